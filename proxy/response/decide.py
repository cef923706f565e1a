"""The response side's decisions, as pure functions over plain data (DESIGN §6.4).

- **Stop** (:class:`StopJudge`): the response's calls are appended to the request's transcript as
  one more step, with empty placeholder results marked ``pending``, and the request-side guards
  are asked whether they would withhold any of them (the same guards, resumed from their states
  after the request's whole transcript when there are some, :attr:`proxy.guards.resume.Evaluation.end`,
  so only the answer's step is read; no guard logic duplicated here; a placeholder is never
  compared: progress-aware rules judge a pending call by the previous pair, :mod:`proxy.core.progress`).
  The turn is stopped when
  - a call would be denied and the current turn (after the last user message) already has
    ``stop.after_ignored_denials`` withheld results in the request (kind ``denials``), or
  - a call would be denied by the circuit breaker's volume cap (kind ``cap``) or waste cap (kind
    ``waste``: the episode's last calls brought nothing new) and ``stop.on_cap`` is set.
  - the response's text (with or without calls) would make ``guards.monologue.stop_at``
    assistant messages in a row with the same text (kind ``monologue``; the request-side rule's own
    count, :meth:`proxy.guards.monologue.Monologue.stop_count`, no guard run needed). A text-only
    answer is only looked at when the history already ends in ``stop_at - 1`` such messages
    (``StopJudge.on_text_only``); the stream guard then holds just that choice's finish chunk.
  A user message starts a new turn (no withheld results yet), so a stopped conversation the user
  continues is guarded afresh (a harness's format-error reply is not one: :func:`turn_start`);
  the caps count over the circuit breaker's ``scope`` (in episode scope a new request resets
  them, in conversation scope nothing does). The judge only runs the guards when one of them can
  fire (enough withheld results, or enough calls in the conversation to reach a cap), so most
  responses cost nothing.
- **Runaway** (:func:`runaway_cut`): calls are kept up to the first that is beyond
  ``max_calls_per_response`` or is an identical call (same name and canonical arguments, nothing
  ignored) that may change state (:meth:`proxy.core.effects.EffectRule.may_change`, the config's
  ``progress`` effects) beyond ``max_identical_per_response``, or an identical read-only call
  beyond ``max_identical_reads_per_response``; that call and everything after it are dropped. A
  read-only call repeated in one answer changes nothing and costs the agent one more read, while
  a cut drops every call after it (DESIGN §2.2), so identical reads get the higher bound: a few
  parallel copies pass, a model emitting the same read until its length limit is cut. The
  stream relay applies the same rule as calls complete, so JSON and SSE agree.
- **Degenerate text** in a JSON response is detected and reported only (:func:`decide_json`).
- **Repair** (:mod:`proxy.response.repair`): calls the model wrote as text become
  structured calls before the two decisions above, which then judge them like any others.

:func:`decide_json` rewrites a whole ``chat.completion`` body; the streaming counterpart is
:mod:`proxy.response.stream_guard`. :func:`earlier_stops` finds the stops already in a conversation's
history (for the first-stop-per-conversation incident record).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import operator
import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

from proxy.config import Config, ProgressConfig, ResponseConfig, StopConfig
from proxy.core.actions import Action, Cut, Remind, Stop, Withhold
from proxy.core.canonical import canonical_arguments, parse_arguments
from proxy.core.effects import EffectRule, effect_rule
from proxy.core.harness_replies import is_harness_reply
from proxy.core.transcript import Step, ToolCall, ToolResult, Transcript
from proxy.dialects import jsonbody, text_actions
from proxy.dialects.openai_chat import content_text
from proxy.guards import Context, Guard
from proxy.guards.circuit_breaker import CAP, WASTE
from proxy.guards.circuit_breaker import RULE as BREAKER
from proxy.guards.escalation import RULE as ESCALATION_RULE
from proxy.guards.escalation import Escalation
from proxy.guards.monologue import Monologue
from proxy.guards.resume import Checkpoint, evaluate_from
from proxy.response.assemble import AssembledCall
from proxy.response.degenerate import RepetitionDetector
from proxy.response.repair import CUT_SHORT, Repairer

STOP_RULE = "stop"
RUNAWAY_RULE = "runaway"
DEGENERATE_RULE = "degenerate_text"
DENIALS = "denials"

DENIALS_TEXT = (
    "[loopguard] Stopped: the model kept calling {tool} ({count} times) and ignored {denials} "
    "withheld results, so loopguard ended its turn here; that last call was not run. "
    "Send a message to continue."
)
CAP_TEXT = (
    "[loopguard] Stopped: this conversation reached loopguard's limit of {limit} tool calls (the "
    "model wanted to call {tool} again), so loopguard ended its turn here; that call was not run. "
    "Start a new conversation to continue."
)
#: The cap's text when the circuit breaker counts per episode (a new request resets the cap).
EPISODE_CAP = "episode_cap"
EPISODE_CAP_TEXT = (
    "[loopguard] Stopped: the model reached loopguard's limit of {limit} tool calls for this request "
    "(it wanted to call {tool} again), so loopguard ended its turn here; that call was not run. "
    "Send a message to continue."
)
WASTE_TEXT = (
    "[loopguard] Stopped: the model's tool calls stopped bringing anything new ({count} of its last "
    "{limit} got results it already had, with nothing changed in between), so loopguard ended its "
    "turn here; that last call was not run. Send a message to continue."
)

#: Fields of a message or delta that carry reasoning text (llama.cpp/DeepSeek, vLLM/OpenRouter).
REASONING_FIELDS = ("reasoning_content", "reasoning")


#: Stop kind: the escalation ladder would withhold a call again after it withheld one.
ESCALATION = "escalation"
ESCALATION_TEXT = (
    "[loopguard] Stopped: the model kept calling {tool} after {limit} reminders and a withheld "
    "result that said it was not getting anywhere, so loopguard ended its turn here; that last "
    "call was not run. Send a message to continue."
)

#: Stop kind: the response repeats the same text as the assistant messages before it.
MONOLOGUE = "monologue"
MONOLOGUE_TEXT = (
    "[loopguard] Stopped: the model repeated itself ({count} replies in a row that changed "
    "nothing), so loopguard ended its turn here; any tool call in that last reply was not run. "
    "Send a message to continue."
)


def stop_template(cfg: StopConfig, kind: str) -> str:
    if cfg.message:
        return cfg.message
    texts = {
        CAP: CAP_TEXT,
        EPISODE_CAP: EPISODE_CAP_TEXT,
        WASTE: WASTE_TEXT,
        MONOLOGUE: MONOLOGUE_TEXT,
        ESCALATION: ESCALATION_TEXT,
    }
    return texts.get(kind, DENIALS_TEXT)


def call_key(call: AssembledCall) -> tuple[str, str]:
    """Identity of a call within one response: name and canonical arguments (nothing ignored)."""
    raw = call.arguments
    return call.name, canonical_arguments(parse_arguments(raw), raw)


def with_pending_step(transcript: Transcript, calls: Sequence[AssembledCall]) -> tuple[Transcript, set[int]]:
    """``transcript`` plus one step: an assistant message at the end with ``calls``, each answered
    by an empty placeholder result. Returns it and the placeholder results' positions."""
    pos = transcript.message_count
    turn = len(transcript.user_positions)
    step_index = len(transcript.steps)
    first = len(transcript.calls)
    new = tuple(
        ToolCall(
            seq=first + i,
            step=step_index,
            turn=turn,
            position=pos,
            call_id=c.id,
            name=c.name,
            arguments_raw=c.arguments,
            arguments=parse_arguments(c.arguments),
            result=ToolResult(pos + 1 + i, "", pending=True),
        )
        for i, c in enumerate(calls)
    )
    step = Step(step_index, pos, tuple(c.seq for c in new), pos + len(new))
    t = transcript  # made field by field: ``dataclasses.replace`` reads every field by name
    extended = Transcript(
        t.calls + new,
        (*t.steps, step),
        t.user_positions,
        t.assistant_text_positions,
        pos + 1 + len(new),
        step_index,
        t.said,
        t.tools,
        t.tool_choice,
        t.action_shapes,
    )
    return extended, {pos + 1 + i for i in range(len(new))}


