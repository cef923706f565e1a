"""Integration tests of the HTTP edge through the real server (DESIGN §1, §3, §7).

Every test runs the same code as ``loopguard serve`` (``make_proxy``) in front of a fake upstream on a
real port (``upstream``) and talks to it as an agent would: with a raw aiohttp client that adds no
headers of its own, with raw sockets where connection handling matters, or with the official SDK.
Timing properties (no SSE buffering, prompt upstream close on disconnect) are proven with events,
never with sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx2
import openai
import orjson
import pytest
import structlog
from aiohttp import web
from multidict import CIMultiDict

import proxy.request.rewrite
from proxy.config import Config
from proxy.edge.observe import configure_logging
from proxy.guards.repeat_reminder import DETAILED_TEXT, GENTLE_TEXT
from proxy.request.conversation import key_digest
from tests.helpers.fakes import (
    FakeUpstream,
    agent_history,
    completion,
    looping_handler,
    only_guard,
    repeated_call_messages,
    sse_events,
    tool_call,
)

CHAT = "/v1/chat/completions"
#: The test agent sends only the headers a test names (plus Host and Content-Length).
AGENT_SKIP = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")


@pytest.fixture
async def agent() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(auto_decompress=False, skip_auto_headers=AGENT_SKIP) as s:
        yield s


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lower(headers: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def fixed(
    status: int = 200,
    body: bytes = b"",
    headers: Any = None,
    reason: str | None = None,
) -> Any:
    """An upstream handler answering every request with exactly this status, body and headers."""

    async def handler(request: web.Request, _body: bytes) -> web.StreamResponse:
        return web.Response(status=status, reason=reason, body=body, headers=headers)

    return handler


async def stream_events(request: web.Request, events: list[bytes]) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for ev in events:
        await resp.write(ev)
    await resp.write_eof()
    return resp


def body_of(messages: list[dict[str, Any]], stream: bool = False) -> bytes:
    return orjson.dumps({"model": "m", "messages": messages, "stream": stream})


# --- byte-identical passthrough ------------------------------------------------------------------

ODD_BODY = (
    b'  {\n\t"stream" :false , "temperature":0.50,\n'
    b'"messages":[ {"content":"caf\\u00e9 \xc3\xa9 \\"q\\" \\/","role" : "user"} ],'
    b' "model":"m", "extra":{"b":1,"a":[1.0, 2e3]}, "model_dup":"x"   }\r\n '
)


async def test_untouched_chat_request_is_byte_identical(upstream: FakeUpstream, make_proxy, agent) -> None:
    answer = b'{"id":"x",  "choices":[] ,"odd":  "\\u00e9"}'
    upstream.handler = fixed(200, answer, {"Content-Type": "application/json"})
    base = await make_proxy()
    async with agent.post(base + CHAT, data=ODD_BODY, headers={"Content-Type": "application/json"}) as r:
        assert r.status == 200
        assert await r.read() == answer
    (rec,) = upstream.requests
    assert (rec.method, rec.path_qs) == ("POST", CHAT)
    assert rec.body == ODD_BODY


async def test_5mb_agent_history_is_forwarded_byte_identical(
    upstream: FakeUpstream, make_proxy, agent
) -> None:
    # ~300 calls (under the circuit breaker's lifetime cap of 300), ASCII escapes + indentation
    raw = json.dumps(agent_history(290, 17_000), indent=1).encode()
    assert len(raw) > 5 * 1024 * 1024
    base = await make_proxy()  # default max_body_mb (64)
    async with agent.post(base + CHAT, data=raw, headers={"Content-Type": "application/json"}) as r:
        assert r.status == 200
        assert (await r.json())["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "read_file"
    (rec,) = upstream.requests
    assert rec.body == raw


async def test_untouched_streaming_chat_request_is_byte_identical(
    upstream: FakeUpstream, make_proxy, agent
) -> None:
    raw = json.dumps({"messages": repeated_call_messages(2), "model": "m", "stream": True}, indent=2).encode()
    base = await make_proxy()
    async with agent.post(base + CHAT, data=raw) as r:
        got = await r.read()
    assert upstream.requests[0].body == raw
    assert got == b"".join(sse_events([tool_call("read_file", '{"path": "app.py"}', "call_3")]))


@pytest.mark.parametrize(
    ("method", "path", "body", "expected"),
    [
        ("GET", "/v1/models?x=1", None, "/v1/models?x=1"),
        ("GET", "/health", None, "/health"),
        ("GET", "/props?a=1&b=%20c", None, "/props?a=1&b=%20c"),
        ("PUT", "/v1/files/file-1?purpose=batch", b"\x00\x01binary\xff", "/v1/files/file-1?purpose=batch"),
        ("DELETE", "/v1/files/file-1", None, "/v1/files/file-1"),
        ("POST", "/v1/embeddings", b'{"input": "x",  "model":"e"}', "/v1/embeddings"),
        ("PATCH", "/v1beta/thing", b"{}", "/v1beta/thing"),
        ("GET", "/v1/files/a%2Fb%20c?q=x%2By&r=1+2", None, "/v1/files/a%2Fb%20c?q=x%2By&r=1+2"),
        ("OPTIONS", "/v1/models", None, "/v1/models"),
    ],
)
async def test_other_paths_and_methods(
    upstream: FakeUpstream, make_proxy, agent, method: str, path: str, body: bytes | None, expected: str
) -> None:
    upstream.handler = fixed(200, b"ok:" + method.encode(), {"X-Up": "1"})
    base = await make_proxy()
    async with agent.request(method, base + path, data=body) as r:
        assert r.status == 200
        assert await r.read() == b"ok:" + method.encode()
        assert r.headers["X-Up"] == "1"
    (rec,) = upstream.requests
    assert (rec.method, rec.path_qs, rec.body) == (method, expected, body or b"")


@pytest.mark.parametrize(
    ("prefix", "path", "expected"),
    [
        ("/api/v1", "/v1/models?x=1", "/api/v1/models?x=1"),
        ("/api/v1", CHAT, "/api/v1/chat/completions"),
        ("/api/v1/", "/v1/models", "/api/v1/models"),
        ("/api/v1", "/health", "/health"),
        ("/api/v1", "/v1", "/api/v1"),
        ("/openai", "/v1/chat/completions?api-version=2", "/openai/chat/completions?api-version=2"),
        ("", "/v1/models", "/models"),
        # the base URL's own query goes with every request (Azure's api-version)
        (
            "/openai/deployments/d?api-version=2024-02-01",
            CHAT,
            "/openai/deployments/d/chat/completions?api-version=2024-02-01",
        ),
        (
            "/openai/deployments/d?api-version=2024-02-01",
            "/v1/models?limit=5",
            "/openai/deployments/d/models?api-version=2024-02-01&limit=5",
        ),
        ("/v1?api-version=1&k=v", "/v1/models?api-version=2", "/v1/models?k=v&api-version=2"),
        ("/v1?api-version=1", "/health", "/health?api-version=1"),
    ],
)
async def test_upstream_base_with_path_prefix(
    upstream: FakeUpstream, make_proxy, agent, prefix: str, path: str, expected: str
) -> None:
    upstream.handler = fixed(200, b"{}")
    origin = upstream.url.removesuffix("/v1")
    base = await make_proxy(upstream_url=origin + prefix)
    method = "POST" if "chat" in path else "GET"
    async with agent.request(method, base + path, data=b"{}" if method == "POST" else None) as r:
        assert r.status == 200
    assert upstream.requests[0].path_qs == expected


async def test_head_request(upstream: FakeUpstream, make_proxy, agent) -> None:
    upstream.handler = fixed(200, b"0123456789", {"X-Up": "1"})
    base = await make_proxy()
    async with agent.head(base + "/v1/models") as r:
        assert r.status == 200
        assert r.headers["X-Up"] == "1"
        assert r.headers["Content-Length"] == "10"
        assert await r.read() == b""
    assert upstream.requests[0].method == "HEAD"


async def test_expect_100_continue_and_chunked_request_bodies(
    upstream: FakeUpstream, make_proxy, agent
) -> None:
    """curl sends ``Expect: 100-continue`` with big bodies; SDKs may stream bodies chunked."""
    upstream.handler = fixed(200, b"{}")
    base = await make_proxy()
    raw = json.dumps(agent_history(40, 4000), indent=1).encode()
    async with agent.post(base + CHAT, data=raw, expect100=True) as r:
        assert r.status == 200
    assert upstream.requests[-1].body == raw

    async def gen() -> AsyncIterator[bytes]:
        for i in range(0, len(raw), 70_001):
            yield raw[i : i + 70_001]

    async with agent.post(base + CHAT, data=gen()) as r:
        assert r.status == 200
    assert upstream.requests[-1].body == raw


# --- headers ---------------------------------------------------------------------------------------


async def test_request_headers_end_to_end_and_hop_by_hop_dropped(
    upstream: FakeUpstream, make_proxy, agent
) -> None:
    seen: list[list[tuple[str, str]]] = []

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        seen.append(list(request.headers.items()))
        return web.json_response({})

    upstream.handler = handler
    base = await make_proxy()
    headers = [
        ("Authorization", "Bearer sk-agent-key"),
        ("X-Foo", "bar  baz"),
        ("X-Multi", "a"),
        ("X-Multi", "b"),
        ("Content-Type", "application/json"),
        ("Connection", "keep-alive, X-Drop-Me"),
        ("X-Drop-Me", "1"),
        ("Keep-Alive", "timeout=5"),
        ("TE", "trailers"),
        ("Upgrade", "h2c"),
        ("Proxy-Authorization", "Basic cHJveHk6c2VjcmV0"),
        ("Proxy-Connection", "keep-alive"),
    ]
    async with agent.post(base + CHAT, data=b'{"messages": []}', headers=headers) as r:
        assert r.status == 200
    (items,) = seen
    names = sorted({k.lower() for k, _ in items})
    assert names == ["authorization", "content-length", "content-type", "host", "x-foo", "x-multi"]
    got = lower(upstream.requests[0].headers)
    assert got["host"] == upstream.url.removeprefix("http://").removesuffix("/v1")
    assert got["authorization"] == "Bearer sk-agent-key"
    assert got["x-foo"] == "bar  baz"
    assert got["content-type"] == "application/json"
    assert [v for k, v in items if k.lower() == "x-multi"] == ["a", "b"]


async def test_no_headers_added_that_the_agent_did_not_send(
    upstream: FakeUpstream, make_proxy, agent
) -> None:
    upstream.handler = fixed(200, b"{}")
    base = await make_proxy()
    async with agent.get(base + "/v1/models") as r:
        assert r.status == 200
    async with agent.post(base + CHAT, data=b"{}") as r:
        assert r.status == 200
    get, post = (lower(rec.headers) for rec in upstream.requests)
    assert set(get) == {"host"}
    assert set(post) == {"host", "content-length"}
    # What the agent sends is kept as sent.
    async with agent.get(
        base + "/v1/models", headers={"Accept-Encoding": "br", "User-Agent": "agent/1"}
    ) as r:
        assert r.status == 200
    third = lower(upstream.requests[2].headers)
    assert (third["accept-encoding"], third["user-agent"]) == ("br", "agent/1")


async def test_response_status_reason_headers_relayed(upstream: FakeUpstream, make_proxy, agent) -> None:
    upstream.handler = fixed(
        418,
        b"I'm a teapot\n",
        CIMultiDict(
            [
                ("X-Custom", "v 1"),
                ("Content-Type", "text/plain"),
                ("Set-Cookie", "a=1"),
                ("Set-Cookie", "b=2"),
                ("X-Hop", "1"),
                ("Connection", "X-Hop"),
                ("Keep-Alive", "timeout=9"),
            ]
        ),
        reason="Short And Stout",
    )
    base = await make_proxy()
    async with agent.get(base + "/v1/models") as r:
        assert (r.status, r.reason) == (418, "Short And Stout")
        assert await r.read() == b"I'm a teapot\n"
        assert r.headers["X-Custom"] == "v 1"
        assert r.headers["Content-Type"] == "text/plain"
        assert r.headers.getall("Set-Cookie") == ["a=1", "b=2"]
        assert "X-Hop" not in r.headers
        assert "Keep-Alive" not in r.headers


@pytest.mark.parametrize(
    ("status", "body", "headers"),
    [
        (400, b'{"error":{"message":"bad  request","type":"invalid_request_error"}}', {}),
        (401, b'{"error": {"message": "Incorrect API key"}}', {"WWW-Authenticate": "Bearer"}),
        (404, b"Not Found", {}),
        (429, b'{"error":{"type":"rate_limit"}}', {"Retry-After": "7", "X-RateLimit-Remaining": "0"}),
        (500, b"Internal Server Error\n\xff\xfe", {}),
        (503, b'{"error":{"message":"Loading model","code":503}}', {"Retry-After": "1"}),
        (307, b"", {"Location": "http://elsewhere.invalid/v1/chat/completions"}),
        (204, b"", {"X-Empty": "1"}),
    ],
)
async def test_upstream_errors_reach_agent_exactly(
    upstream: FakeUpstream, make_proxy, agent, status: int, body: bytes, headers: dict[str, str]
) -> None:
    upstream.handler = fixed(status, body, {"Content-Type": "application/json", **headers})
    base = await make_proxy()
    async with agent.post(base + CHAT, data=body_of(repeated_call_messages(1)), allow_redirects=False) as r:
        assert r.status == status
        assert await r.read() == body
        for k, v in headers.items():
            assert r.headers[k] == v


async def test_gzip_response_passes_through_compressed(upstream: FakeUpstream, make_proxy, agent) -> None:
    plain = orjson.dumps(completion(content="hello " * 1000))
    packed = gzip.compress(plain, mtime=0)
    upstream.handler = fixed(200, packed, {"Content-Type": "application/json", "Content-Encoding": "gzip"})
    base = await make_proxy()
    async with agent.post(
        base + CHAT, data=body_of(repeated_call_messages(1)), headers={"Accept-Encoding": "gzip"}
    ) as r:
        assert r.headers["Content-Encoding"] == "gzip"
        got = await r.read()
    assert got == packed
    assert gzip.decompress(got) == plain
    # asked for an answer the response side reads; compressed anyway, it passes unread (counted:
    # tests/e2e/test_unguarded_responses.py)
    assert lower(upstream.requests[0].headers)["accept-encoding"] == "identity"


async def test_compressed_request_body_is_forwarded_unchanged(make_proxy, agent) -> None:
    """A ``Content-Encoding: gzip`` request body is opaque to the proxy: the upstream must get the
    compressed bytes the agent sent, under the same header (recorded by an upstream that does not
    decompress)."""
    got: list[tuple[dict[str, str], bytes]] = []

    async def handle(request: web.Request) -> web.Response:
        got.append((lower(dict(request.headers)), await request.read()))
        return web.Response(body=b"{}")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, auto_decompress=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        base = await make_proxy(upstream_url=f"http://127.0.0.1:{runner.addresses[0][1]}/v1")
        plain = body_of(repeated_call_messages(3))
        packed = gzip.compress(plain, mtime=0)
        async with agent.post(base + CHAT, data=packed, headers={"Content-Encoding": "gzip"}) as r:
            assert r.status == 200
        ((headers, body),) = got
        assert headers["content-encoding"] == "gzip"
        assert body == packed
    finally:
        await runner.cleanup()


# --- body limit -------------------------------------------------------------------------------------


async def test_body_over_max_body_mb_gets_413(upstream: FakeUpstream, make_proxy, agent) -> None:
    base = await make_proxy({"upstream": {"max_body_mb": 1}})
    big = body_of([{"role": "user", "content": "x" * (1024 * 1024 + 10)}])
    async with agent.post(base + CHAT, data=big) as r:
        assert r.status == 413
        assert orjson.loads(await r.read()) == {
            "error": {
                "message": "loopguard: request body over 1 MiB (upstream.max_body_mb)",
                "type": "request_too_large",
                "code": 413,
            }
        }
    assert upstream.requests == []
    # Just under the limit still goes through.
    ok = body_of([{"role": "user", "content": "x" * (1024 * 1024 - 100)}])
    async with agent.post(base + CHAT, data=ok) as r:
        assert r.status == 200
    assert upstream.requests[0].body == ok


# --- SSE ------------------------------------------------------------------------------------------


async def test_sse_chunks_relayed_in_order_byte_exact(upstream: FakeUpstream, make_proxy, agent) -> None:
    events = [
        b"data: " + orjson.dumps({"i": i, "pad": "é" * (i * 37 % 500), "nl": "a\nb"}) + b"\n\n"
        for i in range(64)
    ]
    events.insert(10, b": keep-alive comment\n\n")
    events.insert(20, b"event: ping\r\ndata: {}\r\n\r\n")
    events.append(b"data: [DONE]\n\n")

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        return await stream_events(request, events)

    upstream.handler = handler
    base = await make_proxy()
    async with agent.post(base + CHAT, data=body_of(repeated_call_messages(1), stream=True)) as r:
        assert r.headers["Content-Type"] == "text/event-stream"
        got = b"".join([c async for c in r.content.iter_any()])
    assert got == b"".join(events)


async def test_sse_is_not_buffered(upstream: FakeUpstream, make_proxy, agent) -> None:
    events = sse_events([tool_call("read_file", '{"path": "app.py"}', "call_1")])
    first_received = asyncio.Event()

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(events[0])
        await first_received.wait()  # only the agent receiving chunk 1 through the proxy releases this
        for ev in events[1:]:
            await resp.write(ev)
        await resp.write_eof()
        return resp

    upstream.handler = handler
    base = await make_proxy()
    try:
        async with agent.post(base + CHAT, data=body_of(repeated_call_messages(1), stream=True)) as r:
            first = await asyncio.wait_for(r.content.readuntil(b"\n\n"), 2)
            assert first == events[0]
            first_received.set()
            rest = await asyncio.wait_for(r.read(), 2)
    finally:
        first_received.set()
    assert first + rest == b"".join(events)


# --- bad input --------------------------------------------------------------------------------------


async def test_non_json_body_forwarded_and_upstream_400_relayed(
    upstream: FakeUpstream, make_proxy, agent
) -> None:
    error = b'{"error":{"message":"Failed to parse the request body as JSON: expected value","code":400}}'
    upstream.handler = fixed(400, error, {"Content-Type": "application/json; charset=utf-8"})
    base = await make_proxy()
    for raw in (b"this is {not json", b"", b"\xff\xfe\x00garbage", b'{"messages": [', b"[1, 2, 3]", b"null"):
        async with agent.post(base + CHAT, data=raw, headers={"Content-Type": "application/json"}) as r:
            assert r.status == 400
            assert await r.read() == error
        assert upstream.requests[-1].body == raw


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "messages": {"role": "user", "content": "not a list"}},
        {"model": "m", "messages": "hello"},
        {"model": "m", "messages": None},
        {"model": "m"},
        {"model": "m", "messages": [*repeated_call_messages(3)[:-1], "not an object"]},
        {"model": "m", "messages": [*repeated_call_messages(3), 42]},
    ],
    ids=["dict", "string", "null", "missing", "non-object-msg", "trailing-int"],
)
async def test_unreadable_messages_forwarded_unchanged(
    upstream: FakeUpstream, make_proxy, agent, body: dict[str, Any]
) -> None:
    upstream.handler = fixed(200, b"{}")
    raw = json.dumps(body).encode()
    base = await make_proxy()
    async with agent.post(base + CHAT, data=raw) as r:
        assert r.status == 200
    assert upstream.requests[0].body == raw


async def test_orphan_tool_message_and_unanswered_call(upstream: FakeUpstream, make_proxy, agent) -> None:
    base = await make_proxy()
    orphan = [
        {"role": "user", "content": "hi"},
        {"role": "tool", "tool_call_id": "nope", "content": "stray result"},
        {"role": "tool", "content": "no id at all"},
    ]
    # The newest step (call 3) has no result yet: no reminder for it yet.
    pending = repeated_call_messages(3, last_result=False)
    # A call that never got its result (call 1) still counts; call 3's result is there.
    skipped = repeated_call_messages(3)
    del skipped[2]
    for messages in (orphan, pending):
        raw = json.dumps({"model": "m", "messages": messages}).encode()
        async with agent.post(base + CHAT, data=raw) as r:
            assert r.status == 200
        assert upstream.requests[-1].body == raw
    raw = json.dumps({"model": "m", "messages": skipped}).encode()
    async with agent.post(base + CHAT, data=raw) as r:
        assert r.status == 200
    sent = upstream.requests[-1].json()["messages"]
    assert sent == [*skipped, {"role": "user", "content": GENTLE_TEXT}]


async def test_invalid_json_arguments_compared_raw(upstream: FakeUpstream, make_proxy, agent) -> None:
    # same_target would see three read_file calls without a target and the same result
    base = await make_proxy({"guards": {"same_target": {"enabled": False}}})
    bad = '{"path": "app.py"'  # not JSON
    raw3 = body_of(repeated_call_messages(3, arguments=bad))
    async with agent.post(base + CHAT, data=raw3) as r:
        assert r.status == 200
    assert upstream.requests[-1].json()["messages"][7] == {"role": "user", "content": GENTLE_TEXT}
    async with agent.post(base + CHAT, data=body_of(repeated_call_messages(5, arguments=bad))) as r:
        assert r.status == 200
    detailed = DETAILED_TEXT.format(tool="read_file", count=5, arguments=bad)
    assert "- arguments: " + bad + "\n" in detailed
    assert upstream.requests[-1].json()["messages"][12] == {"role": "user", "content": detailed}
    # Invalid JSON that differs only in whitespace is a different raw string: no chain.
    messages = repeated_call_messages(3, arguments=bad)
    messages[3]["tool_calls"][0]["function"]["arguments"] = '{"path":"app.py"'
    raw = body_of(messages)
    async with agent.post(base + CHAT, data=raw) as r:
        assert r.status == 200
    assert upstream.requests[-1].body == raw


# --- upstream failures ---------------------------------------------------------------------------


async def test_upstream_down_gives_502_without_secrets(make_proxy, agent) -> None:
    port = closed_port()
    base = await make_proxy(upstream_url=f"http://127.0.0.1:{port}/v1")
    async with agent.post(
        base + CHAT,
        data=body_of(repeated_call_messages(1)),
        headers={"Authorization": "Bearer sk-agent-secret"},
    ) as r:
        assert r.status == 502
        assert r.headers["Content-Type"].startswith("application/json")
        raw = await r.read()
    err = orjson.loads(raw)["error"]
    assert err["type"] == "upstream_unreachable"
    assert isinstance(err["message"], str) and err["message"]
    assert b"sk-agent-secret" not in raw
    async with agent.get(base + "/v1/models") as r:
        assert r.status == 502
    async with agent.get(base + "/loop-guard") as r:
        assert (await r.json())["upstream_errors"] == 2


async def test_upstream_url_with_credentials_down_gives_502_without_secrets(make_proxy, agent) -> None:
    """An upstream base URL may carry credentials (user info); the agent's own ``Authorization``
    must still be forwarded (here: the upstream is down, so 502) and neither secret may leak."""
    port = closed_port()
    base = await make_proxy(upstream_url=f"http://user:sk-url-secret@127.0.0.1:{port}/v1")
    for headers in ({}, {"Authorization": "Bearer sk-agent-secret"}):
        async with agent.post(base + CHAT, data=body_of(repeated_call_messages(1)), headers=headers) as r:
            raw = await r.read()
            assert r.status == 502, (headers, raw)
        assert orjson.loads(raw)["error"]["type"] == "upstream_unreachable"
        assert b"sk-agent-secret" not in raw
        assert b"sk-url-secret" not in raw


def _dies_after_two_events(events: list[bytes]) -> Any:
    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(events[0])
        await resp.write(events[1])
        assert request.transport is not None
        request.transport.close()  # abrupt: no terminating chunk (close() still flushes the two)
        return resp

    return handler


async def test_upstream_dies_mid_stream_raw_client_sees_error_event(
    upstream: FakeUpstream, make_proxy, agent
) -> None:
    events = sse_events(content="hello world, this is long")
    upstream.handler = _dies_after_two_events(events)
    base = await make_proxy()
    got = await broken_stream(agent, base)
    assert got.startswith(events[0] + events[1])
    tail = got[len(events[0] + events[1]) :]
    assert tail.startswith(b'data: {"error"')
    assert tail.endswith(b"\n\n")
    assert orjson.loads(tail[len(b"data: ") :])["error"]["message"]
    assert b"[DONE]" not in got


async def test_upstream_dies_mid_stream_sdk_raises(upstream: FakeUpstream, make_proxy) -> None:
    events = sse_events(content="hello world, this is long")
    upstream.handler = _dies_after_two_events(events)
    base = await make_proxy()
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0)
    received: list[Any] = []
    try:
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        # The proxy's error event (openai.APIError) or a broken transfer: anything but a clean end.
        with pytest.raises((openai.APIError, httpx2.TransportError)):
            async for chunk in stream:
                received.append(chunk)
        assert len(received) == 2
    finally:
        await client.close()


async def test_upstream_dies_mid_json_body_agent_sees_error(
    upstream: FakeUpstream, make_proxy, agent
) -> None:
    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json", "Content-Length": "1000"})
        await resp.prepare(request)
        await resp.write(b'{"id": "chatcmpl-1", ')
        assert request.transport is not None
        request.transport.close()  # 980 bytes short of Content-Length
        return resp

    upstream.handler = handler
    base = await make_proxy()
    async with agent.post(base + CHAT, data=body_of(repeated_call_messages(1))) as r:
        assert r.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await r.read()


async def test_agent_disconnect_closes_upstream_request(upstream: FakeUpstream, make_proxy) -> None:
    events = sse_events(content="a long generation " * 4)
    upstream_closed = asyncio.Event()

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            await resp.write(events[0])
            await asyncio.Event().wait()  # generating forever, until the proxy hangs up
        except (asyncio.CancelledError, ConnectionError):
            upstream_closed.set()
            raise
        finally:
            upstream_closed.set()
        return resp

    upstream.handler = handler
    base = await make_proxy()
    port = int(base.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = body_of(repeated_call_messages(1), stream=True)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    buf = b""
    while events[0] not in buf:
        data = await asyncio.wait_for(reader.read(65536), 2)
        assert data, "proxy closed the connection before the first chunk"
        buf += data
    assert not upstream_closed.is_set()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    writer.close()
    await asyncio.wait_for(upstream_closed.wait(), 2)
    assert loop.time() - t0 < 1.0


async def test_agent_disconnect_before_upstream_answers_closes_upstream_request(
    upstream: FakeUpstream, make_proxy
) -> None:
    """A non-streaming generation: the agent gives up while the upstream is still thinking."""
    started = asyncio.Event()
    upstream_closed = asyncio.Event()

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        started.set()
        try:
            await asyncio.Event().wait()  # a long generation, until the proxy hangs up
        finally:
            upstream_closed.set()
        raise AssertionError("unreachable")

    upstream.handler = handler
    base = await make_proxy()
    port = int(base.rsplit(":", 1)[1])
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    body = body_of(repeated_call_messages(1))
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await asyncio.wait_for(started.wait(), 2)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    writer.close()
    await asyncio.wait_for(upstream_closed.wait(), 2)
    assert loop.time() - t0 < 1.0


# --- proxy's own endpoints -------------------------------------------------------------------------


async def test_healthz(make_proxy, agent) -> None:
    base = await make_proxy()
    async with agent.get(base + "/loop-guard/healthz") as r:
        assert r.status == 200
        assert await r.json(content_type=None) == {"status": "ok"}


async def test_stats_counts_after_scripted_sequence(upstream: FakeUpstream, make_proxy, agent) -> None:
    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        if not request.path.endswith("/chat/completions"):
            return web.json_response({"data": []})
        try:
            orjson.loads(body)
        except orjson.JSONDecodeError:
            return web.Response(status=400, body=b"bad json")
        return await looping_handler(request, body)

    upstream.handler = handler
    base = await make_proxy(only_guard("repeat_reminder"))
    async with agent.get(base + "/v1/models") as r:
        assert r.status == 200
    async with agent.post(base + CHAT, data=b"not json") as r:
        assert r.status == 400
    for n in range(1, 6):  # calls 1..5 of one chain: fresh reminders at 3 and 5
        async with agent.post(base + CHAT, data=body_of(repeated_call_messages(n))) as r:
            assert r.status == 200
    async with agent.get(base + "/loop-guard/healthz") as r:
        assert r.status == 200
    async with agent.get(base + "/loop-guard") as r:
        assert r.status == 200
        snap = await r.json()
    assert snap["requests"] == 7
    assert snap["guarded_requests"] == 5  # "not json" counts under unguarded
    assert snap["unguarded"] == {"not_json": 1}
    assert snap["rewritten_requests"] == 3  # n = 3 (fresh), 4 (re-derived), 5 (fresh)
    assert snap["reminders_injected"] == 2
    assert snap["results_withheld"] == 0
    assert snap["per_rule"] == {"repeat_reminder": 2}
    assert snap["internal_errors"] == 0
    assert snap["upstream_errors"] == 0
    # The stats endpoint itself is read-only and never forwarded.
    assert [rec.path_qs for rec in upstream.requests].count("/loop-guard") == 0


async def test_admin_token(upstream: FakeUpstream, make_proxy, agent) -> None:
    upstream.handler = fixed(200, b"{}")
    base = await make_proxy({"admin_token": "adm-123"})
    for path in ("/loop-guard", "/loop-guard/healthz"):
        async with agent.get(base + path) as r:
            assert r.status == 401
        async with agent.get(base + path, headers={"Authorization": "Bearer wrong"}) as r:
            assert r.status == 401
        async with agent.get(base + path, headers={"Authorization": "Bearer adm-123"}) as r:
            assert r.status == 200
    # Proxied routes do not need (and do not get) the admin token.
    async with agent.get(base + "/v1/models", headers={"Authorization": "Bearer sk-agent"}) as r:
        assert r.status == 200
    assert lower(upstream.requests[0].headers)["authorization"] == "Bearer sk-agent"


async def test_fail_open_when_guards_raise(
    upstream: FakeUpstream, make_proxy, agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("guard bug")

    monkeypatch.setattr(proxy.request.rewrite, "evaluate_resumed", boom)
    base = await make_proxy()
    raw = body_of(repeated_call_messages(3))  # would normally get a reminder
    async with agent.post(base + CHAT, data=raw) as r:
        assert r.status == 200
        answer = await r.json()
    assert answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "read_file"
    assert upstream.requests[0].body == raw
    async with agent.get(base + "/loop-guard") as r:
        snap = await r.json()
    assert snap["internal_errors"] == 1
    assert snap["rewritten_requests"] == 0
    assert snap["reminders_injected"] == 0


# --- logging --------------------------------------------------------------------------------------


@pytest.fixture
def restore_structlog() -> Any:
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


async def test_one_request_log_line_without_secrets(
    upstream: FakeUpstream, make_proxy, agent, capfd: pytest.CaptureFixture[str], restore_structlog: Any
) -> None:
    configure_logging("info")
    base = await make_proxy(only_guard("repeat_reminder"))
    messages = repeated_call_messages(3)
    messages[0]["content"] = "TOPSECRETCONTENT"
    capfd.readouterr()
    async with agent.post(
        base + CHAT,
        data=body_of(messages),
        headers={"Authorization": "Bearer sk-secret-123", "X-Session-Id": "sess-42"},
    ) as r:
        assert r.status == 200
        await r.read()
    out = err = ""
    for _ in range(200):  # the line is written right after the response ends; poll, not time
        captured = capfd.readouterr()
        out, err = out + captured.out, err + captured.err
        if '"request"' in err:
            break
        await asyncio.sleep(0.005)
    assert "sk-secret-123" not in out + err
    assert "TOPSECRETCONTENT" not in out + err
    lines = [orjson.loads(line) for line in err.splitlines() if line.startswith("{")]
    (event,) = [e for e in lines if e.get("event") == "request"]
    assert event["conversation"] == key_digest("sess-42")
    assert event["model"] == "m"
    assert event["stream"] is False
    assert event["status"] == 200
    assert isinstance(event["upstream_ms"], int | float) and event["upstream_ms"] >= 0
    assert isinstance(event["added_ms"], int | float) and event["added_ms"] >= 0
    assert event["actions"] == [
        {"rule": "repeat_reminder", "kind": "remind", "tool": "read_file", "count": 3, "limit": 3}
    ]


async def test_disconnected_request_is_logged_too(
    upstream: FakeUpstream, make_proxy, capfd: pytest.CaptureFixture[str], restore_structlog: Any
) -> None:
    """DESIGN §7: one line per request, also when the agent hangs up mid-stream."""
    configure_logging("info")
    events = sse_events(content="a long generation")
    upstream_closed = asyncio.Event()
    upstream.handler = lingering(events[:1], upstream_closed)
    base = await make_proxy()
    capfd.readouterr()
    await stream_and_hang_up(base, events[0])
    await asyncio.wait_for(upstream_closed.wait(), 2)
    err = await request_line_err(capfd)
    lines = [orjson.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert len([e for e in lines if e.get("event") == "request"]) == 1, err


async def test_expect_100_continue_is_answered_by_the_proxy_not_forwarded(make_proxy) -> None:
    """Curl sends ``Expect: 100-continue`` with a 2 MiB body; an upstream that
    never sends 100 (a raw HTTP/1.1 server here, reading the head and then the body) must get a
    plain request: the proxy answers the agent's ``Expect`` itself and forwards no ``Expect``."""
    heads: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        heads.append(head)
        await reader.readexactly(content_length(head))  # never sends "100 Continue": waits for the body
        writer.write(RAW_OK)
        await writer.drain()
        writer.close()

    async with raw_upstream(serve) as url:
        base = await make_proxy(upstream_url=url)
        raw = b'{"model": "m", "messages": [], "pad": "' + b"x" * (2 * 1024 * 1024) + b'"}'
        async with aiohttp.ClientSession() as s:
            r = await asyncio.wait_for(s.post(base + CHAT, data=raw, expect100=True), 10)
            assert (r.status, await r.read()) == (200, b"{}")
        assert b"expect:" not in heads[0].lower()


