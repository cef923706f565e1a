"""The response side end to end (DESIGN §6.4): the real server in front of a fake upstream, with the
official ``openai`` SDK as the agent where parsing matters and raw sockets where connection
handling matters. Timing properties are proven with events; the fake model "generates" by
yielding to the event loop between tokens (``sleep(0)``, no wall-clock time)."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import structlog
from aiohttp import web

import proxy.edge.relay
import proxy.response.stream_guard
from proxy.config import GuardsConfig
from proxy.edge.observe import configure_logging
from proxy.request.conversation import key_digest
from proxy.response.decide import DENIALS_TEXT
from tests.helpers.fakes import FakeUpstream, completion, repeated_call_messages, sse_events, tool_call
from tests.helpers.quirks import ARGS, QUIRKS, ROLE, Quirk, calls, chunk, ev, tc
from tests.helpers.sdk_agent import agent_loop, snapshot, turn

CHAT = "/v1/chat/completions"
RESULT = "print('hi')"
STOP_TEXT = DENIALS_TEXT.format(tool="read_file", count=9, denials=2)
#: The denials stop is pinned here with the escalation ladder off (it would end these loops at the
#: 7th call: tests/unit/guards/test_escalation.py).
NO_LADDER: dict[str, Any] = {"guards": {"escalation": {"enabled": False}}}
NO_STOP = {"stop": {"after_ignored_denials": 0}, "guards": {"escalation": {"stop": False}}}


@pytest.fixture
async def agent() -> AsyncIterator[aiohttp.ClientSession]:
    skip = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
    async with aiohttp.ClientSession(auto_decompress=False, skip_auto_headers=skip) as s:
        yield s


# --- the stop ends the agent's loop -------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_sdk_agent_loop_ends_on_its_own_with_the_stop_text(
    upstream: FakeUpstream, sdk, stream: bool
) -> None:
    client = await sdk(NO_LADDER, **{"x-session-id": "agent-1"})
    messages, steps, finish = await agent_loop(client, stream)
    assert steps == 9  # 8 calls run (7 and 8 withheld from the model), the 9th answer is the stop
    assert len(upstream.requests) == 9
    assert finish == "stop"
    assert messages[-1] == {"role": "assistant", "content": STOP_TEXT}
    assert sum(1 for m in messages if m["role"] == "tool") == 8
    snap = await snapshot(client.base)
    assert (snap["stops"], snap["per_rule"]["stop"], snap["results_withheld"]) == (1, 1, 2)
    assert [(i["kind"], i["tool"], i["count"], i["limit"], i["agent"]) for i in snap["incidents"]] == [
        ("duplicate", "read_file", 7, 6, key_digest("agent-1")),
        ("stop", "read_file", 9, 2, key_digest("agent-1")),
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_without_the_stop_the_loop_runs_to_max_steps(upstream: FakeUpstream, sdk, stream: bool) -> None:
    client = await sdk(NO_STOP)
    messages, steps, finish = await agent_loop(client, stream, max_steps=15)
    assert (steps, finish) == (15, "tool_calls")
    assert all(m.get("tool_calls") for m in messages if m["role"] == "assistant")


@pytest.mark.parametrize(
    ("scope", "again", "count"),
    [
        # a new request is a boundary: the same loop is counted afresh and stopped at its 9th call
        ("episode", 9, 9),
        # the seed's scope: the duplicates count on, so calls 9 and 10 run (both withheld from the
        # model as duplicates) and the third answer is stopped again
        ("conversation", 3, 11),
    ],
)
async def test_user_continues_after_a_stop_guarded_afresh_and_one_incident(
    upstream: FakeUpstream, sdk, tmp_path: Path, scope: str, again: int, count: int
) -> None:
    path = tmp_path / "incidents.jsonl"
    breaker = {"incident_log": str(path), "scope": scope}
    client = await sdk(
        {"guards": {"circuit_breaker": breaker, "escalation": {"enabled": False}}},
        **{"x-session-id": "s1"},
    )
    messages, steps, _ = await agent_loop(client, stream=True)
    assert steps == 9
    messages.append({"role": "user", "content": "Please try once more."})
    messages, steps, finish = await agent_loop(client, stream=True, messages=messages)
    # The new turn starts with no withheld result
    assert (steps, finish) == (again, "stop")
    assert messages[-1]["content"] == DENIALS_TEXT.format(tool="read_file", count=count, denials=2)
    snap = await snapshot(client.base)
    assert snap["stops"] == 2
    for _ in range(200):
        if path.exists() and len(path.read_bytes().splitlines()) >= 2:
            break
        await asyncio.sleep(0.01)
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    # one line per kind and conversation: the second stop is not a new incident
    assert [(x["kind"], x["count"]) for x in lines] == [("duplicate", 7), ("stop", 9)]


async def test_stop_is_logged_in_the_request_line(
    upstream: FakeUpstream, make_proxy, agent, capfd: pytest.CaptureFixture[str]
) -> None:
    saved = structlog.get_config()
    configure_logging("info")
    try:
        base = await make_proxy(NO_LADDER)
        capfd.readouterr()
        body = orjson.dumps({"model": "m", "messages": repeated_call_messages(8)})
        async with agent.post(base + CHAT, data=body) as r:
            answer = await r.json()
        assert answer["choices"][0]["message"] == {"role": "assistant", "content": STOP_TEXT}
        err = ""
        for _ in range(200):
            err += capfd.readouterr().err
            if '"request"' in err:
                break
            await asyncio.sleep(0.005)
    finally:
        structlog.configure(**saved)
    (line,) = [
        orjson.loads(x) for x in err.splitlines() if '"event": "request"' in x or '"event":"request"' in x
    ]
    assert line["actions"][-1] == {
        "rule": "stop",
        "kind": "stop",
        "tool": "read_file",
        "count": 9,
        "limit": 2,
        "reason": "denials",
        "withheld_in_turn": 2,  # what the limit counts, named
        "after_ignored_denials": 2,
    }
    assert STOP_TEXT not in err  # never message content


async def test_a_fingerprinted_conversations_lines_name_the_key_of_its_first_request(
    upstream: FakeUpstream, make_proxy, agent, capfd: pytest.CaptureFixture[str]
) -> None:
    """No conversation header: the first request (no tool call yet) is keyed by the opening's
    fingerprint, the later ones by one that reads the first call's id too; each later line says
    ``opened_as`` the first one's key."""
    saved = structlog.get_config()
    configure_logging("info")
    try:
        base = await make_proxy()
        capfd.readouterr()
        for history in (repeated_call_messages(0), repeated_call_messages(1), repeated_call_messages(2)):
            body = orjson.dumps({"model": "m", "messages": history})
            async with agent.post(base + CHAT, data=body) as r:
                await r.read()
        err = ""
        for _ in range(200):
            err += capfd.readouterr().err
            if err.count('"request"') >= 3:
                break
            await asyncio.sleep(0.005)
    finally:
        structlog.configure(**saved)
    lines = [
        orjson.loads(x) for x in err.splitlines() if '"event": "request"' in x or '"event":"request"' in x
    ]
    first, *later = [(x["conversation"], x.get("opened_as")) for x in lines]
    assert first[1] is None and first[0].startswith("fp-")
    assert later == [(later[0][0], first[0])] * 2 and later[0][0] != first[0]


