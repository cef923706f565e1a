"""The ``guards`` section: one frozen dataclass per guard (DESIGN §6), in the order the guards
run (:func:`proxy.guards.build_guards`).

Every guard has ``enabled`` and ``mode`` (``enforce`` applies its actions, ``observe`` decides,
logs and counts them but changes no byte: :meth:`proxy.config.Config.observed_rules`). Tool-name
patterns are whole names, case-sensitive, ``*`` the only wildcard. ``progress_aware`` keys count a
repeat only when its result equals the previous one's, compared after masking ``progress.masks``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated, Literal

from proxy.config import checks
from proxy.config.defaults import (
    DEFAULT_EXEMPT,
    DEFAULT_FAILURE_PATTERNS,
    DEFAULT_IGNORE_ARGS,
    DEFAULT_REJECTION_PATTERNS,
)
from proxy.config.fields import SECTION, Bool, Bound, Int, Mode, Str, Thresholds
from proxy.errors import ConfigError

#: The placeholders a ``guards.circuit_breaker.deny_message`` template may use.
DENY_PLACEHOLDERS = ("tool", "count", "limit", "kind")
#: An integer >= n.
AtLeast1 = Annotated[Int, Bound(ge=1)]
AtLeast2 = Annotated[Int, Bound(ge=2)]
#: 0 (the limit is off) or an integer >= 0.
Limit = Annotated[Int, Bound(ge=0, note="0 = off")]


@dataclass(frozen=True)
class RepeatReminderConfig:
    """Advisory reminders on consecutive identical calls (DESIGN §6.1): when the agent makes the
    same call (same name, same canonical arguments) several times in a row, a reminder follows
    that step's tool results."""

    __pydantic_config__ = SECTION

    enabled: Bool = True
    """false = this guard does nothing."""
    thresholds: Thresholds = (3, 5, 8)
    """Fire when the consecutive count equals one of these (integers >= 2, no repeats; sorted).
    The lowest gives a short nudge, higher ones a detailed reminder; after the highest, silence."""
    include: tuple[Str, ...] = ()
    """Tool-name patterns tracked; empty = every tool."""
    exclude: tuple[Str, ...] = ()
    """Tool-name patterns not tracked: they neither count nor break a chain."""
    ignore_args: tuple[Str, ...] = DEFAULT_IGNORE_ARGS
    """Top-level argument keys ignored when comparing calls. [] compares every argument."""
    arguments_preview_chars: AtLeast1 = 500
    """Characters of the arguments shown in a reminder; detection uses all of them."""
    inject_as: Literal["user", "tool_suffix"] = "user"
    """user: a user message after the step's tool results; tool_suffix: appended to the step's last
    tool result (for chat templates that reject a user message right after tool messages)."""
    progress_aware: Bool = True
    """The same call continues the chain only when its result is the same as the previous one's."""
    mode: Mode = "enforce"
    """enforce | observe."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "thresholds", tuple(sorted(self.thresholds)))

    def check(self, path: str) -> Iterator[ConfigError]:
        yield from checks.thresholds(self.thresholds, f"{path}.thresholds")


@dataclass(frozen=True)
class CircuitBreakerConfig:
    """Withholds the result of a call repeated too often, or past a lifetime cap (DESIGN §6.2):
    the model sees denial text in place of the result (the agent did run the tool)."""

    __pydantic_config__ = SECTION

    enabled: Bool = True
    """false = this guard does nothing."""
    duplicate_limit: AtLeast1 = 6
    """A call is denied when this many calls with the same tool and arguments are already among
    the last `window` executed calls (need not be consecutive)."""
    window: AtLeast1 = 200
    """How many of the most recent executed (not denied) calls the count looks at; >= duplicate_limit."""
    max_calls_per_agent: Annotated[Int, Bound(ge=0, note="0 = no cap")] = 0
    """Volume cap per scope: once this many calls have run, every later call is denied. 0 = off
    (the default: a healthy agent makes hundreds of calls on one request; the waste cap below
    tells a runaway from it)."""
    scope: Literal["episode", "conversation"] = "episode"
    """What the duplicate window, the volume cap and the waste cap count over. episode: the calls
    since the user's last new request (a continuation, a compaction summary or a harness's reply
    is none: progress.continuation_patterns); conversation: every call of the conversation, user
    messages never reset them (the seed)."""
    waste_window: Annotated[Int, Bound(ge=2, off=True)] = 100
    """The waste cap looks at this many of the scope's most recent calls (waits never count).
    0 = no waste cap."""
    waste_limit: AtLeast1 = 80
    """The waste cap trips when at least this many of the last `waste_window` calls brought nothing
    new (a result the scope had already got from the same tool, and no change); <= waste_window."""
    exempt: tuple[Str, ...] = DEFAULT_EXEMPT
    """Tool-name patterns never counted, never denied."""
    only: tuple[Str, ...] = ()
    """If not empty, guard only these tools (overrides exempt)."""
    ignore_args: tuple[Str, ...] = DEFAULT_IGNORE_ARGS
    """Top-level argument keys dropped before comparing calls ([] compares every argument)."""
    deny_message: Str = ""
    """The denial text, a template with {tool}, {count}, {limit}, {kind} (duplicate | cap | waste);
    "" = the built-in text for each kind (proxy.guards.circuit_breaker)."""
    incident_log: Str = ""
    """JSONL file getting one line per conversation for the first denial of each kind; "" = off."""
    progress_aware: Bool = True
    """A duplicate counts only when its result equals the previous one's and no call in between
    may have changed the situation (progress.read_only_*)."""
    ignore_sole_args: Bool = False
    """true: drop ignore_args even when they are all a call has; false keeps them then."""
    mode: Mode = "enforce"
    """enforce | observe."""

    def check(self, path: str) -> Iterator[ConfigError]:
        if self.window >= 1:
            yield from checks.at_least_other(
                self.window, self.duplicate_limit, "duplicate_limit", f"{path}.window"
            )
        if self.waste_window and self.waste_limit > self.waste_window:
            yield ConfigError(
                f"{path}.waste_limit",
                f"must be <= waste_window ({self.waste_window}), got {self.waste_limit}",
            )
        yield from checks.template(self.deny_message, DENY_PLACEHOLDERS, f"{path}.deny_message")


@dataclass(frozen=True)
class TurnGuardConfig:
    """A per-turn ledger and narration (DESIGN §6.3). Off by default: its per-turn caps suit chat
    assistants and would cut long autonomous coding turns. A call that trips a limit has its
    result withheld and replaced by text telling the model to stop and answer the user."""

    __pydantic_config__ = SECTION

    enabled: Bool = False
    """true turns the turn guard (and its narration) on."""
    max_same_target: Annotated[Int, Bound(ge=2, off=True)] = 6
    """The call after this many calls on one target in a turn trips (arguments may differ). 0 = off."""
    max_same_call: Annotated[Int, Bound(ge=2, off=True)] = 3
    """The call after this many identical calls in a turn trips (need not be consecutive). 0 = off."""
    max_failures: Limit = 5
    """A call made after this many failed results in a row trips. 0 = off."""
    max_calls_per_turn: Limit = 40
    """Every call beyond this many in a turn trips. 0 = off."""
    mute_after_trip: Bool = True
    """After the first trip of a turn, later trips get a one-line denial."""
    targets: dict[Str, tuple[Str, ...]] = field(default_factory=dict)
    """Tool-name pattern → argument names tried for that tool's target (proxy.core.targets);
    [] = that tool has no target."""
    failure_patterns: tuple[Str, ...] = DEFAULT_FAILURE_PATTERNS
    """Regular expressions matched at the edges of a tool result that make it a failure (Python
    syntax, multiline; proxy.core.failures)."""
    narrate_after_ms: Limit = 180_000
    """A narration reminder when this many ms have passed since the turn's start or the agent's
    last text to the user. 0 = no narration."""
    narrate_every_ms: Limit = 240_000
    """At least this many ms between two narration reminders of a turn."""
    progress_aware: Bool = True
    """max_same_call counts a call only when its result equals the previous one's."""
    mode: Mode = "enforce"
    """enforce | observe; covers its narration reminders too."""

    def check(self, path: str) -> Iterator[ConfigError]:
        for tool, names in self.targets.items():
            if not tool:
                yield ConfigError(f"{path}.targets", "tool names must not be empty")
            for i, name in enumerate(names):
                if not name:
                    yield ConfigError(f"{path}.targets.{tool}[{i}]", "argument names must not be empty")
        yield from checks.failure_patterns(self.failure_patterns, f"{path}.failure_patterns")


