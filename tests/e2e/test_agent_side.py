"""The agent side (:mod:`proxy.edge.connections`): header and body timeouts,
the connection limit, half-closed requests. Raw sockets against the real loopguard server in
front of the fake upstream, so what is asserted is what goes over the wire."""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any

import aiohttp
import orjson
import pytest
import structlog
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from proxy.cli.main import main
from proxy.config import Config, build
from proxy.edge import connections
from proxy.edge.observe import configure_logging
from proxy.edge.serve import LINGER_S
from proxy.errors import ConfigError
from tests.helpers.fakes import FakeUpstream, completion, repeated_call_messages, sse_events

CHAT = "/v1/chat/completions"


@pytest.fixture
def restore_structlog() -> Any:
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def port_of(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


async def connect(base: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port_of(base))


def parse(raw: bytes) -> tuple[bytes, dict[str, str], bytes]:
    """(status line, headers with lower-case names, body de-chunked when chunked)."""
    head, _, body = raw.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = {k.decode().lower(): v.decode().strip() for k, _, v in (x.partition(b":") for x in lines)}
    if headers.get("transfer-encoding") == "chunked":
        out = b""
        while True:
            size, _, rest = body.partition(b"\r\n")
            n = int(size, 16)
            if n == 0:
                break
            out, body = out + rest[:n], rest[n + 2 :]
        body = out
    return status, headers, body


async def read_response(reader: asyncio.StreamReader) -> tuple[bytes, dict[str, str], bytes]:
    """One response delimited by its Content-Length (the connection may stay open)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    status, headers, _ = parse(head)
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 5)
    return status, headers, body


async def log_events(capfd: pytest.CaptureFixture[str], event: str) -> list[dict[str, Any]]:
    """The JSON log lines named ``event`` written so far (polled briefly for the first)."""
    err = ""
    for _ in range(100):
        err += capfd.readouterr().err
        if f'"{event}"' in err:
            break
        await asyncio.sleep(0.01)
    lines = [orjson.loads(x) for x in err.splitlines() if x.startswith("{")]
    return [x for x in lines if x.get("event") == event]


def without_timestamp(event: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k != "timestamp"}


HEADER_408 = orjson.dumps(
    {
        "error": {
            "message": "loopguard: the request headers were not complete within 0.5 s "
            "(listen.header_timeout_s)",
            "type": "request_timeout",
            "code": 408,
        }
    }
)


def raw_408_headers() -> bytes:
    return (
        b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(HEADER_408)}\r\n".encode()
        + b"Connection: close\r\n\r\n"
        + HEADER_408
    )


# --- header timeout -------------------------------------------------------------------------------


async def test_silent_connection_is_closed_after_header_timeout(
    upstream: FakeUpstream, make_proxy, capfd: pytest.CaptureFixture[str], restore_structlog: Any
) -> None:
    configure_logging("info")
    base = await make_proxy({"listen": {"header_timeout_s": 0.5}})
    capfd.readouterr()
    t0 = time.monotonic()  # before connecting: the clock runs from the connection's open
    reader, writer = await connect(base)
    got = await asyncio.wait_for(reader.read(), 5)  # until the proxy closes
    elapsed = time.monotonic() - t0
    writer.close()
    assert got == b""  # nothing had come: closed without an answer
    assert 0.45 <= elapsed < 2.0, elapsed
    assert upstream.requests == []
    (event,) = await log_events(capfd, "agent_timeout")
    assert without_timestamp(event) == {
        "event": "agent_timeout",
        "level": "warning",
        "phase": "headers",
        "received_bytes": 0,
        "timeout_s": 0.5,
    }


async def test_partial_headers_get_a_408_after_header_timeout(
    upstream: FakeUpstream, make_proxy, capfd: pytest.CaptureFixture[str], restore_structlog: Any
) -> None:
    configure_logging("info")
    base = await make_proxy({"listen": {"header_timeout_s": 0.5}})
    capfd.readouterr()
    t0 = time.monotonic()  # before connecting: the clock runs from the connection's open
    reader, writer = await connect(base)
    partial = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-secret-77\r\n"
    writer.write(partial)
    got = await asyncio.wait_for(reader.read(), 5)
    elapsed = time.monotonic() - t0
    writer.close()
    assert got == raw_408_headers()
    assert 0.45 <= elapsed < 2.0, elapsed
    assert upstream.requests == []
    (event,) = await log_events(capfd, "agent_timeout")
    assert without_timestamp(event) == {
        "event": "agent_timeout",
        "level": "warning",
        "phase": "headers",
        "received_bytes": len(partial),
        "timeout_s": 0.5,
    }
    assert "sk-secret-77" not in capfd.readouterr().err


async def test_idle_keepalive_connection_is_not_timed_but_its_next_request_is(
    upstream: FakeUpstream, make_proxy
) -> None:
    """Idle between requests: aiohttp's keep-alive timeout (3630 s), not header_timeout_s; the
    next request's clock starts at its first byte."""
    base = await make_proxy({"listen": {"header_timeout_s": 0.5}})
    reader, writer = await connect(base)
    get = b"GET /loop-guard/healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    for _ in range(2):
        writer.write(get)
        status, headers, body = await read_response(reader)
        assert (status, body) == (b"HTTP/1.1 200 OK", b'{"status":"ok"}')
        assert "connection" not in headers  # kept alive
        await asyncio.sleep(1.0)  # idle for twice header_timeout_s: still open
    writer.write(b"GET /loop-guard/healthz HTTP/1.1\r\n")  # the next request stalls midway
    t0 = time.monotonic()
    got = await asyncio.wait_for(reader.read(), 5)
    elapsed = time.monotonic() - t0
    writer.close()
    assert got == raw_408_headers()
    assert 0.45 <= elapsed < 2.0, elapsed


# --- body timeout ---------------------------------------------------------------------------------


async def test_stalled_body_gets_a_408_and_nothing_goes_upstream(
    upstream: FakeUpstream, make_proxy, capfd: pytest.CaptureFixture[str], restore_structlog: Any
) -> None:
    configure_logging("info")
    base = await make_proxy({"listen": {"body_timeout_s": 0.5}})
    capfd.readouterr()
    reader, writer = await connect(base)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer sk-secret-88\r\nContent-Length: 1000\r\n\r\n" + b'{"model":"'
    )
    t0 = time.monotonic()
    status, headers, body = await read_response(reader)
    elapsed = time.monotonic() - t0
    assert status == b"HTTP/1.1 408 Request Timeout"
    assert headers["connection"] == "close"
    assert headers["content-type"] == "application/json"
    assert body == orjson.dumps(
        {
            "error": {
                "message": "loopguard: the request body stalled: nothing received for 0.5 s "
                "(listen.body_timeout_s)",
                "type": "request_timeout",
                "code": 408,
            }
        }
    )
    assert 0.45 <= elapsed < 2.0, elapsed
    # the agent sends nothing more: the proxy drains for LINGER_S (1 s; aiohttp's default 10 s
    # held the connection slot that long), then closes
    t1 = time.monotonic()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    assert time.monotonic() - t1 < LINGER_S + 1.0
    writer.close()
    assert upstream.requests == []
    (event,) = await log_events(capfd, "agent_timeout")
    assert without_timestamp(event) == {
        "event": "agent_timeout",
        "level": "warning",
        "phase": "body",
        "method": "POST",
        "path": CHAT,
        "received_bytes": 10,
        "content_length": 1000,
        "timeout_s": 0.5,
        "status": 408,
    }
    assert "sk-secret-88" not in capfd.readouterr().err


