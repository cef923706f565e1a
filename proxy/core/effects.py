"""What a tool call may change (DESIGN §2.2): "the same call getting the same result,
with nothing in between that could have changed it" is evidence of a loop; a repeat with
state-changing calls in between (``cp x.orig x`` between fix attempts, ``git diff`` after every
edit) is not.

Rules:
- A call is **read-only** when
  - its tool matches ``read_only_tools`` (extra patterns; DESIGN §6 pattern syntax), or its name
    says so: split into words (``read_file``, ``WebFetch``, ``mcp__fs__read_text``), it has a word
    of :data:`READ_VERBS` and none of :data:`WRITE_VERBS`, and it is not in
    ``state_changing_tools``;
  - a multiplexed tool (:func:`proxy.core.targets.subcommand`: ``str_replace_editor {"command":
    "view"}``) is read-only when its subcommand is in :data:`READ_SUBCOMMANDS`, whatever its name;
  - a shell call (a ``command``/``cmd`` argument holding a command line) is read-only when every
    simple command of it (split on ``&&``, ``||``, ``;``, ``|``, newlines) runs a program of
    ``read_only_commands`` (``cat``, ``grep``, ``sed`` without ``-i``, ``git diff``, …) and nothing
    writes: no output redirection other than to ``/dev/null`` or another descriptor, no ``tee``,
    no ``find -delete``/``-exec``, no heredoc.
  Anything else may change state (unknown tools and programs included: precision first).
- A call **changes the situation** when it may change state, its result is not a failure, not a
  user's rejection (a rejected edit changed nothing) and not a cancellation
  (:func:`proxy.core.failures.cancelled`: it never ran), and it is *novel*: no earlier call with the
  same tool and canonical arguments got the same result (masked, :mod:`proxy.core.progress`). A second
  identical write with the same result leaves the state as the first one did.
- A call that waits on a running process (:func:`proxy.core.waits.is_wait`) changes the situation:
  time passed while the process ran, so a status check after it is not a repeat of the one
  before it.
- :func:`epochs` numbers the situations: ``before[i]`` is how many calls changed the situation
  before call *i*; ``after[i]`` includes call *i* itself. A later call *C* repeats an earlier
  call *P* "with nothing in between that could have changed it" when ``before[C] == after[P]``.

Pure; never raises on odd arguments.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.config import ProgressConfig
from proxy.config.defaults import DEFAULT_READ_ONLY_COMMANDS, DEFAULT_READ_ONLY_TOOLS
from proxy.core import agents
from proxy.core.canonical import canonical_arguments
from proxy.core.episodes import ContinuationRule, EpisodeCounter, episodes
from proxy.core.failures import FailureRule, RejectionRule, cancelled
from proxy.core.memo import Memo, verdict_bytes
from proxy.core.patterns import NamePatterns
from proxy.core.progress import DEFAULT_MASKS, Masks, compile_masks, same_result
from proxy.core.targets import COMMAND_ARGS, own_command, subcommand
from proxy.core.transcript import ToolCall, Transcript
from proxy.core.waits import is_wait

#: Words of a tool name that mark it as reading (with none of :data:`WRITE_VERBS`).
READ_VERBS = frozenset(
    (
        "read",
        "view",
        "open",
        "goto",
        "scroll",
        "search",
        "find",
        "grep",
        "glob",
        "ls",
        "list",
        "get",
        "cat",
        "fetch",
        "show",
        "look",
        "inspect",
        "describe",
        "think",
        "status",
        "query",
        "lookup",
        "head",
        "tail",
        "browse",
        "navigate",
    )
)
#: Words of a tool name that mark it as possibly writing, whatever else it says.
WRITE_VERBS = frozenset(
    (
        "write",
        "edit",
        "create",
        "delete",
        "remove",
        "rm",
        "update",
        "set",
        "put",
        "post",
        "apply",
        "replace",
        "insert",
        "move",
        "mv",
        "rename",
        "run",
        "exec",
        "execute",
        "bash",
        "shell",
        "sh",
        "cmd",
        "terminal",
        "install",
        "commit",
        "push",
        "patch",
        "save",
        "append",
        "send",
        "submit",
        "kill",
        "start",
        "stop",
        "restart",
        "upload",
        "modify",
        "change",
        "make",
        "mkdir",
        "touch",
        "copy",
        "cp",
        "clear",
        "reset",
    )
)
#: Subcommands of multiplexed tools that only read.
READ_SUBCOMMANDS = frozenset(
    (
        "view",
        "read",
        "show",
        "list",
        "get",
        "search",
        "find",
        "status",
        "diff",
        "cat",
        "open",
        "print",
        "info",
        "help",
        "log",
    )
)
#: ``git`` subcommands that only read.
GIT_READ = frozenset(
    (
        "status",
        "diff",
        "log",
        "show",
        "blame",
        "grep",
        "ls-files",
        "ls-tree",
        "rev-parse",
        "describe",
        "shortlog",
        "reflog",
        "cat-file",
    )
)

_WORDS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")
_SEGMENTS = re.compile(r"&&|\|\||[;|\n]")
_REDIRECT = re.compile(r"(?<![<>&\d])(?:\d?>>?|&>)\s*(?!&|/dev/null\b)(\S+)")
_ASSIGN = re.compile(r"^[A-Za-z_]\w*=\S*$")
_QUOTED = re.compile(r"'[^']*'|\"(?:[^\"\\\\]|\\\\.)*\"")


def name_words(tool: str) -> list[str]:
    """Lower-case words of a tool name: ``mcp__fs__readText`` → ``["mcp", "fs", "read", "text"]``."""
    return [w.lower() for w in _WORDS.findall(tool)]


def shell_read_only(command: str, programs: frozenset[str]) -> bool:
    """True when every simple command of ``command`` runs one of ``programs`` and nothing in it
    writes (see the module docstring). Quoted text is not looked into (``grep "a|b"`` is one
    command); ``$(…)`` and backquotes make it not read-only."""
    command = _QUOTED.sub("Q", command)
    if "<<" in command or "`" in command or "$(" in command or _REDIRECT.search(command):
        return False
    for segment in _SEGMENTS.split(command):
        words = segment.split()
        while words and _ASSIGN.match(words[0]):  # FOO=1 cmd
            words.pop(0)
        if not words:
            continue
        prog = words[0].rsplit("/", 1)[-1]
        if prog not in programs:
            return False
        rest = words[1:]
        if prog == "sed" and any(w.startswith("-i") or w.startswith("--in-place") for w in rest):
            return False
        if prog == "find" and any(w in ("-delete", "-exec", "-execdir", "-ok", "-fprint") for w in rest):
            return False
        if prog == "git":
            sub = next((w for w in rest if not w.startswith("-")), "")
            if sub not in GIT_READ:
                return False
    return True


def command_line(value: Any) -> str | None:
    """The shell command line of a ``command`` argument: a non-blank string, or an argv list
    (Codex: ``["bash", "-lc", "git status"]`` → ``git status``; ``["ls", "-la"]`` → ``ls -la``)."""
    if isinstance(value, str):
        return value if value.strip() else None
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        if (
            len(value) == 3
            and value[0].rsplit("/", 1)[-1] in ("bash", "sh", "zsh")
            and value[1]
            in (
                "-c",
                "-lc",
            )
        ):
            return value[2] if value[2].strip() else None
        return " ".join(value)
    return None


class EffectRule:
    """``EffectRule()(call) -> bool``: True when ``call`` may change state (not read-only).

    ``read_only_tools`` / ``state_changing_tools``: extra tool-name patterns; ``read_only_commands``:
    the programs of :func:`shell_read_only`. Verdicts are memoized per (tool, arguments string):
    an agent's old calls come back on every request. Equal when configured alike."""

    __slots__ = ("_changing", "_memo", "_programs", "_read_only", "config")

    #: Bounds of the verdicts' memo (entries; bytes by :func:`proxy.core.memo.verdict_bytes`).
    MEMO_ENTRIES = 2048
    MEMO_BYTES = 1024 * 1024

    def __init__(
        self,
        read_only_tools: Sequence[str] = DEFAULT_READ_ONLY_TOOLS,
        state_changing_tools: Sequence[str] = (),
        read_only_commands: Sequence[str] = DEFAULT_READ_ONLY_COMMANDS,
    ) -> None:
        self.config = (tuple(read_only_tools), tuple(state_changing_tools), tuple(read_only_commands))
        self._read_only = NamePatterns(self.config[0])
        self._changing = NamePatterns(self.config[1])
        self._programs = frozenset(self.config[2])
        self._memo: Memo[tuple[str, str], bool] = Memo(self.MEMO_ENTRIES, self.MEMO_BYTES, verdict_bytes)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EffectRule) and other.config == self.config

    def __hash__(self) -> int:
        return hash(self.config)

    def may_change(self, name: str, arguments: Any) -> bool:
        if self._changing.matches(name):
            return True
        if self._read_only.matches(name):
            return False
        sub = subcommand(arguments)
        kind = agents.kind_of(name, arguments, sub)
        if kind in agents.READ_ONLY_KINDS:
            return False
        if kind in ("mutate", "delegate"):
            return True
        if sub is not None:
            return sub not in READ_SUBCOMMANDS
        if isinstance(arguments, dict):
            for arg in COMMAND_ARGS:
                value = command_line(arguments.get(arg))
                if value is not None:
                    if own_command(name, value):
                        break  # SWE-agent style: the tool's own command line ("open a.py 10")
                    return not shell_read_only(value, self._programs)
        words = set(name_words(name))
        return not (words & READ_VERBS) or bool(words & WRITE_VERBS)

    def __call__(self, call: ToolCall) -> bool:
        raw = call.arguments_raw
        if not isinstance(raw, str):
            return self.may_change(call.name, call.arguments)
        key = (call.name, raw)
        verdict = self._memo.get(key)
        if verdict is None:
            verdict = self._memo.put(key, self.may_change(call.name, call.arguments))
        return verdict