def _ends_cleanly_after(events: list[bytes]) -> Any:
    """An upstream that sends ``events`` and ends its body properly (terminating chunk), with no
    finish_reason and no ``[DONE]`` among them."""

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for e in events:
            await resp.write(e)
        await resp.write_eof()
        return resp

    return handler


@pytest.mark.parametrize("shape", ["content_then_nothing", "empty_200_stream"])
async def test_a_stream_that_stops_short_is_no_success(
    upstream: FakeUpstream,
    make_proxy,
    agent,
    shape: str,
    capfd: pytest.CaptureFixture[str],
    restore_structlog: Any,
) -> None:
    """A stream that ends without a finish_reason and without [DONE] (also an
    empty 200 stream, as llama-cpp-python sends when it rejects a streaming tool choice) ends with
    the error event and a broken connection, counted and logged at warning."""
    events = sse_events(content="hello world, this is long")[:3] if shape == "content_then_nothing" else []
    assert all(b'finish_reason":"' not in e and b"[DONE]" not in e for e in events)
    upstream.handler = _ends_cleanly_after(events)
    configure_logging("info")
    base = await make_proxy()
    capfd.readouterr()
    got = await broken_stream(agent, base)
    err = await request_line_err(capfd)
    (line,) = [orjson.loads(x) for x in err.splitlines() if x.startswith("{") and '"request"' in x]
    assert (line["level"], line["upstream_error"]) == ("warning", "IncompleteStream")
    prefix = b"".join(events)
    assert got.startswith(prefix)
    tail = got[len(prefix) :]
    assert orjson.loads(tail.removeprefix(b"data: "))["error"]["type"] == "upstream_disconnected"
    async with agent.get(base + "/loop-guard") as r:
        assert (await r.json())["upstream_errors"] == 1


