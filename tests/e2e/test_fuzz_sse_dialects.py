"""Every dialect's stream guard reads valid SSE however it is written (the WHATWG event-stream
rules, https://html.spec.whatwg.org/multipage/server-sent-events.html): lines ending in LF, CRLF,
bare CR or a mix, comment lines (``: ping``), stray blank lines (events without data, never
dispatched), ``id:``/``retry:`` lines, ``data:`` with or without its space, an event's JSON split
over several ``data:`` lines (joined with LF), all cut at random read boundaries.

Before: a data-less block in a Responses stream made its guard raise (the rest of the answer went
out unread, the answer was not kept, the next ``previous_response_id`` request unguarded), and a
stream whose lines end in bare CR left its last event waiting for a byte that never came (no
stop, and an "upstream closed the stream" error event after a complete answer).

Table-driven over :data:`WIRES`: one row per dialect (its stream guard and a plain answer with
two identical calls and some text), so a new dialect is one more row. Each scenario's decision
on the plain stream is pinned (pass, stop, runaway cut, degenerate cut); then, decorated:

- the decision (the actions) is the plain stream's;
- the events the agent parses (event name, decoded data) are the plain stream's output's;
- nothing decided: the agent gets exactly the decorated bytes;
- after the end of the stream nothing is held, and the stream is as complete as the plain one.

Broken off at any byte, the agent gets whole events and then the error event on its own, as the
edge writes them (:func:`test_a_decorated_stream_broken_off_anywhere_ends_with_the_error_event_on_its_own`).

Through the real server (:func:`test_a_decorated_looping_stream_is_stopped_through_the_server`),
each dialect's looping answer, decorated, is stopped, with ``internal_errors`` 0; a Responses
answer is kept, so the chained request that names it is guarded.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.config import Config, build
from proxy.core.actions import Cut, Stop
from proxy.edge import relay
from proxy.edge.keys import STATS_KEY
from proxy.response.assemble import AssembledCall
from proxy.response.gemini_stream import GeminiArrayGuard, GeminiStreamGuard
from proxy.response.messages_stream import MessagesStreamGuard
from proxy.response.responses_stream import ResponsesStreamGuard
from proxy.response.sse import EventGate, SSEFramer
from proxy.response.stream_guard import FramedGuard, StreamGuard
from tests.helpers.fakes import repeated_call_messages, sse_events, tool_call
from tests.helpers.gemini_contents import gemini_body
from tests.helpers.messages_blocks import messages_body
from tests.helpers.messages_items import message_events
from tests.helpers.proxy_server import serve
from tests.helpers.responses_items import response_events, responses_body

FUZZ = settings(
    derandomize=True,
    deadline=None,
    max_examples=25,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

STOP = Stop(text="[loopguard] Stopped.", rule="stop", tool="read_file", count=9, limit=2)
ARGS = '{"path": "app.py"}'
STOP_MARK = "[loopguard]"
TEXT = "Let me look at the file."
#: degenerate text: one sentence over and over (the check's defaults need 12 copies)
REPEATED = "I will read the file again now. " * 16
DEFAULT = Config()
#: the runaway cut at the second identical call (the degenerate check off: the text is healthy);
#: read_file configured as state-changing, since identical read-only calls are never counted
RUNAWAY = build(
    Config,
    {"response": {"max_identical_per_response": 1}, "progress": {"state_changing_tools": ["read_file"]}},
)


class Judge:
    """Stands in for :class:`proxy.response.decide.StopJudge`: answers ``verdict`` every time."""

    def __init__(self, verdict: Stop | None) -> None:
        self.verdict = verdict
        self.on_text_only = False

    def __call__(self, calls: Sequence[AssembledCall], text: str = "") -> Stop | None:
        return self.verdict


@dataclass(frozen=True)
class Wire:
    """One dialect's stream: its guard, and the plain events of an answer (``text``, then two
    identical ``read_file`` calls); ``server``: its path and request body for the real server."""

    name: str
    guard: Callable[[Config, Any], FramedGuard]
    answer: Callable[[str], list[bytes]]
    path: str
    body: Callable[[list[dict[str, Any]]], dict[str, Any]]


def _chat_answer(text: str, calls: int = 2) -> list[bytes]:
    return sse_events([tool_call("read_file", ARGS, f"call_{9 + k}") for k in range(calls)], content=text)


def _gemini_answer(text: str) -> list[bytes]:
    """A Gemini ``alt=sse`` answer: the text in 8-character pieces, one event per call, then the
    finishing event (compact JSON, LF line ends, as the other rows)."""

    def event(parts: list[Any], finish: bool = False) -> bytes:
        cand: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        if finish:
            cand["finishReason"] = "STOP"
        return b"data: " + orjson.dumps({"candidates": [cand], "modelVersion": "m"}) + b"\n\n"

    call = {"functionCall": {"name": "read_file", "args": orjson.loads(ARGS)}}
    pieces = [event([{"text": text[i : i + 8]}]) for i in range(0, len(text), 8)]
    return [*pieces, event([call]), event([call]), event([], finish=True)]


WIRES = [
    Wire(
        "chat",
        StreamGuard,
        _chat_answer,
        "/v1/chat/completions",
        lambda messages: {"model": "m", "stream": True, "messages": messages},
    ),
    Wire(
        "responses",
        ResponsesStreamGuard,
        lambda text: response_events([("call_9", "read_file", ARGS), ("call_10", "read_file", ARGS)], text),
        "/v1/responses",
        lambda messages: {**responses_body(messages), "stream": True},
    ),
    Wire(
        "messages",
        MessagesStreamGuard,
        lambda text: message_events([("toolu_9", "read_file", ARGS), ("toolu_10", "read_file", ARGS)], text),
        "/v1/messages",
        lambda messages: {**messages_body(messages), "stream": True, "max_tokens": 100},
    ),
    Wire(
        "gemini",
        GeminiStreamGuard,
        _gemini_answer,
        "/v1beta/models/m:streamGenerateContent?alt=sse",
        gemini_body,
    ),
]


#: (id, config, judge, the answer's text, the decision on the plain stream)
SCENARIOS = [
    ("pass", DEFAULT, Judge(None), TEXT, []),
    ("stop", DEFAULT, Judge(STOP), TEXT, [("Stop", "stop")]),
    ("runaway", RUNAWAY, Judge(None), TEXT, [("Cut", "runaway")]),
    ("degenerate", DEFAULT, Judge(None), REPEATED, [("Cut", "degenerate_text")]),
]


# --- running a guard ----------------------------------------------------------------------------


@dataclass
class Run:
    out: bytes
    actions: list[tuple[str, str]]
    complete: bool


def run(wire: Wire, reads: Sequence[bytes], cfg: Config, judge: Any) -> Run:
    """Feed ``reads`` as the relay does (stops at an abort), then end the stream."""
    guard = wire.guard(cfg, judge)
    out = bytearray()
    aborted = False
    for chunk in reads:
        o = guard.feed(chunk)
        out += o.data
        if o.abort:
            aborted = True
            break
    if not aborted:
        out += guard.finish()
        assert guard.received == guard.settled  # nothing held after the end of the stream
    actions = [(type(a).__name__, a.rule) for a in guard.actions if isinstance(a, (Stop, Cut))]
    return Run(bytes(out), actions, guard.complete)


_OWN_IDS = re.compile(r"msg_loopguard_\d+")


def agent_view(out: bytes) -> list[tuple[str | None, Any]]:
    """The data events the agent parses: (event name, data decoded as JSON, else as text); the
    ids the guard gives its own items are numbered per process, so they read as one."""
    framer = SSEFramer()
    events = framer.feed(out) + framer.end()
    assert framer.finish() == b"", "the output ends mid-event"
    view: list[tuple[str | None, Any]] = []
    for e in events:
        if e.data is None:
            continue
        data = _OWN_IDS.sub("msg_loopguard_N", e.data)
        try:
            view.append((e.event, orjson.loads(data)))
        except orjson.JSONDecodeError:
            view.append((e.event, data))
    return view


# --- decorating a plain stream -------------------------------------------------------------------

_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[,:{}\[\]]')


def _json_breaks(text: str) -> list[int]:
    """Offsets in ``text`` (compact JSON) where a line break keeps it the same JSON: after a
    ``,``, ``:``, ``{`` or ``[`` (never inside a string); none in data that is no object
    (``[DONE]``)."""
    if not text.startswith("{"):
        return []
    return [m.end() for m in _JSON_TOKEN.finditer(text) if m.group() in (",", ":", "{", "[")]


@st.composite
def decorated(draw: st.DrawFn, events: list[bytes]) -> bytes:
    """``events`` (plain: ``event:``/``data:`` lines ending in LF) written otherwise, as valid SSE
    with the same data: line ends LF, CRLF, CR or mixed; comments, ``id:``/``retry:`` lines and
    stray blank lines; ``data:`` with or without its space; the data over several lines."""
    style = draw(st.sampled_from([b"\n", b"\r\n", b"\r", None]))
    ends = iter(draw(st.lists(st.sampled_from([b"\n", b"\r\n", b"\r"]), min_size=8, max_size=8)) * 100_000)

    last = [b""]

    def line(text: bytes) -> bytes:
        end = style if style is not None else next(ends)
        if not text and end == b"\n" and last[0] == b"\r":
            end = b"\r"  # CR then an empty line ending in LF would be one CRLF: one line end, not two
        last[0] = end
        return text + end

    sep = draw(st.sampled_from([b" ", b""]))
    out = bytearray()
    for raw in events:
        (ev,) = SSEFramer().feed(raw)
        assert ev.data is not None
        for _ in range(draw(st.integers(0, 2))):  # blocks without data between events
            for text in draw(st.sampled_from([(b": ping", b""), (b"",), (b"retry: 10", b"")])):
                out += line(text)
        for extra in draw(st.lists(st.sampled_from([b": keep-alive", b"id: 7", b"retry: 3000"]), max_size=2)):
            out += line(extra)
        if ev.event is not None:
            out += line(b"event: " + ev.event.encode())
        breaks = _json_breaks(ev.data)
        cuts = sorted(set(draw(st.lists(st.sampled_from(breaks), max_size=4)))) if breaks else []
        for a, b in zip([0, *cuts], [*cuts, len(ev.data)], strict=True):
            out += line(b"data:" + sep + ev.data[a:b].encode())
        out += line(b"")
    return bytes(out)


@st.composite
def splits(draw: st.DrawFn, raw: bytes) -> list[bytes]:
    """``raw`` cut at random points (now and then byte by byte)."""
    if len(raw) < 6000 and draw(st.integers(0, 9)) == 0:
        return [raw[i : i + 1] for i in range(len(raw))]
    cuts = sorted(set(draw(st.lists(st.integers(0, len(raw)), max_size=30))))
    return [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]


# --- the plain streams' decisions are what the scenarios say ---------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s[0] for s in SCENARIOS])
@pytest.mark.parametrize("wire", WIRES, ids=[w.name for w in WIRES])
def test_the_plain_stream_gets_the_scenarios_decision(wire: Wire, scenario: tuple[Any, ...]) -> None:
    _, cfg, judge, text, decision = scenario
    events = wire.answer(text)
    plain = run(wire, [b"".join(events)], cfg, judge)
    assert plain.actions == decision
    assert plain.complete
    if not decision:
        assert plain.out == b"".join(events)


# --- decorated: the same decision, the same events, the same bytes when nothing is decided ----------


@FUZZ
@given(data=st.data())
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s[0] for s in SCENARIOS])
@pytest.mark.parametrize("wire", WIRES, ids=[w.name for w in WIRES])
def test_a_decorated_stream_gets_the_plain_streams_decision_and_events(
    wire: Wire, scenario: tuple[Any, ...], data: st.DataObject
) -> None:
    _, cfg, judge, text, decision = scenario
    events = wire.answer(text)
    plain = run(wire, [b"".join(events)], cfg, judge)
    raw = data.draw(decorated(events), label="stream")
    reads = data.draw(splits(raw), label="reads")
    got = run(wire, reads, cfg, judge)
    assert got.actions == plain.actions == decision
    assert got.complete
    assert agent_view(got.out) == agent_view(plain.out)
    if not decision:
        assert got.out == raw


@pytest.mark.parametrize("wire", WIRES, ids=[w.name for w in WIRES])
@pytest.mark.parametrize(
    "form",
    [
        pytest.param(lambda raw: raw.replace(b"\n\n", b"\n\n: ping\n\n"), id="a_comment_after_every_event"),
        pytest.param(lambda raw: raw.replace(b"\n\n", b"\n\n\n"), id="a_blank_line_after_every_event"),
        pytest.param(lambda raw: raw.replace(b"\n", b"\r"), id="bare_cr_line_ends"),
        pytest.param(lambda raw: raw.replace(b',"', b',\ndata: "'), id="data_over_several_lines"),
    ],
)
def test_each_form_alone_is_read_like_the_plain_stream(wire: Wire, form: Callable[[bytes], bytes]) -> None:
    """The forms the fuzz mixes, one at a time, on the stop scenario, read whole and byte by byte."""
    events = wire.answer(TEXT)
    raw = form(b"".join(events))
    plain = run(wire, [b"".join(events)], DEFAULT, Judge(STOP))
    for reads in ([raw], [raw[i : i + 1] for i in range(len(raw))]):
        got = run(wire, reads, DEFAULT, Judge(STOP))
        assert got.actions == [("Stop", "stop")]
        assert got.complete
        assert agent_view(got.out) == agent_view(plain.out)


# --- broken off anywhere: whole events, then the error event on its own --------------------------------

ERROR_EVENT = b'data: {"error":{"message":"cut","type":"upstream_disconnected","code":502}}\n\n'


def broken_off(wire: Wire, reads: Sequence[bytes], cfg: Config, judge: Any) -> bytes:
    """What the agent gets when the upstream breaks off after ``reads``, as the edge writes it
    (:func:`proxy.edge.relay.relay_sse` and :class:`proxy.edge.upstream.GatedStream`): each
    read's output through the gate, the guard's held bytes released at the break, the half event
    the gate holds dropped, then the error event."""
    guard, gate, out = wire.guard(cfg, judge), EventGate(), bytearray()
    for chunk in reads:
        o = guard.feed(chunk)
        out += gate.feed(o.data)
        if o.abort:
            return bytes(out + gate.flush())  # the guard's own cut ends the stream whole
    out += gate.feed(guard.release())
    gate.drop()
    return bytes(out) + ERROR_EVENT


@FUZZ
@given(data=st.data())
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s[0] for s in SCENARIOS])
@pytest.mark.parametrize("wire", WIRES, ids=[w.name for w in WIRES])
def test_a_decorated_stream_broken_off_anywhere_ends_with_the_error_event_on_its_own(
    wire: Wire, scenario: tuple[Any, ...], data: st.DataObject
) -> None:
    """Cut at any byte of any form: the agent parses whole events only (each data a JSON value, as
    sent), then the error event, and nothing unended: never a half event the error event would be
    read as the rest of."""
    _, cfg, judge, text, _ = scenario
    raw = data.draw(decorated(wire.answer(text)), label="stream")
    cut = data.draw(st.integers(0, len(raw)), label="cut")
    reads = data.draw(splits(raw[:cut]), label="reads")
    got = broken_off(wire, reads, cfg, judge)
    framer = SSEFramer()
    events = framer.feed(got) + framer.end()
    assert framer.finish() == b""
    parsed = [orjson.loads(e.data) if e.data != "[DONE]" else e.data for e in events if e.data is not None]
    if got.endswith(ERROR_EVENT):
        assert parsed[-1] == orjson.loads(ERROR_EVENT[6:])


# --- through the real server -----------------------------------------------------------------------

FORMS = {
    "plain": lambda raw: raw,
    "comments": lambda raw: raw.replace(b"\n\n", b"\n\n: ping\n\n"),
    "bare_cr": lambda raw: raw.replace(b"\n", b"\r"),
    "multi_line_data": lambda raw: raw.replace(b',"', b',\ndata: "'),
}


async def _through_the_server(wire: Wire, form: Callable[[bytes], bytes]) -> tuple[list[bytes], Any]:
    """A looping conversation (8 identical reads, the 9th coming) in ``wire``'s form, answered with
    the 9th read written in ``form``, then the chained request (Responses: naming the answer's id);
    returns the agent's two bodies and the proxy's stats."""
    answer = form(b"".join(wire.answer(TEXT)))

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(0, len(answer), 97):
            await resp.write(answer[i : i + 97])
            await asyncio.sleep(0)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    config = {"guards": {"escalation": {"enabled": False}}, "response": {"max_identical_per_response": 0}}
    bodies: list[bytes] = []
    try:
        upstream = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
        async with serve(config, upstream) as (base, proxy), aiohttp.ClientSession() as session:
            first = wire.body(repeated_call_messages(8))
            second = dict(first)
            if wire.name == "responses":  # the next step names the answer it got
                second = {
                    "model": "m",
                    "stream": True,
                    "previous_response_id": "resp_1",
                    "input": [{"type": "message", "role": "user", "content": "Go on."}],
                }
            for body in (first, second):
                async with session.post(
                    base + wire.path, data=orjson.dumps(body), headers={"Content-Type": "application/json"}
                ) as r:
                    assert r.status == 200
                    bodies.append(await r.read())
            return bodies, proxy[STATS_KEY]
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("form", list(FORMS), ids=list(FORMS))
@pytest.mark.parametrize("wire", WIRES, ids=[w.name for w in WIRES])
def test_a_decorated_looping_stream_is_stopped_through_the_server(wire: Wire, form: str) -> None:
    bodies, stats = asyncio.run(_through_the_server(wire, FORMS[form]))
    first = agent_view(bodies[0])
    texts = [orjson.dumps(d).decode() for _, d in first]
    assert any(STOP_MARK in t for t in texts), "the looping answer was not stopped"
    assert not any("upstream closed" in t for t in texts)
    assert stats.internal_errors == 0
    assert stats.per_action[("stop", "stop", "enforce")] >= 1
    assert dict(stats.unguarded) == {}  # the chained Responses request found its answer kept


def test_wires_cover_every_stream_guard() -> None:
    """A new stream guard (a new dialect) gets its row in :data:`WIRES`. Gemini's JSON-array stream
    is no event stream (none of these SSE forms applies to it): its own fuzz is in
    ``tests/unit/response/test_gemini_shapes.py``."""
    sse_guards = set(relay._STREAM_GUARDS.values()) - {GeminiArrayGuard}
    assert {w.guard for w in WIRES} == {StreamGuard, *sse_guards}
