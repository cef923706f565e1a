"""Guards: pure functions from a transcript (plus a context) to actions, in one ordered registry.

Every guard has one signature, ``guard(transcript, ctx) -> list[Action]``, and a ``name``. The
order of :func:`build_guards` is the order their actions are applied (and merged, for reminders on
the same step).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from proxy.config import GuardsConfig
from proxy.core.actions import Action
from proxy.core.effects import EffectRule, Situations
from proxy.core.episodes import ContinuationRule
from proxy.core.failures import FailureRule, RejectionRule
from proxy.core.progress import DEFAULT_MASKS, Masks
from proxy.core.state import ConversationState
from proxy.core.targets import TargetRule
from proxy.core.transcript import Transcript
from proxy.guards.circuit_breaker import CircuitBreaker
from proxy.guards.cycles import Cycles
from proxy.guards.echo_loop import EchoLoop
from proxy.guards.escalation import Escalation
from proxy.guards.monologue import Monologue
from proxy.guards.narration import Narration
from proxy.guards.recurrence import Recurrence
from proxy.guards.repeat_reminder import RepeatReminder
from proxy.guards.repeated_failure import RepeatedFailure
from proxy.guards.resume import context_for
from proxy.guards.same_target import SameTarget
from proxy.guards.turn_guard import TurnGuard
from proxy.guards.waiting import Waiting
from proxy.guards.wording import QUOTE, Style


@dataclass(frozen=True, slots=True)
class Context:
    """What a guard may know besides the transcript: the conversation key (DESIGN §4), the
    current time in ms since the epoch, and the conversation's remembered state
    (:mod:`proxy.core.state`; None when unknown or not kept). Only time-based rules (narration) read
    ``now_ms`` and ``state``."""

    conversation: str = ""
    now_ms: int = 0
    state: ConversationState | None = None
    #: actions decided before this guard ran (for guards with ``reads_prior = True``: the
    #: escalation ladder reads the reminders); the response-side stop check seeds it with the
    #: request's actions
    prior: tuple[Action, ...] = ()


Guard = Callable[[Transcript, Context], list[Action]]


def build_guards(
    cfg: GuardsConfig,
    masks: Masks = DEFAULT_MASKS,
    effects: EffectRule | None = None,
    continuations: ContinuationRule | None = None,
    stop_note: Guard | None = None,
    style: Style = QUOTE,
) -> tuple[Guard, ...]:
    """The enabled guards, in order: repeat_reminder, circuit_breaker, turn_guard, narration
    (part of ``turn_guard``'s config; on when it is enabled and ``narrate_after_ms`` > 0), the
    rules beyond exact repeats (DESIGN §6.5), ``waiting`` (a long wait's reminder), and last
    ``escalation`` (it reads the reminders of the guards before it).
    ``masks``: the compiled ``progress.masks``; ``effects``: the ``progress`` effect rule
    (:mod:`proxy.core.effects`); ``continuations``: which user messages do not start a new episode
    (:mod:`proxy.core.episodes`); all for guards with ``progress_aware``. ``stop_note``: the enforced stop's
    note on harness replies (:func:`proxy.guards.stop_note.stop_note_for`; last: it reads every
    other guard's withheld results). ``style``: ``recovery.reminders``, how the texts about a looping
    call speak of it (:mod:`proxy.guards.wording`)."""
    turn = cfg.turn_guard
    inject = cfg.repeat_reminder.inject_as
    targets = TargetRule(overrides=turn.targets)
    situations = Situations(
        masks,
        effects or EffectRule(),
        FailureRule(turn.failure_patterns),
        RejectionRule(cfg.repeated_failure.rejection_patterns),
        continuations or ContinuationRule(),
    )
    registry: list[tuple[bool, Callable[[], Guard]]] = [
        (cfg.repeat_reminder.enabled, lambda: RepeatReminder(cfg.repeat_reminder, situations, style)),
        (cfg.circuit_breaker.enabled, lambda: CircuitBreaker(cfg.circuit_breaker, situations, style)),
        (turn.enabled, lambda: TurnGuard(turn, situations, style)),
        (turn.enabled and turn.narrate_after_ms > 0, lambda: Narration(turn)),
        # beyond exact repeats, DESIGN §6.5 (reminders use repeat_reminder's inject_as; targets and
        # failures as turn_guard defines them)
        (
            cfg.recurrence.enabled,
            lambda: Recurrence(
                cfg.recurrence, inject, situations, leave_runs=cfg.repeat_reminder.enabled, style=style
            ),
        ),
        (cfg.cycles.enabled, lambda: Cycles(cfg.cycles, inject, situations, targets, style)),
        (
            cfg.repeated_failure.enabled,
            lambda: RepeatedFailure(
                cfg.repeated_failure, inject, targets, turn.failure_patterns, situations, style
            ),
        ),
        (cfg.monologue.enabled, lambda: Monologue(cfg.monologue, inject, situations)),
        (cfg.echo_loop.enabled, lambda: EchoLoop(cfg.echo_loop, inject, situations, style)),
        (
            cfg.same_target.enabled,
            lambda: SameTarget(
                cfg.same_target, inject, targets, situations, cfg.repeat_reminder.ignore_args, style
            ),
        ),
        (cfg.waiting.enabled, lambda: Waiting(cfg.waiting, inject, situations)),
        # escalation last, because it reads the reminders of every guard before it
        (cfg.escalation.enabled, lambda: Escalation(cfg.escalation, targets, situations, style)),
    ]
    guards = tuple(make() for enabled, make in registry if enabled)
    # the note only speaks of withheld results: without a guard that withholds it has nothing
    withholding = any(getattr(g, "withholds", True) for g in guards)
    return (*guards, stop_note) if stop_note is not None and withholding else guards


def evaluate(
    transcript: Transcript, guards: Sequence[Guard], ctx: Context, observed: AbstractSet[str] = frozenset()
) -> list[Action]:
    """Run every guard over ``transcript``; their actions concatenated in registry order. A guard
    with ``reads_prior = True`` gets ``ctx.prior`` plus the actions of the guards before it.

    ``observed``: the rule names in observe mode. A guard that reads prior actions
    and is itself enforced reads only the applied ones (those of rules not in ``observed``): an
    enforced escalation never counts reminders the model was not given, so what it says is true.
    An observed one reads them all: it reports what enforcing every rule would do. Marking the
    returned actions ``observed`` is the caller's (:func:`proxy.core.actions.mark_observed`)."""
    actions: list[Action] = []
    for guard in guards:
        actions.extend(guard(transcript, context_for(guard, ctx, actions, observed)))
    return actions
