"""The Anthropic Messages answer side: stop, runaway and degenerate cuts on SSE events and
on a JSON ``message`` object, no sockets; what the official ``anthropic`` SDK makes of the bytes the
agent gets; then the wiring through the real server (with a stand-in request dialect, so these
tests do not depend on :mod:`proxy.dialects.anthropic_messages`)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import types
from collections.abc import Awaitable, Callable
from typing import Any

import anthropic
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer, make_mocked_request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy import dialects
from proxy.config import Config, build
from proxy.core.actions import Stop
from proxy.dialects import anthropic_messages, openai_chat
from proxy.edge import answers, relay, wire
from proxy.guards import Context, build_guards, evaluate
from proxy.response.decide import DENIALS_TEXT, StopJudge
from proxy.response.messages_stream import MessagesStreamGuard, decide_json
from tests.conftest import ProxyFactory
from tests.helpers.fakes import FakeUpstream, repeated_call_messages
from tests.helpers.messages_items import event, message, message_events, tool_use_events

CFG = Config()
STOP = Stop(text="[loopguard] Stopped.", rule="stop", tool="read_file", count=9, limit=2)
LOOP = ("toolu_9", "read_file", '{"path": "app.py"}')
OTHER = ("toolu_10", "read_file", '{"path": "b.py"}')
#: a call that may change state: three of them in one answer are a runaway (three reads are not)
WRITE = ("toolu_9", "write_file", '{"path": "app.py"}')
#: the stop text the real judge gives for the 9th read_file of app.py after two withheld results
LOOP_STOP = DENIALS_TEXT.format(tool="read_file", count=9, denials=2)


class Judge:
    """A stop judge stub: stops any answer (``stop``) or none; records what it was asked."""

    def __init__(self, stop: Stop | None) -> None:
        self.stop = stop
        self.on_text_only = stop is not None
        self.seen: list[tuple[list[Any], str]] = []

    def __call__(self, calls: Any, text: str = "") -> Stop | None:
        self.seen.append(([(c.id, c.name, c.arguments) for c in calls], text))
        return self.stop


def looping_judge() -> StopJudge:
    """The real stop judge for a conversation that made the same call 8 times (results 7 and 8
    withheld in this turn), built as the server does: a Transcript (proxy.core.transcript.build, via the
    chat dialect's parser), the guards' actions on it, a Context. The escalation ladder is off (it
    would stop with its own text; these tests pin the denials stop)."""
    cfg = build(Config, {"guards": {"escalation": {"enabled": False}}})
    transcript = openai_chat.parse_request({"messages": repeated_call_messages(8)})
    guards = build_guards(cfg.guards)
    ctx = Context(conversation="c")
    return StopJudge(transcript, evaluate(transcript, guards, ctx), guards, ctx, cfg)


def run(
    events: list[bytes], judge: Any, cfg: Config = CFG, split: int = 7
) -> tuple[bytes, MessagesStreamGuard, bool]:
    """Feed the stream in ``split``-byte reads; returns (agent bytes, guard, aborted)."""
    guard = MessagesStreamGuard(cfg, judge)
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
    """The agent's events (each frame's ``event:`` name must be its data's ``type``)."""
    events = []
    for frame in stream.decode().split("\n\n"):
        if not frame:
            continue
        name, data = frame.split("\n")
        obj = json.loads(data.removeprefix("data: "))
        assert name == f"event: {obj['type']}"
        events.append(obj)
    return events


def shape(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Each event as (type, index, what it carries) for exact comparison."""
    out: list[tuple[Any, ...]] = []
    for e in events:
        t = e["type"]
        if t == "content_block_start":
            out.append((t, e["index"], e["content_block"]["type"]))
        elif t == "content_block_delta":
            d = e["delta"]
            out.append((t, e["index"], d["type"], d.get("text", d.get("partial_json", d.get("thinking")))))
        elif t == "content_block_stop":
            out.append((t, e["index"]))
        elif t == "message_delta":
            out.append((t, e["delta"]["stop_reason"], e["usage"]["output_tokens"]))
        else:
            out.append((t,))
    return out


def feed_events(guard: MessagesStreamGuard, events: list[bytes]) -> tuple[list[bytes], int]:
    """Feed one event per read until the guard aborts; (what each read gave, the last event fed)."""
    outs: list[bytes] = []
    for k, ev in enumerate(events):
        o = guard.feed(ev)
        outs.append(o.data)
        if o.abort:
            return outs, k
    return outs, len(events)


def with_limits(**response: Any) -> Config:
    return dataclasses.replace(CFG, response=dataclasses.replace(CFG.response, **response))


Serve = Callable[[bytes, str], Awaitable[str]]


@pytest.fixture
async def serve_bytes() -> Any:
    """``await serve_bytes(body, content_type)``: a tiny server answering ``POST /v1/messages``
    with exactly ``body``; returns its base URL (for the SDK's ``base_url``)."""
    servers: list[TestServer] = []

    async def start(body: bytes, content_type: str) -> str:
        async def handle(request: web.Request) -> web.Response:
            await request.read()
            return web.Response(body=body, headers={"Content-Type": content_type})

        app = web.Application()
        app.router.add_post("/v1/messages", handle)
        srv = TestServer(app, host="127.0.0.1")
        await srv.start_server()
        servers.append(srv)
        return str(srv.make_url("")).rstrip("/")

    yield start
    for srv in servers:
        await srv.close()


async def sdk_stream(base: str) -> anthropic.types.Message:
    """The official SDK's ``messages.stream`` accumulation of what ``base`` serves."""
    client = anthropic.AsyncAnthropic(base_url=base, api_key="sk-ant-test", max_retries=0)
    try:
        async with client.messages.stream(
            model="m", max_tokens=100, messages=[{"role": "user", "content": "Fix app.py"}]
        ) as s:
            async for _ in s:
                pass
            return await s.get_final_message()
    finally:
        await client.close()


REALISTIC = message_events([LOOP, OTHER], text="Let me look.", thinking="The file is app.py; read it.")


# --- SSE: nothing decided -------------------------------------------------------------------------------


def test_unchanged_stream_is_byte_identical_split_at_every_byte_boundary() -> None:
    raw = b"".join(REALISTIC)
    calls = [("toolu_9", "read_file", '{"path": "app.py"}'), ("toolu_10", "read_file", '{"path": "b.py"}')]
    for at in range(len(raw) + 1):
        judge = Judge(None)
        guard = MessagesStreamGuard(CFG, judge)
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
    # a different call than the loop's: the judge has nothing to stop
    events = message_events([OTHER], text="Let me look.", thinking="Hmm.")
    out, guard, aborted = run(events, looping_judge(), split=split)
    assert (out, aborted, guard.actions) == (b"".join(events), False, [])


def test_nothing_is_held_before_the_first_tool_use() -> None:
    guard = MessagesStreamGuard(CFG, Judge(STOP))
    got = [guard.feed(ev).data for ev in REALISTIC]
    first_call = 11  # message_start, thinking (5), ping, text (4), then the first tool_use start
    assert got[:first_call] == REALISTIC[:first_call]  # each event out as it completes
    assert got[first_call:-2] == [b""] * (len(REALISTIC) - first_call - 2)  # held until message_delta
    assert got[-1] == REALISTIC[-1]  # message_stop: after the decision, passed as it came


def test_a_tool_input_sent_whole_in_the_block_start_is_the_calls_arguments() -> None:
    # a server that puts the whole input in content_block_start and sends no input_json_delta
    block = {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "app.py"}}
    events = message_events([])
    events = [
        events[0],
        event({"type": "content_block_start", "index": 0, "content_block": block}),
        event({"type": "content_block_stop", "index": 0}),
        *events[-2:],
    ]
    judge = Judge(None)
    out, _, _ = run(events, judge)
    assert out == b"".join(events)
    assert judge.seen == [([("toolu_1", "read_file", '{"path":"app.py"}')], "")]


# --- SSE: stop -------------------------------------------------------------------------------------------


def test_stop_drops_the_calls_and_emits_the_stop_text_block() -> None:
    events = message_events([LOOP], text="Reading it again.", thinking="Same file again.")
    out, guard, aborted = run(events, looping_judge())
    assert not aborted
    got = parse(out)
    assert shape(got) == [
        ("message_start",),
        ("content_block_start", 0, "thinking"),
        ("content_block_delta", 0, "thinking_delta", "Same fil"),
        ("content_block_delta", 0, "thinking_delta", "e again."),
        ("content_block_delta", 0, "signature_delta", None),
        ("content_block_stop", 0),
        ("ping",),
        ("content_block_start", 1, "text"),
        ("content_block_delta", 1, "text_delta", "Reading "),
        ("content_block_delta", 1, "text_delta", "it again."),
        ("content_block_stop", 1),
        # the tool_use block's five events are gone; the ping after it stays, in order
        ("ping",),
        ("content_block_start", 2, "text"),
        ("content_block_delta", 2, "text_delta", f"\n\n{LOOP_STOP}"),
        ("content_block_stop", 2),
        ("message_delta", "end_turn", 87),
        ("message_stop",),
    ]
    assert out.startswith(b"".join(events[:11]))  # everything before the call: byte for byte
    assert out.endswith(events[-1])
    assert got[-2]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    (stop,) = guard.actions
    assert (stop.kind, stop.reason, stop.tool, stop.count, stop.text) == (
        "stop",
        "denials",
        "read_file",
        9,
        LOOP_STOP,
    )
    assert (guard.complete, guard.received, guard.settled) == (True, len(b"".join(events)), guard.received)


def test_stop_renumbers_the_blocks_after_a_dropped_call_from_zero() -> None:
    block = {"type": "text", "text": ""}
    events = [
        *message_events([LOOP, LOOP], pings=False)[:-2],  # two tool_use blocks at 0 and 1
        event({"type": "content_block_start", "index": 2, "content_block": block}),
        event({"type": "content_block_delta", "index": 2, "delta": {"type": "text_delta", "text": "Done?"}}),
        event({"type": "content_block_stop", "index": 2}),
        *message_events([LOOP])[-2:],
    ]
    out, _, _ = run(events, Judge(STOP), cfg=with_limits(max_identical_per_response=0))
    assert shape(parse(out)) == [
        ("message_start",),
        ("content_block_start", 0, "text"),
        ("content_block_delta", 0, "text_delta", "Done?"),
        ("content_block_stop", 0),
        ("content_block_start", 1, "text"),
        ("content_block_delta", 1, "text_delta", "\n\n[loopguard] Stopped."),
        ("content_block_stop", 1),
        ("message_delta", "end_turn", 87),
        ("message_stop",),
    ]


def test_stop_of_a_calls_only_answer_is_the_stop_text_alone_at_index_zero() -> None:
    out, guard, _ = run(message_events([LOOP, OTHER], pings=False), Judge(STOP))
    assert shape(parse(out)) == [
        ("message_start",),
        ("content_block_start", 0, "text"),
        ("content_block_delta", 0, "text_delta", "[loopguard] Stopped."),
        ("content_block_stop", 0),
        ("message_delta", "end_turn", 87),
        ("message_stop",),
    ]
    assert guard.settled == guard.received


async def test_the_sdk_accumulates_a_stopped_stream(serve_bytes: Serve) -> None:
    events = message_events([LOOP, OTHER], text="Reading it again.", thinking="Same file again.")
    out, _, _ = run(events, looping_judge(), split=1)
    final = await sdk_stream(await serve_bytes(out, "text/event-stream"))
    assert [b.type for b in final.content] == ["thinking", "text", "text"]
    assert final.content[0].thinking == "Same file again."
    assert final.content[0].signature == "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl"
    assert [b.text for b in final.content[1:]] == ["Reading it again.", f"\n\n{LOOP_STOP}"]
    assert (final.stop_reason, final.usage.output_tokens, final.id) == ("end_turn", 87, "msg_01")


async def test_the_sdk_accumulates_an_unchanged_stream_with_both_calls(serve_bytes: Serve) -> None:
    out, _, _ = run(REALISTIC, Judge(None), split=3)
    final = await sdk_stream(await serve_bytes(out, "text/event-stream"))
    assert [(b.type, getattr(b, "input", None)) for b in final.content] == [
        ("thinking", None),
        ("text", None),
        ("tool_use", {"path": "app.py"}),
        ("tool_use", {"path": "b.py"}),
    ]
    assert final.stop_reason == "tool_use"


def test_a_text_only_answer_the_judge_stops_gets_the_stop_block() -> None:
    out, guard, _ = run(message_events([], text="I am done."), Judge(STOP))
    assert shape(parse(out))[-6:] == [
        ("content_block_stop", 0),
        ("content_block_start", 1, "text"),
        ("content_block_delta", 1, "text_delta", "\n\n[loopguard] Stopped."),
        ("content_block_stop", 1),
        ("message_delta", "end_turn", 87),
        ("message_stop",),
    ]
    assert [a.kind for a in guard.actions] == ["stop"]


def test_a_stop_at_message_stop_without_message_delta_writes_one() -> None:
    events = [*message_events([LOOP], pings=False)[:-2], event({"type": "message_stop"})]
    out, guard, _ = run(events, Judge(STOP))
    assert shape(parse(out)) == [
        ("message_start",),
        ("content_block_start", 0, "text"),
        ("content_block_delta", 0, "text_delta", "[loopguard] Stopped."),
        ("content_block_stop", 0),
        ("message_delta", "end_turn", 1),
        ("message_stop",),
    ]
    assert guard.complete


# --- SSE: runaway --------------------------------------------------------------------------------------


def test_identical_calls_past_the_limit_are_cut_when_the_third_completes() -> None:
    events = message_events([WRITE, WRITE, WRITE, WRITE], text="Again.")  # max_identical_per_response: 2
    guard = MessagesStreamGuard(CFG, Judge(None))
    outs, k = feed_events(guard, events)
    # message_start, ping, text (4), then blocks of 6 events (start, 3 deltas, stop, ping)
    third_stop = 6 + 2 * 6 + 4
    assert k == third_stop
    out = b"".join(outs)
    assert out == b"".join(events[: 6 + 2 * 6]) + event(
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": {"output_tokens": 1},
        }
    ) + event({"type": "message_stop"})
    (cut,) = guard.actions
    assert (cut.rule, cut.reason, cut.count, cut.limit) == ("runaway", "identical", 2, 2)
    assert (guard.complete, guard.aborted) == (True, True)


def test_too_many_calls_are_cut_as_soon_as_the_one_past_the_limit_starts() -> None:
    calls = [(f"toolu_{k}", "read_file", f'{{"path": "f{k}.py"}}') for k in range(4)]
    events = message_events(calls, pings=False)
    guard = MessagesStreamGuard(with_limits(max_calls_per_response=2), Judge(None))
    outs, k = feed_events(guard, events)
    assert k == 1 + 2 * 5  # the third call's content_block_start
    assert shape(parse(b"".join(outs))) == [
        ("message_start",),
        ("content_block_start", 0, "tool_use"),
        ("content_block_delta", 0, "input_json_delta", ""),
        ("content_block_delta", 0, "input_json_delta", '{"path":'),
        ("content_block_delta", 0, "input_json_delta", ' "f0.py"}'),
        ("content_block_stop", 0),
        ("content_block_start", 1, "tool_use"),
        ("content_block_delta", 1, "input_json_delta", ""),
        ("content_block_delta", 1, "input_json_delta", '{"path":'),
        ("content_block_delta", 1, "input_json_delta", ' "f1.py"}'),
        ("content_block_stop", 1),
        ("message_delta", "tool_use", 1),
        ("message_stop",),
    ]
    assert b"".join(outs).startswith(b"".join(events[:11]))
    assert [(a.rule, a.reason, a.count) for a in guard.actions] == [("runaway", "calls", 2)]


async def test_the_sdk_accumulates_a_cut_stream(serve_bytes: Serve) -> None:
    out, _, aborted = run(message_events([WRITE, WRITE, WRITE]), Judge(None), split=5)
    assert aborted
    final = await sdk_stream(await serve_bytes(out, "text/event-stream"))
    assert [(b.type, b.name, b.id, b.input) for b in final.content] == [
        ("tool_use", "write_file", "toolu_9", {"path": "app.py"})
    ] * 2
    assert final.stop_reason == "tool_use"


# --- SSE: degenerate text -------------------------------------------------------------------------------

DEGENERATE = "I will check the file again. " * 200


@pytest.mark.parametrize(
    ("events", "reason", "kept"),
    [
        pytest.param(message_events([], text=DEGENERATE), "content", 4, id="text"),
        pytest.param(message_events([], thinking=DEGENERATE), "reasoning", 3, id="thinking"),
        pytest.param(
            [
                *message_events([LOOP], pings=False)[:6],
                event(
                    {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}
                ),
                event(
                    {
                        "type": "content_block_delta",
                        "index": 1,
                        "delta": {"type": "text_delta", "text": DEGENERATE},
                    }
                ),
                *message_events([LOOP])[-2:],
            ],
            "content",
            None,
            id="text_after_a_held_call",
        ),
    ],
)
def test_degenerate_text_closes_the_block_and_ends_with_max_tokens(
    events: list[bytes], reason: str, kept: int | None
) -> None:
    out, guard, aborted = run(events, Judge(STOP), split=50)
    assert aborted
    got = shape(parse(out))
    assert got[-3:] == [("content_block_stop", 0), ("message_delta", "max_tokens", 1), ("message_stop",)]
    assert "tool_use" not in {g[2] for g in got if g[0] == "content_block_start"}
    if kept is not None:  # the upstream's events up to the cut, byte for byte (the first delta degenerates)
        assert out.startswith(b"".join(events[:kept]))
    else:  # the held call is dropped; the text block is renumbered to 0
        assert got[:2] == [("message_start",), ("content_block_start", 0, "text")]
    assert [(a.rule, a.reason) for a in guard.actions] == [("degenerate_text", reason)]
    assert guard.complete


# --- SSE: errors, broken grammar, unknown events ---------------------------------------------------------

ERROR = b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n'


@pytest.mark.parametrize(
    ("bad", "at"),
    [
        pytest.param(ERROR, 13, id="error_event_mid_call"),
        pytest.param(ERROR, 3, id="error_event_before_any_call"),
        pytest.param(b"event: content_block_delta\ndata: not json\n\n", 13, id="not_json"),
        pytest.param(b'event: x\ndata: {"no_type": 1}\n\n', 13, id="no_type"),
        pytest.param(
            event({"type": "ping"}).replace(b"event: ping", b"event: message_stop"), 13, id="name_vs_type"
        ),
        pytest.param(
            event({"type": "content_block_delta", "index": 7, "delta": {"type": "text_delta", "text": "x"}}),
            13,
            id="delta_for_a_block_never_started",
        ),
        pytest.param(event({"type": "content_block_stop", "index": 0}), 13, id="stop_for_a_stopped_block"),
        pytest.param(
            event({"type": "content_block_start", "index": 2, "content_block": {"type": "text", "text": ""}}),
            13,
            id="index_started_twice",
        ),
        pytest.param(
            event(
                {
                    "type": "content_block_delta",
                    "index": 2,
                    "delta": {"type": "input_json_delta", "partial_json": 5},
                }
            ),
            13,
            id="partial_json_not_a_string",
        ),
        pytest.param(event({"type": "content_block_stop", "index": "2"}), 13, id="index_not_an_int"),
        pytest.param(
            event({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            0,
            id="block_before_message_start",
        ),
    ],
)
def test_events_outside_the_grammar_release_everything_unchanged(bad: bytes, at: int) -> None:
    stream = [*REALISTIC[:at], bad, *REALISTIC[at:]]
    out, guard, aborted = run(stream, Judge(STOP))
    assert (out, aborted, guard.complete, guard.actions) == (b"".join(stream), False, True, [])
    assert guard.settled == guard.received


UNKNOWN = [
    event({"type": "x_vendor_progress", "done": 0.5}),
    event(
        {
            "type": "content_block_start",
            "index": 2,
            "content_block": {
                "type": "server_tool_use",
                "id": "srvtoolu_1",
                "name": "web_search",
                "input": {},
            },
        }
    ),
    event(
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "input_json_delta", "partial_json": '{"q":1}'},
        }
    ),
    event({"type": "content_block_delta", "index": 2, "delta": {"type": "x_new_delta", "v": 1}}),
    event({"type": "content_block_stop", "index": 2}),
    b": keep-alive\n\n",
]


def test_unknown_events_and_blocks_pass_and_are_kept_on_a_stop() -> None:
    # thinking 0, text 1, a server tool block 2 and unknown events, then the calls at 3 and 4
    head = message_events([], text="Look.", thinking="Hm.", pings=False)
    events = [*head[:-2], *UNKNOWN, *tool_use_events(3, LOOP), *tool_use_events(4, OTHER), *head[-2:]]
    seen = b"".join(events[:-12])  # everything before the first call
    out, guard, _ = run(events, Judge(None))
    assert (out, guard.actions) == (b"".join(events), [])
    out, guard, _ = run(events, Judge(STOP))
    assert out.startswith(seen)
    assert shape(parse(out[len(seen) :])) == [
        ("content_block_start", 3, "text"),
        ("content_block_delta", 3, "text_delta", "\n\n[loopguard] Stopped."),
        ("content_block_stop", 3),
        ("message_delta", "end_turn", 87),
        ("message_stop",),
    ]


@pytest.mark.parametrize("cut", [1, 12, 20], ids=["after_start", "at_first_call", "mid_calls"])
def test_a_stream_without_message_stop_is_released_unchanged_and_not_complete(cut: int) -> None:
    events = REALISTIC[:cut]
    out, guard, _ = run(events, Judge(STOP))
    assert (out, guard.complete, guard.actions) == (b"".join(events), False, [])


def test_release_after_an_upstream_failure_gives_the_held_bytes_unchanged() -> None:
    guard = MessagesStreamGuard(CFG, Judge(STOP))
    out = b"".join(guard.feed(ev).data for ev in REALISTIC[:15]) + guard.release()
    assert out == b"".join(REALISTIC[:15])


# --- JSON ------------------------------------------------------------------------------------------------

THINKING = {"type": "thinking", "thinking": "Same file.", "signature": "EqQBCgIYAh"}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}
SERVER = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "x"}}


