"""The official ``openai`` SDK as an unmodified agent loop, through the real proxy, against the
default looping fake upstream (DESIGN §1.2, §6.1).

The agent keeps its own ``messages`` list and never sees a reminder; the upstream sees reminders
after calls 3, 5 and 8, re-injected at the same positions on every later request so each request
extends the previous one (the model server's prefix cache stays valid).
"""

from __future__ import annotations

import copy
from typing import Any

import httpx2
import orjson
import pytest
from openai import AsyncOpenAI

from proxy.guards.repeat_reminder import DETAILED_TEXT, GENTLE_TEXT
from tests.helpers.fakes import FakeUpstream, only_guard

RESULT = "print('hi')"
ARGS = '{"path": "app.py"}'
STEPS = 9  # requests 0..8; request k carries k steps


def reminder_text(count: int) -> str:
    if count == 3:
        return GENTLE_TEXT
    return DETAILED_TEXT.format(tool="read_file", count=count, arguments='{"path":"app.py"}')


async def next_assistant_message(client: AsyncOpenAI, messages: list[dict[str, Any]], stream: bool) -> dict:
    """One model turn, as an agent would record it in its history."""
    if not stream:
        resp = await client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
        return resp.choices[0].message.model_dump(exclude_none=True)
    chunks = await client.chat.completions.create(model="m", messages=messages, stream=True)  # type: ignore[arg-type]
    content = ""
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    async for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        delta = choice.delta
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            slot = calls.setdefault(
                tc.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
            )
            if tc.id:
                slot["id"] = tc.id
            if tc.function is not None:
                slot["function"]["name"] += tc.function.name or ""
                slot["function"]["arguments"] += tc.function.arguments or ""
    assert finish == "tool_calls"
    msg: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
    return msg


class Sent:
    """What the agent sent on each request: its history, and the SDK's exact bytes and headers."""

    def __init__(self) -> None:
        self.histories: list[list[dict[str, Any]]] = []
        self.bodies: list[bytes] = []
        self.headers: list[dict[str, str]] = []

    async def hook(self, request: httpx2.Request) -> None:
        self.bodies.append(request.content)
        self.headers.append({k.lower(): v for k, v in request.headers.items()})


async def run_agent(base: str, stream: bool) -> Sent:
    """Run the agent loop for STEPS requests; returns the agent's history as sent on each request
    (and checks the upstream got the SDK's own bytes where no guard acted)."""
    rec = Sent()
    http = httpx2.AsyncClient(event_hooks={"request": [rec.hook]})
    client = AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0, http_client=http)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Read app.py"}]
    try:
        for _ in range(STEPS):
            rec.histories.append(copy.deepcopy(messages))
            msg = await next_assistant_message(client, messages, stream)
            messages.append(msg)
            for tc in msg.get("tool_calls") or []:
                assert tc["function"] == {"name": "read_file", "arguments": ARGS}
                messages.append({"role": "tool", "tool_call_id": tc["id"], "content": RESULT})
    finally:
        await client.close()
        await http.aclose()
    # The agent's own history never contains a reminder.
    assert [i for i, m in enumerate(messages) if m["role"] == "user"] == [0]
    assert all("[loopguard]" not in orjson.dumps(m).decode() for m in messages)
    assert all(m["content"] == RESULT for m in messages if m["role"] == "tool")
    assert len(rec.bodies) == STEPS
    return rec


