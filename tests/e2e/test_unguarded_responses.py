"""Answers the response side cannot read are asked for readable, and counted when they still are not
(``unguarded_responses{reason}``, the log line's ``unguarded_response``), through the real server.

Before: the agent's ``Accept-Encoding: gzip, deflate`` (the openai and anthropic SDKs send it by
default) went upstream as it came; a compressing upstream's answer then passed unread, a looping
call came through where the stop should be, and neither the log line nor a counter said so. Now a
guarded request asks for ``Accept-Encoding: identity`` while the response side is on, and every
answer it was to read and could not is counted by reason: ``content_encoding`` (compressed
anyway), ``content_type`` (a 200 answer neither SSE nor JSON), ``too_large`` (an event past the
limit), ``internal_error`` (the response side failed open), ``candidates`` (a Gemini answer with
several candidates, or one other than the first: which one the agent acts on is not known).
Gemini's JSON-array stream (``:streamGenerateContent`` without ``alt=sse``) is read, element by
element, as its SSE form is.
"""

from __future__ import annotations

import gzip
import zlib
from typing import Any
from unittest import mock

import aiohttp
import orjson
import pytest
from aiohttp import web
from structlog.testing import capture_logs

from proxy.response import stream_guard
from proxy.response.stream_guard import StreamGuard
from tests.conftest import ProxyFactory
from tests.helpers.fakes import FakeUpstream, completion, repeated_call_messages, sse_events, tool_call
from tests.helpers.gemini_contents import gemini_body
from tests.helpers.messages_blocks import messages_body
from tests.helpers.messages_items import message, message_events
from tests.helpers.responses_items import function_call_item, response_events, response_object, responses_body

ARGS = '{"path": "app.py"}'
#: the agent's headers, as the openai SDK sends them
SDK_HEADERS = {"Content-Type": "application/json", "Accept-Encoding": "gzip, deflate"}
CONFIG = {"guards": {"escalation": {"enabled": False}}}


def _chat(stream: bool) -> tuple[str, bytes, bytes, str]:
    calls = [tool_call("read_file", ARGS, "call_9")]
    answer = b"".join(sse_events(calls)) if stream else orjson.dumps(completion(calls))
    body = {"model": "m", "stream": stream, "messages": repeated_call_messages(8)}
    return "/v1/chat/completions", orjson.dumps(body), answer, "chat"


def _responses(stream: bool) -> tuple[str, bytes, bytes, str]:
    call = ("call_9", "read_file", ARGS)
    if stream:
        answer = b"".join(response_events([call]))
    else:
        answer = orjson.dumps(response_object([function_call_item(*call)]))
    body = {**responses_body(repeated_call_messages(8)), "stream": stream}
    return "/v1/responses", orjson.dumps(body), answer, "responses"


def _messages(stream: bool) -> tuple[str, bytes, bytes, str]:
    call = ("toolu_9", "read_file", ARGS)
    if stream:
        answer = b"".join(message_events([call]))
    else:
        answer = orjson.dumps(
            message([{"type": "tool_use", "id": "toolu_9", "name": "read_file", "input": {"path": "app.py"}}])
        )
    body = {**messages_body(repeated_call_messages(8)), "stream": stream, "max_tokens": 100}
    return "/v1/messages", orjson.dumps(body), answer, "messages"


WIRES = {"chat": _chat, "responses": _responses, "messages": _messages}


def compressing(answer: bytes, stream: bool, always: bool = False) -> Any:
    """An upstream that compresses its answer as the agent's ``Accept-Encoding`` allows (gzip
    first, then deflate), as uvicorn's or nginx's gzip does; ``always``: whatever was asked."""

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        accepted = request.headers.get("Accept-Encoding", "")
        ctype = "text/event-stream" if stream else "application/json"
        if always or "gzip" in accepted:
            return web.Response(
                body=gzip.compress(answer), headers={"Content-Type": ctype, "Content-Encoding": "gzip"}
            )
        if "deflate" in accepted:
            return web.Response(
                body=zlib.compress(answer), headers={"Content-Type": ctype, "Content-Encoding": "deflate"}
            )
        return web.Response(body=answer, headers={"Content-Type": ctype})

    return handler


async def post(base: str, path: str, body: bytes) -> tuple[bytes, dict[str, Any], str]:
    """(the agent's body, decoded as aiohttp does; the stats; the metrics text)."""
    async with aiohttp.ClientSession() as s:
        async with s.post(base + path, data=body, headers=SDK_HEADERS) as r:
            assert r.status == 200
            got = await r.read()
        async with s.get(f"{base}/loop-guard") as r:
            stats = await r.json()
        async with s.get(f"{base}/loop-guard/metrics") as r:
            metrics = await r.text()
    return got, stats, metrics


