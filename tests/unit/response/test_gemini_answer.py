"""The Gemini API answer side: stop, runaway and degenerate cuts on ``alt=sse`` events and on a JSON
``GenerateContentResponse``, no sockets; then the wiring through the real server (``alt=sse``
stopped, the JSON-array stream read and stopped, a stream cut by the upstream)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy.config import Config, build
from proxy.core.actions import Stop
from proxy.dialects import openai_chat
from proxy.guards import Context, build_guards, evaluate
from proxy.response.decide import DENIALS_TEXT, StopJudge, earlier_stops
from proxy.response.gemini_stream import GeminiStreamGuard, decide_json
from tests.conftest import ProxyFactory
from tests.helpers.fakes import FakeUpstream, repeated_call_messages
from tests.helpers.gemini_contents import gemini_body

CFG = Config()
STOP = Stop(text="[loopguard] Stopped.", rule="stop", tool="read_file", count=9, limit=2)
LOOP = {"functionCall": {"name": "read_file", "args": {"path": "app.py"}}}
#: a call that may change state: three in one answer are a runaway (three reads are not)
WRITE = {"functionCall": {"name": "write_file", "args": {"path": "app.py"}}}
OTHER = {"functionCall": {"name": "read_file", "args": {"path": "b.py"}, "id": "c2"}}
LOOP_STOP = DENIALS_TEXT.format(tool="read_file", count=9, denials=2)
USAGE = {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15}


class Judge:
    """A stop judge stub: stops any answer (``stop``) or none; records what it was asked."""

    def __init__(self, stop: Stop | None) -> None:
        self.stop = stop
        self.seen: list[tuple[list[Any], str]] = []

    def __call__(self, calls: Any, text: str = "") -> Stop | None:
        self.seen.append(([(c.id, c.name, c.arguments) for c in calls], text))
        return self.stop


def looping_judge() -> StopJudge:
    """The real stop judge for a conversation that made the same call 8 times (results 7 and 8
    withheld), built as the server does; the escalation ladder off (it stops with its own text)."""
    cfg = build(Config, {"guards": {"escalation": {"enabled": False}}})
    transcript = openai_chat.parse_request({"messages": repeated_call_messages(8)})
    guards = build_guards(cfg.guards)
    ctx = Context(conversation="c")
    return StopJudge(transcript, evaluate(transcript, guards, ctx), guards, ctx, cfg)


def event(parts: list[Any] | None = None, finish: str | None = None, **extra: Any) -> bytes:
    cand: dict[str, Any] = {"content": {"role": "model", "parts": parts or []}, "index": 0}
    if finish is not None:
        cand["finishReason"] = finish
    obj: dict[str, Any] = {"candidates": [cand], **extra}
    if finish is not None:
        obj["usageMetadata"] = USAGE
    obj["modelVersion"] = "gemini-2.5-pro"
    obj["responseId"] = "r1"
    return b"data: " + json.dumps(obj).encode() + b"\r\n\r\n"


def answer(*calls: Any, text: str = "", thought: str = "") -> list[bytes]:
    """An answer as Gemini streams it: a thought, the text in 8-character pieces, one event per
    call, the last event with ``finishReason: "STOP"``."""
    events = []
    if thought:
        events.append(event([{"text": thought, "thought": True}]))
    events += [event([{"text": text[i : i + 8]}]) for i in range(0, len(text), 8)]
    events += [event([c]) for c in calls]
    return [*events, event([], "STOP")]


def run(
    events: list[bytes], judge: Any, cfg: Config = CFG, split: int = 7
) -> tuple[bytes, GeminiStreamGuard, bool]:
    """Feed the stream in ``split``-byte reads; returns (agent bytes, guard, aborted)."""
    guard = GeminiStreamGuard(cfg, judge)
    raw = b"".join(events)
    out = bytearray()
    for i in range(0, len(raw), split):
        o = guard.feed(raw[i : i + split])
        out += o.data
        if o.abort:
            return bytes(out), guard, True
    return bytes(out + guard.finish()), guard, False


def parse(stream: bytes) -> list[dict[str, Any]]:
    return [json.loads(f.removeprefix(b"data: ")) for f in stream.split(b"\r\n\r\n") if f]


def shape(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Each event as (its parts' kinds and texts, finishReason)."""
    out = []
    for e in events:
        cand = e["candidates"][0]
        parts = [
            ("call", p["functionCall"]["args"]) if "functionCall" in p else ("text", p["text"])
            for p in (cand.get("content") or {}).get("parts") or []
        ]
        out.append((parts, cand.get("finishReason")))
    return out


