"""escalation (DESIGN §2.2): reminders the model ignores lead somewhere.

Rules, per episode (:mod:`proxy.core.episodes`: the calls after a new request; a "continue" or a
compaction summary does not start one, because the loop rules whose reminders the ladder counts go
on counting across them — a user who types "continue" after a stop while the model keeps looping
sees its next stale call withheld and the one after stopped again; a new request starts from the
bottom of the ladder):
- A reminder *about* a call (``Remind.call``; every rule's reminders after a step name the call
  that brought them, reminders about text or time name none) counts for what that call is on:
  its tool (with a multiplexed tool's subcommand) and target
  (:func:`proxy.core.targets.call_on`; a call without a target is on its tool). Reminders are counted
  once per place (two rules reminding after one step are one message to the model), and only the
  ones the model had read before a call (placed before it) count for it.
- After ``after_reminders`` (2) reminders about one tool and target in the episode, the next call
  to that tool on that target whose result is *nothing new* — equal (masked,
  :mod:`proxy.core.progress`) to the result of an earlier call on it in the episode — has its result
  withheld. A new result is
  progress and passes: the ladder stops only what keeps failing to move. So is a successful
  edit with a new change (:class:`proxy.core.effects.EditLedger`), whatever its constant success line
  says; and a failure with the same shape as an earlier one on it (an agent's tool that echoes its
  arguments in its errors, :func:`proxy.core.agents.failure_shape`) is nothing new. A new result also sets
  the count back: only reminders placed after the last new result on that target count (a job
  polled with one command, whose output moves on every few polls, gets its "same result"
  reminders between the moves, and is never withheld; found by a new user's Claude Code tryout). A call
  whose result is not known yet (the response side's look-ahead) counts as nothing new only when the
  previous call on that target got nothing new and this one repeats it with at most small changes to its
  arguments (canonical arguments at least :data:`SIMILAR` alike, :class:`difflib.SequenceMatcher` ratio
  over their first :data:`SIMILAR_CHARS` characters): a drifting repeat, not a new approach (a rewritten
  edit of the same file is a new approach and is not stopped). A cancelled call
  (:func:`proxy.core.failures.cancelled`: it never ran) is neither: never withheld, and it neither
  adds a result nor counts as progress.
- This is what ends loops whose arguments drift (a small model's escaping noise, reminder text
  echoed into the arguments), which exact-match rules never see as repeats: the reminders of the
  target-based rules (repeated failures, cycles) still come, and the ladder acts on them.
- The response side (:class:`proxy.response.decide.StopJudge`) ends the turn when, with ``stop``, an
  answer's call would be withheld by this rule again after it already withheld one in the turn
  (since the last user message of any kind: "continue" gives the model one more chance; a
  harness's format-error reply is none, :func:`proxy.response.decide.turn_start`).
"""

from __future__ import annotations

import bisect
import difflib
from collections import Counter
from collections.abc import Sequence

from proxy.config import EscalationConfig
from proxy.core import agents
from proxy.core.actions import Action, Remind, Withhold
from proxy.core.canonical import canonical_arguments
from proxy.core.effects import EditLedger, Situations
from proxy.core.episodes import EpisodeCounter
from proxy.core.failures import cancelled
from proxy.core.memo import Memo
from proxy.core.progress import Masks, same_result
from proxy.core.targets import TargetRule, call_on
from proxy.core.transcript import ToolCall, ToolResult, Transcript
from proxy.core.waits import is_wait
from proxy.guards.resume import unread
from proxy.guards.turns import call_memo, known, memoized
from proxy.guards.wording import QUOTE, Style, speak

RULE = "escalation"
#: How alike (difflib ratio) a pending call's arguments must be to the last stale call's.
SIMILAR = 0.8
SIMILAR_CHARS = 2000

WITHHOLD_TEXT = (
    "[loopguard] The result of this call is withheld: you were reminded {count} times that your "
    "calls to {subject} were not getting anywhere, and this call got the same result as an "
    "earlier one. Stop calling {tool} for this: use the results you already have, "
    "try a different approach, or tell the user what is blocking you."
)
#: ``recovery.reminders: plain | redirect`` (:mod:`proxy.guards.wording`): neither the tool nor the
#: target.
PLAIN_WITHHOLD_TEXT = (
    "[loopguard] The result of this call is withheld: you were reminded {count} times that these "
    "calls were not getting anywhere, and this call got the same result as an earlier one."
)
PLAIN_WITHHOLD_CLOSE = (
    "Stop making this call: try a different approach, or tell the user what is blocking you."
)