def effect_rule(progress: ProgressConfig) -> EffectRule:
    """What may change state by the config's ``progress`` section (its ``read_only_tools``,
    ``state_changing_tools`` and ``read_only_commands``)."""
    return EffectRule(progress.read_only_tools, progress.state_changing_tools, progress.read_only_commands)


def progress_rules(progress: ProgressConfig) -> tuple[Masks, EffectRule, ContinuationRule]:
    """The rule objects the guards read from the config's ``progress`` section: its masks
    compiled, what may change state, which user messages continue a turn. Raises ``re.error``
    for a pattern that does not compile (nothing for a checked config)."""
    return (
        compile_masks(progress.masks),
        effect_rule(progress),
        ContinuationRule(progress.continuation_patterns),
    )


@dataclass(frozen=True, slots=True)
class Epochs:
    """``before[i]``/``after[i]``: situation numbers around call *i* (see the module docstring)."""

    before: tuple[int, ...]
    after: tuple[int, ...]

    def unchanged(self, earlier: int, later: int) -> bool:
        """True when nothing between calls ``earlier`` and ``later`` (indexes) changed the
        situation (``earlier``'s own effect included)."""
        return self.before[later] == self.after[earlier]


#: The last few computations (the guards of one request ask for the same calls, or for the calls
#: of the tools they guard), by identity of the calls sequence.
_recent: list[tuple[Sequence[ToolCall], tuple[Any, ...], Epochs]] = []
RECENT = 4


