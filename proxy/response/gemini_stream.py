"""The response side of the Gemini API, sans-I/O: a ``GenerateContentResponse`` (JSON, the answer to
``:generateContent``) or its SSE events (``:streamGenerateContent?alt=sse``) in, what the agent
receives out. The decisions are the shared ones (:class:`proxy.response.answer.AnswerState`: the
stop judge, the runaway cut, degenerate text), and so are the framing, the holding and the byte
accounting (:class:`proxy.response.stream_guard.FramedGuard`); this module is the wire: its decoder
(``_event``, ``_track``) and encoder (``_write``, the stop part, the endings).

The grammar (https://ai.google.dev/api/generate-content#v1beta.GenerateContentResponse, checked
against ``@google/genai`` and Gemini CLI): every event is ``data: <GenerateContentResponse>`` (no
``event:`` names, no terminator): ``candidates[]`` (one per ``candidateCount``; each with
``content.parts[]`` holding the new ``text`` parts, ``thought: true`` ones being reasoning, and
whole ``functionCall`` parts: arguments are never split across events), ``finishReason`` on the
last event of a candidate (``STOP`` for text and for calls alike, ``MAX_TOKENS``, ``SAFETY``, …),
and ``usageMetadata``, ``modelVersion``, ``responseId``. An event without ``candidates``
(``promptFeedback`` only, usage only) passes on as it is.

SSE (:class:`GeminiStreamGuard`): events go to the agent as their exact upstream bytes as soon as
they are complete, except that an event with a ``functionCall`` part, and every event after it, is
**held** until the decision at the event that carries ``finishReason`` (that event is decided
before it goes out, whether calls came or not: a text-only answer can be stopped too).

- Nothing decided → the held bytes are released unchanged.
- **Stop** → the ``functionCall`` parts are dropped from the held events (an event left with no
  part and no ``finishReason`` is dropped); the finishing event gets one ``text`` part with the
  stop text (after a blank line when the answer said something) and ``finishReason: "STOP"``.
- **Runaway** (too many calls, or too many identical ones, in one answer) → as soon as an event
  brings a call past the limit, the upstream is closed; the held events are released without the
  calls past the cut, then one event ``{"candidates": [{"finishReason": "STOP", "index": 0}]}``
  ends the answer (at the finishing event itself, the calls past the cut are dropped from it).
- **Degenerate text** (:mod:`proxy.response.degenerate`, in ``text`` or ``thought`` parts) → the
  upstream is closed; held calls are dropped and one event with ``finishReason: "MAX_TOKENS"``
  ends the answer.
- An event that is not JSON, ``{"error": …}``, more than one candidate or a candidate ``index``
  other than 0 (``candidateCount`` > 1: not read), ``parts`` that is not a list, or an event past
  :data:`proxy.response.stream_guard.MAX_EVENT_BYTES` → everything held is released unchanged and
  the rest of the stream passes through unread. A stream that ends without ``finishReason`` is
  released unchanged and stopped short (``complete`` stays False: the edge ends it with an error,
  as Gemini CLI itself treats such a stream as invalid), unless none of its responses had a
  candidate: a blocked prompt (one ``promptFeedback`` event, then the end, as Google sends it) or
  ``{"candidates": []}`` had nothing to finish and passes as it came.

Without ``alt=sse`` the stream is one JSON array of these objects; that answer is relayed unread
(buffering it to decide would turn the stream into one late body), so only the request side
guards it (:func:`proxy.edge.wire.wire_of`). The SDKs and Gemini CLI always ask for SSE.

JSON (:func:`decide_json`): the same decisions on a whole ``GenerateContentResponse`` (one
candidate). Stop → its ``content.parts`` keep the parts that are neither answer text nor
``functionCall`` (thoughts, code execution), then one ``text`` part: the answer's text, a blank
line and the stop text; ``finishReason: "STOP"``. Runaway → the ``functionCall`` parts past the
cut are removed. Degenerate text is reported only. Anything else is left alone (None: the original
bytes go out).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proxy.config import Config
from proxy.core.actions import Action, Cut
from proxy.dialects import jsonbody
from proxy.response.assemble import AssembledCall
from proxy.response.decide import DEGENERATE_RULE, StopJudge, detect_text, effects_of, runaway_cut
from proxy.response.sse import SSEEvent
from proxy.response.stream_guard import DecidingGuard, Held

#: Members of the first event copied into an event the guard writes itself (scalars only).
_BASE_FIELDS = ("modelVersion", "responseId")


class _NotOurs(Exception):
    """The event is not one this guard reads (module docstring): it stops reading the stream."""


def _candidate(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The one candidate of a response, None when it has none. Raises :class:`_NotOurs` for
    several candidates, another index, or parts that are not a list."""
    candidates = obj.get("candidates")
    if candidates is None:
        return None
    if not isinstance(candidates, list) or len(candidates) > 1:
        raise _NotOurs
    if not candidates:
        return None
    cand = candidates[0]
    if not isinstance(cand, dict) or cand.get("index", 0) != 0:
        raise _NotOurs
    content = cand.get("content")
    if content is not None and not (isinstance(content, dict) and isinstance(content.get("parts", []), list)):
        raise _NotOurs
    return cand


