"""Guards that resume from a kept state: a request costs what its new steps cost.

An agent sends its whole history on every step, and a guard that reads the whole transcript on
every request does work that grows with the history. A *resumable* guard keeps what it has
established in a small mutable state and advances it over the transcript one unit (call, said
message, user message) at a time:

- ``guard.begin() -> state``: the state before anything is read. ``state.copy()`` is an
  independent copy (advancing either never changes the other).
- ``guard.advance(state, transcript, ctx, upto) -> list[Action]``: read every unit at a message
  position ``< upto`` that ``state`` has not read yet, in conversation order, and return the
  actions decided for them (in the order the whole-transcript call gives them).
- ``guard(transcript, ctx)`` is ``guard.advance(guard.begin(), transcript, ctx,
  transcript.message_count)``: one code path, so the whole-transcript call and the fold are the
  same by construction.

A :class:`Checkpoint` is every resumable guard's state at the *cut* of a transcript
(:func:`cut`: the position of its last step's assistant message; the last step is always read
again, since its results may still arrive) and the actions decided before it. None is made while
a call before the cut waits for its result.
:func:`evaluate_from` resumes from one: each resumable guard copies its kept state, advances it
over what lies between the two cuts (kept again as the new checkpoint) and over the rest. A guard
without ``begin``/``advance`` (narration: it reads the clock and the remembered state) runs over
the whole transcript every time.

What a checkpoint may be used for is the caller's promise (the prefix cache,
:mod:`proxy.request.prefix_cache`, keeps one per conversation): every unit before its cut is the
same in the new transcript, the guards are the same objects and the observed rules the same.
Then the actions are exactly those of :func:`proxy.guards.evaluate` (``tests/gates/test_resume.py``
replays every fixture and real run both ways, a request at a time). A guard that breaks that
promise (an action before the cut that depends on what comes after) is caught there.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from proxy.core.actions import Action
from proxy.core.transcript import ToolCall, Transcript

if TYPE_CHECKING:
    from proxy.guards import Context, Guard


def unread(state: Any, calls: Sequence[ToolCall], upto: int) -> Iterator[ToolCall]:
    """The calls of ``calls`` (a transcript's, in order) that ``state`` has not read, at message
    positions before ``upto``; each counts as read (``state.next``, its ``seq`` + 1) once handed
    out. The loop every resumable guard's ``advance`` runs over calls."""
    while state.next < len(calls) and calls[state.next].position < upto:
        call = calls[state.next]
        state.next += 1
        yield call


def resumable(guard: object) -> bool:
    """True for a guard with ``begin`` and ``advance`` (see the module docstring)."""
    return hasattr(guard, "begin") and hasattr(guard, "advance")


def cut(transcript: Transcript) -> int | None:
    """Where a checkpoint of ``transcript`` is taken: the message position of its last step's
    assistant message (None: no step, nothing worth keeping)."""
    return transcript.steps[-1].position if transcript.steps else None


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What :func:`evaluate_from` kept of one transcript. ``guards``: the guards it was made with
    (compared by identity: a reload builds new ones). ``observed``: the observed rules then.
    ``cut``: :func:`cut` of that transcript. ``states``/``actions``: per guard, its state after
    every unit before the cut and the actions decided for them (None/() for a guard that is not
    resumable). Never changed after it is made: a resume copies the states."""

    guards: tuple[Any, ...]
    observed: frozenset[str]
    cut: int
    states: tuple[Any, ...]
    actions: tuple[tuple[Action, ...], ...]

    def fits(self, guards: Sequence[Any], observed: AbstractSet[str], new_cut: int | None) -> bool:
        """True when a transcript cut at ``new_cut`` may resume from this checkpoint under those
        guards and observed rules (the caller having checked its units before :attr:`cut`)."""
        return (
            new_cut is not None
            and self.cut <= new_cut
            and len(self.guards) == len(guards)
            and all(a is b for a, b in zip(self.guards, guards, strict=True))
            and self.observed == frozenset(observed)
        )

    def narrowed(self, guards: Sequence[Any]) -> Checkpoint:
        """This checkpoint for a subset of its guards run under no observed rules (the
        response-side stop judge, :class:`proxy.response.decide.StopJudge`): each guard's kept state
        (found by identity; a guard not kept starts from nothing). A guard that reads prior actions
        keeps its state only when no rule was observed here: an observed rule changes what it
        read. Nothing but prior actions differs between the two runs before the cut (the other
        guards read only the transcript)."""
        index = {id(g): i for i, g in enumerate(self.guards)}
        states: list[Any] = []
        actions: list[tuple[Action, ...]] = []
        for g in guards:
            i = index.get(id(g))
            if i is None or (self.observed and getattr(g, "reads_prior", False)):
                states.append(None)
                actions.append(())
            else:
                states.append(self.states[i])
                actions.append(self.actions[i])
        return Checkpoint(tuple(guards), frozenset(), self.cut, tuple(states), tuple(actions))


def context_for(
    guard: object, ctx: Context, earlier: Sequence[Action], observed: AbstractSet[str]
) -> Context:
    """The context ``guard`` runs with: for a guard with ``reads_prior = True``, ``ctx.prior``
    plus the actions of the guards before it (``earlier``); an enforced one reads only the
    applied ones (see :func:`proxy.guards.evaluate`)."""
    if not getattr(guard, "reads_prior", False):
        return ctx
    prior = (*ctx.prior, *earlier)
    if observed and getattr(guard, "name", None) not in observed:
        prior = tuple(a for a in prior if a.rule not in observed and not a.observed)
    # made field by field: ``dataclasses.replace`` reads every field by name, twice per request
    return type(ctx)(ctx.conversation, ctx.now_ms, ctx.state, prior)


@dataclass(frozen=True, slots=True)
class Evaluation:
    """What :func:`evaluate_resumed` decided and kept. ``actions``: exactly what
    :func:`proxy.guards.evaluate` returns. ``checkpoint``: at the transcript's :func:`cut`, for
    the conversation's next request (None: no step, a call before the cut still waits for its
    result, or not asked for). ``end``: every resumable guard's state after the whole transcript
    (its ``cut`` the message count), for the answer's look-ahead, which appends one step to this
    very transcript (:class:`proxy.response.decide.StopJudge`): resumed from it, the guards read
    the answer's calls alone instead of the request's last step again (None: not asked for)."""

    actions: list[Action]
    checkpoint: Checkpoint | None
    end: Checkpoint | None = None


def evaluate_from(
    transcript: Transcript,
    guards: Sequence[Guard],
    ctx: Context,
    observed: AbstractSet[str] = frozenset(),
    checkpoint: Checkpoint | None = None,
    keep: bool = True,
    new_only: bool = False,
) -> tuple[list[Action], Checkpoint | None]:
    """:func:`proxy.guards.evaluate`, resuming the resumable guards from ``checkpoint`` when it
    :meth:`~Checkpoint.fits`; returns the actions (exactly what ``evaluate`` returns) and the
    checkpoint of this transcript (None when it has no step; always None with ``keep`` False:
    a caller that drops it, the stop judge, saves a copy of every guard's state). See
    :func:`evaluate_resumed`."""
    done = evaluate_resumed(transcript, guards, ctx, observed, checkpoint, keep=keep, new_only=new_only)
    return done.actions, done.checkpoint


def evaluate_resumed(
    transcript: Transcript,
    guards: Sequence[Guard],
    ctx: Context,
    observed: AbstractSet[str] = frozenset(),
    checkpoint: Checkpoint | None = None,
    keep: bool = True,
    end: bool = False,
    new_only: bool = False,
) -> Evaluation:
    """:func:`evaluate_from` as an :class:`Evaluation`, with its ``end`` checkpoint when ``end``
    is True (the guards' states after the last advance, which nothing changes afterwards: kept
    as they are, no copy).

    ``new_only``: the actions of a resumed guard are only those it decides for what lies after
    the checkpoint's cut (the ones before it are not handed on, to the caller nor to the guards
    that read prior actions); for a caller that reads only those, over a transcript whose units
    before the cut are all the checkpoint's (the stop judge: the answer's step after the
    request's whole transcript). A guard that reads prior actions then reads them from
    ``ctx.prior`` (the stop judge's: the request's reminders) and the new ones; the escalation
    ladder, the one such guard the judge asks, counts a reminder once per place and reads only
    those about calls it has not read.

    A transcript cut where ``checkpoint`` was (the same history sent again, or only results or a
    user message after its last step) has nothing between the two cuts: each guard's kept state
    is its state at the new cut as it is, so it is copied once (to read the rest) instead of
    twice, and ``checkpoint`` itself is kept."""
    new_cut = cut(transcript)
    usable = checkpoint is not None and checkpoint.fits(guards, observed, new_cut)
    same = usable and checkpoint is not None and checkpoint.cut == new_cut
    wanted = keep
    keep = keep and new_cut is not None and not same
    count = transcript.message_count
    actions: list[Action] = []
    states: list[Any] = []
    kept: list[tuple[Action, ...]] = []
    ends: list[Any] = []
    ended: list[tuple[Action, ...]] = []
    decided: list[Action] = []  # the actions decided in this run (not handed on from the checkpoint)
    for i, guard in enumerate(guards):
        # a guard that reads only the prior actions about calls it has not read gets those of
        # this run: the ones handed on are about calls before the cut, all read already
        unread_only = (
            usable
            and checkpoint is not None
            and checkpoint.states[i] is not None
            and getattr(guard, "reads_prior_unread", False)
        )
        gctx = context_for(guard, ctx, decided if unread_only else actions, observed)
        if not resumable(guard):
            whole = guard(transcript, gctx)
            actions.extend(whole)
            decided.extend(whole)
            states.append(None)
            kept.append(())
            ends.append(None)
            ended.append(())
            continue
        g: Any = guard
        if usable and checkpoint is not None and checkpoint.states[i] is not None:
            state = checkpoint.states[i].copy()
            own = [] if new_only else list(checkpoint.actions[i])
        else:
            state = g.begin()
            own = []
        handed = len(own)
        if new_cut is not None and not same:  # same: every unit before the cut is read already
            own.extend(g.advance(state, transcript, gctx, new_cut))
            if keep:
                states.append(state.copy())
                kept.append(tuple(own))
        own.extend(g.advance(state, transcript, gctx, count))
        actions.extend(own)
        decided.extend(own[handed:])
        if end:
            ends.append(state)
            ended.append(tuple(own))
    last = Checkpoint(tuple(guards), frozenset(observed), count, tuple(ends), tuple(ended)) if end else None
    if same:
        return Evaluation(actions, checkpoint if wanted else None, last)
    if not keep or not _settled(transcript, checkpoint.cut if usable and checkpoint else 0, new_cut):
        return Evaluation(actions, None, last)
    assert new_cut is not None
    made = Checkpoint(tuple(guards), frozenset(observed), new_cut, tuple(states), tuple(kept))
    return Evaluation(actions, made, last)


def _settled(transcript: Transcript, since: int, upto: int) -> bool:
    """True when every call at a message position in ``[since, upto)`` has its result (calls
    before ``since`` were checked when the checkpoint resumed from was made). A call before the
    cut still waiting for its result (a history that answers a step late) could get it in a
    later request and be judged differently: no checkpoint is made then."""
    for call in reversed(transcript.calls):
        if call.position >= upto:
            continue
        if call.position < since:
            break
        if call.result is None:
            return False
    return True