def tool_use(cid: str, path: str = "app.py", name: str = "read_file") -> dict[str, Any]:
    return {"type": "tool_use", "id": cid, "name": name, "input": {"path": path}}


def test_json_stop_becomes_one_text_block_after_the_thinking() -> None:
    body = message([THINKING, REDACTED, {"type": "text", "text": "Again."}, tool_use("toolu_9"), SERVER])
    judge = looping_judge()
    new, actions = decide_json(orjson.dumps(body), judge, CFG)
    assert new is not None and [a.kind for a in actions] == ["stop"]
    out = json.loads(new)
    assert out["content"] == [THINKING, REDACTED, SERVER, {"type": "text", "text": f"Again.\n\n{LOOP_STOP}"}]
    assert out["stop_reason"] == "end_turn"
    assert {k: v for k, v in out.items() if k not in ("content", "stop_reason")} == {
        k: v for k, v in body.items() if k not in ("content", "stop_reason")
    }


def test_json_stop_of_a_calls_only_answer_is_the_stop_text_alone() -> None:
    judge = Judge(STOP)
    new, _ = decide_json(orjson.dumps(message([tool_use("a"), tool_use("b", "b.py")])), judge, CFG)
    assert new is not None
    assert json.loads(new)["content"] == [{"type": "text", "text": "[loopguard] Stopped."}]
    assert judge.seen == [
        ([("a", "read_file", '{"path":"app.py"}'), ("b", "read_file", '{"path":"b.py"}')], "")
    ]


