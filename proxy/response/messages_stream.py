"""The response side of the Anthropic Messages API, sans-I/O: a ``message`` object (JSON)
or its SSE events in, what the agent receives out. The decisions are the shared ones
(:class:`proxy.response.answer.AnswerState`: the stop judge, the runaway cut, degenerate text), and
so are the framing, the holding and the byte accounting (:class:`proxy.response.stream_guard.
FramedGuard`); this module is the wire: its decoder (``_event``, ``_track``) and encoder
(``_write``, the stop block, the endings).

The grammar (Anthropic's streaming reference, checked against the official ``anthropic`` SDK's
``accumulate_event``): frames are ``event: <type>`` + ``data: {"type": <type>, …}``:
``message_start`` (``message``, its ``usage``), then per content block ``content_block_start``
(``index``, ``content_block``: ``text``, ``thinking``, ``redacted_thinking``, ``tool_use`` with
``id``, ``name``, ``input: {}``, ``server_tool_use``, …), ``content_block_delta`` (``text_delta``,
``thinking_delta``, ``signature_delta``, ``input_json_delta`` whose ``partial_json`` pieces make the
tool input, the first often ``""``), ``content_block_stop``; then ``message_delta``
(``delta.stop_reason``, ``usage.output_tokens``) and ``message_stop``; ``ping`` and ``error``
anywhere. Blocks are streamed one after another. The SDK appends a block at each
``content_block_start`` and finds it by ``index`` for its deltas, so the indexes the agent sees
must be 0, 1, 2, … in start order; every ``message_delta`` must carry ``usage.output_tokens``.

SSE (:class:`MessagesStreamGuard`): events go to the agent as their exact upstream bytes as soon as
they are complete, except that from the first ``tool_use`` block's ``content_block_start`` on,
**events are held** (its deltas and stop, and everything after, pings included, to keep the order)
until the decision at ``message_delta`` (or at ``message_stop`` when no ``message_delta`` came).
A tool call is the ``tool_use`` block's ``id``, ``name`` and its ``partial_json`` pieces joined (the
start's ``input`` when no piece came); it is complete at its ``content_block_stop``.

- Nothing decided → the held bytes are released unchanged.
- **Stop** → the held ``tool_use`` blocks' events are dropped; a ``text`` block carrying the stop
  text (after a blank line when the answer said something) is emitted before ``message_delta``,
  whose ``stop_reason`` becomes ``"end_turn"``. Indexes of the blocks after a dropped one are
  renumbered so the agent sees 0, 1, 2, …; an event whose index does not change keeps its bytes.
- **Runaway** (too many calls, or too many identical ones, in one answer) → as soon as a call past
  the limit starts (or an identical one completes), the upstream is closed; the kept blocks' events
  are released, and ``message_delta`` (``stop_reason: "tool_use"``) and ``message_stop`` end the
  stream.
- **Degenerate text** (:mod:`proxy.response.degenerate`, in ``text_delta`` or ``thinking_delta``) →
  the upstream is closed; held ``tool_use`` blocks are dropped, the open block gets its
  ``content_block_stop``, and ``message_delta`` (``stop_reason: "max_tokens"``) and
  ``message_stop`` end the stream.
- An ``error`` event, an event that is not JSON or has no ``type``, an ``event:`` name that is not
  its data's ``type``, or a break of the grammar above (a delta or stop for a block never started
  or already stopped, a block index started twice, a non-integer index, a block before
  ``message_start``, a non-string ``partial_json``), or an event past
  :data:`proxy.response.stream_guard.MAX_EVENT_BYTES` → everything held is released unchanged and
  the rest of the stream passes through unread. Unknown event types and block types pass (held in
  order while holding).

JSON (:func:`decide_json`): the same decisions on a whole ``message`` object. Stop → its
``content`` keeps the blocks that are neither ``text`` nor ``tool_use`` (thinking, server tools),
then one ``text`` block: the answer's text, a blank line and the stop text; ``stop_reason:
"end_turn"``. Runaway → the ``tool_use`` blocks past the cut are removed (``stop_reason`` stays
``"tool_use"``). Degenerate text is reported only. Anything else is left alone (None: the
original bytes go out).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.config import Config
from proxy.core.actions import Action, Cut, Stop
from proxy.dialects import jsonbody
from proxy.response.assemble import AssembledCall
from proxy.response.decide import DEGENERATE_RULE, StopJudge, detect_text, effects_of, runaway_cut
from proxy.response.sse import SSEEvent
from proxy.response.stream_guard import DecidingGuard, Held

CALL_BLOCK = "tool_use"
#: Text deltas the degenerate-text check reads: delta type → (its field, reasoning?)
_TEXT_DELTAS = {"text_delta": ("text", False), "thinking_delta": ("thinking", True)}
_BLOCK_EVENTS = frozenset(("content_block_start", "content_block_delta", "content_block_stop"))


class _Grammar(Exception):
    """The stream broke the event grammar: the guard stops reading it."""


def _arguments(raw: str, start_input: Any) -> Any:
    """A ``tool_use`` block's arguments: its ``partial_json`` joined, else the start's ``input``
    (a server that sends the whole input there), as the wire's JSON string."""
    if raw or not isinstance(start_input, dict) or not start_input:
        return raw
    return jsonbody.dumps(start_input).decode()


