"""Progress-aware repeats (issue 7): the same call is a *repeat* only when its result is the same
as the previous identical call's, after masking volatile spans (:mod:`proxy.volatile`). Same
arguments and a new result is progress (polling a job whose status changes, paging a growing
output), not repetition.

- :func:`same_result` compares two results; an unknown result (None) is never the same.
- :class:`RepeatJudge` folds a sequence of calls keyed by the caller's canonical key and says, for
  each, whether it repeats the previous call with that key. A call whose result has not arrived
  (``result`` None, or ``pending`` for the response side's placeholder results) is judged by the
  previous pair: it is a repeat when the previous call with its key was one (or had no
  predecessor to compare with, i.e. the pending call is the second with its key).

Guards that count repeats use :class:`RepeatJudge`; the masked text of each result is computed at
most once per judge.
"""

from __future__ import annotations

from collections.abc import Hashable

from proxy.transcript import ToolResult
from proxy.volatile import DEFAULT_MASK_PATTERNS, DEFAULT_MASKS, MASK, Masks, compile_masks, mask

__all__ = [
    "DEFAULT_MASKS",
    "DEFAULT_MASK_PATTERNS",
    "MASK",
    "Masks",
    "RepeatJudge",
    "compile_masks",
    "mask",
    "same_result",
]


def _known(r: ToolResult | None) -> bool:
    return r is not None and not r.pending


def same_result(a: ToolResult | None, b: ToolResult | None, masks: Masks) -> bool:
    """True when both results are known and equal after masking (text and error flag)."""
    if not _known(a) or not _known(b):
        return False
    assert a is not None and b is not None
    if a.is_error != b.is_error:
        return False
    if a.text == b.text:
        return True
    return mask(a.text, masks) == mask(b.text, masks)


class RepeatJudge:
    """``judge.repeats(key, result) -> bool`` for calls fed in conversation order.

    The first call with a key is not a repeat (there is nothing before it). A later one is a repeat
    when its result equals (masked, same error flag) the last known result of a call with that key;
    when no earlier result with that key is known, it is a repeat (nothing shows progress). A call
    without a known result is judged by the previous pair: it is a repeat when the previous call
    with its key was one, or was the first with that key. :meth:`forget` drops every key (a caller
    that wants comparisons not to cross a user message calls it there).
    """

    __slots__ = ("_last", "_masks")

    def __init__(self, masks: Masks = DEFAULT_MASKS) -> None:
        self._masks = masks
        # key -> (last known masked text or None, its error flag, verdict of the last call, it was the first)
        self._last: dict[Hashable, tuple[str | None, bool | None, bool, bool]] = {}

    def repeats(self, key: Hashable, result: ToolResult | None) -> bool:
        prev = self._last.get(key)
        if _known(result):
            assert result is not None
            masked: str | None = mask(result.text, self._masks)
            err = result.is_error
        else:
            masked, err = None, None
        if prev is None:
            self._last[key] = (masked, err, False, True)
            return False
        p_masked, p_err, p_verdict, p_first = prev
        if masked is None:
            verdict = p_verdict or p_first
            self._last[key] = (p_masked, p_err, verdict, False)
        else:
            verdict = p_masked is None or (p_masked == masked and p_err == err)
            self._last[key] = (masked, err, verdict, False)
        return verdict

    def forget(self) -> None:
        self._last.clear()
