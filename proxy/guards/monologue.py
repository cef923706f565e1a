"""monologue (DESIGN §6.5): the model saying the same thing over and over — reminder, then the
response side stops the turn.

Rules (over the user and assistant messages of the whole conversation, in order; a user message
that continues the work does not reset, because harnesses answer a reply they dislike with a user
message, but a new request from the user does: :mod:`proxy.core.episodes`, the same
``progress.continuation_patterns`` and harness replies the other rules read):
- Never in a conversation without tool calls: plain chat where a user types
  "continue" for the next chapter is not a loop.
- **Same text**: an assistant message's text, whitespace-normalized (runs of whitespace → one
  space, trimmed), equal to the text of the previous assistant message, *and nothing new came
  back in between*: both messages are text-only, or both called the same tools (in order; the
  arguments may differ) and got the same results (masked, :mod:`proxy.core.progress`). The same
  narration while paging through a file (``scroll_down``, each page new) is progress, not a
  repeat. An assistant message without text breaks the run, and so does a new request between two
  messages (a model that answers "Committed." to three "commit and continue" prompts is doing what
  it was asked). When the run reaches ``repeats`` (3) messages, a reminder fires.
- **Same answer**: text-only assistant replies (no tool calls) each answered by a user message
  with the same normalized text that continues the work (a harness error such as "You did not use
  a tool", a "continue"); the run counts such pairs in a row, and fires at ``repeats``. A new
  request as the answer ends the run: a person who sends the same request again is not a harness.
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

import bisect
import re
from collections.abc import Sequence

from proxy.config import MonologueConfig
from proxy.core.actions import Action, Delivery, Remind
from proxy.core.effects import Situations
from proxy.core.episodes import ContinuationRule
from proxy.core.memo import ENTRY_BYTES, Memo
from proxy.core.progress import same_result
from proxy.core.transcript import Said, Step, Transcript
from proxy.guards.repeat_reminder import preview
from proxy.guards.turns import known

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


#: Bounds of :func:`normalize`'s memo: entries, and bytes (:data:`proxy.core.memo.ENTRY_BYTES`
#: plus the text twice: the key and its normalized copy).
NORMALIZE_ENTRIES = 4096
NORMALIZE_BYTES = 2 * 1024 * 1024
_normalized: Memo[str, str] = Memo(
    NORMALIZE_ENTRIES, NORMALIZE_BYTES, lambda text, value: ENTRY_BYTES + len(text) + len(value)
)


def normalize(text: str) -> str:
    """``text`` with runs of whitespace made one space, trimmed (memoized: a conversation's old
    messages come back on every request)."""
    found = _normalized.get(text)
    if found is None:
        found = _normalized.put(text, _SPACE.sub(" ", text).strip())
    return found


class Monologue:
    """Guard callable: ``Monologue(cfg)(transcript, ctx) -> list[Remind]``."""

    __slots__ = ("_cfg", "_continues", "_delivery", "_situations")

    name = RULE
    #: only reminds: the response-side stop check need not ask it (proxy.response.decide.StopJudge)
    withholds = False

    def __init__(
        self, cfg: MonologueConfig, delivery: Delivery = "user", situations: Situations | None = None
    ) -> None:
        self._cfg = cfg
        self._delivery = delivery
        self._situations = situations or Situations()
        self._continues: ContinuationRule = self._situations.continuations

    @property
    def config(self) -> MonologueConfig:
        return self._cfg

    def _new_request(self, msg: Said) -> bool:
        """``msg`` is a user message that asks for something new (not a continuation, not a
        harness's reply: :class:`proxy.core.episodes.ContinuationRule`)."""
        return msg.role == "user" and not self._continues(msg.text)

    def _prompt_between(self, said: Sequence[Said], j: int, k: int) -> bool:
        """A new request among ``said[j + 1 : k]``."""
        return any(self._new_request(said[i]) for i in range(j + 1, k))

    def _tools_of(self, transcript: Transcript, msg: Said) -> tuple[str, ...]:
        """The tools assistant message ``msg`` called, in order (empty for a text-only one)."""
        if not msg.has_calls:
            return ()
        step = _step_at(transcript, msg.position)
        if step is None:
            return ()
        return tuple(transcript.calls[i].name for i in step.calls)

    def _same_step(self, transcript: Transcript, a: Said, b: Said) -> bool:
        """Nothing new came back between assistant messages ``a`` and ``b`` (see the rules)."""
        if a.has_calls != b.has_calls:
            return False
        if not a.has_calls:
            return True
        sa, sb = _step_at(transcript, a.position), _step_at(transcript, b.position)
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

    def _repeats(self, transcript: Transcript, a: Said, a_text: str, b: Said, b_text: str) -> bool:
        """Assistant message ``b`` (normalized text ``b_text``) goes on with the same-text run of
        the previous assistant message ``a`` (``a_text``)."""
        return bool(b_text) and b_text == a_text and self._same_step(transcript, a, b)

    def _last_run(self, transcript: Transcript) -> int:
        """The length of the same-text run of the last assistant message of ``transcript.said``
        (0 without one): counted back from it, as long as each message repeats the one before."""
        said = transcript.said
        k = _previous_assistant(said, len(said))
        if k is None:
            return 0
        text = normalize(said[k].text)
        if not text:
            return 0
        run = 1
        j = _previous_assistant(said, k)
        while (
            j is not None
            and not self._prompt_between(said, j, k)
            and self._repeats(transcript, said[j], normalize(said[j].text), said[k], text)
        ):
            run, k = run + 1, j
            j = _previous_assistant(said, k)
        return run

    def begin(self) -> MonologueState:
        """The state before any message (:mod:`proxy.guards.resume`)."""
        return MonologueState()

    def __call__(self, transcript: Transcript, ctx: object = None) -> list[Action]:
        return self.advance(self.begin(), transcript, ctx, transcript.message_count)

    def advance(self, state: MonologueState, transcript: Transcript, ctx: object, upto: int) -> list[Action]:
        """Read the messages of ``transcript.said`` before message position ``upto`` that
        ``state`` has not read (:mod:`proxy.guards.resume`); the reminders decided for them. A
        text-only assistant message is decided when the message after it is read (its answer, or
        not), or at the end of the transcript. Nothing in a conversation without tool calls."""
        if not transcript.calls:
            return []
        said = transcript.said
        actions: list[Action] = []
        s = state
        while s.next < len(said) and said[s.next].position < upto:
            k = s.next
            msg = said[k]
            s.next += 1
            if s.waiting:
                self._decide(s, transcript, msg, actions)
            if msg.role != "assistant":
                if self._new_request(msg):  # a new request: no same-text run goes on across it
                    s.last, s.last_text, s.run = None, "", 0
                continue
            text = normalize(msg.text)
            if (
                text
                and s.last is not None
                and self._repeats(transcript, said[s.last], s.last_text, msg, text)
            ):
                s.run += 1
            else:
                s.run = 1 if text else 0
            s.last, s.last_text = k, text
            s.waiting = True
            if msg.has_calls:  # no answer to wait for
                self._decide(s, transcript, None, actions)
        if s.waiting and s.next >= len(said) and upto >= transcript.message_count:
            self._decide(s, transcript, None, actions)
        return actions

    def _decide(
        self, s: MonologueState, transcript: Transcript, nxt: Said | None, actions: list[Action]
    ) -> None:
        """Decide the last assistant message read (``s.last``), ``nxt`` being the message of
        ``transcript.said`` after it (None: none, or it made calls): its answer when it is a
        user message right after a text-only one."""
        s.waiting = False
        assert s.last is not None
        msg = transcript.said[s.last]
        answer = None
        if not msg.has_calls and nxt is not None and nxt.role == "user" and nxt.position == msg.position + 1:
            answer = nxt
        if answer is not None and self._new_request(answer):  # a person asking again: no run
            s.answer_run, s.last_answer = 0, ""
        elif answer is not None:
            a_text = normalize(answer.text)
            s.answer_run = s.answer_run + 1 if a_text and a_text == s.last_answer else (1 if a_text else 0)
            s.last_answer = a_text
        else:
            s.answer_run, s.last_answer = 0, ""
        if s.run == self._cfg.repeats:
            body = SAME_TEXT.format(count=s.run, text=preview(s.last_text, TEXT_PREVIEW_CHARS))
            count = s.run
        elif s.answer_run == self._cfg.repeats and answer is not None:
            body = SAME_ANSWER.format(count=s.answer_run, text=preview(s.last_answer, TEXT_PREVIEW_CHARS))
            count = s.answer_run
        else:
            return
        if msg.has_calls:
            step = _step_at(transcript, msg.position)
            if step is None or step.end is None:
                return
            after, fresh, delivery = step.end, transcript.is_fresh(step.index), self._delivery
        elif answer is not None:
            after, fresh, delivery = (
                answer.position,
                answer.position == transcript.message_count - 1,
                "tool_suffix",
            )
        else:
            return
        actions.append(Remind(after, body, RULE, "", count, self._cfg.repeats, fresh, delivery))

    def stop_possible(self, transcript: Transcript) -> bool:
        """True when one more assistant message repeating the last one, or one more text-only
        reply after the same answer, would reach ``stop_at``."""
        stop_at = self._cfg.stop_at
        if not stop_at or not transcript.calls:
            return False
        if self.answer_run(transcript) + 1 >= stop_at:
            return True
        said = transcript.said
        last = _previous_assistant(said, len(said))
        if last is None or self._prompt_between(said, last, len(said)):
            return False
        return self._last_run(transcript) + 1 >= stop_at

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
            if not text or (run and text != answer) or self._new_request(ans):
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
        said = transcript.said
        k = _previous_assistant(said, len(said))
        last = said[k] if k is not None else None
        if last is None or normalize(last.text) != text or self._prompt_between(said, k, len(said)):
            return 1
        if tuple(tools) != self._tools_of(transcript, last):
            return 1
        return self._last_run(transcript) + 1


class MonologueState:
    """What :class:`Monologue` has read: the next message (``next``, an index into
    ``transcript.said``); the last assistant message read (``last``, an index; None before one),
    its normalized text (``last_text``), its same-text run (``run``) and whether it still waits
    for the message after it to be decided (``waiting``); the same-answer run (``answer_run``)
    and its answer's normalized text (``last_answer``). Mutable; :meth:`copy` is independent."""

    __slots__ = ("answer_run", "last", "last_answer", "last_text", "next", "run", "waiting")

    def __init__(self) -> None:
        self.next = 0
        self.last: int | None = None
        self.last_text = ""
        self.run = 0
        self.waiting = False
        self.answer_run = 0
        self.last_answer = ""

    def copy(self) -> MonologueState:
        out = MonologueState()
        out.next, out.last, out.last_text, out.run = self.next, self.last, self.last_text, self.run
        out.waiting, out.answer_run, out.last_answer = self.waiting, self.answer_run, self.last_answer
        return out


def _step_at(transcript: Transcript, position: int) -> Step | None:
    """The step whose assistant message is at ``position`` (steps are in message order)."""
    steps = transcript.steps
    i = bisect.bisect_left(steps, position, key=lambda st: st.position)
    return steps[i] if i < len(steps) and steps[i].position == position else None


def _previous_assistant(said: Sequence[Said], k: int) -> int | None:
    """The index of the last assistant message of ``said`` before index ``k`` (None: none)."""
    for j in range(k - 1, -1, -1):
        if said[j].role == "assistant":
            return j
    return None
