"""turn_guard: a per-turn ledger that withholds results and tells the model to talk to the user
(DESIGN §6.3).

Seed: dsh-loop-guard (6 calls on one target, 3 identical calls, 5 failures in a row, 40 calls per
turn). It catches what exact-repeat rules miss: the *rewrite loop* (edit a script, run it, edit it
again with different content: no two calls are identical) and long runs of failing calls.

Rules:
- A turn is the run of calls after a user message (calls before the first user message form
  turn 0). Every turn starts a fresh ledger. Calls are replayed in conversation order, parallel
  calls of one step in listed order; every call counts, tripped ones included (the agent ran them).
- A call *trips* when, counting it,
  - ``same_call``: it is at least the ``max_same_call``-th call in the turn with its canonical key
    (DESIGN §5; the free-text fields of :data:`~proxy.config.DEFAULT_IGNORE_ARGS` dropped);
    repeats need not be consecutive. With ``progress_aware`` a call counts only when its
    result equals the previous result of that call in the turn after masking volatile spans
    (:mod:`proxy.core.progress`; a result not arrived yet is judged by the previous pair): polling a job
    whose status changes is progress, not a repeat;
  - ``same_target``: it is at least the ``max_same_target``-th call in the turn on one target
    (:mod:`proxy.core.targets`; tools and arguments may differ). A command target also counts as a call
    on each of its words that is a plain (path, URL) target of this turn: ``bash {"command":
    "python fix.py"}`` is a call on ``fix.py`` once ``write_file {"path": "fix.py"}`` is in the
    turn, or comes later in it. A leading ``./`` is ignored (``./fix.py`` is ``fix.py``);
  - ``failures``: at least ``max_failures`` results in a row, across any tools, were failures
    (:mod:`proxy.core.failures`) among the calls of *earlier steps* of the turn (the results the model
    had seen when it made the call). A success resets the run; a missing result neither counts nor
    resets. Results count as the tools returned them, withheld or not;
  - ``turn_calls``: it is call number ``max_calls_per_turn`` + 1 or later in the turn.
  A limit of 0 is off. When several limits trip at once, the first in this order is reported.
- A trip is a :class:`~proxy.core.actions.Withhold` of the call's result (none while the result has
  not arrived), ``reason`` = the kind above, ``count``/``limit`` the evidence. The first trip of a
  turn gets :data:`TRIP_TEXT`, telling the model to stop calling tools and answer the user (what
  it tried, where it is stuck, what the user must decide) and naming the limit. With
  ``mute_after_trip`` later trips in the same turn get the one-line :data:`MUTED_TEXT`.

:meth:`TurnGuard.ledger` is the same replay for the current turn only, as data for
``GET /loop-guard?conversation=KEY``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.config import DEFAULT_IGNORE_ARGS, TurnGuardConfig
from proxy.core.actions import Action, Withhold
from proxy.core.canonical import canonical_arguments
from proxy.core.effects import EpochCounter, Situations
from proxy.core.failures import FailureRule
from proxy.core.progress import RepeatJudge
from proxy.core.targets import TargetRule, path_key
from proxy.core.transcript import ToolCall, Transcript
from proxy.core.waits import is_wait
from proxy.guards.repeat_reminder import preview
from proxy.guards.resume import unread
from proxy.guards.wording import QUOTE, Style

RULE = "turn_guard"
SAME_CALL = "same_call"
SAME_TARGET = "same_target"
FAILURES = "failures"
TURN_CALLS = "turn_calls"

#: The config key behind each kind of trip.
LIMIT_KEYS = {
    SAME_CALL: "max_same_call",
    SAME_TARGET: "max_same_target",
    FAILURES: "max_failures",
    TURN_CALLS: "max_calls_per_turn",
}
EVIDENCE = {
    SAME_CALL: "this is call {count} of {tool} with these same arguments in this turn.",
    SAME_TARGET: "this is call {count} on {target} in this turn.",
    FAILURES: "the last {count} tool results in this turn were failures.",
    TURN_CALLS: "this is tool call {count} in this turn.",
}
#: ``recovery.reminders: plain | redirect`` (:mod:`proxy.guards.wording`): the evidence without
#: the tool, its arguments or the target (the rest of the text names no call: the same in every
#: style, and it already says what to do instead: answer the user).
PLAIN_EVIDENCE = {
    **EVIDENCE,
    SAME_CALL: "you have now made this same call {count} times in this turn.",
    SAME_TARGET: "this is call {count} on the same target in this turn.",
}
LIMITS = {
    SAME_CALL: "{limit} identical calls per turn",
    SAME_TARGET: "{limit} calls on the same target per turn",
    FAILURES: "{limit} failed results in a row",
    TURN_CALLS: "{limit} tool calls per turn",
}
TRIP_TEXT = (
    "[loopguard] The result of this call is withheld: {evidence} The limit is {limits} ({key}). "
    "Stop calling tools now and answer the user in plain text: say what you tried, where you are "
    "stuck, and what the user must decide or provide before you go on."
)
MUTED_TEXT = (
    "[loopguard] Result withheld: over the limit of {limits} again. Stop calling tools and answer the user."
)
#: Characters of a target shown in a trip text (the rest is summarised).
TARGET_PREVIEW_CHARS = 200
#: Entries per list in a ledger summary.
SUMMARY_TOP = 10


@dataclass(frozen=True, slots=True)
class Trip:
    """One tripping call: its 1-based ``index`` in the turn, the call, the kind (``reason``) and
    the evidence; ``muted`` when it got the one-line text."""

    index: int
    call: ToolCall
    reason: str
    count: int
    limit: int
    target: str | None
    muted: bool

    def text(self, style: Style = QUOTE) -> str:
        """The denial text in ``style`` (``recovery.reminders``)."""
        limits = LIMITS[self.reason].format(limit=self.limit)
        if self.muted:
            return MUTED_TEXT.format(limits=limits)
        if style != QUOTE:
            evidence = PLAIN_EVIDENCE[self.reason].format(count=self.count)
            return TRIP_TEXT.format(evidence=evidence, limits=limits, key=LIMIT_KEYS[self.reason])
        target = preview(self.target, TARGET_PREVIEW_CHARS) if self.target else ""
        evidence = EVIDENCE[self.reason].format(count=self.count, tool=self.call.name, target=target)
        return TRIP_TEXT.format(evidence=evidence, limits=limits, key=LIMIT_KEYS[self.reason])


@dataclass(frozen=True, slots=True)
class TurnLedger:
    """The replay of one turn: ``turn`` (number of user messages before it), ``calls``, the
    counts per canonical call (with each call's target) and per target (as the rule counts them,
    command words included), the failure run after its last step, and its trips in call order."""

    turn: int
    calls: int
    same_call: Counter[tuple[str, str]]
    call_targets: dict[tuple[str, str], str | None]
    same_target: Counter[str]
    consecutive_failures: int
    trips: tuple[Trip, ...]

    def summary(self) -> dict[str, Any]:
        """Plain data for ``GET /loop-guard?conversation=``: the calls and targets seen at least
        twice (the top :data:`SUMMARY_TOP`; tool and target, never full arguments), the number of
        trips and the last :data:`SUMMARY_TOP` of them."""
        return {
            "turn": self.turn,
            "calls": self.calls,
            "same_call": [
                {"tool": key[0], "target": self.call_targets[key], "count": n}
                for key, n in self.same_call.most_common(SUMMARY_TOP)
                if n > 1
            ],
            "same_target": [
                {"target": t, "count": n} for t, n in self.same_target.most_common(SUMMARY_TOP) if n > 1
            ],
            "consecutive_failures": self.consecutive_failures,
            "trips": len(self.trips),
            "tripped": [
                {
                    "call": t.index,
                    "tool": t.call.name,
                    "limit": LIMIT_KEYS[t.reason],
                    "count": t.count,
                    "value": t.limit,
                }
                for t in self.trips[-SUMMARY_TOP:]
            ],
        }


def _fold(run: int, flags: Sequence[bool | None]) -> int:
    """The failure run after a step's results ``flags``."""
    for failed in flags:
        if failed is True:
            run += 1
        elif failed is False:
            run = 0
    return run