def with_limits(**response: Any) -> Config:
    return dataclasses.replace(CFG, response=dataclasses.replace(CFG.response, **response))


REALISTIC = answer(LOOP, OTHER, text="Let me look.", thought="The file is app.py.")


# --- SSE: nothing decided -------------------------------------------------------------------------------


def test_unchanged_stream_is_byte_identical_split_at_every_byte_boundary() -> None:
    raw = b"".join(REALISTIC)
    calls = [(None, "read_file", '{"path":"app.py"}'), ("c2", "read_file", '{"path":"b.py"}')]
    for at in range(len(raw) + 1):
        judge = Judge(None)
        guard = GeminiStreamGuard(CFG, judge)
        first, second = guard.feed(raw[:at]), guard.feed(raw[at:])
        out = first.data + second.data + guard.finish()
        assert (out, first.abort, second.abort) == (raw, False, False), at
        assert (guard.complete, guard.received, guard.settled, guard.actions) == (
            True,
            len(raw),
            len(raw),
            [],
        )
        assert judge.seen == [(calls, "Let me look.")], at


@pytest.mark.parametrize("split", [1, 13, 100_000])
def test_unchanged_stream_byte_for_byte_with_the_real_judge(split: int) -> None:
    events = answer(OTHER, text="Let me look.", thought="Hmm.")
    out, guard, aborted = run(events, looping_judge(), split=split)
    assert (out, aborted, guard.actions) == (b"".join(events), False, [])


def test_nothing_is_held_before_the_first_call_and_the_finish_is_decided_at_once() -> None:
    guard = GeminiStreamGuard(CFG, Judge(None))
    got = [guard.feed(ev).data for ev in REALISTIC]
    first_call = 3  # the thought, the text (2 pieces), then the first call
    assert got[:first_call] == REALISTIC[:first_call]
    assert got[first_call:-1] == [b""] * 2  # the calls, held
    assert got[-1] == b"".join(REALISTIC[first_call:])  # released at the finishing event


# --- SSE: stop -------------------------------------------------------------------------------------------


def test_stop_drops_the_calls_and_puts_the_stop_text_in_the_finishing_event() -> None:
    events = answer(LOOP, text="Reading it again.", thought="Same file.")
    out, guard, aborted = run(events, looping_judge())
    assert not aborted
    assert out.startswith(b"".join(events[:4]))  # the thought and text pieces as they came
    assert shape(parse(out))[4:] == [([("text", f"\n\n{LOOP_STOP}")], "STOP")]
    last = parse(out)[-1]
    assert (last["usageMetadata"], last["modelVersion"]) == (USAGE, "gemini-2.5-pro")
    assert [(a.rule, a.kind) for a in guard.actions] == [("stop", "stop")]
    assert guard.complete and guard.received == guard.settled


def test_stop_of_calls_in_the_finishing_event_itself() -> None:
    events = [event([{"text": "Again."}]), event([LOOP, OTHER], "STOP")]
    out, _, _ = run(events, Judge(STOP))
    assert shape(parse(out)) == [
        ([("text", "Again.")], None),
        ([("text", "\n\n[loopguard] Stopped.")], "STOP"),
    ]


