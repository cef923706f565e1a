"""Configuration: one YAML file parsed once into frozen dataclasses (DESIGN §8).

Every key is optional; unknown keys, wrong types and out-of-range values raise
:class:`proxy.errors.ConfigError` naming the dotted key path (``guards.repeat_reminder.thresholds``).
The defaults here are the ones documented in ``config/loopguard.yaml``. Precedence for the listen
address and upstream: command-line flags, then ``LOOPGUARD_*`` environment variables, then the file,
then these defaults (see :mod:`proxy.cli.main`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import string
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml

from proxy.config.redact import redact_url
from proxy.core.effects import DEFAULT_READ_ONLY_COMMANDS, DEFAULT_READ_ONLY_TOOLS, EffectRule
from proxy.core.episodes import DEFAULT_CONTINUATION_PATTERNS, ContinuationRule
from proxy.core.failures import DEFAULT_FAILURE_PATTERNS, compile_pattern
from proxy.core.volatile import DEFAULT_MASK_PATTERNS, Masks, compile_masks
from proxy.errors import ConfigError

#: ``mode`` of a guard, of ``stop``, of ``response`` and of the whole file (issue 16).
Mode = Literal["enforce", "observe"]

DEFAULT_IGNORE_ARGS = ("description", "explanation", "reason", "thought", "purpose")
DEFAULT_EXEMPT = ("todo_write", "ask_user_question", "exit_plan_mode")
#: The placeholders a ``guards.circuit_breaker.deny_message`` template may use.
DENY_PLACEHOLDERS = ("tool", "count", "limit", "kind")


def _check_failure_patterns(patterns: tuple[str, ...], key: str) -> Iterator[ConfigError]:
    """Each pattern must compile as a failure pattern (:func:`proxy.core.failures.compile_pattern`);
    the error names ``key[i]``."""
    for i, pattern in enumerate(patterns):
        try:
            compile_pattern(pattern)
        except re.error as e:
            yield ConfigError(f"{key}[{i}]", f"is not a valid regular expression: {e}")
        except ValueError as e:
            yield ConfigError(f"{key}[{i}]", f"is rejected: {e}")


def _check_thresholds(thresholds: tuple[int, ...], key: str) -> Iterator[ConfigError]:
    """A reminder rule's thresholds: not empty, integers >= 2, none twice; the error names ``key``."""
    if not thresholds:
        yield ConfigError(key, "must not be empty")
    elif any(t < 2 for t in thresholds):
        yield ConfigError(key, "every threshold must be an integer >= 2")
    if len(set(thresholds)) != len(thresholds):
        yield ConfigError(key, "thresholds must not repeat")