def turn_start(transcript: Transcript) -> int:
    """Position of the user message that starts the stop ladder's current turn (-1: none): the
    last one that is not a harness's format-error reply (:mod:`proxy.core.harness_replies`). A harness
    that answers a stop with "Tool call error: no tool calls found" asks the model again; the stop
    must hold through that, while anything a person says starts afresh."""
    said = transcript.said
    j = len(said) - 1
    for pos in reversed(transcript.user_positions):
        # the last said message at or before ``pos`` (found by bisection: an agent's turn holds
        # thousands of assistant messages after its user message)
        j = min(j, bisect.bisect_right(said, pos, key=_position) - 1)
        while j >= 0 and said[j].position == pos and said[j].role != "user":
            j -= 1
        if j < 0 or said[j].position != pos or not is_harness_reply(said[j].text):
            return pos
    return -1


_position = operator.attrgetter("position")


class StopJudge:
    """``judge(calls) -> Stop | None`` for one request: would these response calls end the turn?"""

    __slots__ = (
        "_after",
        "_cap",
        "_cap_text",
        "_cfg",
        "_checkpoint",
        "_ctx",
        "_escalated",
        "_guards",
        "_monologue",
        "_room",
        "_transcript",
        "_waste",
        "action_shapes",
        "on_text_only",
        "withheld",
    )

    def __init__(
        self,
        transcript: Transcript,
        request_actions: Sequence[Action],
        guards: Sequence[Guard],
        ctx: Context,
        cfg: Config,
        checkpoint: Checkpoint | None = None,
    ) -> None:
        self._transcript = transcript
        #: the history shows a harness running fenced text actions (their result shapes): an
        #: answer's fenced action is then judged as a call (:func:`decide_json`)
        self.action_shapes = transcript.action_shapes
        # Only guards that can withhold decide whether a call "would be denied"; reminder-only
        # guards (``withholds = False``) are skipped. A guard without the flag is asked.
        self._guards = tuple(g for g in guards if getattr(g, "withholds", True))
        # the request's guards after its whole transcript, narrowed to these guards: they resume
        # from it over the answer's step alone instead of reading the whole history
        self._checkpoint = checkpoint.narrowed(self._guards) if checkpoint is not None else None
        # the escalation ladder reads the reminders: those of the request (the answer's own step
        # has none yet), since reminder-only guards are not asked again
        reminders = tuple(a for a in request_actions if isinstance(a, Remind))
        self._ctx = Context(ctx.conversation, ctx.now_ms, ctx.state, reminders)
        self._cfg = cfg.stop
        self._after = cfg.stop.after_ignored_denials
        breaker = cfg.guards.circuit_breaker
        self._cap = breaker.max_calls_per_agent if cfg.stop.on_cap and breaker.enabled else 0
        self._cap_text = EPISODE_CAP if breaker.scope == "episode" else CAP
        # the waste cap needs at least waste_limit calls in its scope before it can deny one
        on = cfg.stop.on_cap and breaker.enabled and breaker.waste_window
        self._waste = breaker.waste_limit if on else 0
        # the most calls one answer can bring (a longer one is cut first): how near the cap must be
        self._room = cfg.response.max_calls_per_response or 1 << 30
        # monologue: the request-side rule says how long the same-text run would get
        self._monologue = next((g for g in guards if isinstance(g, Monologue) and g.config.stop_at), None)
        #: a text-only answer could be stopped (the history already ends in stop_at - 1 assistant
        #: messages with the same text): the stream guard then holds a text-only choice's finish
        self.on_text_only = self._monologue is not None and self._monologue.stop_possible(transcript)
        last_user = turn_start(transcript)
        #: withheld results in the current turn of the request (fresh and re-derived)
        self.withheld = len(
            {a.position for a in request_actions if isinstance(a, Withhold) and a.position > last_user}
        )
        # escalation: a withheld result of the ladder in this turn makes the next one a stop (the
        # ladder is the last guard that withholds: its actions are found from the end)
        ladder = next((g for g in guards if isinstance(g, Escalation) and g.config.stop), None)
        self._escalated = ladder is not None and any(
            isinstance(a, Withhold) and a.rule == ESCALATION_RULE and a.position > last_user
            for a in reversed(request_actions)
        )

    @property
    def possible(self) -> bool:
        """Some answer to this request could be stopped (no guard run): the turn already has
        ``stop.after_ignored_denials`` withheld results, the ladder withheld in it, a text could
        complete a monologue, or one answer's calls could reach the volume or the waste cap. False
        means no answer is stopped, so ``stop.deliver: error`` streams such an answer unheld."""
        if 0 < self._after <= self.withheld or self._escalated or self.on_text_only:
            return True
        reach = len(self._transcript.calls) + self._room
        return 0 < self._cap < reach or 0 < self._waste < reach

    @staticmethod
    def enabled(cfg: Config) -> bool:
        breaker = cfg.guards.circuit_breaker
        cap = (
            cfg.stop.on_cap
            and breaker.enabled
            and (breaker.max_calls_per_agent > 0 or breaker.waste_window > 0)
        )
        monologue = cfg.guards.monologue.enabled and cfg.guards.monologue.stop_at > 0
        ladder = cfg.guards.escalation.enabled and cfg.guards.escalation.stop
        return cfg.stop.after_ignored_denials > 0 or cap or monologue or ladder

    def __call__(self, calls: Sequence[AssembledCall], text: str = "") -> Stop | None:
        """``calls``: the response's tool calls; ``text``: its content (for the monologue stop)."""
        if not calls:
            return self._monologue_stop(calls, text) if self.on_text_only else None
        by_denials = 0 < self._after <= self.withheld
        total = len(self._transcript.calls) + len(calls)
        by_cap = 0 < self._cap < total or 0 < self._waste < total
        if not (by_denials or by_cap or self._escalated):
            return self._monologue_stop(calls, text)
        extended, pending = with_pending_step(self._transcript, calls)
        evaluated = evaluate_from(
            extended, self._guards, self._ctx, frozenset(), self._checkpoint, keep=False, new_only=True
        )[0]
        # the answer's own withheld results (filtered before the sort, which is stable: the
        # same order as sorting every re-derived action of a long history first)
        mine = [a for a in evaluated if isinstance(a, Withhold) and a.position in pending]
        denied = sorted(mine, key=lambda a: a.position)
        capped = [a for a in denied if a.rule == BREAKER and a.reason in (CAP, WASTE)]
        if by_cap and capped:
            first = capped[0]
            if first.reason == WASTE:
                return self._stop(WASTE, first, first.limit)
            return self._stop(CAP, first, first.limit, self._cap_text)
        laddered = [a for a in denied if a.rule == ESCALATION_RULE]
        if self._escalated and laddered:
            return self._stop(ESCALATION, laddered[0], laddered[0].limit)
        if by_denials and denied:
            return self._stop(DENIALS, denied[0], self._after)
        return self._monologue_stop(calls, text)

    def _monologue_stop(self, calls: Sequence[AssembledCall], text: str) -> Stop | None:
        """Stop when ``text`` would be the ``monologue.stop_at``-th same message in a row, or a
        text-only answer the ``stop_at``-th text-only reply in a row answered the same way."""
        if self._monologue is None or not text.strip():
            return None
        limit = self._monologue.config.stop_at
        count = self._monologue.stop_count(self._transcript, text, [c.name for c in calls])
        if not calls:
            count = max(count, self._monologue.answer_run(self._transcript) + 1)
        if count < limit:
            return None
        tool = calls[0].name if calls else ""
        body = stop_template(self._cfg, MONOLOGUE).format(
            tool=tool, count=count, limit=limit, kind=MONOLOGUE, denials=self.withheld
        )
        evidence = (("same_replies_in_a_row", count), ("stop_at", limit))
        return Stop(
            text=body,
            rule=STOP_RULE,
            tool=tool,
            count=count,
            limit=limit,
            reason=MONOLOGUE,
            evidence=evidence,
        )

    def _stop(self, kind: str, w: Withhold, limit: int | None, template: str = "") -> Stop:
        text = stop_template(self._cfg, template or kind).format(
            tool=w.tool, count=w.count, limit=limit, kind=kind, denials=self.withheld
        )
        evidence: tuple[tuple[str, int | None], ...]
        if kind == CAP:
            scope = "calls_in_request" if template == EPISODE_CAP else "calls_in_conversation"
            evidence = ((scope, w.count), ("max_calls_per_agent", limit))
        elif kind == WASTE:
            evidence = (("calls_bringing_nothing_new", w.count), ("waste_window", limit))
        elif kind == ESCALATION:  # the ladder's withhold counts the reminders its call ignored
            evidence = (
                ("ignored_reminders", w.count),
                ("after_reminders", limit),
                ("withheld_in_turn", self.withheld),
            )
        else:
            evidence = (("withheld_in_turn", self.withheld), ("after_ignored_denials", limit))
        return Stop(
            text=text, rule=STOP_RULE, tool=w.tool, count=w.count, limit=limit, reason=kind, evidence=evidence
        )