def _parts(cand: dict[str, Any] | None) -> list[Any]:
    content = cand.get("content") if cand is not None else None
    parts = content.get("parts") if isinstance(content, dict) else None
    return parts if isinstance(parts, list) else []


def _call(part: Any) -> dict[str, Any] | None:
    call = part.get("functionCall") if isinstance(part, dict) else None
    return call if isinstance(call, dict) else None


def _text(part: Any) -> tuple[str, bool] | None:
    """A part's text and whether it is a thought, or None when it has no text."""
    if isinstance(part, dict) and isinstance(part.get("text"), str):
        return part["text"], part.get("thought") is True
    return None


def _call_of(call: dict[str, Any], index: int) -> AssembledCall:
    """A ``functionCall`` as the runaway rule and the stop judge read it: its ``args`` serialized
    compactly (``{}`` when absent)."""
    cid, name, args = call.get("id"), call.get("name"), call.get("args")
    return AssembledCall(
        id=cid if isinstance(cid, str) else None,
        name=name if isinstance(name, str) else "",
        arguments=jsonbody.dumps({} if args is None else args).decode(),
        index=index,
    )


def decide_json(raw: bytes, judge: StopJudge | None, cfg: Config) -> tuple[bytes | None, list[Action]]:
    """Decide on a whole ``GenerateContentResponse``. Returns the rewritten body (None = forward
    the original bytes) and the actions taken. A body that is not one answer (not JSON, an
    ``error`` object, the JSON array of a stream, several candidates, none) is left alone:
    ``(None, [])``."""
    try:
        obj = jsonbody.decode(raw)
    except jsonbody.Unreadable:
        return None, []
    if not isinstance(obj, dict) or "error" in obj:
        return None, []
    try:
        cand = _candidate(obj)
    except _NotOurs:
        return None, []
    if cand is None:
        return None, []
    parts = _parts(cand)
    said = [t for t in map(_text, parts) if t is not None]
    text = "".join(t for t, thought in said if not thought)
    thoughts = "".join(t for t, thought in said if thought)
    actions: list[Action] = []
    limit = cfg.response.degenerate_text.min_repeats
    for what, reason in ((text, "content"), (thoughts, "reasoning")):
        repeats = detect_text(what, cfg) if what else None
        if repeats:
            actions.append(Cut(DEGENERATE_RULE, "", repeats, limit, reason, applied=False))
    wire_calls = [c for c in map(_call, parts) if c is not None]
    calls = [_call_of(c, k) for k, c in enumerate(wire_calls)]
    cut = runaway_cut(calls, cfg.response, effects=effects_of(cfg.progress))
    kept = calls[: cut.count] if cut else calls
    if cut:
        actions.append(cut)
    stop = judge(kept, text) if judge is not None and (kept or text) else None
    if stop is not None:
        actions.append(stop)
        answer = f"{text}\n\n{stop.text}" if text.strip() else stop.text
        rest = [p for p in parts if _call(p) is None and not (_text(p) is not None and not _text(p)[1])]  # type: ignore[index]
        cand["content"] = {**cand["content"], "parts": [*rest, {"text": answer}]}
        cand["finishReason"] = "STOP"
        return jsonbody.dumps(obj), actions
    if cut:
        dropped = {id(c) for c in wire_calls[cut.count :]}
        cand["content"] = {**cand["content"], "parts": [p for p in parts if id(_call(p)) not in dropped]}
        return jsonbody.dumps(obj), actions
    return None, actions


@dataclass(slots=True)
class _Held(Held):
    #: the calls (indexes into the answer's calls) of its functionCall parts, in part order
    calls: list[int] = field(default_factory=list)
    finish: bool = False  # it carries the candidate's finishReason


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + jsonbody.dumps(obj) + b"\r\n\r\n"


