"""Collapse (``recovery.collapse``): a run of identical call/result pairs is folded into its first
pair and a note, in the body the upstream sees, so that the repetition is no longer in the context
the model conditions on (DESIGN §2.2: interventions must not feed the loop).

A *run* is at least ``min_repeats`` consecutive steps that are each *foldable* and each the same
as the run's first step:

- foldable: the step made exactly one call (parallel calls are never folded), its result has
  arrived (not the response side's placeholder) in a message of its own, right after the call
  (a call written as text whose result is a block of a user message is not folded), the
  assistant message said nothing (its text empty or whitespace only: what a model said is never
  left out), and the call does not wait (:func:`proxy.core.waits.is_wait`: a poll that says the
  process is still running, a sleep; waiting is not looping);
- consecutive: the step's first position is right after the previous step's last result, so
  nothing lies between them (no user message, no assistant text, no note of a harness, no
  reasoning item of its own);
- the same: the same tool and canonical arguments (DESIGN §5, every argument compared: the note
  says it was the same call), the same error flag, and the same result text after masking
  volatile spans (:func:`proxy.core.progress.same_text`, as progress-aware counting compares
  results), compared with the first step's result, the one the upstream still sees.

Each run becomes one :class:`proxy.core.actions.Fold`: its second through last steps are left
out, and the note goes after the first step's result. The note says how many times the call was
made and that each time it got the same result, the one shown; it never quotes the call's name or
arguments. When the guards withheld the first step's result, the note does not point at it.
The guards' reminders and withheld results on the folded steps go with them; the note then says
how many there were and what they asked (:func:`guidance`), so the model is still told, and a
stop that cites them is true of what it read.

Pure, and a function of the transcript (and the guards' withholds, themselves a function of it):
a later request of the conversation folds the same runs at the same positions, so its upstream
body is byte-identical up to the fold; a run that grows at the tail changes only what follows its
first step. The upstream's prefix cache breaks once, at the request whose run first reaches
``min_repeats`` (:func:`breaks_prefix`).
"""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from proxy.core.actions import Delivery, Fold
from proxy.core.canonical import canonical_arguments
from proxy.core.progress import DEFAULT_MASKS, Masks, same_text
from proxy.core.transcript import ToolCall, Transcript
from proxy.core.waits import is_wait

RULE = "collapse"

#: The note after a run's first step (``{count}``: the run's steps).
NOTE = (
    "Note: the tool call above was made {count} times in a row with the same arguments, and each "
    "time it returned the same result, the one shown above. The repeated calls are left out here."
)
#: The note when that first step's result was withheld by a guard (it is not shown).
NOTE_WITHHELD = (
    "Note: the tool call above was made {count} times in a row with the same arguments, and each "
    "time it returned the same result. The repeated calls are left out here."
)

#: Added to the note when guidance of the guards went with the folded steps (their reminders, their
#: withheld results): the model is still told, without the call quoted, what it was told there,
#: so a later stop that cites those reminders and withheld results says what the model read.
GUIDANCE = (
    " Before this note, loopguard {what}. Do not make this call again: change your approach, or "
    "answer the user with what you know."
)


def guidance(reminded: int, withheld: int) -> str:
    """The :data:`GUIDANCE` sentence for ``reminded`` reminders and ``withheld`` withheld results
    left out with the folded steps; "" when there were none."""
    what = []
    if reminded:
        times = "once" if reminded == 1 else f"{reminded} times"
        what.append(f"reminded you {times} that this call was not getting anywhere")
    if withheld:
        results = "one of its results" if withheld == 1 else f"{withheld} of its results"
        what.append(f"withheld {results}")
    return GUIDANCE.format(what=" and ".join(what)) if what else ""


@dataclass(frozen=True, slots=True)
class Collapse:
    """What folding needs of the config: ``min_repeats`` (steps in a run before it is folded,
    >= 2; ``recovery.collapse.min_repeats``), ``masks`` (the compiled ``progress.masks``) and
    ``delivery`` (``guards.repeat_reminder.inject_as``: how the note is delivered)."""

    min_repeats: int = 3
    masks: Masks = DEFAULT_MASKS
    delivery: Delivery = "user"