@lru_cache(maxsize=4)
def effects_of(progress: ProgressConfig) -> EffectRule:
    """The effects reading of a config's ``progress`` section, built once per section (its
    patterns are compiled and its verdicts memoized; a reload brings a new section)."""
    return effect_rule(progress)


#: The effects reading of the default config (``runaway_cut`` without ``effects``).
DEFAULT_EFFECTS = effects_of(ProgressConfig())


def runaway_cut(
    calls: Sequence[AssembledCall],
    cfg: ResponseConfig,
    complete: int | None = None,
    effects: EffectRule = DEFAULT_EFFECTS,
) -> Cut | None:
    """The runaway rule over the first ``complete`` calls (all by default), plus the count limit
    over all of them. Returns a :class:`Cut` whose ``count`` is the number of calls kept, or None.

    Identical calls (same name and canonical arguments) that may change state (``effects``: the
    config's, :func:`effects_of`) count toward ``max_identical_per_response``: the same edit or
    command three times in one answer is the runaway. Identical read-only calls count toward
    ``max_identical_reads_per_response``: a few parallel copies of one read are harmless (and
    redacted transcripts make distinct reads look alike), twenty are a model stuck repeating
    itself until its length limit. Both cuts have ``reason`` ``"identical"`` and the limit that
    was passed."""
    n_complete = len(calls) if complete is None else complete
    cut_at: int | None = None
    reason = ""
    tool = ""
    limit: int | None = None
    writes, reads = cfg.max_identical_per_response, cfg.max_identical_reads_per_response
    if writes or reads:
        seen: Counter[tuple[str, str]] = Counter()
        changing: dict[tuple[str, str], bool] = {}  # the verdict of each distinct call, once
        for i, call in enumerate(calls[:n_complete]):
            key = call_key(call)
            verdict = changing.get(key)
            if verdict is None:
                verdict = changing[key] = effects.may_change(call.name, parse_arguments(call.arguments))
            bound = writes if verdict else reads
            if not bound:
                continue
            seen[key] += 1
            if seen[key] > bound:
                cut_at, reason, tool, limit = i, "identical", call.name, bound
                break
    max_calls = cfg.max_calls_per_response
    if max_calls and len(calls) > max_calls and (cut_at is None or max_calls < cut_at):
        cut_at, reason, tool, limit = max_calls, "calls", calls[max_calls].name, max_calls
    if cut_at is None:
        return None
    return Cut(rule=RUNAWAY_RULE, tool=tool, count=cut_at, limit=limit, reason=reason)


