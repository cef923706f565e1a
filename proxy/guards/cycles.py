"""cycles (DESIGN §6.5): the turn's calls going round a cycle of 2-5 steps — reminder, then
withhold.

Rules:
- Per turn, each call is reduced to its *identity*: tool name and target (:mod:`proxy.core.targets`,
  the ``turn_guard.targets`` overrides; a leading ``./`` ignored), or, for a call without a
  target, tool name and canonical arguments. Arguments of targeted calls may differ: an
  edit/write ping-pong on one file with different content is a cycle; the same sequence over
  different files (a per-item batch) is not, because the targets differ. A multiplexed tool's
  subcommand is part of its identity (``str_replace_editor`` ``view`` and ``str_replace`` on one
  file are two different steps).
- The calls up to call *i* end in a cycle of period *p* (``min_period``..``max_period``) when
  each of the last ``p * (n - 1)`` identities equals the one *p* calls before it; *n* is the
  number of repetitions. A period whose block is one identity repeated (A A) is an exact repeat,
  left to the repeat rules. The smallest matching period is reported.
- When the cycle reaches ``repetitions`` (3) repetitions and (with ``progress_aware``) every call
  of the last round got the same result (masked) as the call one period before, a reminder
  describing the cycle goes after the completing call's step: debugging that edits and re-runs
  with new results each round is not going in circles.
- From ``withhold_at`` (4) repetitions on, every call that continues the cycle has its result
  withheld — with ``progress_aware``, only when every call of the last round (the last *p* calls)
  got the same result (masked, :mod:`proxy.core.progress`) as the call one period before it and no call
  in between changed the situation (:mod:`proxy.core.effects`: a successful new edit does): a cycle
  where something changes (re-reading a file after each edit) is still getting somewhere. A result
  not yet known is judged by the previous pair.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.config import CyclesConfig
from proxy.core.actions import Action, Delivery, Withhold
from proxy.core.canonical import canonical_arguments
from proxy.core.effects import EpochCounter, Situations
from proxy.core.episodes import EpisodeCounter
from proxy.core.memo import Memo
from proxy.core.progress import Masks, same_result
from proxy.core.targets import TargetRule, path_key, subcommand
from proxy.core.transcript import ToolCall, Transcript
from proxy.core.waits import is_wait
from proxy.guards.repeat_reminder import preview
from proxy.guards.resume import unread
from proxy.guards.turns import call_memo, known, memoized, remind_after_step
from proxy.guards.wording import QUOTE, Style, speak

RULE = "cycles"
STEP_PREVIEW_CHARS = 120

REMIND_TEXT = (
    "[loopguard] You are going in circles: the same {period} steps have now repeated {count} "
    "times in a row, and the last round gave the same results as the round before:\n{steps}\n"
    "Another round will end the same way. Stop and rethink: what did these results tell you, "
    "and what different step would get you further? If you are stuck, tell the user."
)
WITHHOLD_TEXT = (
    "[loopguard] The result of this call is withheld: it continues a cycle of {period} steps "
    "({cycle}) that you have now repeated {count} times without a different outcome. Break the "
    "cycle: use the results you already have, try a different approach, or tell the user what is "
    "blocking you."
)
#: ``recovery.reminders: plain | redirect`` (:mod:`proxy.guards.wording`): the cycle's length and
#: rounds, not its steps; "the same results" only where the rule required them (``progress_aware``).
PLAIN_REMIND_TEXT = (
    "[loopguard] You are going in circles: the same {period} steps have now repeated {count} times in "
    "a row{same}. Another round will end the same way."
)
PLAIN_REMIND_CLOSE = (
    "Stop and rethink: what did these results tell you, and what different step would get you "
    "further? If you are stuck, tell the user."
)
PLAIN_WITHHOLD_TEXT = (
    "[loopguard] The result of this call is withheld: it continues a cycle of {period} steps that you "
    "have now repeated {count} times{same}."
)
PLAIN_WITHHOLD_CLOSE = "Break the cycle: try a different approach, or tell the user what is blocking you."
SAME_ROUND = ", and the last round gave the same results as the round before"


def _block_period_is(block: Sequence[tuple[str, str]], period: int) -> bool:
    """True when ``block`` (one period) is not itself a repetition of a shorter block."""
    for d in range(1, period):
        if period % d == 0 and all(block[k] == block[k - d] for k in range(d, period)):
            return False
    return True


def _same(s: CyclesState, calls: Sequence[ToolCall], masks: Masks, k: int, p: int) -> tuple[bool, bool]:
    """(the open turn's call ``k``'s result repeats the one ``p`` calls before, and nothing in
    between changed the situation), memoized in ``s.memo``; a result not known yet is judged by
    the previous pair. A module function, not a closure in :meth:`Cycles.advance`: a local
    function that calls itself refers to itself through its closure, a reference cycle that
    kept each request's guard state and results alive until a full collection."""
    if k < p:
        return False, False
    memo = s.memo
    if (k, p) not in memo:
        call, before = calls[s.start + k], calls[s.start + k - p]
        if known(call.result):
            result = same_result(call.result, before.result, masks)
        else:
            result = _same(s, calls, masks, k - p, p)[0]
        memo[(k, p)] = (result, result and s.epochs.unchanged(before.seq, call.seq))
    return memo[(k, p)]