def _foldable(t: Transcript, index: int, texts: AbstractSet[int]) -> ToolCall | None:
    """The one call of step ``index`` when the step can be folded (module docstring), else None."""
    step = t.steps[index]
    if len(step.calls) != 1 or step.end != step.position + 1 or step.position in texts:
        return None
    call = t.calls[step.calls[0]]
    result = call.result
    if result is None or result.pending or result.part is not None or result.position != step.end:
        return None
    if is_wait(call):
        return None
    return call


def _key(call: ToolCall) -> tuple[str, str]:
    return call.name, canonical_arguments(call.arguments, call.arguments_raw)


def runs(t: Transcript, min_repeats: int, masks: Masks = DEFAULT_MASKS) -> list[tuple[int, ...]]:
    """The runs of ``t`` (module docstring): each the indexes of its steps, in order, at least
    ``min_repeats`` of them; runs never overlap."""
    out: list[tuple[int, ...]] = []
    texts = frozenset(t.assistant_text_positions)
    run: list[int] = []
    first: ToolCall | None = None
    key: tuple[str, str] | None = None
    for index in range(len(t.steps)):
        call = _foldable(t, index, texts)
        if call is not None and first is not None and key is not None and run:
            prev = t.steps[run[-1]]
            assert first.result is not None and call.result is not None
            if (
                t.steps[index].position == (prev.end or 0) + 1
                and _key(call) == key
                and call.result.is_error == first.result.is_error
                and same_text(first.result.text, call.result.text, masks)
            ):
                run.append(index)
                continue
        if len(run) >= min_repeats:
            out.append(tuple(run))
        if call is None:
            run, first, key = [], None, None
        else:
            run, first, key = [index], call, _key(call)
    if len(run) >= min_repeats:
        out.append(tuple(run))
    return out


def folds(
    t: Transcript,
    collapse: Collapse,
    withheld: AbstractSet[int] = frozenset(),
    reminded: AbstractSet[int] = frozenset(),
) -> tuple[Fold, ...]:
    """One :class:`Fold` per run of ``t`` (:func:`runs`), in order. ``withheld``: the positions of
    results the guards withhold (the note then does not point at the first step's result);
    ``reminded``: the positions the guards' reminders go after. Those inside a fold go with its
    steps, and its note then says how many there were (:func:`guidance`). A fold is ``fresh``
    when its run ends at the request's newest step."""
    return tuple(_folds(t, collapse, withheld, reminded))


def _folds(
    t: Transcript, collapse: Collapse, withheld: AbstractSet[int], reminded: AbstractSet[int]
) -> Iterator[Fold]:
    for run in runs(t, collapse.min_repeats, collapse.masks):
        first, second, last = t.steps[run[0]], t.steps[run[1]], t.steps[run[-1]]
        assert first.end is not None and last.end is not None
        note = NOTE_WITHHELD if first.end in withheld else NOTE
        gone = range(second.position, last.end + 1)
        told = guidance(sum(p in gone for p in reminded), sum(p in gone for p in withheld))
        yield Fold(
            after=first.end,
            start=second.position,
            stop=last.end,
            text=note.format(count=len(run)) + told,
            rule=RULE,
            tool=t.calls[first.calls[0]].name,
            count=len(run),
            limit=collapse.min_repeats,
            fresh=t.is_fresh(run[-1]),
            delivery=collapse.delivery,
            steps=(run[0], run[-1]),
        )


def breaks_prefix(fold: Fold) -> bool:
    """True when ``fold`` begins at a step the conversation's previous request sent unfolded: a
    fresh fold whose run has just reached ``min_repeats`` (before this step the run was one step
    short, so its steps went upstream as they were)."""
    return fold.fresh and fold.count == fold.limit
