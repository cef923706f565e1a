"""turn_guard end to end (DESIGN §6.3): the official ``openai`` SDK as an unmodified agent loop against
the real proxy (the dsh-loop-guard profile) in front of a fake model stuck in a rewrite loop;
narration with the server's clock replaced; ``GET /loop-guard?conversation=``."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml
from aiohttp import web
from openai import AsyncOpenAI

from proxy.edge.keys import MEMORY_KEY
from proxy.guards.narration import render
from proxy.request.conversation import key_digest
from tests.helpers.fakes import FakeUpstream, completion, sse_events, tool_call
from tests.helpers.proxy_server import serve

ROOT = Path(__file__).resolve().parents[2]
PROFILE = yaml.safe_load((ROOT / "config/profiles/dsh-loop-guard.yaml").read_text())
#: The profile with the response side's stop switched off, so the request side is seen alone.
CONFIG = {**PROFILE, "stop": {"after_ignored_denials": 0, "on_cap": False}}
WROTE = "wrote fix.py"
CRASH = "Traceback (most recent call last):\n  File \"fix.py\", line 1\nNameError: name 'x' is not defined"
TRIP = (
    "[loopguard] The result of this call is withheld: this is call 6 on fix.py in this turn. "
    "The limit is 6 calls on the same target per turn (max_same_target). Stop calling tools now "
    "and answer the user in plain text: say what you tried, where you are stuck, and what the "
    "user must decide or provide before you go on."
)
MUTED = (
    "[loopguard] Result withheld: over the limit of 6 calls on the same target per turn again. "
    "Stop calling tools and answer the user."
)


async def rewrite_loop_model(request: web.Request, body: bytes) -> web.StreamResponse:
    """A model stuck in the rewrite loop: it rewrites fix.py five times (new content each time),
    then runs it, rewrites it, runs it, …"""
    req = orjson.loads(body)
    n = sum(1 for m in req["messages"] if m.get("role") == "assistant")
    if n < 5 or n % 2 == 0:
        call = tool_call(
            "write_file", orjson.dumps({"path": "fix.py", "content": f"x = {n}\n"}).decode(), f"w{n}"
        )
    else:
        call = tool_call("bash", '{"command": "python fix.py"}', f"b{n}")
    if req.get("stream"):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for ev in sse_events([call]):
            await resp.write(ev)
        await resp.write_eof()
        return resp
    return web.json_response(completion([call]), dumps=lambda o: orjson.dumps(o).decode())


async def ask(client: AsyncOpenAI, messages: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
    """One model turn through the SDK; the assistant message as the agent appends it."""
    if not stream:
        resp = await client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
        return resp.choices[0].message.model_dump(exclude_none=True)
    calls: dict[int, dict[str, Any]] = {}
    chunks = await client.chat.completions.create(model="m", messages=messages, stream=True)  # type: ignore[arg-type]
    async for chunk in chunks:
        for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            c = calls.setdefault(
                d.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
            )
            c["id"] = d.id or c["id"]
            if d.function:
                c["function"]["name"] += d.function.name or ""
                c["function"]["arguments"] += d.function.arguments or ""
    return {"role": "assistant", "content": None, "tool_calls": [calls[i] for i in sorted(calls)]}


async def agent_loop(client: AsyncOpenAI, messages: list[dict[str, Any]], steps: int, stream: bool) -> None:
    """The agent: ask, run each call (writes succeed, running fix.py crashes), ``steps`` times."""
    for _ in range(steps):
        msg = await ask(client, messages, stream)
        messages.append(msg)
        for tc in msg.get("tool_calls", []):
            result = WROTE if tc["function"]["name"] == "write_file" else CRASH
            messages.append({"role": "tool", "tool_call_id": tc["id"], "content": result})


async def get(base: str, path: str, token: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as s, s.get(base + path, headers=headers) as r:
        return r.status, await r.json()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_sdk_rewrite_loop_is_withheld_from_the_sixth_call_on_fix_py(
    upstream: FakeUpstream, make_proxy, stream: bool
) -> None:
    upstream.handler = rewrite_loop_model
    base = await make_proxy(CONFIG)
    client = AsyncOpenAI(
        base_url=f"{base}/v1", api_key="sk-test", default_headers={"x-session-id": "agent-4"}
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Make fix.py run"}]
    await agent_loop(client, messages, 9, stream)  # the 9th request carries calls 1-8
    await client.close()

    assert all("[loopguard]" not in orjson.dumps(m).decode() for m in messages)  # the agent's own history
    bodies = [r.json() for r in upstream.requests]
    assert len(bodies) == 9
    assert all(b.get("stream", False) is stream for b in bodies)
    tools = [m["content"] for m in bodies[8]["messages"] if m["role"] == "tool"]
    assert tools == [WROTE, WROTE, WROTE, WROTE, WROTE, TRIP, MUTED, MUTED]
    assert len(bodies[8]["messages"]) == len(messages) - 2  # nothing inserted; the 9th answer not sent
    for k in range(6):  # untouched requests reach the upstream as the agent sent them
        assert bodies[k]["messages"] == messages[: 1 + 2 * k]
    for before, after in itertools.pairwise(bodies):  # earlier trips are re-derived in place
        assert after["messages"][: len(before["messages"])] == before["messages"]

    status, ledger = await get(base, "/loop-guard?conversation=agent-4")
    assert status == 200
    assert ledger["conversation"] == key_digest("agent-4")
    assert (ledger["turn"], ledger["calls"], ledger["consecutive_failures"]) == (1, 8, 1)
    assert ledger["same_target"] == [
        {"target": "fix.py", "count": 8},
        {"target": "python fix.py", "count": 2},
    ]
    assert ledger["same_call"][0] == {"tool": "bash", "target": "python fix.py", "count": 2}
    assert ledger["trips"] == 3
    assert ledger["tripped"] == [
        {"call": n, "tool": tool, "limit": "max_same_target", "count": n, "value": 6}
        for n, tool in ((6, "bash"), (7, "write_file"), (8, "bash"))
    ]
    assert ledger["limits"] == {
        "max_same_call": 3,
        "max_same_target": 6,
        "max_failures": 5,
        "max_calls_per_turn": 40,
    }
    assert ledger["narration"]["reminders"] == 0 and ledger["narration"]["last"] is None
    _, st = await get(base, "/loop-guard")
    assert (st["results_withheld"], st["per_rule"], st["withhold_kinds"]) == (
        3,
        {"turn_guard": 3},
        {"same_target": 3},
    )


async def test_sdk_narration_with_the_server_clock_replaced(upstream: FakeUpstream) -> None:
    upstream.handler = rewrite_loop_model
    now = [1_700_000_000_000]
    config = {**CONFIG, "guards": {**CONFIG["guards"], "turn_guard": {**CONFIG["guards"]["turn_guard"]}}}
    config["guards"]["turn_guard"]["max_same_target"] = 0  # only narration acts in this test
    async with serve(config, upstream.url) as (base, app):
        app[MEMORY_KEY].clock = lambda: now[0]
        client = AsyncOpenAI(base_url=f"{base}/v1", api_key="k", default_headers={"x-session-id": "n1"})
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Make fix.py run"}]
        await agent_loop(client, messages, 3, stream=True)  # t = 0: turn seen, calls 1 and 2
        now[0] += 179_000
        await agent_loop(client, messages, 1, stream=False)
        assert [m["role"] for m in upstream.requests[-1].json()["messages"]].count("user") == 1
        now[0] += 1_000  # 180 s of silence
        await agent_loop(client, messages, 1, stream=True)
        sent = upstream.requests[-1].json()["messages"]
        narration = {"role": "user", "content": render(180_000)}
        assert sent[-1] == narration and sent[:-1] == messages[:-2]
        now[0] += 60_000
        await agent_loop(client, messages, 1, stream=False)
        again = upstream.requests[-1].json()["messages"]
        assert again[: len(sent)] == sent  # re-injected at the same position
        assert again.count(narration) == 1
        status, ledger = await get(base, "/loop-guard?conversation=n1")
        await client.close()
    assert status == 200
    assert ledger["narration"]["reminders"] == 1
    assert ledger["narration"]["last"] == {
        "time": "2023-11-14T22:16:20.000Z",
        "after": len(sent) - 2,
        "silent_s": 180,
    }
    assert ledger["narration"]["turn_started"] == "2023-11-14T22:13:20.000Z"


async def test_ledger_endpoint_404s_and_admin_token(upstream: FakeUpstream, make_proxy) -> None:
    upstream.handler = rewrite_loop_model
    base = await make_proxy({**CONFIG, "admin_token": "s3cret"})
    status, body = await get(base, "/loop-guard?conversation=nobody", "s3cret")
    assert status == 404
    assert body["error"]["message"] == (
        f"no turn_guard ledger for conversation {key_digest('nobody')} (unknown, expired, or turn_guard off; "
        "a fingerprinted conversation's first request, before its first tool call, is logged "
        "under the key its later lines name opened_as: ask for their conversation key)"
    )
    async with aiohttp.ClientSession() as s, s.get(base + "/loop-guard?conversation=nobody") as r:
        assert r.status == 401

    default = await make_proxy()  # turn_guard off: nothing is remembered
    client = AsyncOpenAI(base_url=f"{default}/v1", api_key="k", default_headers={"x-session-id": "a"})
    await agent_loop(client, [{"role": "user", "content": "go"}], 2, stream=False)
    await client.close()
    assert (await get(default, "/loop-guard?conversation=a"))[0] == 404
