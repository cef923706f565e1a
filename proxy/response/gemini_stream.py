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
  other than 0 (``candidateCount`` > 1: which candidate the agent acts on is not known; counted as
  unread, :data:`CANDIDATES`), ``parts`` that is not a list, or an event past
  :data:`proxy.response.stream_guard.MAX_EVENT_BYTES` → everything held is released unchanged and
  the rest of the stream passes through unread.
- Vertex AI's streamed call arguments (``streamFunctionCallArguments``): a ``functionCall`` part
  with ``willContinue: true`` opens a call whose next ``functionCall`` parts are its fragments
  (``partialArgs``: ``jsonPath`` and a typed value) up to the one whose ``willContinue`` is not
  true. Fragments of one call are one call (:class:`_Calls`): their arguments are assembled by
  path, the runaway rule counts the call once it is complete, and a drop drops all its parts.

A stream that ends without ``finishReason`` is released unchanged and stopped short (``complete``
stays False: the edge ends it with an error, as Gemini CLI itself treats such a stream as invalid),
unless none of its responses had a candidate: a blocked prompt (one ``promptFeedback`` event, then
the end, as Google sends it) or ``{"candidates": []}`` had nothing to finish and passes as it came.

Without ``alt=sse`` the stream is one JSON array of these objects (:class:`GeminiArrayGuard`): its
elements are read as they arrive (:mod:`proxy.response.json_array`), each as an SSE event, with the
same holding and decisions, and what the agent gets stays one valid array.

JSON (:func:`decide_json_answer`): the same decisions on a whole ``GenerateContentResponse`` (one
candidate; several, or another index, are left alone and reported, :data:`CANDIDATES`).
Stop → its ``content.parts`` keep the parts that are neither answer text nor
``functionCall`` (thoughts, code execution), then one ``text`` part: the answer's text, a blank
line and the stop text; ``finishReason: "STOP"``. Runaway → the ``functionCall`` parts past the
cut are removed. Degenerate text is reported only. Anything else is left alone (None: the original
bytes go out).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from proxy.config import Config
from proxy.core.actions import Action, Cut
from proxy.dialects import jsonbody
from proxy.response.assemble import AssembledCall
from proxy.response.decide import DEGENERATE_RULE, StopJudge, detect_text, effects_of, runaway_cut
from proxy.response.json_array import JSONArrayFramer
from proxy.response.sse import SSEEvent
from proxy.response.stream_guard import DecidingGuard, Held

#: Members of the first event copied into an event the guard writes itself (scalars only).
_BASE_FIELDS = ("modelVersion", "responseId")


#: Why an answer went out unread (``unguarded_responses{reason}``): it has several candidates, or
#: a candidate other than the first (``candidateCount`` > 1), and which one the agent acts on is
#: not known.
CANDIDATES = "candidates"


class _NotOurs(Exception):
    """The event is not one this guard reads (module docstring): it stops reading the stream.
    ``reason``: why the answer is counted as unread (:data:`CANDIDATES`), None for what is no
    answer at all (the upstream's error, not this grammar)."""

    def __init__(self, reason: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason


def _candidate(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The one candidate of a response, None when it has none. Raises :class:`_NotOurs` for
    several candidates, another index (reason :data:`CANDIDATES`), or parts that are not a list."""
    candidates = obj.get("candidates")
    if candidates is None:
        return None
    if not isinstance(candidates, list):
        raise _NotOurs
    if len(candidates) > 1:
        raise _NotOurs(CANDIDATES)
    if not candidates:
        return None
    cand = candidates[0]
    if not isinstance(cand, dict):
        raise _NotOurs
    if cand.get("index", 0) != 0:
        raise _NotOurs(CANDIDATES)
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


#: A step of a ``partialArgs`` JSON path (RFC 9535, as Vertex writes them): ``.name``, ``[N]``,
#: ``['name']`` or ``["name"]``.
_STEP = re.compile(r"""\.([A-Za-z_][\w-]*)|\[(\d+)\]|\['((?:[^'\\]|\\.)*)'\]|\["((?:[^"\\]|\\.)*)"\]""")
#: The value members of a ``PartialArg`` (one of them is set).
_VALUES = ("stringValue", "numberValue", "boolValue", "nullValue")
#: The largest array index a path may name (a hostile ``$.a[100000000]`` builds no huge list).
_MAX_INDEX = 4096