def test_stop_of_a_calls_only_answer_is_the_stop_text_alone() -> None:
    out, _, _ = run(answer(LOOP, OTHER), Judge(STOP))
    assert shape(parse(out)) == [([("text", "[loopguard] Stopped.")], "STOP")]


def test_a_text_only_answer_the_judge_stops_gets_the_stop_part() -> None:
    judge = Judge(STOP)
    out, _, _ = run(answer(text="I will call it again."), judge)
    assert shape(parse(out))[-1] == ([("text", "\n\n[loopguard] Stopped.")], "STOP")
    assert judge.seen == [([], "I will call it again.")]


# --- SSE: runaway and degenerate text ----------------------------------------------------------------------


def test_identical_calls_past_the_limit_are_cut_as_the_one_past_it_arrives() -> None:
    events = answer(WRITE, WRITE, WRITE, WRITE, text="Go.")
    guard = GeminiStreamGuard(with_limits(max_identical_per_response=2), Judge(None))
    outs = []
    fed = 0
    for ev in events:
        o = guard.feed(ev)
        outs.append(o.data)
        fed += 1
        if o.abort:
            break
    assert fed == 4  # the text, then the third identical call: the upstream is closed
    got = shape(parse(b"".join(outs)))
    assert got == [
        ([("text", "Go.")], None),
        ([("call", {"path": "app.py"})], None),
        ([("call", {"path": "app.py"})], None),
        ([], "STOP"),
    ]
    assert [(a.rule, a.count, a.reason) for a in guard.actions] == [("runaway", 2, "identical")]
    assert guard.complete and guard.aborted


def test_calls_past_the_limit_in_the_finishing_event_are_dropped_from_it() -> None:
    events = [event([LOOP, OTHER, {"functionCall": {"name": "ls", "args": {}}}], "STOP")]
    out, guard, aborted = run(events, Judge(None), with_limits(max_calls_per_response=2))
    assert not aborted
    assert shape(parse(out)) == [([("call", {"path": "app.py"}), ("call", {"path": "b.py"})], "STOP")]
    assert [(a.rule, a.count, a.reason) for a in guard.actions] == [("runaway", 2, "calls")]


DEGENERATE = "I will check the file again. " * 200


@pytest.mark.parametrize(
    ("events", "reason"),
    [
        pytest.param([event([{"text": DEGENERATE}]), event([], "STOP")], "content", id="text"),
        pytest.param(
            [event([{"text": DEGENERATE, "thought": True}]), event([], "STOP")], "reasoning", id="thought"
        ),
        pytest.param(
            [event([LOOP]), event([{"text": DEGENERATE}]), event([], "STOP")], "content", id="after_a_call"
        ),
    ],
)
def test_degenerate_text_ends_the_answer_with_max_tokens(events: list[bytes], reason: str) -> None:
    out, guard, aborted = run(events, Judge(STOP), split=50)
    assert aborted
    got = shape(parse(out))
    assert got[-1] == ([], "MAX_TOKENS")
    assert all(kind != "call" for parts, _ in got for kind, _ in parts)
    assert [(a.rule, a.reason) for a in guard.actions] == [("degenerate_text", reason)]
    assert guard.complete


# --- SSE: what is not read ------------------------------------------------------------------------------

TWO = (
    b'data: {"candidates":[{"content":{"parts":[{"text":"a"}]},"index":0},'
    b'{"content":{"parts":[]},"index":1}]}\r\n\r\n'
)