class GeminiStreamGuard(DecidingGuard):
    """One streamed Gemini answer (the interface of :class:`proxy.response.stream_guard.FramedGuard`)."""

    __slots__ = ("_base", "_candidates", "_decided", "_finished", "_reason", "_responses")

    def __init__(self, cfg: Config, judge: StopJudge | None) -> None:
        super().__init__(cfg, judge)
        self._responses = 0  # the events read (GenerateContentResponse objects)
        self._candidates = False  # one of them had a candidate
        self._decided = False
        self._finished = False  # the finishing event went out
        self._reason: str | None = None  # a cut's finishReason, written into a finishing event
        self._base: dict[str, Any] = {}

    # --- events -----------------------------------------------------------------------------------

    def _event(self, ev: SSEEvent, out: bytearray) -> None:
        if ev.data is None:
            self._hold_or_emit(_Held(ev.raw), False, out)
            return
        held: _Held | None
        try:
            obj = jsonbody.decode(ev.data)
            if not isinstance(obj, dict) or "error" in obj:
                raise _NotOurs
            cand = _candidate(obj)
            held = _Held(ev.raw, obj)
        except (jsonbody.Unreadable, _NotOurs):
            held = None
        if held is None:
            self._relay_rest(ev.raw, out)  # the upstream's error, or not this grammar
            return
        self._responses += 1
        if self._decided or cand is None:
            self._hold_or_emit(held, False, out)
            return
        self._candidates = True
        if not self._base:
            self._base = {k: obj[k] for k in _BASE_FIELDS if isinstance(obj.get(k), str)}
        cut: Cut | None = None
        for part in _parts(cand):
            said = _text(part)
            if said is not None and cut is None:
                cut = self._answer.text(said[0], reasoning=said[1])
            call = _call(part)
            if call is not None:
                held.calls.append(len(self._calls))
                self._calls.append(_call_of(call, len(self._calls)))
        held.finish = isinstance(cand.get("finishReason"), str)
        if cut is not None:
            self.actions.append(cut)
            self._held.append(held)
            self._abort(out, "MAX_TOKENS", set(range(len(self._calls))))
            return
        if held.finish:
            self.complete = True
            self._held.append(held)
            self._decided = True
            self._decide(out)
            return
        self._open = self._open or bool(held.calls)
        self._hold_or_emit(held, bool(held.calls), out)
        if held.calls:
            runaway = self._answer.runaway(self._calls, len(self._calls))
            if runaway is not None:
                self.actions.append(runaway)
                self._abort(out, "STOP", set(range(runaway.count, len(self._calls))))

    def _end_of_stream(self, out: bytearray) -> None:
        """No finishing event came. A stream whose responses carried no candidate at all (a
        blocked prompt: one ``promptFeedback`` event, then the end, as Google sends it; an empty
        ``candidates`` list) had nothing to finish: it is complete as it is. Otherwise it stopped
        short (``complete`` stays False)."""
        super()._end_of_stream(out)
        if self._responses and not self._candidates:
            self.complete = True

    # --- decisions --------------------------------------------------------------------------------

    def _abort(self, out: bytearray, reason: str, drop: set[int]) -> None:
        """A cut mid-stream (``reason``: the ``finishReason`` the agent gets): release what is
        kept, end the answer; the edge closes the upstream."""
        self._reason = reason
        self._settle(out, drop)
        if not self._finished:
            cand = {"finishReason": reason, "index": 0}
            out += _sse({"candidates": [cand], **self._base})
        self._state = "done"
        self.complete = True

    # --- output -----------------------------------------------------------------------------------

    def _write(self, h: _Held, out: bytearray) -> None:
        """The encoder: a held event as the decision left it: without the parts of dropped calls
        (dropped whole when nothing else is left in it), the finishing event with the stop part."""
        self._finished = self._finished or h.finish
        dropped = [c for c in h.calls if c in self._drop]
        ends = h.finish and (self._stop is not None or self._reason is not None)
        if h.obj is None or not (dropped or ends):
            self._emit(h.raw, out)
            return
        self.settled += len(h.raw)
        cand = dict(h.obj["candidates"][0])
        order = iter(h.calls)  # the call of each functionCall part, in part order
        kept = [p for p in _parts(cand) if _call(p) is None or next(order) not in self._drop]
        if h.finish and self._stop is not None:
            text = f"\n\n{self._stop.text}" if self._answer.said.strip() else self._stop.text
            kept.append({"text": text})
            cand["finishReason"] = "STOP"
        elif h.finish and self._reason is not None:
            cand["finishReason"] = self._reason
        if not kept and not h.finish:
            return  # only dropped calls were in it
        content = cand.get("content") if isinstance(cand.get("content"), dict) else {"role": "model"}
        cand["content"] = {**content, "parts": kept}
        out += _sse({**h.obj, "candidates": [cand]})
