"""monologue (R6, issue 7): the model saying the same thing over and over — reminder, then the
response side stops the turn.

Rules (over the user and assistant messages of the whole conversation, in order; user messages
do not reset, because harnesses answer a reply they dislike with a user message):
- Never in a conversation without tool calls (issue 10, defect 3): plain chat where a user types
  "continue" for the next chapter is not a loop.
- **Same text**: an assistant message's text, whitespace-normalized (runs of whitespace → one
  space, trimmed), equal to the text of the previous assistant message, *and nothing new came
  back in between*: both messages are text-only, or both called the same tools (in order; the
  arguments may differ) and got the same results (masked, :mod:`proxy.progress`). The same
  narration while paging through a file (``scroll_down``, each page new) is progress, not a
  repeat. An assistant message without text breaks the run. When the run reaches ``repeats`` (3)
  messages, a reminder fires.
- **Same answer**: text-only assistant replies (no tool calls) each answered by a user message
  with the same normalized text (a harness error such as "You did not use a tool"); the run
  counts such pairs in a row, and fires at ``repeats``.
- Placement: a message with tool calls gets the reminder after its step's results (``inject_as``
  as in §6.1). A text-only reply has no tool result: its reminder is appended to the message
  that answered it (the harness's user message), never inserted, so roles keep alternating; a
  reply nothing answered yet gets none. Fresh when that message is the request's last.
- Stop (:meth:`Monologue.stop_count`, :meth:`Monologue.answer_run`, read by
  :class:`proxy.response.decide.StopJudge`): a response whose text (and calls) would make the same-text
  run ``stop_at`` (4) long, or a text-only response after ``stop_at - 1`` text-only replies that
  each got the same answer, ends the turn (:meth:`Monologue.stop_possible` says when to look). A
  response's calls, whose results are not known yet, continue the run when they call the same
  tools as the last message.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from proxy.actions import Action, Delivery, Remind
from proxy.effects import Situations
from proxy.guards.repeat_reminder import preview
from proxy.guards.turns import known
from proxy.ops.config import MonologueConfig
from proxy.progress import same_result
from proxy.transcript import Said, Step, Transcript

RULE = "monologue"
TEXT_PREVIEW_CHARS = 200

SAME_TEXT = (
    "[loopguard] Your last {count} messages said exactly the same thing:\n"
    '  "{text}"\n'
    "Repeating it does not move the task forward. Look at what happened since you first wrote "
    "it and do something different, or tell the user plainly where you are stuck."
)
SAME_ANSWER = (
    "[loopguard] Your last {count} replies got the same answer each time:\n"
    '  "{text}"\n'
    "Replying the same way will get the same answer. Do what it asks, or say in one message "
    "what you cannot do and why."
)

_SPACE = re.compile(r"\s+")


@functools.lru_cache(maxsize=4096)
def normalize(text: str) -> str:
    """``text`` with runs of whitespace made one space, trimmed (memoized: a conversation's old
    messages come back on every request)."""
    return _SPACE.sub(" ", text).strip()


class Monologue:
    """Guard callable: ``Monologue(cfg)(transcript, ctx) -> list[Remind]``."""

    __slots__ = ("_cfg", "_delivery", "_last", "_situations")

    name = RULE
    #: only reminds: the response-side stop check need not ask it (proxy.response.decide.StopJudge)
    withholds = False

    def __init__(
        self, cfg: MonologueConfig, delivery: Delivery = "user", situations: Situations | None = None
    ) -> None:
        self._cfg = cfg
        self._delivery = delivery
        self._situations = situations or Situations()
        self._last: tuple[object, object, list[int]] | None = None

    @property
    def config(self) -> MonologueConfig:
        return self._cfg

    def _tools_of(self, transcript: Transcript, msg: Said) -> tuple[str, ...]:
        """The tools assistant message ``msg`` called, in order (empty for a text-only one)."""
        if not msg.has_calls:
            return ()
        step = _steps_by_position(transcript).get(msg.position)
        if step is None:
            return ()
        return tuple(transcript.calls[i].name for i in step.calls)

    def _same_step(self, transcript: Transcript, a: Said, b: Said) -> bool:
        """Nothing new came back between assistant messages ``a`` and ``b`` (see the rules)."""
        if a.has_calls != b.has_calls:
            return False
        if not a.has_calls:
            return True
        steps = _steps_by_position(transcript)
        sa, sb = steps.get(a.position), steps.get(b.position)
        if sa is None or sb is None or len(sa.calls) != len(sb.calls):
            return False
        masks = self._situations.masks
        for i, j in zip(sa.calls, sb.calls, strict=True):
            x, y = transcript.calls[i], transcript.calls[j]
            if x.name != y.name:
                return False
            if known(y.result) and not same_result(x.result, y.result, masks):
                return False
        return True

    def _runs(self, transcript: Transcript) -> list[int]:
        """Per assistant message of ``transcript.said`` (in order), the length of its same-text run.
        Remembered for the last transcript asked about (the rule, its stop check and the stop
        count of one request ask for the same one)."""
        if self._last is not None and self._last[0] is transcript.said and self._last[1] is transcript.steps:
            return self._last[2]
        runs = self._compute_runs(transcript)
        self._last = (transcript.said, transcript.steps, runs)
        return runs

    def _compute_runs(self, transcript: Transcript) -> list[int]:
        runs: list[int] = []
        last: Said | None = None
        last_text = ""
        for msg in transcript.said:
            if msg.role != "assistant":
                continue
            text = normalize(msg.text)
            if text and last is not None and text == last_text and self._same_step(transcript, last, msg):
                runs.append(runs[-1] + 1)
            else:
                runs.append(1 if text else 0)
            last, last_text = msg, text
        return runs

    def __call__(self, transcript: Transcript, ctx: object = None) -> list[Action]:
        if not transcript.calls:
            return []
        said = transcript.said
        step_at = _steps_by_position(transcript)
        runs = iter(self._runs(transcript))
        actions: list[Action] = []
        answer_run, last_answer = 0, ""
        for k, msg in enumerate(said):
            if msg.role != "assistant":
                continue
            text = normalize(msg.text)
            text_run = next(runs)
            answer = _answer(said, k, transcript.message_count)
            if answer is not None:
                a_text = normalize(answer.text)
                answer_run = answer_run + 1 if a_text and a_text == last_answer else (1 if a_text else 0)
                last_answer = a_text
            else:
                answer_run, last_answer = 0, ""
            if text_run == self._cfg.repeats:
                body = SAME_TEXT.format(count=text_run, text=preview(text, TEXT_PREVIEW_CHARS))
                count = text_run
            elif answer_run == self._cfg.repeats and answer is not None:
                body = SAME_ANSWER.format(count=answer_run, text=preview(last_answer, TEXT_PREVIEW_CHARS))
                count = answer_run
            else:
                continue
            if msg.has_calls:
                step = step_at.get(msg.position)
                if step is None or step.end is None:
                    continue
                after, fresh, delivery = step.end, transcript.is_fresh(step.index), self._delivery
            elif answer is not None:
                after, fresh, delivery = (
                    answer.position,
                    answer.position == transcript.message_count - 1,
                    "tool_suffix",
                )
            else:
                continue
            actions.append(Remind(after, body, RULE, "", count, self._cfg.repeats, fresh, delivery))
        return actions

    def stop_possible(self, transcript: Transcript) -> bool:
        """True when one more assistant message repeating the last one, or one more text-only
        reply after the same answer, would reach ``stop_at``."""
        stop_at = self._cfg.stop_at
        if not stop_at or not transcript.calls:
            return False
        if self.answer_run(transcript) + 1 >= stop_at:
            return True
        runs = self._runs(transcript)
        return bool(runs) and runs[-1] + 1 >= stop_at

    def answer_run(self, transcript: Transcript) -> int:
        """How many text-only replies in a row, each answered by the same user message, end the
        conversation (the *same answer* run); 0 in a conversation without tool calls."""
        if not transcript.calls:
            return 0
        said = transcript.said
        run, answer, k = 0, "", len(said) - 1
        while k >= 1:
            reply, ans = said[k - 1], said[k]
            if ans.role != "user" or reply.role != "assistant" or reply.has_calls:
                break
            if ans.position != reply.position + 1:
                break
            text = normalize(ans.text)
            if not text or (run and text != answer):
                break
            run, answer, k = run + 1, text, k - 2
        return run

    def stop_count(self, transcript: Transcript, text: str, tools: Sequence[str] = ()) -> int:
        """How long the same-text run would be with one more assistant message saying ``text``
        and calling ``tools`` (names, in order); 0 when ``text`` is blank or the conversation has
        no tool calls."""
        text = normalize(text)
        if not text or not transcript.calls:
            return 0
        last = next((m for m in reversed(transcript.said) if m.role == "assistant"), None)
        if last is None or normalize(last.text) != text:
            return 1
        if tuple(tools) != self._tools_of(transcript, last):
            return 1
        return self._runs(transcript)[-1] + 1


_step_maps: list[tuple[object, dict[int, Step]]] = []


def _steps_by_position(transcript: Transcript) -> dict[int, Step]:
    """The transcript's steps by the position of their assistant message (the last one built is
    kept: every message of one request looks its step up)."""
    if _step_maps and _step_maps[0][0] is transcript.steps:
        return _step_maps[0][1]
    found = {s.position: s for s in transcript.steps}
    _step_maps[:] = [(transcript.steps, found)]
    return found


def _answer(said: Sequence[Said], k: int, message_count: int) -> Said | None:
    """The user message right after text-only assistant message ``said[k]``, if any."""
    msg = said[k]
    if msg.has_calls or k + 1 >= len(said):
        return None
    nxt = said[k + 1]
    if nxt.role != "user" or nxt.position != msg.position + 1:
        return None
    return nxt
