"""recurrence (DESIGN §6.5): the same call recurring within a window of a turn — advisory.

Rules:
- Per turn (calls after a user message), calls are keyed by tool and canonical arguments
  (DESIGN §5, ``ignore_args`` dropped). With ``progress_aware`` a call counts as a *recurrence*
  of its key only when its result equals the previous identical call's result after masking
  volatile spans (:mod:`proxy.core.progress`) and nothing between them changed the situation
  (:mod:`proxy.core.effects`: an edit, a ``cp``, a script run); a new result or a change in between
  restarts the key's count (polling a job whose status changes, re-reading a file after editing
  it). Without it, every identical call counts.
- A reminder fires after the step of the call that makes ``occurrences`` (3) counted calls of
  one key among the last ``window`` (20) calls of the turn, once per crossing. While
  ``repeat_reminder`` is on (``leave_runs``), occurrences that are all consecutive calls are left
  to it (no double reminder).
- The reminder names the tool, the arguments (preview), how often and over how many calls.
"""

from __future__ import annotations

from proxy.config import RecurrenceConfig
from proxy.core.actions import Action, Delivery
from proxy.core.canonical import canonical_arguments
from proxy.core.effects import EpochCounter, Situations
from proxy.core.episodes import EpisodeCounter
from proxy.core.progress import RepeatJudge
from proxy.core.transcript import Transcript
from proxy.core.waits import is_wait
from proxy.guards.repeat_reminder import preview
from proxy.guards.resume import unread
from proxy.guards.turns import remind_after_step
from proxy.guards.wording import QUOTE, Style, speak

RULE = "recurrence"
PREVIEW_CHARS = 300

TEXT = (
    "[loopguard] You keep coming back to the same tool call: {tool} with the same arguments, "
    "{count} times in your last {span} calls, and it returned the same result each time.\n"
    "- tool: {tool}\n"
    "- arguments: {arguments}\n"
    "Calling it again will not tell you anything new. Use the result you already have, or do "
    "something different."
)
#: ``recovery.reminders: plain | redirect`` (:mod:`proxy.guards.wording`): neither the tool nor the
#: arguments; "the same result" only where the rule required it (``progress_aware``).
PLAIN_TEXT = (
    "[loopguard] You keep coming back to the same tool call: {count} times in your last {span} "
    "calls{same}. Calling it again will not tell you anything new."
)
PLAIN_CLOSE = "Use the result you already have, or do something different."
SAME_RESULT = ", and it returned the same result each time"


class Recurrence:
    """Guard callable: ``Recurrence(cfg)(transcript, ctx) -> list[Remind]``."""

    __slots__ = ("_cfg", "_delivery", "_ignore", "_leave_runs", "_situations", "_style")

    name = RULE
    #: only reminds: the response-side stop check need not ask it (proxy.response.decide.StopJudge)
    withholds = False

    def __init__(
        self,
        cfg: RecurrenceConfig,
        delivery: Delivery = "user",
        situations: Situations | None = None,
        leave_runs: bool = True,
        style: Style = QUOTE,
    ) -> None:
        self._cfg = cfg
        self._style = style
        self._leave_runs = leave_runs
        self._delivery = delivery
        self._ignore = frozenset(cfg.ignore_args)
        self._situations = situations or Situations()

    def begin(self) -> RecurrenceState:
        """The state before any call (:mod:`proxy.guards.resume`)."""
        aware = self._cfg.progress_aware
        epochs = self._situations.epoch_counter() if aware else None
        episodes = self._situations.episode_counter() if aware else None
        return RecurrenceState(epochs, episodes)

    def __call__(self, transcript: Transcript, ctx: object = None) -> list[Action]:
        return self.advance(self.begin(), transcript, ctx, transcript.message_count)

    def advance(self, state: RecurrenceState, transcript: Transcript, ctx: object, upto: int) -> list[Action]:
        """Read the calls before message position ``upto`` that ``state`` has not read
        (:mod:`proxy.guards.resume`); the reminders decided for them."""
        cfg = self._cfg
        actions: list[Action] = []
        calls = transcript.calls
        s = state
        for call in unread(s, calls, upto):
            if s.epochs is not None:
                s.epochs.add(call)
            if is_wait(call):  # waiting is not looping (proxy.core.waits)
                continue
            # the turn (progress-aware: the episode, a continuation does not split it)
            group = call.turn if s.episodes is None else s.episodes.of(transcript, call.position)
            if group != s.group:
                s.group, s.index, s.hits = group, 0, {}
                s.judge = RepeatJudge(self._situations.masks, s.epochs) if s.epochs is not None else None
            i = s.index
            s.index += 1
            hits = s.hits
            key = (call.name, canonical_arguments(call.arguments, call.arguments_raw, self._ignore))
            seen = hits.get(key)
            repeat = s.judge.repeats(key, call.result, call.seq) if s.judge is not None else seen is not None
            if seen is None or not repeat:
                hits[key] = (i,)
                continue
            # a tuple per key: a copy of the state shares them
            seen = tuple(k for k in (*seen, i) if k > i - cfg.window)
            hits[key] = seen
            count = len(seen)
            if count != cfg.occurrences or (self._leave_runs and seen[-1] - seen[0] == count - 1):
                continue
            span = i - seen[0] + 1
            if self._style != QUOTE:
                same = SAME_RESULT if cfg.progress_aware else ""
                plain = PLAIN_TEXT.format(count=count, span=span, same=same)
                text = speak(self._style, plain, transcript, call, PLAIN_CLOSE)
            else:
                text = TEXT.format(
                    tool=call.name, count=count, span=span, arguments=preview(key[1], PREVIEW_CHARS)
                )
            action = remind_after_step(transcript, call, text, RULE, count, cfg.occurrences, self._delivery)
            if action is not None:
                actions.append(action)
        return actions


class RecurrenceState:
    """What :class:`Recurrence` has read: the next call (``next``, a ``seq``), the open turn
    (``group``: its turn or, progress-aware, episode number; ``index``: calls of it read;
    ``hits``: per key, the turn indexes of its counted calls still in the window; ``judge``: its
    :class:`~proxy.core.progress.RepeatJudge`) and, progress-aware, the situation counter of every call
    read and the episode counter. Mutable; :meth:`copy` is independent."""

    __slots__ = ("episodes", "epochs", "group", "hits", "index", "judge", "next")

    def __init__(self, epochs: EpochCounter | None, episodes: EpisodeCounter | None) -> None:
        self.epochs = epochs
        self.episodes = episodes
        self.next = 0
        self.group = -1
        self.index = 0
        self.hits: dict[tuple[str, str], tuple[int, ...]] = {}
        self.judge: RepeatJudge | None = None

    def copy(self) -> RecurrenceState:
        """An independent copy (``hits`` holds tuples: shared; the transcript never held)."""
        epochs = self.epochs.copy() if self.epochs is not None else None
        out = RecurrenceState(epochs, self.episodes.copy() if self.episodes is not None else None)
        out.next, out.group, out.index = self.next, self.group, self.index
        out.hits = dict(self.hits)
        out.judge = self.judge.copy(epochs) if self.judge is not None else None
        return out