# --- runaway ------------------------------------------------------------------------------------------


def runaway_handler(n: int, progress: dict[str, Any], name: str = "write_file") -> Any:
    """A model streaming ``n`` identical calls of ``name``, one token at a time; records how many
    calls it got out and sets ``progress["closed"]`` when the proxy hangs up."""

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            await resp.write(ev(chunk(ROLE)))
            for i in range(n):
                for delta in (
                    tc(i, f"call_{i}", name, "", type_=True),
                    tc(i, arguments='{"path": '),
                    tc(i, arguments='"app.py"}'),
                ):
                    await resp.write(ev(chunk(calls(delta))))
                    await asyncio.sleep(0)  # the next token (no wall-clock time)
                progress["written"] = i + 1
            await resp.write(ev(chunk(finish="tool_calls")) + b"data: [DONE]\n\n")
            await resp.write_eof()
        finally:
            progress["closed"].set()
        return resp

    return handler


ALL_GUARDS_OFF = {"guards": {name: {"enabled": False} for name in GuardsConfig.__dataclass_fields__}}


@pytest.mark.parametrize("config", [None, ALL_GUARDS_OFF], ids=["defaults", "request_guards_off"])
async def test_300_identical_streamed_calls_agent_gets_2_and_upstream_is_closed(
    upstream: FakeUpstream, sdk, config: dict[str, Any] | None
) -> None:
    """The runaway cut needs no request-side guard: with all of them off it still applies."""
    progress: dict[str, Any] = {"written": 0, "closed": asyncio.Event()}
    upstream.handler = runaway_handler(300, progress)
    client = await sdk(config)
    msg, finish = await turn(client, [{"role": "user", "content": "go"}], stream=True)
    assert finish == "tool_calls"
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]] == [
        (f"call_{i}", "write_file", ARGS) for i in range(2)
    ]
    await asyncio.wait_for(progress["closed"].wait(), 2)
    assert progress["written"] < 20, progress["written"]  # it stopped writing long before 300 (6 here)
    snap = await snapshot(client.base)
    assert (snap["responses_cut"], snap["per_rule"]) == (1, {"runaway": 1})


