"""circuit_breaker end to end (DESIGN §6.2): the official ``openai`` SDK as an unmodified agent loop
against the real proxy in front of a fake looping model; retries, restarts, a broken incident log."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from openai import AsyncOpenAI
from structlog.testing import capture_logs

from proxy.edge.keys import INCIDENTS_KEY
from proxy.guards.circuit_breaker import DUPLICATE_TEXT
from proxy.request.conversation import conversation_key, key_digest
from tests.helpers.fakes import FakeUpstream
from tests.helpers.proxy_server import serve

RESULT = "print('hi')"
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
#: Upstream message indexes of the tool results of calls 7–20 in a 20-call loop with the default
#: config: reminders (user messages) sit at 7, 12 and 19, after the results of calls 3, 5 and 8.
WITHHELD = [16, 18, 21, 23, 25, 27, 29, 31, 33, 35, 37, 39, 41, 43]
KEPT = [2, 4, 6, 9, 11, 14]


async def ask(client: AsyncOpenAI, messages: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
    """One model turn through the SDK; the assistant message as the agent appends it."""
    if not stream:
        resp = await client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
        return resp.choices[0].message.model_dump(exclude_none=True)
    calls: dict[int, dict[str, Any]] = {}
    chunks = await client.chat.completions.create(model="m", messages=messages, stream=True)  # type: ignore[arg-type]
    async for chunk in chunks:
        if not chunk.choices:
            continue
        for d in chunk.choices[0].delta.tool_calls or []:
            c = calls.setdefault(
                d.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
            )
            c["id"] = d.id or c["id"]
            if d.function:
                c["function"]["name"] += d.function.name or ""
                c["function"]["arguments"] += d.function.arguments or ""
    return {"role": "assistant", "content": None, "tool_calls": [calls[i] for i in sorted(calls)]}


async def agent_loop(
    client: AsyncOpenAI, turns: int, stream: bool, messages: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """The agent: ask, run every tool call (always the same output), repeat ``turns`` times."""
    messages = messages if messages is not None else [{"role": "user", "content": "Read app.py"}]
    for _ in range(turns):
        msg = await ask(client, messages, stream)
        messages.append(msg)
        for tc in msg.get("tool_calls", []):
            messages.append({"role": "tool", "tool_call_id": tc["id"], "content": RESULT})
    return messages


async def stats(base: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(f"{base}/loop-guard") as r:
        return await r.json()


def lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_sdk_loop_20_calls(upstream: FakeUpstream, make_proxy, tmp_path: Path, stream: bool) -> None:
    path = tmp_path / "incidents.jsonl"
    # The response-side stop would end this loop at call 9 (tests/e2e/test_response_e2e.py): off here.
    # The escalation ladder would withhold call 6 first (tests/unit/guards/test_escalation.py): off here too.
    base = await make_proxy(
        {
            "guards": {"circuit_breaker": {"incident_log": str(path)}, "escalation": {"enabled": False}},
            "stop": {"after_ignored_denials": 0},
        }
    )
    client = AsyncOpenAI(
        base_url=f"{base}/v1", api_key="sk-test", default_headers={"x-session-id": "agent-7"}
    )
    messages = await agent_loop(client, 21, stream)
    await client.close()

    assert len(upstream.requests) == 21
    assert all(r.json().get("stream", False) is stream for r in upstream.requests)
    sent = upstream.requests[20].json()["messages"]
    assert len(sent) == len(messages) - 2 + 3  # the 21st answer is not sent; 3 reminders are added
    assert [i for i, m in enumerate(sent) if m["role"] == "user"] == [0, 7, 12, 19]
    tool_msgs = {i: m["content"] for i, m in enumerate(sent) if m["role"] == "tool"}
    assert sorted(tool_msgs) == sorted(KEPT + WITHHELD)
    assert [tool_msgs[i] for i in KEPT] == [RESULT] * 6
    assert [tool_msgs[i] for i in WITHHELD] == [
        DUPLICATE_TEXT.format(tool="read_file", count=k, limit=6) for k in range(7, 21)
    ]
    # each earlier request is a prefix of the next one: earlier rewrites are re-derived in place
    for before, after in zip(upstream.requests[7:20], upstream.requests[8:21], strict=True):
        assert after.json()["messages"][: len(before.json()["messages"])] == before.json()["messages"]

    for _ in range(100):
        if path.exists():
            break
        await asyncio.sleep(0.01)
    (line,) = lines(path)
    assert TIME.match(line.pop("time"))
    assert line == {
        "kind": "duplicate",
        "tool": "read_file",
        "count": 7,
        "limit": 6,
        "agent": key_digest("agent-7"),
    }
    st = await stats(base)
    assert (st["results_withheld"], st["withhold_kinds"], st["reminders_injected"]) == (
        14,
        {"duplicate": 14},
        3,
    )
    assert [{k: v for k, v in i.items() if k != "time"} for i in st["incidents"]] == [line]


async def test_client_retry_sends_identical_bytes_and_no_second_incident(
    upstream: FakeUpstream, make_proxy, tmp_path: Path
) -> None:
    path = tmp_path / "incidents.jsonl"
    base = await make_proxy(
        {"guards": {"circuit_breaker": {"incident_log": str(path)}, "escalation": {"enabled": False}}}
    )
    client = AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test")
    messages = await agent_loop(client, 7, stream=False)
    await client.close()
    body = orjson.dumps({"model": "m", "messages": messages})
    async with aiohttp.ClientSession() as s:
        for _ in range(2):
            async with s.post(f"{base}/v1/chat/completions", data=body) as r:
                assert r.status == 200
    first, retry = upstream.requests[-2:]
    assert first.body == retry.body
    assert first.json()["messages"][16]["content"] == DUPLICATE_TEXT.format(
        tool="read_file", count=7, limit=6
    )
    st = await stats(base)
    assert st["withhold_kinds"] == {"duplicate": 2}  # counters count requests, retries included
    assert len(st["incidents"]) == 1
    for _ in range(100):
        if path.exists():
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    (line,) = lines(path)
    assert (line["kind"], line["count"], line["agent"]) == (
        "duplicate",
        7,
        conversation_key({}, {"messages": messages}, ()),
    )


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_restarted_proxy_rewrites_identically_and_logs_no_duplicate(
    upstream: FakeUpstream, tmp_path: Path, stream: bool
) -> None:
    path = tmp_path / "incidents.jsonl"
    config = {
        # the escalation ladder would withhold call 6 (tests/unit/guards/test_escalation.py): off here
        "guards": {"circuit_breaker": {"incident_log": str(path)}, "escalation": {"enabled": False}},
        "stop": {"after_ignored_denials": 0},  # the response-side stop would end the loop at 9
    }
    async with serve(config, upstream.url) as (base, _):
        client = AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test")
        messages = await agent_loop(client, 10, stream)  # the last request carries 9 calls
        await client.close()
    before = upstream.requests[-1]
    assert [r["count"] for r in lines(path)] == [7]

    async with serve(config, upstream.url) as (base, _):
        client = AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test")
        await ask(client, messages[:-2], stream)  # the agent resends its last request
        assert upstream.requests[-1].body == before.body  # the same rewrite, byte for byte
        await agent_loop(client, 3, stream, messages)  # requests carrying calls 1–10, 1–11, 1–12
        await client.close()
        assert (await stats(base))["incidents"] == []
    old = before.json()["messages"]
    for r in upstream.requests[-3:]:
        assert r.json()["messages"][: len(old)] == old
    assert upstream.requests[-1].json()["messages"][-1]["content"] == DUPLICATE_TEXT.format(
        tool="read_file", count=12, limit=6
    )
    assert [r["count"] for r in lines(path)] == [7]


async def test_unwritable_incident_log_does_not_affect_forwarding(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    path = tmp_path / "no-such-dir" / "incidents.jsonl"
    config = {"guards": {"circuit_breaker": {"incident_log": str(path), "duplicate_limit": 2}}}
    with capture_logs() as logs:
        async with serve(config, upstream.url) as (base, app):
            for agent in ("a", "b"):
                client = AsyncOpenAI(
                    base_url=f"{base}/v1", api_key="k", default_headers={"x-session-id": agent}
                )
                await agent_loop(client, 4, stream=agent == "b")
                await client.close()
                sent = upstream.requests[-1].json()["messages"]
                assert [m["content"] for m in sent if m["role"] == "tool"] == [
                    RESULT,
                    RESULT,
                    DUPLICATE_TEXT.format(tool="read_file", count=3, limit=2),
                ]
            st = await stats(base)
        assert app[INCIDENTS_KEY].write_errors == 2
    assert st["internal_errors"] == 0
    assert [i["agent"] for i in st["incidents"]] == [key_digest("a"), key_digest("b")]
    assert [e for e in logs if e["event"] == "incident_log_error"] == [
        {
            "event": "incident_log_error",
            "log_level": "error",
            "path": str(path),
            "error": "FileNotFoundError",
            "detail": "No such file or directory",
        }
    ]
    assert not path.parent.exists()
    requests = [e for e in logs if e["event"] == "request"]
    assert len(requests) == 8
    assert {e["status"] for e in requests} == {200}