def epochs(
    calls: Sequence[ToolCall],
    effects: EffectRule,
    failures: FailureRule,
    masks: Masks = DEFAULT_MASKS,
    rejections: RejectionRule | None = None,
) -> Epochs:
    """The situation numbers of ``calls`` (conversation order); ``rejections`` says which results
    are a user's rejection. The last few computations are remembered."""
    config = (effects, failures.patterns, masks, rejections)
    for seen_calls, seen_config, seen_out in _recent:
        if seen_calls is calls and seen_config == config:
            return seen_out
    before: list[int] = []
    after: list[int] = []
    seen: dict[tuple[str, str], list[Any]] = {}
    n = 0
    for call in calls:
        before.append(n)
        if is_wait(call):  # time passed while a process ran: what it changed may show now
            n += 1
        elif effects(call):
            key = (call.name, canonical_arguments(call.arguments, call.arguments_raw))
            results = seen.get(key)
            if call.result is None or call.result.pending:  # judged by the previous pair
                novel = results is None
            else:
                novel = results is None or not any(same_result(r, call.result, masks) for r in results)
                seen.setdefault(key, []).append(call.result)
                del seen[key][:-4]  # the last few results of a key are enough
            # classified only when it matters: a failed, rejected or cancelled call changed nothing
            if novel and failures(call.result) is not True and not (rejections and rejections(call.result)):
                n += 0 if cancelled(call.result) else 1
        after.append(n)
    out = Epochs(tuple(before), tuple(after))
    _recent.insert(0, (calls, config, out))
    del _recent[RECENT:]
    return out