async def test_a_stream_with_a_finish_but_no_done_is_still_a_success(
    upstream: FakeUpstream, make_proxy, agent
) -> None:
    events = [e for e in sse_events(content="hello") if b"[DONE]" not in e]
    upstream.handler = _ends_cleanly_after(events)
    base = await make_proxy()
    async with agent.post(base + CHAT, data=body_of(repeated_call_messages(1), stream=True)) as r:
        assert (r.status, await r.read()) == (200, b"".join(events))


# --- a stalled upstream -----------------------------------------------------------------------------

STALL = {"upstream": {"read_timeout_s": 0.3}}


def _stalls(head: bool, events: list[bytes], content_type: str = "text/event-stream") -> Any:
    """An upstream that sends nothing (``head`` False), or its headers and ``events``, and then
    nothing more, ever (until the proxy hangs up)."""

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        if not head:
            await asyncio.Event().wait()
        resp = web.StreamResponse(headers={"Content-Type": content_type})
        await resp.prepare(request)
        for e in events:
            await resp.write(e)
        await asyncio.Event().wait()
        return resp

    return handler


@pytest.mark.parametrize(
    ("head", "events", "content_type"),
    [
        pytest.param(False, [], "application/json", id="before_the_headers"),
        pytest.param(True, [b'{"id": "chatcmpl-1", "choi'], "application/json", id="mid_json"),
    ],
)
async def test_a_stalled_json_answer_is_a_504(
    upstream: FakeUpstream, make_proxy, agent, head: bool, events: list[bytes], content_type: str
) -> None:
    upstream.handler = _stalls(head, events, content_type)
    base = await make_proxy(STALL)
    post = agent.post(base + CHAT, data=body_of(repeated_call_messages(1)))
    async with await asyncio.wait_for(post, 10) as r:
        assert r.status == 504
        body = orjson.loads(await r.read())
    assert (body["error"]["type"], body["error"]["code"]) == ("upstream_timeout", 504)
    assert "read_timeout_s" in body["error"]["message"]
    async with agent.get(base + "/loop-guard") as r:
        assert (await r.json())["upstream_errors"] == 1