async def test_slow_but_steady_body_is_not_cut(upstream: FakeUpstream, make_proxy) -> None:
    """One chunk every 0.2 s for 2 s with body_timeout_s 0.5: the idle time counts, not the total."""
    answer = orjson.dumps({"object": "list", "data": []})

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.Response(body=answer, content_type="application/json")

    upstream.handler = handler
    base = await make_proxy({"listen": {"body_timeout_s": 0.5}})
    body = bytes(range(256)) * 8000  # 2 MB, in 10 pieces of 200 KiB
    pieces = [body[i : i + len(body) // 10] for i in range(0, len(body), len(body) // 10)]
    assert len(pieces) == 10
    reader, writer = await connect(base)
    writer.write(
        b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
    )
    t0 = time.monotonic()
    for piece in pieces:
        await asyncio.sleep(0.2)
        writer.write(piece)
        await writer.drain()
    status, _, got = await read_response(reader)
    elapsed = time.monotonic() - t0
    writer.close()
    assert (status, got) == (b"HTTP/1.1 200 OK", answer)
    assert elapsed >= 2.0
    (recorded,) = upstream.requests
    assert recorded.body == body  # byte for byte


# --- max_connections ------------------------------------------------------------------------------


async def test_connection_past_max_connections_gets_a_503_at_once(
    upstream: FakeUpstream, make_proxy, capfd: pytest.CaptureFixture[str], restore_structlog: Any
) -> None:
    configure_logging("info")
    base = await make_proxy({"listen": {"max_connections": 5, "header_timeout_s": 30}})
    capfd.readouterr()
    idle = [await connect(base) for _ in range(5)]
    await asyncio.sleep(0.2)  # all five accepted
    message = orjson.dumps(
        {
            "error": {
                "message": "loopguard: too many connections (listen.max_connections = 5); retry shortly",
                "type": "too_many_connections",
                "code": 503,
            }
        }
    )
    expected = (
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(message)}\r\n".encode()
        + b"Connection: close\r\nRetry-After: 1\r\n\r\n"
        + message
    )
    for send in (b"", b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"):  # silent, then a request
        reader, writer = await connect(base)
        writer.write(send)
        t0 = time.monotonic()
        got = await asyncio.wait_for(reader.read(), 5)  # the answer, then the proxy's EOF
        elapsed = time.monotonic() - t0
        writer.close()
        assert got == expected
        assert elapsed < 1.0, elapsed
    assert upstream.requests == []
    (event,) = await log_events(capfd, "connection_limit")  # once per 10 s, with the count
    assert without_timestamp(event) == {
        "event": "connection_limit",
        "level": "warning",
        "max_connections": 5,
        "refused": 1,
    }
    for _, writer in idle:
        writer.close()
    async with aiohttp.ClientSession() as s:
        for _ in range(100):  # the slots free as the proxy sees the closes
            async with s.get(base + "/v1/models") as r:
                if r.status == 200:
                    break
            await asyncio.sleep(0.02)
        assert r.status == 200
        assert len(upstream.requests) == 1


def test_fd_limit_raised_to_fit_max_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 4096))
    monkeypatch.setattr(resource, "setrlimit", lambda _, v: calls.append(v))
    connections.ensure_fd_limit(1024)
    assert calls == [(2 * 1024 + connections.FD_RESERVE, 4096)]  # agent and upstream connections
    calls.clear()
    connections.ensure_fd_limit(400)  # 2 * 400 + reserve fits in 1024: untouched
    assert calls == []


