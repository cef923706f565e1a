"""Helpers shared by the rules beyond exact repeats (DESIGN §6.5): a transcript's calls split
into turns, and a reminder placed after a step's results. Pure."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from proxy.core.actions import Delivery, Remind
from proxy.core.memo import Memo, call_bytes
from proxy.core.transcript import ToolCall, ToolResult, Transcript


def turns(calls: Sequence[ToolCall], episode: Sequence[int] | None = None) -> Iterator[Sequence[ToolCall]]:
    """The calls of each turn (the run after a user message), in order; empty turns skipped.
    With ``episode`` (:func:`proxy.core.episodes.episodes`, by call ``seq``) the runs are episodes: a
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


T = TypeVar("T")

#: Bounds of each guard's :func:`memoized` memo: entries, and bytes charged by
#: :func:`proxy.core.memo.call_bytes`. A conversation's old calls are looked up again when its
#: history is read in full (a prefix cache miss) and when a guard looks back over an episode
#: (escalation, on a target's first reminder): the bench's 5 MB session has 1,635 distinct calls
#: (escalation's hit rate there 96% at 2,048 entries as at 8,192, 71% at 1,024), the recorded real
#: runs at most 176 each.
MEMO_ENTRIES = 2048
MEMO_BYTES = 1024 * 1024


def call_memo() -> Memo[tuple[str, str], Any]:
    """An empty memo for :func:`memoized` (one per guard)."""
    return Memo(MEMO_ENTRIES, MEMO_BYTES, call_bytes)


def memoized(memo: Memo[tuple[str, str], T], call: ToolCall, compute: Callable[[ToolCall], T]) -> T:
    """``compute(call)``, remembered in ``memo`` per tool name and arguments string (an agent's
    old calls come back on every request); calls whose arguments are not a string are computed
    every time."""
    raw = call.arguments_raw
    if not isinstance(raw, str):
        return compute(call)
    key = (call.name, raw)
    found = memo.get(key)
    if found is None:
        found = memo.put(key, compute(call))
    return found


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
    *,
    about_call: bool = True,
) -> Remind | None:
    """A reminder after the results of ``call``'s step; None while they have not arrived.
    ``about_call``: it names ``call`` (``Remind.call``, what escalation counts); False for a
    reminder about time, which names no call."""
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
        call=call.seq if about_call else None,
    )