def _path(json_path: Any) -> list[str | int] | None:
    """The steps of a ``partialArgs`` ``jsonPath`` (``$.files[0].path`` → ``["files", 0,
    "path"]``), None when it is not one this reads."""
    if not isinstance(json_path, str) or not json_path.startswith("$"):
        return None
    steps: list[str | int] = []
    i = 1
    while i < len(json_path):
        m = _STEP.match(json_path, i)
        if m is None:
            return None
        if m.group(2) is not None:
            steps.append(int(m.group(2)))
        else:
            steps.append(next(g for g in (m.group(1), m.group(3), m.group(4)) if g is not None))
        i = m.end()
    return steps or None


def _put(obj: dict[str, Any], steps: list[str | int], value: Any, append: bool) -> None:
    """Set ``value`` at ``steps`` in ``obj`` (objects and arrays made as the steps need them);
    ``append``: a string value continues the string already there. A step that does not fit
    (an index into an object, a name into an array, an index past :data:`_MAX_INDEX`) sets
    nothing."""
    if any(isinstance(k, int) and k > _MAX_INDEX for k in steps):
        return
    cur: Any = obj
    for k, nxt in zip(steps, [*steps[1:], None], strict=True):
        if isinstance(k, int) and not isinstance(cur, list):
            return
        if isinstance(k, str) and not isinstance(cur, dict):
            return
        if isinstance(cur, list):
            assert isinstance(k, int)
            cur.extend([None] * (k + 1 - len(cur)))
        if nxt is None:
            old = cur[k] if isinstance(cur, list) else cur.get(k)
            cur[k] = old + value if append and isinstance(old, str) and isinstance(value, str) else value
            return
        child = cur[k] if isinstance(cur, list) else cur.get(k)
        if not isinstance(child, (dict, list)):
            child = [] if isinstance(nxt, int) else {}
            cur[k] = child
        cur = child


class _Building:
    """A call whose arguments stream in fragments (Vertex AI's ``streamFunctionCallArguments``):
    the first ``functionCall`` part names it (``name``, ``willContinue: true``), the next ones
    carry ``partialArgs`` (``jsonPath`` and one of ``stringValue``, ``numberValue``, ``boolValue``,
    ``nullValue``; a string whose ``willContinue`` is true goes on in the next fragment for that
    path), and the part whose ``willContinue`` is not true (often an empty ``functionCall: {}``)
    ends it. ``args``: the arguments so far; ``open``: more fragments are to come."""

    __slots__ = ("args", "continuing", "id", "name", "open")

    def __init__(self) -> None:
        self.id: str | None = None
        self.name = ""
        self.args: dict[str, Any] = {}
        self.continuing: set[str] = set()  # paths whose string goes on in the next fragment
        self.open = False

    def merge(self, call: dict[str, Any]) -> None:
        cid, name, args = call.get("id"), call.get("name"), call.get("args")
        if self.id is None and isinstance(cid, str):
            self.id = cid
        if not self.name and isinstance(name, str):
            self.name = name
        if isinstance(args, dict):
            self.args.update(args)
        partial = call.get("partialArgs")
        for arg in partial if isinstance(partial, list) else ():
            if not isinstance(arg, dict):
                continue
            key = next((k for k in _VALUES if k in arg), None)
            where = arg.get("jsonPath")
            if key is None or not isinstance(where, str):
                continue
            value = None if key == "nullValue" else arg[key]
            steps = _path(where) or [where]  # a path this does not read: its own top-level member
            _put(self.args, steps, value, append=where in self.continuing)
            if arg.get("willContinue") is True:
                self.continuing.add(where)
            else:
                self.continuing.discard(where)
        self.open = call.get("willContinue") is True


