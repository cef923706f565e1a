"""Degenerate text: a generation stuck repeating one span (DESIGN §6.4).

:class:`RepetitionDetector` is fed a choice's streamed ``content`` (or reasoning) piece by piece
and reports when the text's tail has become one span repeated over and over.

Rule (``response.degenerate_text``): the tail of the looked-at text consists of at least
``min_repeats`` (10) back-to-back copies of one span of 1 to ``max_period`` (500) characters, and
those copies cover at least ``min_chars`` (200) characters. The copies must be exact: the model
saying the same sentence 10 times in a row is caught; a list whose items differ (numbers, names)
is not. So ``"I will check the file. "`` 10 times (230 characters) is degenerate, and so are 200
newlines or ``"ha"`` 100 times; a 40-character ``=====`` rule is not.

False-positive rule: text that repeats legitimately is not looked at at all:
- lines inside fenced code blocks (from a line starting with ````` or ``~~~`` to the next one)
  and the fence lines themselves,
- indented code lines (starting with 4 spaces or a tab),
- table rows (lines starting with ``|``, after leading spaces).
Everything else (prose, lists, headings, blank lines) is joined in order and checked. A line is
classified when it ends; the line still being streamed is checked along with the text before it,
unless it already starts like one of the kinds above.

Cost: the tail kept is bounded (``min_repeats * max_period`` characters plus one period); a check
runs after every 16 new characters, and candidate periods come from one substring search for the
tail's last characters, so a check of ordinary text costs about a microsecond (0.3 µs per streamed
character all told, measured).
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.config import DegenerateTextConfig

#: New characters between two checks (repetition that has started stays until it is seen).
CHECK_EVERY = 16


@dataclass(frozen=True, slots=True)
class Repetition:
    """Evidence: the repeated span's length and how many copies end the text."""

    period: int
    repeats: int


def periodic_tail(text: str, min_repeats: int, min_chars: int, max_period: int) -> Repetition | None:
    """The shortest span whose back-to-back copies make up the end of ``text`` per the rule
    above, or None.

    Candidates come from a substring search: if the tail has period ``p`` over ``need >= p + w``
    characters, its last ``w`` characters also occur ``p`` characters earlier, so only the
    positions where that window occurs again (usually none in ordinary text) are checked."""
    n = len(text)
    if n < min_chars or n < min_repeats:
        return None
    w = max(1, min(32, min_chars // 2))  # see the docstring: need >= p + w for every valid p
    window = text[n - w :]
    limit = n - 1  # an earlier occurrence lies within text[:limit], so it starts before n - w
    while True:
        j = text.rfind(window, 0, limit)
        if j < 0:
            return None
        p = n - w - j  # nearest occurrence first: the shortest period first
        if p > max_period or min_repeats * p > n:
            return None
        limit = j + w - 1
        need = max(min_repeats * p, min_chars)
        if need > n or text[n - need : n - p] != text[n - need + p :]:
            continue
        # count the copies for the evidence (how far back the period holds, within the tail)
        start = n - need
        while start - p >= 0 and text[start - p : start] == text[start : start + p]:
            start -= p
        while start > 0 and text[start - 1] == text[start - 1 + p]:
            start -= 1
        return Repetition(p, (n - start) // p)


def _skipped_line(line: str) -> bool:
    """Indented code or a table row (the fence lines are handled by the caller)."""
    return line.startswith(("    ", "\t")) or line.lstrip(" ").startswith("|")


def _fence(line: str) -> bool:
    return line.lstrip(" ").startswith(("```", "~~~"))


class RepetitionDetector:
    """Feed text pieces in order; :meth:`feed` returns the evidence once the rule holds."""

    __slots__ = ("_cfg", "_head", "_in_fence", "_keep", "_line", "_since", "_tail")

    def __init__(self, cfg: DegenerateTextConfig) -> None:
        self._cfg = cfg
        self._tail = ""  # looked-at text of complete lines (bounded)
        self._line = ""  # the line being streamed (its tail, when very long)
        self._head = ""  # its first characters, which classify it
        self._in_fence = False
        self._since = 0
        self._keep = cfg.min_repeats * cfg.max_period + cfg.max_period + max(cfg.min_chars, 1)

    def feed(self, text: str) -> Repetition | None:
        if not text:
            return None
        parts = text.split("\n")
        for part in parts[:-1]:
            line = self._line + part
            self._end_line(self._head if len(self._head) >= 8 else line[:8], line)
            self._line = self._head = ""
        self._line += parts[-1]
        if len(self._head) < 8:
            self._head = self._line[:8]
        self._since += len(text)
        if self._since < CHECK_EVERY:
            return None
        self._since = 0
        return self.check()

    def check(self) -> Repetition | None:
        """Check now (also called at the end of a text)."""
        line, head = self._line, self._head
        pending = "" if self._in_fence or _fence(head) or _skipped_line(head) else line
        if len(line) > self._keep:
            self._line = line[-self._keep :]  # an endless line: only its tail matters
        text = self._tail + pending
        cfg = self._cfg
        return periodic_tail(text[-self._keep :], cfg.min_repeats, cfg.min_chars, cfg.max_period)

    def _end_line(self, head: str, line: str) -> None:
        if _fence(head):
            self._in_fence = not self._in_fence
            return
        if self._in_fence or _skipped_line(head):
            return
        tail = self._tail + line + "\n"
        self._tail = tail[-self._keep :] if len(tail) > 2 * self._keep else tail
