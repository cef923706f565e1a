"""How a stop reaches the agent (``stop.deliver``, :mod:`proxy.edge.stopped`), through the real
server in front of a fake upstream, in every wire (chat completions, Responses, Messages, Gemini),
JSON and SSE, and with the official ``openai`` and ``anthropic`` SDKs.

The conversation is eight identical reads with the same result; the upstream answers the ninth.
With the escalation ladder off, the denials stop ends that turn (the 7th and 8th results were
withheld). ``deliver: answer`` (the default): a 200 whose answer is the stop's text, and a JSON
answer carries ``x-loopguard-stop: denials``. ``deliver: error``: an HTTP 400 in the wire's own
error form with code ``loop_detected``, the same for a retried request, which makes one incident.
A stream that could not be stopped is not held; one that is stopped after its first bytes went
out ends with the error as an event in the wire's form.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import anthropic
import openai
import orjson
import pytest
from aiohttp import web

from proxy.response import decide
from proxy.response.decide import DENIALS_TEXT
from tests.helpers.fakes import FakeUpstream, completion, repeated_call_messages, sse_events, tool_call
from tests.helpers.gemini_contents import answer_events as gemini_events
from tests.helpers.gemini_contents import answer_object as gemini_object
from tests.helpers.gemini_contents import gemini_body
from tests.helpers.messages_blocks import message_events, message_object, messages_body
from tests.helpers.responses_items import function_call_item, response_events, response_object, responses_body
from tests.helpers.sdk_agent import snapshot

ARGS = '{"path": "app.py"}'
STOP_TEXT = DENIALS_TEXT.format(tool="read_file", count=9, denials=2)
ABOUT = {"rule": "stop", "kind": "denials", "tool": "read_file"}
NO_LADDER: dict[str, Any] = {"guards": {"escalation": {"enabled": False}}}
TEXT = "Reading it once more."
#: the answer to the looping conversation: some text and the ninth identical read (as a chat
#: message, and as a Messages one)
NINTH = {"role": "assistant", "content": TEXT, "tool_calls": [tool_call("read_file", ARGS, "call_9")]}
NINTH_MESSAGES = {
    "role": "assistant",
    "content": [
        {"type": "text", "text": TEXT},
        {"type": "tool_use", "id": "toolu_9", "name": "read_file", "input": {"path": "app.py"}},
    ],
}

OPENAI_ERROR = {
    "error": {
        "message": STOP_TEXT,
        "type": "invalid_request_error",
        "param": None,
        "code": "loop_detected",
        "loopguard": ABOUT,
    }
}


@dataclass(frozen=True)
class Wire:
    name: str
    path: Callable[[bool], str]
    body: Callable[[list[dict[str, Any]], bool], dict[str, Any]]
    json_answer: dict[str, Any]
    sse_answer: list[bytes]
    error: dict[str, Any]
    #: the error event that ends a stream already under way
    event: bytes


def _gemini_path(stream: bool) -> str:
    return "/v1beta/models/m:streamGenerateContent?alt=sse" if stream else "/v1beta/models/m:generateContent"


WIRES = [
    Wire(
        "chat",
        lambda stream: "/v1/chat/completions",
        lambda messages, stream: {"model": "m", "messages": messages, "stream": stream},
        completion([tool_call("read_file", ARGS, "call_9")]),
        sse_events([tool_call("read_file", ARGS, "call_9")]),
        OPENAI_ERROR,
        b"data: " + orjson.dumps(OPENAI_ERROR) + b"\n\n",
    ),
    Wire(
        "responses",
        lambda stream: "/v1/responses",
        lambda messages, stream: {**responses_body(messages), "stream": stream},
        response_object([function_call_item("call_9", "read_file", ARGS)]),
        response_events([("call_9", "read_file", ARGS)]),
        OPENAI_ERROR,
        b"event: error\ndata: "
        + orjson.dumps({"type": "error", "code": "loop_detected", "message": STOP_TEXT, "param": None})
        + b"\n\n",
    ),
    Wire(
        "messages",
        lambda stream: "/v1/messages",
        lambda messages, stream: {**messages_body(messages), "max_tokens": 100, "stream": stream},
        message_object(NINTH_MESSAGES),
        message_events(NINTH_MESSAGES),
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": STOP_TEXT,
                "code": "loop_detected",
                "loopguard": ABOUT,
            },
        },
        b"event: error\ndata: "
        + orjson.dumps(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": STOP_TEXT,
                    "code": "loop_detected",
                    "loopguard": ABOUT,
                },
            }
        )
        + b"\n\n",
    ),
    Wire(
        "gemini",
        _gemini_path,
        lambda messages, stream: gemini_body(messages),
        gemini_object(NINTH),
        gemini_events(NINTH),
        {
            "error": {
                "code": 400,
                "message": STOP_TEXT,
                "status": "INVALID_ARGUMENT",
                "details": [
                    {
                        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                        "reason": "LOOP_DETECTED",
                        "domain": "loopguard",
                        "metadata": ABOUT,
                    }
                ],
            }
        },
        b"data: "
        + orjson.dumps(
            {
                "error": {
                    "code": 400,
                    "message": STOP_TEXT,
                    "status": "INVALID_ARGUMENT",
                    "details": [
                        {
                            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                            "reason": "LOOP_DETECTED",
                            "domain": "loopguard",
                            "metadata": ABOUT,
                        }
                    ],
                }
            }
        )
        + b"\n\n",
    ),
]
IDS = [w.name for w in WIRES]


def answering(wire: Wire, stream: bool, gate: asyncio.Event | None = None) -> Any:
    """The fake upstream's handler: ``wire``'s answer (the ninth read), JSON or SSE; with
    ``gate``, the stream's last event waits for it."""

    async def handle(request: web.Request, body: bytes) -> web.StreamResponse:
        if not stream:
            return web.json_response(wire.json_answer)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i, event in enumerate(wire.sse_answer):
            if gate is not None and i == len(wire.sse_answer) - 1:
                await gate.wait()
            await resp.write(event)
            await asyncio.sleep(0)
        await resp.write_eof()
        return resp

    return handle