def test_json_runaway_keeps_the_first_calls() -> None:
    body = message([{"type": "text", "text": "x"}, *(tool_use(f"c{k}", name="write_file") for k in range(4))])
    new, actions = decide_json(orjson.dumps(body), Judge(None), CFG)
    assert new is not None
    out = json.loads(new)
    assert [b.get("id") for b in out["content"]] == [None, "c0", "c1"]
    assert out["stop_reason"] == "tool_use"
    assert [(a.rule, a.reason, a.count) for a in actions] == [("runaway", "identical", 2)]


@pytest.mark.parametrize(
    ("name", "n", "kept"), [("Read", 4, 4), ("read_file", 3, 3), ("Read", 5, 4), ("read_file", 300, 4)]
)
def test_json_identical_reads_are_cut_past_four(name: str, n: int, kept: int) -> None:
    body = message([tool_use(f"c{k}", "REDACTED.ts", name) for k in range(n)])
    new, actions = decide_json(orjson.dumps(body), Judge(None), CFG)
    if kept == n:
        assert (new, actions) == (None, [])
        return
    assert new is not None
    assert [b["id"] for b in json.loads(new)["content"]] == [f"c{k}" for k in range(kept)]
    assert [(a.rule, a.reason, a.count, a.limit, a.tool) for a in actions] == [
        ("runaway", "identical", 4, 4, name)
    ]