@pytest.mark.parametrize(
    ("name", "n", "kept"),
    [
        pytest.param("write_file", 300, 2, id="300_writes_cut_to_2"),
        pytest.param("write_file", 3, 2, id="3_writes_cut_to_2"),
        pytest.param("read_file", 300, 4, id="300_reads_cut_to_4"),
        pytest.param("read_file", 5, 4, id="5_reads_cut_to_4"),
        pytest.param("read_file", 3, 3, id="3_reads_pass"),
        pytest.param("Read", 4, 4, id="4_Reads_pass"),
    ],
)
async def test_json_response_with_identical_calls_cuts_writes_past_2_and_reads_past_4(
    upstream: FakeUpstream, sdk, name: str, n: int, kept: int
) -> None:
    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        answer = completion([tool_call(name, ARGS, f"call_{i}") for i in range(n)])
        return web.json_response(answer, dumps=lambda o: orjson.dumps(o).decode())

    upstream.handler = handler
    client = await sdk()
    msg, finish = await turn(client, [{"role": "user", "content": "go"}], stream=False)
    assert finish == "tool_calls"
    assert [c["id"] for c in msg["tool_calls"]] == [f"call_{i}" for i in range(kept)]
    snap = await snapshot(client.base)
    assert snap["responses_cut"] == (1 if kept < n else 0)


@pytest.mark.parametrize(("name", "n", "kept"), [("read_file", 300, 4), ("Read", 4, 4), ("grep", 3, 3)])
async def test_streamed_identical_reads_are_cut_past_four(
    upstream: FakeUpstream, sdk, name: str, n: int, kept: int
) -> None:
    progress: dict[str, Any] = {"written": 0, "closed": asyncio.Event()}
    upstream.handler = runaway_handler(n, progress, name)
    client = await sdk()
    msg, finish = await turn(client, [{"role": "user", "content": "go"}], stream=True)
    assert finish == "tool_calls"
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]] == [
        (f"call_{i}", name, ARGS) for i in range(kept)
    ]
    await asyncio.wait_for(progress["closed"].wait(), 2)
    snap = await snapshot(client.base)
    assert (snap["responses_cut"], snap["per_rule"]) == ((1, {"runaway": 1}) if kept < n else (0, {}))


