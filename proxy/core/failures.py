"""Is a tool result a failure? (DESIGN §6.3, §6.5)

The rule, in order:

0. **A cancelled call** (:func:`cancelled`: its result says it never ran because another call of
   its step failed) is neither a failure nor a success: ``None``, as for a call without a result.
   Claude Code answers the other calls of a parallel step that way when one of them errors; ten
   parallel edits of which one failed are one failure, not ten.
1. **The protocol's error flag** decides when the dialect has one (``ToolResult.is_error`` is not
   None): True is a failure, False is a success, whatever the text says.
2. **An explicit exit status at the edge of the result** decides when there is one: a line of
   the result's *edges* (below) that is a harness's status line, one of
   :data:`EXIT_STATUS_PATTERNS` (mini-swe-agent's ``<returncode>1</returncode>``,
   ``<exit_code>1</exit_code>``, ``Exit code: 1``, ``[Command finished with exit code 1]``,
   ``Process exited with code 127``, ``exit status 1``). Any non-zero status is a failure; when
   every status found is 0 the result is a **success**, even if the output prints an error or a
   traceback (``grep -n Error x.py`` hits, a script that catches and prints an exception). A
   status line in the middle of a long output is not at the edges: the later steps decide.
3. **A JSON object with a top-level ``"error"``**: the whole result parses as a JSON object whose
   ``"error"`` member is not null, false, 0, ``""``, ``[]`` or ``{}`` (``{"error": "not found"}``,
   a JSON-RPC error object). An ``"error"`` nested deeper, or ``"error": null``, is not a failure.
   Results over :data:`JSON_MAX_CHARS` characters skip this step.
4. **A failure pattern matches at the edge of the result.** Each pattern is a Python regular
   expression, compiled with ``re.MULTILINE`` (so ``^`` and ``$`` anchor at every line),
   case-sensitive unless it says ``(?i)``. Patterns are searched in the result's *edges* only: its
   first :data:`EDGE_LINES` lines and its last :data:`EDGE_LINES` lines (trailing whitespace of
   the result ignored; at most :data:`EDGE_CHARS` characters at each end). Tools announce failure
   at the top (``Error: …``, ``bash: x: command not found``, SWE-agent's ``Your proposed edit has
   introduced new syntax error(s)``, ``Traceback …``) or at the bottom (``NameError: …``); the
   middle of a long output is file content or program output, not the tool's verdict. This also
   keeps the cost flat: the 300 results of a 5 MB history are classified in about 2 ms.

5. **A known agent's failure line** (:func:`proxy.core.agents.failure_lines`: Codex's ``apply_patch
   verification failed: …``, Gemini CLI's ``Failed to edit, 0 occurrences found …``) at the edge
   of the result, whatever the configured patterns: each is specific to its tool.

Every default pattern (and every exit-status pattern) is anchored at the start of a line, and the
ones with a ``program: `` prefix require the program name to have no colon and to be followed by
exactly one space and a non-space. So a grep hit (``src/errors.py:10: class ErrorHandler``,
``app.py:3:  raise Error("x")``) and file contents that merely *mention* errors (indented code,
prose such as ``returns exit code 2 on bad input`` in the middle of a README) are not failures.

Known limits, by design: a file whose first or last lines *are* an error message (a saved crash
log, a log file whose lines start with ``ERROR``) counts as a failure; a failure reported only in
the middle of a long output does not; a status of 0 from a pipeline (``python t.py | tail``) is
the status of its last command, so a traceback piped through ``tail`` is a success.

Pure; never raises on any input.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import orjson

from proxy.config.checks import compile_failure_pattern
from proxy.config.defaults import DEFAULT_FAILURE_PATTERNS
from proxy.core import agents
from proxy.core.memo import Memo, text_bytes
from proxy.core.transcript import ToolResult

#: How many lines at each end of a result the patterns see.
EDGE_LINES = 5
#: At most this many characters at each end of a result are searched.
EDGE_CHARS = 2000
#: Results longer than this are not parsed as JSON (step 3).
JSON_MAX_CHARS = 1_000_000
_TRAILING = 256  # trailing whitespace ignored is looked for in this many last characters
_BACKREF = re.compile(r"\\[1-9]|\(\?P=")

#: Explicit exit-status lines (rule step 2), searched in the result's edges; each has one capture
#: group, the status. Case-insensitive where the words are; a line that goes on after the number
#: (prose: "returns exit code 2 on bad input") is not a status line.
EXIT_STATUS_PATTERNS: tuple[str, ...] = (
    # mini-swe-agent's <returncode>1</returncode>; <exit_code>1</exit_code>, <exitcode>…
    r"^<(?:returncode|return_code|exit_?code|exit_status)>[ \t]*(-?\d+)[ \t]*</",
    # a line ending in a status: "Exit code: 1", "exit code 2", "Process exited with code 127",
    # "[Command finished with exit code 1]", "[The command completed with exit code 1.]",
    # "exit status 1", "Return code: 0" (at most four words before the phrase)
    r"^[\[(]?(?:[\w-]+ ){0,4}?(?i:exit(?:ed)? (?:with )?(?:exit )?(?:code|status)|return ?code)[:=]? *"
    r"(-?\d+)[.)\]]*[ \t\r]*$",
)
#: Whole results (trimmed) that say the call was cancelled, never run, because another call of its
#: step failed: Claude Code 2.x's answer to every other call of a parallel step when one errors
#: (with ``is_error: true``; seen in recorded Claude Code sessions). Exact texts: a result that
#: merely mentions them is the tool's own output.
CANCELLED_TEXTS: frozenset[str] = frozenset(
    (
        "<tool_use_error>Sibling tool call errored</tool_use_error>",
        "Sibling tool call errored",
    )
)
_CANCELLED_MAX = max(map(len, CANCELLED_TEXTS)) + _TRAILING


def cancelled(result: ToolResult | None) -> bool:
    """True when ``result`` is a cancellation (:data:`CANCELLED_TEXTS`, the whole text trimmed):
    the call never ran, so it is neither a failure nor a success and changed nothing. False for
    no result or a pending one."""
    if result is None or result.pending or len(result.text) > _CANCELLED_MAX:
        return False
    return result.text.strip() in CANCELLED_TEXTS


#: What :meth:`FailureRule.reason` returns for a non-zero exit status (rule step 2).
EXIT_STATUS = "exit_status"


_JSON_START = re.compile(r"\s*\{")
_AGENT_FAILURE = re.compile("|".join(f"(?:{p})" for p in agents.failure_lines()), re.MULTILINE)
#: What :meth:`FailureRule.reason` returns for a known agent's failure line (rule step 5).
AGENT_FAILURE = "agent_failure"
_EXIT_STATUS = re.compile("|".join(f"(?:{p})" for p in EXIT_STATUS_PATTERNS), re.MULTILINE)


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """Compile one failure pattern the way :class:`FailureRule` uses it: the rule the config
    checks the pattern by (:func:`proxy.config.checks.compile_failure_pattern`).

    Raises ``re.error`` when it is not a regular expression and ``ValueError`` when it matches
    an empty result (it would call every result a failure)."""
    return compile_failure_pattern(pattern)


def edge_spans(text: str) -> list[tuple[int, int]]:
    """The ``(start, end)`` index ranges of ``text`` that the patterns search (rule step 3): its
    first and last :data:`EDGE_LINES` lines (all of it when it has fewer lines), its trailing
    whitespace left out, each end cut to :data:`EDGE_CHARS` characters. A range cut in the middle
    of a line does not start a line there, so ``^`` does not match at the cut."""
    end = len(text)
    tail = text[-_TRAILING:]
    end -= len(tail) - len(tail.rstrip())
    head_end = -1
    for _ in range(EDGE_LINES):
        head_end = text.find("\n", head_end + 1, end)
        if head_end < 0:  # at most EDGE_LINES lines
            return [(0, end)] if end <= 2 * EDGE_CHARS else [(0, EDGE_CHARS), (end - EDGE_CHARS, end)]
    tail_start = end
    for _ in range(EDGE_LINES):
        tail_start = text.rfind("\n", head_end, tail_start)
        if tail_start <= head_end:
            return [(0, min(head_end, EDGE_CHARS)), (max(head_end + 1, end - EDGE_CHARS), end)]
    return [(0, min(head_end, EDGE_CHARS)), (max(tail_start + 1, end - EDGE_CHARS), end)]


def edge_text(text: str) -> str:
    """What the patterns see of ``text``: its :func:`edge_spans` joined by a newline."""
    return "\n".join(text[a:b] for a, b in edge_spans(text))


def exit_status(text: str, spans: Sequence[tuple[int, int]] | None = None) -> int | None:
    """The explicit exit status at the edges of ``text`` (rule step 2): the first non-zero status
    line found (first edge first), else 0 when every one found is 0, else None (there is none).
    ``spans`` are ``text``'s :func:`edge_spans` when the caller has them already."""
    found: int | None = None
    for a, b in edge_spans(text) if spans is None else spans:
        for m in _EXIT_STATUS.finditer(text, a, b):
            status = int(next(g for g in m.groups() if g is not None))
            if status:
                return status
            found = 0
    return found