def detect_text(text: str, cfg: Config) -> int | None:
    """Repeats of the degenerate span ending ``text``, or None (a whole text, non-streaming)."""
    dcfg = cfg.response.degenerate_text
    if not dcfg.enabled or not text:
        return None
    det = RepetitionDetector(dcfg)
    det.feed(text)
    rep = det.check()
    return rep.repeats if rep else None


def append_text(content: Any, text: str) -> Any:
    """``content`` with ``text`` after it (a blank line between), for the final message."""
    if isinstance(content, list):
        return [*content, {"type": "text", "text": text}]
    if isinstance(content, str) and content:
        return f"{content}\n\n{text}"
    return text


def message_calls(message: dict[str, Any]) -> list[AssembledCall]:
    """The calls of a complete (non-streamed) assistant message."""
    out: list[AssembledCall] = []
    tool_calls = message.get("tool_calls")
    if isinstance(tool_calls, list):
        for i, tc in enumerate(tool_calls):
            if not isinstance(tc, dict):
                continue
            fn = tc.get("function") if isinstance(tc.get("function"), dict) else {}
            cid = tc.get("id")
            name = fn.get("name")
            args = fn.get("arguments")
            out.append(
                AssembledCall(
                    id=cid if isinstance(cid, str) else None,
                    name=name if isinstance(name, str) else "",
                    arguments="" if args is None else args,
                    index=i,
                )
            )
    fc = message.get("function_call")
    if not out and isinstance(fc, dict):
        args = fc.get("arguments")
        name = fc.get("name")
        out.append(AssembledCall(None, name if isinstance(name, str) else "", "" if args is None else args))
    return out