class _Calls:
    """The calls of one answer, read from its ``functionCall`` parts in order (:meth:`feed`):
    a part is a whole call, or a fragment of the call still open (:class:`_Building`); fragments
    of one call are one call. ``calls``: each as the rules read it (fragments: the arguments
    assembled so far); ``complete``: how many of them are complete (all but an open one)."""

    __slots__ = ("_building", "_open", "calls")

    def __init__(self) -> None:
        self.calls: list[AssembledCall] = []
        self._building: _Building | None = None
        self._open = False

    @property
    def complete(self) -> int:
        return len(self.calls) - (1 if self._open else 0)

    def feed(self, call: dict[str, Any]) -> int:
        """Read one ``functionCall``; returns the index of the call it belongs to."""
        if not self._open and call.get("willContinue") is not True and "partialArgs" not in call:
            self.calls.append(_call_of(call, len(self.calls)))
            return len(self.calls) - 1
        if not self._open:
            self._building = _Building()
            self.calls.append(AssembledCall(index=len(self.calls)))
        b = self._building
        assert b is not None
        b.merge(call)
        index = len(self.calls) - 1
        self.calls[index] = AssembledCall(
            id=b.id, name=b.name, arguments=jsonbody.dumps(b.args).decode(), index=index
        )
        self._open = b.open
        return index


def decide_json(raw: bytes, judge: StopJudge | None, cfg: Config) -> tuple[bytes | None, list[Action]]:
    """:func:`decide_json_answer` without the reason it went unread."""
    new, actions, _ = decide_json_answer(raw, judge, cfg)
    return new, actions


def decide_json_answer(
    raw: bytes, judge: StopJudge | None, cfg: Config
) -> tuple[bytes | None, list[Action], str | None]:
    """Decide on a whole ``GenerateContentResponse``. Returns the rewritten body (None = forward
    the original bytes), the actions taken, and why the answer went unread (:data:`CANDIDATES`:
    several candidates, or one other than the first; None). A body that is not one answer (not
    JSON, an ``error`` object, the JSON array of a stream, several candidates, none) is left
    alone: ``(None, [], reason)``."""
    try:
        obj = jsonbody.decode(raw)
    except jsonbody.Unreadable:
        return None, [], None
    if not isinstance(obj, dict) or "error" in obj:
        return None, [], None
    try:
        cand = _candidate(obj)
    except _NotOurs as exc:
        return None, [], exc.reason
    if cand is None:
        return None, [], None
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
    read = _Calls()
    of_part = {id(p): read.feed(c) for p in parts if (c := _call(p)) is not None}  # part → its call
    calls = read.calls
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
        return jsonbody.dumps(obj), actions, None
    if cut:
        kept_parts = [p for p in parts if of_part.get(id(p), -1) < cut.count]
        cand["content"] = {**cand["content"], "parts": kept_parts}
        return jsonbody.dumps(obj), actions, None
    return None, actions, None


@dataclass(slots=True)
class _Held(Held):
    #: the calls (indexes into the answer's calls) of its functionCall parts, in part order
    calls: list[int] = field(default_factory=list)
    finish: bool = False  # it carries the candidate's finishReason


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + jsonbody.dumps(obj) + b"\r\n\r\n"