class Cycles:
    """Guard callable: ``Cycles(cfg)(transcript, ctx) -> list[Remind | Withhold]``."""

    __slots__ = ("_cfg", "_delivery", "_memo", "_situations", "_style", "_targets")

    name = RULE

    def __init__(
        self,
        cfg: CyclesConfig,
        delivery: Delivery = "user",
        situations: Situations | None = None,
        targets: TargetRule | None = None,
        style: Style = QUOTE,
    ) -> None:
        self._cfg = cfg
        self._style = style
        self._delivery = delivery
        self._situations = situations or Situations()
        self._memo: Memo[tuple[str, str], tuple[str, str]] = call_memo()
        self._targets = targets or TargetRule()

    def identity(self, call: ToolCall) -> tuple[str, str]:
        """(tool, target) of ``call`` (memoized per tool and arguments string)."""
        return memoized(self._memo, call, self._identity)

    def _identity(self, call: ToolCall) -> tuple[str, str]:
        target = self._targets(call.name, call.arguments)
        if target is not None:
            where = target.value if target.is_command else path_key(target.value)
            sub = subcommand(call.arguments)
            return call.name, f"{sub} {where}" if sub else where
        return call.name, "\0" + canonical_arguments(call.arguments, call.arguments_raw)

    def begin(self) -> CyclesState:
        """The state before any call (:mod:`proxy.guards.resume`)."""
        episodes = self._situations.episode_counter() if self._cfg.progress_aware else None
        return CyclesState(self._situations.epoch_counter(), episodes, self._cfg.max_period)

    def __call__(self, transcript: Transcript, ctx: object = None) -> list[Action]:
        return self.advance(self.begin(), transcript, ctx, transcript.message_count)

    def advance(self, state: CyclesState, transcript: Transcript, ctx: object, upto: int) -> list[Action]:
        """Read the calls before message position ``upto`` that ``state`` has not read
        (:mod:`proxy.guards.resume`); the reminders and withholds decided for them."""
        cfg = self._cfg
        periods = range(cfg.min_period, cfg.max_period + 1)
        calls = transcript.calls
        masks = self._situations.masks
        s = state
        epochs = s.epochs

        actions: list[Action] = []
        for call in unread(s, calls, upto):
            epochs.add(call)
            group = call.turn if s.episodes is None else s.episodes.of(transcript, call.position)
            if group != s.group:
                s.new_turn(group, call.seq, periods)
            i = s.index
            s.index += 1
            ids = s.recent
            # a wait (proxy.core.waits) is like no other call: time passed, no cycle goes through it
            ids.append(("\0wait", str(call.seq)) if is_wait(call) else self.identity(call))
            if len(ids) > cfg.max_period + 1:
                del ids[0]
            # ids[-1 - d] is the identity of the turn's call i - d (d <= max_period)
            run = s.run
            for p in periods:
                run[p] = run[p] + 1 if i >= p and ids[-1] == ids[-1 - p] else 0
            s.prune(i)
            found = next((p for p in periods if run[p] >= p and _block_period_is(ids[-p:], p)), None)
            if found is None:
                continue
            p = found
            block = ids[-p:]
            count = run[p] // p + 1  # repetitions, counting the first
            complete = run[p] % p == 0
            last_round = [_same(s, calls, masks, k, p) for k in range(i - p + 1, i + 1)]
            # a reminder only when the last round got the same results as the one before
            repeated = not cfg.progress_aware or all(r for r, _ in last_round)
            if complete and count == cfg.repetitions and repeated:
                if self._style != QUOTE:
                    same = SAME_ROUND if cfg.progress_aware else ""
                    plain = PLAIN_REMIND_TEXT.format(period=p, count=count, same=same)
                    text = speak(self._style, plain, transcript, call, PLAIN_REMIND_CLOSE)
                else:
                    steps = "\n".join(
                        f"  {k}. {name} {preview(target.lstrip(chr(0)), STEP_PREVIEW_CHARS)}"
                        for k, (name, target) in enumerate(block, 1)
                    )
                    text = REMIND_TEXT.format(period=p, count=count, steps=steps)
                remind = remind_after_step(
                    transcript, call, text, RULE, count, cfg.repetitions, self._delivery
                )
                if remind is not None:
                    actions.append(remind)
            withhold = cfg.withhold_at and run[p] >= p * (cfg.withhold_at - 1)
            # no call of the last round got a new result, and none changed the situation
            stale = all(unchanged for _, unchanged in last_round)
            if not withhold or (cfg.progress_aware and not stale) or call.result is None:
                continue
            if self._style != QUOTE:
                same = SAME_ROUND if cfg.progress_aware else ""
                plain = PLAIN_WITHHOLD_TEXT.format(period=p, count=count, same=same)
                denial = speak(self._style, plain, transcript, call, PLAIN_WITHHOLD_CLOSE)
            else:
                cycle = " → ".join(name for name, _ in block)
                denial = WITHHOLD_TEXT.format(period=p, cycle=cycle, count=count)
            actions.append(
                Withhold(
                    position=call.result.position,
                    part=call.result.part,
                    call_id=call.call_id,
                    text=denial,
                    rule=RULE,
                    tool=call.name,
                    count=count,
                    limit=cfg.withhold_at,
                    fresh=transcript.is_fresh(call.step),
                    reason="cycle",
                )
            )
        return actions