async def test_a_stalled_stream_ends_with_the_error_event(upstream: FakeUpstream, make_proxy, agent) -> None:
    events = sse_events(content="hello world, this is long")[:2]
    upstream.handler = _stalls(True, events)
    base = await make_proxy(STALL)
    got = await broken_stream(agent, base)
    assert got.startswith(b"".join(events))
    error = orjson.loads(got[len(b"".join(events)) :].removeprefix(b"data: "))["error"]
    assert (error["type"], error["code"]) == ("upstream_timeout", 504)
    assert error["message"] == "loopguard: upstream sent nothing for longer than upstream.read_timeout_s"


def test_the_default_read_timeout_ends_every_stall() -> None:
    assert Config().upstream.read_timeout_s == 900.0


@pytest.mark.parametrize("guarded", [True, False], ids=["response_side", "passthrough"])
async def test_an_agent_that_hangs_up_after_done_is_not_disconnected(
    upstream: FakeUpstream,
    make_proxy,
    capfd: pytest.CaptureFixture[str],
    restore_structlog: Any,
    guarded: bool,
) -> None:
    """llama-cpp-python keeps the stream open for a moment after ``[DONE]``; the
    SDK has everything and closes. That request is logged at info, without ``disconnected``."""
    configure_logging("info")
    events = sse_events(content="all done")
    upstream_closed = asyncio.Event()
    upstream.handler = lingering(events, upstream_closed)  # the server lingers after [DONE]
    config = (
        None
        if guarded
        else {
            "response": {
                "max_calls_per_response": 0,
                "max_identical_per_response": 0,
                "max_identical_reads_per_response": 0,
                "degenerate_text": {"enabled": False},
            },
            "stop": {"after_ignored_denials": 0, "on_cap": False},
            "guards": {"monologue": {"stop_at": 0}, "escalation": {"stop": False}},
        }
    )
    base = await make_proxy(config)
    capfd.readouterr()
    await stream_and_hang_up(base, b"[DONE]")
    await asyncio.wait_for(upstream_closed.wait(), 2)
    err = await request_line_err(capfd)
    (line,) = [orjson.loads(x) for x in err.splitlines() if x.startswith("{") and '"request"' in x]
    assert (line["level"], "disconnected" in line, "upstream_error" in line) == ("info", False, False)