def decide_json(
    raw: bytes, judge: StopJudge | None, cfg: Config, repair: Repairer | None = None
) -> tuple[bytes | None, list[Action]]:
    """Decide on a whole ``chat.completion`` body. Returns the rewritten body (None = forward the
    original bytes) and the actions taken. A body that is not a completion is left alone.
    ``repair``: calls written as text in a choice without structured calls are rewritten first
    (:mod:`proxy.response.repair`) and then judged like any other calls."""
    try:
        obj = jsonbody.decode(raw)
    except jsonbody.Unreadable:
        return None, []
    if not isinstance(obj, dict) or not isinstance(obj.get("choices"), list):
        return None, []
    actions: list[Action] = []
    changed = False
    for n, choice in enumerate(obj["choices"]):
        msg = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(msg, dict):
            continue
        fixed = None
        if repair is not None and not message_calls(msg) and choice.get("finish_reason") not in CUT_SHORT:
            index = choice.get("index")
            fixed = repair.message(msg, index if isinstance(index, int) else n)
        if fixed is not None:
            actions.append(fixed)
            choice["finish_reason"] = "tool_calls"
            changed = True
        for field, reason in (("content", "content"), *((f, "reasoning") for f in REASONING_FIELDS)):
            text = msg.get(field)
            repeats = detect_text(text, cfg) if isinstance(text, str) else None
            if repeats:
                limit = cfg.response.degenerate_text.min_repeats
                actions.append(Cut(DEGENERATE_RULE, "", repeats, limit, reason, applied=False))
        calls = message_calls(msg)
        if not calls and judge is not None and judge.action_shapes:
            action = text_actions.answer_action(content_text(msg.get("content")), judge.action_shapes)
            if action is not None:  # a fenced action of a harness that runs them
                text_call = AssembledCall(None, action.name, jsonbody.dumps(action.arguments).decode(), 0)
                stop = judge([text_call], action.text)
                if stop is not None:  # the stop text instead: no action left for the harness to run
                    actions.append(stop)
                    msg["content"] = stop.text
                    choice["finish_reason"] = "stop"
                    changed = True
                continue
        if not calls:
            stop = judge([], content_text(msg.get("content"))) if judge is not None else None
            if stop is not None:  # monologue in a text-only answer: the stop text after it
                actions.append(stop)
                msg["content"] = append_text(msg.get("content"), stop.text)
                choice["finish_reason"] = "stop"
                changed = True
            continue
        cut = runaway_cut(calls, cfg.response, effects=effects_of(cfg.progress))
        kept = calls[: cut.count] if cut else calls
        if cut:
            actions.append(cut)
        stop = judge(kept, content_text(msg.get("content"))) if judge is not None else None
        if stop is not None:
            actions.append(stop)
            msg["content"] = append_text(msg.get("content"), stop.text)
            msg.pop("tool_calls", None)
            msg.pop("function_call", None)
            choice["finish_reason"] = "stop"
            changed = True
        elif cut:
            msg["tool_calls"] = msg["tool_calls"][: cut.count]
            changed = True
    return (jsonbody.dumps(obj) if changed else None), actions


