"""Helpers shared by the issue-7 rules: a transcript's calls split into turns, and a reminder
placed after a step's results. Pure."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from proxy.actions import Delivery, Remind
from proxy.transcript import ToolCall, ToolResult, Transcript


def turns(calls: Sequence[ToolCall], episode: Sequence[int] | None = None) -> Iterator[Sequence[ToolCall]]:
    """The calls of each turn (the run after a user message), in order; empty turns skipped.
    With ``episode`` (:func:`proxy.episodes.episodes`, by call ``seq``) the runs are episodes: a
    continuation user message ("continue", a compaction summary) does not split them."""

    def group(call: ToolCall) -> int:
        return call.turn if episode is None else episode[call.seq]

    i = 0
    while i < len(calls):
        j = i
        first = group(calls[i])
        while j < len(calls) and group(calls[j]) == first:
            j += 1
        yield calls[i:j]
        i = j


def known(result: ToolResult | None) -> bool:
    """A result that has arrived (not None, not the response side's pending placeholder)."""
    return result is not None and not getattr(result, "pending", False)


def remind_after_step(
    transcript: Transcript,
    call: ToolCall,
    text: str,
    rule: str,
    count: int,
    limit: int | None,
    delivery: Delivery,
) -> Remind | None:
    """A reminder after the results of ``call``'s step; None while they have not arrived."""
    end = transcript.steps[call.step].end
    if end is None:
        return None
    return Remind(
        after=end,
        text=text,
        rule=rule,
        tool=call.name,
        count=count,
        limit=limit,
        fresh=transcript.is_fresh(call.step),
        delivery=delivery,
        call=call.seq,
    )