INDEX_1 = b'data: {"candidates":[{"content":{"parts":[]},"index":1}]}\r\n\r\n'


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(
            b'data: {"error":{"code":503,"message":"overloaded","status":"UNAVAILABLE"}}\r\n\r\n', id="error"
        ),
        pytest.param(b"data: {not json\r\n\r\n", id="not_json"),
        pytest.param(TWO, id="two_candidates"),
        pytest.param(INDEX_1, id="index_1"),
        pytest.param(b'data: {"candidates":[{"content":{"parts":{}}}]}\r\n\r\n', id="parts_not_a_list"),
    ],
)
def test_events_outside_the_grammar_release_everything_unchanged(bad: bytes) -> None:
    events = [event([{"text": "Hi."}]), event([LOOP]), bad, event([], "STOP")]
    out, guard, aborted = run(events, Judge(STOP))
    assert (out, aborted, guard.actions, guard.complete) == (b"".join(events), False, [], True)
    # an answer with another candidate is one the agent may act on: counted as unread
    assert guard.unread == ("candidates" if bad in (TWO, INDEX_1) else None)


def test_an_event_without_candidates_passes_as_it_is() -> None:
    feedback = b'data: {"promptFeedback":{"blockReason":"SAFETY"}}\r\n\r\n'
    out, _, _ = run([feedback, *answer(LOOP)], Judge(STOP))
    assert out.startswith(feedback)
    assert shape(parse(out)[1:]) == [([("text", "[loopguard] Stopped.")], "STOP")]


@pytest.mark.parametrize("cut", [1, 2])
def test_a_stream_without_finish_reason_is_released_unchanged_and_not_complete(cut: int) -> None:
    events = answer(LOOP, text="Go.")[:cut]
    out, guard, aborted = run(events, Judge(STOP))
    assert (out, aborted, guard.complete, guard.actions) == (b"".join(events), False, False, [])


def test_release_after_an_upstream_failure_gives_the_held_bytes_unchanged() -> None:
    guard = GeminiStreamGuard(CFG, Judge(STOP))
    first = guard.feed(event([{"text": "Go."}]) + event([LOOP]))
    assert first.data == event([{"text": "Go."}])
    assert guard.release() == event([LOOP])


# --- JSON -----------------------------------------------------------------------------------------------


def response(parts: list[Any], finish: str = "STOP") -> bytes:
    cand = {"content": {"role": "model", "parts": parts}, "finishReason": finish, "index": 0}
    return json.dumps(
        {"candidates": [cand], "usageMetadata": USAGE, "modelVersion": "gemini-2.5-pro"}
    ).encode()


def test_json_stop_keeps_the_thoughts_then_one_text_part() -> None:
    thought = {"text": "Hmm.", "thought": True, "thoughtSignature": "s"}
    new, actions = decide_json(response([thought, {"text": "Again."}, LOOP]), Judge(STOP), CFG)
    assert new is not None
    cand = orjson.loads(new)["candidates"][0]
    assert cand["content"]["parts"] == [thought, {"text": "Again.\n\n[loopguard] Stopped."}]
    assert (cand["finishReason"], [a.kind for a in actions]) == ("STOP", ["stop"])


def test_json_stop_of_a_calls_only_answer_is_the_stop_text_alone() -> None:
    new, _ = decide_json(response([LOOP]), looping_judge(), CFG)
    assert new is not None
    assert orjson.loads(new)["candidates"][0]["content"]["parts"] == [{"text": LOOP_STOP}]


def test_json_runaway_keeps_the_first_calls() -> None:
    new, actions = decide_json(
        response([WRITE, WRITE, WRITE]), Judge(None), with_limits(max_identical_per_response=2)
    )
    assert new is not None
    assert orjson.loads(new)["candidates"][0]["content"]["parts"] == [WRITE, WRITE]
    assert [(a.rule, a.count) for a in actions] == [("runaway", 2)]


def test_json_identical_reads_are_left_to_the_call_limit() -> None:
    cfg = with_limits(max_identical_per_response=2)
    assert decide_json(response([LOOP, LOOP, LOOP, LOOP]), Judge(None), cfg) == (None, [])


def test_json_unchanged_answer_is_left_alone() -> None:
    judge = Judge(None)
    assert decide_json(response([{"text": "Look."}, OTHER]), judge, CFG) == (None, [])
    assert judge.seen == [([("c2", "read_file", '{"path":"b.py"}')], "Look.")]