#: How much of a message's end is compared with the stop texts (they are a few hundred characters).
_TAIL = 4096


@functools.lru_cache(maxsize=64)
def _template_pattern(template: str) -> re.Pattern[str]:
    parts: list[str] = []
    for literal, name, _, _ in string.Formatter().parse(template):
        parts.append(re.escape(literal))
        if name is not None:
            parts.append(".*?")
    return re.compile("".join(parts) + r"\Z", re.DOTALL)


def _gemini_message(content: Any) -> Any:
    """A Gemini ``model`` content as the chat assistant message :func:`earlier_stops` reads (its
    answer text; ``tool_calls`` when it has ``functionCall`` parts); other contents as they are."""
    if (
        not isinstance(content, dict)
        or content.get("role") != "model"
        or not isinstance(content.get("parts"), list)
    ):
        return content
    parts = [p for p in content["parts"] if isinstance(p, dict)]
    text = "".join(
        p["text"] for p in parts if isinstance(p.get("text"), str) and p.get("thought") is not True
    )
    calls = [p for p in parts if "functionCall" in p]
    return {"role": "assistant", "content": text, "tool_calls": calls}


#: Characters JSON writes as they are (no encoder escapes them, short of a ``\\u`` escape).
_VERBATIM = re.compile(r"[^\x20-\x7e]|[\"\\/]")


