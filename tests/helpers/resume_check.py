"""One check for every resumable guard's own tests (:mod:`proxy.guards.resume`): a state
advanced up to a cut, then over the rest (itself and an independent copy of it), decides what the
whole-transcript call decides."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from proxy.core.actions import Action
from proxy.core.transcript import Transcript


def assert_resumes(
    guard: Any,
    transcript: Transcript,
    ctx: Any = None,
    cuts: Iterable[int] | None = None,
    after: Callable[[], None] | None = None,
) -> list[Action]:
    """For every cut (default: every message position, 0 through ``message_count``): begin,
    advance to the cut, copy the state, advance both to the end; each gives the whole run, and a
    third advance finds nothing left to read. ``after``: also called once the state has been
    advanced to the end (a guard's own extra check). Returns the whole run's actions."""
    end = transcript.message_count
    whole: list[Action] = guard(transcript, ctx)
    for cut in range(end + 1) if cuts is None else cuts:
        state = guard.begin()
        first = guard.advance(state, transcript, ctx, cut)
        kept = state.copy()
        assert first + guard.advance(state, transcript, ctx, end) == whole, cut
        if after is not None:
            after()
        assert first + guard.advance(kept, transcript, ctx, end) == whole, cut  # the copy is independent
        assert guard.advance(state, transcript, ctx, end) == [], cut  # nothing left to read
    return whole