@dataclass(frozen=True)
class ListenConfig:
    """The agent side (issue 14, items 1 and 4; :mod:`proxy.edge.connections`). Seconds throughout.

    ``shutdown_grace_s``: on SIGTERM/SIGINT, how long requests in flight may take to finish
    before they are ended.

    ``header_timeout_s`` (60): the longest an agent may take to send a request's headers: from
    the connection's opening, and on a kept-alive connection from the first byte of its next
    request. Then the connection is closed (with a 408 and an OpenAI-style error body if part
    of a request had arrived; silently if nothing had). Every HTTP client sends its headers in
    one write right after connecting, so 60 s (nginx's ``client_header_timeout``) is only ever
    reached by a client that is stuck or gone. An idle kept-alive connection (nothing sent since
    the last answer) is not timed by this: it stays open for aiohttp's ``keepalive_timeout``
    (3,630 s), longer than any client keeps an idle pooled connection (httpx 5 s, Go and Rust
    90 s), so the client always closes it first and a request never races a close.

    ``body_timeout_s`` (60): the longest the request body may stall: idle time between two
    reads, not the whole upload, so a 20 MB body on a slow link is never cut while bytes keep
    coming. Then the agent gets a 408 (``error.type: "request_timeout"``) and the connection is
    closed; nothing was sent upstream. Agents send their body as fast as the network allows, so
    a minute without a byte (nginx's ``client_body_timeout``) means a dead client or network.
    ``null`` turns either timeout off (then aiohttp's 3,630 s still ends a silent connection).

    ``max_connections`` (1024): agent connections open at once (active and kept-alive idle).
    One more is answered at once with a 503 (``error.type: "too_many_connections"``,
    ``Retry-After: 1``) and closed, never queued, so an agent is told instead of hanging, and
    stalled clients cannot use up the process's file descriptors (at start the soft
    ``RLIMIT_NOFILE`` is raised, up to the hard limit, to fit this many connections plus the
    upstream pool; a warning says so when the hard limit is lower).
    """

    host: str = "127.0.0.1"
    port: int = 4000
    shutdown_grace_s: float = 30.0
    header_timeout_s: float | None = 60.0
    body_timeout_s: float | None = 60.0
    max_connections: int = 1024

    def check(self, path: str) -> Iterator[ConfigError]:
        if not 0 <= self.port <= 65535:
            yield ConfigError(f"{path}.port", "must be between 0 and 65535")
        if self.shutdown_grace_s < 0:
            yield ConfigError(f"{path}.shutdown_grace_s", "must be >= 0")
        for name in ("header_timeout_s", "body_timeout_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                yield ConfigError(f"{path}.{name}", "must be > 0 or null")
        if self.max_connections < 1:
            yield ConfigError(f"{path}.max_connections", "must be an integer >= 1")


@dataclass(frozen=True)
class UpstreamConfig:
    """``url``: base URL as in ``OPENAI_BASE_URL``. Timeouts in seconds: ``read_timeout_s`` is the
    longest the upstream may send nothing — before its response headers (a non-streaming answer
    is generated in that time) and between any two reads of its body; ``null`` = wait forever
    (issue 14, item 1: the default ends every stall). ``max_body_mb``: largest request body
    accepted, MiB.

    ``stream_json_requests`` (issue 14, item 13; default false): a chat-completions request the
    agent sends without ``"stream": true`` goes upstream as a stream (``"stream": true`` and, when
    the body has no ``stream_options``, ``"stream_options": {"include_usage": true}``, spliced
    into the bytes; ``Accept-Encoding`` dropped) and the answer is assembled into the one
    ``chat.completion`` object the agent asked for (:mod:`proxy.response.as_stream`). Then an agent that
    hangs up frees the model slot on servers that only notice a closed *stream*
    (llama-cpp-python), and the runaway and degenerate-text cuts apply as they do to streams. Off
    by default: the agent then gets JSON loopguard wrote, not the server's bytes, and some
    upstreams refuse or change streamed requests (an upstream that refuses the stream itself, or
    answers with an empty stream, gets the original request once more)."""

    url: str = "http://127.0.0.1:8080/v1"
    connect_timeout_s: float = 10.0
    read_timeout_s: float | None = 900.0
    max_body_mb: int = 64
    stream_json_requests: bool = False

    def check(self, path: str) -> Iterator[ConfigError]:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            yield ConfigError(f"{path}.url", f"must be an http(s) URL, got {_shown(f'{path}.url', self.url)}")
        if self.connect_timeout_s <= 0:
            yield ConfigError(f"{path}.connect_timeout_s", "must be > 0")
        if self.read_timeout_s is not None and self.read_timeout_s <= 0:
            yield ConfigError(f"{path}.read_timeout_s", "must be > 0 or null")
        if self.max_body_mb < 1:
            yield ConfigError(f"{path}.max_body_mb", "must be an integer >= 1")


@dataclass(frozen=True)
class ConversationKeyConfig:
    """Request headers tried in order for the conversation key (DESIGN §4), case-insensitive."""

    headers: tuple[str, ...] = ("x-session-id", "session_id", "conversation_id")


@dataclass(frozen=True)
class RepeatReminderConfig:
    """Advisory reminders on consecutive identical calls (DESIGN §6.1)."""

    enabled: bool = True
    thresholds: tuple[int, ...] = (3, 5, 8)
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    ignore_args: tuple[str, ...] = DEFAULT_IGNORE_ARGS
    arguments_preview_chars: int = 500
    inject_as: Literal["user", "tool_suffix"] = "user"
    #: A repeat counts only when its result equals the previous one's (masked, ``progress.masks``).
    progress_aware: bool = True
    #: ``enforce`` (apply) or ``observe`` (decide, log, count, change nothing): :meth:`Config.observed_rules`
    mode: Mode = "enforce"

    def check(self, path: str) -> Iterator[ConfigError]:
        yield from _check_thresholds(self.thresholds, f"{path}.thresholds")
        if self.arguments_preview_chars < 1:
            yield ConfigError(f"{path}.arguments_preview_chars", "must be an integer >= 1")

    def __post_init__(self) -> None:
        object.__setattr__(self, "thresholds", tuple(sorted(self.thresholds)))


@dataclass(frozen=True)
class CircuitBreakerConfig:
    """Denial of windowed duplicate calls and a lifetime cap (DESIGN §6.2).

    ``deny_message``: a template with ``{tool}``, ``{count}``, ``{limit}``, ``{kind}``; empty = the
    built-in text for each kind (``proxy.guards.circuit_breaker``). ``incident_log``: JSONL file
    path; empty = off.
    """

    enabled: bool = True
    duplicate_limit: int = 6
    window: int = 200
    max_calls_per_agent: int = 300
    exempt: tuple[str, ...] = DEFAULT_EXEMPT
    only: tuple[str, ...] = ()
    ignore_args: tuple[str, ...] = DEFAULT_IGNORE_ARGS
    deny_message: str = ""
    incident_log: str = ""
    #: A duplicate counts only when its result equals the previous one's (masked, ``progress.masks``).
    progress_aware: bool = True
    #: Drop ``ignore_args`` even when they are all a call has (the seed); False keeps them then.
    ignore_sole_args: bool = False
    #: ``enforce`` (apply) or ``observe`` (decide, log, count, change nothing): :meth:`Config.observed_rules`
    mode: Mode = "enforce"

    def check(self, path: str) -> Iterator[ConfigError]:
        if self.duplicate_limit < 1:
            yield ConfigError(f"{path}.duplicate_limit", "must be an integer >= 1")
        if self.window < 1:
            yield ConfigError(f"{path}.window", "must be an integer >= 1")
        elif self.window < self.duplicate_limit:
            yield ConfigError(
                f"{path}.window", f"must be >= duplicate_limit ({self.duplicate_limit}), got {self.window}"
            )
        if self.max_calls_per_agent < 0:
            yield ConfigError(f"{path}.max_calls_per_agent", "must be an integer >= 0 (0 = no cap)")
        yield from _check_template(self.deny_message, DENY_PLACEHOLDERS, f"{path}.deny_message")


def _check_template(text: str, names: tuple[str, ...], key: str) -> Iterator[ConfigError]:
    """Reject a ``str.format`` template that uses anything but ``{name}`` for ``names`` (with an
    optional conversion or format spec that renders for sample values)."""
    allowed = ", ".join(f"{{{n}}}" for n in names)
    fmt = string.Formatter()
    fields: list[str] = []
    try:
        for _, name, spec, _ in fmt.parse(text):
            if name is not None:
                fields.append(name)
            if spec:  # nested fields, as in {count:{width}}
                fields.extend(n for _, n, _, _ in fmt.parse(spec) if n is not None)
    except ValueError as e:
        hint = "write {{ and }} for literal braces"
        yield ConfigError(key, f"is not a valid template ({e}); {hint}")
        return
    for f in fields:
        if f not in names:
            yield ConfigError(key, f"unknown placeholder {{{f}}}; allowed: {allowed}")
            return
    try:
        text.format(**{n: 1 if n in ("count", "limit") else n for n in names})
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
        yield ConfigError(key, f"cannot be rendered: {e}")


@dataclass(frozen=True)
class TurnGuardConfig:
    """Per-turn ledger and narration (DESIGN §6.3, issue 4). Off by default: its per-turn caps
    suit chat assistants and would cut long autonomous coding turns.

    Limits are integers; 0 disables that limit. ``targets``: tool-name pattern → argument names
    tried for that tool's target (``proxy.core.targets``). ``failure_patterns``: regular expressions
    matched at the edges of a tool result (``proxy.core.failures``). ``narrate_*``: milliseconds.
    """

    enabled: bool = False
    max_same_target: int = 6
    max_same_call: int = 3
    max_failures: int = 5
    max_calls_per_turn: int = 40
    mute_after_trip: bool = True
    targets: dict[str, tuple[str, ...]] = field(default_factory=dict)
    failure_patterns: tuple[str, ...] = DEFAULT_FAILURE_PATTERNS
    narrate_after_ms: int = 180_000
    narrate_every_ms: int = 240_000
    #: ``same_call`` counts a call only when its result equals the previous one's (masked).
    progress_aware: bool = True
    #: ``enforce`` (apply) or ``observe`` (decide, log, count, change nothing): :meth:`Config.observed_rules`
    mode: Mode = "enforce"

    def check(self, path: str) -> Iterator[ConfigError]:
        for name in ("max_same_target", "max_same_call"):
            if getattr(self, name) < 0 or getattr(self, name) == 1:
                yield ConfigError(f"{path}.{name}", "must be 0 (off) or an integer >= 2")
        for name in ("max_failures", "max_calls_per_turn", "narrate_after_ms", "narrate_every_ms"):
            if getattr(self, name) < 0:
                yield ConfigError(f"{path}.{name}", "must be an integer >= 0 (0 = off)")
        for tool, names in self.targets.items():
            if not tool:
                yield ConfigError(f"{path}.targets", "tool names must not be empty")
            for i, name in enumerate(names):
                if not name:
                    yield ConfigError(f"{path}.targets.{tool}[{i}]", "argument names must not be empty")
        yield from _check_failure_patterns(self.failure_patterns, f"{path}.failure_patterns")


#: Result texts that say the user rejected a call (``guards.repeated_failure.rejection_patterns``).
DEFAULT_REJECTION_PATTERNS: tuple[str, ...] = (
    # "User declined", "The user rejected this tool call", "user denied the request", opencode's
    # "The user rejected permission to use this specific tool call", Cline's "The user denied
    # this operation" (not "user.rejected = True": a space after "user")
    r"(?i)\buser (?:has |had )?(?:rejected|denied|declined|refused)\b",
    # "Permission denied by user", "Command rejected by user", Codex's "exec command rejected by
    # user" (not a shell's bare "Permission denied")
    r"(?i)\b(?:rejected|denied|declined|refused) by (?:the )?user\b",
    # "the user did not approve this command", "The user doesn't want to proceed with this tool
    # use", Claude Code's "The user doesn't want to take this action right now. STOP …"
    r"(?i)\buser (?:doesn['\u2019]t|does not|didn['\u2019]t|did not|hasn['\u2019]t|has not) "
    r"(?:want|approved?|allow(?:ed)?|permit(?:ted)?|consent(?:ed)?)\b",
    # "The user chose not to run this"
    r"(?i)\buser (?:chose|has chosen|decided|has decided) not to\b",
    # "Tool use was rejected", "tool call denied"
    r"(?i)\btool (?:use|call) (?:was |has been )?(?:rejected|denied|declined)\b",
)


def _check_range(obj: Any, path: str, name: str, low: int, zero_ok: bool = False) -> Iterator[ConfigError]:
    value = getattr(obj, name)
    if value < low and not (zero_ok and value == 0):
        off = "0 (off) or " if zero_ok else ""
        yield ConfigError(f"{path}.{name}", f"must be {off}an integer >= {low}")


@dataclass(frozen=True)
class RecurrenceConfig:
    """R2 (issue 7): the same call for the ``occurrences``-th time among the last ``window`` calls
    of a turn, not all in a row (:mod:`proxy.guards.recurrence`). Advisory."""

    enabled: bool = True
    occurrences: int = 3
    window: int = 20
    progress_aware: bool = True
    ignore_args: tuple[str, ...] = DEFAULT_IGNORE_ARGS
    #: ``enforce`` (apply) or ``observe`` (decide, log, count, change nothing): :meth:`Config.observed_rules`
    mode: Mode = "enforce"

    def check(self, path: str) -> Iterator[ConfigError]:
        yield from _check_range(self, path, "occurrences", 2)
        if self.window < self.occurrences:
            yield ConfigError(
                f"{path}.window", f"must be >= occurrences ({self.occurrences}), got {self.window}"
            )


@dataclass(frozen=True)
class CyclesConfig:
    """R5 (issue 7): the turn's last calls are a period of ``min_period``..``max_period`` calls
    repeated ``repetitions`` times, calls compared by tool and target (:mod:`proxy.guards.cycles`).
    Reminder; the ``withhold_at``-th repetition is withheld (0 = never)."""

    enabled: bool = True
    min_period: int = 2
    max_period: int = 5
    repetitions: int = 3
    withhold_at: int = 4
    progress_aware: bool = True
    #: ``enforce`` (apply) or ``observe`` (decide, log, count, change nothing): :meth:`Config.observed_rules`
    mode: Mode = "enforce"

    def check(self, path: str) -> Iterator[ConfigError]:
        yield from _check_range(self, path, "min_period", 2)
        if self.max_period < self.min_period:
            yield ConfigError(f"{path}.max_period", f"must be >= min_period ({self.min_period})")
        elif self.max_period > 20:
            yield ConfigError(f"{path}.max_period", "must be <= 20")
        yield from _check_range(self, path, "repetitions", 2)
        if self.withhold_at and self.withhold_at <= self.repetitions:
            yield ConfigError(f"{path}.withhold_at", f"must be 0 (off) or > repetitions ({self.repetitions})")


@dataclass(frozen=True)
class RepeatedFailureConfig:
    """R4 (issue 7): ``failures`` failed results in a row from one tool on one target (0 = off),
    and (``reissue``) a call identical to one that failed or was rejected
    (:mod:`proxy.guards.repeated_failure`). Advisory."""

    enabled: bool = True
    failures: int = 3
    reissue: bool = True
    rejection_patterns: tuple[str, ...] = DEFAULT_REJECTION_PATTERNS
    error_preview_chars: int = 200
    ignore_args: tuple[str, ...] = DEFAULT_IGNORE_ARGS
    #: ``enforce`` (apply) or ``observe`` (decide, log, count, change nothing): :meth:`Config.observed_rules`
    mode: Mode = "enforce"

    def check(self, path: str) -> Iterator[ConfigError]:
        yield from _check_range(self, path, "failures", 2, zero_ok=True)
        yield from _check_range(self, path, "error_preview_chars", 1)
        yield from _check_failure_patterns(self.rejection_patterns, f"{path}.rejection_patterns")


@dataclass(frozen=True)
class MonologueConfig:
    """R6 (issue 7): the same assistant text in ``repeats`` assistant messages in a row, or
    text-only replies each answered with the same message (:mod:`proxy.guards.monologue`).
    Reminder; the response side stops the turn at the ``stop_at``-th (0 = never)."""

    enabled: bool = True
    repeats: int = 3
    stop_at: int = 4
    #: ``enforce`` (apply) or ``observe`` (decide, log, count, change nothing): :meth:`Config.observed_rules`
    mode: Mode = "enforce"

    def check(self, path: str) -> Iterator[ConfigError]:
        yield from _check_range(self, path, "repeats", 2)
        if self.stop_at and self.stop_at <= self.repeats:
            yield ConfigError(f"{path}.stop_at", f"must be 0 (off) or > repeats ({self.repeats})")


@dataclass(frozen=True)
class EchoLoopConfig:
    """The same command template re-run with only quoted literals changed while the result just
    echoes them (:mod:`proxy.guards.echo_loop`): reminder at the ``repeats``-th run in a row."""

    enabled: bool = True
    repeats: int = 3
    min_literal_chars: int = 2
    #: ``enforce`` (apply) or ``observe`` (decide, log, count, change nothing): :meth:`Config.observed_rules`
    mode: Mode = "enforce"

    def check(self, path: str) -> Iterator[ConfigError]:
        yield from _check_range(self, path, "repeats", 2)
        yield from _check_range(self, path, "min_literal_chars", 1)


@dataclass(frozen=True)
class SameTargetConfig:
    """R3 (issue 10): consecutive calls on one tool and target with changing arguments and an
    unchanged result (:mod:`proxy.guards.same_target`): a reminder when the run's length equals
    a threshold. Advisory."""

    enabled: bool = True
    thresholds: tuple[int, ...] = (3, 5, 8)
    #: ``enforce`` (apply) or ``observe`` (decide, log, count, change nothing): :meth:`Config.observed_rules`
    mode: Mode = "enforce"

    def check(self, path: str) -> Iterator[ConfigError]:
        yield from _check_thresholds(self.thresholds, f"{path}.thresholds")

    def __post_init__(self) -> None:
        object.__setattr__(self, "thresholds", tuple(sorted(self.thresholds)))


@dataclass(frozen=True)
class EscalationConfig:
    """The escalation ladder (issue 10, DESIGN §2.2, :mod:`proxy.guards.escalation`): after
    ``after_reminders`` reminders in a turn about calls to one tool on one target, the next such
    call that gets nothing new is withheld; with ``stop``, a further one ends the turn."""

    enabled: bool = True
    after_reminders: int = 2
    stop: bool = True
    #: ``enforce`` (apply) or ``observe`` (decide, log, count, change nothing): :meth:`Config.observed_rules`
    mode: Mode = "enforce"

    def check(self, path: str) -> Iterator[ConfigError]:
        yield from _check_range(self, path, "after_reminders", 1)


@dataclass(frozen=True)
class WaitingConfig:
    """Waiting on a running process (:mod:`proxy.guards.waiting`, DESIGN §2.2): never withheld or
    stopped; one reminder when a wait has gone ``remind_after_ms`` (0: never) without new output,
    by the times the conversation reports, and again at each doubling of that."""

    enabled: bool = True
    remind_after_ms: int = 1_800_000
    #: ``enforce`` (apply) or ``observe`` (decide, log, count, change nothing): :meth:`Config.observed_rules`
    mode: Mode = "enforce"

    def check(self, path: str) -> Iterator[ConfigError]:
        yield from _check_range(self, path, "remind_after_ms", 1000, zero_ok=True)


@dataclass(frozen=True)
class GuardsConfig:
    repeat_reminder: RepeatReminderConfig = field(default_factory=RepeatReminderConfig)
    circuit_breaker: CircuitBreakerConfig = field(default_factory=CircuitBreakerConfig)
    turn_guard: TurnGuardConfig = field(default_factory=TurnGuardConfig)
    recurrence: RecurrenceConfig = field(default_factory=RecurrenceConfig)
    cycles: CyclesConfig = field(default_factory=CyclesConfig)
    repeated_failure: RepeatedFailureConfig = field(default_factory=RepeatedFailureConfig)
    monologue: MonologueConfig = field(default_factory=MonologueConfig)
    echo_loop: EchoLoopConfig = field(default_factory=EchoLoopConfig)
    same_target: SameTargetConfig = field(default_factory=SameTargetConfig)
    escalation: EscalationConfig = field(default_factory=EscalationConfig)
    waiting: WaitingConfig = field(default_factory=WaitingConfig)


@dataclass(frozen=True)
class ProgressConfig:
    """Progress-aware repeats (issue 7, :mod:`proxy.core.progress`): ``masks`` are regular expressions
    for volatile spans (timestamps, durations, ids) masked before two results are compared; the
    default list is :data:`proxy.core.volatile.DEFAULT_MASK_PATTERNS`. One list for every guard with
    ``progress_aware``."""

    masks: tuple[str, ...] = DEFAULT_MASK_PATTERNS
    #: What may change state (issue 10, :mod:`proxy.core.effects`): extra tool-name patterns that only
    #: read / that always may write, and the programs whose shell runs only read.
    read_only_tools: tuple[str, ...] = DEFAULT_READ_ONLY_TOOLS
    state_changing_tools: tuple[str, ...] = ()
    read_only_commands: tuple[str, ...] = DEFAULT_READ_ONLY_COMMANDS
    #: User messages that do not start a new episode (issue 10, :mod:`proxy.core.episodes`).
    continuation_patterns: tuple[str, ...] = DEFAULT_CONTINUATION_PATTERNS

    def check(self, path: str) -> Iterator[ConfigError]:
        for i, pattern in enumerate(self.continuation_patterns):
            if not pattern.strip():
                yield ConfigError(f"{path}.continuation_patterns[{i}]", "must not be empty")
                continue
            try:
                re.compile(pattern)
            except re.error as e:
                yield ConfigError(
                    f"{path}.continuation_patterns[{i}]", f"is not a valid regular expression: {e}"
                )
        for name in ("read_only_tools", "state_changing_tools", "read_only_commands"):
            for i, value in enumerate(getattr(self, name)):
                if not value.strip():
                    yield ConfigError(f"{path}.{name}[{i}]", "must not be empty")
        bad_mask = False
        for i, pattern in enumerate(self.masks):
            if not pattern:
                yield ConfigError(f"{path}.masks[{i}]", "must not be empty")
                bad_mask = True
                continue
            try:
                compile_masks([pattern])
            except re.error as e:
                hint = " (inline flags only in scoped form, e.g. (?i:...))" if "flags" in str(e) else ""
                yield ConfigError(f"{path}.masks[{i}]", f"is not a valid regular expression: {e}{hint}")
                bad_mask = True
                continue
            if re.compile(pattern).match(""):
                yield ConfigError(f"{path}.masks[{i}]", "must not match the empty string")
                bad_mask = True
        if bad_mask:  # the combined expression is checked once every mask is valid on its own
            return
        try:
            compile_masks(self.masks)
        except re.error as e:  # e.g. a global inline flag that is only valid at the start
            yield ConfigError(f"{path}.masks", f"cannot be combined into one expression: {e}")

    def compiled(self) -> Masks:
        return compile_masks(self.masks)

    def effects(self) -> EffectRule:
        return EffectRule(self.read_only_tools, self.state_changing_tools, self.read_only_commands)

    def continuations(self) -> ContinuationRule:
        return ContinuationRule(self.continuation_patterns)


#: The placeholders a ``stop.message`` template may use.
STOP_PLACEHOLDERS = ("tool", "count", "limit", "kind", "denials")


@dataclass(frozen=True)
class StopConfig:
    """Response side: end the agent's turn (DESIGN §6.4, :mod:`proxy.response.decide`).

    ``after_ignored_denials``: stop when the response has a call the guards would deny and the
    turn already has this many withheld results (0 = off). ``on_cap``: stop when a call would pass
    the circuit breaker's lifetime cap. ``message``: a template with ``{tool}``, ``{count}``,
    ``{limit}``, ``{kind}`` (``denials`` | ``cap`` | ``monologue`` | ``escalation``),
    ``{denials}``; empty = the built-in text for each kind (``monologue``:
    ``guards.monologue.stop_at``; ``escalation``: ``guards.escalation``).
    """

    after_ignored_denials: int = 2
    on_cap: bool = True
    message: str = ""
    #: ``enforce`` (apply) or ``observe`` (decide, log, count, change nothing): :meth:`Config.observed_rules`
    mode: Mode = "enforce"

    def check(self, path: str) -> Iterator[ConfigError]:
        if self.after_ignored_denials < 0:
            yield ConfigError(f"{path}.after_ignored_denials", "must be an integer >= 0 (0 = off)")
        yield from _check_template(self.message, STOP_PLACEHOLDERS, f"{path}.message")


@dataclass(frozen=True)
class DegenerateTextConfig:
    """Streamed content or reasoning whose tail is one span repeated (:mod:`proxy.response.degenerate`):
    at least ``min_repeats`` copies of a span of 1..``max_period`` characters covering at least
    ``min_chars`` characters; fenced/indented code and table rows are not looked at."""

    enabled: bool = True
    min_repeats: int = 10
    min_chars: int = 200
    max_period: int = 500

    def check(self, path: str) -> Iterator[ConfigError]:
        if self.min_repeats < 2:
            yield ConfigError(f"{path}.min_repeats", "must be an integer >= 2")
        if self.min_chars < 1:
            yield ConfigError(f"{path}.min_chars", "must be an integer >= 1")
        if self.max_period < 1:
            yield ConfigError(f"{path}.max_period", "must be an integer >= 1")


@dataclass(frozen=True)
class ResponseConfig:
    """Runaway responses and degenerate text (DESIGN §6.4). 0 disables a limit.

    ``repair_text_tool_calls`` (issue 13, default on): a chat answer to a request that offered
    ``tools``, with no structured calls, whose content holds complete call blocks naming offered
    tools (:mod:`proxy.dialects.text_calls`), is rewritten into structured ``tool_calls``
    (:mod:`proxy.response.repair`). False: such answers pass as they came, byte for byte."""

    max_calls_per_response: int = 32
    max_identical_per_response: int = 2
    degenerate_text: DegenerateTextConfig = field(default_factory=DegenerateTextConfig)
    repair_text_tool_calls: bool = True
    #: ``enforce`` (apply) or ``observe`` (decide, log, count, change nothing): :meth:`Config.observed_rules`
    mode: Mode = "enforce"

    def check(self, path: str) -> Iterator[ConfigError]:
        for key in ("max_calls_per_response", "max_identical_per_response"):
            if getattr(self, key) < 0:
                yield ConfigError(f"{path}.{key}", "must be an integer >= 0 (0 = no limit)")


@dataclass(frozen=True)
class ResponsesStoreConfig:
    """The Responses API's ``previous_response_id`` chains (issue 11, :mod:`proxy.request.response_store`).

    A request that names a ``previous_response_id`` sends only its new items; the upstream
    rebuilds the history. To guard it, loopguard keeps, per response id seen in an upstream
    answer, that chain's items as the agent has them (what it sent, before loopguard's edits,
    and the output it received). Answers to requests with ``store: false`` are never kept.
    An id loopguard does not hold (evicted, a restart, another replica) is forwarded unguarded,
    counted as ``unguarded{reason="unknown_previous_response"}`` and logged once per chain.

    ``max_entries`` (1024): responses kept, least recently used dropped first; 0 = keep none
    (every chained request is then forwarded unguarded). ``max_bytes_mb`` (64): MiB of kept
    items (JSON bytes; the responses of one chain share their items, which count once); a
    response whose chain alone is larger is not kept; null = no byte limit. ``max_age_s`` (21600, six
    hours): an entry not stored or used for this long is dropped; null = no age limit.
    """

    max_entries: int = 1024
    max_bytes_mb: float | None = 64.0
    max_age_s: float | None = 21600.0

    def check(self, path: str) -> Iterator[ConfigError]:
        if self.max_entries < 0:
            yield ConfigError(f"{path}.max_entries", "must be an integer >= 0 (0 = keep none)")
        for name in ("max_bytes_mb", "max_age_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                yield ConfigError(f"{path}.{name}", "must be > 0 or null (no limit)")


@dataclass(frozen=True)
class PrefixCacheConfig:
    """What the previous request of each conversation established, kept so the next one reads only
    its new messages (issue 15, :mod:`proxy.request.prefix_cache`). Decisions are the same with it
    or without it; it only saves time.

    ``max_bytes_mb`` (32): MiB kept over all conversations (each entry counts its history's JSON
    bytes plus an estimate of its parse state: :func:`proxy.request.prefix_cache.entry_size`); the
    least recently used conversation is dropped first. 0 = off (every request reads its whole
    history).
    """

    max_bytes_mb: float = 32.0

    def check(self, path: str) -> Iterator[ConfigError]:
        if not self.max_bytes_mb >= 0:
            yield ConfigError(f"{path}.max_bytes_mb", "must be a number >= 0 (0 = off)")

    @property
    def max_bytes(self) -> int:
        """The budget in bytes (0 = off)."""
        return int(self.max_bytes_mb * 1024 * 1024)


#: What a backend URL may start with (``state.backend``): the redis package's URL schemes.
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


@dataclass(frozen=True)
class StateConfig:
    """Where the state shared by replicas lives (issue 16; :mod:`proxy.request.shared`).

    ``backend``: ``memory`` (default: one process, today's behaviour) or a Redis URL
    (``redis://host:6379/0``, ``rediss://…``, ``unix:///path``) shared by every replica: narration
    timing and first-seen times, incident de-duplication, the Responses store, and the stats
    totals. ``timeout_ms`` (50): the longest one Redis call may take (connect included); past it
    the call fails open. ``retry_s`` (1.0): after a failed call Redis is not asked again for this
    long (requests meanwhile use local state only). ``prefix``: of every Redis key.
    ``stats_interval_s`` (5.0): how often a replica publishes its counters for the totals.
    """

    backend: str = "memory"
    timeout_ms: float = 50.0
    retry_s: float = 1.0
    prefix: str = "loopguard:"
    stats_interval_s: float = 5.0

    @property
    def shared(self) -> bool:
        return self.backend != "memory"

    def check(self, path: str) -> Iterator[ConfigError]:
        if self.backend != "memory" and not self.backend.startswith(REDIS_SCHEMES):
            yield ConfigError(
                f"{path}.backend",
                f"must be 'memory' or a redis:// URL, got {_shown(f'{path}.backend', self.backend)}",
            )
        for name in ("timeout_ms", "stats_interval_s"):
            if not getattr(self, name) > 0:
                yield ConfigError(f"{path}.{name}", "must be > 0")
        if self.retry_s < 0:
            yield ConfigError(f"{path}.retry_s", "must be >= 0")
        if not self.prefix:
            yield ConfigError(f"{path}.prefix", "must not be empty")


@dataclass(frozen=True)
class CaptureConfig:
    """Capture of guarded requests for ``loopguard replay`` (issue 16, :mod:`proxy.edge.capture`).

    ``path``: the JSONL file (``""`` = off; its directory must exist and be writable, checked
    at start: ``check-config`` and ``serve`` fail naming ``capture.path`` otherwise); one line per guarded
    request: the conversation's messages and the answer's calls, never headers. ``max_bytes``:
    the file is rotated when it would grow past this many bytes (``path.1`` … ``path.<backups>``,
    the oldest dropped: :class:`logging.handlers.RotatingFileHandler`). ``contents``: false
    (default) writes every message text, tool result and call argument value as a digest (equal
    texts give equal digests, so replay decides the same); true writes them as sent."""

    path: str = ""
    max_bytes: int = 100 * 1024 * 1024
    backups: int = 5
    contents: bool = False

    def check(self, path: str) -> Iterator[ConfigError]:
        if self.max_bytes < 1024:
            yield ConfigError(f"{path}.max_bytes", "must be an integer >= 1024")
        if self.backups < 1:  # RotatingFileHandler never rotates with 0 backups
            yield ConfigError(f"{path}.backups", "must be an integer >= 1")
        if self.path:
            problem = _unwritable(Path(self.path))
            if problem:
                yield ConfigError(f"{path}.path", problem)


def _unwritable(file: Path) -> str:
    """Why a file to be appended to (``capture.path``) cannot be written, "" when it can: its
    directory is missing, not a directory or not writable (``os.access``, which also says no on
    a read-only file system), or the file itself is a directory or not writable."""
    parent = file.parent
    if not parent.exists():
        return f"its directory {str(parent)!r} does not exist"
    if not parent.is_dir():
        return f"{str(parent)!r} is not a directory"
    if file.is_dir():
        return f"{str(file)!r} is a directory"
    if file.exists():
        if not os.access(file, os.W_OK):
            return f"{str(file)!r} is not writable"
    elif not os.access(parent, os.W_OK | os.X_OK):
        return f"its directory {str(parent)!r} is not writable"
    return ""


#: The rules of each config section with a ``mode`` (``narration`` is part of ``turn_guard``).
MODE_SECTIONS: dict[str, tuple[str, ...]] = {
    "repeat_reminder": ("repeat_reminder",),
    "circuit_breaker": ("circuit_breaker",),
    "turn_guard": ("turn_guard", "narration"),
    "recurrence": ("recurrence",),
    "cycles": ("cycles",),
    "repeated_failure": ("repeated_failure",),
    "monologue": ("monologue",),
    "echo_loop": ("echo_loop",),
    "same_target": ("same_target",),
    "escalation": ("escalation",),
    "waiting": ("waiting",),
}
#: Response-side rules: ``stop.mode`` covers stops, ``response.mode`` runaway and degenerate cuts.
STOP_RULES = ("stop",)
RESPONSE_RULES = ("runaway", "degenerate_text", "repair_text_tool_calls")


@dataclass(frozen=True)
class Config:
    listen: ListenConfig = field(default_factory=ListenConfig)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    conversation_key: ConversationKeyConfig = field(default_factory=ConversationKeyConfig)
    guards: GuardsConfig = field(default_factory=GuardsConfig)
    stop: StopConfig = field(default_factory=StopConfig)
    response: ResponseConfig = field(default_factory=ResponseConfig)
    progress: ProgressConfig = field(default_factory=ProgressConfig)
    responses_store: ResponsesStoreConfig = field(default_factory=ResponsesStoreConfig)
    prefix_cache: PrefixCacheConfig = field(default_factory=PrefixCacheConfig)
    state: StateConfig = field(default_factory=StateConfig)
    #: Bearer token required on ``/loop-guard`` routes; null = open (they bind to 127.0.0.1).
    admin_token: str | None = None
    #: ``observe``: every section is observed, whatever its own ``mode`` (issue 16).
    mode: Mode = "enforce"
    capture: CaptureConfig = field(default_factory=CaptureConfig)

    def observed_rules(self) -> frozenset[str]:
        """The rule names (``Action.rule``) whose actions are observed, not applied: every rule
        when ``mode: observe``, else the rules of each section whose own ``mode`` is ``observe``
        (:data:`MODE_SECTIONS`; ``stop.mode`` for ``stop``, ``response.mode`` for ``runaway``
        and ``degenerate_text``). An observed action is decided, logged, counted and recorded as
        an incident exactly as an applied one, but changes no byte (issue 16)."""
        every = self.mode == "observe"
        out: set[str] = set()
        for section, rules in MODE_SECTIONS.items():
            if every or getattr(self.guards, section).mode == "observe":
                out.update(rules)
        if every or self.stop.mode == "observe":
            out.update(STOP_RULES)
        if every or self.response.mode == "observe":
            out.update(RESPONSE_RULES)
        return frozenset(out)

    def modes(self) -> dict[str, str]:
        """Each enabled section's effective mode (``guards.<name>``, ``stop``, ``response``), for
        the startup line and ``GET /loop-guard``."""
        observed = self.observed_rules()
        out = {
            name: "observe" if MODE_SECTIONS[name][0] in observed else "enforce"
            for name in MODE_SECTIONS
            if getattr(self.guards, name).enabled
        }
        out["stop"] = "observe" if "stop" in observed else "enforce"
        out["response"] = "observe" if "runaway" in observed else "enforce"
        return out


# --- building dataclasses from plain data -------------------------------------------------------

_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
#: Keys whose value is a credential: an error about one names its type, never its value.
SECRET_KEYS = frozenset({"admin_token"})
#: Keys whose value is a URL that may carry a credential (user info, a query ``api-key``):
#: shown through :func:`proxy.config.redact.redact_url`.
URL_KEYS = frozenset({"upstream.url", "state.backend"})


def _shown(key: str, value: Any) -> str:
    """``value`` as an error message about ``key`` may show it: a credential's type only
    (``a value of type int (not shown)``), a URL redacted (:func:`redact_url` with ``marked``),
    anything else its ``repr``."""
    if key in SECRET_KEYS:
        return f"a value of type {type(value).__name__} (not shown)"
    if key in URL_KEYS and isinstance(value, str):
        if urlsplit(value).netloc or re.fullmatch(r"[\w.-]*", value):  # a URL with a host, a word
            return repr(redact_url(value, marked=True))
        return "a value that is not a URL with a host (not shown)"  # where its user info ends is unknown
    return repr(value)


def _coerce(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return build(tp, value, key)
    if origin is Literal:
        if value not in typing.get_args(tp):
            choices = ", ".join(repr(c) for c in typing.get_args(tp))
            raise ConfigError(key, f"must be one of {choices}, got {_shown(key, value)}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _coerce(inner, value, key)
    if origin is tuple:
        if not isinstance(value, list):
            raise ConfigError(key, f"must be a list, got {type(value).__name__}")
        (inner, _) = typing.get_args(tp)
        return tuple(_coerce(inner, v, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(key, f"must be a mapping, got {type(value).__name__}")
        kt, vt = typing.get_args(tp)
        return {_coerce(kt, k, key): _coerce(vt, v, f"{key}.{k}") for k, v in value.items()}
    ok = (
        (tp is bool and isinstance(value, bool))
        or (tp is int and isinstance(value, int) and not isinstance(value, bool))
        or (tp is float and isinstance(value, int | float) and not isinstance(value, bool))
        or (tp is str and isinstance(value, str))
    )
    if not ok:
        raise ConfigError(key, f"must be {_TYPE_NAMES.get(tp, tp)}, got {_shown(key, value)}")
    return float(value) if tp is float else value


def build(cls: type, data: Any, path: str = "", errors: list[ConfigError] | None = None) -> Any:
    """Build dataclass ``cls`` from a mapping (None = all defaults), validating every key.

    Raises :class:`ConfigError` naming ``path.key`` for unknown keys, wrong types, and whatever the
    class's own ``check(path)`` rejects. With ``errors`` (a list), nothing is raised: each error
    is appended, the key it names takes its default, and every other key is still read (and
    every error a section's ``check`` finds is appended); the caller looks at ``errors``.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        error = ConfigError(path or "<root>", f"must be a mapping, got {type(data).__name__}")
        if errors is None:
            raise error
        errors.append(error)
        data = {}
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{path}.{k}" if path else str(k)
        try:
            if k not in names:
                raise ConfigError(key, "unknown key")
            tp = hints[k]
            kwargs[k] = build(tp, v, key, errors) if dataclasses.is_dataclass(tp) else _coerce(tp, v, key)
        except ConfigError as e:
            if errors is None:
                raise
            errors.append(e)
    obj = cls(**kwargs)
    check = getattr(obj, "check", None)
    if check is not None:
        for e in check(path):  # each check yields every error it finds, one per key
            if errors is None:
                raise e
            errors.append(e)
    return obj


def config_errors(path: str | Path) -> tuple[Config | None, list[ConfigError]]:
    """Every error of the config file at ``path`` (``check-config``): the config (None when the
    file cannot be read or is not YAML) and the errors, in file order, empty when it is valid."""
    try:
        data = _read(path)
    except ConfigError as e:
        return None, [e]
    errors: list[ConfigError] = []
    cfg = build(Config, data, "", errors)
    return (None if errors else cfg), errors


def _duplicate_keys(node: yaml.Node, path: str = "") -> Iterator[ConfigError]:
    """A :class:`ConfigError` for each key that appears twice in one mapping of ``node`` (YAML
    itself lets the last one win silently: a second ``admin_token:`` further down would replace
    the first without a word), naming its dotted path and both lines."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            name = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            key = f"{path}.{name}" if path else str(name)
            line = key_node.start_mark.line + 1
            if name is not None and name in seen:
                yield ConfigError(key, f"appears twice (lines {seen[name]} and {line}); keep one")
            elif name is not None:
                seen[name] = line
            yield from _duplicate_keys(value_node, key)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from _duplicate_keys(item, f"{path}[{i}]")


def _read(path: str | Path) -> Any:
    """The YAML document of the file at ``path``. Raises :class:`ConfigError`: ``<file>`` when
    it cannot be read, is not YAML, or holds no document at all (empty, or comments only: a file
    truncated or emptied by mistake must not quietly mean "all defaults", which would drop
    ``admin_token``; ``{}`` says that on purpose); the key's path when a key appears twice in
    one mapping."""
    try:
        with Path(path).open(encoding="utf-8") as f:
            loader = yaml.SafeLoader(f)  # a stream, so YAML errors name the file
            try:
                node = loader.get_single_node()
                if node is not None:
                    for error in _duplicate_keys(node):
                        raise error
                data = loader.construct_document(node) if node is not None else None
            finally:
                loader.dispose()
    except OSError as e:
        raise ConfigError("<file>", f"cannot read {path}: {e.strerror or e}") from e
    except yaml.YAMLError as e:
        raise ConfigError("<file>", f"{path} is not valid YAML: {e}") from e
    if data is None:
        raise ConfigError("<file>", f"{path} holds no settings (empty); write {{}} for all defaults")
    return data


def load_config(path: str | Path | None) -> Config:
    """Load and validate a YAML config file; ``None`` gives the defaults.

    Raises :class:`ConfigError` (key ``<file>`` when the file cannot be read or is not YAML).
    """
    if path is None:
        return Config()
    return build(Config, _read(path))


#: The keys a reload cannot change (issue 16, hot reload): the listening socket, the upstream
#: connection pool and its timeouts (:mod:`proxy.edge.server` builds them at start), the stores
#: sized at start, the state backend's connection, the incident log's file. A reload whose file
#: changes one of them is rejected, naming the keys (restart to change them).
RESTART_ONLY = (
    # the one credential of the admin routes: a reload re-reads a file anyone who can write it
    # (or empty it) controls, and must never open or move the door it is asked through
    "admin_token",
    "listen",
    "upstream",
    "responses_store",
    # the prefix cache is sized at start (proxy.edge.server)
    "prefix_cache.max_bytes_mb",
    "state",
    "guards.circuit_breaker.incident_log",
    # the capture file is opened at start (capture.contents may change on a reload)
    "capture.path",
    "capture.max_bytes",
    "capture.backups",
)


def _leaves(plain: Any, path: str) -> dict[str, Any]:
    if isinstance(plain, dict):
        out: dict[str, Any] = {}
        for k, v in plain.items():
            out.update(_leaves(v, f"{path}.{k}" if path else k))
        return out
    return {path: plain}


def restart_keys(old: Config, new: Config) -> list[str]:
    """The dotted keys under :data:`RESTART_ONLY` whose values differ between ``old`` and ``new``
    (sorted; empty when a reload may apply ``new``)."""
    a, b = _leaves(to_plain(old), ""), _leaves(to_plain(new), "")
    return sorted(
        k
        for k in a.keys() | b.keys()
        if a.get(k) != b.get(k) and any(k == p or k.startswith(p + ".") for p in RESTART_ONLY)
    )


def to_plain(cfg: Any) -> Any:
    """The effective config as plain data (tuples as lists), for ``check-config`` and stats."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: to_plain(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, tuple | list):
        return [to_plain(v) for v in cfg]
    if isinstance(cfg, dict):
        return {k: to_plain(v) for k, v in cfg.items()}
    return cfg