def json_error(text: str) -> bool:
    """True when ``text`` is a JSON object with a meaningful top-level ``"error"`` (rule step 3)."""
    if len(text) > JSON_MAX_CHARS or not _JSON_START.match(text) or '"error"' not in text:
        return False
    if not text[-64:].rstrip().endswith("}"):
        return False
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(obj, dict) or "error" not in obj:
        return False
    value = obj["error"]
    return value is not None and value is not False and value not in (0, "", [], {})


class FailureRule:
    """Classifies tool results: ``FailureRule()(result)`` is True (failure), False (success) or
    None (no result yet, or a cancelled call), by the module's rule steps 0 to 5. ``patterns``
    replace :data:`DEFAULT_FAILURE_PATTERNS` (step 4); steps 1 to 3 and 5 are not patterns and
    always apply."""

    __slots__ = ("_any", "_compiled", "_memo", "patterns")

    #: Verdicts remembered per text (a conversation's old results come back on every request):
    #: texts up to MEMO_MAX_CHARS, at most MEMO_ENTRIES of them and MEMO_BYTES charged by
    #: :func:`proxy.core.memo.text_bytes` (least recently used dropped).
    MEMO_MAX_CHARS = 16 * 1024
    MEMO_ENTRIES = 2048
    MEMO_BYTES = 2 * 1024 * 1024

    def __init__(self, patterns: Sequence[str] = DEFAULT_FAILURE_PATTERNS) -> None:
        self.patterns = tuple(patterns)
        self._compiled = tuple(compile_pattern(p) for p in self.patterns)
        self._any: re.Pattern[str] | None = None  # all patterns in one scan, when they combine
        self._memo: Memo[str, bool] = Memo(self.MEMO_ENTRIES, self.MEMO_BYTES, text_bytes)
        if self.patterns and not any(_BACKREF.search(p) for p in self.patterns):
            try:
                self._any = re.compile("|".join(f"(?:{p})" for p in self.patterns), re.MULTILINE)
            except re.error:  # e.g. global inline flags not at the start: search one by one
                self._any = None

    def failed_text(self, text: str) -> bool:
        """True when ``text`` is a failure by rule steps 2 to 5 (as :meth:`reason`, faster;
        memoized for texts up to :attr:`MEMO_MAX_CHARS`)."""
        if len(text) > self.MEMO_MAX_CHARS:
            return self._failed_text(text)
        verdict = self._memo.get(text)
        if verdict is None:
            verdict = self._memo.put(text, self._failed_text(text))
        return verdict

    def _failed_text(self, text: str) -> bool:
        spans = edge_spans(text)
        status = exit_status(text, spans)
        if status is not None:  # step 2: an explicit status decides
            return status != 0
        if json_error(text):
            return True
        if self._any is not None:
            if any(self._any.search(text, a, b) is not None for a, b in spans):
                return True
            return any(_AGENT_FAILURE.search(text, a, b) is not None for a, b in spans)
        return self.reason(text) is not None

    def reason(self, text: str) -> str | None:
        """Why ``text`` is a failure: :data:`EXIT_STATUS` (``"exit_status"``, a non-zero exit
        status), ``"json"``, the first pattern that matched, or :data:`AGENT_FAILURE`; None when
        it is not one (rule steps 2 to 5; the flag is :meth:`__call__`'s business)."""
        spans = edge_spans(text)
        status = exit_status(text, spans)
        if status is not None:
            return EXIT_STATUS if status else None
        if json_error(text):
            return "json"
        for pattern, compiled in zip(self.patterns, self._compiled, strict=True):
            if any(compiled.search(text, a, b) is not None for a, b in spans):
                return pattern
        if any(_AGENT_FAILURE.search(text, a, b) is not None for a, b in spans):
            return AGENT_FAILURE
        return None

    def __call__(self, result: ToolResult | None) -> bool | None:
        if result is None or cancelled(result):
            return None
        if result.is_error is not None:
            return result.is_error
        return self.failed_text(result.text)


