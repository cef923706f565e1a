"""Progress-aware repeats: the same call is a *repeat* only when its result is the same
as the previous identical call's, after masking volatile spans (:mod:`proxy.core.volatile`). Same
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

from collections import OrderedDict
from collections.abc import Hashable
from typing import Protocol

from proxy.core.transcript import ToolResult
from proxy.core.volatile import DEFAULT_MASK_PATTERNS, DEFAULT_MASKS, MASK, Masks, compile_masks, mask

__all__ = [
    "DEFAULT_MASKS",
    "DEFAULT_MASK_PATTERNS",
    "MASK",
    "Masks",
    "RepeatJudge",
    "compile_masks",
    "mask",
    "same_result",
    "same_text",
]


def _known(r: ToolResult | None) -> bool:
    return r is not None and not r.pending


#: Verdicts of :func:`same_text` on texts that differ, remembered across requests (an agent sends
#: its whole history every time; only the newest results are new): key ``(hash(a), hash(b),
#: len(a), len(b), masks)``, at most :data:`MEMO_SIZE` entries, oldest dropped first. A memo
#: only, never a decision input: the verdict is the same with or without it.
_memo: OrderedDict[tuple[int, int, int, int, Masks], bool] = OrderedDict()
MEMO_SIZE = 32_768


def same_text(a: str, b: str, masks: Masks) -> bool:
    """``mask(a) == mask(b)``, computed lazily: equal texts need no masking; otherwise the texts
    are walked line by line (masks never span a line break) and only lines that differ are
    masked, stopping at the first pair that still differs. Verdicts are memoized."""
    if a == b:
        return True
    if masks.regex is None:
        return False
    key = (hash(a), hash(b), len(a), len(b), masks)
    verdict = _memo.get(key)
    if verdict is None:
        verdict = _walk(a, b, masks)
        _memo[key] = verdict
        if len(_memo) > MEMO_SIZE:
            _memo.popitem(last=False)
    return verdict


def _walk(a: str, b: str, masks: Masks) -> bool:
    assert masks.regex is not None
    sub = masks.regex.sub
    na, nb = len(a), len(b)
    ia = ib = 0
    while True:
        ja = a.find("\n", ia)
        jb = b.find("\n", ib)
        ja = na if ja < 0 else ja
        jb = nb if jb < 0 else jb
        x, y = a[ia:ja], b[ib:jb]
        if x != y and sub(MASK, x) != sub(MASK, y):
            return False
        if ja == na or jb == nb:
            return ja == na and jb == nb
        ia, ib = ja + 1, jb + 1


def same_result(a: ToolResult | None, b: ToolResult | None, masks: Masks) -> bool:
    """True when both results are known and equal after masking (text and error flag)."""
    if not _known(a) or not _known(b):
        return False
    assert a is not None and b is not None
    return a.is_error == b.is_error and same_text(a.text, b.text, masks)


class SituationNumbers(Protocol):
    """What the judge asks of situation numbers (:class:`proxy.core.effects.Epochs` or
    :class:`proxy.core.effects.EpochCounter`, by call index): did anything change between two
    calls. A protocol so that effects may build on this module without a cycle."""

    def unchanged(self, earlier: int, later: int) -> bool: ...


class RepeatJudge:
    """``judge.repeats(key, result, index) -> bool`` for calls fed in conversation order.

    The first call with a key is not a repeat (there is nothing before it). A later one is a repeat
    when its result equals (masked, same error flag) the last known result of a call with that key;
    when no earlier result with that key is known, it is a repeat (nothing shows progress). A call
    without a known result is judged by the previous pair: it is a repeat when the previous call
    with its key was one, or was the first with that key. :meth:`forget` drops every key (a caller
    that wants comparisons not to cross a user message calls it there).

    With ``epochs`` (:func:`proxy.core.effects.epochs`) a call is a repeat only when, in
    addition, nothing between the previous call with its key and itself changed the situation
    (``index`` is the call's ``seq``): the same result after an edit is not evidence of a loop.

    Results are compared with :func:`same_result` only when a key comes back, so a conversation
    without repeated calls costs one dict entry per call and no masking at all.
    """

    __slots__ = ("_epochs", "_last", "_masks")

    def __init__(self, masks: Masks = DEFAULT_MASKS, epochs: SituationNumbers | None = None) -> None:
        self._masks = masks
        self._epochs = epochs
        # key -> (last known result or None, verdict of the last call, it was the first, index)
        self._last: dict[Hashable, tuple[ToolResult | None, bool, bool, int | None]] = {}

    def repeats(self, key: Hashable, result: ToolResult | None, index: int | None = None) -> bool:
        prev = self._last.get(key)
        known = result if _known(result) else None
        if prev is None:
            self._last[key] = (known, False, True, index)
            return False
        p_result, p_verdict, p_first, p_index = prev
        if known is None:
            verdict = p_verdict or p_first
            self._last[key] = (p_result, verdict, False, index)
        else:
            verdict = p_result is None or same_result(p_result, known, self._masks)
            self._last[key] = (known, verdict, False, index)
        if verdict and self._epochs is not None and index is not None and p_index is not None:
            verdict = self._epochs.unchanged(p_index, index)
            self._last[key] = (*self._last[key][:1], verdict, False, index)
        return verdict

    def forget(self) -> None:
        self._last.clear()

    def copy(self, epochs: SituationNumbers | None = None) -> RepeatJudge:
        """An independent copy judging with ``epochs`` (the copy of this judge's counter, when it
        has one: :class:`proxy.core.effects.EpochCounter`)."""
        out = RepeatJudge(self._masks, epochs)
        out._last = dict(self._last)
        return out
