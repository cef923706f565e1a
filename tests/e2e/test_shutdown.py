"""Graceful shutdown: on SIGTERM or SIGINT the proxy stops accepting, lets
requests in flight finish for up to ``listen.shutdown_grace_s``, ends the rest (a stream gets the
error event), writes their log lines and exits 0 — also as PID 1, where a process without a
handler ignores SIGTERM (``docker stop`` would wait and SIGKILL). The real ``loopguard serve``
runs as a child process in front of a fake upstream."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from tests.helpers.fakes import FakeUpstream, repeated_call_messages, sse_events
from tests.helpers.proxy_server import serve_process


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def slow_stream(events: list[bytes], gap_s: float, forever: bool) -> Any:
    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for e in events:
            await resp.write(e)
            await asyncio.sleep(gap_s)
        if forever:
            await asyncio.Event().wait()
        await resp.write_eof()
        return resp

    return handler


async def serve(
    upstream_url: str, tmp_path: Path, grace_s: float, pid1: bool, extra: str = ""
) -> tuple[Any, int, str]:
    port = free_port()
    cfg = tmp_path / "lg.yaml"
    cfg.write_text(f"listen: {{shutdown_grace_s: {grace_s}}}\n{extra}")
    prefix = ["unshare", "--pid", "--fork", "--kill-child"] if pid1 else []
    proc = await serve_process(upstream_url, port, cfg, prefix=prefix, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    line = await asyncio.wait_for(proc.stderr.readline(), 20)
    assert b'"listening"' in line, line
    return proc, port, f"http://127.0.0.1:{port}"


def target_pid(proc: Any, pid1: bool) -> int:
    """The proxy's own process (under unshare, its child: PID 1 in its namespace)."""
    if not pid1:
        return int(proc.pid)
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    return int(children[0])


CASES = [
    pytest.param(10.0, False, False, id="in_flight_stream_finishes_within_the_grace"),
    pytest.param(0.5, True, False, id="endless_stream_ended_with_the_error_event"),
    pytest.param(0.5, True, True, id="as_pid_1"),
]


@pytest.mark.parametrize(("grace_s", "forever", "pid1"), CASES)
async def test_sigterm_shuts_down_gracefully(
    upstream: FakeUpstream, tmp_path: Path, grace_s: float, forever: bool, pid1: bool
) -> None:
    if pid1 and (shutil.which("unshare") is None or os.geteuid() != 0):
        pytest.skip("needs unshare and root for a PID namespace")
    events = sse_events(content="a stream that takes a while to generate")
    if forever:
        events = events[:3]  # a generation that does not end: no finish, no [DONE]
    upstream.handler = slow_stream(events, 0.1, forever)
    proc, _, base = await serve(upstream.url, tmp_path, grace_s, pid1)
    got = b""
    broken = False
    try:
        async with aiohttp.ClientSession() as s:
            body = orjson.dumps({"model": "m", "messages": repeated_call_messages(1), "stream": True})
            async with s.post(base + "/v1/chat/completions", data=body) as r:
                assert r.status == 200
                got += await r.content.readany()
                os.kill(target_pid(proc, pid1), signal.SIGTERM)
                try:
                    async for chunk in r.content.iter_any():
                        got += chunk
                except aiohttp.ClientPayloadError:
                    broken = True
        code = await asyncio.wait_for(proc.wait(), 10)
    finally:
        if proc.returncode is None:
            proc.kill()
    assert proc.stderr is not None
    err = (await proc.stderr.read()).decode()
    lines = [orjson.loads(x) for x in err.splitlines() if x.startswith("{")]
    request = [x for x in lines if x.get("event") == "request"]
    assert code == 0
    assert [x["event"] for x in lines if x["event"] in ("shutting_down", "stopped")] == [
        "shutting_down",
        "stopped",
    ]
    assert len(request) == 1
    if forever:
        assert broken
        tail = got.rsplit(b"\n\n", 2)[-2]
        assert orjson.loads(tail.removeprefix(b"data: "))["error"]["type"] == "proxy_shutdown"
        assert (request[0]["level"], request[0].get("shutdown")) == ("warning", True)
    else:
        assert (broken, got) == (False, b"".join(events))
        assert request[0]["level"] == "info"


def never_answers(arrived: asyncio.Event) -> Any:
    """An upstream that reads the request and then sends nothing, not even its headers (a
    model server busy with another slot's generation)."""

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        arrived.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    return handler


