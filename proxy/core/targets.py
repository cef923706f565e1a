"""Target of a tool call (DESIGN §6.3, §6.5): the file, command or URL a call acts on.

The target is the value of the first *present* argument among the configured names (default
:data:`DEFAULT_TARGET_ARGS`; a per-tool override replaces that list for the tools it names),
whitespace-normalized: leading and trailing whitespace removed, every inner run of whitespace
collapsed to one space. "Present" means the argument holds a non-blank string, a number, or a
list of strings and numbers (an argv such as ``["python", "fix.py"]``, joined with spaces);
anything else (null, an object, a boolean, ``""``) is skipped and the next name is tried. A call
whose arguments are not a JSON object, or that has none of the names, has no target.

Per-tool overrides (``targets: {my_tool: [arg, …]}``) are keyed by tool-name pattern (DESIGN §6:
whole name, case-sensitive, ``*`` the only wildcard). An exact name wins over a wildcard pattern;
among wildcard patterns the first listed wins. ``my_tool: []`` gives that tool no target.

A tool whose ``command`` argument is its own command line (SWE-agent: ``edit {"command": "edit
264:265\n…"}``, ``open {"command": "open a.py 232"}``) has the first line of it, line numbers and
ranges dropped, as target: ``edit``, ``open a.py``. Retried edits of the open file are
calls on one target whatever lines they name; the text being written is not part of it.

A target taken from a ``command`` or ``cmd`` argument is a *command target*; its
:attr:`Target.words` are the words of the command (split on whitespace and the shell operators
``; & | < > ( )`` and backquotes, quotes stripped, a leading ``./`` dropped), so that a rule can
tell that ``python fix.py`` runs the file that ``write_file {"path": "fix.py"}`` wrote.
:func:`path_key` applies the same ``./`` rule to a plain target.

Pure functions over decoded arguments; never raise.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core import agents
from proxy.core.patterns import NamePatterns

DEFAULT_TARGET_ARGS = (
    "path",
    "file_path",
    "filepath",
    "filePath",  # OpenCode's read, edit and write
    "absolute_path",  # Gemini CLI's read_file
    "file",
    "filename",
    "target_file",
    "notebook_path",
    "command",
    "cmd",
    "url",
)
#: Argument names whose value is a shell command (its target is a command target).
COMMAND_ARGS = frozenset({"command", "cmd"})
#: Argument names that can hold the subcommand of a multiplexed tool (:func:`subcommand`).
SUBCOMMAND_ARGS = ("command", "action", "operation", "op", "subcommand", "mode")
_SUBCOMMAND = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_LINE_SPEC = re.compile(r"^\d+(?::\d+)?$")

_SPACE = re.compile(r"\s+")
_WORD_SPLIT = re.compile(r"[\s;&|<>()`]+")


def normalize(value: Any) -> str | None:
    """The whitespace-normalized text of an argument value, or None when it is not a usable target
    (see the module docstring)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        text = _SPACE.sub(" ", value).strip()
        return text or None
    if (
        isinstance(value, list)
        and value
        and all(isinstance(v, str | int | float) and not isinstance(v, bool) for v in value)
    ):
        return normalize(" ".join(str(v) for v in value))
    return None


def path_key(text: str) -> str:
    """``text`` with surrounding quotes and a leading ``./`` removed (``./fix.py`` → ``fix.py``)."""
    text = text.strip("'\"")
    while text.startswith("./") and len(text) > 2:
        text = text[2:]
    return text


def command_words(command: str) -> frozenset[str]:
    """The words of a shell command as :func:`path_key` forms: ``cd src && python ./fix.py`` →
    ``{"cd", "src", "python", "fix.py"}``."""
    return frozenset(w for w in (path_key(p) for p in _WORD_SPLIT.split(command)) if w)