async def post(base: str, wire: Wire, stream: bool, messages: list[dict[str, Any]]) -> tuple[int, Any, bytes]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            base + wire.path(stream),
            data=orjson.dumps(wire.body(messages, stream)),
            headers={"Content-Type": "application/json", "x-session-id": f"run-{wire.name}"},
        ) as r,
    ):
        return r.status, r.headers, await r.read()


def stop_incidents(snap: dict[str, Any]) -> list[tuple[str, str, int, int]]:
    return [(i["kind"], i["tool"], i["count"], i["limit"]) for i in snap["incidents"] if i["kind"] == "stop"]


# --- through the server, every wire ---------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("wire", WIRES, ids=IDS)
async def test_deliver_error_answers_the_wires_own_400_the_same_for_a_retry_and_one_incident(
    upstream: FakeUpstream, make_proxy, wire: Wire, stream: bool
) -> None:
    upstream.handler = answering(wire, stream)
    base = await make_proxy({**NO_LADDER, "stop": {"deliver": "error"}})
    looping = repeated_call_messages(8)
    first = await post(base, wire, stream, looping)
    retried = await post(base, wire, stream, looping)
    for status, headers, raw in (first, retried):
        assert status == 400
        assert headers["Content-Type"] == "application/json"
        assert orjson.loads(raw) == wire.error
    assert first[2] == retried[2]  # byte for byte
    snap = await snapshot(base)
    assert stop_incidents(snap) == [("stop", "read_file", 9, 2)]  # the retry is not a new incident
    assert snap["internal_errors"] == 0


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("wire", WIRES, ids=IDS)
async def test_deliver_answer_is_a_200_with_the_stop_text_and_a_header_on_json(
    upstream: FakeUpstream, make_proxy, wire: Wire, stream: bool
) -> None:
    upstream.handler = answering(wire, stream)
    base = await make_proxy(NO_LADDER)
    status, headers, raw = await post(base, wire, stream, repeated_call_messages(8))
    assert status == 200
    assert orjson.dumps(STOP_TEXT)[1:-1] in raw  # the text, as the wire escapes it
    assert STOP_TEXT.startswith("[loopguard] Stopped: ")  # the first words a script can match
    # a stream's headers went out before its answer was decided: no header there
    assert headers.get("x-loopguard-stop") == (None if stream else "denials")
    assert stop_incidents(await snapshot(base)) == [("stop", "read_file", 9, 2)]