def expected_upstream(agent_messages: list[dict[str, Any]], inject_as: str) -> list[dict[str, Any]]:
    """What the upstream must receive for one request: the agent's messages plus a reminder after
    the tool result of every step that reached 3, 5 or 8 (step t's result is at index 2t)."""
    out = copy.deepcopy(agent_messages)
    steps = (len(out) - 1) // 2
    for t in sorted((t for t in (3, 5, 8) if t <= steps), reverse=True):
        if inject_as == "user":
            out.insert(2 * t + 1, {"role": "user", "content": reminder_text(t)})
        else:
            out[2 * t]["content"] = f"{out[2 * t]['content']}\n\n{reminder_text(t)}"
    return out


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_sdk_agent_loop_reminders_at_3_5_8(upstream: FakeUpstream, make_proxy, stream: bool) -> None:
    base = await make_proxy(only_guard("repeat_reminder"))
    sent = await run_agent(base, stream)
    assert len(upstream.requests) == STEPS
    bodies = [rec.json() for rec in upstream.requests]
    for k, (agent_msgs, body) in enumerate(zip(sent.histories, bodies, strict=True)):
        assert body.get("stream", False) is stream
        assert body["messages"] == expected_upstream(agent_msgs, "user"), f"request {k}"

    positions = [[i for i, m in enumerate(b["messages"]) if m["role"] == "user" and i > 0] for b in bodies]
    assert positions == [[], [], [], [7], [7], [7, 12], [7, 12], [7, 12], [7, 12, 19]]
    final = bodies[8]["messages"]
    assert final[7]["content"] == GENTLE_TEXT
    assert "- tool: read_file\n" in final[12]["content"]
    assert "- consecutive_calls: 5\n" in final[12]["content"]
    assert "- consecutive_calls: 8\n" in final[19]["content"]
    assert '- arguments: {"path":"app.py"}\n' in final[19]["content"]
    # Each reminder sits right after the tool result of the step that reached the threshold.
    assert [final[i - 1]["tool_call_id"] for i in (7, 12, 19)] == ["call_3", "call_5", "call_8"]

    # Requests untouched by the guards (0-2) reach the upstream byte for byte; the others differ
    # exactly by the reminders. Headers: the SDK's own, minus hop-by-hop ones.
    for k in range(STEPS):
        assert (upstream.requests[k].body == sent.bodies[k]) is (k < 3), k
        got = {h.lower(): v for h, v in upstream.requests[k].headers.items()}
        want = {h: v for h, v in sent.headers[k].items() if h not in ("connection", "keep-alive")}
        assert got.keys() == want.keys()
        same = [h for h in want if h not in ("host", "content-length", "accept-encoding")]
        assert {h: got[h] for h in same} == {h: want[h] for h in same}
        # the response side reads the answer, so the upstream is asked for it uncompressed (the
        # SDK's own value depends on which decoders httpx finds installed: gzip at least)
        assert ("gzip" in want["accept-encoding"], got["accept-encoding"]) == (True, "identity")
        assert got["content-length"] == str(len(upstream.requests[k].body))
        assert got["authorization"] == "Bearer sk-test"

    # Each request extends the previous one: same messages at the same positions, byte-identical
    # up to the new step (the earlier reminders are re-injected where they were).
    for k in range(1, STEPS):
        prev, cur = bodies[k - 1]["messages"], bodies[k]["messages"]
        assert [orjson.dumps(m) for m in cur[: len(prev)]] == [orjson.dumps(m) for m in prev], k
        prev_raw, cur_raw = upstream.requests[k - 1].body, upstream.requests[k].body
        # The SDK serializes compactly, as the proxy does, so the bytes line up from request 1 on.
        end = prev_raw.rindex(orjson.dumps(prev[-1])) + len(orjson.dumps(prev[-1]))
        assert cur_raw[:end] == prev_raw[:end], k


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_sdk_agent_loop_tool_suffix(upstream: FakeUpstream, make_proxy, stream: bool) -> None:
    base = await make_proxy(only_guard("repeat_reminder", inject_as="tool_suffix"))
    sent = await run_agent(base, stream)
    bodies = [rec.json() for rec in upstream.requests]
    for k, (agent_msgs, body) in enumerate(zip(sent.histories, bodies, strict=True)):
        msgs = body["messages"]
        assert len(msgs) == len(agent_msgs), f"request {k}: no message may be inserted"
        assert [i for i, m in enumerate(msgs) if m["role"] == "user"] == [0]
        assert msgs == expected_upstream(agent_msgs, "tool_suffix"), f"request {k}"
    final = bodies[8]["messages"]
    assert final[6]["content"] == f"{RESULT}\n\n{GENTLE_TEXT}"
    assert final[10]["content"].endswith(reminder_text(5))
    assert final[16]["content"].endswith(reminder_text(8))
    assert "- consecutive_calls: 8\n" in final[16]["content"]
    untouched = [i for i in range(2, 17, 2) if i not in (6, 10, 16)]
    assert all(final[i]["content"] == RESULT for i in untouched)
    for k in range(1, STEPS):
        prev, cur = bodies[k - 1]["messages"], bodies[k]["messages"]
        assert cur[: len(prev)] == prev, k