#: The agent's 503 body before any of the answer reached it, per wire (the Messages form is
#: Anthropic's, which its SDK and Claude Code read).
SHUTDOWN_503 = {
    "/v1/chat/completions": {
        "error": {"message": "loopguard is shutting down", "type": "proxy_shutdown", "code": 503}
    },
    "/v1/responses": {
        "error": {"message": "loopguard is shutting down", "type": "proxy_shutdown", "code": 503}
    },
    "/v1/messages": {
        "type": "error",
        "error": {"type": "proxy_shutdown", "message": "loopguard is shutting down"},
    },
}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/v1/messages"])
async def test_a_request_waiting_for_upstream_headers_gets_a_503_at_the_end_of_one_grace(
    upstream: FakeUpstream, tmp_path: Path, path: str
) -> None:
    grace_s = 2.0
    arrived = asyncio.Event()
    upstream.handler = never_answers(arrived)
    proc, _, base = await serve(upstream.url, tmp_path, grace_s, False)
    try:
        async with aiohttp.ClientSession() as s:
            body = orjson.dumps({"model": "m", "messages": repeated_call_messages(1), "input": "hi"})
            post = asyncio.ensure_future(s.post(base + path, data=body))
            await asyncio.wait_for(arrived.wait(), 10)
            sent = time.monotonic()
            os.kill(proc.pid, signal.SIGTERM)
            async with await asyncio.wait_for(post, 10) as r:
                answered = time.monotonic() - sent
                status, answer = r.status, await r.json(content_type=None)
        code = await asyncio.wait_for(proc.wait(), 10)
        exited = time.monotonic() - sent
    finally:
        if proc.returncode is None:
            proc.kill()
    assert proc.stderr is not None
    lines = [orjson.loads(x) for x in (await proc.stderr.read()).decode().splitlines() if x.startswith("{")]
    (request,) = [x for x in lines if x.get("event") == "request"]
    assert (code, status, answer) == (0, 503, SHUTDOWN_503[path])
    assert (request["status"], request["shutdown"], request["level"]) == (503, True, "warning")
    # one grace in all (aiohttp's own shutdown would wait it out a second time)
    assert grace_s <= answered < grace_s + 1.0, answered
    assert exited < grace_s + 1.5, exited


async def test_a_json_request_streamed_upstream_gets_a_503_at_the_end_of_one_grace(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    """``upstream.stream_json_requests``: the agent asked for JSON, the upstream streams an answer
    that does not end; SIGTERM, and at the end of the grace the agent gets the 503 JSON answer
    (it had none of the answer: the proxy was assembling it)."""
    grace_s = 0.5
    streaming = asyncio.Event()
    events = sse_events(content="a generation that does not end")[:2]

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for e in events:
            await resp.write(e)
        streaming.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    upstream.handler = handler
    proc, _, base = await serve(
        upstream.url, tmp_path, grace_s, False, "upstream: {stream_json_requests: true}\n"
    )
    try:
        async with aiohttp.ClientSession() as s:
            body = orjson.dumps({"model": "m", "messages": repeated_call_messages(1)})
            post = asyncio.ensure_future(s.post(base + "/v1/chat/completions", data=body))
            await asyncio.wait_for(streaming.wait(), 10)
            await asyncio.sleep(0.2)  # the proxy reads the stream
            sent = time.monotonic()
            os.kill(proc.pid, signal.SIGTERM)
            async with await asyncio.wait_for(post, 10) as r:
                answered = time.monotonic() - sent
                status, answer = r.status, await r.json(content_type=None)
        code = await asyncio.wait_for(proc.wait(), 10)
    finally:
        if proc.returncode is None:
            proc.kill()
    assert proc.stderr is not None
    lines = [orjson.loads(x) for x in (await proc.stderr.read()).decode().splitlines() if x.startswith("{")]
    (request,) = [x for x in lines if x.get("event") == "request"]
    assert (code, status, answer) == (0, 503, SHUTDOWN_503["/v1/chat/completions"])
    assert (request["status"], request["shutdown"], request["as_stream"], request["level"]) == (
        503,
        True,
        True,
        "warning",
    )
    assert grace_s <= answered < grace_s + 1.0, answered


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/models"])
async def test_an_agent_still_uploading_its_body_gets_a_503_at_the_end_of_one_grace(
    upstream: FakeUpstream, tmp_path: Path, path: str
) -> None:
    """SIGTERM while the agent is still sending its body (half of it sent, the rest never comes
    before the grace ends): the agent gets the 503 within about a second of the grace, not an
    empty close from the runner's cleanup two seconds later; nothing goes upstream."""
    grace_s = 1.0
    proc, port, _ = await serve(upstream.url, tmp_path, grace_s, False)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = orjson.dumps({"model": "m", "messages": repeated_call_messages(1)})
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[: len(body) // 2]
        )
        await writer.drain()
        await asyncio.sleep(0.3)  # the proxy is reading the body
        sent = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        got = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        answered = time.monotonic() - sent
        length = int(got.lower().partition(b"content-length: ")[2].partition(b"\r\n")[0])
        got += await asyncio.wait_for(reader.readexactly(length), 10)
        closed = await asyncio.wait_for(reader.read(), 10)  # the connection closes after it
        writer.close()
        code = await asyncio.wait_for(proc.wait(), 10)
        exited = time.monotonic() - sent
    finally:
        if proc.returncode is None:
            proc.kill()
    assert proc.stderr is not None
    lines = [orjson.loads(x) for x in (await proc.stderr.read()).decode().splitlines() if x.startswith("{")]
    (request,) = [x for x in lines if x.get("event") == "request"]
    head, _, answer = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 "), got
    wire = "/v1/messages" if path == "/v1/messages" else "/v1/chat/completions"
    assert orjson.loads(answer) == SHUTDOWN_503[wire]
    assert (request["status"], request["shutdown"], request["body_incomplete"]) == (503, True, True)
    assert (upstream.requests, closed, code) == ([], b"", 0)
    assert grace_s <= answered < grace_s + 0.5, answered
    assert exited < grace_s + 1.5, exited
