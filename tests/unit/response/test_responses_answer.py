"""The Responses API's answer side: stop, runaway and degenerate cuts on SSE events and
on a JSON ``response`` object, no sockets; then the real server with the official SDK."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import orjson
import pytest
from aiohttp import web
from openai import AsyncOpenAI

from proxy.config import Config
from proxy.core.actions import Stop
from proxy.response.responses_stream import ResponsesStreamGuard, decide_json
from tests.conftest import ProxyFactory
from tests.helpers.fakes import FakeUpstream, repeated_call_messages
from tests.helpers.responses_items import function_call_item, response_events, response_object, responses_body

CFG = Config()
STOP = Stop(text="[loopguard] Stopped.", rule="stop", tool="exec_command", count=9, limit=2)
CALL = ("call_9", "exec_command", '{"cmd": "ls -la"}')
#: a command that writes: three of them in one answer are a runaway (three ``ls -la`` are not)
WRITE = ("call_9", "exec_command", '{"cmd": "echo x >> log.txt"}')


class Judge:
    """A stop judge stub: stops any answer (``stop``) or none."""

    def __init__(self, stop: Stop | None) -> None:
        self.stop = stop
        self.on_text_only = stop is not None
        self.seen: list[tuple[list[Any], str]] = []

    def __call__(self, calls: Any, text: str = "") -> Stop | None:
        self.seen.append(([(c.id, c.name, c.arguments) for c in calls], text))
        return self.stop


def run(
    events: list[bytes], judge: Any, cfg: Config = CFG, split: int = 7
) -> tuple[bytes, ResponsesStreamGuard, bool]:
    """Feed the stream in ``split``-byte reads; returns (agent bytes, guard, aborted)."""
    guard = ResponsesStreamGuard(cfg, judge)
    raw = b"".join(events)
    out = bytearray()
    aborted = False
    for i in range(0, len(raw), split):
        o = guard.feed(raw[i : i + split])
        out += o.data
        if o.abort:
            aborted = True
            break
    if not aborted:
        out += guard.finish()
    return bytes(out), guard, aborted


def parse(stream: bytes) -> list[dict[str, Any]]:
    events = []
    for block in stream.decode().split("\n\n"):
        if not block:
            continue
        lines = block.split("\n")
        assert lines[0].startswith("event: ")
        obj = json.loads(lines[1].removeprefix("data: "))
        assert lines[0] == f"event: {obj['type']}"
        events.append(obj)
    return events


def no_runaway() -> Config:
    return dataclasses.replace(CFG, response=dataclasses.replace(CFG.response, max_identical_per_response=0))


# --- SSE ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("split", [1, 5, 64, 100_000])
@pytest.mark.parametrize("text", [None, "Let me look."])
def test_nothing_decided_releases_the_exact_bytes(split: int, text: str | None) -> None:
    events = response_events([CALL, ("call_10", "read_file", '{"path": "a"}')], text)
    judge = Judge(None)
    out, guard, aborted = run(events, judge, split=split)
    assert out == b"".join(events)
    assert (aborted, guard.complete, guard.received, guard.settled) == (False, True, len(out), len(out))
    assert judge.seen == [
        (
            [("call_9", "exec_command", '{"cmd": "ls -la"}'), ("call_10", "read_file", '{"path": "a"}')],
            text or "",
        )
    ]


def test_stop_drops_the_calls_and_emits_the_stop_message() -> None:
    events = response_events([CALL], "Running it again.")
    out, guard, _ = run(events, Judge(STOP))
    got = parse(out)
    assert [e["type"] for e in got] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        # the call's four events are gone; the stop message follows
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert out.startswith(b"".join(events[:9]))  # what came before the call: byte for byte
    assert [e["sequence_number"] for e in got] == list(range(16))
    assert [e["output_index"] for e in got if "output_index" in e] == [0] * 7 + [1] * 6
    stop_text = "\n\n[loopguard] Stopped."
    assert got[11]["delta"] == stop_text
    final = got[-1]["response"]
    assert [(i["type"], i.get("role")) for i in final["output"]] == [
        ("message", "assistant"),
        ("message", "assistant"),
    ]
    assert final["output"][1]["content"] == [{"type": "output_text", "text": stop_text, "annotations": []}]
    assert final["status"] == "completed" and final["usage"]["total_tokens"] == 120
    assert [a.kind for a in guard.actions] == ["stop"]
    assert guard.settled == guard.received


def test_stop_of_a_calls_only_answer_is_the_stop_text_alone() -> None:
    out, _, _ = run(response_events([CALL, CALL]), Judge(STOP), cfg=no_runaway())
    got = parse(out)
    assert [e["type"] for e in got][2:] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert got[4]["delta"] == "[loopguard] Stopped."
    assert [e["sequence_number"] for e in got] == list(range(9))
    assert got[-1]["response"]["output"][0]["content"][0]["text"] == "[loopguard] Stopped."
    assert len(got[-1]["response"]["output"]) == 1


def test_identical_calls_past_the_limit_are_cut_and_the_stream_completed() -> None:
    events = response_events([WRITE, WRITE, WRITE, WRITE])  # max_identical_per_response: 2
    out, guard, aborted = run(events, Judge(None))
    got = parse(out)
    assert aborted
    assert out.startswith(b"".join(events[:12]))  # created, in_progress, two whole calls (5 events each)
    assert [e["type"] for e in got][12:] == ["response.completed"]
    assert got[-1]["sequence_number"] == 12
    final = got[-1]["response"]
    assert [(i["type"], i["call_id"]) for i in final["output"]] == [("function_call", "call_9")] * 2
    assert final["status"] == "completed"
    (cut,) = guard.actions
    assert (cut.rule, cut.reason, cut.count, cut.limit) == ("runaway", "identical", 2, 2)


@pytest.mark.parametrize(
    "call",
    [
        CALL,
        ("call_9", "read_file", '{"path": "a.py"}'),
        ("call_9", "shell", '{"command": ["bash", "-lc", "cat a.py"]}'),
    ],
    ids=["ls", "read_file", "cat"],
)
def test_identical_read_only_calls_stream_through_uncut(call: tuple[str, str, str]) -> None:
    events = response_events([call] * 4)
    out, guard, aborted = run(events, Judge(None))
    assert (out, guard.actions, aborted) == (b"".join(events), [], False)


def test_degenerate_text_ends_with_response_incomplete() -> None:
    text = "I will check the file again. " * 200
    out, guard, aborted = run(response_events([], text), Judge(None), split=50)
    got = parse(out)
    assert aborted
    assert got[-1]["type"] == "response.incomplete"
    assert got[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert got[-1]["response"]["status"] == "incomplete"
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    assert [a.rule for a in guard.actions] == ["degenerate_text"]


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(b"data: not json\n\n", id="not_json"),
        pytest.param(b'event: x\ndata: {"no_type": 1}\n\n', id="no_type"),
        pytest.param(
            b'event: error\ndata: {"type":"error","code":"server_error","message":"boom"}\n\n', id="error"
        ),
        pytest.param(
            b'event: response.failed\ndata: {"type":"response.failed","response":{}}\n\n', id="failed"
        ),
    ],
)
def test_events_outside_the_grammar_release_everything_unchanged(bad: bytes) -> None:
    events = response_events([CALL])
    stream = [*events[:4], bad, *events[4:]]
    out, guard, aborted = run(stream, Judge(STOP))
    assert (out, aborted, guard.complete) == (b"".join(stream), False, True)
    assert guard.actions == []


def test_a_stream_without_a_terminal_event_is_not_complete() -> None:
    events = response_events([CALL])[:-1]
    out, guard, _ = run(events, Judge(STOP))
    assert (out, guard.complete) == (b"".join(events), False)


# --- JSON -----------------------------------------------------------------------------------------------


def test_json_stop_keeps_one_assistant_message() -> None:
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": []}
    body = response_object(
        [
            reasoning,
            {
                "id": "msg_1",
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Again.", "annotations": []}],
            },
            {
                "id": "fc_1",
                "type": "function_call",
                "status": "completed",
                "call_id": "c1",
                "name": "f",
                "arguments": "{}",
            },
        ]
    )
    new, actions = decide_json(orjson.dumps(body), Judge(STOP), CFG)
    assert new is not None and [a.kind for a in actions] == ["stop"]
    out = json.loads(new)
    assert out["output"][0] == reasoning
    assert [(i["type"], i["content"][0]["text"]) for i in out["output"][1:]] == [
        ("message", "Again.\n\n[loopguard] Stopped.")
    ]
    assert {k: v for k, v in out.items() if k != "output"} == {k: v for k, v in body.items() if k != "output"}


def test_json_runaway_keeps_the_first_calls() -> None:
    items = [
        {
            "id": f"fc_{k}",
            "type": "function_call",
            "status": "completed",
            "call_id": f"c{k}",
            "name": "f",
            "arguments": "{}",
        }
        for k in range(4)
    ]
    new, actions = decide_json(orjson.dumps(response_object(items)), Judge(None), CFG)
    assert new is not None
    assert [i["call_id"] for i in json.loads(new)["output"]] == ["c0", "c1"]
    assert [(a.rule, a.count) for a in actions] == [("runaway", 2)]


@pytest.mark.parametrize(("n", "kept"), [(4, 4), (5, 4), (300, 4)])
def test_json_identical_reads_are_cut_past_four(n: int, kept: int) -> None:
    items = [function_call_item(f"c{k}", "exec_command", '{"cmd": "ls -la"}') for k in range(n)]
    new, actions = decide_json(orjson.dumps(response_object(items)), Judge(None), CFG)
    if kept == n:
        assert (new, actions) == (None, [])
        return
    assert new is not None
    assert [i["call_id"] for i in json.loads(new)["output"]] == [f"c{k}" for k in range(kept)]
    assert [(a.rule, a.reason, a.count, a.limit) for a in actions] == [("runaway", "identical", 4, 4)]


@pytest.mark.parametrize("raw", [b"not json", b'{"object": "response"}', b"[]"])
def test_json_that_is_not_a_response_is_left_alone(raw: bytes) -> None:
    assert decide_json(raw, Judge(STOP), CFG) == (None, [])


# --- through the real server, with the official SDK -----------------------------------------------------


def looping_responses_model() -> Any:
    """Answers every request with the same ``exec_command`` call, streamed when asked."""

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        req = json.loads(body)
        n = sum(1 for i in req["input"] if i.get("type") == "function_call")
        call = (f"call_{n + 1}", "read_file", '{"path": "app.py"}')
        if req.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for ev in response_events([call]):
                await resp.write(ev)
            await resp.write_eof()
            return resp
        item = {
            "id": f"fc_{n}",
            "type": "function_call",
            "status": "completed",
            "call_id": call[0],
            "name": call[1],
            "arguments": call[2],
        }
        return web.json_response(response_object([item]))

    return handler


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_sdk_responses_loop_is_stopped(
    upstream: FakeUpstream, make_proxy: ProxyFactory, stream: bool
) -> None:
    upstream.handler = looping_responses_model()
    base = await make_proxy()
    client = AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0)
    items = responses_body(repeated_call_messages(8))["input"]
    try:
        if stream:
            async with client.responses.stream(model="m", input=items) as s:
                async for _ in s:
                    pass
                final = await s.get_final_response()
        else:
            final = await client.responses.create(model="m", input=items)
    finally:
        await client.close()
    assert [i.type for i in final.output] == ["message"]
    assert final.output_text.startswith("[loopguard]")
    assert "read_file" in final.output_text
    assert final.status == "completed"
