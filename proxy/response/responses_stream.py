"""The response side of the OpenAI Responses API, sans-I/O: a ``response`` object (JSON)
or its SSE events in, what the agent receives out. The decisions are the shared ones
(:class:`proxy.response.answer.AnswerState`: the stop judge, the runaway cut, degenerate text), and
so are the framing, the holding and the byte accounting (:class:`proxy.response.stream_guard.
FramedGuard`); this module is the wire: its decoder (``_event``, ``_track``) and encoder
(``_write``, the stop message, the endings).

SSE (:class:`ResponsesStreamGuard`): frames are ``event: <type>`` + ``data: {"type": <type>,
"sequence_number": n, …}``; there is no ``[DONE]``. Events go to the agent as their exact upstream
bytes as soon as they are complete, except that from a call's ``response.output_item.added``
(item ``function_call`` / ``custom_tool_call``) on, **events are held** (its argument deltas,
``.done``, ``output_item.done``, and everything after, to keep the order) until the decision at
``response.completed``.

- Nothing decided → the held bytes are released unchanged.
- **Stop** → the held call items' events are dropped; a new assistant ``message`` item carrying
  the stop text is emitted (``output_item.added``, ``content_part.added``,
  ``output_text.delta``, ``output_text.done``, ``content_part.done``, ``output_item.done``), and
  ``response.completed`` lists the items the agent saw plus that message, no call items.
- **Runaway** (too many calls, or too many identical ones, in one response) → as soon as a call
  past the limit starts (or an identical one completes), the upstream is closed; the kept calls'
  events are released and a ``response.completed`` listing exactly the items kept ends the stream.
- **Degenerate text** (:mod:`proxy.response.degenerate`, in ``output_text`` or reasoning deltas) → the
  upstream is closed; held call events are dropped and ``response.incomplete``
  (``incomplete_details.reason: "max_output_tokens"``) ends the stream.
- Once anything is dropped or inserted, every event after it is re-serialized with
  ``sequence_number`` renumbered (strictly increasing, no gaps from there) and ``output_index``
  mapped to the items the agent saw (the SDK's stream accumulator indexes its output list by it).
- ``response.incomplete``, ``response.failed``, ``error``, an event that is not JSON or has no
  ``type``, or an event past :data:`proxy.response.stream_guard.MAX_EVENT_BYTES` → everything held is
  released unchanged and the rest of the stream passes through unread.

JSON (:func:`decide_json`): the same decisions on a whole ``response`` object. Stop → its
``output`` keeps the items that are neither calls nor assistant messages, then one assistant
message with one ``output_text`` part: the answer's text, a blank line and the stop text.

The framing, the states and the byte accounting for fail-open are
:class:`proxy.response.stream_guard.FramedGuard`'s, shared with the chat stream guard.
"""

from __future__ import annotations

import contextlib
import itertools
import zlib
from dataclasses import dataclass
from typing import Any

from proxy.config import Config
from proxy.core.actions import Action, Cut, Stop
from proxy.dialects import jsonbody
from proxy.dialects.openai_responses import Answer, answer_of
from proxy.response.assemble import AssembledCall
from proxy.response.decide import DEGENERATE_RULE, StopJudge, detect_text, effects_of, runaway_cut
from proxy.response.sse import SSEEvent, SSEFramer
from proxy.response.stream_guard import MAX_EVENT_BYTES, DecidingGuard, Held

CALL_ITEMS = frozenset(("function_call", "custom_tool_call"))
_ARG_DELTAS = frozenset(("response.function_call_arguments.delta", "response.custom_tool_call_input.delta"))
_ARG_DONE = frozenset(("response.function_call_arguments.done", "response.custom_tool_call_input.done"))
_REASONING_DELTAS = frozenset(("response.reasoning_text.delta", "response.reasoning_summary_text.delta"))
#: Events after which the upstream says no more: released as they are.
_ENDS = frozenset(("response.incomplete", "response.failed", "error"))
_ids = itertools.count(1)


