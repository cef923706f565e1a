"""Volatile spans of tool results: the parts that change between two runs of the same
call without meaning anything happened — timestamps, clock times, durations, UUIDs, hex ids, PIDs.

:data:`DEFAULT_MASK_PATTERNS` is the documented default list (``guards.progress.masks`` in the
config); :func:`compile_masks` turns a list into :class:`Masks`, one compiled alternation applied
in a single pass over each line (a masked span never crosses a line break). Pure, no state.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.config.checks import mask_alternation
from proxy.config.defaults import DEFAULT_MASK_PATTERNS

#: The replacement for every masked span.
MASK = "\u2217"


@dataclass(frozen=True, slots=True)
class Masks:
    """A compiled mask list: ``patterns`` as configured and ``regex``, their alternation."""

    patterns: tuple[str, ...]
    regex: re.Pattern[str] | None


#: Every default pattern starts with one of these characters; the default list is compiled behind
#: a lookahead on them, which halves the cost of a scan (Python's engine otherwise tries every
#: branch at every position).
_DEFAULT_FIRST = "(?=[0-9A-Fa-fPp])"


def compile_masks(patterns: Sequence[str]) -> Masks:
    """Compile ``patterns`` (raises :class:`re.error` naming nothing: the config names the key).
    An empty list masks nothing."""
    for p in patterns:
        re.compile(p)  # each on its own first, so an error is about one pattern
    pats = tuple(patterns)
    if not pats:
        return Masks(pats, None)
    alternation = mask_alternation(pats)
    if pats == DEFAULT_MASK_PATTERNS:
        alternation = f"{_DEFAULT_FIRST}(?:{alternation})"
    return Masks(pats, re.compile(alternation))


DEFAULT_MASKS = compile_masks(DEFAULT_MASK_PATTERNS)


#: Masked texts remembered across requests (an agent resends its whole history every time): key
#: ``(hash(text), len(text), masks)``, at most :data:`MEMO_CHARS` characters in all, oldest dropped
#: first; texts longer than :data:`MEMO_MAX_TEXT` are not kept. A memo only: the result is the same.
_memo: OrderedDict[tuple[int, int, Masks], str] = OrderedDict()
_memo_chars = 0
MEMO_CHARS = 8_000_000
MEMO_MAX_TEXT = 262_144


def mask(text: str, masks: Masks) -> str:
    """``text`` with every volatile span replaced by :data:`MASK`. Masks apply line by line: a
    span never includes a line break, so masking keeps the number of lines. Memoized."""
    global _memo_chars
    if masks.regex is None or not text:
        return text
    key = (hash(text), len(text), masks)
    hit = _memo.get(key)
    if hit is not None:
        _memo.move_to_end(key)
        return hit
    sub = masks.regex.sub
    out = "\n".join(sub(MASK, line) for line in text.split("\n"))
    if len(text) <= MEMO_MAX_TEXT:
        _memo[key] = out
        _memo_chars += len(out)
        while _memo_chars > MEMO_CHARS:
            _memo_chars -= len(_memo.popitem(last=False)[1])
    return out
