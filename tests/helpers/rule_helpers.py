"""Helpers for the rule tests (the loop rules, same_target, escalation, and the gates that run them
on fixtures and recorded runs): run one guard over a :class:`tests.helpers.agent_steps.History` and
describe its actions by call number."""

from __future__ import annotations

from typing import Any

from proxy.core.actions import Action, Remind, Withhold
from proxy.core.transcript import Transcript
from proxy.dialects import openai_chat
from tests.helpers.agent_steps import History


def transcript(h: History) -> Transcript:
    return openai_chat.parse_request({"messages": h.messages})


def call_at(t: Transcript, action: Action) -> int:
    """The 1-based number of the call an action is about: for a reminder, the last call of the
    step whose results it follows; for a withhold, the call whose result it replaces."""
    if isinstance(action, Withhold):
        return next(
            c.seq + 1 for c in t.calls if c.result is not None and c.result.position == action.position
        )
    assert isinstance(action, Remind)
    return max(c.seq + 1 for c in t.calls if c.result is not None and c.result.position <= action.after)


def summary(guard: Any, h: History) -> list[tuple[str, int, int]]:
    """``[(kind, call number, count), …]`` of ``guard``'s actions over ``h``."""
    t = transcript(h)
    return [(a.kind, call_at(t, a), a.count) for a in guard(t, None)]
