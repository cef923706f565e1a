"""repeat_reminder: advisory reminders on a chain of identical tool calls (DESIGN §6.1).

Seeds: dsh-repeat-tool-guard and dsh-repeat-tool-reminder (thresholds 3/5/8).

Rules:
- Tracked calls: all tools when ``include`` is empty, else those matching ``include``; then
  ``exclude`` removes. Untracked calls are transparent (neither count nor reset the chain).
- The chain counts consecutive tracked calls with the same canonical key (DESIGN §5, with
  ``ignore_args`` dropped); a different key restarts it at 1; a user message resets it — with
  ``progress_aware``, only a new request does (issue 10, :mod:`proxy.episodes`: the same call
  with the same result after "continue" or a compaction summary goes on with the chain).
- ``progress_aware`` (issue 7): a call with the same key continues the chain only when its result
  equals the previous call's after masking volatile spans (:mod:`proxy.progress`); a new result is
  progress and restarts the chain at 1, and so does a call after another (untracked) call that
  changed the situation (:mod:`proxy.effects`). A call whose result has not arrived is judged by
  the previous pair.
  Parallel calls in one step count in listed order.
- A reminder fires when the count *equals* a threshold. The lowest threshold gives a short generic
  nudge; higher ones a detailed reminder with ``- tool:``, ``- consecutive_calls:`` and
  ``- arguments:`` lines. After the highest threshold the chain is silent until it breaks.
- The reminder goes right after the tool results of the step that reached the threshold; a step
  whose results have not arrived gets none yet.
"""

from __future__ import annotations

from proxy.actions import Action, Remind
from proxy.canonical import canonical_arguments
from proxy.effects import Situations
from proxy.ops.config import RepeatReminderConfig
from proxy.patterns import NamePatterns
from proxy.progress import RepeatJudge
from proxy.transcript import Transcript

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


def preview(text: str, limit: int) -> str:
    """The first ``limit`` characters of ``text``, then ``… (+N more chars)`` if anything was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… (+{len(text) - limit} more chars)"


class RepeatReminder:
    """Guard callable: ``RepeatReminder(cfg)(transcript, ctx) -> list[Remind]``."""

    __slots__ = ("_cfg", "_exclude", "_ignore", "_include", "_situations", "_thresholds")

    name = RULE
    #: only reminds: the response-side stop check need not ask it (proxy.response.decide.StopJudge)
    withholds = False

    def __init__(self, cfg: RepeatReminderConfig, situations: Situations | None = None) -> None:
        self._cfg = cfg
        self._situations = situations or Situations()
        self._include = NamePatterns(cfg.include)
        self._exclude = NamePatterns(cfg.exclude)
        self._ignore = frozenset(cfg.ignore_args)
        self._thresholds = frozenset(cfg.thresholds)

    def tracked(self, name: str) -> bool:
        if self._include and not self._include.matches(name):
            return False
        return not self._exclude.matches(name)

    def __call__(self, transcript: Transcript, ctx: object = None) -> list[Action]:
        cfg = self._cfg
        lowest = cfg.thresholds[0]
        actions: list[Action] = []
        prev_key: tuple[str, str] | None = None
        prev_turn = -1
        count = 0
        judge = None
        tracked = [c for c in transcript.calls if self.tracked(c.name)]
        if len(tracked) == len(transcript.calls):
            tracked = transcript.calls  # the same object: the epochs of the request are reused
        if cfg.progress_aware:  # untracked calls are transparent: they change no situation either
            judge = RepeatJudge(self._situations.masks, self._situations.epochs(tracked))
        # progress-aware chains go on across a continuation ("continue", a compaction summary)
        group = self._situations.episodes(transcript) if cfg.progress_aware else None
        for index, call in enumerate(tracked):
            key = (call.name, canonical_arguments(call.arguments, call.arguments_raw, self._ignore))
            progress = judge is not None and not judge.repeats(key, call.result, index)
            turn = call.turn if group is None else group[call.seq]
            if turn != prev_turn or key != prev_key or progress:
                count = 0
            count += 1
            prev_key, prev_turn = key, turn
            if count not in self._thresholds:
                continue
            end = transcript.steps[call.step].end
            if end is None:
                continue
            if count == lowest:
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