@dataclass(frozen=True)
class RecurrenceConfig:
    """The same call for the ``occurrences``-th time among the last ``window`` calls of a turn,
    not all in a row (:mod:`proxy.guards.recurrence`). Advisory."""

    __pydantic_config__ = SECTION

    enabled: Bool = True
    """false = this guard does nothing."""
    occurrences: AtLeast2 = 3
    """A reminder when a call is made for this many times among the last `window` calls."""
    window: Int = 20
    """How many of the turn's last calls are looked at; >= occurrences."""
    progress_aware: Bool = True
    """An identical call whose result differs from the previous one's restarts its count."""
    ignore_args: tuple[Str, ...] = DEFAULT_IGNORE_ARGS
    """Top-level argument keys dropped before comparing calls."""
    mode: Mode = "enforce"
    """enforce | observe."""

    def check(self, path: str) -> Iterator[ConfigError]:
        yield from checks.at_least_other(self.window, self.occurrences, "occurrences", f"{path}.window")


@dataclass(frozen=True)
class CyclesConfig:
    """The turn's last calls are a period of ``min_period``..``max_period`` calls repeated
    ``repetitions`` times, calls compared by tool and target (:mod:`proxy.guards.cycles`).
    A reminder; from the ``withhold_at``-th round on, results are withheld."""

    __pydantic_config__ = SECTION

    enabled: Bool = True
    """false = this guard does nothing."""
    min_period: AtLeast2 = 2
    """Shortest cycle, in calls (a period of 1 is an exact repeat)."""
    max_period: Int = 5
    """Longest cycle, in calls; >= min_period, <= 20."""
    repetitions: AtLeast2 = 3
    """A reminder when the cycle completes this many rounds."""
    withhold_at: Int = 4
    """From this many rounds on, each call continuing the cycle has its result withheld.
    0 = never; else > repetitions."""
    progress_aware: Bool = True
    """Withhold only when every call of the last round got the same result as a round earlier."""
    mode: Mode = "enforce"
    """enforce | observe."""

    def check(self, path: str) -> Iterator[ConfigError]:
        if self.max_period < self.min_period:
            yield ConfigError(f"{path}.max_period", f"must be >= min_period ({self.min_period})")
        elif self.max_period > 20:
            yield ConfigError(f"{path}.max_period", "must be <= 20")
        yield from checks.off_or_above(
            self.withhold_at, self.repetitions, "repetitions", f"{path}.withhold_at"
        )