def similar(a: ToolCall, b: ToolCall) -> bool:
    """True when ``b`` repeats ``a`` with at most small changes to its arguments."""
    x = canonical_arguments(a.arguments, a.arguments_raw)[:SIMILAR_CHARS]
    y = canonical_arguments(b.arguments, b.arguments_raw)[:SIMILAR_CHARS]
    if x == y:
        return True
    # difflib's two upper bounds of its ratio first (``real_quick_ratio``: the shorter length,
    # ``quick_ratio``: the characters in common as multisets; the same values, computed without
    # building the matcher, which costs most of a judged answer's time), then the ratio itself
    length = len(x) + len(y)
    if 2.0 * min(len(x), len(y)) / length < SIMILAR:
        return False
    if 2.0 * (Counter(x) & Counter(y)).total() / length < SIMILAR:
        return False
    return difflib.SequenceMatcher(None, x, y, autojunk=False).ratio() >= SIMILAR


class Escalation:
    """Guard callable: ``Escalation(cfg)(transcript, ctx) -> list[Withhold]``; reads
    ``ctx.prior`` (the reminders decided before it)."""

    __slots__ = ("_cfg", "_memo", "_situations", "_style", "_targets")

    name = RULE
    reads_prior = True
    #: of the prior actions only the reminders about calls not read yet are taken (a reminder names
    #: the call that brought it): a resumed run hands it only the actions decided in that run
    #: (:func:`proxy.guards.resume.evaluate_resumed`), not a long history's thousands before the cut
    reads_prior_unread = True

    def __init__(
        self,
        cfg: EscalationConfig,
        targets: TargetRule | None = None,
        situations: Situations | None = None,
        style: Style = QUOTE,
    ) -> None:
        self._cfg = cfg
        self._style = style
        self._targets = targets or TargetRule()
        self._situations = situations or Situations()
        self._memo: Memo[tuple[str, str], tuple[str, str | None]] = call_memo()

    @property
    def config(self) -> EscalationConfig:
        return self._cfg

    def on(self, call: ToolCall) -> tuple[str, str | None]:
        """What ``call`` is on (memoized per tool and arguments string)."""
        return memoized(
            self._memo, call, lambda c: call_on(self._targets, c.name, c.arguments, c.arguments_raw)
        )

    def begin(self) -> EscalationState:
        """The state before any call (:mod:`proxy.guards.resume`)."""
        return EscalationState(self._situations.episode_counter(), self._situations.edit_ledger())

    def __call__(self, transcript: Transcript, ctx: object = None) -> list[Action]:
        return self.advance(self.begin(), transcript, ctx, transcript.message_count)

    def advance(self, state: EscalationState, transcript: Transcript, ctx: object, upto: int) -> list[Action]:
        """Read the calls before message position ``upto`` that ``state`` has not read
        (:mod:`proxy.guards.resume`); the withholds decided for them. ``ctx.prior``: every action
        decided before this guard for the whole transcript; only the reminders about calls not
        read yet are taken from it (those about a call are registered when the call is read: the
        ones that count for a call are about earlier calls)."""
        calls = transcript.calls
        s = state
        first = s.next
        if first >= len(calls) or calls[first].position >= upto:
            return []  # nothing to read: the prior actions need not be looked at
        about: dict[int, list[int]] = {}  # call seq -> where the reminders about it are
        n = len(calls)
        # every action decided before this guard, withheld results (most of a long history's)
        # among them: the reminders about unread calls picked out in one comprehension
        prior = getattr(ctx, "prior", ())
        for action in [a for a in prior if isinstance(a, Remind) and a.call is not None and a.call >= first]:
            seq = action.call
            if seq is not None and seq < n and action.rule != RULE:
                about.setdefault(seq, []).append(action.after)
        masks = self._situations.masks
        actions: list[Action] = []
        for call in unread(s, calls, upto):
            if is_wait(call):  # waiting is not looping (proxy.core.waits): never withheld
                continue
            episode = s.episodes.of(transcript, call.position)
            if episode != s.episode:  # a new episode starts from the bottom of the ladder
                s.episode, s.start, s.tracks, s.owned = episode, call.seq, {}, set()
                s.edits = self._situations.edit_ledger()
            afters = about.get(call.seq)
            if afters is None and not s.tracks:  # nothing reminded about in the episode yet
                continue
            on = self.on(call)
            track = s.own(on)
            if track is None:
                if afters is None:  # never reminded about (yet): judged from its first reminder
                    continue
                # the first reminder on it: judge the episode's calls on it before this one
                track = s.tracks[on] = Track()
                s.owned.add(on)
                for seq in range(s.start, call.seq):
                    if self.on(calls[seq]) == on and not is_wait(calls[seq]):
                        self._judge(track, calls[seq], calls, masks, s.edits, on)
            for after in afters or ():
                i = bisect.bisect_left(track.places, after)
                if i == len(track.places) or track.places[i] != after:  # once per place
                    track.places.insert(i, after)
            stale = self._judge(track, call, calls, masks, s.edits, on)
            if not stale or call.result is None:
                continue
            # reminders read before it, and after the last new result on it (progress)
            positions = track.places
            count = bisect.bisect_left(positions, call.position) - bisect.bisect_left(positions, track.moved)
            if count < self._cfg.after_reminders:
                continue
            if self._style != QUOTE:
                plain = PLAIN_WITHHOLD_TEXT.format(count=count)
                denial = speak(self._style, plain, transcript, call, PLAIN_WITHHOLD_CLOSE)
            else:
                tool, target = on
                subject = f"{tool} on {target}" if target and target != tool else tool
                denial = WITHHOLD_TEXT.format(count=count, subject=subject, tool=call.name)
            actions.append(
                Withhold(
                    position=call.result.position,
                    part=call.result.part,
                    call_id=call.call_id,
                    text=denial,
                    rule=RULE,
                    tool=call.name,
                    count=count,
                    limit=self._cfg.after_reminders,
                    fresh=transcript.is_fresh(call.step),
                    reason="reminders",
                )
            )
        return actions

    @staticmethod
    def _judge(
        track: Track,
        call: ToolCall,
        calls: Sequence[ToolCall],
        masks: Masks,
        edits: EditLedger,
        on: tuple[str, str | None],
    ) -> bool:
        """Whether ``call`` got nothing new on its target (``track``), updating the track and the
        episode's ``edits`` (not for a cancelled call: it got nothing at all)."""
        if cancelled(call.result):
            return False
        if known(call.result):
            assert call.result is not None
            shape = agents.failure_shape(call.name, call.result.text, arguments=call.arguments)
            if edits.progress(call, on):
                stale = False
            else:
                stale = any(same_result(r, call.result, masks) for r in track.results) or (
                    shape is not None and shape in track.shapes
                )
            track.results.append(call.result)
            if shape is not None:
                track.shapes.append(shape)
        else:
            stale = track.last_stale is not None and similar(calls[track.last_stale], call)
        track.last_stale = call.seq if stale else None
        if not stale and call.result is not None:
            track.moved = call.result.position
        return stale