@functools.lru_cache(maxsize=64)
def _needle(template: str) -> bytes:
    """The longest run of the template's literal text that a JSON encoder writes verbatim (b"":
    none): a message ending with the filled template holds it, so a body without it has none."""
    runs = [
        run for literal, _, _, _ in string.Formatter().parse(template) for run in _VERBATIM.split(literal)
    ]
    return max(runs, key=len, default="").encode()


#: The stop texts :func:`earlier_stops` looks for.
STOP_KINDS = (DENIALS, CAP, EPISODE_CAP, WASTE, MONOLOGUE)


def earlier_stops(request_body: bytes, cfg: StopConfig) -> list[Stop]:
    """Stops already in the conversation: assistant messages without calls that end with a stop
    text (the built-in ones, or ``stop.message``). Returned as re-derived (not fresh) actions.
    A body that holds no part of any stop text (and no JSON escape that could spell one) has
    none, and is not decoded; Gemini ``parts`` are joined without a separator, so a body with
    ``parts`` is always decoded (a text could span two of them)."""
    needles = {_needle(stop_template(cfg, kind)) for kind in STOP_KINDS}
    quick = b"\\u" not in request_body and b'"parts"' not in request_body
    if quick and all(n and n not in request_body for n in needles):
        return []
    try:
        body = jsonbody.decode(request_body)
    except jsonbody.Unreadable:
        return []
    messages = body.get("messages", body.get("input")) if isinstance(body, dict) else None
    if isinstance(body, dict) and messages is None and isinstance(body.get("contents"), list):
        messages = [_gemini_message(c) for c in body["contents"]]
    if not isinstance(messages, list):  # chat messages, or Responses input items
        return []
    patterns = {_template_pattern(stop_template(cfg, kind)) for kind in STOP_KINDS}
    out: list[Stop] = []
    for msg in messages:
        if not isinstance(msg, dict) or msg.get("role") != "assistant" or msg.get("tool_calls"):
            continue
        if msg.get("type", "message") != "message":
            continue
        content = msg.get("content")
        if isinstance(content, list):
            content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
        if isinstance(content, str) and any(p.search(content[-_TAIL:]) for p in patterns):
            out.append(Stop(text=content, rule=STOP_RULE, tool="", count=0, limit=None, fresh=False))
    return out


def cuts_enabled(cfg: Config) -> bool:
    """The runaway or degenerate-text checks, or the repair of text tool calls, are on
    (``response.*``: what ``response.mode`` covers)."""
    r = cfg.response
    return bool(
        r.max_calls_per_response
        or r.max_identical_per_response
        or r.max_identical_reads_per_response
        or r.degenerate_text.enabled
        or r.repair_text_tool_calls
    )


def without_cuts(cfg: Config) -> Config:
    """``cfg`` with the runaway and degenerate-text checks and the repair off (the part
    ``response.mode`` covers)."""
    r = cfg.response
    off = dataclasses.replace(
        r,
        max_calls_per_response=0,
        max_identical_per_response=0,
        max_identical_reads_per_response=0,
        degenerate_text=dataclasses.replace(r.degenerate_text, enabled=False),
        repair_text_tool_calls=False,
    )
    return dataclasses.replace(cfg, response=off)


@dataclasses.dataclass(frozen=True)
class Deciders:
    """The response side of one request split by mode: what is enforced
    (``cfg``, ``judge``: applied to the agent's answer) and what is observed (``shadow_cfg``,
    ``shadow_judge``: decided on the same answer, applied never). Without observed rules the
    shadow has nothing on and ``judge`` is the usual one."""

    cfg: Config
    judge: StopJudge | None
    shadow_cfg: Config
    shadow_judge: StopJudge | None

    @property
    def enforcing(self) -> bool:
        return self.judge is not None or cuts_enabled(self.cfg)

    @property
    def observing(self) -> bool:
        return self.shadow_judge is not None or cuts_enabled(self.shadow_cfg)