def test_identical_reads_stream_through_uncut() -> None:
    read = ("toolu_9", "Read", '{"file_path": "REDACTED.ts"}')
    events = message_events([read] * 4)
    out, guard, aborted = run(events, Judge(None), split=5)
    assert (out, guard.actions, aborted) == (b"".join(events), [], False)


def test_json_unchanged_answer_is_left_alone() -> None:
    body = message([THINKING, {"type": "text", "text": "Look."}, tool_use("a"), tool_use("b", "b.py")])
    judge = Judge(None)
    assert decide_json(orjson.dumps(body), judge, CFG) == (None, [])
    assert judge.seen == [
        ([("a", "read_file", '{"path":"app.py"}'), ("b", "read_file", '{"path":"b.py"}')], "Look.")
    ]


@pytest.mark.parametrize(
    ("field", "reason"), [("text", "content"), ("thinking", "reasoning")], ids=["text", "thinking"]
)
def test_json_degenerate_text_is_reported_not_applied(field: str, reason: str) -> None:
    body = message([{"type": field, field: DEGENERATE}], stop_reason="max_tokens")
    new, actions = decide_json(orjson.dumps(body), Judge(None), CFG)
    assert new is None
    assert [(a.rule, a.reason, a.applied) for a in actions] == [("degenerate_text", reason, False)]


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[]",
        b'{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}',
        b'{"type": "message", "content": "a string"}',
        b'{"object": "chat.completion", "choices": []}',
    ],
)
def test_json_that_is_not_a_message_is_left_alone(raw: bytes) -> None:
    assert decide_json(raw, Judge(STOP), CFG) == (None, [])