class Track:
    """What one episode has of the calls on one tool and target that were reminded about:
    ``places`` (sorted, once each) of the reminders about them read so far, their known
    ``results`` in order and the failure ``shapes`` among them, ``last_stale`` the last call's
    ``seq`` when it got nothing new, and ``moved`` the position of the last new result (-1:
    none)."""

    __slots__ = ("last_stale", "moved", "places", "results", "shapes")

    def __init__(self) -> None:
        self.places: list[int] = []
        self.results: list[ToolResult] = []
        self.shapes: list[str] = []
        self.last_stale: int | None = None
        self.moved = -1

    def copy(self) -> Track:
        out = Track()
        out.places, out.results, out.shapes = list(self.places), list(self.results), list(self.shapes)
        out.last_stale, out.moved = self.last_stale, self.moved
        return out


class EscalationState:
    """What :class:`Escalation` has read: the next call (``next``, an index into
    ``transcript.calls``), the episode counter, the current ``episode``, the ``seq`` of its
    first call (``start``) and a :class:`Track` per tool and target reminded about in it
    (``tracks``) and the changes of its edits on them (``edits``; a target is tracked from its
    first reminder, its earlier calls in the episode
    read again then; earlier episodes are never read again). Mutable; :meth:`copy` is
    independent.

    A copy shares the tracks (copy on write, :meth:`own`): a long episode holds a track per
    target reminded about, each with every result read on it, and a resumed request copies its
    state twice (:func:`proxy.guards.resume.evaluate_from`) but touches one or two tracks; copying
    all of them was most of the cost of a request at the end of a 5 MB session."""

    __slots__ = ("edits", "episode", "episodes", "next", "owned", "start", "tracks")

    def __init__(self, episodes: EpisodeCounter, edits: EditLedger) -> None:
        self.episodes = episodes
        self.edits = edits
        self.next = 0
        self.episode = -1
        self.start = 0
        self.tracks: dict[tuple[str, str | None], Track] = {}
        #: the keys of ``tracks`` this state may change in place (no other state holds them)
        self.owned: set[tuple[str, str | None]] = set()

    def own(self, on: tuple[str, str | None]) -> Track | None:
        """The track on ``on`` (None: none), this state's own to change (copied first when it is
        shared with another state)."""
        track = self.tracks.get(on)
        if track is not None and on not in self.owned:
            track = self.tracks[on] = track.copy()
            self.owned.add(on)
        return track

    def copy(self) -> EscalationState:
        out = EscalationState(self.episodes.copy(), self.edits.copy())
        out.next, out.episode, out.start = self.next, self.episode, self.start
        out.tracks = dict(self.tracks)
        self.owned = set()  # shared from now on: either state copies a track before changing it
        return out