class LazyJudge:
    """The stop judge of a request with nothing to guard (:mod:`proxy.request.plain`: no tool
    call in its history, so not decoded), built from the body by ``make`` on the first answer
    with calls. Until then it answers as :class:`StopJudge` does over a history without calls:
    ``on_text_only`` is False (:meth:`proxy.guards.monologue.Monologue.stop_possible` needs a
    call) and a text-only answer gets no stop. ``make`` returns None for a body the dialect
    cannot read (no judge, as for any unreadable request)."""

    __slots__ = ("_judge", "_make", "action_shapes")

    on_text_only = False
    #: no call in the history: no withheld result, no ladder, no monologue (as :attr:`StopJudge.possible`)
    possible = False

    def __init__(self, make: Callable[[], StopJudge | None], action_shapes: frozenset[str]) -> None:
        self._make: Callable[[], StopJudge | None] | None = make
        self._judge: StopJudge | None = None
        #: as :attr:`StopJudge.action_shapes` (the history's harness shapes: none without a fence)
        self.action_shapes = action_shapes

    def __call__(self, calls: Sequence[AssembledCall], text: str = "") -> Stop | None:
        if not calls:
            return None
        if self._make is not None:
            make, self._make = self._make, None
            self._judge = make()
        return self._judge(calls, text) if self._judge is not None else None


def deciders(
    transcript: Transcript | None,
    request_actions: Sequence[Action],
    guards: Sequence[Guard],
    ctx: Context,
    cfg: Config,
    checkpoint: Checkpoint | None = None,
    lazy: Callable[[], Transcript | None] | None = None,
) -> Deciders:
    """Split the response side by ``cfg.observed_rules()``: the cuts go to the enforced part
    unless ``response.mode`` is observe; an enforced stop judge reads only the applied request
    actions and asks only the enforced guards (so the stop text it writes is true), while an
    observed one (``stop.mode: observe``, or any guard observed: the stop enforcing it would
    make) reads all of them and asks every guard. ``transcript`` None: no judge at all.
    ``checkpoint``: the request's (:attr:`proxy.request.rewrite.RequestDecision.checkpoint`), for
    the judges' guards to resume from. ``lazy``: instead of ``transcript``, for a request with
    nothing to guard: what gives its transcript (None: unreadable, no judge); the judge is built
    only when an answer has calls (:class:`LazyJudge`)."""
    observed = cfg.observed_rules()
    enforce_cfg, shadow_cfg = _split(cfg, "runaway" in observed)
    judge = shadow = None

    def judge_of(actions: Sequence[Action], asked: Sequence[Guard]) -> Any:
        if transcript is not None:
            return StopJudge(transcript, actions, asked, ctx, cfg, checkpoint)
        assert lazy is not None

        read = lazy()
        if read is None:
            return None

        def make() -> StopJudge:
            return StopJudge(read, actions, asked, ctx, cfg, checkpoint)

        return LazyJudge(make, read.action_shapes)

    if (transcript is not None or lazy is not None) and StopJudge.enabled(cfg):
        if "stop" not in observed:
            enforced = tuple(g for g in guards if getattr(g, "name", None) not in observed)
            kept = tuple(a for a in request_actions if not a.observed)
            judge = judge_of(kept, enforced)
        if "stop" in observed or any(getattr(g, "name", None) in observed for g in guards):
            shadow = judge_of(request_actions, guards)
    return Deciders(enforce_cfg, judge, shadow_cfg, shadow)


#: (config, runaway observed) → (enforced config, shadow config): the two views of a config are
#: built once per config (a frozen dataclass), not per answer; a few entries (reloads).
_SPLITS: dict[tuple[int, bool], tuple[Config, Config, Config]] = {}


def _split(cfg: Config, runaway_observed: bool) -> tuple[Config, Config]:
    hit = _SPLITS.get((id(cfg), runaway_observed))
    if hit is not None and hit[0] is cfg:
        return hit[1], hit[2]
    off = without_cuts(cfg)
    views = (off, cfg) if runaway_observed else (cfg, off)
    if len(_SPLITS) >= 16:
        _SPLITS.clear()
    _SPLITS[(id(cfg), runaway_observed)] = (cfg, *views)
    return views


def observed_actions(applied: Sequence[Action], shadow: Sequence[Action]) -> list[Action]:
    """The shadow's actions to report, marked observed: a shadow stop only when no stop was
    applied (one answer is stopped once)."""
    stopped = any(isinstance(a, Stop) for a in applied)
    return [dataclasses.replace(a, observed=True) for a in shadow if not (stopped and isinstance(a, Stop))]