@pytest.mark.parametrize(
    ("part", "reason"),
    [({"text": DEGENERATE}, "content"), ({"text": DEGENERATE, "thought": True}, "reasoning")],
)
def test_json_degenerate_text_is_reported_not_applied(part: dict[str, Any], reason: str) -> None:
    new, actions = decide_json(response([part]), Judge(None), CFG)
    assert new is None
    assert [(a.rule, a.reason, a.applied) for a in actions] == [("degenerate_text", reason, False)]


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"[" + response([LOOP]) + b"]", id="the_json_array_of_a_stream"),
        pytest.param(b'{"error":{"code":429,"message":"quota","status":"RESOURCE_EXHAUSTED"}}', id="error"),
        pytest.param(b'{"promptFeedback":{"blockReason":"SAFETY"}}', id="no_candidates"),
        pytest.param(TWO.removeprefix(b"data: ").strip(), id="two_candidates"),
        pytest.param(b"{not json", id="not_json"),
    ],
)
def test_json_that_is_not_one_answer_is_left_alone(raw: bytes) -> None:
    assert decide_json(raw, Judge(STOP), CFG) == (None, [])


# --- through the real server ----------------------------------------------------------------------------

LOOPING = json.dumps(gemini_body(repeated_call_messages(8))).encode()


async def post(base: str, path: str, body: bytes) -> tuple[int, str, bytes]:
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession() as s, s.post(f"{base}{path}", data=body, headers=headers) as r:
        return r.status, r.content_type, await r.read()


async def test_a_looping_sse_answer_is_stopped_through_the_server(
    upstream: FakeUpstream, make_proxy: ProxyFactory
) -> None:
    events = answer(LOOP, text="Again.")

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for ev in events:
            await resp.write(ev)
        await resp.write_eof()
        return resp

    upstream.handler = handler
    base = await make_proxy()
    status, ctype, got = await post(base, "/v1beta/models/g:streamGenerateContent?alt=sse", LOOPING)
    assert (status, ctype) == (200, "text/event-stream")
    assert got.startswith(b"".join(events[:1]))
    parts, finish = shape(parse(got))[-1]
    assert finish == "STOP" and parts[0][1].startswith("\n\n[loopguard] Stopped:")
    assert b"functionCall" not in got


async def test_the_json_array_stream_is_read_and_stopped(
    upstream: FakeUpstream, make_proxy: ProxyFactory
) -> None:
    """``:streamGenerateContent`` without ``alt=sse``: the answer (one JSON array that streams) is
    read element by element as the SSE form is: the looping call is stopped, and the agent gets
    one valid array (before: relayed unread and uncounted)."""
    array = b"[" + b",\r\n".join(e.removeprefix(b"data: ").strip() for e in answer(LOOP)) + b"]"

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.Response(body=array, content_type="application/json")

    upstream.handler = handler
    base = await make_proxy()
    status, _, got = await post(base, "/v1beta/models/g:streamGenerateContent", LOOPING)
    assert status == 200 and b"[loopguard]" in upstream.requests[0].body  # the request side acted
    elements = orjson.loads(got)
    assert [e["candidates"][0].get("finishReason") for e in elements] == ["STOP"]
    assert elements[0]["candidates"][0]["content"]["parts"][0]["text"].startswith("[loopguard] Stopped:")
    assert b"functionCall" not in got


async def test_a_stream_cut_by_the_upstream_ends_with_an_error_event(
    upstream: FakeUpstream, make_proxy: ProxyFactory
) -> None:
    first = event([{"text": "Working."}])

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(first)
        await resp.write_eof()  # no finishReason
        return resp

    upstream.handler = handler
    base = await make_proxy()
    got = b""
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{base}/v1beta/models/g:streamGenerateContent?alt=sse", data=LOOPING) as r,
    ):
        with pytest.raises(aiohttp.ClientPayloadError):  # a broken transfer, never a clean end
            async for chunk in r.content.iter_any():
                got += chunk
    assert got.startswith(first)
    # the error's code and message are what the Gemini SDKs raise from
    error = orjson.loads(got[len(first) :].removeprefix(b"data: "))["error"]
    assert (error["code"], error["type"]) == (502, "upstream_disconnected")