def test_fd_limit_too_low_is_warned_about(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], restore_structlog: Any
) -> None:
    import resource

    configure_logging("info")
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(resource, "getrlimit", lambda _: (256, 512))
    monkeypatch.setattr(resource, "setrlimit", lambda _, v: calls.append(v))
    connections.ensure_fd_limit(1024)
    assert calls == [(512, 512)]
    lines = [orjson.loads(x) for x in capfd.readouterr().err.splitlines() if x.startswith("{")]
    assert [without_timestamp(x) for x in lines] == [
        {
            "event": "fd_limit_low",
            "level": "warning",
            "soft": 512,
            "hard": 512,
            "needed": 2 * 1024 + connections.FD_RESERVE,
            "max_connections": 1024,
            "hint": "raise the limit (ulimit -n) or lower listen.max_connections",
        }
    ]


# --- half-closed requests -------------------------------------------------------------------------

JSON_ANSWER = orjson.dumps(completion(content="All done: the bug was a missing import."))
SSE_ANSWER = sse_events(content="All done: the bug was a missing import.")

HALF_CLOSE_CASES = [
    pytest.param(b"HTTP/1.0", b"", False, id="http10_json"),
    pytest.param(b"HTTP/1.0", b"", True, id="http10_sse"),
    pytest.param(b"HTTP/1.1", b"Connection: close\r\n", False, id="http11_connection_close_json"),
    pytest.param(b"HTTP/1.1", b"Connection: close\r\n", True, id="http11_connection_close_sse"),
]