class GeminiStreamGuard(DecidingGuard):
    """One streamed Gemini answer (the interface of :class:`proxy.response.stream_guard.FramedGuard`)."""

    __slots__ = ("_base", "_candidates", "_decided", "_finished", "_read", "_reason", "_responses")

    def __init__(self, cfg: Config, judge: StopJudge | None) -> None:
        super().__init__(cfg, judge)
        self._responses = 0  # the events read (GenerateContentResponse objects)
        self._candidates = False  # one of them had a candidate
        self._decided = False
        self._finished = False  # the finishing event went out
        self._reason: str | None = None  # a cut's finishReason, written into a finishing event
        self._base: dict[str, Any] = {}
        self._read = _Calls()  # the answer's calls, fragments of one call as one
        self._calls = self._read.calls

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
        except jsonbody.Unreadable:
            held = None
        except _NotOurs as exc:
            held = None
            self.unread = self.unread or exc.reason  # an answer the agent may act on, unread: counted
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
                held.calls.append(self._read.feed(call))
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
            runaway = self._answer.runaway(self._calls, self._read.complete)
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
            self._write_new({"candidates": [cand], **self._base}, out)
        self._end(out)
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
            self._write_raw(h.raw, out)
            return
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
            self._write_dropped(h.raw, out)  # only dropped calls were in it
            return
        content = cand.get("content") if isinstance(cand.get("content"), dict) else {"role": "model"}
        cand["content"] = {**content, "parts": kept}
        self._write_rewritten(h.raw, {**h.obj, "candidates": [cand]}, out)

    # --- the framing: SSE events here, elements of a JSON array in GeminiArrayGuard -----------------

    def _write_raw(self, raw: bytes, out: bytearray) -> None:
        """An event as it came."""
        self._emit(raw, out)

    def _write_rewritten(self, raw: bytes, obj: dict[str, Any], out: bytearray) -> None:
        """The event ``raw`` as ``obj``."""
        self.settled += len(raw)
        out += _sse(obj)

    def _write_dropped(self, raw: bytes, out: bytearray) -> None:
        """The event ``raw`` left out."""
        self.settled += len(raw)

    def _write_new(self, obj: dict[str, Any], out: bytearray) -> None:
        """An event of the guard's own (no upstream bytes)."""
        out += _sse(obj)

    def _end(self, out: bytearray) -> None:
        """After a cut: what ends the answer's framing (nothing for SSE)."""


class GeminiArrayGuard(GeminiStreamGuard):
    """One Gemini answer streamed as a JSON array (``:streamGenerateContent`` without ``alt=sse``):
    its elements are read as the SSE form's events (:mod:`proxy.response.json_array`), with the
    same holding and decisions. What it writes stays one valid array: an element it rewrites keeps
    the separator before it, an element left out takes its separator with it (the ``[`` of the
    first stays), and after a cut the array is closed (``]``). The agent gets the upstream's bytes
    exactly when nothing is decided."""

    __slots__ = ("_opened", "_written")

    def __init__(self, cfg: Config, judge: StopJudge | None) -> None:
        super().__init__(cfg, judge)
        self._framer = JSONArrayFramer()  # type: ignore[assignment]
        self._opened = False  # the "[" went out
        self._written = 0  # elements that went out

    def _separator(self) -> bytes:
        """What goes before the next element written, and it counts as written."""
        sep = (b"" if self._opened else b"[") + (b"," if self._written else b"")
        self._opened, self._written = True, self._written + 1
        return sep

    def _write_raw(self, raw: bytes, out: bytearray) -> None:
        head = raw[: len(raw) - len(raw.lstrip(b" \t\r\n"))]
        lead = raw[len(head) : len(head) + 1]
        if (
            lead in (b"[", b",")
            and (lead == b"[") is (not self._opened)
            and (lead == b",") is bool(self._written)
        ):
            self._opened, self._written = True, self._written + 1
            self._emit(raw, out)  # its own separator is the right one: byte for byte
            return
        if lead not in (b"[", b","):  # no element (the end of a broken array): as it came
            self._emit(raw, out)
            return
        self.settled += len(raw)
        out += self._separator() + raw[len(head) + 1 :]

    def _write_rewritten(self, raw: bytes, obj: dict[str, Any], out: bytearray) -> None:
        self.settled += len(raw)
        out += self._separator() + jsonbody.dumps(obj)

    def _write_dropped(self, raw: bytes, out: bytearray) -> None:
        self.settled += len(raw)
        if not self._opened:
            self._opened = True
            out += b"["

    def _write_new(self, obj: dict[str, Any], out: bytearray) -> None:
        out += self._separator() + jsonbody.dumps(obj)

    def _end(self, out: bytearray) -> None:
        out += b"]" if self._opened else b"[]"

    def _relay_rest(self, raw: bytes, out: bytearray) -> None:
        self.complete = True
        self._give_up(out)
        self._write_raw(raw, out)

    def _end_of_stream(self, out: bytearray) -> None:
        """No finishing element came: everything goes out unchanged; the answer is whole when the
        array was closed (an answer without candidates, a blocked prompt's ``promptFeedback``)."""
        super()._end_of_stream(out)
        framer = self._framer
        self.complete = isinstance(framer, JSONArrayFramer) and framer.closed