# --- wiring: the relay, the server, the error events -----------------------------------------------------

STAND_IN = types.SimpleNamespace(
    PATH_SUFFIX="/messages",
    # in place of proxy.dialects.anthropic_messages: reads the history the test sends along as
    # chat messages (so these tests pin the answer side alone), and rewrites nothing
    parse_request=lambda body: openai_chat.parse_request({"messages": body["x_chat"]}),
    apply=lambda raw, actions, body=None: None,
)


@pytest.fixture
def messages_dialect(monkeypatch: pytest.MonkeyPatch) -> None:
    """``…/messages`` guarded by the stand-in dialect (the real Messages dialect set aside)."""
    kept = tuple(d for d in dialects.REGISTRY if d is not anthropic_messages)
    monkeypatch.setattr(dialects, "REGISTRY", (*kept, STAND_IN))
    monkeypatch.setattr(wire, "anthropic_messages", STAND_IN)


def test_the_messages_wire_is_chosen_by_the_dialects_path_suffix(messages_dialect: None) -> None:
    assert wire.wire_of(make_mocked_request("POST", "/v1/messages")) == "messages"
    assert wire.wire_of(make_mocked_request("POST", "/v1/messages?beta=true")) == "messages"
    assert wire.wire_of(make_mocked_request("POST", "/v1/messages/count_tokens")) is None
    assert wire.wire_of(make_mocked_request("GET", "/v1/messages")) is None
    assert relay._STREAM_GUARDS["messages"] is MessagesStreamGuard