class TurnGuard:
    """Guard callable: ``TurnGuard(cfg)(transcript, ctx) -> list[Withhold]``."""

    __slots__ = ("_cfg", "_failures", "_ignore", "_memo", "_situations", "_style", "_targets")

    name = RULE

    def __init__(
        self, cfg: TurnGuardConfig, situations: Situations | None = None, style: Style = QUOTE
    ) -> None:
        self._cfg = cfg
        self._style = style
        self._situations = situations or Situations()
        self._targets = TargetRule(overrides=cfg.targets)
        self._failures = FailureRule(cfg.failure_patterns) if cfg.max_failures else None
        self._ignore = frozenset(DEFAULT_IGNORE_ARGS)
        # The current turn's ledger from the last evaluation, with the transcript it belongs to,
        # so that ledger() right after an evaluation (the server's commit) does not replay the
        # turn again. Only an identical transcript object hits; results never depend on it.
        self._memo: tuple[Transcript, TurnLedger] | None = None

    @property
    def config(self) -> TurnGuardConfig:
        return self._cfg

    def replay(self, calls: Sequence[ToolCall], turn: int) -> TurnLedger:
        """The ledger of one turn's ``calls`` (in order)."""
        t = self._open(turn)
        trips = [trip for call in calls if (trip := self._read(t, call)) is not None]
        return t.ledger(trips)

    def ledger(self, transcript: Transcript) -> TurnLedger:
        """The ledger of the current turn (the one after the last user message)."""
        memo, self._memo = self._memo, None  # used at most once: the transcript is not kept
        if memo is not None and memo[0] is transcript:
            return memo[1]
        turn = len(transcript.user_positions)
        calls = [c for c in transcript.calls if c.turn == turn]
        return self.replay(calls, turn)

    def begin(self) -> TurnGuardState:
        """The state before any call (:mod:`proxy.guards.resume`)."""
        return TurnGuardState(self._open(0))

    def __call__(self, transcript: Transcript, ctx: object = None) -> list[Action]:
        return self.advance(self.begin(), transcript, ctx, transcript.message_count)

    def advance(self, state: TurnGuardState, transcript: Transcript, ctx: object, upto: int) -> list[Action]:
        """Read the calls before message position ``upto`` that ``state`` has not read
        (:mod:`proxy.guards.resume`); the withholds decided for them. An advance to the end of
        ``transcript`` keeps its current turn's ledger for :meth:`ledger`."""
        actions: list[Action] = []
        calls = transcript.calls
        s = state
        for call in unread(s, calls, upto):
            if call.turn != s.turn.turn:  # every turn starts a fresh ledger
                s.turn = self._open(call.turn)
            trip = self._read(s.turn, call)
            if trip is None or call.result is None:
                continue
            actions.append(
                Withhold(
                    position=call.result.position,
                    part=call.result.part,
                    call_id=call.call_id,
                    text=trip.text(self._style),
                    rule=RULE,
                    tool=call.name,
                    count=trip.count,
                    limit=trip.limit,
                    fresh=transcript.is_fresh(call.step),
                    reason=trip.reason,
                )
            )
        if upto >= transcript.message_count:
            current = len(transcript.user_positions)
            if s.turn.turn == current and s.next == len(calls):
                last = s.turn.ledger([trip.call(calls) for trip in s.turn.trips])
            else:
                last = TurnLedger(current, 0, Counter(), {}, Counter(), 0, ())
            self._memo = (transcript, last)
        return actions

    def _open(self, turn: int) -> TurnState:
        """A fresh ledger for ``turn``."""
        epochs = self._situations.epoch_counter() if self._cfg.progress_aware else None
        judge = RepeatJudge(self._situations.masks, epochs) if epochs is not None else None
        return TurnState(turn, judge, epochs)

    def _read(self, t: TurnState, call: ToolCall) -> Trip | None:
        """Count ``call``, the next of ``t``'s turn; its trip, if it trips (kept in ``t``)."""
        cfg = self._cfg
        if is_wait(call):  # waiting is not looping (proxy.core.waits): not counted, never tripped
            if t.epochs is not None:  # but time passed
                t.epochs.add(call)
            return None
        target = self._targets(call.name, call.arguments)
        failed = self._failures(call.result) if self._failures is not None else None
        t.calls += 1
        index = t.calls
        if call.step != t.step:
            t.run, t.step, t.flags = _fold(t.run, t.flags), call.step, []
        t.flags.append(failed)
        same_call = t.same_call
        key = (call.name, canonical_arguments(call.arguments, call.arguments_raw, self._ignore))
        # progress (seen before, new result) does not count as the same call again
        counted = True
        if t.judge is not None and t.epochs is not None:
            t.epochs.add(call)
            counted = t.judge.repeats(key, call.result, t.epochs.count - 1) or key not in same_call
        if counted:
            same_call[key] += 1
        t_key, t_count = None, 0
        on = t.on
        if target is not None:
            mine = target.value if target.is_command else path_key(target.value)
            t.call_targets.setdefault(key, mine)
            words = target.words
            for k in words | {mine}:
                on[k] += 1
            if not target.is_command:
                t.paths.add(mine)
            t_key, t_count = mine, on[mine]
            for w in words:
                if w in t.paths and on[w] > t_count:
                    t_key, t_count = w, on[w]
        else:
            t.call_targets.setdefault(key, None)
        if cfg.max_same_call and counted and same_call[key] >= cfg.max_same_call:
            reason, count, limit = SAME_CALL, same_call[key], cfg.max_same_call
        elif cfg.max_same_target and t_count >= cfg.max_same_target:
            reason, count, limit = SAME_TARGET, t_count, cfg.max_same_target
        elif cfg.max_failures and t.run >= cfg.max_failures:
            reason, count, limit = FAILURES, t.run, cfg.max_failures
        elif cfg.max_calls_per_turn and index > cfg.max_calls_per_turn:
            reason, count, limit = TURN_CALLS, index, cfg.max_calls_per_turn
        else:
            return None
        muted = cfg.mute_after_trip and bool(t.trips)
        t.trips.append(Tripped(index, call.seq, reason, count, limit, t_key, muted))
        return Trip(index, call, reason, count, limit, t_key, muted)