@pytest.mark.parametrize("wire", WIRES, ids=IDS)
async def test_deliver_error_streams_an_answer_that_cannot_be_stopped_unheld(
    upstream: FakeUpstream, make_proxy, wire: Wire
) -> None:
    """Two reads so far: no withheld result, nothing near the cap, so no answer to this request
    can be stopped; its first bytes reach the agent while the upstream is still generating."""
    gate = asyncio.Event()
    upstream.handler = answering(wire, True, gate)
    base = await make_proxy({**NO_LADDER, "stop": {"deliver": "error"}})
    body = orjson.dumps(wire.body(repeated_call_messages(2), True))
    async with (
        aiohttp.ClientSession() as s,
        s.post(base + wire.path(True), data=body, headers={"Content-Type": "application/json"}) as r,
    ):
        assert r.status == 200
        head = await asyncio.wait_for(r.content.readany(), 5)  # before the last event is sent
        whole = b"".join(wire.sse_answer)
        assert head == whole[: len(head)] and len(head) < len(whole)
        gate.set()
        rest = await r.read()
    assert head + rest == whole  # nothing changed


@pytest.mark.parametrize("wire", WIRES, ids=IDS)
async def test_deliver_error_ends_a_stream_already_under_way_with_the_error_event(
    upstream: FakeUpstream, make_proxy, wire: Wire, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop in a stream that was not held (forced here: the judge says no stop is possible)
    ends it with the wire's error event in place of the stop's answer."""
    monkeypatch.setattr(decide.StopJudge, "possible", property(lambda self: False))
    upstream.handler = answering(wire, True)
    base = await make_proxy({**NO_LADDER, "stop": {"deliver": "error"}})
    status, _, raw = await post(base, wire, True, repeated_call_messages(8))
    assert status == 200
    assert raw.endswith(wire.event)
    assert b"read_file" not in raw[: -len(wire.event)].replace(b"loopguard", b"")  # the call is gone
    assert stop_incidents(await snapshot(base)) == [("stop", "read_file", 9, 2)]


# --- the official SDKs ----------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_openai_sdk_raises_bad_request_with_code_loop_detected_and_does_not_retry(
    upstream: FakeUpstream, make_proxy, api: str, stream: bool
) -> None:
    wire = WIRES[IDS.index(api)]
    upstream.handler = answering(wire, stream)
    base = await make_proxy({**NO_LADDER, "stop": {"deliver": "error"}})
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="local", max_retries=2)
    body = wire.body(repeated_call_messages(8), stream)
    body.pop("stream")
    try:
        with pytest.raises(openai.BadRequestError) as exc:
            if api == "chat":
                got = await client.chat.completions.create(**body, stream=stream)
            else:
                got = await client.responses.create(**body, stream=stream)
            if stream:
                async for _ in got:  # pragma: no cover - the 400 comes before any event
                    pass
    finally:
        await client.close()
    assert exc.value.status_code == 400
    assert exc.value.code == "loop_detected"
    assert exc.value.message.endswith(STOP_TEXT) or STOP_TEXT in exc.value.message
    assert len(upstream.requests) == 1  # a 400 is final: the SDK did not retry


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_anthropic_sdk_raises_bad_request_with_the_stop_text_and_does_not_retry(
    upstream: FakeUpstream, make_proxy, stream: bool
) -> None:
    wire = WIRES[IDS.index("messages")]
    upstream.handler = answering(wire, stream)
    base = await make_proxy({**NO_LADDER, "stop": {"deliver": "error"}})
    client = anthropic.AsyncAnthropic(base_url=base, api_key="local", max_retries=2)
    body = wire.body(repeated_call_messages(8), stream)
    body.pop("stream")
    try:
        with pytest.raises(anthropic.BadRequestError) as exc:
            got = await client.messages.create(**body, stream=stream)
            if stream:
                async for _ in got:  # pragma: no cover - the 400 comes before any event
                    pass
    finally:
        await client.close()
    assert exc.value.status_code == 400
    assert exc.value.body == wire.error["error"] or exc.value.body == wire.error
    assert STOP_TEXT in str(exc.value)
    assert len(upstream.requests) == 1


async def test_openai_sdk_raises_on_the_error_event_of_a_chat_stream_under_way(
    upstream: FakeUpstream, make_proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(decide.StopJudge, "possible", property(lambda self: False))
    wire = WIRES[IDS.index("chat")]
    upstream.handler = answering(wire, True)
    base = await make_proxy({**NO_LADDER, "stop": {"deliver": "error"}})
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="local", max_retries=0)
    try:
        with pytest.raises(openai.APIError) as exc:
            got = await client.chat.completions.create(
                model="m",
                messages=repeated_call_messages(8),
                stream=True,  # type: ignore[arg-type]
            )
            async for _ in got:
                pass
    finally:
        await client.close()
    assert exc.value.message == STOP_TEXT
    assert exc.value.code == "loop_detected"


async def test_anthropic_sdk_raises_on_the_error_event_of_a_stream_under_way(
    upstream: FakeUpstream, make_proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(decide.StopJudge, "possible", property(lambda self: False))
    wire = WIRES[IDS.index("messages")]
    upstream.handler = answering(wire, True)
    base = await make_proxy({**NO_LADDER, "stop": {"deliver": "error"}})
    client = anthropic.AsyncAnthropic(base_url=base, api_key="local", max_retries=0)
    body = wire.body(repeated_call_messages(8), True)
    body.pop("stream")
    try:
        with pytest.raises(anthropic.APIStatusError) as exc:
            got = await client.messages.create(**body, stream=True)
            async for _ in got:
                pass
    finally:
        await client.close()
    assert STOP_TEXT in str(exc.value)


async def test_deliver_error_on_a_json_request_sent_upstream_as_a_stream(
    upstream: FakeUpstream, make_proxy
) -> None:
    """``upstream.stream_json_requests``: the agent asked for JSON, the upstream streamed; the
    stop is the same 400 (with no retry wanted) as for any JSON answer."""
    wire = WIRES[IDS.index("chat")]
    upstream.handler = answering(wire, True)
    base = await make_proxy(
        {**NO_LADDER, "stop": {"deliver": "error"}, "upstream": {"stream_json_requests": True}}
    )
    status, headers, raw = await post(base, wire, False, repeated_call_messages(8))
    assert (status, orjson.loads(raw)) == (400, wire.error)
    assert (headers["x-should-retry"], headers["x-loopguard-stop"]) == ("false", "denials")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_an_observed_stop_is_no_error(upstream: FakeUpstream, make_proxy, stream: bool) -> None:
    """``stop.mode: observe`` with ``deliver: error``: the stop is only observed, so the agent gets
    the upstream's answer unchanged, as a 200."""
    wire = WIRES[IDS.index("chat")]
    upstream.handler = answering(wire, stream)
    base = await make_proxy({**NO_LADDER, "stop": {"deliver": "error", "mode": "observe"}})
    status, headers, raw = await post(base, wire, stream, repeated_call_messages(8))
    assert status == 200
    if stream:
        assert raw == b"".join(wire.sse_answer)
    else:
        assert orjson.loads(raw) == wire.json_answer
    assert "x-loopguard-stop" not in headers