def test_the_proxys_own_error_event_has_the_messages_form(messages_dialect: None) -> None:
    request = make_mocked_request("POST", "/v1/messages")
    got = answers.error_event(request, "loopguard: upstream sent nothing", "upstream_timeout", 504)
    assert got == (
        b'event: error\ndata: {"type":"error","error":{"type":"upstream_timeout",'
        b'"message":"loopguard: upstream sent nothing"}}\n\n'
    )


def looping_messages_model(stream_events: list[bytes] | None = None) -> Any:
    """Answers every ``/v1/messages`` request with the same ``read_file`` call (SSE when asked)."""

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        req = json.loads(body)
        if req.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for ev in stream_events or message_events([LOOP], text="Reading it again."):
                await resp.write(ev)
            if stream_events is not None:  # a cut-off stream: the connection drops mid-answer
                assert request.transport is not None
                request.transport.close()
                return resp
            await resp.write_eof()
            return resp
        return web.json_response(
            message([{"type": "text", "text": "Reading it again."}, tool_use("toolu_9")])
        )

    return handler


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_sdk_messages_loop_is_stopped_through_the_server(
    upstream: FakeUpstream, make_proxy: ProxyFactory, messages_dialect: None, stream: bool
) -> None:
    upstream.handler = looping_messages_model()
    base = await make_proxy({"guards": {"escalation": {"enabled": False}}})
    client = anthropic.AsyncAnthropic(base_url=base, api_key="sk-ant-test", max_retries=0)
    params: dict[str, Any] = {
        "model": "m",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "Fix app.py"}],
        "extra_body": {"x_chat": repeated_call_messages(8)},
    }
    try:
        if stream:
            async with client.messages.stream(**params) as s:
                async for _ in s:
                    pass
                final = await s.get_final_message()
        else:
            final = await client.messages.create(**params)
    finally:
        await client.close()
    assert [b.type for b in final.content] == ["text"] * (2 if stream else 1)
    said = "".join(b.text for b in final.content if b.type == "text")
    assert said == f"Reading it again.\n\n{LOOP_STOP}"
    assert final.stop_reason == "end_turn"
    assert [r.path_qs for r in upstream.requests] == ["/v1/messages"]


