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

#: The replacement for every masked span.
MASK = "\u2217"

#: Default volatile spans, each a Python regular expression (inline flags only in scoped form,
#: ``(?i:...)``, because the list is compiled as one alternation). Order matters where two could
#: match at the same place: the first listed wins.
DEFAULT_MASK_PATTERNS: tuple[str, ...] = (
    # ISO 8601 dates and timestamps: 2026-11-30, 2026-11-30T02:37:55.123Z, 2026-11-30 02:37:55+01:00
    r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?",
    # UUIDs
    r"(?i:\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b)",
    # clock times: 02:37, 02:37:55, 02:37:55.123, 2:37 PM
    r"\b\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:\s?(?i:am|pm))?\b",
    # durations: 0.53s, 12 ms, 1.5 seconds, 3m, 2h, 250µs
    r"\b\d+(?:\.\d+)?\s?(?:ns|us|µs|ms|s|secs?|seconds?|m|mins?|minutes?|h|hrs?|hours?)\b",
    # hex ids (git SHAs, container and request ids): 0x-prefixed, or 7+ hex digits mixing letters and digits
    r"(?i:\b0x[0-9a-f]+\b)",
    r"(?i:\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,}\b)",
    # process ids: pid 4242, PID: 4242, pid=4242, and process group ids: Gemini CLI ends every
    # shell result with "Process Group PGID: 4242"
    r"(?i:\bp(?:g)?id\b[\s:=#]*\d+)",
    # line numbers and counts that shift when a file is edited above them:
    # "(90 lines total)", "(216 more lines above)", a traceback's `File "x.py", line 19` and
    # `(x.py, line 5)`, "error at/on line 5", a linter's `x.py:12:5:`. What the line says is never
    # masked (a different error or line of code is still a new result), nor is a bare "line N"
    # (a job reporting "processing line 1200" is making progress), nor grep's `x.py:12:` hits.
    r"\d+(?= lines total\b)",
    r"\d+(?= more lines (?:above|below)\b)",
    r"(?<=, line )\d+\b",
    r"(?<= at line )\d+\b",
    r"(?<= on line )\d+\b",
    r"(?<=\.py:)\d+(?=:\d+:)",
    # ids an agent harness writes around every tool result (Codex CLI 0.171's
    # exec_command output): "Chunk ID: 3f9a0c" (6 random hex digits, new on every call) and
    # "Process running with session ID 50343"
    r"(?<=Chunk ID: )[0-9a-f]+\b",
    r"(?<=Process running with session ID )\d+\b",
    # where Claude Code saved a large result (over ~30 KB it sends "<persisted-output>", "Output
    # too large (61.3KB). Full output saved to: …/tool-results/<random>.txt" and a 2 KB preview):
    # the file name is new on every call, so two such results are compared by what they show
    # (the size and the preview), or an exact loop with big outputs is never the same result
    r"Full output saved to: [^\n]+",
)


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
    alternation = "|".join(f"(?:{p})" for p in pats)
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