async def test_a_request_on_a_connection_the_upstream_just_closed_is_retried_once(make_proxy, agent) -> None:
    """At the upstream's keep-alive idle timeout, a request sent on the
    connection it is closing fails before any answer; the proxy sends it once more on a fresh
    connection. (The raw upstream answers the first request of each connection and closes the
    connection when a second one arrives on it.)"""
    seen: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = True
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            if not first:
                writer.close()  # the idle timeout fired as this request arrived
                return
            first = False
            seen.append(await reader.readexactly(content_length(head)))
            writer.write(RAW_OK)
            await writer.drain()
        writer.close()

    async with raw_upstream(serve) as url:
        base = await make_proxy(upstream_url=url)
        for i in range(3):
            raw = body_of(repeated_call_messages(1 + i))
            async with agent.post(base + CHAT, data=raw) as r:
                assert (r.status, await r.read()) == (200, b"{}")
        assert len(seen) == 3  # each request reached the upstream once, complete
        async with agent.get(base + "/loop-guard") as r:
            assert (await r.json())["upstream_errors"] == 0


async def stream_and_hang_up(base: str, marker: bytes) -> None:
    """A raw agent: POST a streaming chat request, read until ``marker`` arrives, hang up."""
    reader, writer = await asyncio.open_connection("127.0.0.1", int(base.rsplit(":", 1)[1]))
    body = body_of(repeated_call_messages(1), stream=True)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    buf = b""
    while marker not in buf:
        data = await asyncio.wait_for(reader.read(65536), 2)
        assert data
        buf += data
    writer.close()


