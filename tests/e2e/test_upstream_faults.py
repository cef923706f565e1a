"""A misbehaving upstream on raw sockets (the fault suite): each scenario writes exact
bytes (or resets the connection) at one phase of the answer; the tests pin what the agent receives
and how often the upstream was asked, through the real server. The stalls (before the headers,
mid-JSON, mid-stream) are in tests/e2e/test_forwarding.py (``test_a_stalled_*``), ``Expect`` in
``test_expect_100_continue_*``, the stale keep-alive race in ``test_a_request_on_a_connection_*``.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import anthropic
import openai
import orjson
import pytest
from aiohttp import web
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from proxy.config import Config
from proxy.edge.serve import start
from proxy.response.sse import SSEFramer
from tests.conftest import ProxyFactory
from tests.helpers.fakes import FakeUpstream, repeated_call_messages
from tests.helpers.proxy_server import proxy_config

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
CHAT = "/v1/chat/completions"
ANSWER = orjson.dumps(
    {
        "id": "c1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    }
)
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
EVENT = (
    b'data: {"id":"c1","object":"chat.completion.chunk",'
    b'"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n'
)


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0), not a FIN."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@dataclass
class RawUpstream:
    """An upstream on a raw socket: reads one request (headers and a Content-Length body), then
    runs ``script``. ``requests``: how many requests it read."""

    script: Script | None = None
    requests: int = 0
    url: str = ""
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            self.requests += 1
            assert self.script is not None
            await self.script(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass


@pytest.fixture
async def raw_upstream() -> AsyncIterator[RawUpstream]:
    up = RawUpstream()
    server = await asyncio.start_server(up.handle, "127.0.0.1", 0)
    up.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    yield up
    server.close()


async def request(raw_upstream: RawUpstream, stream: bool) -> tuple[bytes, float, dict]:
    """POST a one-step chat request through a fresh proxy on a raw socket; returns (every byte the
    agent received until the proxy closed, seconds, the proxy's stats)."""
    cfg: Config = proxy_config({"upstream": {"read_timeout_s": 2}}, raw_upstream.url)
    runner, port = await start(cfg)
    try:
        body = orjson.dumps({"model": "m", "stream": stream, "messages": repeated_call_messages(1)})
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        writer.write(
            f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        got = await asyncio.wait_for(reader.read(), 10)
        elapsed = loop.time() - t0
        writer.close()
        r2, w2 = await asyncio.open_connection("127.0.0.1", port)
        w2.write(b"GET /loop-guard HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        stats = orjson.loads((await r2.read()).split(b"\r\n\r\n", 1)[1])
        w2.close()
        return got, elapsed, stats
    finally:
        await runner.cleanup()


def status_and_body(got: bytes) -> tuple[int, bytes]:
    head, _, body = got.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def dechunk(body: bytes) -> bytes:
    out = bytearray()
    while body:
        size, _, rest = body.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out += rest[:n]
        body = rest[n + 2 :]
    return bytes(out)


# --- scripts ---------------------------------------------------------------------------------------------


async def reset_before_headers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    reset(writer)


async def close_before_headers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.close()


async def reset_mid_json(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(
        f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(ANSWER)}\r\n\r\n".encode()
        + ANSWER[:10]
    )
    await writer.drain()
    reset(writer)


async def truncated_json(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Content-Length promises more than comes, then a clean close."""
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(ANSWER) + 50}\r\n\r\n".encode()
        + ANSWER
    )
    await writer.drain()
    writer.close()


async def json_longer_than_its_length(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Content-Length says less than what follows: the answer is what the length says."""
    writer.write(
        f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(ANSWER)}\r\n\r\n".encode()
        + ANSWER
        + b"GARBAGE"
    )
    await writer.drain()
    writer.close()


async def json_until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """No length, no chunking: the body ends when the connection does (HTTP/1.0 style)."""
    writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + ANSWER)
    await writer.drain()
    writer.close()


async def bad_chunk_framing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(SSE_HEAD + chunk(EVENT) + b"zz\r\nnot a chunk\r\n")
    await writer.drain()
    writer.close()


async def reset_mid_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(SSE_HEAD + chunk(EVENT))
    await writer.drain()
    await asyncio.sleep(0.05)
    reset(writer)


async def close_mid_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The chunked stream's last chunk never comes: a clean FIN after one event."""
    writer.write(SSE_HEAD + chunk(EVENT))
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.close()


# --- the agent's view ------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("script", [reset_before_headers, close_before_headers], ids=["reset", "fin"])
async def test_upstream_gone_before_its_headers_is_a_502_and_not_sent_twice(
    raw_upstream: RawUpstream, script: Script, stream: bool
) -> None:
    """The request reached the upstream: sending it again could run a generation twice, so the
    stale keep-alive retry never applies to a fresh connection."""
    raw_upstream.script = script
    got, elapsed, stats = await request(raw_upstream, stream)
    status, body = status_and_body(got)
    assert status == 502
    assert orjson.loads(body)["error"]["type"] == "upstream_unreachable"
    assert raw_upstream.requests == 1
    assert (stats["upstream_errors"], stats["internal_errors"]) == (1, 0)
    assert elapsed < 2


@pytest.mark.parametrize(
    ("script", "sent"),
    [
        pytest.param(reset_mid_json, ANSWER[:10], id="reset"),
        pytest.param(truncated_json, ANSWER, id="short_body"),
    ],
)
async def test_a_json_answer_cut_midway_reaches_the_agent_visibly_short(
    raw_upstream: RawUpstream, script: Script, sent: bytes
) -> None:
    """What came is relayed under the upstream's own Content-Length, then the connection closes:
    the agent's client sees fewer bytes than announced, never a clean success."""
    raw_upstream.script = script
    got, elapsed, stats = await request(raw_upstream, False)
    head, _, body = got.partition(b"\r\n\r\n")
    announced = len(ANSWER) if script is reset_mid_json else len(ANSWER) + 50
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert f"Content-Length: {announced}\r\n".encode() in head
    assert body == sent
    assert stats["upstream_errors"] == 1
    assert elapsed < 2


async def test_extra_bytes_after_the_length_are_a_502(raw_upstream: RawUpstream) -> None:
    """aiohttp's parser refuses an answer followed by bytes it did not announce: a 502 naming the
    error type, never a half-read answer."""
    raw_upstream.script = json_longer_than_its_length
    got, _, stats = await request(raw_upstream, False)
    status, body = status_and_body(got)
    assert (status, orjson.loads(body)["error"]["type"]) == (502, "upstream_unreachable")
    assert "(ClientResponseError)" in orjson.loads(body)["error"]["message"]
    assert (raw_upstream.requests, stats["upstream_errors"]) == (1, 1)


async def test_an_http10_answer_read_until_close_arrives_whole(raw_upstream: RawUpstream) -> None:
    raw_upstream.script = json_until_close
    got, _, stats = await request(raw_upstream, False)
    status, body = status_and_body(got)
    head = got.partition(b"\r\n\r\n")[0].lower()
    assert status == 200
    assert (dechunk(body) if b"chunked" in head else body) == ANSWER
    assert (stats["upstream_errors"], stats["internal_errors"]) == (0, 0)


async def test_a_bad_chunk_in_the_first_read_is_a_502(raw_upstream: RawUpstream) -> None:
    raw_upstream.script = bad_chunk_framing
    got, _, stats = await request(raw_upstream, True)
    status, body = status_and_body(got)
    assert (status, orjson.loads(body)["error"]["type"]) == (502, "upstream_unreachable")
    assert (raw_upstream.requests, stats["upstream_errors"]) == (1, 1)


@pytest.mark.parametrize("script", [reset_mid_stream, close_mid_stream], ids=["reset", "fin"])
async def test_a_stream_cut_midway_ends_with_the_error_event_and_a_broken_connection(
    raw_upstream: RawUpstream, script: Script
) -> None:
    raw_upstream.script = script
    got, elapsed, stats = await request(raw_upstream, True)
    status, body = status_and_body(got)
    assert status == 200
    data = dechunk(body)
    assert data.startswith(EVENT)
    error = orjson.loads(data[len(EVENT) :].removeprefix(b"data: "))
    assert error["error"]["type"] == "upstream_disconnected"
    assert not got.endswith(b"0\r\n\r\n")  # no final chunk: the agent sees a broken stream
    assert (stats["upstream_errors"], stats["internal_errors"]) == (1, 0)
    assert elapsed < 2


async def test_more_concurrent_requests_than_aiohttps_default_pool_all_reach_the_upstream(
    upstream: FakeUpstream, make_proxy: ProxyFactory
) -> None:
    """120 requests at once to an upstream that answers none until all 120 have arrived: with
    aiohttp's default pool (100) the 101st waited for a free connection with no timeout, so none
    was ever answered; the pool now holds one upstream connection per agent connection."""
    n = 120
    arrived = asyncio.Event()
    seen = 0

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        nonlocal seen
        seen += 1
        if seen == n:
            arrived.set()
        await arrived.wait()
        return web.Response(body=b'{"ok":true}', content_type="application/json")

    upstream.handler = handler
    base = await make_proxy()
    body = orjson.dumps({"model": "m", "messages": repeated_call_messages(1)})

    async def one(session: aiohttp.ClientSession) -> bytes:
        async with session.post(base + CHAT, data=body) as r:
            return await r.read()

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        got = await asyncio.wait_for(asyncio.gather(*(one(session) for _ in range(n))), 30)
    assert got == [b'{"ok":true}'] * n
    assert seen == n


# --- a stream cut mid-event: the half event is dropped, the error event stands alone -------------


@dataclass(frozen=True)
class WireCase:
    """One wire's streamed answer for the mid-event cut: its path and request body, one whole
    event, and the event the upstream breaks off in (cut at ``cut`` bytes)."""

    path: str
    body: bytes
    first: bytes
    second: bytes


def _data(obj: dict, event: str | None = None, eol: bytes = b"\n") -> bytes:
    head = f"event: {event}".encode() + eol if event else b""
    return head + b"data: " + orjson.dumps(obj) + eol + eol


_GEMINI_TEXT = {
    "candidates": [{"content": {"role": "model", "parts": [{"text": "HALF-EVENT-TEXT"}]}, "index": 0}]
}
WIRE_CASES = {
    "chat": WireCase(
        CHAT,
        orjson.dumps({"model": "m", "stream": True, "messages": repeated_call_messages(1)}),
        EVENT,
        EVENT.replace(b'"hi"', b'"HALF-EVENT-TEXT"'),
    ),
    "responses": WireCase(
        "/v1/responses",
        orjson.dumps({"model": "m", "stream": True, "input": "hi"}),
        _data(
            {
                "type": "response.created",
                "sequence_number": 0,
                "response": {"id": "resp_1", "object": "response", "status": "in_progress", "output": []},
            },
            "response.created",
        ),
        _data(
            {
                "type": "response.output_text.delta",
                "sequence_number": 1,
                "item_id": "msg_1",
                "output_index": 0,
                "content_index": 0,
                "delta": "HALF-EVENT-TEXT",
            },
            "response.output_text.delta",
        ),
    ),
    "messages": WireCase(
        "/v1/messages",
        orjson.dumps(
            {"model": "m", "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        ),
        _data(
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "m",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 1, "output_tokens": 0},
                },
            },
            "message_start",
        ),
        _data(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": "HALF-EVENT-TEXT"},
            },
            "content_block_start",
        ),
    ),
    "gemini": WireCase(
        "/v1beta/models/m:streamGenerateContent?alt=sse",
        orjson.dumps({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}),
        _data(
            {"candidates": [{"content": {"role": "model", "parts": [{"text": "hi"}]}, "index": 0}]},
            eol=b"\r\n",
        ),
        _data(_GEMINI_TEXT, eol=b"\r\n"),
    ),
    # not a dialect's path: relayed unread, through the same gate
    "passthrough": WireCase(
        "/v1/completions",
        orjson.dumps({"model": "m", "stream": True, "prompt": "hi"}),
        b'data: {"id":"c1","object":"text_completion","choices":[{"index":0,"text":"hi"}]}\n\n',
        b'data: {"id":"c1","object":"text_completion","choices":[{"index":0,"text":"HALF-EVENT-TEXT"}]}\n\n',
    ),
}
#: where in the second event the upstream breaks off: inside its JSON, right after its last
#: line's end (the blank line missing), between the ``event:`` line and the ``data:`` line
CUTS = {
    "mid_json": lambda ev: ev.index(b"HALF-EVENT-TEXT") + 4,
    "before_blank_line": lambda ev: len(ev.rstrip(b"\r\n")) + (2 if ev.endswith(b"\r\n\r\n") else 1),
    "after_first_line": lambda ev: ev.index(b"\n") + 1,
}