@pytest.mark.parametrize(("version", "extra", "stream"), HALF_CLOSE_CASES)
async def test_half_closed_request_gets_its_whole_answer(
    upstream: FakeUpstream, make_proxy, version: bytes, extra: bytes, stream: bool
) -> None:
    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        if not stream:
            await asyncio.sleep(0.2)  # generating while the agent's side is already shut
            return web.Response(body=JSON_ANSWER, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event in SSE_ANSWER:
            await resp.write(event)
            await asyncio.sleep(0.02)
        await resp.write_eof()
        return resp

    upstream.handler = handler
    base = await make_proxy()
    body = orjson.dumps({"model": "m", "messages": repeated_call_messages(1), "stream": stream})
    reader, writer = await connect(base)
    writer.write(
        b"POST /v1/chat/completions "
        + version
        + b"\r\nHost: x\r\nContent-Type: application/json\r\n"
        + extra
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    writer.write_eof()  # shutdown(SHUT_WR): the agent has said all it will say
    raw = await asyncio.wait_for(reader.read(), 5)  # everything, up to the proxy's close
    writer.close()
    status, _, got = parse(raw)
    assert status == version + b" 200 OK"
    assert got == (b"".join(SSE_ANSWER) if stream else JSON_ANSWER)  # as the upstream sent it
    (recorded,) = upstream.requests
    assert recorded.body == body


async def test_eof_after_a_keepalive_request_is_a_hang_up(upstream: FakeUpstream, make_proxy) -> None:
    """TCP cannot tell a half-close from a hang-up: after a keep-alive request an EOF is the agent
    going away, and the upstream request is closed at once, as before (a local server stops)."""
    upstream_closed = asyncio.Event()

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            await resp.write(SSE_ANSWER[0])
            await asyncio.Event().wait()  # generating forever, until the proxy hangs up
        finally:
            upstream_closed.set()
        return resp

    upstream.handler = handler
    base = await make_proxy()
    body = orjson.dumps({"model": "m", "messages": repeated_call_messages(1), "stream": True})
    reader, writer = await connect(base)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    buf = b""
    while SSE_ANSWER[0] not in buf:
        buf += await asyncio.wait_for(reader.read(65536), 2)
    t0 = time.monotonic()
    writer.write_eof()
    await asyncio.wait_for(upstream_closed.wait(), 2)
    assert time.monotonic() - t0 < 1.0
    writer.close()


async def test_eof_in_the_middle_of_a_body_drops_the_request_at_once(
    upstream: FakeUpstream, make_proxy
) -> None:
    base = await make_proxy({"listen": {"body_timeout_s": 5}})
    reader, writer = await connect(base)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b'{"model":"'
    )
    await writer.drain()
    await asyncio.sleep(0.1)  # the handler is reading the body
    t0 = time.monotonic()
    writer.write_eof()
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, not a 408 five seconds later
    assert time.monotonic() - t0 < 1.0
    writer.close()
    assert upstream.requests == []


async def test_aiohttp_internals_we_rely_on() -> None:
    """What :mod:`proxy.edge.connections` reads beyond aiohttp's public API is still there and still
    means the same: fails on an aiohttp upgrade that changes it (the tests above then show how)."""
    server = web.Server(lambda request: web.Response())
    for name in connections.AIOHTTP_INTERNALS[web.Server]:
        assert hasattr(server, name), name
    slots = {s for cls in RequestHandler.__mro__ for s in getattr(cls, "__slots__", ())}
    for name in connections.AIOHTTP_INTERNALS[RequestHandler]:
        assert name in slots, name
    # the server builds its protocol as AgentServer.__call__ does, with every runner kwarg
    assert "RequestHandler(self, loop=self._loop, **self._kwargs)" in inspect.getsource(web.Server.__call__)
    assert list(inspect.signature(RequestHandler.finish_response).parameters) == [
        "self",
        "request",
        "resp",
        "start_time",
    ]
    # aiohttp itself still drops a half-closed connection (else this module could do less)
    assert RequestHandler.eof_received(object.__new__(RequestHandler)) is None  # type: ignore[func-returns-value]


# --- configuration --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("listen", "message"),
    [
        pytest.param({"header_timeout_s": 0}, "listen.header_timeout_s: must be > 0 or null", id="header_0"),
        pytest.param(
            {"header_timeout_s": -1.5}, "listen.header_timeout_s: must be > 0 or null", id="header_negative"
        ),
        pytest.param(
            {"header_timeout_s": "60s"},
            "listen.header_timeout_s: must be a number, got '60s'",
            id="header_string",
        ),
        pytest.param({"body_timeout_s": 0}, "listen.body_timeout_s: must be > 0 or null", id="body_0"),
        pytest.param(
            {"body_timeout_s": float("nan")}, "listen.body_timeout_s: must be > 0 or null", id="body_nan"
        ),
        pytest.param(
            {"body_timeout_s": True}, "listen.body_timeout_s: must be a number, got True", id="body_bool"
        ),
        pytest.param(
            {"max_connections": 0}, "listen.max_connections: must be an integer >= 1", id="max_conn_0"
        ),
        pytest.param(
            {"max_connections": 10.5},
            "listen.max_connections: must be an integer, got 10.5",
            id="max_conn_float",
        ),
        pytest.param(
            {"max_connections": None},
            "listen.max_connections: must be an integer, got None",
            id="max_conn_null",
        ),
    ],
)
def test_bad_agent_side_settings_name_the_key(listen: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        build(Config, {"listen": listen})
    assert str(exc.value) == message


def test_agent_side_settings_defaults_and_null() -> None:
    cfg = build(Config, {})
    assert (cfg.listen.header_timeout_s, cfg.listen.body_timeout_s, cfg.listen.max_connections) == (
        60.0,
        60.0,
        1024,
    )
    off = build(Config, {"listen": {"header_timeout_s": None, "body_timeout_s": None}}).listen
    assert (off.header_timeout_s, off.body_timeout_s) == (None, None)


def test_check_config_rejects_a_bad_max_connections(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "lg.yaml"
    path.write_text("listen:\n  max_connections: -3\n", encoding="utf-8")
    assert main(["check-config", str(path)]) == 2
    assert capsys.readouterr().err == (
        "loopguard: invalid configuration: listen.max_connections: must be an integer >= 1\n"
    )