async def request_line_err(capfd: pytest.CaptureFixture[str]) -> str:
    """stderr up to the request's log line (polled for, not a timing assertion)."""
    err = ""
    for _ in range(100):
        err += capfd.readouterr().err
        if '"request"' in err:
            break
        await asyncio.sleep(0.005)
    return err


def lingering(events: list[bytes], closed: asyncio.Event) -> Any:
    """An upstream that streams ``events`` and then keeps the connection open (sets ``closed``
    when the proxy hangs up on it)."""

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for e in events:
                await resp.write(e)
            await asyncio.Event().wait()
        finally:
            closed.set()
        return resp

    return handler


#: A raw upstream's answer: 200 with an empty JSON object.
RAW_OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


def content_length(head: bytes) -> int:
    """The Content-Length of a raw request head (0 when it has none)."""
    lines = head.split(b"\r\n")
    return next((int(x.split(b":", 1)[1]) for x in lines if x.lower().startswith(b"content-length:")), 0)


@contextlib.asynccontextmanager
async def raw_upstream(serve: Any) -> AsyncIterator[str]:
    """A raw HTTP/1.1 upstream on a free loopback port (``serve(reader, writer)`` per connection);
    yields its base URL."""
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    finally:
        server.close()
        await server.wait_closed()


async def broken_stream(agent: aiohttp.ClientSession, base: str) -> bytes:
    """POST a streaming chat request; its answer (status 200) must end in a broken transfer,
    never a clean end. Returns the bytes received before the break."""
    got = b""
    async with agent.post(base + CHAT, data=body_of(repeated_call_messages(1), stream=True)) as r:
        assert r.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            async for chunk in r.content.iter_any():
                got += chunk
    return got