@dataclass(frozen=True)
class RepeatedFailureConfig:
    """Failing the same way again (:mod:`proxy.guards.repeated_failure`): ``failures`` failed
    results in a row from one tool on one target, and (``reissue``) a call identical to one that
    failed or was rejected. Advisory."""

    __pydantic_config__ = SECTION

    enabled: Bool = True
    """false = this guard does nothing."""
    failures: Annotated[Int, Bound(ge=2, off=True)] = 3
    """A reminder (quoting the error's first line) after this many failures in a row. 0 = off."""
    reissue: Bool = True
    """A reminder when a call identical to one that failed, or that the user rejected, is made again."""
    rejection_patterns: tuple[Str, ...] = DEFAULT_REJECTION_PATTERNS
    """Regular expressions saying the user rejected the call (searched in a result's edges)."""
    error_preview_chars: AtLeast1 = 200
    """Characters of the error line quoted."""
    ignore_args: tuple[Str, ...] = DEFAULT_IGNORE_ARGS
    """Top-level argument keys dropped before comparing calls."""
    mode: Mode = "enforce"
    """enforce | observe."""

    def check(self, path: str) -> Iterator[ConfigError]:
        yield from checks.failure_patterns(self.rejection_patterns, f"{path}.rejection_patterns")


@dataclass(frozen=True)
class MonologueConfig:
    """The same assistant text in ``repeats`` assistant messages in a row, or text-only replies
    each answered with the same message (:mod:`proxy.guards.monologue`). A reminder; the response
    side stops the turn at the ``stop_at``-th."""

    __pydantic_config__ = SECTION

    enabled: Bool = True
    """false = this guard does nothing."""
    repeats: AtLeast2 = 3
    """A reminder at this many same messages in a row."""
    stop_at: Int = 4
    """The response side stops the turn at this many. 0 = never; else > repeats."""
    mode: Mode = "enforce"
    """enforce | observe."""

    def check(self, path: str) -> Iterator[ConfigError]:
        yield from checks.off_or_above(self.stop_at, self.repeats, "repeats", f"{path}.stop_at")