@dataclass(frozen=True, slots=True)
class Tripped:
    """A :class:`Trip` as a state keeps it: the call by its ``seq``."""

    index: int
    seq: int
    reason: str
    count: int
    limit: int
    target: str | None
    muted: bool

    def call(self, calls: Sequence[ToolCall]) -> Trip:
        """The trip, its call found in ``calls`` (the transcript's, by ``seq``)."""
        return Trip(self.index, calls[self.seq], self.reason, self.count, self.limit, self.target, self.muted)


class TurnState:
    """One turn's ledger while it is read: ``turn``, the ``calls`` counted, the counts per
    canonical call (``same_call``, with each call's target in ``call_targets``) and per target
    (``on``, command words included), the plain targets so far (``paths``), the failure ``run``
    before the current ``step`` and that step's failure ``flags``, the trips so far
    (``trips``, :class:`Tripped`) and, progress-aware, the judge with its situation counter.
    Mutable; :meth:`copy` is independent."""

    __slots__ = (
        "call_targets",
        "calls",
        "epochs",
        "flags",
        "judge",
        "on",
        "paths",
        "run",
        "same_call",
        "step",
        "trips",
        "turn",
    )

    def __init__(self, turn: int, judge: RepeatJudge | None, epochs: EpochCounter | None) -> None:
        self.turn = turn
        self.judge = judge
        self.epochs = epochs
        self.calls = 0
        self.same_call: Counter[tuple[str, str]] = Counter()
        self.call_targets: dict[tuple[str, str], str | None] = {}
        self.on: Counter[str] = Counter()
        self.paths: set[str] = set()
        self.run = 0
        self.step = -1
        self.flags: list[bool | None] = []
        self.trips: list[Tripped] = []

    def copy(self) -> TurnState:
        epochs = self.epochs.copy() if self.epochs is not None else None
        out = TurnState(self.turn, self.judge.copy(epochs) if self.judge is not None else None, epochs)
        out.calls, out.run, out.step = self.calls, self.run, self.step
        out.same_call = Counter(self.same_call)
        out.call_targets = dict(self.call_targets)
        out.on = Counter(self.on)
        out.paths = set(self.paths)
        out.flags = list(self.flags)
        out.trips = list(self.trips)
        return out

    def ledger(self, trips: Sequence[Trip]) -> TurnLedger:
        """The :class:`TurnLedger` so far, with ``trips`` (these trips, their calls resolved);
        its containers are copies."""
        targets = Counter({t: self.on[t] for t in self.call_targets.values() if t is not None})
        return TurnLedger(
            self.turn,
            self.calls,
            Counter(self.same_call),
            dict(self.call_targets),
            targets,
            _fold(self.run, self.flags),
            tuple(trips),
        )


class TurnGuardState:
    """What :class:`TurnGuard` has read: the next call (``next``, an index into
    ``transcript.calls``) and the ledger of the turn of the last call read (``turn``; earlier
    turns are never read again). Mutable; :meth:`copy` is independent."""

    __slots__ = ("next", "turn")

    def __init__(self, turn: TurnState) -> None:
        self.next = 0
        self.turn = turn

    def copy(self) -> TurnGuardState:
        out = TurnGuardState(self.turn.copy())
        out.next = self.next
        return out