async def test_sdk_messages_runaway_is_cut_through_the_server(
    upstream: FakeUpstream, make_proxy: ProxyFactory, messages_dialect: None
) -> None:
    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for ev in message_events([WRITE] * 4):  # max_identical_per_response: 2
            try:
                await resp.write(ev)
            except ConnectionResetError:
                break
        return resp

    upstream.handler = handler
    base = await make_proxy()
    client = anthropic.AsyncAnthropic(base_url=base, api_key="sk-ant-test", max_retries=0)
    try:
        async with client.messages.stream(
            model="m",
            max_tokens=100,
            messages=[{"role": "user", "content": "Fix app.py"}],
            extra_body={"x_chat": repeated_call_messages(1)},
        ) as s:
            async for _ in s:
                pass
            final = await s.get_final_message()
    finally:
        await client.close()
    assert [(b.type, b.name, b.id, b.input) for b in final.content] == [
        ("tool_use", "write_file", "toolu_9", {"path": "app.py"})
    ] * 2
    assert final.stop_reason == "tool_use"


async def test_a_messages_stream_cut_by_the_upstream_ends_with_the_anthropic_error_event(
    upstream: FakeUpstream, make_proxy: ProxyFactory, messages_dialect: None
) -> None:
    upstream.handler = looping_messages_model(message_events([LOOP])[:4])
    base = await make_proxy()
    client = anthropic.AsyncAnthropic(base_url=base, api_key="sk-ant-test", max_retries=0)
    try:
        with pytest.raises(anthropic.APIStatusError) as info:
            async with client.messages.stream(
                model="m",
                max_tokens=100,
                messages=[{"role": "user", "content": "Fix app.py"}],
                extra_body={"x_chat": repeated_call_messages(1)},
            ) as s:
                async for _ in s:
                    pass
    finally:
        await client.close()
    assert info.value.body == {
        "type": "error",
        "error": {
            "type": "upstream_disconnected",
            "message": "loopguard: upstream closed the stream before it finished",
        },
    }


# --- property: any stream, any reads, any decision ---------------------------------------------------------

_TEXTS = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_BLOCK = st.one_of(
    st.tuples(st.just("text"), _TEXTS),
    st.tuples(st.just("thinking"), _TEXTS),
    st.tuples(
        st.just("tool"), st.sampled_from(['{"path": "app.py"}', '{"path": "b.py"}', "", '{"a": [1, "é"]}'])
    ),
    st.tuples(st.just("server"), st.just('{"q": 1}')),
)
FUZZ = settings(
    derandomize=True, deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow]
)


