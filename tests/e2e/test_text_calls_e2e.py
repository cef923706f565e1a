"""Tool calls written as text, end to end: the official ``openai`` SDK, through the real
proxy, in front of a fake server that answers the way a server without a tool parser does
(Qwen3-Coder XML in ``content``), streamed and not."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from openai import AsyncOpenAI

from tests.helpers.fakes import FakeUpstream, completion, sse_events

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["path"],
            },
        },
    }
]
XML = (
    "I'll read it.\n\n<tool_call>\n<function=read_file>\n<parameter=path>\napp.py\n</parameter>\n"
    "<parameter=limit>\n40\n</parameter>\n</function>\n</tool_call>"
)
ARGS = '{"path":"app.py","limit":40}'


def answering(content: str) -> Any:
    """A fake model that always answers ``content`` (8 characters an SSE event)."""

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        if orjson.loads(body).get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for ev in sse_events(None, content=content):
                await resp.write(ev)
            await resp.write_eof()
            return resp
        return web.json_response(completion(None, content=content), dumps=lambda o: orjson.dumps(o).decode())

    return handler


text_model = answering(XML)


async def ask(client: AsyncOpenAI, messages: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
    """One answer as the agent records it: content, calls (id, name, arguments), finish."""
    if not stream:
        resp = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
        msg = resp.choices[0].message
        calls = [(tc.id, tc.function.name, tc.function.arguments) for tc in msg.tool_calls or []]
        return {"content": msg.content, "calls": calls, "finish": resp.choices[0].finish_reason}
    chunks = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True)  # type: ignore[arg-type]
    content = ""
    slots: dict[int, list[str]] = {}
    finish = None
    async for chunk in chunks:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            content += choice.delta.content or ""
            for tc in choice.delta.tool_calls or []:
                slot = slots.setdefault(tc.index, ["", "", ""])
                slot[0] += tc.id or ""
                if tc.function is not None:
                    slot[1] += tc.function.name or ""
                    slot[2] += tc.function.arguments or ""
    calls = [tuple(slots[i]) for i in sorted(slots)]
    return {"content": content or None, "calls": calls, "finish": finish}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_sdk_receives_a_structured_call(upstream: FakeUpstream, sdk: Any, stream: bool) -> None:
    upstream.handler = text_model
    client = await sdk()
    got = await ask(client, [{"role": "user", "content": "Read app.py"}], stream)
    assert got["finish"] == "tool_calls"
    assert got["content"] == "I'll read it."  # the held part of the text, trailing whitespace removed
    [(cid, name, args)] = got["calls"]
    assert (name, args) == ("read_file", ARGS)
    assert cid.startswith("call_lg") and len(cid) == 31
    async with aiohttp.ClientSession() as s, s.get(f"{client.base}/loop-guard") as r:  # type: ignore[attr-defined]
        stats = await r.json()
    assert (stats["responses_repaired"], stats["text_calls_repaired"]) == (1, 1)
    assert stats["per_rule"] == {"repair_text_tool_calls": 1}
    async with aiohttp.ClientSession() as s, s.get(f"{client.base}/loop-guard/metrics") as r:  # type: ignore[attr-defined]
        metrics = await r.text()
    assert (
        'loopguard_actions_total{kind="repair",mode="enforce",rule="repair_text_tool_calls"} 1.0' in metrics
    )
    assert "loopguard_text_calls_repaired_total 1.0" in metrics


async def test_a_json_request_sent_upstream_as_a_stream_is_repaired(upstream: FakeUpstream, sdk: Any) -> None:
    """``upstream.stream_json_requests``: the answer is read as a stream, repaired, assembled."""
    upstream.handler = text_model
    client = await sdk({"upstream": {"stream_json_requests": True}})
    got = await ask(client, [{"role": "user", "content": "Read app.py"}], False)
    assert upstream.requests[-1].json()["stream"] is True
    assert (got["content"], got["finish"]) == ("I'll read it.", "tool_calls")
    assert [(n, a) for _, n, a in got["calls"]] == [("read_file", ARGS)]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_with_repair_off_the_sdk_receives_the_text(
    upstream: FakeUpstream, sdk: Any, stream: bool
) -> None:
    upstream.handler = text_model
    client = await sdk({"response": {"repair_text_tool_calls": False}})
    got = await ask(client, [{"role": "user", "content": "Read app.py"}], stream)
    assert got == {"content": XML, "calls": [], "finish": "stop"}


@pytest.mark.parametrize(
    "config", [{"mode": "observe"}, {"response": {"mode": "observe"}}], ids=["all", "response"]
)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_in_observe_mode_the_repair_is_counted_and_not_applied(
    upstream: FakeUpstream, sdk: Any, stream: bool, config: dict[str, Any]
) -> None:
    """Observe mode on text calls: ``response.mode: observe`` covers the repair: the agent gets the
    text as the model wrote it, and the repair it would have made is logged and counted as
    observed."""
    upstream.handler = text_model
    client = await sdk(config)
    got = await ask(client, [{"role": "user", "content": "Read app.py"}], stream)
    assert got == {"content": XML, "calls": [], "finish": "stop"}
    async with aiohttp.ClientSession() as s, s.get(f"{client.base}/loop-guard") as r:  # type: ignore[attr-defined]
        stats = await r.json()
    assert stats["observed_per_rule"] == {"repair_text_tool_calls": 1}
    assert stats["observed"] == {"remind": 0, "withhold": 0, "stop": 0, "cut": 0, "repair": 1, "fold": 0}
    assert stats["responses_repaired"] == 0  # applied repairs only
    async with aiohttp.ClientSession() as s, s.get(f"{client.base}/loop-guard/metrics") as r:  # type: ignore[attr-defined]
        metrics = await r.text()
    assert (
        'loopguard_actions_total{kind="repair",mode="observe",rule="repair_text_tool_calls"} 1.0' in metrics
    )


#: (what the model writes before the call, calls the agent ran before the stop, the stop's words,
#: results withheld in the last request): with text before the call the same reply three times in
#: a row is a monologue; with the call alone, the escalation ladder reminds twice, withholds the
#: 6th call's result and stops the turn at the 7th (the shipped defaults)
LOOPS = [
    ("I'll read it.\n\n", 3, "the model repeated itself", 0),
    ("", 6, "after 2 reminders and a withheld result", 1),
]


@pytest.mark.parametrize(
    ("before", "ran_before_stop", "words", "withheld"), LOOPS, ids=["with text", "call only"]
)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_repaired_call_the_model_repeats_is_a_loop_like_any_other(
    upstream: FakeUpstream,
    sdk: Any,
    stream: bool,
    before: str,
    ran_before_stop: int,
    words: str,
    withheld: int,
) -> None:
    """The agent runs every repaired call and sends it back as a structured call; the model keeps
    writing the same call as text; the loop is ended like a structured one (pinned)."""
    upstream.handler = answering(before + XML[len("I'll read it.\n\n") :])
    client = await sdk()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Read app.py"}]
    ran = 0
    for _ in range(20):
        got = await ask(client, messages, stream)
        if not got["calls"]:
            break
        ran += len(got["calls"])
        calls = [
            {"id": c, "type": "function", "function": {"name": n, "arguments": a}} for c, n, a in got["calls"]
        ]
        messages.append({"role": "assistant", "content": got["content"], "tool_calls": calls})
        messages += [
            {"role": "tool", "tool_call_id": c, "content": "print('hi')\n"} for c, _, _ in got["calls"]
        ]
    assert got["finish"] == "stop"
    assert got["content"].startswith(before.rstrip() + ("\n\n" if before else "") + "[loopguard] Stopped")
    assert words in got["content"], got["content"]
    assert ran == ran_before_stop
    ids = [tc["id"] for m in messages for tc in m.get("tool_calls") or []]
    assert len(set(ids)) == len(ids) == ran
    last = upstream.requests[-1].json()["messages"]
    assert sum(1 for m in last if m["role"] == "tool" and "[loopguard]" in m["content"]) == withheld