@dataclass(frozen=True)
class EchoLoopConfig:
    """The same command template re-run with only quoted literals changed while the result just
    echoes them (:mod:`proxy.guards.echo_loop`). Advisory."""

    __pydantic_config__ = SECTION

    enabled: Bool = True
    """false = this guard does nothing."""
    repeats: AtLeast2 = 3
    """A reminder at this many such runs in a row."""
    min_literal_chars: AtLeast1 = 2
    """Shorter quoted literals are not considered."""
    mode: Mode = "enforce"
    """enforce | observe."""


@dataclass(frozen=True)
class SameTargetConfig:
    """Consecutive calls on one tool and target with changing arguments and an unchanged result
    (:mod:`proxy.guards.same_target`). Advisory; exact repeats are repeat_reminder's."""

    __pydantic_config__ = SECTION

    enabled: Bool = True
    """false = this guard does nothing."""
    thresholds: Thresholds = (3, 5, 8)
    """A reminder when the run reaches one of these (integers >= 2, no repeats; sorted)."""
    mode: Mode = "enforce"
    """enforce | observe."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "thresholds", tuple(sorted(self.thresholds)))

    def check(self, path: str) -> Iterator[ConfigError]:
        yield from checks.thresholds(self.thresholds, f"{path}.thresholds")


@dataclass(frozen=True)
class EscalationConfig:
    """The escalation ladder (DESIGN §2.2, :mod:`proxy.guards.escalation`): after
    ``after_reminders`` reminders in an episode about calls to one tool on one target, the next
    such call that gets nothing new is withheld; with ``stop``, a further one ends the turn."""

    __pydantic_config__ = SECTION

    enabled: Bool = True
    """false = this guard does nothing."""
    after_reminders: AtLeast1 = 2
    """Reminders about one tool and target before a call there that gets nothing new is withheld."""
    stop: Bool = True
    """A further such call ends the turn (never the first answer after a user message)."""
    mode: Mode = "enforce"
    """enforce | observe."""


@dataclass(frozen=True)
class WaitingConfig:
    """Waiting on a running process (:mod:`proxy.guards.waiting`, DESIGN §2.2) is not looping:
    never counted, withheld or stopped; one reminder when a wait has gone ``remind_after_ms``
    without new output, by the times the conversation reports, and again at each doubling."""

    __pydantic_config__ = SECTION

    enabled: Bool = True
    """false = this guard does nothing."""
    remind_after_ms: Annotated[Int, Bound(ge=1000, off=True)] = 1_800_000
    """A reminder when a wait has gone this long without new output. 0 = never."""
    mode: Mode = "enforce"
    """enforce | observe."""


@dataclass(frozen=True)
class GuardsConfig:
    """The guards, which read the bodies of chat completions, Responses and Anthropic Messages
    requests and add reminders, withhold results or stop the turn."""

    __pydantic_config__ = SECTION

    repeat_reminder: RepeatReminderConfig = field(default_factory=RepeatReminderConfig)
    """Reminders on consecutive identical calls."""
    circuit_breaker: CircuitBreakerConfig = field(default_factory=CircuitBreakerConfig)
    """Withholds results of calls repeated too often, or past a lifetime cap."""
    turn_guard: TurnGuardConfig = field(default_factory=TurnGuardConfig)
    """A per-turn ledger with limits, and narration reminders (off by default)."""
    recurrence: RecurrenceConfig = field(default_factory=RecurrenceConfig)
    """The same call coming back in a turn, not all in a row."""
    cycles: CyclesConfig = field(default_factory=CyclesConfig)
    """The turn's last calls going round a cycle."""
    repeated_failure: RepeatedFailureConfig = field(default_factory=RepeatedFailureConfig)
    """Failing the same way again."""
    monologue: MonologueConfig = field(default_factory=MonologueConfig)
    """The model saying the same thing over and over."""
    echo_loop: EchoLoopConfig = field(default_factory=EchoLoopConfig)
    """A command re-run with only a quoted literal changed while its output echoes it."""
    same_target: SameTargetConfig = field(default_factory=SameTargetConfig)
    """The same tool on the same target with changing arguments and an unchanged result."""
    escalation: EscalationConfig = field(default_factory=EscalationConfig)
    """Reminders the model ignores lead to withheld results, then a stop."""
    waiting: WaitingConfig = field(default_factory=WaitingConfig)
    """Waiting on a running process: a reminder, never a block."""
