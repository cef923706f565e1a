"""Precision first (DESIGN §2.2): withhold and stop only on evidence of no progress. A
conversation in which every tool result is new — whatever the calls, their repeats, their order,
the user's "continue"s — never has a result withheld and its next answer is never stopped.
Property test over the pure request and response sides the server runs (the lifetime cap, 300
calls, is out of reach here; turn_guard is off by default)."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.config import Config
from proxy.core.actions import Withhold
from proxy.core.effects import progress_rules
from proxy.guards import Context, build_guards
from proxy.request.rewrite import decide_request
from proxy.response.assemble import AssembledCall
from proxy.response.decide import StopJudge

CFG = Config()
GUARDS = build_guards(CFG.guards, *progress_rules(CFG.progress))

_calls = st.sampled_from(
    [
        ("read_file", {"path": "config.yaml"}),
        ("read_file", {"path": "app.py"}),
        ("bash", {"command": "npm test"}),
        ("bash", {"command": "git diff"}),
        ("bash", {"command": "cp app.py.orig app.py"}),
        ("edit_file", {"path": "app.py", "old": "a", "new": "b"}),
        ("grep", {"pattern": "TODO", "path": "src"}),
        ("job_status", {"id": 42}),
    ]
)
_words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]


@st.composite
def progressing(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A conversation of up to 60 calls (1-3 per step) whose every result is new text, with user
    messages ("continue", new requests) now and then."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing tests."}]
    n = 0
    for _ in range(draw(st.integers(min_value=1, max_value=30))):
        if draw(st.integers(min_value=0, max_value=9)) == 0:
            messages.append({"role": "user", "content": draw(st.sampled_from(["continue", "Now the docs."]))})
        step = draw(st.lists(_calls, min_size=1, max_size=3))
        wire, results = [], []
        for name, args in step:
            n += 1
            cid = f"c{n}"
            wire.append(
                {
                    "id": cid,
                    "type": "function",
                    "function": {"name": name, "arguments": orjson.dumps(args).decode()},
                }
            )
            # new text every time: a word sequence unique to this call
            text = " ".join(_words[int(d)] for d in str(n)) + f" ({draw(st.sampled_from(_words))})"
            results.append({"role": "tool", "tool_call_id": cid, "content": f"{text}\n"})
        messages.append({"role": "assistant", "content": None, "tool_calls": wire})
        messages.extend(results)
    return messages


@settings(max_examples=200, deadline=None)
@given(progressing(), _calls)
def test_a_conversation_that_makes_progress_is_never_blocked(
    messages: list[dict[str, Any]], nxt: Any
) -> None:
    raw = orjson.dumps({"model": "m", "messages": messages})
    decision = decide_request(raw, {}, GUARDS, CFG.conversation_key.headers)
    assert [a for a in decision.actions if isinstance(a, Withhold)] == []
    assert decision.transcript is not None
    judge = StopJudge(decision.transcript, decision.actions, GUARDS, Context(), CFG)
    name, args = nxt
    assert judge([AssembledCall("next", name, orjson.dumps(args).decode())]) is None