# --- degenerate text ------------------------------------------------------------------------------------


def text_handler(pieces: list[str], progress: dict[str, Any], finish: str = "stop") -> Any:
    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            await resp.write(ev(chunk(ROLE)))
            for i, piece in enumerate(pieces):
                await resp.write(ev(chunk({"content": piece})))
                progress["written"] = i + 1
                await asyncio.sleep(0)
            await resp.write(ev(chunk(finish=finish)) + b"data: [DONE]\n\n")
            await resp.write_eof()
        finally:
            progress["closed"].set()
        return resp

    return handler


async def test_degenerate_stream_ends_early_with_length_and_upstream_is_closed(
    upstream: FakeUpstream, sdk
) -> None:
    progress: dict[str, Any] = {"written": 0, "closed": asyncio.Event()}
    sentence = "I need to check the configuration file again. "
    upstream.handler = text_handler(["Let me think. "] + [sentence] * 5000, progress)
    client = await sdk()
    msg, finish = await turn(client, [{"role": "user", "content": "why?"}], stream=True)
    assert finish == "length"
    assert msg["content"].startswith("Let me think. " + sentence * 10)
    assert len(msg["content"]) < len(sentence) * 40
    await asyncio.wait_for(progress["closed"].wait(), 2)
    assert progress["written"] < 40, progress["written"]  # of 5001 pieces (15 here)
    snap = await snapshot(client.base)
    assert (snap["responses_cut"], snap["per_rule"]) == (1, {"degenerate_text": 1})


async def test_long_legitimate_answer_with_table_and_code_is_not_cut(
    upstream: FakeUpstream, make_proxy, agent
) -> None:
    from tests.unit.response.test_degenerate import LEGIT

    progress: dict[str, Any] = {"written": 0, "closed": asyncio.Event()}
    pieces = [LEGIT[i : i + 5] for i in range(0, len(LEGIT), 5)]
    upstream.handler = text_handler(pieces, progress)
    base = await make_proxy()
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "fix it"}], "stream": True})
    async with agent.post(base + CHAT, data=body) as r:
        got = await r.read()
    expected = (
        ev(chunk(ROLE))
        + b"".join(ev(chunk({"content": p})) for p in pieces)
        + ev(chunk(finish="stop"))
        + b"data: [DONE]\n\n"
    )
    assert got == expected
    assert progress["written"] == len(pieces)


async def test_degenerate_json_is_reported_not_changed(upstream: FakeUpstream, make_proxy, agent) -> None:
    raw = orjson.dumps(completion(content="I will check again. " * 50))

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.Response(body=raw, content_type="application/json")

    upstream.handler = handler
    base = await make_proxy()
    async with agent.post(base + CHAT, data=b'{"model":"m","messages":[]}') as r:
        assert await r.read() == raw
    snap = await snapshot(base)
    assert (snap["responses_cut"], snap["per_rule"]) == (0, {"degenerate_text": 1})


# --- disconnects ----------------------------------------------------------------------------------------


