"""A scripted fake OpenAI Responses server (``POST /v1/responses``) for agent harness tests.

It answers as the real server does: with ``stream: true`` an SSE stream of ``event: <type>`` /
``data: {..., "type": <type>, "sequence_number": n}`` events (``response.created``,
``response.in_progress``, per output item ``response.output_item.added`` → argument or text deltas
→ ``….done`` → ``response.output_item.done``, then ``response.completed`` carrying the whole
response object with ``output`` and ``usage``); without it the response object as JSON. Shapes
follow the openai SDK's ``openai.types.responses`` models (``ResponseFunctionToolCall``,
``ResponseOutputMessage``, ``ResponseUsage``, the ``Response*Event`` classes).

What it answers is a *script*: a function of the request number (0-based) and the decoded body
returning the output items to send (:func:`function_call` / :func:`message` / :func:`reasoning`).
:meth:`FakeResponses.handle` is a handler for :class:`tests.helpers.fakes.FakeUpstream` (the ``upstream``
fixture, which records every request raw); the fake also keeps the bodies it answered and the
exact bytes of each answer. Other paths (e.g. ``GET /v1/models``) are answered 404.

``stateful=True`` makes it keep conversation state as the real server does with
``previous_response_id``: per response id (unless the request said ``store: false``) the history
it answered (the previous response's history, the request's ``input``, its ``output``). A request
naming an id it does not hold gets a 400 ``previous_response_not_found``; a history with a call
and no output for it gets the real server's 400 ("No tool output found for function call …").
The script then sees the whole history as ``body["input"]``; :attr:`FakeResponses.histories` keeps
each one.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

Item = dict[str, Any]
Script = Callable[[int, dict[str, Any]], list[Item]]
_ids = itertools.count(1)


def function_call(name: str, arguments: str, call_id: str | None = None) -> Item:
    """A completed ``function_call`` output item (``arguments`` a JSON string)."""
    n = next(_ids)
    return {
        "id": f"fc_{n:04d}",
        "type": "function_call",
        "status": "completed",
        "arguments": arguments,
        "call_id": call_id or f"call_{n:04d}",
        "name": name,
    }


def custom_call(name: str, text: str, call_id: str | None = None) -> Item:
    """A completed ``custom_tool_call`` output item (``input``: the raw text the model wrote)."""
    n = next(_ids)
    return {
        "id": f"ctc_{n:04d}",
        "type": "custom_tool_call",
        "status": "completed",
        "call_id": call_id or f"call_{n:04d}",
        "name": name,
        "input": text,
    }


def message(text: str) -> Item:
    """A completed assistant ``message`` output item with one ``output_text`` part."""
    return {
        "id": f"msg_{next(_ids):04d}",
        "type": "message",
        "status": "completed",
        "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": text}],
        "role": "assistant",
    }


def reasoning(summary: str = "") -> Item:
    """A completed ``reasoning`` output item (opaque ``encrypted_content``, as with
    ``include: ["reasoning.encrypted_content"]``), with an optional summary text."""
    n = next(_ids)
    parts = [{"type": "summary_text", "text": summary}] if summary else []
    return {"id": f"rs_{n:04d}", "type": "reasoning", "summary": parts, "encrypted_content": f"gAAAA{n:08d}"}


def response_object(
    rid: str, body: dict[str, Any], output: list[Item], status: str, usage: dict[str, Any] | None
) -> dict[str, Any]:
    """The ``response`` object (the fields a real server fills in, echoing the request's)."""
    now = int(time.time())
    return {
        "id": rid,
        "object": "response",
        "created_at": now,
        "status": status,
        "background": False,
        "completed_at": now if status == "completed" else None,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": None,
        "max_tool_calls": None,
        "model": body.get("model", "fake-model"),
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "prompt_cache_key": body.get("prompt_cache_key"),
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "store": body.get("store", False),
        "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools", []),
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "user": None,
        "metadata": {},
    }


