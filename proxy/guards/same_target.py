"""same_target: the same tool on the same target, again and again, with arguments
that change but a result that does not — advisory (the escalation ladder acts on it).

Exact repeats are ``repeat_reminder``'s; this rule sees the loops whose arguments drift (a small
model's HTML-escaping noise, reminder text echoed into an argument, a flag toggled back and
forth), which no exact-match rule sees as repeats.

Rules, per episode (a turn that only a new request starts, :mod:`proxy.core.episodes`):
- What a call is on: its tool (with a multiplexed tool's subcommand) and target
  (:func:`proxy.core.targets.call_on`). Calls without a target are not looked at: a tool whose every
  answer is the same acknowledgement (a ``think`` tool's "Your thought has been logged.", a todo
  list's "Todos updated") is not looping when its arguments change.
- A run is consecutive calls on one tool and target where each call got the same result as the
  one before (masked, :mod:`proxy.core.progress`), or the same failure (the same failure shape of an
  agent's tool, :func:`proxy.core.agents.failure_shape`: a Claude Code edit whose old text is missing
  echoes that text, so every error differs), and nothing in between changed the situation
  (:mod:`proxy.core.effects`). A call on anything else, a new result, or a change ends it. A
  cancelled call (:func:`proxy.core.failures.cancelled`: it never ran, its sibling failed) neither
  goes on nor ends a run: nine edits cancelled together are not nine edits with one result.
- A successful edit with a new change (:class:`proxy.core.effects.EditLedger`: not the same edit again,
  not one undoing an earlier edit) is progress, even when its result is a constant success line
  ("The file … has been updated successfully."): it starts a new run, at 1.
- A search that found nothing (:func:`proxy.core.agents.found_nothing`: ``grep``/``glob`` answering
  "No files found") is on nothing: it ends a run and starts none. Searching with one pattern after
  another that each find nothing is exploration, not a loop (an exact repeat of one such search
  is still ``repeat_reminder``'s).
- A reminder fires when the run's length equals one of ``thresholds`` (3, 5, 8) and the run is
  not all one call (its arguments differ at least once, compared as ``repeat_reminder`` compares
  them: without its ``ignore_args``; identical runs are left to it, so a run whose calls differ
  only in a ``description`` never gets both reminders, which would contradict each other: found by
  a new user's Claude Code tryout). A result not known yet (the response side's
  look-ahead) is judged by the previous pair.
- The reminder goes after the step, so it is decided at the step's last call: a threshold reached
  earlier in the step (parallel calls) is reminded about then, with the run's length and last
  arguments at that call, if the run is still going; a run that ended inside the step is not
  reminded about (what the reminder would say is no longer true of the calls before it).
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.config import SameTargetConfig
from proxy.core import agents
from proxy.core.actions import Action, Delivery
from proxy.core.canonical import canonical_arguments
from proxy.core.effects import EditLedger, EpochCounter, Situations
from proxy.core.episodes import EpisodeCounter
from proxy.core.failures import cancelled
from proxy.core.memo import Memo
from proxy.core.progress import same_result
from proxy.core.targets import TargetRule, call_on
from proxy.core.transcript import ToolCall, Transcript
from proxy.core.waits import is_wait
from proxy.guards.repeat_reminder import preview
from proxy.guards.resume import unread
from proxy.guards.turns import call_memo, known, memoized, remind_after_step
from proxy.guards.wording import QUOTE, Style, speak

RULE = "same_target"
PREVIEW_CHARS = 300

TEXT = (
    "[loopguard] You called {subject} {count} times in a row, with different arguments each "
    "time, and it returned the same result each time.\n"
    "- tool: {tool}\n"
    "- last arguments: {arguments}\n"
    "Changing the arguments this way does not change the result. Use the result you already "
    "have, do something different, or tell the user what is blocking you."
)
#: The text for a run of the same failure whose echoed arguments differ.
FAILED_TEXT = (
    "[loopguard] You called {subject} {count} times in a row, with different arguments each "
    "time, and it failed the same way each time:\n"
    "  {error}\n"
    "- tool: {tool}\n"
    "- last arguments: {arguments}\n"
    "Changing the arguments this way does not fix it. Read the error and check its cause first "
    "(for an edit: read the file again, as it is now), do something different, or tell the user "
    "what is blocking you."
)
#: ``recovery.reminders: plain | redirect`` (:mod:`proxy.guards.wording`): no tool, target,
#: arguments or error quoted (a failure shape may echo the arguments).
PLAIN_TEXT = (
    "[loopguard] You have made {count} calls in a row on the same tool and target, with arguments "
    "that changed, and they returned the same result each time. Changing the arguments this way "
    "does not change the result."
)
PLAIN_FAILED_TEXT = (
    "[loopguard] You have made {count} calls in a row on the same tool and target, with arguments "
    "that changed, and they failed the same way each time. Changing the arguments this way does "
    "not fix it."
)
#: plain's closing lines, for a run of the same result and of the same failure (redirect closes
#: with :func:`proxy.guards.wording.instead`)
PLAIN_CLOSE = (
    "Use the result you already have, do something different, or tell the user what is blocking you."
)
PLAIN_FAILED_CLOSE = (
    "Read the error and check its cause first (for an edit: read the file again, as it is now), do "
    "something different, or tell the user what is blocking you."
)


class SameTarget:
    """Guard callable: ``SameTarget(cfg)(transcript, ctx) -> list[Remind]``."""

    __slots__ = ("_cfg", "_delivery", "_ignore", "_memo", "_situations", "_style", "_targets", "_thresholds")

    name = RULE
    #: only reminds: the response-side stop check need not ask it (proxy.response.decide.StopJudge)
    withholds = False

    def __init__(
        self,
        cfg: SameTargetConfig,
        delivery: Delivery = "user",
        targets: TargetRule | None = None,
        situations: Situations | None = None,
        ignore_args: Sequence[str] = (),
        style: Style = QUOTE,
    ) -> None:
        self._cfg = cfg
        self._style = style
        self._ignore = frozenset(ignore_args)  # repeat_reminder's: what "the same call" means
        self._delivery = delivery
        self._targets = targets or TargetRule()
        self._situations = situations or Situations()
        self._thresholds = frozenset(cfg.thresholds)
        self._memo: Memo[tuple[str, str], tuple[str, str | None]] = call_memo()

    def begin(self) -> SameTargetState:
        """The state before any call (:mod:`proxy.guards.resume`)."""
        situations = self._situations
        return SameTargetState(
            situations.epoch_counter(), situations.episode_counter(), situations.edit_ledger()
        )

    def __call__(self, transcript: Transcript, ctx: object = None) -> list[Action]:
        return self.advance(self.begin(), transcript, ctx, transcript.message_count)

    def advance(self, state: SameTargetState, transcript: Transcript, ctx: object, upto: int) -> list[Action]:
        """Read the calls before message position ``upto`` that ``state`` has not read
        (:mod:`proxy.guards.resume`); the reminders decided for them."""
        masks = self._situations.masks
        actions: list[Action] = []
        calls = transcript.calls
        s = state
        for call in unread(s, calls, upto):
            s.epochs.add(call)
            if is_wait(call):  # waiting is not looping (proxy.core.waits); it changed the situation
                continue
            turn = s.episodes.of(transcript, call.position)
            if turn != s.turn:  # a new episode: no run goes on across it
                s.turn = turn
                s.run, s.varied, s.prev, s.prev_on, s.prev_same, s.due = 0, False, None, None, False, 0
                s.edits = self._situations.edit_ledger()
            if cancelled(call.result):
                continue
            on = memoized(
                self._memo, call, lambda c: call_on(self._targets, c.name, c.arguments, c.arguments_raw)
            )
            if on[1] is None or (known(call.result) and self._found_nothing(call)):
                s.run, s.varied, s.prev, s.prev_on, s.prev_same, s.due = 0, False, None, None, False, 0
                continue
            prev = calls[s.prev] if s.prev is not None else None
            same = False
            shape = None
            if s.edits.progress(call, on):  # the file changed: progress, a new run
                prev = None
            elif prev is not None and on == s.prev_on and s.epochs.unchanged(prev.seq, call.seq):
                if known(call.result) and known(prev.result):
                    assert call.result is not None and prev.result is not None
                    same = same_result(prev.result, call.result, masks)
                    if not same:
                        shape = agents.same_failure(
                            call.name, prev.result.text, call.result.text, arguments=call.arguments
                        )
                        same = shape is not None
                elif not known(call.result):
                    same, shape = s.prev_same, s.shape
            if same and prev is not None:
                s.run += 1
                s.varied = s.varied or self._same_call(call) != self._same_call(prev)
                s.shape = shape or s.shape
            else:
                s.run, s.varied, s.shape, s.due = 1, False, None, 0
            s.prev, s.prev_on, s.prev_same = call.seq, on, same
            run = s.run
            if run in self._thresholds and s.varied:
                s.due = run  # the threshold reached, reminded about at the step's last call
            if not s.due or call.seq != transcript.steps[call.step].calls[-1]:
                continue
            limit, s.due = s.due, 0
            if self._style != QUOTE:
                plain, close = (
                    (PLAIN_TEXT, PLAIN_CLOSE) if s.shape is None else (PLAIN_FAILED_TEXT, PLAIN_FAILED_CLOSE)
                )
                text = speak(self._style, plain.format(count=run), transcript, call, close)
            else:
                tool, target = on
                subject = f"{tool} on {preview(target, 120)}" if target and target != tool else tool
                text = (TEXT if s.shape is None else FAILED_TEXT).format(
                    subject=subject,
                    count=run,
                    tool=call.name,
                    arguments=preview(_args(call), PREVIEW_CHARS),
                    error=preview(s.shape or "", PREVIEW_CHARS),
                )
            action = remind_after_step(transcript, call, text, RULE, run, limit, self._delivery)
            if action is not None:
                actions.append(action)
        return actions

    def _found_nothing(self, call: ToolCall) -> bool:
        """``call`` (its result known) is a search that found nothing."""
        assert call.result is not None
        return agents.found_nothing(call.name, call.arguments, call.result.text)

    def _same_call(self, call: ToolCall) -> str:
        return canonical_arguments(call.arguments, call.arguments_raw, self._ignore)


def _args(call: ToolCall) -> str:
    return canonical_arguments(call.arguments, call.arguments_raw)


class SameTargetState:
    """What :class:`SameTarget` has read: the next call (``next``, a ``seq``), the situation and
    episode counters, the current episode (``turn``), its edits (``edits``) and its run: its
    length (``run``), whether its arguments differed (``varied``), the failure shape its results
    shared when they were not all the same (``shape``), its last call (``prev``, a ``seq``; None
    after a call without a target), what that call was on (``prev_on``), whether it continued
    the run (``prev_same``) and the threshold it reached that is still to be reminded about at the
    end of the step (``due``, 0: none). Mutable; :meth:`copy` is independent."""

    __slots__ = (
        "due",
        "edits",
        "episodes",
        "epochs",
        "next",
        "prev",
        "prev_on",
        "prev_same",
        "run",
        "shape",
        "turn",
        "varied",
    )

    def __init__(self, epochs: EpochCounter, episodes: EpisodeCounter, edits: EditLedger) -> None:
        self.epochs = epochs
        self.episodes = episodes
        self.edits = edits
        self.shape: str | None = None
        self.next = 0
        self.turn = -1
        self.run = 0
        self.varied = False
        self.prev: int | None = None
        self.prev_on: tuple[str, str | None] | None = None
        self.prev_same = False
        self.due = 0

    def copy(self) -> SameTargetState:
        out = SameTargetState(self.epochs.copy(), self.episodes.copy(), self.edits.copy())
        out.next, out.turn, out.run, out.varied = self.next, self.turn, self.run, self.varied
        out.shape, out.due = self.shape, self.due
        out.prev, out.prev_on, out.prev_same = self.prev, self.prev_on, self.prev_same
        return out