class EpochCounter:
    """:func:`epochs` one call at a time (a guard that resumes from a kept state adds only the
    new calls): :meth:`add` the calls in conversation order, then ask
    :meth:`unchanged` as of :class:`Epochs` (by index in the order added). Mutable; :meth:`copy`
    is independent. Gives exactly what :func:`epochs` gives for the same calls."""

    __slots__ = ("_own_seen", "_rule", "after", "before", "count", "n", "seen")

    def __init__(self, situations: Situations) -> None:
        self._rule = situations
        self.n = 0
        #: the calls added; ``before``/``after`` hold at least that many numbers (a copy shares
        #: them with the counter it was made from: what either adds goes after the shared
        #: first ``count``, which never change)
        self.count = 0
        self.before: list[int] = []
        self.after: list[int] = []
        #: per (tool, arguments) of a call that may change the situation, its last 4 results
        #: (tuples: a copy shares them; the dict too, until either changes it)
        self.seen: dict[tuple[str, str], tuple[Any, ...]] = {}
        self._own_seen = True

    def add(self, call: ToolCall) -> None:
        """Number ``call``, the next one in conversation order."""
        rule = self._rule
        if len(self.before) != self.count:  # a counter sharing the numbers added past them
            self.before = self.before[: self.count]
            self.after = self.after[: self.count]
        self.count += 1
        self.before.append(self.n)
        if is_wait(call):  # as in :func:`epochs`
            self.n += 1
        elif rule.effects(call):
            key = (call.name, canonical_arguments(call.arguments, call.arguments_raw))
            results = self.seen.get(key)
            if call.result is None or call.result.pending:  # judged by the previous pair
                novel = results is None
            else:
                novel = results is None or not any(same_result(r, call.result, rule.masks) for r in results)
                if not self._own_seen:
                    self.seen, self._own_seen = dict(self.seen), True
                self.seen[key] = (*(results or ())[-3:], call.result)  # the last few results are enough
            # classified only when it matters: a failed, rejected or cancelled call changed nothing
            if novel and rule.failures(call.result) is not True and not rule.rejections(call.result):
                self.n += 0 if cancelled(call.result) else 1
        self.after.append(self.n)

    def unchanged(self, earlier: int, later: int) -> bool:
        """As :meth:`Epochs.unchanged`."""
        return self.before[later] == self.after[earlier]

    def copy(self) -> EpochCounter:
        """An independent copy, sharing what is read so far (copy on write: a resumed request
        copies every guard's counter twice, each holding two numbers per call of a long
        history, and adds a few calls to one of them)."""
        out = EpochCounter(self._rule)
        out.n, out.count = self.n, self.count
        out.before, out.after = self.before, self.after
        out.seen, out._own_seen = self.seen, False
        self._own_seen = False  # shared from now on: either copies it before changing it
        return out