def request_lines(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "request" and e.get("path", "").startswith(("/v1/", "/v1beta/"))]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("wire", list(WIRES))
async def test_a_compressing_upstream_is_asked_for_identity_and_the_loop_is_stopped(
    upstream: FakeUpstream, make_proxy: ProxyFactory, wire: str, stream: bool
) -> None:
    path, body, answer, _ = WIRES[wire](stream)
    upstream.handler = compressing(answer, stream)
    base = await make_proxy(CONFIG)
    got, stats, _ = await post(base, path, body)
    assert upstream.requests[0].headers["Accept-Encoding"] == "identity"
    assert b"[loopguard]" in got
    assert stats["stops"] == 1
    assert stats["unguarded_responses"] == {}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("wire", list(WIRES))
async def test_an_answer_compressed_anyway_passes_untouched_and_is_counted(
    upstream: FakeUpstream, make_proxy: ProxyFactory, wire: str, stream: bool
) -> None:
    path, body, answer, _ = WIRES[wire](stream)
    upstream.handler = compressing(answer, stream, always=True)
    base = await make_proxy(CONFIG)
    with capture_logs() as logs:
        got, stats, metrics = await post(base, path, body)
    assert got == answer  # aiohttp decoded the gzip the upstream sent: the bytes passed untouched
    assert stats["stops"] == 0
    assert stats["unguarded_responses"] == {"content_encoding": 1}
    assert 'loopguard_unguarded_responses_total{reason="content_encoding"} 1.0' in metrics
    assert [e.get("unguarded_response") for e in request_lines(logs)] == ["content_encoding"]


async def test_response_side_off_leaves_accept_encoding_and_counts_nothing(
    upstream: FakeUpstream, make_proxy: ProxyFactory
) -> None:
    """With every response-side check off nothing reads the answer: the agent's header goes as is."""
    path, body, answer, _ = _chat(False)
    upstream.handler = compressing(answer, False)
    off = {
        "stop": {"after_ignored_denials": 0, "on_cap": False},
        "guards": {"monologue": {"enabled": False}, "escalation": {"enabled": False}},
        "response": {
            "max_calls_per_response": 0,
            "max_identical_per_response": 0,
            "max_identical_reads_per_response": 0,
            "degenerate_text": {"enabled": False},
            "repair_text_tool_calls": False,
        },
    }
    base = await make_proxy(off)
    got, stats, _ = await post(base, path, body)
    assert upstream.requests[0].headers["Accept-Encoding"] == "gzip, deflate"
    assert got == answer
    assert stats["unguarded_responses"] == {}


def _fixed(body: bytes, ctype: str) -> Any:
    async def handler(request: web.Request, raw: bytes) -> web.StreamResponse:
        return web.Response(body=body, headers={"Content-Type": ctype})

    return handler


def _raising(self: StreamGuard, chunk: bytes) -> stream_guard.Output:
    raise RuntimeError("a bug in the guard")


#: one chunk of 300 kB of content: past the (patched) event limit while it arrives
BIG_EVENT = (
    b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": {"content": "word " * 60_000}}]}) + b"\n\n"
)
UNREAD: list[Any] = [
    pytest.param(_fixed(b"hello", "text/plain"), None, "content_type", id="content_type"),
    pytest.param(
        _fixed(BIG_EVENT + b"".join(sse_events(content="Done.")), "text/event-stream"),
        mock.patch.object(stream_guard, "MAX_EVENT_BYTES", 1024),
        "too_large",
        id="too_large",
    ),
    pytest.param(
        _fixed(b"".join(sse_events([tool_call("read_file", ARGS, "call_9")])), "text/event-stream"),
        mock.patch.object(StreamGuard, "feed", _raising),
        "internal_error",
        id="internal_error",
    ),
]


@pytest.mark.parametrize(("handler", "patch", "reason"), UNREAD)
async def test_every_answer_the_response_side_could_not_read_is_counted(
    upstream: FakeUpstream, make_proxy: ProxyFactory, handler: Any, patch: Any, reason: str
) -> None:
    path, body, _, _ = _chat(True)
    upstream.handler = handler
    base = await make_proxy(CONFIG)
    with capture_logs() as logs, patch if patch is not None else mock.patch.dict({}):
        _, stats, metrics = await post(base, path, body)
    assert stats["unguarded_responses"] == {reason: 1}
    assert f'loopguard_unguarded_responses_total{{reason="{reason}"}} 1.0' in metrics
    assert [e.get("unguarded_response") for e in request_lines(logs)] == [reason]


# --- Gemini: answers with another candidate, the JSON-array stream ---------------------------------------

GEMINI_LOOPING = orjson.dumps(gemini_body(repeated_call_messages(8)))
GEMINI_PATHS = {
    "json": "/v1beta/models/g:generateContent",
    "sse": "/v1beta/models/g:streamGenerateContent?alt=sse",
    "array": "/v1beta/models/g:streamGenerateContent",
}


