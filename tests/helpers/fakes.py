"""Fake upstream model server and builders of realistic OpenAI chat-completion bodies for tests."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

Handler = Callable[[web.Request, bytes], Awaitable[web.StreamResponse]]
_ids = itertools.count(1)


def tool_call(name: str, arguments: str | dict[str, Any], call_id: str | None = None) -> dict[str, Any]:
    """A wire tool call (``arguments`` as a JSON string unless a dict is given on purpose)."""
    return {
        "id": call_id or f"call_{next(_ids)}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def completion(
    tool_calls: list[dict[str, Any]] | None = None, content: str | None = None, model: str = "fake-model"
) -> dict[str, Any]:
    """A non-streaming ``chat.completion`` object with one choice."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1700000000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if tool_calls else "stop",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def sse_events(
    tool_calls: list[dict[str, Any]] | None = None, content: str | None = None, model: str = "fake-model"
) -> list[bytes]:
    """The same answer as :func:`completion`, as a list of SSE events (``data: …\\n\\n``), ending
    with ``data: [DONE]``. Tool calls arrive llama.cpp/OpenAI style: id and name first, then the
    arguments in two fragments."""
    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1700000000, "model": model}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        obj = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    out = [chunk({"role": "assistant", "content": None if tool_calls else ""})]
    if content:
        for i in range(0, len(content), 8):
            out.append(chunk({"content": content[i : i + 8]}))
    for idx, tc in enumerate(tool_calls or []):
        args = tc["function"]["arguments"]
        args = args if isinstance(args, str) else orjson.dumps(args).decode()
        half = len(args) // 2
        out.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": idx,
                            "id": tc["id"],
                            "type": "function",
                            "function": {"name": tc["function"]["name"], "arguments": ""},
                        }
                    ]
                }
            )
        )
        for part in (args[:half], args[half:]):
            out.append(chunk({"tool_calls": [{"index": idx, "function": {"arguments": part}}]}))
    out.append(chunk({}, "tool_calls" if tool_calls else "stop"))
    out.append(b"data: [DONE]\n\n")
    return out


@dataclass
class Recorded:
    method: str
    path_qs: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class FakeUpstream:
    """An aiohttp app on a real loopback port that records every request it gets.

    ``handler`` answers; replace it per test. ``url`` is the base URL (``…/v1``)."""

    url: str = ""
    requests: list[Recorded] = field(default_factory=list)
    handler: Handler | None = None


def scripted_model(
    calls_for: Callable[[int], list[dict[str, Any]]], content: str | None = None
) -> Callable[[web.Request, bytes], Awaitable[web.StreamResponse]]:
    """A fake model handler: its answer to a request whose history holds ``n`` assistant messages
    makes the calls ``calls_for(n)`` (with ``content``), streamed when the request asks for it."""

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        req = orjson.loads(body) if body else {}
        n = sum(1 for m in req.get("messages", []) if m.get("role") == "assistant")
        calls = calls_for(n)
        if req.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for ev in sse_events(calls, content=content):
                await resp.write(ev)
            await resp.write_eof()
            return resp
        return web.json_response(completion(calls, content=content), dumps=lambda o: orjson.dumps(o).decode())

    return handler


#: Default fake model: always answers with the same ``read_file {"path": "app.py"}`` call.
looping_handler = scripted_model(lambda n: [tool_call("read_file", '{"path": "app.py"}', f"call_{n + 1}")])


def repeated_call_messages(
    n: int,
    name: str = "read_file",
    arguments: str = '{"path": "app.py"}',
    result: str = "print('hi')",
    last_result: bool = True,
) -> list[dict[str, Any]]:
    """A user prompt followed by ``n`` steps each making the same call (ids ``call_1``…``call_n``)
    and getting ``result``; the last step gets no result when ``last_result`` is False."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the bug in app.py"}]
    for i in range(1, n + 1):
        cid = f"call_{i}"
        messages.append(
            {"role": "assistant", "content": None, "tool_calls": [tool_call(name, arguments, cid)]}
        )
        if i < n or last_result:
            messages.append({"role": "tool", "tool_call_id": cid, "content": result})
    return messages


def agent_history(n_calls: int = 300, file_chars: int = 16_000, seed: int = 7) -> dict[str, Any]:
    """A realistic coding-agent request body: a long system prompt, a user task, then ``n_calls``
    steps of varied tool calls (never the same call twice in a row, so no guard fires) whose results
    carry big file contents (non-ASCII, quotes, backslashes, newlines included). About
    ``n_calls * file_chars`` bytes once serialized."""
    import random

    rnd = random.Random(seed)
    words = ["def", "return", "self", "import", "class", "if", "else", "for", "in", "None", "ünïcode", "日本"]

    def file_text(i: int) -> str:
        lines = []
        size = 0
        while size < file_chars:
            line = f'    {" ".join(rnd.choice(words) for _ in range(8))}  # "q" \\ line {i}-{size}\t'
            lines.append(line)
            size += len(line) + 1
        return "\n".join(lines)

    tools = ["read_file", "grep", "list_dir", "run_tests", "edit_file"]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful coding agent. " * 200},
        {"role": "user", "content": "Refactor the storage layer and make the tests pass."},
    ]
    for i in range(n_calls):
        name = tools[i % len(tools)]
        args = {"path": f"src/module_{i}.py", "pattern": f"fn_{i}", "line": i, "ratio": i / 7}
        cid = f"call_{i:04d}"
        messages.append(
            {
                "role": "assistant",
                "content": f"Step {i}: looking at module {i}." if i % 3 == 0 else None,
                "tool_calls": [tool_call(name, orjson.dumps(args).decode(), cid)],
            }
        )
        messages.append({"role": "tool", "tool_call_id": cid, "name": name, "content": file_text(i)})
    return {
        "model": "qwen2.5-coder-32b",
        "messages": messages,
        "tools": [
            {"type": "function", "function": {"name": t, "parameters": {"type": "object", "properties": {}}}}
            for t in tools
        ],
        "temperature": 0.2,
        "stream": False,
    }


def only_guard(name: str, **settings: Any) -> dict[str, Any]:
    """A config dict enabling guard ``name`` (with ``settings``) and disabling every other guard
    the configuration knows, so a test about one guard is not disturbed by guards added later."""
    import dataclasses

    from proxy.config import GuardsConfig

    guards: dict[str, Any] = {f.name: {"enabled": False} for f in dataclasses.fields(GuardsConfig)}
    guards[name] = {"enabled": True, **settings}
    return {"guards": guards}
