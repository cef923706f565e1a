"""The official ``anthropic`` SDK as an unmodified agent loop on the Messages API, through the real
proxy, against a fake upstream that answers Messages-shaped JSON (the request side).

The agent keeps its own ``messages`` and never sees a reminder or a denial; the upstream sees the
reminders as ``text`` blocks right after the ``tool_result`` blocks of the steps that reached a
threshold, and denials in place of the withheld results, at the exact calls, re-applied at the
same places on every later request. Thinking blocks (with their signatures), ``cache_control``
and ``is_error`` reach it as the agent sent them. A conversation without a loop reaches the
upstream byte for byte, headers (``x-api-key``, ``anthropic-version``, ``anthropic-beta``)
included. ``messages.stream``: the upstream receives the rewritten request and the SDK reads the
fake's SSE answer (the answer side is pinned in tests/unit/response/test_messages_answer.py).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import httpx2
import orjson
from aiohttp import web
from anthropic import AsyncAnthropic

from proxy.guards.circuit_breaker import DUPLICATE_TEXT
from proxy.guards.repeat_reminder import DETAILED_TEXT, GENTLE_TEXT
from tests.conftest import ProxyFactory
from tests.helpers.fakes import FakeUpstream, only_guard
from tests.helpers.messages_blocks import message_events

RESULT = "print('hi')"
STEPS = 9  # requests 0..8; request k carries k steps
TOOLS = [
    {
        "name": "read_file",
        "description": "Read a file",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
    {"name": "ls", "description": "List files", "input_schema": {"type": "object", "properties": {}}},
]
THINKING = {"type": "thinking", "thinking": "I will read it.", "signature": "EqQBCgIYAhIM1gbcDa9GJwZAsig=="}
#: Sent with every request besides the SDK's own (``authorization``, ``anthropic-version``).
HEADERS = {"anthropic-beta": "interleaved-thinking-2025-05-14", "x-api-key": "sk-ant-key-test"}


def reminder_text(count: int) -> str:
    if count == 3:
        return GENTLE_TEXT
    return DETAILED_TEXT.format(tool="read_file", count=count, arguments='{"path":"app.py"}')


def answer(n: int, blocks: list[dict[str, Any]]) -> bytes:
    return orjson.dumps(
        {
            "id": f"msg_{n}",
            "type": "message",
            "role": "assistant",
            "model": "claude-fake",
            "content": blocks,
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 5},
        }
    )


def model(calls_for: Any) -> Any:
    """A fake Messages model: its answer to a request whose history holds ``n`` assistant
    messages is a thinking block and the ``tool_use`` blocks ``calls_for(n)``."""

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        n = sum(1 for m in orjson.loads(body)["messages"] if m["role"] == "assistant")
        return web.Response(body=answer(n, [THINKING, *calls_for(n)]), content_type="application/json")

    return handler


def read(n: int, path: str = "app.py", suffix: str = "") -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{n + 1}{suffix}", "name": "read_file", "input": {"path": path}}


class Sent:
    """What the agent sent on each request: its history, and the SDK's exact bytes and headers."""

    def __init__(self) -> None:
        self.histories: list[list[dict[str, Any]]] = []
        self.bodies: list[bytes] = []
        self.headers: list[dict[str, str]] = []
        self.stop_reasons: list[str | None] = []  # of each answer the agent got

    async def hook(self, request: httpx2.Request) -> None:
        self.bodies.append(request.content)
        self.headers.append({k.lower(): v for k, v in request.headers.items()})


def results_for(blocks: list[Any]) -> list[dict[str, Any]]:
    """The agent's tool results for an answer's ``tool_use`` blocks: ``ls`` fails (``is_error``),
    the last result carries the prompt-cache breakpoint, as Claude Code puts it."""
    out: list[dict[str, Any]] = []
    for b in blocks:
        if b["type"] != "tool_use":
            continue
        r: dict[str, Any] = {"type": "tool_result", "tool_use_id": b["id"], "content": RESULT}
        if b["name"] == "ls":
            r = {**r, "content": [{"type": "text", "text": "ls: permission denied"}], "is_error": True}
        out.append(r)
    out[-1] = {**out[-1], "cache_control": {"type": "ephemeral"}}
    return out