def fuzz_stream(blocks: list[tuple[str, str]], pings: list[bool]) -> tuple[list[bytes], int]:
    """A stream of ``blocks`` (a ``ping`` after block k when ``pings[k]``); its tool_use count."""
    out = [message_events([])[0]]
    calls = 0
    for k, (kind, value) in enumerate(blocks):
        if kind == "tool":
            out += tool_use_events(k, (f"toolu_{k}", "read_file", value))
            calls += 1
        elif kind == "server":
            block = {"type": "server_tool_use", "id": f"srvtoolu_{k}", "name": "web_search", "input": {}}
            out.append(event({"type": "content_block_start", "index": k, "content_block": block}))
            delta = {"type": "input_json_delta", "partial_json": value}
            out.append(event({"type": "content_block_delta", "index": k, "delta": delta}))
            out.append(event({"type": "content_block_stop", "index": k}))
        else:
            start = {"type": kind, kind: ""}
            out.append(event({"type": "content_block_start", "index": k, "content_block": start}))
            delta = {"type": f"{kind}_delta", kind: value}
            out.append(event({"type": "content_block_delta", "index": k, "delta": delta}))
            out.append(event({"type": "content_block_stop", "index": k}))
        if pings[k % len(pings)]:
            out.append(b": keep-alive\n\n" if k % 2 else event({"type": "ping"}))
    return [*out, *message_events([], stop_reason="tool_use" if calls else "end_turn")[-2:]], calls


def check_grammar(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the SDK's accumulator relies on: ``message_start`` first, blocks started at 0, 1, 2, …
    in order, deltas and stops only for open blocks, ``message_delta`` (with usage) then
    ``message_stop`` last. Returns the blocks as started."""
    assert events[0]["type"] == "message_start"
    started: list[dict[str, Any]] = []
    open_: set[int] = set()
    for e in events[1:-2]:
        if e["type"] == "content_block_start":
            assert e["index"] == len(started)
            started.append(e["content_block"])
            open_.add(e["index"])
        elif e["type"] in ("content_block_delta", "content_block_stop"):
            assert e["index"] in open_
            if e["type"] == "content_block_stop":
                open_.remove(e["index"])
        else:
            assert e["type"] == "ping"
    assert not open_
    assert [e["type"] for e in events[-2:]] == ["message_delta", "message_stop"]
    assert isinstance(events[-2]["usage"]["output_tokens"], int)
    return started


def frames(stream: bytes) -> list[dict[str, Any]]:
    return parse(b"".join(f + b"\n\n" for f in stream.split(b"\n\n") if f and not f.startswith(b":")))


@FUZZ
@given(
    blocks=st.lists(_BLOCK, max_size=7),
    pings=st.lists(st.booleans(), min_size=1, max_size=4),
    reads=st.lists(st.integers(1, 40), min_size=1, max_size=8),
    decision=st.sampled_from(["none", "stop", "runaway"]),
)
def test_any_stream_any_reads_gives_the_bytes_or_a_stream_the_sdk_reads(
    blocks: list[tuple[str, str]], pings: list[bool], reads: list[int], decision: str
) -> None:
    events, calls = fuzz_stream(blocks, pings)
    raw = b"".join(events)
    cfg = (
        with_limits(max_calls_per_response=1)
        if decision == "runaway"
        else with_limits(max_identical_per_response=0)
    )
    guard = MessagesStreamGuard(cfg, Judge(STOP if decision == "stop" else None))
    out = bytearray()
    pos = 0
    for n in itertools.cycle(reads):
        if pos >= len(raw) or guard.aborted:
            break
        o = guard.feed(raw[pos : pos + n])
        pos += n
        out += o.data
        assert raw.startswith(bytes(out)) or guard.actions  # unchanged so far: a prefix of the bytes
    out += guard.finish()
    assert guard.settled == guard.received
    asked = calls > 0 or any(kind == "text" and value for kind, value in blocks)  # the judge is asked
    if decision == "none" or (decision == "runaway" and calls <= 1) or (decision == "stop" and not asked):
        assert (bytes(out), guard.actions) == (raw, [])
        return
    got = frames(bytes(out))
    started = check_grammar(got)
    reason = got[-2]["delta"]["stop_reason"]
    if decision == "stop":
        assert [a.kind for a in guard.actions] == ["stop"]
        assert [b["type"] for b in started] == [
            b[0] if b[0] != "server" else "server_tool_use" for b in blocks if b[0] != "tool"
        ] + ["text"]
        assert (got[-3]["type"], reason) == ("content_block_stop", "end_turn")
        said = "".join(b[1] for b in blocks if b[0] == "text")
        assert got[-4]["delta"]["text"] == (
            "\n\n[loopguard] Stopped." if said.strip() else "[loopguard] Stopped."
        )
    else:
        assert [(a.rule, a.count) for a in guard.actions] == [("runaway", 1)]
        assert [b["type"] for b in started].count("tool_use") == 1
        assert reason == "tool_use"
