"""A scripted fake Anthropic Messages server (``POST /v1/messages``) for agent harness tests
(Claude Code through loopguard).

It answers as the real API does (https://docs.anthropic.com/en/api/messages-streaming): with
``stream: true`` an SSE stream of ``event: <type>`` / ``data: {"type": <type>, …}`` frames
(``message_start`` carrying the message with empty ``content``, a ``ping``, per content block
``content_block_start`` → deltas → ``content_block_stop``, then ``message_delta`` with
``stop_reason`` and the output ``usage``, then ``message_stop``); a ``text`` block streams
``text_delta`` pieces, a ``tool_use`` block starts with ``input: {}`` and streams its input as
``input_json_delta`` ``partial_json`` pieces (the first one empty, as the real API sends), a
``thinking`` block ``thinking_delta`` pieces then one ``signature_delta``. Without ``stream`` the
message as JSON. ``POST /v1/messages/count_tokens`` answers ``{"input_tokens": n}`` (about 4 bytes
a token). Both accept a query (Claude Code sends ``?beta=true``). Any other path is a 404 in the
API's error shape.

What it answers is a *script*: a function of the request number (0-based, counting the
``/messages`` requests the script is asked about) and the decoded body, returning the content
blocks to send (:func:`text` / :func:`tool_use` / :func:`thinking`). The ``stop_reason`` is
``tool_use`` when a block is a ``tool_use``, else ``end_turn``, unless
:attr:`FakeMessages.stop_reason` names another for that request (``max_tokens``, ``refusal``).
``side`` (optional) picks the requests that are not the agent's main loop (Claude Code's title or
summary requests: no ``tools``) and answers them with its own blocks, so they do not count as
script steps.

:meth:`FakeMessages.handle` is a handler for :class:`tests.helpers.fakes.FakeUpstream` (the ``upstream``
fixture records every request raw: method, path with query, headers, body). The fake itself keeps
every request it got (:attr:`FakeMessages.requests`: method, path, headers, raw body), the exact
body bytes of its answer to each (:attr:`FakeMessages.answers`, the same order: SSE stream or
JSON, ``count_tokens`` and 404s included), the decoded bodies of the script's requests
(:attr:`FakeMessages.bodies`) and the script's answers alone (:attr:`FakeMessages.step_answers`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

Block = dict[str, Any]
Script = Callable[[int, dict[str, Any]], list[Block]]
_ids = itertools.count(1)


def text(value: str) -> Block:
    """A ``text`` content block."""
    return {"type": "text", "text": value}


def tool_use(name: str, input: dict[str, Any], id: str | None = None) -> Block:
    """A ``tool_use`` content block (``id`` like the API's ``toolu_…``)."""
    return {"type": "tool_use", "id": id or f"toolu_fake{next(_ids):06d}", "name": name, "input": input}


def thinking(value: str, signature: str | None = None) -> Block:
    """A ``thinking`` content block with an opaque ``signature``."""
    return {"type": "thinking", "thinking": value, "signature": signature or f"sig{next(_ids):08d}"}


def usage_for(raw: bytes, blocks: list[Block]) -> tuple[int, int]:
    """Plausible (input, output) token counts (about 4 bytes a token)."""
    return max(1, len(raw) // 4), max(1, len(orjson.dumps(blocks)) // 4)


def stop_reason_of(blocks: list[Block]) -> str:
    """``tool_use`` when the answer calls a tool, else ``end_turn``."""
    return "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"


def message_object(
    mid: str, model: str, blocks: list[Block], usage: tuple[int, int], stop_reason: str | None = None
) -> dict[str, Any]:
    """The whole ``message`` object (what a non-streamed request gets); ``stop_reason`` defaults
    to :func:`stop_reason_of` the blocks."""
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": stop_reason or stop_reason_of(blocks),
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage[0],
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": usage[1],
        },
    }


def _pieces(value: str, size: int) -> list[str]:
    return [value[i : i + size] for i in range(0, len(value), size)] or [""]