def _call_of(block: dict[str, Any], index: int) -> AssembledCall:
    """The call of a whole (non-streamed) ``tool_use`` block: its input serialized compactly."""
    cid, name, args = block.get("id"), block.get("name"), block.get("input")
    return AssembledCall(
        id=cid if isinstance(cid, str) else None,
        name=name if isinstance(name, str) else "",
        arguments="" if args is None else jsonbody.dumps(args).decode(),
        index=index,
    )


def _is(block: Any, kind: str) -> bool:
    return isinstance(block, dict) and block.get("type") == kind


def _texts(content: list[Any], kind: str, field: str) -> str:
    return "".join(b[field] for b in content if _is(b, kind) and isinstance(b.get(field), str))


def decide_json(raw: bytes, judge: StopJudge | None, cfg: Config) -> tuple[bytes | None, list[Action]]:
    """Decide on a whole Messages ``message`` object (``{"type": "message", "content": [...],
    "stop_reason": …}``). Returns the rewritten body (None = forward the original bytes) and the
    actions taken. A body that is not a message (not JSON, an ``error`` object, no ``content``
    list) is left alone: ``(None, [])``."""
    try:
        obj = jsonbody.decode(raw)
    except jsonbody.Unreadable:
        return None, []
    if not isinstance(obj, dict) or obj.get("type", "message") != "message":
        return None, []
    content = obj.get("content")
    if not isinstance(content, list):
        return None, []
    actions: list[Action] = []
    text = _texts(content, "text", "text")
    limit = cfg.response.degenerate_text.min_repeats
    for said, reason in ((text, "content"), (_texts(content, "thinking", "thinking"), "reasoning")):
        repeats = detect_text(said, cfg) if said else None
        if repeats:
            actions.append(Cut(DEGENERATE_RULE, "", repeats, limit, reason, applied=False))
    blocks = [b for b in content if _is(b, CALL_BLOCK)]
    calls = [_call_of(b, k) for k, b in enumerate(blocks)]
    cut = runaway_cut(calls, cfg.response, effects=effects_of(cfg.progress))
    kept = calls[: cut.count] if cut else calls
    if cut:
        actions.append(cut)
    stop = judge(kept, text) if judge is not None else None
    if stop is not None:
        actions.append(stop)
        said = f"{text}\n\n{stop.text}" if text.strip() else stop.text
        rest = [b for b in content if not (_is(b, CALL_BLOCK) or _is(b, "text"))]
        obj["content"] = [*rest, {"type": "text", "text": said}]
        obj["stop_reason"] = "end_turn"
        return jsonbody.dumps(obj), actions
    if cut:
        dropped = {id(b) for b in blocks[cut.count :]}
        obj["content"] = [b for b in content if id(b) not in dropped]
        return jsonbody.dumps(obj), actions
    return None, actions


@dataclass(slots=True)
class _Block:
    """One content block the upstream started (by its upstream ``index``)."""

    kind: str
    call: int | None = None  # index into the calls, for a tool_use block
    start_input: Any = None
    open: bool = True


@dataclass(slots=True)
class _Held(Held):
    index: int | None = None  # upstream index of the block the event belongs to
    call: int | None = None  # index into the calls of that block's call


