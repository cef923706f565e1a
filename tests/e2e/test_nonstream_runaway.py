"""Non-streaming runaway: an agent that hangs up on a non-streaming request
frees the model slot, and ``upstream.stream_json_requests`` sends such requests upstream as
streams, assembling the one JSON answer the agent asked for (so the runaway and degenerate cuts
apply, and servers that only stop on a closed *stream* stop).

The real server in front of a scripted fake upstream; raw sockets where connection handling
matters, the official ``openai`` SDK where parsing matters. The llama-cpp-python measurement is
at the end (marker ``realmodel``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import orjson
import pytest
import structlog
from aiohttp import web
from openai import AsyncOpenAI

from proxy.edge.observe import configure_logging
from proxy.response.as_stream import Assembly, error_status, stream_rejected, stream_request, top_level_values
from proxy.response.assemble import CompletionAssembler
from proxy.response.decide import DENIALS_TEXT
from tests.helpers.fakes import FakeUpstream, completion, tool_call
from tests.helpers.quirks import ARGS, BASE, ROLE, calls, chunk, ev, tc
from tests.helpers.sdk_agent import agent_loop, snapshot

CHAT = "/v1/chat/completions"
ON: dict[str, Any] = {"upstream": {"stream_json_requests": True}}
USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}


@pytest.fixture
async def agent() -> AsyncIterator[aiohttp.ClientSession]:
    skip = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
    async with aiohttp.ClientSession(auto_decompress=False, skip_auto_headers=skip) as s:
        yield s


@pytest.fixture
def restore_structlog() -> Iterator[None]:
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def with_config(extra: dict[str, Any]) -> dict[str, Any]:
    return {**ON, **extra}


def sse_answer(*events: bytes, status: int = 200, close: bool = False) -> Any:
    """An upstream that answers every request with these SSE bytes (``close``: then breaks the
    connection instead of ending the body)."""

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(status=status, headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for e in events:
            await resp.write(e)
        if close:
            assert request.transport is not None
            request.transport.close()
            return resp
        await resp.write_eof()
        return resp

    return handler


async def raw_post(base: str, body: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", int(base.rsplit(":", 1)[1]))
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    return reader, writer


async def request_lines(capfd: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """The ``request`` log lines on stderr so far (polled until one arrives)."""
    err = ""
    for _ in range(200):
        err += capfd.readouterr().err
        if '"request"' in err:
            break
        await asyncio.sleep(0.005)
    lines = [orjson.loads(line) for line in err.splitlines() if line.startswith("{")]
    return [e for e in lines if e.get("event") == "request"]


# --- the agent hangs up on a non-streaming request -----------------------------------------------------


@pytest.mark.parametrize("config", [None, ON], ids=["json_upstream", "as_stream"])
async def test_agent_hangup_mid_non_streaming_request_closes_the_upstream_logged_and_counted(
    upstream: FakeUpstream,
    make_proxy,
    config: dict[str, Any] | None,
    capfd: pytest.CaptureFixture[str],
    restore_structlog: None,
) -> None:
    """Without the switch the upstream is generating a JSON answer (no byte sent yet); with it,
    a stream that has sent one token. Either way the agent's hang-up closes the upstream
    connection within a second, and is logged (no content) and counted."""
    configure_logging("info")
    generating = asyncio.Event()
    closed = asyncio.Event()
    seen: list[Any] = []

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        seen.append(orjson.loads(body).get("stream"))
        try:
            if seen[-1]:
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await resp.prepare(request)
                await resp.write(ev(chunk({"role": "assistant", "content": "Once"})))
            generating.set()
            await asyncio.Event().wait()  # a long generation, until the proxy hangs up
        finally:
            closed.set()
        raise AssertionError("unreachable")

    upstream.handler = handler
    base = await make_proxy(config)
    capfd.readouterr()
    _, writer = await raw_post(
        base, b'{"model":"m","messages":[{"role":"user","content":"Tell a long story"}]}'
    )
    await asyncio.wait_for(generating.wait(), 5)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    writer.close()
    await asyncio.wait_for(closed.wait(), 2)
    assert loop.time() - t0 < 1.0
    assert seen == [True if config else None]
    lines = await request_lines(capfd)
    assert len(lines) == 1
    line = lines[0]
    assert (line["level"], line["disconnected"], line.get("as_stream", False)) == (
        "warning",
        True,
        bool(config),
    )
    assert "Tell a long story" not in orjson.dumps(line).decode()
    snap = await snapshot(base)
    assert snap["disconnects"] == 1
    async with aiohttp.ClientSession() as s, s.get(base + "/loop-guard/metrics") as r:
        assert "loopguard_disconnects_total 1.0" in await r.text()


# --- what goes upstream ---------------------------------------------------------------------------------


TEXT_STREAM = [
    ev({**BASE, "system_fingerprint": "fp_1", "obfuscation": "x1", **chunk(ROLE | {"content": ""})}),
    ev({**BASE, "system_fingerprint": "fp_1", "obfuscation": "x22", **chunk({"content": "Hello"})}),
    ev({**BASE, "system_fingerprint": "fp_1", **chunk({"content": " world"})}),
    ev({**BASE, "system_fingerprint": "fp_1", **chunk(finish="stop")}),
    ev({**BASE, "system_fingerprint": "fp_1", "choices": [], "usage": USAGE}),
    b"data: [DONE]\n\n",
]
TEXT_JSON = (
    b'{"id":"chatcmpl-q","object":"chat.completion","created":1700000000,"model":"m",'
    b'"system_fingerprint":"fp_1","choices":[{"index":0,"message":{"role":"assistant",'
    b'"content":"Hello world"},"logprobs":null,"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}'
)


@pytest.mark.parametrize(
    ("sent", "expected"),
    [
        pytest.param(
            b'{"model":"m","seed":18446744073709551617,"messages":[{"role":"user","content":"hi"}]}',
            b'{"stream":true,"stream_options":{"include_usage":true},"model":"m","seed":18446744073709551617,'
            b'"messages":[{"role":"user","content":"hi"}]}',
            id="no_stream_member",
        ),
        pytest.param(
            b'{"model": "m", "messages": [{"role": "user", "content": "\\"stream\\": false"}], '
            b'"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", '
            b'"properties": {"stream": {"type": "boolean", "default": false}}}}}], "stream": false, '
            b'"temperature": 0.70}',
            b'{"stream_options":{"include_usage":true},"model": "m", "messages": [{"role": "user", '
            b'"content": "\\"stream\\": false"}], "tools": [{"type": "function", "function": {"name": "f", '
            b'"parameters": {"type": "object", "properties": {"stream": {"type": "boolean", "default": '
            b'false}}}}}], "stream": true, "temperature": 0.70}',
            id="stream_false_in_place",
        ),
        pytest.param(
            b'{"stream":null,"stream_options":{"include_usage":false},"model":"m","messages":[]}',
            b'{"stream":true,"stream_options":{"include_usage":false},"model":"m","messages":[]}',
            id="stream_null_own_stream_options",
        ),
    ],
)
async def test_upstream_gets_the_request_as_a_stream_only_those_bytes_changed(
    upstream: FakeUpstream, make_proxy, agent, sent: bytes, expected: bytes
) -> None:
    upstream.handler = sse_answer(*TEXT_STREAM)
    base = await make_proxy(ON)
    headers = {"Content-Type": "application/json", "Accept-Encoding": "gzip, deflate", "X-Custom": "1"}
    async with agent.post(base + CHAT, data=sent, headers=headers) as r:
        assert (r.status, r.headers["Content-Type"], await r.read()) == (200, "application/json", TEXT_JSON)
    (got,) = upstream.requests
    assert got.body == expected
    assert got.headers["Accept-Encoding"] == "identity"  # an event stream loopguard reads: not compressed
    assert got.headers["X-Custom"] == "1"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (CHAT, b'{"model":"m","messages":[],"stream":true}'),
        (CHAT, b'{"model":"m","messages":[],"stream":"no"}'),
        (CHAT, b"not json"),
        (CHAT, b'["a list"]'),
        (CHAT, b'\xef\xbb\xbf{"model":"m","messages":[]}'),  # a BOM: not JSON to loopguard
        ("/v1/completions", b'{"model":"m","prompt":"hi"}'),
        ("/v1/embeddings", b'{"model":"m","input":"hi"}'),
    ],
    ids=[
        "already_a_stream",
        "odd_stream_value",
        "not_json",
        "not_an_object",
        "bom_not_json",
        "completions",
        "embeddings",
    ],
)
async def test_other_requests_go_upstream_byte_for_byte(
    upstream: FakeUpstream, make_proxy, agent, path: str, body: bytes
) -> None:
    async def handler(request: web.Request, got: bytes) -> web.StreamResponse:
        return web.Response(body=b'{"ok":true}', content_type="application/json")

    upstream.handler = handler
    base = await make_proxy(ON)
    async with agent.post(base + path, data=body) as r:
        assert await r.read() == b'{"ok":true}'
    assert upstream.requests[0].body == body


async def test_json_orjson_cannot_read_is_converted_with_its_number_text_kept(
    upstream: FakeUpstream, make_proxy, agent
) -> None:
    """``1e400`` is JSON (the guards read it, proxy.dialects.jsonbody): the request goes as a stream and
    only the stream members are added; the number text is untouched."""

    async def handler(request: web.Request, got: bytes) -> web.StreamResponse:
        return web.Response(body=b'{"ok":true}', content_type="application/json")

    upstream.handler = handler
    base = await make_proxy(ON)
    body = b'{"model":"m","messages":[],"temperature":1e400}'
    async with agent.post(base + CHAT, data=body) as r:
        assert await r.read() == b'{"ok":true}'
    assert upstream.requests[0].body == (
        b'{"stream":true,"stream_options":{"include_usage":true},"model":"m","messages":[],"temperature":1e400}'
    )


# --- the assembled answer -------------------------------------------------------------------------------


LLAMA_CPP_NAMED = [  # llama-cpp-python 0.3.x, chatml-function-calling, a named tool choice
    ev(
        {
            **BASE,
            "choices": [
                {
                    "index": 0,
                    "finish_reason": None,
                    "logprobs": None,
                    "delta": {
                        "role": "assistant",
                        "content": None,
                        "function_call": None,
                        "tool_calls": None,
                    },
                }
            ],
        }
    ),
    *(
        ev(
            {
                **BASE,
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": None,
                        "logprobs": None,
                        "delta": {
                            "role": None,
                            "content": None,
                            "function_call": {"name": "read_file", "arguments": part},
                            "tool_calls": [
                                {
                                    "index": 0,
                                    "id": "call__0_read_file_cmpl-1",
                                    "type": "function",
                                    "function": {"name": "read_file", "arguments": part},
                                }
                            ],
                        },
                    }
                ],
            }
        )
        for part in ('{"', "path", '":', ' "', "config", ".yaml", '"}')
    ),
    ev({**BASE, "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": None, "delta": {}}]}),
    b"data: [DONE]\n\n",
]
OPENAI_PARALLEL = [  # OpenAI style: id and name first, arguments in fragments, two calls, usage last
    ev(chunk(ROLE | {"content": None}, usage=None)),
    ev(chunk(calls(tc(0, "call_a", "read_file", "", type_=True)), usage=None)),
    ev(chunk(calls(tc(0, arguments='{"path": ')), usage=None)),
    ev(chunk(calls(tc(0, arguments='"a.py"}')), usage=None)),
    ev(chunk(calls(tc(1, "call_b", "grep", "", type_=True)), usage=None)),
    ev(chunk(calls(tc(1, arguments='{"pattern": "x"}')), usage=None)),
    ev(chunk(finish="tool_calls", usage=None)),
    ev({**BASE, "choices": [], "usage": USAGE}),
    b"data: [DONE]\n\n",
]


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        (
            LLAMA_CPP_NAMED,
            {
                "id": "chatcmpl-q",
                "object": "chat.completion",
                "created": 1700000000,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {
                                    "id": "call__0_read_file_cmpl-1",
                                    "type": "function",
                                    "function": {"name": "read_file", "arguments": '{"path": "config.yaml"}'},
                                }
                            ],
                            "function_call": {"name": "read_file", "arguments": '{"path": "config.yaml"}'},
                        },
                        "logprobs": None,
                        "finish_reason": "tool_calls",
                    }
                ],
            },
        ),
        (
            OPENAI_PARALLEL,
            {
                "id": "chatcmpl-q",
                "object": "chat.completion",
                "created": 1700000000,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {
                                    "id": "call_a",
                                    "type": "function",
                                    "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
                                },
                                {
                                    "id": "call_b",
                                    "type": "function",
                                    "function": {"name": "grep", "arguments": '{"pattern": "x"}'},
                                },
                            ],
                        },
                        "logprobs": None,
                        "finish_reason": "tool_calls",
                    }
                ],
                "usage": USAGE,
            },
        ),
    ],
    ids=["llama_cpp_python_named", "openai_parallel"],
)
async def test_streamed_tool_calls_are_assembled_into_the_json_answer(
    upstream: FakeUpstream, make_proxy, agent, events: list[bytes], expected: dict[str, Any]
) -> None:
    upstream.handler = sse_answer(*events)
    base = await make_proxy(ON)
    async with agent.post(
        base + CHAT, data=b'{"model":"m","messages":[{"role":"user","content":"go"}]}'
    ) as r:
        assert r.status == 200
        assert await r.read() == orjson.dumps(expected)


async def test_the_openai_sdk_reads_the_assembled_answer(upstream: FakeUpstream, sdk) -> None:
    upstream.handler = sse_answer(*OPENAI_PARALLEL)
    client: AsyncOpenAI = await sdk(ON)
    resp = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}])
    assert resp.object == "chat.completion"
    assert resp.choices[0].finish_reason == "tool_calls"
    assert [
        (c.id, c.function.name, c.function.arguments) for c in resp.choices[0].message.tool_calls or []
    ] == [
        ("call_a", "read_file", '{"path": "a.py"}'),
        ("call_b", "grep", '{"pattern": "x"}'),
    ]
    assert resp.usage is not None and resp.usage.total_tokens == 7


async def test_a_json_answer_to_the_stream_request_is_relayed_as_json(
    upstream: FakeUpstream, make_proxy, agent
) -> None:
    """A server that ignores ``stream`` answers JSON: that goes to the agent byte for byte."""
    raw = orjson.dumps(completion(content="Hi there."))

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.Response(body=raw, content_type="application/json")

    upstream.handler = handler
    base = await make_proxy(ON)
    async with agent.post(base + CHAT, data=b'{"model":"m","messages":[]}') as r:
        assert (r.status, await r.read()) == (200, raw)


# --- the response side applies --------------------------------------------------------------------------


def streaming_model(deltas: list[dict[str, Any]], progress: dict[str, Any], finish: str) -> Any:
    """A model streaming one delta per token (``sleep(0)`` between them); records how many it got
    out and sets ``progress["closed"]`` when the proxy hangs up."""

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        progress["stream"] = orjson.loads(body).get("stream")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            await resp.write(ev(chunk(ROLE)))
            for i, delta in enumerate(deltas):
                await resp.write(ev(chunk(delta)))
                progress["written"] = i + 1
                await asyncio.sleep(0)
            await resp.write(ev(chunk(finish=finish)) + b"data: [DONE]\n\n")
            await resp.write_eof()
        finally:
            progress["closed"].set()
        return resp

    return handler


async def test_300_identical_calls_in_a_non_streaming_answer_are_cut_and_the_upstream_closed(
    upstream: FakeUpstream, make_proxy, agent
) -> None:
    progress: dict[str, Any] = {"written": 0, "closed": asyncio.Event()}
    deltas = [
        d
        for i in range(300)
        for d in (
            calls(tc(i, f"call_{i}", "write_file", "", type_=True)),
            calls(tc(i, arguments='{"path": ')),
            calls(tc(i, arguments='"app.py"}')),
        )
    ]
    upstream.handler = streaming_model(deltas, progress, "tool_calls")
    base = await make_proxy(ON)
    async with agent.post(
        base + CHAT, data=b'{"model":"m","messages":[{"role":"user","content":"go"}]}'
    ) as r:
        answer = orjson.loads(await r.read())
    assert progress["stream"] is True
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"] == [
        {"id": f"call_{i}", "type": "function", "function": {"name": "write_file", "arguments": ARGS}}
        for i in range(2)
    ]
    await asyncio.wait_for(progress["closed"].wait(), 2)
    assert progress["written"] < 60, progress["written"]  # of 900 deltas
    snap = await snapshot(base)
    assert (snap["responses_cut"], snap["per_rule"]) == (1, {"runaway": 1})


async def test_degenerate_text_in_a_non_streaming_answer_is_cut_with_length(
    upstream: FakeUpstream, make_proxy, agent
) -> None:
    progress: dict[str, Any] = {"written": 0, "closed": asyncio.Event()}
    sentence = "I need to check the configuration file again. "
    deltas = [{"content": "Let me think. "}] + [{"content": sentence}] * 5000
    upstream.handler = streaming_model(deltas, progress, "stop")
    base = await make_proxy(ON)
    async with agent.post(
        base + CHAT, data=b'{"model":"m","messages":[{"role":"user","content":"why"}]}'
    ) as r:
        answer = orjson.loads(await r.read())
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"].startswith("Let me think. " + sentence * 10)
    assert len(choice["message"]["content"]) < len(sentence) * 40
    await asyncio.wait_for(progress["closed"].wait(), 2)
    assert progress["written"] < 40, progress["written"]  # of 5001
    snap = await snapshot(base)
    assert (snap["responses_cut"], snap["per_rule"]) == (1, {"degenerate_text": 1})


async def test_the_stop_ends_a_non_streaming_agent_loop_through_assembled_answers(
    upstream: FakeUpstream, sdk
) -> None:
    """The default looping fake model streams when asked to: every answer was assembled, and the
    stop (a response-side decision) ends the loop as it does for JSON and SSE agents."""
    client = await sdk(with_config({"guards": {"escalation": {"enabled": False}}}))
    messages, steps, finish = await agent_loop(client, stream=False)
    assert (steps, finish) == (9, "stop")
    assert all(r.json()["stream"] is True for r in upstream.requests)
    assert messages[-1] == {
        "role": "assistant",
        "content": DENIALS_TEXT.format(tool="read_file", count=9, denials=2),
    }


# --- errors and fallbacks -------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [400, 401, 404, 422, 429, 500, 503])
async def test_an_error_answer_to_the_stream_request_is_passed_through(
    upstream: FakeUpstream, make_proxy, agent, status: int
) -> None:
    raw = (
        b'{"error": {"message": "no", "type": "invalid_request_error", "param": "temperature", "code": null}}'
    )

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.Response(status=status, body=raw, content_type="application/json", headers={"X-Req": "7"})

    upstream.handler = handler
    base = await make_proxy(ON)
    async with agent.post(base + CHAT, data=b'{"model":"m","messages":[]}') as r:
        assert (r.status, r.headers["X-Req"], await r.read()) == (status, "7", raw)
    assert len(upstream.requests) == 1


@pytest.mark.parametrize(
    ("refusal", "reason"),
    [
        pytest.param(
            (
                400,
                b'{"error": {"message": "Your organization must be verified to stream this model.", '
                b'"type": "invalid_request_error", "param": "stream", "code": "unsupported_value"}}',
            ),
            "rejected",
            id="openai_unverified_organization",
        ),
        pytest.param(
            (400, b'{"error": {"message": "Unrecognized request argument", "param": "stream_options"}}'),
            "rejected",
            id="stream_options_unknown",
        ),
        pytest.param(None, "empty_stream", id="llama_cpp_python_auto_tool_choice"),
        pytest.param("broken", "empty_stream", id="empty_stream_then_broken"),
    ],
)
async def test_an_upstream_that_refuses_the_stream_gets_the_original_request(
    upstream: FakeUpstream,
    make_proxy,
    agent,
    refusal: Any,
    reason: str,
    capfd: pytest.CaptureFixture[str],
    restore_structlog: None,
) -> None:
    configure_logging("info")
    raw = orjson.dumps(completion([tool_call("read_file", ARGS, "call_1")]))

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        if not orjson.loads(body).get("stream"):
            return web.Response(body=raw, content_type="application/json")
        if isinstance(refusal, tuple):
            return web.Response(status=refusal[0], body=refusal[1], content_type="application/json")
        return await sse_answer(b": ping\n\n", close=refusal == "broken")(request, body)

    upstream.handler = handler
    base = await make_proxy(ON)
    sent = b'{"model":"m","messages":[{"role":"user","content":"go"}],"tool_choice":"auto"}'
    capfd.readouterr()
    async with agent.post(base + CHAT, data=sent) as r:
        assert (r.status, await r.read()) == (200, raw)
    assert [q.body for q in upstream.requests][1:] == [sent]
    assert upstream.requests[0].json()["stream"] is True
    (line,) = await request_lines(capfd)
    assert (line["stream_fallback"], line["status"], line["as_stream"]) == (reason, 200, True)


async def test_an_error_event_in_the_stream_becomes_the_error_answer(
    upstream: FakeUpstream, make_proxy, agent
) -> None:
    error = b'{"error":{"code":500,"message":"Context size has been exceeded.","type":"server_error"}}'
    upstream.handler = sse_answer(ev(chunk(ROLE)), ev(chunk({"content": "Hel"})), b"data: " + error + b"\n\n")
    base = await make_proxy(ON)
    async with agent.post(base + CHAT, data=b'{"model":"m","messages":[]}') as r:
        assert (r.status, r.content_type, await r.read()) == (500, "application/json", error)


@pytest.mark.parametrize("close", [False, True], ids=["ends_cleanly", "connection_broken"])
async def test_a_stream_that_stops_short_is_a_502(
    upstream: FakeUpstream, make_proxy, agent, close: bool
) -> None:
    upstream.handler = sse_answer(ev(chunk(ROLE)), ev(chunk({"content": "Hel"})), close=close)
    base = await make_proxy(ON)
    async with agent.post(base + CHAT, data=b'{"model":"m","messages":[]}') as r:
        assert r.status == 502
        assert orjson.loads(await r.read())["error"]["type"] == "upstream_disconnected"
    assert len(upstream.requests) == 1  # no second request: the upstream had started answering
    assert (await snapshot(base))["upstream_errors"] == 1


async def test_a_complete_answer_survives_a_connection_broken_after_it(
    upstream: FakeUpstream, make_proxy, agent
) -> None:
    upstream.handler = sse_answer(*TEXT_STREAM, close=True)
    base = await make_proxy(ON)
    async with agent.post(base + CHAT, data=b'{"model":"m","messages":[]}') as r:
        assert (r.status, await r.read()) == (200, TEXT_JSON)


@pytest.mark.parametrize("moment", ["headers_came_not_yet_taken", "answer_in_flight"])
async def test_a_shutdown_ends_a_streamed_json_request_with_a_503(
    upstream: FakeUpstream, moment: str
) -> None:
    """The end of a shutdown's grace period (``end_grace``, as ``serve_forever`` runs it) for a
    request whose agent asked for JSON and whose answer comes upstream as a stream: the agent
    gets the 503 error answer, whether its handler had taken the upstream's headers yet (the
    answer is being read: the sweep closes it) or not (the send had finished, so cancelling it
    did nothing, and the response was not among those the sweep closes)."""
    from proxy.edge.keys import INFLIGHT_KEY, PENDING_KEY, SHUTDOWN_KEY
    from proxy.edge.shutdown import end_grace
    from tests.helpers.proxy_server import serve

    sent = asyncio.Event()

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(ev(chunk({"role": "assistant", "content": "Once"})))
        sent.set()
        await asyncio.Event().wait()
        return resp

    upstream.handler = handler
    async with serve(ON, upstream.url) as (base, app), aiohttp.ClientSession() as http:
        answer = asyncio.ensure_future(http.post(base + CHAT, data=b'{"model":"m","messages":[]}'))
        await asyncio.wait_for(sent.wait(), 5)
        if moment == "answer_in_flight":
            while not app[INFLIGHT_KEY]:
                await asyncio.sleep(0.01)
        else:
            # Step by step: this test runs again before the handler resumes on its finished send.
            while not all(t.done() for t in app[PENDING_KEY]):
                await asyncio.sleep(0)
            assert (len(app[PENDING_KEY]), len(app[INFLIGHT_KEY])) == (1, 0)
        app[SHUTDOWN_KEY].set()
        end_grace(app)
        r = await asyncio.wait_for(answer, 5)
        assert r.status == 503
        assert orjson.loads(await r.read())["error"]["type"] == "proxy_shutdown"
        r.release()


# --- sans-I/O pieces ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"{}", b'{"stream":true,"stream_options":{"include_usage":true}}'),
        (b" {\n} ", b' {"stream":true,"stream_options":{"include_usage":true}\n} '),
        (b'{"stream":false}', b'{"stream_options":{"include_usage":true},"stream":true}'),
        (b'{\n  "stream" : null\n}\n', b'{"stream_options":{"include_usage":true},\n  "stream" : true\n}\n'),
        (
            b'{"x":"[{\\"","stream":false}',
            b'{"stream_options":{"include_usage":true},"x":"[{\\"","stream":true}',
        ),
        (
            b'{"stream":false,"stream":null}',
            b'{"stream_options":{"include_usage":true},"stream":true,"stream":true}',
        ),
        (b'{"stream":true}', None),
        (b'{"stream":false,"stream":true}', None),
        (b'{"stream":0}', None),
        (b"[]", None),
        (b"nope", None),
    ],
)
def test_stream_request_splices_only_the_stream_members(body: bytes, expected: bytes | None) -> None:
    assert stream_request(body) == expected


def test_top_level_values_tell_nesting_from_either_end() -> None:
    inner = b'{"a":{"stream":false},"b":[{"stream":null}],"c":"\\"stream\\": false"'
    for body in (inner + b',"stream":false}', b'{"stream":false,' + inner[1:] + b"}"):
        (span,) = top_level_values(body, "stream")
        assert body[span[0] : span[1]] == b"false"
    assert top_level_values(inner + b"}", "stream") == []


def test_stream_request_is_cheap_for_a_big_body() -> None:
    """A 2 MB history with ``"stream": false`` last: the member is found by counting brackets
    from the nearer end, not by reading every string (a full scan took ~40-120 ms here)."""
    messages = [
        {"role": "tool", "tool_call_id": f"c{i}", "content": 'x = {"a": [1]}\n' * 100} for i in range(1200)
    ]
    raw = orjson.dumps({"model": "m", "messages": messages, "stream": False})
    best = 1.0
    for _ in range(3):
        t0 = time.perf_counter()
        out = stream_request(raw, parsed=True)
        best = min(best, time.perf_counter() - t0)
    assert best < 0.03, best  # ~3-7 ms here
    assert out is not None and out.endswith(b',"stream":true}')


def test_stream_rejected_only_for_a_4xx_about_the_stream() -> None:
    about = b'{"error":{"param":"stream","message":"m"}}'
    assert stream_rejected(400, about)
    assert not stream_rejected(500, about)
    assert not stream_rejected(400, b'{"error":{"param":"messages"}}')
    assert not stream_rejected(400, b"not json")


def test_error_status_from_the_error_event() -> None:
    assert error_status(b'{"error":{"code":400,"message":"x"}}') == 400
    assert error_status(b'{"object":"error","code":422}') == 422
    assert error_status(b'{"error":{"code":"context_length_exceeded"}}') == 502
    assert error_status(b'{"error":"boom"}') == 502


def test_assembler_joins_texts_logprobs_and_choices() -> None:
    asm = CompletionAssembler()
    lp = {"token": "a", "logprob": -0.1, "top_logprobs": []}
    for c in (
        {**BASE, "choices": [{"index": 1, "delta": {"role": "assistant", "content": "B"}, "logprobs": None}]},
        {
            **BASE,
            "choices": [
                {"index": 0, "delta": {"reasoning_content": "think "}, "logprobs": {"content": [lp]}},
                {"index": 1, "delta": {"content": "b"}, "finish_reason": "stop"},
            ],
        },
        {**BASE, "choices": [{"index": 0, "delta": {"reasoning_content": "more", "content": "A"}}]},
        {
            **BASE,
            "choices": [{"index": 0, "delta": {}, "finish_reason": "length", "stop_reason": None}],
            "timings": {"predicted_n": 3},
        },
    ):
        asm.add(c)
    assert asm.result() == {
        "id": "chatcmpl-q",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "m",
        "timings": {"predicted_n": 3},
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "A", "reasoning_content": "think more"},
                "logprobs": {"content": [lp]},
                "finish_reason": "length",
                "stop_reason": None,
            },
            {
                "index": 1,
                "message": {"role": "assistant", "content": "Bb"},
                "logprobs": None,
                "finish_reason": "stop",
            },
        ],
    }


def test_assembly_of_an_unreadable_or_unfinished_stream_has_no_answer() -> None:
    a = Assembly()
    a.feed(b"data: {not json}\n\n" + ev(chunk(finish="stop")))
    a.finish()
    assert (a.answer(), a.empty) == (None, False)
    b = Assembly()
    b.feed(b": ping\n\n" + ev(chunk({"content": "x"})))
    b.finish()
    assert (b.answer(), b.complete) == (None, False)
    c = Assembly()
    c.feed(b": ping\n\ndata: [DO")
    c.finish()
    assert c.empty


# --- llama-cpp-python, for real (marker realmodel) -----------------------------------------------------


@pytest.fixture(scope="module")
def llama_url() -> Iterator[str]:
    from tests.helpers.llama_server import find_or_fetch_gguf, llama_available, llama_python, llama_server

    python = llama_python()
    if not llama_available(python):
        pytest.fail(
            "llama-cpp-python[server] is not installed: `pip install -e '.[test]'` installs it, "
            "or deselect these tests with -m 'not realmodel'"
        )
    with llama_server(find_or_fetch_gguf(), python=python) as url:
        yield url


#: A generation of 3,000 tokens (min_tokens keeps the model from stopping early): 100 s and more
#: on 2 cores, so an answer to the next request well within that can only mean the server stopped
#: generating when loopguard closed the upstream stream.
LONG_TOKENS = 3000
LONG: dict[str, Any] = {
    "model": "smollm2-135m-instruct",
    "messages": [{"role": "user", "content": "Write a very long story about a dragon, with many chapters."}],
    "max_tokens": LONG_TOKENS,
    "min_tokens": LONG_TOKENS,
    "temperature": 0,
}
TINY: dict[str, Any] = {
    "model": "smollm2-135m-instruct",
    "messages": [{"role": "user", "content": "Hi"}],
    "max_tokens": 1,
    "temperature": 0,
}


@pytest.mark.realmodel
async def test_real_llama_cpp_python_is_freed_when_the_agent_hangs_up_on_a_json_request(
    llama_url: str,
) -> None:
    """Measured: llama-cpp-python 0.3.x generates a non-streamed answer to
    its end after the client hung up (the next request waited 181 s direct, 194 s through
    loopguard without the switch); a stream it stops at once (0.2 s). With
    ``stream_json_requests`` the agent's JSON request goes upstream as a stream, so the hang-up
    frees the server: the next request is answered in a fraction of the time the rest of the
    generation would take (the bound scales with the speed measured just before, since the
    machine may be shared)."""
    from tests.helpers.proxy_server import serve

    async with serve(ON, llama_url) as (base, _), aiohttp.ClientSession() as http:
        t0 = time.monotonic()
        async with http.post(base + CHAT, json={**LONG, "max_tokens": 48, "min_tokens": 48}) as r:
            assert r.status == 200
            assert orjson.loads(await r.read())["object"] == "chat.completion"
        per_token = (time.monotonic() - t0) / 48
        _, writer = await raw_post(base, orjson.dumps(LONG))
        await asyncio.sleep(1.0)  # generating
        writer.close()
        t0 = time.monotonic()
        async with http.post(base + CHAT, json=TINY) as r:
            assert r.status == 200
            await r.read()
        waited = time.monotonic() - t0
        rest = per_token * LONG_TOKENS  # about what the rest of the generation would take
        print(f"next request answered {waited:.2f} s after the hang-up; the rest would take ~{rest:.0f} s")
        assert waited < max(30.0, rest / 4), (waited, rest)
        snap = await snapshot(base)
        assert snap["disconnects"] == 1


@pytest.mark.realmodel
@pytest.mark.parametrize("shape", ["text", "named_tool", "auto_tool"])
async def test_real_llama_cpp_python_answers_the_same_through_the_stream(llama_url: str, shape: str) -> None:
    """The assembled answer says what the server's own JSON answer says (temperature 0): the same
    text or the same calls and finish_reason; ``usage`` is missing because llama-cpp-python
    streams none. ``tool_choice: "auto"`` with tools is refused as a stream (an empty 200
    stream), so that request goes once more as it came (``stream_fallback``)."""
    from tests.helpers.proxy_server import serve
    from tests.helpers.realmodel_probe import MODEL, REQUEST_PARAMS, SYSTEM_PROMPT, TOOL_CHOICES, TOOLS

    body: dict[str, Any] = {"model": MODEL, **REQUEST_PARAMS}
    if shape == "text":
        body["messages"] = [{"role": "user", "content": "Say hello in five words."}]
        body["max_tokens"] = 12
    else:
        body["messages"] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": "What does the file config.yaml contain?"},
        ]
        body["tools"] = TOOLS
        body["tool_choice"] = TOOL_CHOICES["named" if shape == "named_tool" else "auto"]
    async with serve(ON, llama_url) as (base, _), aiohttp.ClientSession() as http:
        async with http.post(llama_url + "/chat/completions", json=body) as r:
            direct = orjson.loads(await r.read())
        async with http.post(base + CHAT, json=body) as r:
            assert (r.status, r.content_type) == (200, "application/json")
            via = orjson.loads(await r.read())

    def gist(answer: dict[str, Any]) -> Any:
        choice = answer["choices"][0]
        msg = choice["message"]
        calls_ = [(c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls") or []]
        return answer["object"], msg["role"], msg.get("content"), calls_, choice["finish_reason"]

    assert gist(via) == gist(direct)
    if shape == "auto_tool":  # the fallback: the server's own JSON answer, usage included
        assert via["usage"] == direct["usage"]
    else:
        assert "usage" not in via