def usage_for(body: bytes, output: list[Item]) -> dict[str, Any]:
    """Plausible token counts (about 4 bytes a token)."""
    inp = max(1, len(body) // 4)
    out = max(1, len(orjson.dumps(output)) // 4)
    return {
        "input_tokens": inp,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": inp + out,
    }


def sse_events(rid: str, body: dict[str, Any], raw: bytes, output: list[Item]) -> list[tuple[str, Item]]:
    """The (type, payload) events of one streamed answer, ``sequence_number`` counted from 0."""
    events: list[tuple[str, Item]] = []

    def emit(etype: str, **fields: Any) -> None:
        events.append((etype, {"type": etype, "sequence_number": len(events), **fields}))

    emit("response.created", response=response_object(rid, body, [], "in_progress", None))
    emit("response.in_progress", response=response_object(rid, body, [], "in_progress", None))
    for index, item in enumerate(output):
        if item["type"] == "function_call":
            added = {**item, "status": "in_progress", "arguments": ""}
            emit("response.output_item.added", output_index=index, item=added)
            args = item["arguments"]
            half = len(args) // 2
            for part in (args[:half], args[half:]):
                emit(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=index,
                    delta=part,
                )
            emit(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                arguments=args,
            )
        elif item["type"] == "custom_tool_call":
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "input": ""},
            )
            text = item["input"]
            half = len(text) // 2
            for part in (text[:half], text[half:]):
                emit(
                    "response.custom_tool_call_input.delta",
                    item_id=item["id"],
                    output_index=index,
                    delta=part,
                )
            emit("response.custom_tool_call_input.done", item_id=item["id"], output_index=index, input=text)
        elif item["type"] == "message":
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "content": []},
            )
            for ci, part in enumerate(item["content"]):
                text = part["text"]
                empty = {**part, "text": ""}
                common = {"item_id": item["id"], "output_index": index, "content_index": ci}
                emit("response.content_part.added", **common, part=empty)
                for i in range(0, len(text), 16):
                    emit("response.output_text.delta", **common, delta=text[i : i + 16], logprobs=[])
                emit("response.output_text.done", **common, text=text, logprobs=[])
                emit("response.content_part.done", **common, part=part)
        elif item["type"] == "reasoning":
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "summary": [], "encrypted_content": None},
            )
            for si, part in enumerate(item["summary"]):
                common = {"item_id": item["id"], "output_index": index, "summary_index": si}
                emit("response.reasoning_summary_part.added", **common, part={**part, "text": ""})
                emit("response.reasoning_summary_text.delta", **common, delta=part["text"])
                emit("response.reasoning_summary_text.done", **common, text=part["text"])
                emit("response.reasoning_summary_part.done", **common, part=part)
        else:
            emit("response.output_item.added", output_index=index, item=item)
        emit("response.output_item.done", output_index=index, item=item)
    emit(
        "response.completed", response=response_object(rid, body, output, "completed", usage_for(raw, output))
    )
    return events


def _bad(message: str, code: str | None) -> web.Response:
    error = {"message": message, "type": "invalid_request_error", "param": "input", "code": code}
    return web.json_response({"error": error}, status=400)


@dataclass
class FakeResponses:
    """The fake server's state: the ``script``, the decoded body of every ``POST …/responses`` it
    answered and the exact bytes of each answer (:attr:`answers`, the SSE stream or JSON)."""

    script: Script
    bodies: list[dict[str, Any]] = field(default_factory=list)
    answers: list[bytes] = field(default_factory=list)
    stateful: bool = False
    #: stateful: response id → the history it holds (input items then output items)
    held: dict[str, list[Item]] = field(default_factory=dict)
    #: stateful: the whole history behind each request answered (what the model saw)
    histories: list[list[Item]] = field(default_factory=list)

    def _history(self, body: dict[str, Any]) -> tuple[list[Item] | None, web.Response | None]:
        items = body.get("input", [])
        items = [{"type": "message", "role": "user", "content": items}] if isinstance(items, str) else items
        prev = body.get("previous_response_id")
        if prev is not None and prev not in self.held:
            return None, _bad(f"Previous response with id '{prev}' not found.", "previous_response_not_found")
        history = [*self.held.get(prev, []), *items] if prev is not None else list(items)
        answered = {i.get("call_id") for i in history if str(i.get("type", "")).endswith("_call_output")}
        for i in history:
            if i.get("type") in ("function_call", "custom_tool_call") and i.get("call_id") not in answered:
                return None, _bad(f"No tool output found for function call {i.get('call_id')}.", None)
        return history, None

    async def handle(self, request: web.Request, raw: bytes) -> web.StreamResponse:
        """Answer one request (a :data:`tests.helpers.fakes.Handler`)."""
        if request.method != "POST" or not request.path.endswith("/responses"):
            return web.json_response(
                {"error": {"message": "not found", "type": "invalid_request_error"}}, status=404
            )
        body = orjson.loads(raw)
        n = len(self.bodies)
        self.bodies.append(body)
        seen = body
        if self.stateful:
            history, error = self._history(body)
            if error is not None:
                return error
            assert history is not None
            self.histories.append(history)
            seen = {**body, "input": history}
        output = self.script(n, seen)
        rid = f"resp_{next(_ids):04d}"
        if self.stateful and body.get("store") is not False:
            self.held[rid] = [*seen["input"], *output]
        if not body.get("stream"):
            data = orjson.dumps(response_object(rid, body, output, "completed", usage_for(raw, output)))
            self.answers.append(data)
            return web.Response(body=data, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        sent = bytearray()
        for etype, payload in sse_events(rid, body, raw, output):
            event = b"event: " + etype.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"
            sent += event
            await resp.write(event)
        self.answers.append(bytes(sent))
        await resp.write_eof()
        return resp