@dataclass(frozen=True, slots=True)
class Situations:
    """What progress-aware guards need to tell a repeat from progress: the result ``masks``, the
    ``effects`` rule, the ``failures`` rule and ``rejections`` (a failed or rejected call changed
    nothing), and the ``continuations`` rule (which user messages do not start a new episode).
    Built once from the config (:func:`proxy.guards.build_guards`)."""

    masks: Masks = DEFAULT_MASKS
    effects: EffectRule = field(default_factory=EffectRule)
    failures: FailureRule = field(default_factory=FailureRule)
    rejections: RejectionRule = field(default_factory=RejectionRule)
    continuations: ContinuationRule = field(default_factory=ContinuationRule)

    def epochs(self, calls: Sequence[ToolCall]) -> Epochs:
        return epochs(calls, self.effects, self.failures, self.masks, self.rejections)

    def epoch_counter(self) -> EpochCounter:
        """An empty :class:`EpochCounter` under these rules."""
        return EpochCounter(self)

    def edit_ledger(self) -> EditLedger:
        """An empty :class:`EditLedger` under these rules."""
        return EditLedger(self)

    def episode_counter(self) -> EpisodeCounter:
        """An empty :class:`proxy.core.episodes.EpisodeCounter` under the continuation rule."""
        return EpisodeCounter(self.continuations)

    def episodes(self, transcript: Transcript) -> tuple[int, ...]:
        """Per call, its episode (:mod:`proxy.core.episodes`): turns that continuations do not split."""
        return episodes(transcript, self.continuations)


#: Words of a tool name (or subcommand) that mark a tool the table does not know as editing a file.
EDIT_VERBS = frozenset(("edit", "write", "replace", "patch", "insert", "create", "modify", "apply"))
#: ... unless it also has one of these (a command runner may write, but its success says nothing
#: about a file).
RUN_VERBS = frozenset(("run", "exec", "execute", "bash", "shell", "sh", "cmd", "terminal", "command"))
#: How many changes per target an :class:`EditLedger` keeps (the newest).
LEDGER_CHANGES = 32


def is_mutation(name: str, arguments: Any) -> bool:
    """True when a call edits a file: its tool (or subcommand) is of kind ``mutate`` in
    :mod:`proxy.core.agents`, or, for a tool the table does not know, its name has a word of
    :data:`EDIT_VERBS` and none of :data:`RUN_VERBS` (``edit_file``, ``apply_diff``)."""
    sub = subcommand(arguments)
    kind = agents.kind_of(name, arguments, sub)
    if kind is not None or agents.tool(name) is not None:
        return kind == "mutate"
    words = set(name_words(name))
    if sub is not None:
        words.update(name_words(sub))
    return bool(words & EDIT_VERBS) and not words & RUN_VERBS


class EditLedger:
    """Which successful edits are progress (DESIGN §2.2: "a successful mutation with new
    arguments is progress even when its result is a constant success line").

    ``ledger.progress(call, on) -> bool`` for the calls of one episode in conversation order,
    ``on`` what the call is on (:func:`proxy.core.targets.call_on`): True when the call edits a file
    (:func:`is_mutation`), its result is known, not a failure (``situations.failures``) and not a
    user's rejection, and its change is new on that target: not the change of an earlier
    successful edit on it (the same edit again) and not one that undoes it (its old and new texts
    swapped: A→B then B→A, :func:`proxy.core.agents.undoes`). What a call changes is
    :func:`proxy.core.agents.change_of` for the agents' edit tools, else its canonical arguments. The
    last :data:`LEDGER_CHANGES` changes per target are kept. Mutable; :meth:`copy` is
    independent."""

    __slots__ = ("_rule", "seen")

    def __init__(self, situations: Situations) -> None:
        self._rule = situations
        #: per target, its successful edits' changes (tuples: a copy shares them)
        self.seen: dict[tuple[str, str | None], tuple[Any, ...]] = {}

    def progress(self, call: ToolCall, on: tuple[str, str | None]) -> bool:
        result = call.result
        if result is None or result.pending or not is_mutation(call.name, call.arguments):
            return False
        rule = self._rule
        if rule.failures(result) is True or rule.rejections(result):
            return False
        change: Any = agents.change_of(call.name, call.arguments, call.arguments_raw)
        if change is None:
            change = canonical_arguments(call.arguments, call.arguments_raw)
        seen = self.seen.get(on, ())
        self.seen[on] = (*seen[-(LEDGER_CHANGES - 1) :], change)
        if change in seen:
            return False
        return not (
            isinstance(change, tuple) and any(isinstance(e, tuple) and agents.undoes(change, e) for e in seen)
        )

    def copy(self) -> EditLedger:
        out = EditLedger(self._rule)
        out.seen = dict(self.seen)
        return out