def sse_events(
    mid: str, model: str, blocks: list[Block], usage: tuple[int, int], stop_reason: str | None = None
) -> list[tuple[str, Block]]:
    """The (event type, payload) frames of one streamed answer (``stop_reason`` as for
    :func:`message_object`)."""
    start = message_object(mid, model, [], (usage[0], 1))
    start["stop_reason"] = None
    events: list[tuple[str, Block]] = [("message_start", {"type": "message_start", "message": start})]
    events.append(("ping", {"type": "ping"}))

    def delta(index: int, d: Block) -> None:
        events.append(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d}))

    for index, block in enumerate(blocks):
        if block["type"] == "tool_use":
            opening: Block = {**block, "input": {}}
        elif block["type"] == "text":
            opening = {"type": "text", "text": ""}
        elif block["type"] == "thinking":
            opening = {"type": "thinking", "thinking": "", "signature": ""}
        else:
            opening = block
        events.append(
            ("content_block_start", {"type": "content_block_start", "index": index, "content_block": opening})
        )
        if block["type"] == "tool_use":
            args = orjson.dumps(block["input"]).decode()
            delta(index, {"type": "input_json_delta", "partial_json": ""})
            for part in _pieces(args, max(1, len(args) // 2 + 1)):
                delta(index, {"type": "input_json_delta", "partial_json": part})
        elif block["type"] == "text":
            for part in _pieces(block["text"], 16):
                delta(index, {"type": "text_delta", "text": part})
        elif block["type"] == "thinking":
            for part in _pieces(block["thinking"], 16):
                delta(index, {"type": "thinking_delta", "thinking": part})
            delta(index, {"type": "signature_delta", "signature": block["signature"]})
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason or stop_reason_of(blocks), "stop_sequence": None},
                "usage": {"output_tokens": usage[1]},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def frame(etype: str, payload: Block) -> bytes:
    """One SSE frame as the API writes it."""
    return b"event: " + etype.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


@dataclass
class Received:
    """One request the fake got: method, path with query, headers, raw body."""

    method: str
    path_qs: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class FakeMessages:
    """The fake server's state: the ``script`` (and ``side``, answering the requests it picks),
    every request it got and the body of every answer (:attr:`answers`, one per request), the
    decoded body of every request the script answered and those answers (:attr:`step_answers`)."""

    script: Script
    #: (is_side(body), blocks(body)): requests it picks are answered with blocks(body), not by the
    #: script; None: every ``/messages`` request is a script step
    side: tuple[Callable[[dict[str, Any]], bool], Callable[[dict[str, Any]], list[Block]]] | None = None
    requests: list[Received] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    side_bodies: list[dict[str, Any]] = field(default_factory=list)
    #: the ``stop_reason`` of the script's answer to request n (None: from its blocks)
    stop_reason: Callable[[int], str | None] = lambda n: None
    #: the body of the answer to each of :attr:`requests`, in order
    answers: list[bytes] = field(default_factory=list)
    #: the script's answers only, in step order (the bytes, and the blocks they carry)
    step_answers: list[bytes] = field(default_factory=list)
    step_blocks: list[list[Block]] = field(default_factory=list)

    def _json(self, index: int, data: bytes, status: int = 200) -> web.Response:
        self.answers[index] = data
        return web.Response(body=data, status=status, content_type="application/json")

    async def handle(self, request: web.Request, raw: bytes) -> web.StreamResponse:
        """Answer one request (a :data:`tests.helpers.fakes.Handler`)."""
        index = len(self.requests)
        self.requests.append(Received(request.method, request.raw_path, dict(request.headers), raw))
        self.answers.append(b"")  # filled in below (requests may overlap)
        if request.method == "POST" and request.path.endswith("/messages/count_tokens"):
            return self._json(index, orjson.dumps({"input_tokens": max(1, len(raw) // 4)}))
        if request.method != "POST" or not request.path.endswith("/messages"):
            error = {"type": "not_found_error", "message": f"Not found: {request.method} {request.path}"}
            return self._json(index, orjson.dumps({"type": "error", "error": error}), status=404)
        body = orjson.loads(raw)
        is_side = self.side is not None and self.side[0](body)
        stop_reason = None
        if is_side:
            assert self.side is not None
            self.side_bodies.append(body)
            blocks = self.side[1](body)
        else:
            stop_reason = self.stop_reason(len(self.bodies))
            blocks = self.script(len(self.bodies), body)
            self.bodies.append(body)
            self.step_blocks.append(blocks)
        mid = f"msg_fake{next(_ids):06d}"
        model = body.get("model", "fake-model")
        usage = usage_for(raw, blocks)
        if not body.get("stream"):
            data = orjson.dumps(message_object(mid, model, blocks, usage, stop_reason))
            if not is_side:
                self.step_answers.append(data)
            return self._json(index, data)
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "request-id": mid}
        )
        await resp.prepare(request)
        sent = bytearray()
        for etype, payload in sse_events(mid, model, blocks, usage, stop_reason):
            data = frame(etype, payload)
            sent += data
            await resp.write(data)
        self.answers[index] = bytes(sent)
        if not is_side:
            self.step_answers.append(bytes(sent))
        await resp.write_eof()
        return resp