class MessagesStreamGuard(DecidingGuard):
    """One streamed Messages answer (the interface of :class:`proxy.response.stream_guard.FramedGuard`)."""

    __slots__ = (
        "_blocks",
        "_decided",
        "_delta_written",
        "_done_calls",
        "_index_map",
        "_next",
        "_output_tokens",
        "_renumber",
        "_started",
    )

    def __init__(self, cfg: Config, judge: StopJudge | None) -> None:
        super().__init__(cfg, judge)
        self._blocks: dict[int, _Block] = {}  # upstream index → block
        self._done_calls = 0
        self._decided = False
        self._delta_written = False  # a rewritten message_delta went out
        self._started = False  # message_start came
        self._renumber = False  # a block was dropped: later indexes go through _index_map
        self._index_map: dict[int, int] = {}  # upstream block index → the agent's
        self._next = 0  # the first block index the agent has not seen
        self._output_tokens = 0  # message_start's usage.output_tokens (for a written message_delta)

    # --- events -----------------------------------------------------------------------------------

    def _event(self, ev: SSEEvent, out: bytearray) -> None:
        if ev.data is None:
            self._hold_or_emit(_Held(ev.raw), False, out)
            return
        try:
            obj = jsonbody.decode(ev.data)
        except jsonbody.Unreadable:
            obj = None
        kind = obj.get("type") if isinstance(obj, dict) else None
        held: _Held | None = None
        if isinstance(kind, str) and kind != "error" and ev.event in (None, kind):
            assert isinstance(obj, dict)
            try:
                held = self._track(kind, obj, ev.raw)
            except _Grammar:
                held = None
        if held is None:
            self._relay_rest(ev.raw, out)  # the upstream's error, or not this grammar
            return
        if kind == "message_stop":
            self.complete = True
        if self._decided:
            self._hold_or_emit(held, False, out)
            return
        if kind in ("message_delta", "message_stop"):
            self._held.append(held)
            self._decided = True
            self._decide(out)
            return
        self._open = self._open or held.call is not None
        self._hold_or_emit(held, held.call is not None, out)
        cut = self._text_cut(obj) if kind == "content_block_delta" else None
        if cut is not None:
            self.actions.append(cut)
            self._abort(out, "max_tokens", set(range(len(self._calls))))
            return
        if held.call is not None and kind in ("content_block_start", "content_block_stop"):
            runaway = self._answer.runaway(self._calls, self._done_calls)
            if runaway is not None:
                self.actions.append(runaway)
                self._abort(out, "tool_use", set(range(runaway.count, len(self._calls))))

    def _track(self, kind: str, obj: dict[str, Any], raw: bytes) -> _Held:
        """Follow the blocks and assemble the calls; the event as held. Raises :class:`_Grammar`."""
        if kind == "message_start":
            message = obj.get("message")
            if self._started or not isinstance(message, dict):
                raise _Grammar
            self._started = True
            usage = message.get("usage")
            tokens = usage.get("output_tokens") if isinstance(usage, dict) else None
            self._output_tokens = tokens if isinstance(tokens, int) else 0
            return _Held(raw, obj)
        if kind not in _BLOCK_EVENTS:
            return _Held(raw, obj)  # message_delta, message_stop, ping, an unknown event
        index = obj.get("index")
        if not self._started or not isinstance(index, int) or isinstance(index, bool):
            raise _Grammar
        block = self._blocks.get(index)
        if kind == "content_block_start":
            start = obj.get("content_block")
            if block is not None or not isinstance(start, dict) or not isinstance(start.get("type"), str):
                raise _Grammar
            block = self._blocks[index] = _Block(start["type"])
            if block.kind == CALL_BLOCK:
                block.call = len(self._calls)
                block.start_input = start.get("input")
                cid, name = start.get("id"), start.get("name")
                self._calls.append(
                    AssembledCall(
                        id=cid if isinstance(cid, str) else None,
                        name=name if isinstance(name, str) else "",
                        arguments="",
                        index=block.call,
                    )
                )
            return _Held(raw, obj, index, block.call)
        if block is None or not block.open:
            raise _Grammar
        if kind == "content_block_stop":
            block.open = False
            if block.call is not None:
                call = self._calls[block.call]
                call.arguments = _arguments(call.arguments, block.start_input)
                self._done_calls += 1
            return _Held(raw, obj, index, block.call)
        delta = obj.get("delta")
        if not isinstance(delta, dict) or not isinstance(delta.get("type"), str):
            raise _Grammar
        if block.call is not None and delta["type"] == "input_json_delta":
            piece = delta.get("partial_json")
            if not isinstance(piece, str):
                raise _Grammar
            self._calls[block.call].arguments += piece
        return _Held(raw, obj, index, block.call)

    def _text_cut(self, obj: dict[str, Any]) -> Cut | None:
        delta = obj.get("delta")
        spec = _TEXT_DELTAS.get(delta.get("type")) if isinstance(delta, dict) else None
        if spec is None:
            return None
        assert isinstance(delta, dict)
        text = delta.get(spec[0])
        return self._answer.text(text, reasoning=spec[1]) if isinstance(text, str) else None

    # --- decisions --------------------------------------------------------------------------------

    def _abort(self, out: bytearray, reason: str, drop: set[int]) -> None:
        """A cut mid-stream (``reason``: the ``stop_reason`` the agent gets): release what is kept,
        close its open blocks, end the message; the edge closes the upstream."""
        self._settle(out, drop)
        for index, block in sorted(self._blocks.items()):
            if block.open and index in self._index_map and block.call not in drop:
                block.open = False
                self._write_obj({"type": "content_block_stop", "index": self._index_map[index]}, out)
        self._write_obj(self._message_delta(reason), out)
        self._write_obj({"type": "message_stop"}, out)
        self._state = "done"
        self.complete = True

    # --- output -----------------------------------------------------------------------------------

    def _write(self, h: _Held, out: bytearray) -> None:
        """The encoder: a held event as the decision left it. The events of dropped calls' blocks
        are left out (the agent's block indexes shift from there); before ``message_delta`` (or a
        ``message_stop`` without one) the stop block, and its ``stop_reason``."""
        if h.call is not None and h.call in self._drop:
            self.settled += len(h.raw)
            self._renumber = True
            return
        kind = h.obj.get("type") if h.obj is not None else None
        changed = self._stop is not None or bool(self._drop)
        if changed and not self._delta_written and kind in ("message_delta", "message_stop"):
            assert h.obj is not None
            self._delta_written = True
            if self._stop is not None:
                self._emit_stop(self._stop, out)
            reason = "end_turn" if self._stop is not None else "tool_use"
            if kind == "message_stop":
                self._write_obj(self._message_delta(reason), out)
            else:
                delta = h.obj.get("delta")
                delta = {**delta} if isinstance(delta, dict) else {}
                delta["stop_reason"] = reason
                if self._stop is not None:
                    delta["stop_sequence"] = None
                obj = {**h.obj, "delta": delta}
                if not isinstance(obj.get("usage"), dict):
                    obj["usage"] = {"output_tokens": self._output_tokens}
                self.settled += len(h.raw)
                self._write_obj(obj, out)
                return
        self._emit_event(h, out)

    def _emit_event(self, h: _Held, out: bytearray) -> None:
        obj, index = h.obj, h.index
        if obj is None or index is None:
            self._emit(h.raw, out)
            return
        if obj.get("type") == "content_block_start":
            mine = self._next if self._renumber else index
            self._index_map[index] = mine
            self._next = max(self._next, mine + 1)
        mine = self._index_map.get(index, index)
        if mine == index:
            self._emit(h.raw, out)
            return
        self.settled += len(h.raw)
        self._write_obj({**obj, "index": mine}, out)

    def _message_delta(self, reason: str) -> dict[str, Any]:
        return {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": None},
            "usage": {"output_tokens": self._output_tokens},
        }

    @staticmethod
    def _write_obj(obj: dict[str, Any], out: bytearray) -> None:
        out += b"event: " + str(obj.get("type", "")).encode() + b"\ndata: " + jsonbody.dumps(obj) + b"\n\n"

    def _emit_stop(self, stop: Stop, out: bytearray) -> None:
        """The stop text as one ``text`` block, at the first index the agent has not seen."""
        self._renumber = True
        text = f"\n\n{stop.text}" if self._answer.said.strip() else stop.text
        index = self._next
        self._next += 1
        for obj in (
            {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
            {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}},
            {"type": "content_block_stop", "index": index},
        ):
            self._write_obj(obj, out)