async def raw_post(base: str, body: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", int(base.rsplit(":", 1)[1]))
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return reader, writer


@pytest.mark.parametrize(
    "when",
    ["before_the_first_byte", "mid_stream", "json_being_buffered"],
)
async def test_agent_disconnect_closes_the_upstream_within_a_second(
    upstream: FakeUpstream, make_proxy, when: str
) -> None:
    sent = asyncio.Event()
    closed = asyncio.Event()
    content = ev(chunk({"content": "Looking."}))

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        json_mode = when == "json_being_buffered"
        ctype = "application/json" if json_mode else "text/event-stream"
        resp = web.StreamResponse(headers={"Content-Type": ctype})
        await resp.prepare(request)
        try:
            if json_mode:
                await resp.write(b'{"id": "chatcmpl-1", "choices": [')
            else:
                if when == "mid_stream":
                    await resp.write(content)
                # a call delta: held by the proxy, so nothing of it reaches the agent
                await resp.write(ev(chunk(calls(tc(0, "call_a", "read_file", '{"pa', type_=True)))))
            sent.set()
            await asyncio.Event().wait()  # generating, until the proxy hangs up
        finally:
            closed.set()
        return resp

    upstream.handler = handler
    base = await make_proxy()
    reader, writer = await raw_post(base, orjson.dumps({"model": "m", "messages": [], "stream": True}))
    await asyncio.wait_for(sent.wait(), 2)
    if when == "mid_stream":
        buf = b""
        while content not in buf:
            data = await asyncio.wait_for(reader.read(65536), 2)
            assert data
            buf += data
        assert b"call_a" not in buf
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    writer.close()
    await asyncio.wait_for(closed.wait(), 2)
    assert loop.time() - t0 < 1.0


# --- byte-exact passthrough -------------------------------------------------------------------------------


def chunked_writes(raw: bytes) -> list[bytes]:
    """Irregular write boundaries: inside events, inside CRLF, inside multi-byte characters."""
    sizes = [1, 7, 2, 13, 3, 64, 5]
    out, i, k = [], 0, 0
    while i < len(raw):
        out.append(raw[i : i + sizes[k % len(sizes)]])
        i += sizes[k % len(sizes)]
        k += 1
    return out


@pytest.mark.parametrize("quirk", QUIRKS, ids=[q.name for q in QUIRKS])
async def test_quirky_streams_pass_byte_exact_when_nothing_is_decided(
    upstream: FakeUpstream, make_proxy, agent, quirk: Quirk
) -> None:
    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        for part in chunked_writes(quirk.raw):
            await resp.write(part)
            await asyncio.sleep(0)
        await resp.write_eof()
        return resp

    upstream.handler = handler
    base = await make_proxy()
    body = orjson.dumps({"model": "m", "messages": repeated_call_messages(2), "stream": True})
    async with agent.post(base + CHAT, data=body) as r:
        assert r.headers["Content-Type"] == "text/event-stream; charset=utf-8"
        got = await r.read()
    assert got == quirk.raw
    snap = await snapshot(base)
    assert (snap["stops"], snap["responses_cut"], snap["internal_errors"]) == (0, 0, 0)


async def test_json_with_calls_passes_byte_exact_with_its_headers(
    upstream: FakeUpstream, make_proxy, agent
) -> None:
    raw = (
        b'{ "id":"chatcmpl-1","object":"chat.completion", "choices":[{"index":0,'
        b'"message":{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"read_file",'
        b'"arguments":"{\\"path\\": \\"\\u00e9.py\\"}"}}]},"finish_reason":"tool_calls"}] }\n'
    )

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.Response(body=raw, headers={"Content-Type": "application/json", "X-Up": "1"})

    upstream.handler = handler
    base = await make_proxy()
    async with agent.post(
        base + CHAT, data=orjson.dumps({"model": "m", "messages": repeated_call_messages(3)})
    ) as r:
        assert await r.read() == raw
        assert r.headers["Content-Length"] == str(len(raw))
        assert r.headers["X-Up"] == "1"


async def test_gzip_answer_passes_untouched_even_when_it_would_be_stopped(
    upstream: FakeUpstream, make_proxy, agent
) -> None:
    packed = gzip.compress(orjson.dumps(completion([tool_call("read_file", '{"path": "app.py"}', "call_9")])))

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.Response(
            body=packed, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"}
        )

    upstream.handler = handler
    base = await make_proxy()
    body = orjson.dumps({"model": "m", "messages": repeated_call_messages(8)})
    async with agent.post(base + CHAT, data=body, headers={"Accept-Encoding": "gzip"}) as r:
        assert await r.read() == packed
    assert (await snapshot(base))["stops"] == 0


# --- the SDK parses every rewritten response ------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_sdk_parses_a_stop_after_content(upstream: FakeUpstream, sdk, stream: bool) -> None:
    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        calls_ = [tool_call("read_file", '{"path": "app.py"}', "call_9")]
        if not stream:
            answer = completion(calls_, content="Once more.")
            return web.json_response(answer, dumps=lambda o: orjson.dumps(o).decode())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for e in sse_events(calls_, content="Once more."):
            await resp.write(e)
        await resp.write_eof()
        return resp

    upstream.handler = handler
    client = await sdk(NO_LADDER)
    msg, finish = await turn(client, repeated_call_messages(8), stream)
    assert (msg, finish) == ({"role": "assistant", "content": "Once more.\n\n" + STOP_TEXT}, "stop")


async def test_sdk_parses_a_runaway_cut_of_40_calls(upstream: FakeUpstream, sdk) -> None:
    events = [ev(chunk(ROLE))] + [
        ev(chunk(calls(tc(0, f"c{i}", "grep", {"q": i}, type_=True)))) for i in range(40)
    ]  # Ollama style: all at index 0, arguments as objects

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for e in events:
            await resp.write(e)
        await resp.write(ev(chunk(finish="tool_calls")) + b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    upstream.handler = handler
    client = await sdk()
    msg, finish = await turn(client, [{"role": "user", "content": "go"}], stream=True)
    assert finish == "tool_calls"
    assert [(c["id"], c["function"]["arguments"]) for c in msg["tool_calls"]] == [
        (f"c{i}", f'{{"q":{i}}}') for i in range(32)
    ]


# --- fail open ------------------------------------------------------------------------------------------


async def test_stream_guard_bug_fails_open_with_the_exact_bytes(
    upstream: FakeUpstream, make_proxy, agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = proxy.response.stream_guard.StreamGuard._event
    seen = {"n": 0}

    def flaky(self: Any, e: Any, out: Any) -> None:
        seen["n"] += 1
        if seen["n"] == 3:  # while a call delta is held
            raise RuntimeError("guard bug")
        original(self, e, out)

    monkeypatch.setattr(proxy.response.stream_guard.StreamGuard, "_event", flaky)
    raw = b"".join(sse_events([tool_call("read_file", ARGS, "call_1")], content="Looking at it."))

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for part in chunked_writes(raw):
            await resp.write(part)
            await asyncio.sleep(0)
        await resp.write_eof()
        return resp

    upstream.handler = handler
    base = await make_proxy()
    body = orjson.dumps({"model": "m", "messages": repeated_call_messages(8), "stream": True})
    async with agent.post(base + CHAT, data=body) as r:
        assert await r.read() == raw
    snap = await snapshot(base)
    assert (snap["internal_errors"], snap["stops"]) == (1, 0)


async def test_json_decision_bug_fails_open(
    upstream: FakeUpstream, make_proxy, agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*a: Any, **k: Any) -> Any:
        raise RuntimeError("bug")

    monkeypatch.setattr(proxy.edge.relay, "decide_json", boom)
    base = await make_proxy()
    body = orjson.dumps({"model": "m", "messages": repeated_call_messages(8)})
    async with agent.post(base + CHAT, data=body) as r:
        answer = await r.json()
    assert answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "read_file"
    assert (await snapshot(base))["internal_errors"] == 1


async def test_response_side_off_relays_everything(upstream: FakeUpstream, make_proxy, agent) -> None:
    progress: dict[str, Any] = {"written": 0, "closed": asyncio.Event()}
    upstream.handler = runaway_handler(50, progress)
    base = await make_proxy(
        {
            "stop": {"after_ignored_denials": 0, "on_cap": False},
            "response": {
                "max_calls_per_response": 0,
                "max_identical_per_response": 0,
                "max_identical_reads_per_response": 0,
                "degenerate_text": {"enabled": False},
            },
        }
    )
    body = orjson.dumps({"model": "m", "messages": [], "stream": True})
    async with agent.post(base + CHAT, data=body) as r:
        got = await r.read()
    assert got.count(b'"id":"call_') == 50
    assert progress["written"] == 50