async def test_malformed_requests_are_logged_without_what_the_agent_sent(
    upstream: FakeUpstream, make_proxy, capfd: pytest.CaptureFixture[str], restore_structlog: Any
) -> None:
    """aiohttp's traceback for a malformed header or chunked body quoted the raw
    bytes (``b'Authorization: Bearer sk-…\\r'``) on stderr. Now one ``bad_request`` line with the
    error's type and status, and nothing the agent sent."""
    configure_logging("info")
    base = await make_proxy()
    port = int(base.rsplit(":", 1)[1])
    capfd.readouterr()
    bad = [
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-MARKER-1\r\r\n"
        b"Content-Length: 2\r\n\r\n{}",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-MARKER-2\r\n"
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\nMARKER-3 message content\r\n0\r\n\r\n",
    ]
    for payload in bad:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(payload)
        head = await asyncio.wait_for(reader.read(100), 2)
        assert head.startswith(b"HTTP/1.0 400") or head.startswith(b"HTTP/1.1 400"), head
        writer.close()
    err = ""
    for _ in range(100):
        out = capfd.readouterr()
        err += out.err + out.out
        if err.count('"bad_request"') >= 2:
            break
        await asyncio.sleep(0.005)
    assert "MARKER" not in err
    lines = [orjson.loads(x) for x in err.splitlines() if x.startswith("{")]
    assert [(x["event"], x["level"], x["status"]) for x in lines] == [("bad_request", "warning", 400)] * 2