async def run_agent(base: str, steps: int = STEPS) -> Sent:
    """The agent loop for ``steps`` requests (``messages.create``, non-streaming, with tools)."""
    rec = Sent()
    http = httpx2.AsyncClient(event_hooks={"request": [rec.hook]})
    client = AsyncAnthropic(
        base_url=base, api_key="sk-ant-test", max_retries=0, http_client=http, default_headers=HEADERS
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Read app.py"}]
    try:
        for _ in range(steps):
            rec.histories.append(copy.deepcopy(messages))
            msg = await client.messages.create(
                model="claude-fake", max_tokens=1024, tools=TOOLS, messages=messages
            )  # type: ignore[arg-type]
            rec.stop_reasons.append(msg.stop_reason)
            blocks = [b.model_dump(exclude_none=True) for b in msg.content]
            messages.append({"role": "assistant", "content": blocks})
            if msg.stop_reason != "tool_use":  # the turn ended (loopguard's stop)
                break
            messages.append({"role": "user", "content": results_for(blocks)})
    finally:
        await client.close()
        await http.aclose()
    kept = messages if rec.stop_reasons[-1] == "tool_use" else messages[:-1]  # but loopguard's stop
    assert all("[loopguard]" not in orjson.dumps(m).decode() for m in kept)  # the agent's own history
    assert len(rec.bodies) == steps
    return rec


def assert_same_headers(got: dict[str, str], want: dict[str, str], body: bytes) -> None:
    got = {h.lower(): v for h, v in got.items()}
    want = {h: v for h, v in want.items() if h not in ("connection", "keep-alive")}
    assert got.keys() == want.keys()
    same = [h for h in want if h not in ("host", "content-length", "accept-encoding")]
    assert {h: got[h] for h in same} == {h: want[h] for h in same}
    # the response side reads the answer, so the upstream is asked for it uncompressed
    # (the SDK's own value depends on which decoders httpx finds installed: gzip at least)
    assert ("gzip" in want["accept-encoding"], got["accept-encoding"]) == (True, "identity")
    assert got["content-length"] == str(len(body))
    for name in ("x-api-key", "authorization", "anthropic-version", "anthropic-beta"):
        assert got[name] == want[name], name  # passed through untouched
    assert (got["x-api-key"], got["authorization"]) == ("sk-ant-key-test", "Bearer sk-ant-test")


async def test_sdk_reminders_are_text_blocks_after_the_results_at_3_5_8(
    upstream: FakeUpstream, make_proxy: ProxyFactory
) -> None:
    upstream.handler = model(lambda n: [read(n)])
    base = await make_proxy(only_guard("repeat_reminder"))
    sent = await run_agent(base)
    bodies = [rec.json() for rec in upstream.requests]
    for k, (history, body) in enumerate(zip(sent.histories, bodies, strict=True)):
        want = copy.deepcopy(history)
        for t in (3, 5, 8):
            if t <= k:  # step t's results are message 2t: the reminder right after them
                want[2 * t]["content"].append({"type": "text", "text": reminder_text(t)})
        assert body["messages"] == want, f"request {k}"
        assert body["tools"] == TOOLS
    final = bodies[8]["messages"]
    assert len(final) == 17  # no message inserted
    assert [[b["type"] for b in final[i]["content"]] for i in (6, 10, 16)] == [["tool_result", "text"]] * 3
    assert final[6]["content"][0]["tool_use_id"] == "toolu_3"
    assert final[6]["content"][0]["cache_control"] == {"type": "ephemeral"}  # kept on its block
    assert "- consecutive_calls: 8\n" in final[16]["content"][1]["text"]
    assert all(m["content"][0] == THINKING for m in final if m["role"] == "assistant")
    for k in range(STEPS):  # requests 0-2: byte for byte; the others differ by the reminders only
        assert (upstream.requests[k].body == sent.bodies[k]) is (k < 3), k
        assert_same_headers(upstream.requests[k].headers, sent.headers[k], upstream.requests[k].body)
    for k in range(1, STEPS):  # each request extends the previous one
        assert bodies[k]["messages"][: len(bodies[k - 1]["messages"])] == bodies[k - 1]["messages"], k


async def test_sdk_withheld_result_is_the_exact_parallel_call(
    upstream: FakeUpstream, make_proxy: ProxyFactory
) -> None:
    """Parallel ``tool_use``: read_file app.py and ls (exempt, failing) in every answer; from the
    7th read_file its result (the first ``tool_result`` block) is the denial text, ls's result
    and its ``is_error`` untouched, the cache breakpoint where the agent put it."""
    ls = {"type": "tool_use", "name": "ls", "input": {}}
    upstream.handler = model(lambda n: [read(n), {**ls, "id": f"toolu_{n + 1}_ls"}])
    config = only_guard("circuit_breaker", progress_aware=False, duplicate_limit=6, exempt=["ls"])
    base = await make_proxy(config)
    sent = await run_agent(base)
    bodies = [rec.json() for rec in upstream.requests]
    denial = DUPLICATE_TEXT.format(tool="read_file", count=7, limit=6)
    for k, (history, body) in enumerate(zip(sent.histories, bodies, strict=True)):
        want = copy.deepcopy(history)
        for t in range(7, k + 1):  # the 7th and later read_file results
            count = t
            want[2 * t]["content"][0]["content"] = DUPLICATE_TEXT.format(
                tool="read_file", count=count, limit=6
            )
        assert body["messages"] == want, f"request {k}"
    final = bodies[8]["messages"]
    assert final[14]["content"][0] == {"type": "tool_result", "tool_use_id": "toolu_7", "content": denial}
    assert final[14]["content"][1] == {
        "type": "tool_result",
        "tool_use_id": "toolu_7_ls",
        "content": [{"type": "text", "text": "ls: permission denied"}],
        "is_error": True,
        "cache_control": {"type": "ephemeral"},
    }
    assert [m["content"][0]["content"] for m in final[2:13:2]] == [RESULT] * 6  # calls 1-6 ran
    assert [upstream.requests[k].body == sent.bodies[k] for k in range(STEPS)] == [True] * 7 + [False] * 2
    # two withheld results ignored: the 9th answer is loopguard's stop (stop.after_ignored_denials)
    assert sent.stop_reasons == ["tool_use"] * 8 + ["end_turn"]


async def test_sdk_conversation_without_a_loop_arrives_byte_for_byte(
    upstream: FakeUpstream, make_proxy: ProxyFactory
) -> None:
    upstream.handler = model(lambda n: [read(n, f"src/file{n}.py")])
    base = await make_proxy()  # the shipped defaults, every guard on
    sent = await run_agent(base)
    assert [r.body for r in upstream.requests] == sent.bodies
    for rec, headers in zip(upstream.requests, sent.headers, strict=True):
        assert rec.path_qs == "/v1/messages"
        assert_same_headers(rec.headers, headers, rec.body)


async def test_sdk_stream_request_is_rewritten_and_the_answer_read(
    upstream: FakeUpstream, make_proxy: ProxyFactory
) -> None:
    """``messages.stream`` with a history of seven identical calls: the upstream receives the
    reminders and the denial; the SDK reads the fake's SSE text answer to its end."""
    history: list[dict[str, Any]] = [{"role": "user", "content": "Read app.py"}]
    for n in range(7):
        history.append({"role": "assistant", "content": [THINKING, read(n)]})
        history.append({"role": "user", "content": results_for([read(n)])})

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for ev in message_events({"content": "Done reading."}, "msg_stream"):
            await resp.write(ev)
        await resp.write_eof()
        return resp

    upstream.handler = handler
    config = only_guard("repeat_reminder")
    config["guards"]["circuit_breaker"] = {"enabled": True, "progress_aware": False, "duplicate_limit": 6}
    base = await make_proxy(config)
    client = AsyncAnthropic(base_url=base, api_key="sk-ant-test", max_retries=0)
    try:
        async with client.messages.stream(
            model="claude-fake",
            max_tokens=1024,
            tools=TOOLS,  # type: ignore[arg-type]
            messages=history,  # type: ignore[arg-type]
        ) as stream:
            final = await stream.get_final_message()
    finally:
        await client.close()
    assert [b.type for b in final.content] == ["text"]
    assert final.content[0].text == "Done reading."  # type: ignore[union-attr]
    (got,) = [json.loads(r.body) for r in upstream.requests]
    assert got["stream"] is True
    want = copy.deepcopy(history)
    for t in (3, 5):
        want[2 * t]["content"].append({"type": "text", "text": reminder_text(t)})
    want[14]["content"][0]["content"] = DUPLICATE_TEXT.format(tool="read_file", count=7, limit=6)
    assert got["messages"] == want


async def test_the_proxys_own_errors_on_messages_have_anthropics_form(make_proxy: ProxyFactory) -> None:
    """An upstream that is down: a 502 whose body is Anthropic's error object, which the SDK
    reads into ``APIStatusError.body`` / ``.type`` (on chat paths the body stays OpenAI's)."""
    import anthropic

    from tests.e2e.test_forwarding import closed_port

    base = await make_proxy(upstream_url=f"http://127.0.0.1:{closed_port()}/v1")
    client = AsyncAnthropic(base_url=base, api_key="sk-ant-test", max_retries=0)
    try:
        try:
            await client.messages.create(
                model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
            )
        except anthropic.APIStatusError as exc:
            err = exc
        else:
            raise AssertionError("no error raised")
    finally:
        await client.close()
    assert err.status_code == 502
    assert err.body == {
        "type": "error",
        "error": {
            "type": "upstream_unreachable",
            "message": err.body["error"]["message"],  # type: ignore[index]
        },
    }
    assert err.body["error"]["message"].startswith("loopguard: upstream http://127.0.0.1:")  # type: ignore[index]