def test_an_earlier_stop_in_gemini_contents_is_found() -> None:
    """A stop the agent kept in its history (a ``model`` content of the stop text, no call) is the
    conversation's earlier stop, so a later one is not a new incident; a model content with a
    call, or a thought, is not one."""
    stop_text = LOOP_STOP
    body = {
        "contents": [
            {"role": "user", "parts": [{"text": "go"}]},
            {"role": "model", "parts": [{"text": stop_text}]},
            {"role": "model", "parts": [{"text": stop_text}, LOOP]},
            {"role": "model", "parts": [{"text": stop_text, "thought": True}]},
        ]
    }
    found = earlier_stops(json.dumps(body).encode(), CFG.stop)
    assert [(s.text, s.fresh) for s in found] == [(stop_text, False)]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_observe_mode_changes_no_byte_of_a_gemini_exchange_yet_counts_the_stop(
    upstream: FakeUpstream, make_proxy: ProxyFactory, stream: bool
) -> None:
    """``mode: observe`` on a looping Gemini request: the body reaches the upstream as sent and the
    answer reaches the agent as the upstream sent it, while the withholds and the stop are counted
    as observed."""
    events = answer(LOOP, text="Again.")
    body = b"".join(events) if stream else response([{"text": "Again."}, LOOP])

    async def handler(request: web.Request, raw: bytes) -> web.StreamResponse:
        if not stream:
            return web.Response(body=body, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for ev in events:
            await resp.write(ev)
        await resp.write_eof()
        return resp

    upstream.handler = handler
    base = await make_proxy({"mode": "observe"})
    path = "/v1beta/models/g:streamGenerateContent?alt=sse" if stream else "/v1beta/models/g:generateContent"
    status, _, got = await post(base, path, LOOPING)
    async with aiohttp.ClientSession() as s, s.get(f"{base}/loop-guard") as r:
        stats = await r.json()
    assert (status, got, upstream.requests[0].body) == (200, body, LOOPING)
    assert (stats["rewritten_requests"], stats["stops"], stats["observed"]["stop"]) == (0, 0, 1)
    assert stats["per_rule"] == {"circuit_breaker": 1, "escalation": 1, "repeat_reminder": 1, "stop": 1}
    assert stats["observed_per_rule"] == stats["per_rule"]


def _data(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\r\n\r\n"


BLOCKED = {"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": USAGE, "modelVersion": "m"}


@pytest.mark.parametrize(
    ("events", "complete"),
    [
        pytest.param([_data(BLOCKED)], True, id="blocked_prompt"),
        pytest.param([_data({"candidates": []})], True, id="empty_candidates"),
        pytest.param([_data({"usageMetadata": USAGE}), _data(BLOCKED)], True, id="no_candidate_in_any"),
        pytest.param([], False, id="no_event_at_all"),
        pytest.param([event([{"text": "half an ans"}])], False, id="a_candidate_without_finish"),
        pytest.param([_data(BLOCKED), event([{"text": "x"}])], False, id="a_candidate_after_feedback"),
    ],
)
def test_a_stream_whose_responses_carry_no_candidate_is_complete_as_it_is(
    events: list[bytes], complete: bool
) -> None:
    """A blocked prompt (one ``promptFeedback`` event, then the end) had nothing to finish: it
    passes byte for byte and is not taken for an answer that stopped short; a stream with a
    candidate and no ``finishReason``, or no event at all, still is."""
    out, guard, aborted = run(events, Judge(None))
    assert (out, guard.complete, aborted, guard.actions) == (b"".join(events), complete, False, [])
