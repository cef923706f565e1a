"""Is a tool result a failure? (DESIGN §6.3, §6.5)

The rule, in order:

1. **The protocol's error flag** decides when the dialect has one (``ToolResult.is_error`` is not
   None): True is a failure, False is a success, whatever the text says.
2. **A JSON object with a top-level ``"error"``**: the whole result parses as a JSON object whose
   ``"error"`` member is not null, false, 0, ``""``, ``[]`` or ``{}`` (``{"error": "not found"}``,
   a JSON-RPC error object). An ``"error"`` nested deeper, or ``"error": null``, is not a failure.
   Results over :data:`JSON_MAX_CHARS` characters skip this step.
3. **A failure pattern matches at the edge of the result.** Each pattern is a Python regular
   expression, compiled with ``re.MULTILINE`` (so ``^`` and ``$`` anchor at every line),
   case-sensitive unless it says ``(?i)``. Patterns are searched in the result's *edge lines* only:
   its first :data:`EDGE_LINES` and last :data:`EDGE_LINES` non-blank lines, each cut to
   :data:`LINE_CHARS` characters, trailing whitespace removed. Tools announce failure at the top
   (``Error: …``, ``bash: x: command not found``, ``Exit code: 1``, ``Traceback …``) or at the
   bottom (``[Command finished with exit code 1]``, ``NameError: …``); the middle of a long output
   is file content or program output, not the tool's verdict. This also keeps the cost flat: a
   300-call history with 16 KB results is classified in about a millisecond.

Every default pattern is anchored at the start of a line, and the ones with a ``program: ``
prefix require the program name to have no colon and to be followed by exactly one space and a
non-space. So a grep hit (``src/errors.py:10: class ErrorHandler``, ``app.py:3:  raise
Error("x")``) and file contents that merely *mention* errors (indented code, prose such as
``returns exit code 2 on bad input`` in the middle of a README) are not failures.

Known limits, by design: a file whose first or last lines *are* an error message (a saved crash
log, a log file whose lines start with ``ERROR``) counts as a failure; a failure reported only in
the middle of a long output does not.

Pure; never raises on any input.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import orjson

from proxy.transcript import ToolResult

#: How many non-blank lines at each end of a result the patterns see.
EDGE_LINES = 5
#: Each edge line is cut to this many characters before matching.
LINE_CHARS = 400
#: Results longer than this are not parsed as JSON (step 2).
JSON_MAX_CHARS = 1_000_000
_SPLIT = 4 * EDGE_LINES  # lines split off each end while looking for the non-blank ones

#: The default failure patterns (``guards.turn_guard.failure_patterns``), one concept each.
DEFAULT_FAILURE_PATTERNS: tuple[str, ...] = (
    # "Error: …", "ERROR …", "FATAL: …", "Error executing command"; not "Errors: 0", "ERROR_CODES".
    r"^(?:Error|ERROR|Fatal|FATAL)\b",
    # lower-case prefixes with a colon: "error: pathspec…", "error[E0425]: …", "fatal: not a git repo"
    r"^(?:error|fatal)(?:\[[\w-]+\])?:",
    r"^(?:npm ERR!|make: \*\*\*)",
    # an agent framework's error wrapper
    r"^<(?:tool_use_error|error)>",
    r"^Traceback \(most recent call last\)",
    # the last line of an uncaught exception: "NameError: name 'x' is not defined", "AssertionError"
    r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)(?::|$)",
    # a non-zero exit code: "Exit code: 1", "exit code 2", "Process exited with code 127",
    # "[Command finished with exit code 1]", "exit status 1"; never "exit code 0"
    r"^[\[(]?(?:[\w-]+ ){0,4}?(?i:exit(?:ed)? (?:with )?(?:exit )?(?:code|status)|return ?code)[:=]? *"
    r"(?:-\d+|0*[1-9]\d*)\b",
    # "bash: line 1: foo: command not found", "zsh: command not found: foo",
    # "cat: x: No such file or directory", "bash: ./run.sh: Permission denied"
    r"^(?:[^\s:]+: (?=\S).*?)?(?:command not found|No such file or directory|Permission denied)",
    # dash: "sh: 1: foo: not found"
    r"^[^\s:]+: \d+: .*: not found$",
)

_JSON_START = re.compile(r"\s*\{")


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """Compile one failure pattern the way :class:`FailureRule` uses it.

    Raises ``re.error`` when it is not a regular expression and ``ValueError`` when it matches
    an empty result (it would call every result a failure)."""
    compiled = re.compile(pattern, re.MULTILINE)
    if compiled.search("") is not None:
        raise ValueError("it matches an empty result, so every result would be a failure")
    return compiled


def edge_lines(text: str) -> str:
    """The first and last :data:`EDGE_LINES` non-blank lines of ``text`` (all of them when there
    are at most twice that many), each cut to :data:`LINE_CHARS` characters, joined by ``\\n``.
    Reads only the ends of a long text."""
    parts = text.split("\n", _SPLIT)
    if len(parts) <= _SPLIT:
        lines = [p for p in parts if p and not p.isspace()]
        if len(lines) > 2 * EDGE_LINES:
            lines = lines[:EDGE_LINES] + lines[-EDGE_LINES:]
    else:
        head = [p for p in parts[:_SPLIT] if p and not p.isspace()][:EDGE_LINES]
        tail = [p for p in text.rsplit("\n", _SPLIT)[1:] if p and not p.isspace()][-EDGE_LINES:]
        lines = head + tail
    return "\n".join(line[:LINE_CHARS].rstrip() for line in lines)


def json_error(text: str) -> bool:
    """True when ``text`` is a JSON object with a meaningful top-level ``"error"`` (rule step 2)."""
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
    None (no result yet). ``patterns`` replace :data:`DEFAULT_FAILURE_PATTERNS`."""

    __slots__ = ("_compiled", "patterns")

    def __init__(self, patterns: Sequence[str] = DEFAULT_FAILURE_PATTERNS) -> None:
        self.patterns = tuple(patterns)
        self._compiled = tuple(compile_pattern(p) for p in self.patterns)

    def reason(self, text: str) -> str | None:
        """Why ``text`` is a failure: ``"json"``, or the first pattern that matched; None when it
        is not one (rule steps 2 and 3; the flag is :meth:`__call__`'s business)."""
        if json_error(text):
            return "json"
        if self._compiled:
            edges = edge_lines(text)
            for pattern, compiled in zip(self.patterns, self._compiled, strict=True):
                if compiled.search(edges) is not None:
                    return pattern
        return None

    def __call__(self, result: ToolResult | None) -> bool | None:
        if result is None:
            return None
        if result.is_error is not None:
            return result.is_error
        return self.reason(result.text) is not None
