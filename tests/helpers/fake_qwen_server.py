"""A scripted fake OpenAI chat-completions server (``POST /v1/chat/completions``) for the Qwen Code
harness: it can answer the way a local Qwen server *without a tool-call parser* does
(vLLM without ``--tool-call-parser``, llama.cpp without ``--jinja``, SGLang without one): the
model's call arrives as Qwen3-Coder XML in ``message.content``, ``finish_reason: "stop"``, no
``tool_calls``::

    <tool_call>
    <function=read_file>
    <parameter=file_path>
    /tmp/w/a.txt
    </parameter>
    </function>
    </tool_call>

or as a server *with* a parser does (structured ``tool_calls``, ``finish_reason: "tool_calls"``),
for the control runs.

Streaming (``stream: true``, what Qwen Code always sends) answers with the chunks of
:func:`tests.helpers.fakes.sse_events` (role chunk, content in 8-character deltas, so the markup is split
across chunks as a real server splits it; tool calls id and name first, then the arguments in two
fragments; a finish chunk) followed, when the request asked ``stream_options.include_usage``, by
the usage chunk real servers send (``choices: []``), then ``data: [DONE]``; without ``stream``
the ``chat.completion`` object of :func:`tests.helpers.fakes.completion` as JSON.

What it answers is a *script*: a function of the request number (0-based) and the decoded body
returning an :class:`Answer`. The calls it makes are built from the ``tools`` the request offers
(:func:`offered_parameters`): a script naming a tool or parameter the request does not offer
records the miss in :attr:`FakeChat.errors` and answers a text saying so, so a renamed tool in a
new Qwen Code version fails the test instead of silently testing nothing.
:meth:`FakeChat.handle` is a handler for :class:`tests.helpers.fakes.FakeUpstream` (the ``upstream``
fixture, which records every request raw); the fake also keeps every decoded body and the exact
bytes of each answer.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from tests.helpers.fakes import completion, sse_events, tool_call

_ids = itertools.count(1)


@dataclass(frozen=True)
class Answer:
    """One model answer: ``content`` text and/or structured ``tool_calls`` (wire dicts)."""

    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


Script = Callable[[int, dict[str, Any]], Answer]


def qwen3_coder_xml(name: str, parameters: dict[str, str]) -> str:
    """The Qwen3-Coder chat template's call block: ``<tool_call>``, ``<function=NAME>``, one
    ``<parameter=KEY>`` per argument with the raw value on its own line(s), closing tags, each
    on its own line (the format the qwen3_coder tool parsers of vLLM and SGLang read)."""
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in parameters.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def hermes_json(name: str, arguments: dict[str, Any]) -> str:
    """The hermes / Qwen2.5 call block: ``<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>``."""
    call = orjson.dumps({"name": name, "arguments": arguments}).decode()
    return f"<tool_call>\n{call}\n</tool_call>"


def offered_parameters(body: dict[str, Any], name: str) -> set[str] | None:
    """The parameter names of the function tool ``name`` in the request's ``tools`` (None when the
    request does not offer it)."""
    for tool in body.get("tools") or []:
        fn = tool.get("function") or {}
        if tool.get("type") == "function" and fn.get("name") == name:
            return set((fn.get("parameters") or {}).get("properties") or {})
    return None


def usage_chunk(model: str) -> bytes:
    """The last chunk of a stream asked with ``stream_options.include_usage`` (``choices: []``)."""
    obj = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": model,
        "choices": [],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }
    return b"data: " + orjson.dumps(obj) + b"\n\n"


@dataclass
class FakeChat:
    """The fake server's state: the ``script``, the decoded body of every ``POST
    …/chat/completions`` it answered, the exact bytes of each answer (:attr:`answers`: the SSE
    stream or the JSON) and the scripts' complaints (:attr:`errors`)."""

    script: Script
    bodies: list[dict[str, Any]] = field(default_factory=list)
    answers: list[bytes] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def call(self, body: dict[str, Any], name: str, arguments: dict[str, str], text: bool) -> Answer:
        """An answer making the call ``name(arguments)``: Qwen3-Coder XML in ``content`` when
        ``text``, else one structured call. Records an error (and answers a text naming it) when
        the request does not offer ``name`` with those parameters."""
        params = offered_parameters(body, name)
        if params is None or not set(arguments) <= params:
            miss = f"tool {name} with parameters {sorted(arguments)} not offered (offered: {params})"
            self.errors.append(miss)
            return Answer(content=f"fake: {miss}")
        if text:
            return Answer(content=qwen3_coder_xml(name, arguments))
        return Answer(tool_calls=[tool_call(name, orjson.dumps(arguments).decode(), f"call_{next(_ids)}")])

    async def handle(self, request: web.Request, raw: bytes) -> web.StreamResponse:
        """Answer one request (a :data:`tests.helpers.fakes.Handler`); other paths get a 404."""
        if request.method != "POST" or not request.path.endswith("/chat/completions"):
            return web.json_response(
                {"error": {"message": "not found", "type": "invalid_request_error"}}, status=404
            )
        body = orjson.loads(raw)
        n = len(self.bodies)
        self.bodies.append(body)
        answer = self.script(n, body)
        model = body.get("model", "fake-model")
        if not body.get("stream"):
            data = orjson.dumps(completion(answer.tool_calls, content=answer.content, model=model))
            self.answers.append(data)
            return web.Response(body=data, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        events = sse_events(answer.tool_calls, content=answer.content, model=model)
        if (body.get("stream_options") or {}).get("include_usage"):
            events.insert(len(events) - 1, usage_chunk(model))
        sent = bytearray()
        for event in events:
            sent += event
            await resp.write(event)
        self.answers.append(bytes(sent))
        await resp.write_eof()
        return resp


def repeating_read(path: str, text: bool, times: int = 20, final: str = "Giving up.") -> FakeChat:
    """A model that asks for ``read_file {"file_path": path}`` in its first ``times`` answers (as
    Qwen3-Coder XML text when ``text``, else structured), whatever comes back, then answers
    ``final``."""
    fake = FakeChat(lambda n, body: Answer(content=final))

    def script(n: int, body: dict[str, Any]) -> Answer:
        if n >= times:
            return Answer(content=final)
        return fake.call(body, "read_file", {"file_path": path}, text)

    fake.script = script
    return fake


def read_then_answer(path: str, text: bool, final: str) -> FakeChat:
    """A model that does not loop: one ``read_file {"file_path": path}`` call, then ``final``."""
    return repeating_read(path, text, times=1, final=final)


def alternating_reads(
    paths: tuple[str, str], text: bool, times: int = 30, final: str = "Giving up."
) -> FakeChat:
    """A model that reads ``paths[0]``, ``paths[1]``, ``paths[0]``, … (a cycle of period 2, the
    loop Qwen Code's always-on guard does not see) in its first ``times`` answers, then ``final``."""
    fake = FakeChat(lambda n, body: Answer(content=final))

    def script(n: int, body: dict[str, Any]) -> Answer:
        if n >= times:
            return Answer(content=final)
        return fake.call(body, "read_file", {"file_path": paths[n % 2]}, text)

    fake.script = script
    return fake