def _call_of(item: dict[str, Any], index: int | None = None) -> AssembledCall:
    raw = item.get("arguments") if item.get("type") == "function_call" else item.get("input")
    name = item.get("name")
    cid = item.get("call_id")
    return AssembledCall(
        id=cid if isinstance(cid, str) else None,
        name=name if isinstance(name, str) else "",
        arguments=raw if isinstance(raw, str) else "",
        index=index,
    )


def _message_text(item: dict[str, Any]) -> str:
    content = item.get("content")
    if not isinstance(content, list):
        return ""
    return "".join(
        p["text"]
        for p in content
        if isinstance(p, dict) and p.get("type") == "output_text" and isinstance(p.get("text"), str)
    )


def stop_message(text: str, item_id: str | None = None) -> dict[str, Any]:
    """The assistant ``message`` item carrying ``text`` (status completed)."""
    return {
        "id": item_id or f"msg_loopguard_{next(_ids)}",
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _without_calls(output: list[Any], drop: set[int]) -> list[Any]:
    """``output`` without the call items whose ordinal among the call items is in ``drop``
    (ordinals, not ``call_id``: a model repeating itself may repeat the id too)."""
    kept: list[Any] = []
    k = -1
    for item in output:
        if isinstance(item, dict) and item.get("type") in CALL_ITEMS:
            k += 1
            if k in drop:
                continue
        kept.append(item)
    return kept


def _is_assistant_message(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type") == "message" and item.get("role") == "assistant"


def decide_json(raw: bytes, judge: StopJudge | None, cfg: Config) -> tuple[bytes | None, list[Action]]:
    """Decide on a whole ``response`` object. Returns the rewritten body (None = forward the
    original bytes) and the actions taken. A body that is not a response is left alone."""
    new, actions, _ = decide_json_answer(raw, judge, cfg)
    return new, actions


def decide_json_answer(
    raw: bytes, judge: StopJudge | None, cfg: Config
) -> tuple[bytes | None, list[Action], Answer | None]:
    """:func:`decide_json`, and the :class:`proxy.request.response_store.Answer` the agent gets (None when
    the body is not a response the store keeps)."""
    try:
        obj = jsonbody.decode(raw)
    except jsonbody.Unreadable:
        return None, [], None
    if not isinstance(obj, dict) or not isinstance(obj.get("output"), list):
        return None, [], None
    upstream = obj["output"]
    new, actions = _decide_object(obj, judge, cfg)  # a rewrite replaces obj["output"]
    return new, actions, answer_of(obj, upstream if new is not None else None)


def _decide_object(
    obj: dict[str, Any], judge: StopJudge | None, cfg: Config
) -> tuple[bytes | None, list[Action]]:
    output: list[Any] = obj["output"]
    actions: list[Action] = []
    call_items = [i for i in output if isinstance(i, dict) and i.get("type") in CALL_ITEMS]
    calls = [_call_of(item, k) for k, item in enumerate(call_items)]
    text = "".join(_message_text(i) for i in output if _is_assistant_message(i))
    repeats = detect_text(text, cfg) if text else None
    if repeats:
        actions.append(
            Cut(DEGENERATE_RULE, "", repeats, cfg.response.degenerate_text.min_repeats, "content", False)
        )
    cut = runaway_cut(calls, cfg.response, effects=effects_of(cfg.progress))
    kept = calls[: cut.count] if cut else calls
    if cut:
        actions.append(cut)
    stop = judge(kept, text) if judge is not None else None
    if stop is not None:
        actions.append(stop)
        said = f"{text}\n\n{stop.text}" if text.strip() else stop.text
        rest = [
            i
            for i in output
            if not (isinstance(i, dict) and i.get("type") in CALL_ITEMS) and not _is_assistant_message(i)
        ]
        obj["output"] = [*rest, stop_message(said)]
        obj["status"] = "completed"
        return jsonbody.dumps(obj), actions
    if cut:
        dropped = {id(i) for i in call_items[cut.count :]}
        obj["output"] = [i for i in output if id(i) not in dropped]
        return jsonbody.dumps(obj), actions
    return None, actions


@dataclass(slots=True)
class _Held(Held):
    call: int | None = None  # index into the calls of the call item this event belongs to


class ResponsesStreamGuard(DecidingGuard):
    """One streamed Responses answer (the interface of :class:`proxy.response.stream_guard.FramedGuard`)."""

    __slots__ = (
        "_base",
        "_client_items",
        "_done_calls",
        "_index_map",
        "_item_call",
        "_items",
        "_renumber",
        "_seq",
        "answer",
    )

    def __init__(self, cfg: Config, judge: StopJudge | None) -> None:
        super().__init__(cfg, judge)
        self._item_call: dict[Any, int] = {}  # item id / output_index → call index
        self._done_calls = 0
        self._items: dict[int, dict[str, Any]] = {}  # upstream output_index → finished item
        self._base: dict[str, Any] = {}
        self._seq: int | None = None  # the last sequence_number the agent got
        self._renumber = False
        self._client_items = 0  # output items the agent has seen added
        self._index_map: dict[int, int] = {}  # upstream output_index → the agent's
        #: the answer as the agent gets it, once its final event is decided (proxy.request.response_store)
        self.answer: Answer | None = None

    # --- events -----------------------------------------------------------------------------------

    def _event(self, ev: SSEEvent, out: bytearray) -> None:
        if ev.data is None:  # a comment (``: ping``), a stray blank line, ``id:``/``retry:`` alone
            self._hold_or_emit(_Held(ev.raw), False, out)
            return
        try:
            obj = jsonbody.decode(ev.data)
        except jsonbody.Unreadable:
            obj = None
        kind = obj.get("type") if isinstance(obj, dict) else None
        if not isinstance(kind, str):
            self._relay_rest(ev.raw, out)  # not an event of this grammar
            return
        assert isinstance(obj, dict)
        if kind in ("response.created", "response.in_progress") and isinstance(obj.get("response"), dict):
            self._base = obj["response"]
        call = self._track(kind, obj)
        if kind in _ENDS:
            self.answer = answer_of(obj.get("response"))
            self._relay_rest(ev.raw, out)
            return
        held = _Held(ev.raw, obj, call)
        if kind == "response.completed":
            self.complete = True
            self._held.append(held)
            upstream = obj.get("response")
            self._decide(out)
            self._state = "pass"
            mine = obj.get("response")
            changed = mine is not upstream and isinstance(upstream, dict)
            self.answer = answer_of(mine, upstream.get("output") if changed else None)
            return
        self._open = self._open or call is not None
        self._hold_or_emit(held, call is not None, out)
        cut = self._text_cut(kind, obj)
        if cut is not None:
            self.actions.append(cut)
            self._abort_incomplete(out)
            return
        if call is not None and kind in ("response.output_item.added", "response.output_item.done"):
            runaway = self._runaway()
            if runaway is not None:
                self._abort_runaway(runaway, out)

    def _track(self, kind: str, obj: dict[str, Any]) -> int | None:
        """Follow the call items; returns the index of the call this event belongs to."""
        item = obj.get("item")
        if kind in ("response.output_item.added", "response.output_item.done") and isinstance(item, dict):
            oi = obj.get("output_index")
            if item.get("type") not in CALL_ITEMS:
                if kind == "response.output_item.done" and isinstance(oi, int):
                    self._items[oi] = item
                return None
            if kind == "response.output_item.added":
                k = len(self._calls)
                self._calls.append(_call_of(item, k))
                self._item_call[item.get("id")] = k
                self._item_call[("oi", oi)] = k
                return k
            k = self._item_call.get(item.get("id"), self._item_call.get(("oi", oi)))
            if k is None:
                return None
            self._calls[k] = _call_of(item, k)
            self._done_calls += 1
            if isinstance(oi, int):
                self._items[oi] = item
            return k
        if kind in _ARG_DELTAS or kind in _ARG_DONE:
            k = self._item_call.get(obj.get("item_id"), self._item_call.get(("oi", obj.get("output_index"))))
            if k is None:
                return None
            c = self._calls[k]
            if kind in _ARG_DONE:
                full = obj.get("arguments", obj.get("input"))
                if isinstance(full, str):
                    c.arguments = full
            elif isinstance(obj.get("delta"), str) and isinstance(c.arguments, str):
                c.arguments += obj["delta"]
            return k
        return None

    def _text_cut(self, kind: str, obj: dict[str, Any]) -> Cut | None:
        delta = obj.get("delta")
        if not isinstance(delta, str):
            return None
        if kind == "response.output_text.delta":
            return self._answer.text(delta)
        if kind in _REASONING_DELTAS:
            return self._answer.text(delta, reasoning=True)
        return None

    def _runaway(self) -> Cut | None:
        return self._answer.runaway(self._calls, self._done_calls)

    # --- decisions --------------------------------------------------------------------------------

    def _abort_runaway(self, cut: Cut, out: bytearray) -> None:
        self.actions.append(cut)
        drop = set(range(cut.count, len(self._calls)))
        self._settle(out, drop)
        output = _without_calls([item for _, item in sorted(self._items.items())], drop)
        self._renumber = True
        response = {**self._base, "status": "completed", "output": output}
        self._synth({"type": "response.completed", "response": response}, out)
        self.answer = answer_of(response)  # what the upstream kept of a closed stream: unknown
        self._end()

    def _abort_incomplete(self, out: bytearray) -> None:
        self._settle(out, drop=set(range(len(self._calls))))
        output = [item for _, item in sorted(self._items.items()) if item.get("type") not in CALL_ITEMS]
        response = {
            **self._base,
            "status": "incomplete",
            "incomplete_details": {"reason": "max_output_tokens"},
            "output": output,
        }
        self._renumber = True
        self._synth({"type": "response.incomplete", "response": response}, out)
        self.answer = answer_of(response)
        self._end()

    def _end(self) -> None:
        self._state = "done"
        self.complete = True

    # --- output -----------------------------------------------------------------------------------

    @staticmethod
    def _is(h: _Held, kind: str) -> bool:
        return h.obj is not None and h.obj.get("type") == kind

    def _write(self, h: _Held, out: bytearray) -> None:
        """The encoder: a held event as the decision left it. The events of dropped calls are
        left out (the agent's output indexes shift from there); before ``response.completed``
        the stop message, and that event's output lists what the agent got."""
        if h.call is not None and h.call in self._drop:
            self.settled += len(h.raw)
            self._renumber = True
            return
        if (self._drop or self._stop) and self._is(h, "response.completed") and h.obj is not None:
            message = self._emit_stop(self._stop, out) if self._stop is not None else None
            response = h.obj.get("response")
            if isinstance(response, dict):
                response = dict(response)
                output = response.get("output") if isinstance(response.get("output"), list) else []
                stop_items = [message] if message is not None else []
                response["output"] = [*_without_calls(output, self._drop), *stop_items]
                h.obj["response"] = response
            self._renumber = True
        self._emit_event(h, out)

    def _emit_event(self, h: _Held, out: bytearray) -> None:
        obj = h.obj
        if obj is None:
            self._emit(h.raw, out)
            return
        oi = obj.get("output_index")
        if obj.get("type") == "response.output_item.added" and isinstance(oi, int):
            self._index_map[oi] = self._client_items
            self._client_items += 1
        if not self._renumber:
            seq = obj.get("sequence_number")
            self._seq = seq if isinstance(seq, int) else self._seq
            self._emit(h.raw, out)
            return
        obj = dict(obj)
        if isinstance(oi, int):
            obj["output_index"] = self._index_map.get(oi, oi)
        self.settled += len(h.raw)
        self._write_obj(obj, out)

    def _synth(self, obj: dict[str, Any], out: bytearray) -> None:
        self._write_obj(obj, out)

    def _write_obj(self, obj: dict[str, Any], out: bytearray) -> None:
        if "sequence_number" in obj or self._seq is not None:
            self._seq = 0 if self._seq is None else self._seq + 1
            obj["sequence_number"] = self._seq
        out += b"event: " + str(obj.get("type", "")).encode() + b"\ndata: " + jsonbody.dumps(obj) + b"\n\n"

    def _emit_stop(self, stop: Stop, out: bytearray) -> dict[str, Any]:
        """The stop message's events; returns its finished item."""
        self._renumber = True
        text = f"\n\n{stop.text}" if self._answer.said.strip() else stop.text
        item = stop_message(text)
        iid = item["id"]
        oi = self._client_items
        self._client_items += 1
        part = {"type": "output_text", "text": "", "annotations": []}
        added = {**item, "status": "in_progress", "content": []}
        for ev in (
            {"type": "response.output_item.added", "output_index": oi, "item": added},
            {
                "type": "response.content_part.added",
                "item_id": iid,
                "output_index": oi,
                "content_index": 0,
                "part": part,
            },
            {
                "type": "response.output_text.delta",
                "item_id": iid,
                "output_index": oi,
                "content_index": 0,
                "delta": text,
                "logprobs": [],
            },
            {
                "type": "response.output_text.done",
                "item_id": iid,
                "output_index": oi,
                "content_index": 0,
                "text": text,
                "logprobs": [],
            },
            {
                "type": "response.content_part.done",
                "item_id": iid,
                "output_index": oi,
                "content_index": 0,
                "part": {**part, "text": text},
            },
            {"type": "response.output_item.done", "output_index": oi, "item": item},
        ):
            self._write_obj(
                {"type": ev["type"], "sequence_number": 0, **{k: v for k, v in ev.items() if k != "type"}},
                out,
            )
        return item


_FINAL = frozenset(("response.completed", "response.incomplete"))
#: The largest JSON answer :class:`ResponseCapture` reads (bytes, decompressed); past it, nothing.
MAX_CAPTURE_BYTES = 64 * 1024 * 1024


class ResponseCapture:
    """Reads a Responses answer the response side does not guard (its checks all off, or a body
    compressed with ``gzip``/``deflate``), only to learn its :class:`proxy.request.response_store.Answer`
    (``answer``): the bytes are relayed unchanged by the caller, this never holds or changes any.
    SSE (``sse``): the ``response.completed`` / ``response.incomplete`` event; JSON: the whole
    body, decoded at :meth:`finish`. Another encoding, an event past
    :data:`proxy.response.stream_guard.MAX_EVENT_BYTES` or a body past :data:`MAX_CAPTURE_BYTES`: no answer.
    """

    __slots__ = ("_body", "_framer", "_inflate", "_off", "answer", "complete")

    def __init__(self, sse: bool, encoding: str | None = None) -> None:
        self._framer = SSEFramer() if sse else None
        self._body = bytearray()
        self._off = False
        self._inflate: Any = None
        enc = (encoding or "").strip().lower()
        if enc in ("gzip", "x-gzip", "deflate"):
            self._inflate = zlib.decompressobj(47 if enc != "deflate" else zlib.MAX_WBITS)
        elif enc not in ("", "identity"):
            self._off = True
        self.answer: Answer | None = None
        #: the answer's final event was read (the agent has the whole answer once it has the bytes)
        self.complete = False

    def feed(self, chunk: bytes) -> None:
        if self._off or self.answer is not None:
            return
        if self._inflate is not None:
            chunk = self._inflate.decompress(chunk)
        if self._framer is None:
            self._body += chunk
            if len(self._body) > MAX_CAPTURE_BYTES:
                self._off = True
                self._body.clear()
            return
        self._read(self._framer.feed(chunk))
        if self._framer.pending > MAX_EVENT_BYTES:
            self._off = True

    def _read(self, events: list[SSEEvent]) -> None:
        for ev in events:
            if ev.data is None or (ev.event is not None and ev.event not in _FINAL):
                continue  # named events other than the final ones are not decoded
            try:
                obj = jsonbody.decode(ev.data)
            except jsonbody.Unreadable:
                continue
            if isinstance(obj, dict) and obj.get("type") in _FINAL:
                self.complete = True
                self.answer = answer_of(obj.get("response"))
                return

    def finish(self) -> None:
        """The body ended (JSON: decode it; SSE: its last event, when a bare CR ended it)."""
        if self._off or self.answer is not None:
            return
        if self._framer is not None:
            if self._inflate is not None:
                self._read(self._framer.feed(self._inflate.flush()))
            self._read(self._framer.end())
            return
        if self._inflate is not None:
            self._body += self._inflate.flush()
        with contextlib.suppress(jsonbody.Unreadable):
            self.answer = answer_of(jsonbody.decode(bytes(self._body)))
        self._body.clear()
        self._off = self.complete = True
