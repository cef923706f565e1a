"""The loop rules (DESIGN §6.5) end to end: the real server in front of a fake model, the official ``openai``
SDK as the agent. The monologue stop ends an agent's loop (streaming and not); a fresh action of a
new rule is counted under its own name in ``GET /loop-guard``; the upstream sees the reminders."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest
from openai import AsyncOpenAI

from proxy.guards.cycles import WITHHOLD_TEXT
from proxy.response.decide import MONOLOGUE_TEXT
from tests.helpers.agent_steps import History
from tests.helpers.fakes import FakeUpstream, scripted_model, tool_call
from tests.helpers.sdk_agent import agent_loop as shared_agent_loop
from tests.helpers.sdk_agent import snapshot, turn

SAME = "Let me look at the configuration once more."
RESULT = "debug: false"


def monologue_model(request_stream: bool) -> Any:
    """A model that always says the same sentence and reads a new file each time (so that no
    call-based rule fires)."""
    return scripted_model(
        lambda n: [tool_call("read_file", orjson.dumps({"path": f"conf{n}.yaml"}).decode(), f"call_{n + 1}")],
        content=SAME,
    )


async def agent_loop(
    client: AsyncOpenAI, stream: bool, max_steps: int = 12
) -> tuple[list[dict[str, Any]], int, str]:
    return await shared_agent_loop(
        client, stream, max_steps, result=RESULT, prompt="Why does the app start in debug mode?"
    )


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_monologue_reminder_then_stop_ends_the_agent_loop(
    upstream: FakeUpstream, sdk, stream: bool
) -> None:
    upstream.handler = monologue_model(stream)
    client = await sdk()
    messages, steps, finish = await agent_loop(client, stream)
    # answers 1-3 run (the reminder goes after the 3rd step's result), the 4th is stopped
    assert (steps, finish) == (4, "stop")
    assert messages[-1] == {"role": "assistant", "content": f"{SAME}\n\n{MONOLOGUE_TEXT.format(count=4)}"}
    assert sum(1 for m in messages if m["role"] == "tool") == 3
    fourth_request = upstream.requests[3].json()["messages"]
    assert fourth_request[-1]["role"] == "user"
    assert fourth_request[-1]["content"].startswith(
        "[loopguard] Your last 3 messages said exactly the same thing:\n"
        '  "Let me look at the configuration once more."'
    )
    snap = await snapshot(client.base)
    assert (snap["per_rule"].get("monologue"), snap["per_rule"].get("stop"), snap["stops"]) == (1, 1, 1)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_monologue_stop_off(upstream: FakeUpstream, sdk, stream: bool) -> None:
    upstream.handler = monologue_model(stream)
    client = await sdk({"guards": {"monologue": {"stop_at": 0}}})
    _, steps, finish = await agent_loop(client, stream, max_steps=6)
    assert (steps, finish) == (6, "tool_calls")


async def test_cycle_withhold_counted_under_its_rule(upstream: FakeUpstream, make_proxy) -> None:
    grep_a = ("bash", {"command": 'grep -rn "class X" .'}, "x.py:1:class X")
    grep_b = ("bash", {"command": 'grep -rn "class X" --include=*.py .'}, "x.py:1:class X")
    h = History().steps([grep_a, grep_b] * 4)
    base = await make_proxy()
    async with aiohttp.ClientSession() as s, s.post(base + "/v1/chat/completions", data=h.body()) as r:
        assert r.status == 200
    sent = upstream.requests[-1].json()["messages"]
    withheld = WITHHOLD_TEXT.format(period=2, cycle="bash → bash", count=4)
    assert [m["content"] for m in sent if m.get("role") == "tool"][-1] == withheld
    snap = await snapshot(base)
    # fresh: the withhold of call 8; the reminder after call 6 is re-derived (not counted again)
    assert snap["per_rule"].get("cycles") == 1
    assert snap["results_withheld"] >= 1


HARNESS = "[ERROR] You did not use a tool in your previous response! Please retry with a tool use."
#: One step of tool use: the conversation is an agent's, not plain chat.
READ_STEP: list[dict[str, Any]] = [
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c0", "content": "debug: true"},
]


def text_only_model() -> Any:
    """A model that answers every request with the same text and no tool call."""
    return scripted_model(lambda n: [], content=SAME)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_text_only_monologue_answered_by_a_harness_error_is_stopped_at_the_4th(
    upstream: FakeUpstream, sdk, stream: bool
) -> None:
    """A harness that answers every text-only reply with the same error (Cline/Roo style), in an
    agent conversation that has used tools: the reminder is appended to the 3rd error message;
    the 4th identical reply gets the stop text."""
    upstream.handler = text_only_model()
    client = await sdk()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the config."}, *READ_STEP]
    replies: list[tuple[str, str]] = []
    for _ in range(4):
        msg, finish = await turn(client, messages, stream)
        replies.append((msg["content"], finish))
        messages += [msg, {"role": "user", "content": HARNESS}]
    assert replies == [(SAME, "stop")] * 3 + [(f"{SAME}\n\n{MONOLOGUE_TEXT.format(count=4)}", "stop")]
    fourth = upstream.requests[3].json()["messages"]
    assert fourth[-1]["role"] == "user"
    assert fourth[-1]["content"].startswith(f"{HARNESS}\n\n[loopguard] Your last 3 messages said exactly")
    snap = await snapshot(client.base)
    assert (snap["per_rule"].get("monologue"), snap["stops"]) == (1, 1)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_different_text_only_replies_with_the_same_harness_error_stopped_at_the_4th(
    upstream: FakeUpstream, make_proxy, stream: bool
) -> None:
    upstream.handler = text_only_model()
    base = await make_proxy()
    client = AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the config."}, *READ_STEP]
    for text in ("I think it is fixed.", "It should work now.", "Done, I believe."):
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": HARNESS}]
    try:
        msg, finish = await turn(client, messages, stream)
    finally:
        await client.close()
    assert (msg["content"], finish) == (f"{SAME}\n\n{MONOLOGUE_TEXT.format(count=4)}", "stop")
    sent = upstream.requests[-1].json()["messages"]
    assert sent[-1]["content"].startswith(f"{HARNESS}\n\n[loopguard] Your last 3 replies got the same answer")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_plain_chat_continue_is_never_stopped(upstream: FakeUpstream, make_proxy, stream: bool) -> None:
    """Plain chat (DESIGN §2.2): a user typing "continue" for the next chapter, no tools anywhere. The model
    answers the same text every time (the worst case); nothing is added, nothing stopped."""
    upstream.handler = text_only_model()
    base = await make_proxy()
    client = AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Write a story in chapters."}]
    replies = []
    try:
        for _ in range(6):
            msg, finish = await turn(client, messages, stream)
            replies.append((msg["content"], finish))
            messages += [msg, {"role": "user", "content": "continue"}]
    finally:
        await client.close()
    assert replies == [(SAME, "stop")] * 6
    assert [r.json()["messages"] for r in upstream.requests] == [messages[: 2 * k + 1] for k in range(6)]
    snap = await snapshot(base)
    assert (snap["stops"], snap["per_rule"]) == (0, {})
