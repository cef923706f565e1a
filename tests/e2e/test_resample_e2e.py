"""Re-sample and fallback (``recovery.resample``, ``recovery.fallback``) through the real server in
front of scripted fake upstreams, in every wire (chat completions, Responses, Messages, Gemini),
JSON and SSE.

The conversation is eight identical reads with the same result: the circuit breaker withholds
the 7th and 8th results, and the upstream's answer is a ninth identical read, which repeats a
withheld call (with the escalation ladder off, today it is stopped: ``denials``). With
``resample.attempts`` the upstream is asked again with the configured ``params`` and a seed of the
attempt's own; the first answer that does not repeat reaches the agent byte for byte. The exact
bodies each upstream saw are pinned, and so is every answer the agent got.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from structlog.testing import capture_logs

from tests.helpers.fakes import (
    FakeUpstream,
    Recorded,
    completion,
    repeated_call_messages,
    sse_events,
    tool_call,
)
from tests.helpers.gemini_contents import answer_events as gemini_events
from tests.helpers.gemini_contents import answer_object as gemini_object
from tests.helpers.gemini_contents import gemini_body
from tests.helpers.messages_blocks import message_events, message_object, messages_body
from tests.helpers.responses_items import function_call_item, response_events, response_object, responses_body
from tests.helpers.sdk_agent import snapshot

ARGS = '{"path": "app.py"}'
OTHER = '{"path": "."}'
NO_LADDER: dict[str, Any] = {"guards": {"escalation": {"enabled": False}}}
PARAMS = {"temperature": 1.3, "repeat_penalty": 1.2}
KEY_ENV = "LOOPGUARD_TEST_FALLBACK_KEY"
KEY = "fb-secret-1"

#: the collapse counters, untouched by re-sample and fallback
NO_COLLAPSE = {"collapsed_requests": 0, "folded_steps": 0, "prefix_breaks": 0}


def _message(name: str, args: str, cid: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [tool_call(name, args, cid)]}


def _messages_message(name: str, args: str, cid: str) -> dict[str, Any]:
    block = {"type": "tool_use", "id": cid, "name": name, "input": orjson.loads(args)}
    return {"role": "assistant", "content": [block]}


@dataclass(frozen=True)
class Wire:
    name: str
    path: Callable[[bool], str]
    body: Callable[[list[dict[str, Any]], bool], dict[str, Any]]
    #: (JSON answer, SSE events) of a call ``name(args)`` with id ``cid``
    answer: Callable[[str, str, str], tuple[dict[str, Any], list[bytes]]]
    #: the wire's seed lives here (None: the wire has no seed)
    seed_in: str | None
    credential: str


def _gemini_path(stream: bool, model: str = "m") -> str:
    if stream:
        return f"/v1beta/models/{model}:streamGenerateContent?alt=sse"
    return f"/v1beta/models/{model}:generateContent"


WIRES = [
    Wire(
        "chat",
        lambda stream: "/v1/chat/completions",
        lambda messages, stream: {"model": "m", "messages": messages, "stream": stream},
        lambda n, a, c: (completion([tool_call(n, a, c)]), sse_events([tool_call(n, a, c)])),
        "top",
        "Authorization",
    ),
    Wire(
        "responses",
        lambda stream: "/v1/responses",
        lambda messages, stream: {**responses_body(messages), "stream": stream},
        lambda n, a, c: (response_object([function_call_item(c, n, a)]), response_events([(c, n, a)])),
        None,
        "Authorization",
    ),
    Wire(
        "messages",
        lambda stream: "/v1/messages",
        lambda messages, stream: {**messages_body(messages), "max_tokens": 100, "stream": stream},
        lambda n, a, c: (
            message_object(_messages_message(n, a, c)),
            message_events(_messages_message(n, a, c)),
        ),
        None,
        "x-api-key",
    ),
    Wire(
        "gemini",
        _gemini_path,
        lambda messages, stream: gemini_body(messages),
        lambda n, a, c: (gemini_object(_message(n, a, c)), gemini_events(_message(n, a, c))),
        "generationConfig",
        "x-goog-api-key",
    ),
]
IDS = [w.name for w in WIRES]
STREAMS = pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
EVERY_WIRE = pytest.mark.parametrize("wire", WIRES, ids=IDS)


def _bytes(wire: Wire, stream: bool, name: str, args: str, cid: str) -> bytes:
    obj, events = wire.answer(name, args, cid)
    return b"".join(events) if stream else orjson.dumps(obj)


def repeat(wire: Wire, stream: bool) -> bytes:
    """The ninth identical read: it repeats a withheld call."""
    return _bytes(wire, stream, "read_file", ARGS, "call_9")


def fresh(wire: Wire, stream: bool, cid: str = "call_new") -> bytes:
    """A call not made before: no repeat."""
    return _bytes(wire, stream, "list_dir", OTHER, cid)


def scripted(answers: list[bytes | int | str], stream: bool) -> Any:
    """A handler answering the n-th request with ``answers[n]`` (bytes: a 200 in the stream's
    form; an int: that status with an error body; a str: a 200 JSON body of that text, whatever
    was asked); the last answer for any later request."""
    calls = 0

    async def handle(request: web.Request, body: bytes) -> web.StreamResponse:
        nonlocal calls
        answer = answers[min(calls, len(answers) - 1)]
        calls += 1
        if isinstance(answer, int):
            return web.Response(status=answer, body=b'{"error": "busy"}', content_type="application/json")
        if isinstance(answer, str):
            return web.Response(body=answer.encode(), content_type="application/json")
        if not stream:
            return web.Response(body=answer, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for at in range(0, len(answer), 50):  # as a stream comes: in pieces, not events
            await resp.write(answer[at : at + 50])
            await asyncio.sleep(0)
        await resp.write_eof()
        return resp

    return handle


async def post(base: str, wire: Wire, stream: bool, messages: list[dict[str, Any]]) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            base + wire.path(stream),
            data=orjson.dumps(wire.body(messages, stream)),
            headers={
                "Content-Type": "application/json",
                "x-session-id": f"run-{wire.name}",
                "Authorization": "Bearer agent-key",
                "x-api-key": "agent-key",
                "x-goog-api-key": "agent-key",
            },
        ) as r,
    ):
        return r.status, await r.read()


def seed(body: bytes, attempt: int) -> int:
    """The documented seed: the first 31 bits of SHA-256 over ``loopguard-resample:<n>:`` and the body."""
    return (
        int.from_bytes(hashlib.sha256(f"loopguard-resample:{attempt}:".encode() + body).digest()[:4], "big")
        >> 1
    )


def resampled(wire: Wire, sent: bytes, attempt: int, params: dict[str, Any] = PARAMS) -> bytes:
    """The body the upstream must see on ``attempt``: ``sent`` with ``params`` and the seed."""
    obj = orjson.loads(sent)
    target = obj.setdefault("generationConfig", {}) if wire.seed_in == "generationConfig" else obj
    target.update(params)
    if wire.seed_in is not None:
        target["seed"] = seed(sent, attempt)
    return orjson.dumps(obj)


def recovering(attempts: int = 2, **more: Any) -> dict[str, Any]:
    return {**NO_LADDER, "recovery": {"resample": {"attempts": attempts, "params": PARAMS}, **more}}


def same(raw: bytes) -> bytes:
    """``raw`` with the ids the proxy numbers per process (a stop's Responses message item) as one."""
    return re.sub(rb"msg_loopguard_\d+", b"msg_loopguard_N", raw)


async def today(make_proxy, upstream: FakeUpstream, wire: Wire, stream: bool) -> tuple[int, bytes, Recorded]:
    """What the agent gets without recovery for the repeated read (the stop), and what the
    upstream was sent."""
    upstream.handler = scripted([repeat(wire, stream)], stream)
    base = await make_proxy(NO_LADDER)
    status, raw = await post(base, wire, stream, repeated_call_messages(8))
    sent = upstream.requests[-1]
    upstream.requests.clear()
    return status, raw, sent


@pytest.fixture
async def second() -> AsyncIterator[FakeUpstream]:
    """The fallback upstream: another fake model server that records what it gets."""
    fake = FakeUpstream()

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        fake.requests.append(Recorded(request.method, request.raw_path, dict(request.headers), body))
        assert fake.handler is not None
        return await fake.handler(request, body)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    fake.url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    yield fake
    await runner.cleanup()


# --- re-sample ------------------------------------------------------------------------------------


@STREAMS
@EVERY_WIRE
async def test_resample_delivers_the_first_answer_that_does_not_repeat_with_params_and_seed(
    upstream: FakeUpstream, make_proxy, wire: Wire, stream: bool
) -> None:
    upstream.handler = scripted([repeat(wire, stream), repeat(wire, stream), fresh(wire, stream)], stream)
    base = await make_proxy(recovering(attempts=3))
    status, raw = await post(base, wire, stream, repeated_call_messages(8))
    assert (status, raw) == (200, fresh(wire, stream))  # the upstream's bytes, as it sent them
    sent = upstream.requests[0].body
    assert [r.body for r in upstream.requests] == [sent, resampled(wire, sent, 1), resampled(wire, sent, 2)]
    assert [r.path_qs for r in upstream.requests] == [wire.path(stream)] * 3
    snap = await snapshot(base)
    assert snap["recovery"] == {
        "resample_requests": 1,
        "resample_recovered": 1,
        "fallback_requests": 0,
        "fallback_recovered": 0,
        "extra_upstream_calls": 2,
        **NO_COLLAPSE,
    }
    assert snap["per_rule"].get("resample") == 1
    assert snap["stops"] == 0


@STREAMS
@EVERY_WIRE
async def test_resample_exhausted_leaves_todays_answer_byte_for_byte(
    upstream: FakeUpstream, make_proxy, wire: Wire, stream: bool
) -> None:
    before = await today(make_proxy, upstream, wire, stream)
    upstream.handler = scripted([repeat(wire, stream)], stream)
    base = await make_proxy(recovering(attempts=2))
    status, raw = await post(base, wire, stream, repeated_call_messages(8))
    assert (status, same(raw)) == (before[0], same(before[1]))
    assert b"[loopguard] Stopped" in raw
    sent = upstream.requests[0].body
    assert sent == before[2].body
    assert [r.body for r in upstream.requests] == [sent, resampled(wire, sent, 1), resampled(wire, sent, 2)]
    snap = await snapshot(base)
    assert snap["recovery"]["resample_requests"] == 1
    assert snap["recovery"]["resample_recovered"] == 0
    assert snap["recovery"]["extra_upstream_calls"] == 2
    assert snap["stops"] == 1


@pytest.mark.parametrize("failure", [500, 400, "not an answer"], ids=["5xx", "4xx", "unreadable"])
@STREAMS
@EVERY_WIRE
async def test_an_upstream_error_during_resample_leaves_the_original_answer(
    upstream: FakeUpstream, make_proxy, wire: Wire, stream: bool, failure: int | str
) -> None:
    before = await today(make_proxy, upstream, wire, stream)
    upstream.handler = scripted([repeat(wire, stream), failure, fresh(wire, stream)], stream)
    base = await make_proxy(recovering(attempts=3))
    status, raw = await post(base, wire, stream, repeated_call_messages(8))
    assert (status, same(raw)) == (before[0], same(before[1]))
    assert len(upstream.requests) == 2  # the error ended the re-sampling
    assert (await snapshot(base))["recovery"]["extra_upstream_calls"] == 1


@STREAMS
async def test_recovery_off_by_default_makes_no_extra_call(
    upstream: FakeUpstream, make_proxy, stream: bool
) -> None:
    wire = WIRES[0]
    upstream.handler = scripted([repeat(wire, stream), fresh(wire, stream)], stream)
    base = await make_proxy(NO_LADDER)
    status, raw = await post(base, wire, stream, repeated_call_messages(8))
    assert status == 200 and b"[loopguard] Stopped" in raw
    assert len(upstream.requests) == 1
    assert (await snapshot(base))["recovery"]["extra_upstream_calls"] == 0


@STREAMS
async def test_an_answer_that_does_not_repeat_is_not_asked_again(
    upstream: FakeUpstream, make_proxy, stream: bool
) -> None:
    wire = WIRES[0]
    upstream.handler = scripted([fresh(wire, stream)], stream)
    base = await make_proxy(recovering())
    assert await post(base, wire, stream, repeated_call_messages(8)) == (200, fresh(wire, stream))
    assert len(upstream.requests) == 1


@pytest.mark.parametrize("wire", WIRES[:3], ids=IDS[:3])
async def test_a_stream_that_cannot_be_resampled_is_not_held(
    upstream: FakeUpstream, make_proxy, wire: Wire
) -> None:
    """Two reads so far: nothing withheld, so no answer can be re-sampled; its first bytes reach
    the agent while the upstream is still generating. (Gemini's call-only answer opens with its
    call, which the stop judge's guard holds until the finish with or without recovery.)"""
    gate = asyncio.Event()
    events = wire.answer("read_file", ARGS, "call_9")[1]

    async def handle(request: web.Request, body: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i, event in enumerate(events):
            if i == len(events) - 1:
                await gate.wait()
            await resp.write(event)
        await resp.write_eof()
        return resp

    upstream.handler = handle
    base = await make_proxy(recovering())
    async with (
        aiohttp.ClientSession() as s,
        s.post(base + wire.path(True), data=orjson.dumps(wire.body(repeated_call_messages(2), True))) as r,
    ):
        first = await asyncio.wait_for(r.content.readany(), 5)
        assert first  # before the upstream finished
        gate.set()
        rest = await r.read()
    assert first + rest == repeat(wire, True)
    assert len(upstream.requests) == 1


# --- fallback -------------------------------------------------------------------------------------


@STREAMS
@EVERY_WIRE
async def test_fallback_is_asked_once_with_its_model_and_key_after_the_attempts_repeat(
    upstream: FakeUpstream, second: FakeUpstream, make_proxy, monkeypatch, wire: Wire, stream: bool
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    upstream.handler = scripted([repeat(wire, stream)], stream)
    second.handler = scripted([fresh(wire, stream, "call_fb")], stream)
    fallback = {"url": second.url, "model": "fb-model", "api_key_env": KEY_ENV, "timeout_s": 5}
    base = await make_proxy(recovering(attempts=1, fallback=fallback))
    status, raw = await post(base, wire, stream, repeated_call_messages(8))
    assert (status, raw) == (200, fresh(wire, stream, "call_fb"))
    sent = upstream.requests[0].body
    assert [r.body for r in upstream.requests] == [sent, resampled(wire, sent, 1)]
    [asked] = second.requests
    if wire.name == "gemini":  # the model is in the path
        assert asked.path_qs == _gemini_path(stream, "fb-model")
        assert asked.body == sent
    else:
        assert asked.path_qs == wire.path(stream)
        assert asked.body == orjson.dumps({**orjson.loads(sent), "model": "fb-model"})
    prefix = "Bearer " if wire.credential == "Authorization" else ""
    assert asked.headers[wire.credential] == prefix + KEY
    others = {"Authorization", "x-api-key", "x-goog-api-key"} - {wire.credential}
    assert not others & set(asked.headers)  # the agent's credentials do not go to the fallback
    assert (await snapshot(base))["recovery"] == {
        "resample_requests": 1,
        "resample_recovered": 0,
        "fallback_requests": 1,
        "fallback_recovered": 1,
        "extra_upstream_calls": 2,
        **NO_COLLAPSE,
    }


@STREAMS
async def test_fallback_timeout_or_error_leaves_the_original_answer(
    upstream: FakeUpstream, second: FakeUpstream, make_proxy, stream: bool
) -> None:
    wire = WIRES[0]
    before = await today(make_proxy, upstream, wire, stream)

    async def slow(request: web.Request, body: bytes) -> web.StreamResponse:
        await asyncio.sleep(5)
        return web.Response(body=fresh(wire, False), content_type="application/json")

    second.handler = slow
    upstream.handler = scripted([repeat(wire, stream)], stream)
    base = await make_proxy({**NO_LADDER, "recovery": {"fallback": {"url": second.url, "timeout_s": 0.3}}})
    assert await post(base, wire, stream, repeated_call_messages(8)) == before[:2]
    assert len(upstream.requests) == 1  # no re-sample attempt configured
    assert len(second.requests) == 1
    second.handler = scripted([502], stream)
    assert await post(base, wire, stream, repeated_call_messages(8)) == before[:2]
    snap = await snapshot(base)
    assert snap["recovery"]["fallback_requests"] == 2
    assert snap["recovery"]["fallback_recovered"] == 0


async def test_recovery_metrics_and_log_evidence(
    upstream: FakeUpstream, second: FakeUpstream, make_proxy
) -> None:
    wire = WIRES[0]
    upstream.handler = scripted([repeat(wire, False)] * 4 + [503], False)
    second.handler = scripted([fresh(wire, False)], False)
    base = await make_proxy(recovering(attempts=2, fallback={"url": second.url}))
    with capture_logs() as logs:
        await post(base, wire, False, repeated_call_messages(8))
        await post(base, wire, False, repeated_call_messages(8))  # the attempts now fail at once
    async with aiohttp.ClientSession() as s, s.get(base + "/loop-guard/metrics") as r:
        text = await r.text()
    assert 'loopguard_recovery_total{kind="resample",outcome="repeated"} 1.0' in text
    assert 'loopguard_recovery_total{kind="resample",outcome="error"} 1.0' in text
    assert 'loopguard_recovery_total{kind="fallback",outcome="recovered"} 2.0' in text
    assert "loopguard_extra_upstream_calls_total 5.0" in text  # 2 attempts + 1, 1 + 1
    lines = [e for e in logs if e.get("event") == "request"]
    recovered = [[a for a in e["actions"] if a["kind"] == "recover"] for e in lines]
    assert recovered == [
        [
            {
                "rule": "resample",
                "kind": "recover",
                "tool": "read_file",
                "count": 2,
                "limit": 2,
                "attempts": 2,
                "outcome": "repeated",
            },
            {
                "rule": "fallback",
                "kind": "recover",
                "tool": "read_file",
                "count": 1,
                "limit": 1,
                "attempts": 1,
                "outcome": "recovered",
            },
        ],
        [
            {
                "rule": "resample",
                "kind": "recover",
                "tool": "read_file",
                "count": 1,
                "limit": 2,
                "attempts": 1,
                "outcome": "error",
            },
            {
                "rule": "fallback",
                "kind": "recover",
                "tool": "read_file",
                "count": 1,
                "limit": 1,
                "attempts": 1,
                "outcome": "recovered",
            },
        ],
    ]
    assert "agent-key" not in repr(logs)  # no credential in any log event


async def test_a_json_request_sent_upstream_as_a_stream_is_resampled_as_a_stream(
    upstream: FakeUpstream, make_proxy
) -> None:
    """``upstream.stream_json_requests``: the attempt is the stream request loopguard sent, and the
    agent gets the recovered answer assembled into its JSON."""
    wire = WIRES[0]
    upstream.handler = scripted([repeat(wire, True), fresh(wire, True)], True)
    base = await make_proxy({**recovering(attempts=2), "upstream": {"stream_json_requests": True}})
    status, raw = await post(base, wire, False, repeated_call_messages(8))
    assert status == 200
    [choice] = orjson.loads(raw)["choices"]
    assert [c["function"] for c in choice["message"]["tool_calls"]] == [
        {"name": "list_dir", "arguments": OTHER}
    ]
    sent = upstream.requests[0].body
    assert orjson.loads(sent)["stream"] is True
    assert [r.body for r in upstream.requests] == [sent, resampled(wire, sent, 1)]


async def test_the_agent_going_away_while_the_answer_is_held_closes_the_upstream(
    upstream: FakeUpstream, make_proxy
) -> None:
    wire = WIRES[0]
    started, closed = asyncio.Event(), asyncio.Event()

    async def endless(request: web.Request, body: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            await resp.write(sse_events([tool_call("read_file", ARGS, "call_9")])[0])
            started.set()
            await asyncio.sleep(30)
        finally:
            closed.set()
        return resp

    upstream.handler = endless
    base = await make_proxy(recovering())
    body = orjson.dumps(wire.body(repeated_call_messages(8), True))
    async with aiohttp.ClientSession() as s:
        task = asyncio.ensure_future(s.post(base + wire.path(True), data=body))
        await asyncio.wait_for(started.wait(), 5)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await asyncio.wait_for(closed.wait(), 5)  # the held upstream stream was closed
    assert len(upstream.requests) == 1


def _array(events: list[bytes]) -> bytes:
    """Gemini's streamed array (``:streamGenerateContent`` without ``alt=sse``) of the same answer."""
    return b"[" + b",\r\n".join(e.strip()[len(b"data: ") :] for e in events) + b"]"


async def test_a_gemini_streamed_array_is_resampled_with_the_seed_in_generation_config(
    upstream: FakeUpstream, make_proxy
) -> None:
    wire = WIRES[3]
    again = _array(wire.answer("read_file", ARGS, "call_9")[1])
    other = _array(wire.answer("list_dir", OTHER, "call_new")[1])
    upstream.handler = scripted([again, other], False)  # application/json, read as it streams
    base = await make_proxy(recovering(attempts=2))
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            base + "/v1beta/models/m:streamGenerateContent",
            data=orjson.dumps(wire.body(repeated_call_messages(8), True)),
        ) as r,
    ):
        assert (r.status, await r.read()) == (200, other)
    sent = upstream.requests[0].body
    assert [r.body for r in upstream.requests] == [sent, resampled(wire, sent, 1)]
