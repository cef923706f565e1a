"""repeat_reminder: advisory reminders on a chain of identical tool calls (DESIGN §6.1).

Seeds: dsh-repeat-tool-guard and dsh-repeat-tool-reminder (thresholds 3/5/8).

Rules:
- Tracked calls: all tools when ``include`` is empty, else those matching ``include``; then
  ``exclude`` removes. Untracked calls are transparent (neither count nor reset the chain).
- The chain counts consecutive tracked calls with the same canonical key (DESIGN §5, with
  ``ignore_args`` dropped); a different key restarts it at 1; a user message resets it — with
  ``progress_aware``, only a new request does (:mod:`proxy.core.episodes`: the same call
  with the same result after "continue" or a compaction summary goes on with the chain).
- ``progress_aware``: a call with the same key continues the chain only when its result
  equals the previous call's after masking volatile spans (:mod:`proxy.core.progress`); a new result is
  progress and restarts the chain at 1, and so does a call after another (untracked) call that
  changed the situation (:mod:`proxy.core.effects`). A call whose result has not arrived is judged by
  the previous pair.
  Parallel calls in one step count in listed order.
- A reminder fires when the count *equals* a threshold. The lowest threshold gives a short generic
  nudge; higher ones a detailed reminder with ``- tool:``, ``- consecutive_calls:`` and
  ``- arguments:`` lines. After the highest threshold the chain is silent until it breaks.
- The reminder goes right after the tool results of the step that reached the threshold; a step
  whose results have not arrived gets none yet.
"""

from __future__ import annotations

from proxy.config import RepeatReminderConfig
from proxy.core.actions import Action, Remind
from proxy.core.canonical import canonical_arguments
from proxy.core.effects import EpochCounter, Situations
from proxy.core.episodes import EpisodeCounter
from proxy.core.patterns import NamePatterns
from proxy.core.progress import RepeatJudge
from proxy.core.transcript import Transcript
from proxy.core.waits import is_wait
from proxy.guards.resume import unread
from proxy.guards.wording import QUOTE, Style, speak

RULE = "repeat_reminder"

GENTLE_TEXT = (
    "[loopguard] You have made the same tool call several times in a row. Before calling it "
    "again, re-read its last result: if it did not give you what you need, change your approach "
    "or your arguments instead of repeating the call."
)

DETAILED_TEXT = (
    "[loopguard] You are repeating the same tool call without making progress.\n"
    "- tool: {tool}\n"
    "- consecutive_calls: {count}\n"
    "- arguments: {arguments}\n"
    "Do not call this tool with these exact arguments again. Use the results you already have, "
    "try a different approach, or tell the user what is blocking you."
)
#: ``recovery.reminders: plain | redirect`` (:mod:`proxy.guards.wording`): neither the tool nor the
#: arguments; "the same result" only where the chain required it (``progress_aware``).
PLAIN_TEXT = "[loopguard] You have made the same tool call {count} times in a row{same}."
SAME_RESULT = ", and it returned the same result each time"