def cut_mid_event(case: WireCase, at: int, rst: bool) -> Script:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD + chunk(case.first) + chunk(case.second[:at]))
        await writer.drain()
        await asyncio.sleep(0.05)
        if rst:
            reset(writer)
        else:
            writer.close()

    return script


async def exchange(raw_upstream: RawUpstream, path: str, body: bytes) -> tuple[bytes, dict]:
    """POST ``body`` to ``path`` through a fresh proxy on a raw socket: every byte the agent
    received until the proxy closed, and the proxy's stats."""
    runner, port = await start(proxy_config({"upstream": {"read_timeout_s": 2}}, raw_upstream.url))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        got = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        r2, w2 = await asyncio.open_connection("127.0.0.1", port)
        w2.write(b"GET /loop-guard HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        stats = orjson.loads((await r2.read()).split(b"\r\n\r\n", 1)[1])
        w2.close()
        return got, stats
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("rst", [False, True], ids=["fin", "reset"])
@pytest.mark.parametrize("cut", list(CUTS))
@pytest.mark.parametrize("wire", list(WIRE_CASES))
async def test_a_stream_cut_mid_event_drops_the_half_event_before_the_error_event(
    raw_upstream: RawUpstream, wire: str, cut: str, rst: bool
) -> None:
    """The agent gets the whole events, then the error event on its own: never the half event
    (its parser would read the error event as the rest of it), and nothing left unended."""
    case = WIRE_CASES[wire]
    at = CUTS[cut](case.second)
    raw_upstream.script = cut_mid_event(case, at, rst)
    got, stats = await exchange(raw_upstream, case.path, case.body)
    status, body = status_and_body(got)
    assert status == 200
    assert not got.endswith(b"0\r\n\r\n")  # a broken stream, not a success
    data = dechunk(body)
    assert data.startswith(case.first)
    framer = SSEFramer()
    events = framer.feed(data[len(case.first) :])
    assert framer.finish() == b""  # nothing after the error event's blank line
    assert len(events) == 1, data
    error = orjson.loads(events[0].data or "")
    kind = error["error"]["type"] if "error" in error else error["code"]
    assert kind == "upstream_disconnected"
    assert b"HALF-EVENT-TEXT" not in data
    assert (stats["upstream_errors"], stats["internal_errors"]) == (1, 0)


# --- each official SDK raises the error event as the API error it is ------------------------------


@pytest.fixture
async def cut_proxy(raw_upstream: RawUpstream) -> AsyncIterator[Callable[[str], Awaitable[str]]]:
    """``await cut_proxy(wire)``: a proxy in front of an upstream that sends the wire's first
    event and breaks off inside its second (FIN); returns the proxy's base URL."""
    runners: list[Any] = []

    async def make(wire: str) -> str:
        case = WIRE_CASES[wire]
        raw_upstream.script = cut_mid_event(case, CUTS["mid_json"](case.second), False)
        runner, port = await start(proxy_config({}, raw_upstream.url))
        runners.append(runner)
        return f"http://127.0.0.1:{port}"

    yield make
    for runner in runners:
        await runner.cleanup()


async def test_the_openai_sdk_raises_the_api_error_of_a_chat_stream_cut_mid_event(cut_proxy: Any) -> None:
    """Before: ``json.JSONDecodeError`` (the error event read as the rest of the half event)."""
    client = openai.AsyncOpenAI(base_url=await cut_proxy("chat") + "/v1", api_key="k", max_retries=0)
    got: list[str | None] = []
    try:
        with pytest.raises(openai.APIError) as raised:
            stream = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            async for ev in stream:
                got.append(ev.choices[0].delta.content)
    finally:
        await client.close()
    assert type(raised.value) is openai.APIError  # not APIConnectionError
    assert raised.value.message == "loopguard: upstream closed the stream before it finished"
    assert raised.value.body == {
        "message": "loopguard: upstream closed the stream before it finished",
        "type": "upstream_disconnected",
        "code": 502,
    }
    assert got == ["hi"]


async def test_the_openai_sdk_reads_the_error_event_of_a_responses_stream_cut_mid_event(
    cut_proxy: Any,
) -> None:
    """The Responses stream's ``error`` event reaches the SDK whole and is handed to the caller
    (as the SDK does with the server's own), then the broken connection (before: a JSON decode
    error, and the error event never read)."""
    client = openai.AsyncOpenAI(base_url=await cut_proxy("responses") + "/v1", api_key="k", max_retries=0)
    types: list[str] = []
    error: Any = None
    try:
        with pytest.raises(openai.APIConnectionError):
            stream = await client.responses.create(model="m", input="hi", stream=True)
            async for ev in stream:
                types.append(ev.type)
                if ev.type == "error":
                    error = ev
    finally:
        await client.close()
    assert types == ["response.created", "error"]
    assert (error.code, error.message) == (
        "upstream_disconnected",
        "loopguard: upstream closed the stream before it finished",
    )


async def test_the_anthropic_sdk_raises_the_api_error_of_a_messages_stream_cut_mid_event(
    cut_proxy: Any,
) -> None:
    """Before: ``anthropic.APIConnectionError`` (the error event never parsed)."""
    client = anthropic.AsyncAnthropic(base_url=await cut_proxy("messages"), api_key="k", max_retries=0)
    try:
        with pytest.raises(anthropic.APIStatusError) as raised:
            stream = await client.messages.create(
                model="m", max_tokens=64, messages=[{"role": "user", "content": "hi"}], stream=True
            )
            async for _ in stream:
                pass
    finally:
        await client.close()
    assert raised.value.body == {
        "type": "error",
        "error": {
            "type": "upstream_disconnected",
            "message": "loopguard: upstream closed the stream before it finished",
        },
    }


async def test_the_google_genai_sdk_raises_the_api_error_of_a_gemini_stream_cut_mid_event(
    cut_proxy: Any,
) -> None:
    """Before: ``google.genai.errors.UnknownApiResponseError`` (the glued event is not JSON)."""
    client = genai.Client(
        api_key="k", http_options=genai_types.HttpOptions(base_url=await cut_proxy("gemini"))
    )
    texts: list[str | None] = []
    with pytest.raises(genai_errors.APIError) as raised:
        async for answer in await client.aio.models.generate_content_stream(model="m", contents="hi"):
            texts.append(answer.text)
    assert not isinstance(raised.value, genai_errors.UnknownApiResponseError)
    assert raised.value.code == 502
    assert raised.value.message == "loopguard: upstream closed the stream before it finished"
    assert texts == ["hi"]


# --- a Gemini stream without candidates is complete as it is ----------------------------------------

#: A blocked prompt as Google answers it: prompt feedback and usage, no candidate at all.
BLOCKED = {
    "promptFeedback": {
        "blockReason": "PROHIBITED_CONTENT",
        "safetyRatings": [{"category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH"}],
    },
    "usageMetadata": {"promptTokenCount": 9, "totalTokenCount": 9},
    "modelVersion": "gemini-2.5-flash",
    "responseId": "r1",
}
GEMINI_BODY = orjson.dumps({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})


@pytest.mark.parametrize(
    "events",
    [
        pytest.param([BLOCKED], id="blocked_prompt"),
        pytest.param([{"candidates": []}], id="empty_candidates"),
        pytest.param([{"candidates": [], "promptFeedback": {"blockReason": "OTHER"}}], id="both"),
        pytest.param([{"usageMetadata": {"promptTokenCount": 1}}, BLOCKED], id="two_events_no_candidate"),
    ],
)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_gemini_answer_without_candidates_passes_byte_for_byte(
    upstream: FakeUpstream, make_proxy: ProxyFactory, events: list[dict], stream: bool
) -> None:
    """Before: the stream got ``upstream_disconnected`` appended and a broken connection (taken for
    an answer that stopped short), while the same answer as JSON passed."""
    sent = (
        b"".join(b"data: " + orjson.dumps(e) + b"\r\n\r\n" for e in events)
        if stream
        else orjson.dumps(events[-1])
    )

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        ctype = "text/event-stream" if stream else "application/json"
        resp = web.StreamResponse(headers={"Content-Type": ctype})
        await resp.prepare(request)
        await resp.write(sent)
        await resp.write_eof()
        return resp

    upstream.handler = handler
    base = await make_proxy()
    method = "streamGenerateContent?alt=sse" if stream else "generateContent"
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{base}/v1beta/models/gemini-2.5-flash:{method}", data=GEMINI_BODY) as r:
            got = await r.read()  # raises ClientPayloadError on a broken stream
            assert r.status == 200
        async with s.get(base + "/loop-guard") as r:
            stats = await r.json()
    assert got == sent
    assert (stats["upstream_errors"], stats["internal_errors"]) == (0, 0)
    assert len(upstream.requests) == 1


async def test_the_google_genai_sdk_gets_a_blocked_prompt_through_the_proxy(
    upstream: FakeUpstream, make_proxy: ProxyFactory
) -> None:
    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: " + orjson.dumps(BLOCKED) + b"\r\n\r\n")
        await resp.write_eof()
        return resp

    upstream.handler = handler
    client = genai.Client(api_key="k", http_options=genai_types.HttpOptions(base_url=await make_proxy()))
    answers = [
        a
        async for a in await client.aio.models.generate_content_stream(
            model="gemini-2.5-flash", contents="hi"
        )
    ]
    assert [(a.candidates, a.prompt_feedback.block_reason) for a in answers] == [
        (None, genai_types.BlockedReason.PROHIBITED_CONTENT)
    ]