class RejectionRule:
    """``RejectionRule(patterns)(result) -> bool``: the result says the user rejected the call —
    one of ``patterns`` (``guards.repeated_failure.rejection_patterns``, compiled as
    :func:`compile_pattern` does) is found in the result's edges (:func:`edge_text`). Verdicts are
    memoized per text (texts up to :attr:`MEMO_MAX_CHARS`, at most :attr:`MEMO_ENTRIES` and
    :attr:`MEMO_BYTES` charged by :func:`proxy.core.memo.text_bytes`)."""

    __slots__ = ("_compiled", "_memo", "patterns")

    MEMO_MAX_CHARS = 16 * 1024
    MEMO_ENTRIES = 4096
    MEMO_BYTES = 2 * 1024 * 1024

    def __init__(self, patterns: Sequence[str] = ()) -> None:
        self.patterns = tuple(patterns)
        self._compiled = tuple(compile_pattern(p) for p in self.patterns)
        self._memo: Memo[str, bool] = Memo(self.MEMO_ENTRIES, self.MEMO_BYTES, text_bytes)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RejectionRule) and other.patterns == self.patterns

    def __hash__(self) -> int:
        return hash(self.patterns)

    def text(self, text: str) -> bool:
        """True when ``text`` is a rejection (memoized)."""
        if not self._compiled:
            return False
        if len(text) > self.MEMO_MAX_CHARS:
            return self._search(text)
        verdict = self._memo.get(text)
        if verdict is None:
            verdict = self._memo.put(text, self._search(text))
        return verdict

    def _search(self, text: str) -> bool:
        edges = edge_text(text)
        return any(r.search(edges) for r in self._compiled)

    def __call__(self, result: ToolResult | None) -> bool:
        if result is None or result.pending:
            return False
        return self.text(result.text)