def subcommand(arguments: Any) -> str | None:
    """The subcommand of a multiplexed tool: ``str_replace_editor
    {"command": "view", "path": "a.py"}`` → ``"view"``. The value of the first of
    :data:`SUBCOMMAND_ARGS` that is one short lower-case word, in a call that also names what it
    acts on with another target argument (``path``, ``file``, …; so ``bash {"command": "ls"}`` has
    none). None otherwise."""
    if not isinstance(arguments, dict):
        return None
    if not any(
        isinstance(arguments.get(a), str) and arguments[a].strip()
        for a in DEFAULT_TARGET_ARGS
        if a not in COMMAND_ARGS
    ):
        return None
    for name in SUBCOMMAND_ARGS:
        value = arguments.get(name)
        if isinstance(value, str) and _SUBCOMMAND.match(value):
            return value
    return None


@dataclass(frozen=True, slots=True)
class Target:
    """``value``: the normalized target text. ``arg``: the argument it came from."""

    value: str
    arg: str

    @property
    def is_command(self) -> bool:
        return self.arg in COMMAND_ARGS

    @property
    def words(self) -> frozenset[str]:
        """The command's words (:func:`command_words`) for a command target, else empty."""
        return command_words(self.value) if self.is_command else frozenset()


class TargetRule:
    """Finds the target of a call: ``TargetRule()("write_file", {"path": "fix.py"})`` →
    ``Target("fix.py", "path")``. ``overrides`` maps tool-name patterns to argument-name lists."""

    __slots__ = ("_args", "_exact", "_wild")

    def __init__(
        self,
        args: Sequence[str] = DEFAULT_TARGET_ARGS,
        overrides: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self._args = tuple(args)
        overrides = overrides or {}
        self._exact = {k: tuple(v) for k, v in overrides.items() if "*" not in k}
        self._wild = [(NamePatterns([k]), tuple(v)) for k, v in overrides.items() if "*" in k]

    def arg_names(self, tool: str) -> tuple[str, ...]:
        """The argument names tried, in order, for ``tool``."""
        if tool in self._exact:
            return self._exact[tool]
        for pattern, names in self._wild:
            if pattern.matches(tool):
                return names
        return self._args

    def __call__(self, tool: str, arguments: Any) -> Target | None:
        if not isinstance(arguments, dict):
            return None
        for name in self.arg_names(tool):
            if name in arguments:
                raw = arguments[name]
                if name in COMMAND_ARGS and isinstance(raw, str) and own_command(tool, raw):
                    # "edit 264:265\n<new text>" → "edit"; "open a.py 232" → "open a.py"
                    first = raw.strip().split("\n", 1)[0].split()
                    raw = " ".join(w for w in first if not _LINE_SPEC.match(w))
                value = normalize(raw)
                if value is not None:
                    return Target(value, name)
        return None


def call_on(rule: TargetRule, name: str, arguments: Any, raw: Any = None) -> tuple[str, str | None]:
    """What a call is on, for rules that follow one tool on one target (repeated_failure, the
    escalation ladder): (tool name with its :func:`subcommand`, target as :func:`path_key` for a
    path, the command text for a command; None when the call has no target). A patch tool's call
    (Codex ``apply_patch``, whose raw input ``raw`` is the patch) is on the first file its patch
    names (:func:`proxy.core.agents.patched_files`), and so is a shell call that runs a patch (Codex's
    ``exec_command {"cmd": "apply_patch <<'EOF' …"}``, :func:`proxy.core.agents.shell_patch`), as the
    patch tool (:func:`proxy.core.agents.runs_as`): retries of one patch are calls on one target
    however their patch text drifts, and a patch run either way is the same edit."""
    target = rule(name, arguments)
    sub = subcommand(arguments)
    tool = f"{name} {sub}" if sub else name
    if target is None or target.is_command:
        files = agents.patched_files(name, arguments, raw)
        if files:
            return agents.runs_as(name, arguments), path_key(files[0])
        if target is None:
            return tool, None
    return tool, target.value if target.is_command else path_key(target.value)


def own_command(tool: str, command: str) -> bool:
    """True when ``command`` is the tool's own command line (SWE-agent's ``edit`` tool called with
    ``{"command": "edit 264:265\\n…\\nend_of_edit"}``): its target is the command's first line (the
    file region), not the text being written."""
    words = command.split(None, 1)
    return bool(words) and words[0] == tool and tool not in ("bash", "sh", "shell")