class CyclesState:
    """What :class:`Cycles` has read: the next call (``next``, a ``seq``), the situation counter of
    every call read (``epochs``), progress-aware the episode counter, and the open turn (``group``:
    its turn or episode number; ``start``: the ``seq`` of its first call; ``index``: its calls
    read; ``recent``: the identities of its last ``max_period + 1`` calls; ``run``: per period,
    identities in a row equal to the one a period before; ``memo``: per (turn index, period),
    the verdicts of :meth:`Cycles.advance`'s ``same``, only those of recent calls kept). Mutable;
    :meth:`copy` is independent."""

    __slots__ = (
        "episodes",
        "epochs",
        "group",
        "index",
        "max_period",
        "memo",
        "next",
        "recent",
        "run",
        "start",
    )

    def __init__(self, epochs: EpochCounter, episodes: EpisodeCounter | None, max_period: int) -> None:
        self.epochs = epochs
        self.episodes = episodes
        self.max_period = max_period
        self.next = 0
        self.group = -1
        self.start = 0
        self.index = 0
        self.recent: list[tuple[str, str]] = []
        self.run: dict[int, int] = {}
        self.memo: dict[tuple[int, int], tuple[bool, bool]] = {}

    def new_turn(self, group: int, start: int, periods: range) -> None:
        """Open the turn ``group`` whose first call is ``start`` (a ``seq``)."""
        self.group, self.start, self.index = group, start, 0
        self.recent = []
        self.run = dict.fromkeys(periods, 0)
        self.memo = {}

    def prune(self, i: int) -> None:
        """Drop the verdicts of calls more than two periods before the turn's call ``i`` once the
        memo has grown (only a verdict's value matters, and a dropped one is recomputed the same:
        the memo stays small, and so does a copy)."""
        if len(self.memo) > 16 * self.max_period * self.max_period:
            oldest = i - 2 * self.max_period
            self.memo = {kp: v for kp, v in self.memo.items() if kp[0] >= oldest}

    def copy(self) -> CyclesState:
        """An independent copy (small containers copied, the transcript never held)."""
        out = CyclesState(
            self.epochs.copy(), self.episodes.copy() if self.episodes is not None else None, self.max_period
        )
        out.next, out.group, out.start, out.index = self.next, self.group, self.start, self.index
        out.recent = list(self.recent)
        out.run = dict(self.run)
        out.memo = dict(self.memo)
        return out