async def test_a_long_authorization_header_is_forwarded(upstream: FakeUpstream, make_proxy, agent) -> None:
    """A 9,000-byte token (aiohttp's default limit is 8,190) reaches the upstream
    instead of becoming the proxy's own 400."""
    upstream.handler = fixed(200, b"{}")
    base = await make_proxy()
    token = "Bearer " + "t" * 9000
    async with agent.post(base + CHAT, data=b"{}", headers={"Authorization": token}) as r:
        assert r.status == 200
    assert lower(upstream.requests[0].headers)["authorization"] == token


# --- the request target the upstream gets, and a 413 before the body ---------------------------


async def raw_exchange(port: int, head: bytes, body: bytes = b"") -> bytes:
    """Send ``head`` (and ``body``) on one connection; everything the proxy answers until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head + body)
    await writer.drain()
    got = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return got


@pytest.mark.parametrize(
    ("target", "forwarded"),
    [
        pytest.param("//health", "//health", id="doubled_slash_kept"),
        pytest.param("///x//y?a=1", "///x//y?a=1", id="slashes_and_query_kept"),
        pytest.param("/v1//models", "/v1//models", id="doubled_slash_under_v1"),
        pytest.param("http://agent.example//health", "//health", id="absolute_form_path_only"),
        pytest.param("http://agent.example/v1/models?x=1", "/v1/models?x=1", id="absolute_form_under_v1"),
        pytest.param("/v1/a/../b", "/v1/a/../b", id="dot_dot_segment_kept"),
        pytest.param("/v1/./models", "/v1/./models", id="dot_segment_kept"),
        pytest.param("/%2e%2e/x", "/%2e%2e/x", id="escaped_dot_dot_kept"),
        pytest.param("/v1/a%2Fb/%7Euser", "/v1/a%2Fb/%7Euser", id="escapes_not_requoted"),
        pytest.param(
            "/v1/models?q=../%2e%20x&a=%41", "/v1/models?q=../%2e%20x&a=%41", id="query_not_requoted"
        ),
        pytest.param("http://agent.example/v1/x/../y", "/v1/x/../y", id="absolute_form_dots_kept"),
        pytest.param("/v1/x%zz%", "/v1/x%zz%", id="broken_escape_kept"),
    ],
)
async def test_the_upstream_gets_the_request_target_as_the_agent_sent_it(
    upstream: FakeUpstream, make_proxy, target: str, forwarded: str
) -> None:
    base = await make_proxy()
    port = int(base.rsplit(":", 1)[1])
    got = await raw_exchange(port, f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    assert got.startswith(b"HTTP/1.1 200 ")
    assert [r.path_qs for r in upstream.requests] == [forwarded]


@pytest.mark.parametrize("path", [CHAT, "/v1/embeddings"])
async def test_an_oversized_body_with_expect_100_continue_gets_the_413_at_once(
    upstream: FakeUpstream, make_proxy, path: str
) -> None:
    base = await make_proxy({"upstream": {"max_body_mb": 1}})
    port = int(base.rsplit(":", 1)[1])
    size = 1024 * 1024 + 1
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {size}\r\nExpect: 100-continue\r\n\r\n"
    ).encode()
    got = await raw_exchange(port, head)  # the body is never sent: the client waits for the 100
    status, _, rest = got.partition(b"\r\n")
    assert status == b"HTTP/1.1 413 Request Entity Too Large"
    assert b"100 Continue" not in got
    assert orjson.loads(rest.partition(b"\r\n\r\n")[2]) == {
        "error": {
            "message": "loopguard: request body over 1 MiB (upstream.max_body_mb)",
            "type": "request_too_large",
            "code": 413,
        }
    }
    assert upstream.requests == []
    # a body within the limit still gets its 100 Continue and goes through
    ok = body_of([{"role": "user", "content": "hi"}])
    async with aiohttp.ClientSession() as s, s.post(base + path, data=ok, expect100=True) as r:
        assert r.status == 200
    assert [r.body for r in upstream.requests] == [ok]