def gemini_answer(form: str, events: list[bytes]) -> tuple[bytes, str]:
    """An answer in ``form`` (``json``: the events' objects merged into one response; ``sse``;
    ``array``: the JSON-array stream) and its content type."""
    objs = [orjson.loads(e.removeprefix(b"data: ")) for e in events]
    if form == "sse":
        return b"".join(events), "text/event-stream"
    if form == "array":
        return b"[" + b"\n,\r\n".join(orjson.dumps(o) for o in objs) + b"\n]", "application/json"
    merged: dict[str, Any] = {**objs[-1], "candidates": []}
    for o in objs:
        for c in o["candidates"]:
            index = c.get("index", 0)
            while len(merged["candidates"]) <= index:
                merged["candidates"].append({"content": {"role": "model", "parts": []}, "index": index})
            merged["candidates"][index]["content"]["parts"] += (c.get("content") or {}).get("parts") or []
            if "finishReason" in c:
                merged["candidates"][index]["finishReason"] = c["finishReason"]
    return orjson.dumps(merged), "application/json"


def candidate(index: int, parts: list[Any], finish: str | None = None) -> dict[str, Any]:
    cand: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": index}
    if finish is not None:
        cand["finishReason"] = finish
    return cand


def data(*candidates: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps({"candidates": list(candidates), "modelVersion": "g"}) + b"\r\n\r\n"


READ = {"functionCall": {"name": "read_file", "args": {"path": "app.py"}}}
#: the looping call in the first candidate, and a second candidate (candidateCount: 2)
OTHER_CANDIDATES = {
    "two_candidates": [
        data(candidate(0, [READ]), candidate(1, [{"text": "Done."}])),
        data(candidate(0, [], "STOP"), candidate(1, [], "STOP")),
    ],
    "index_1": [
        data(candidate(0, [READ])),
        data(candidate(1, [{"text": "Done."}], "STOP")),
        data(candidate(0, [], "STOP")),
    ],
}


@pytest.mark.parametrize("form", list(GEMINI_PATHS))
@pytest.mark.parametrize("shape", list(OTHER_CANDIDATES))
async def test_a_gemini_answer_with_another_candidate_passes_untouched_and_is_counted(
    upstream: FakeUpstream, make_proxy: ProxyFactory, shape: str, form: str
) -> None:
    """Before: two candidates, or a candidate with ``index`` 1, passed unread with no count and no
    log field, the looping call included. Which candidate the agent acts on is not known, so the
    answer still passes as it came, and now it is counted: ``unguarded_responses{reason="candidates"}``."""
    answer, ctype = gemini_answer(form, OTHER_CANDIDATES[shape])
    upstream.handler = _fixed(answer, ctype)
    base = await make_proxy(CONFIG)
    with capture_logs() as logs:
        got, stats, metrics = await post(base, GEMINI_PATHS[form], GEMINI_LOOPING)
    assert got == answer
    assert stats["stops"] == 0
    assert stats["unguarded_responses"] == {"candidates": 1}
    assert 'loopguard_unguarded_responses_total{reason="candidates"} 1.0' in metrics
    assert [e.get("unguarded_response") for e in request_lines(logs)] == ["candidates"]


async def test_a_looping_gemini_json_array_stream_is_stopped(
    upstream: FakeUpstream, make_proxy: ProxyFactory
) -> None:
    """``:streamGenerateContent`` without ``alt=sse`` (the JSON-array stream): before, relayed
    unread, uncounted; now its elements are read as the SSE events are, the looping call is
    stopped, and the agent gets one valid array."""
    events = [
        data(candidate(0, [{"text": "Again."}])),
        data(candidate(0, [READ])),
        data(candidate(0, [], "STOP")),
    ]
    answer, ctype = gemini_answer("array", events)
    upstream.handler = _fixed(answer, ctype)
    base = await make_proxy(CONFIG)
    got, stats, _ = await post(base, GEMINI_PATHS["array"], GEMINI_LOOPING)
    elements = orjson.loads(got)
    assert [[p.get("text", "") for p in e["candidates"][0]["content"]["parts"]] for e in elements] == [
        ["Again."],
        [elements[1]["candidates"][0]["content"]["parts"][0]["text"]],
    ]
    assert elements[1]["candidates"][0]["content"]["parts"][0]["text"].startswith("\n\n[loopguard] Stopped:")
    assert elements[1]["candidates"][0]["finishReason"] == "STOP"
    assert got.startswith(b"[" + orjson.dumps(orjson.loads(events[0].removeprefix(b"data: "))))
    assert (stats["stops"], stats["unguarded_responses"]) == (1, {})