def preview(text: str, limit: int) -> str:
    """The first ``limit`` characters of ``text``, then ``… (+N more chars)`` if anything was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… (+{len(text) - limit} more chars)"


class RepeatReminder:
    """Guard callable: ``RepeatReminder(cfg)(transcript, ctx) -> list[Remind]``."""

    __slots__ = ("_cfg", "_exclude", "_ignore", "_include", "_situations", "_style", "_thresholds")

    name = RULE
    #: only reminds: the response-side stop check need not ask it (proxy.response.decide.StopJudge)
    withholds = False

    def __init__(
        self, cfg: RepeatReminderConfig, situations: Situations | None = None, style: Style = QUOTE
    ) -> None:
        self._cfg = cfg
        self._style = style
        self._situations = situations or Situations()
        self._include = NamePatterns(cfg.include)
        self._exclude = NamePatterns(cfg.exclude)
        self._ignore = frozenset(cfg.ignore_args)
        self._thresholds = frozenset(cfg.thresholds)

    def tracked(self, name: str) -> bool:
        if self._include and not self._include.matches(name):
            return False
        return not self._exclude.matches(name)

    def begin(self) -> RepeatState:
        """The state before any call (:mod:`proxy.guards.resume`)."""
        epochs = self._situations.epoch_counter() if self._cfg.progress_aware else None
        judge = RepeatJudge(self._situations.masks, epochs) if epochs is not None else None
        episodes = self._situations.episode_counter() if self._cfg.progress_aware else None
        return RepeatState(judge, epochs, episodes)

    def __call__(self, transcript: Transcript, ctx: object = None) -> list[Action]:
        return self.advance(self.begin(), transcript, ctx, transcript.message_count)

    def advance(self, state: RepeatState, transcript: Transcript, ctx: object, upto: int) -> list[Action]:
        """Read the calls before message position ``upto`` that ``state`` has not read
        (:mod:`proxy.guards.resume`); the reminders decided for them."""
        cfg = self._cfg
        lowest = cfg.thresholds[0]
        actions: list[Action] = []
        calls = transcript.calls
        s = state
        for call in unread(s, calls, upto):
            if not self.tracked(call.name):  # untracked: transparent, they change no situation either
                continue
            if is_wait(call):  # waiting is not looping (proxy.core.waits): transparent to the chain,
                if s.judge is not None and s.epochs is not None:  # but time passed
                    s.epochs.add(call)
                    s.index += 1
                continue
            key = (call.name, canonical_arguments(call.arguments, call.arguments_raw, self._ignore))
            progress = False
            if s.judge is not None and s.epochs is not None:
                s.epochs.add(call)
                progress = not s.judge.repeats(key, call.result, s.index)
            s.index += 1
            # progress-aware chains go on across a continuation ("continue", a compaction summary)
            turn = call.turn if s.episodes is None else s.episodes.of(transcript, call.position)
            if turn != s.prev_turn or key != s.prev_key or progress:
                s.count = 0
            s.count += 1
            s.prev_key, s.prev_turn = key, turn
            if s.count not in self._thresholds:
                continue
            end = transcript.steps[call.step].end
            if end is None:
                continue
            count = s.count
            if self._style != QUOTE:
                same = SAME_RESULT if cfg.progress_aware else ""
                text = speak(self._style, PLAIN_TEXT.format(count=count, same=same), transcript, call)
            elif count == lowest:
                text = GENTLE_TEXT
            else:
                text = DETAILED_TEXT.format(
                    tool=call.name,
                    count=count,
                    arguments=preview(key[1], cfg.arguments_preview_chars),
                )
            actions.append(
                Remind(
                    after=end,
                    text=text,
                    rule=RULE,
                    tool=call.name,
                    count=count,
                    limit=count,
                    fresh=transcript.is_fresh(call.step),
                    delivery=cfg.inject_as,
                    call=call.seq,
                )
            )
        return actions


class RepeatState:
    """What :class:`RepeatReminder` has read: the next call (``seq``), the tracked calls read
    (``index``), the chain (``prev_key``, ``prev_turn``, ``count``) and, progress-aware, the
    judge with its situation counter and the episode counter. Mutable; :meth:`copy` is
    independent."""

    __slots__ = ("count", "episodes", "epochs", "index", "judge", "next", "prev_key", "prev_turn")

    def __init__(
        self, judge: RepeatJudge | None, epochs: EpochCounter | None, episodes: EpisodeCounter | None
    ) -> None:
        self.judge = judge
        self.epochs = epochs
        self.episodes = episodes
        self.next = 0
        self.index = 0
        self.prev_key: tuple[str, str] | None = None
        self.prev_turn = -1
        self.count = 0

    def copy(self) -> RepeatState:
        epochs = self.epochs.copy() if self.epochs is not None else None
        judge = self.judge.copy(epochs) if self.judge is not None else None
        out = RepeatState(judge, epochs, self.episodes.copy() if self.episodes is not None else None)
        out.next, out.index, out.count = self.next, self.index, self.count
        out.prev_key, out.prev_turn = self.prev_key, self.prev_turn
        return out
