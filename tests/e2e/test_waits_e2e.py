"""Waiting is not looping, through the real server: a Codex-shaped history of polls (Responses,
JSON and SSE) and a Claude Code-shaped one of sleeps (Messages, JSON and SSE) reach the model
byte for byte and the model's next poll reaches the agent byte for byte (no withhold, no stop);
a long quiet wait gets the one reminder, in place, and still no stop."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.guards.waiting import PROCESS_TEXT, SLEEP_TEXT
from tests.conftest import ProxyFactory
from tests.helpers.fake_messages import FakeMessages, tool_use
from tests.helpers.fake_responses import FakeResponses, function_call
from tests.helpers.fakes import FakeUpstream, repeated_call_messages, scripted_model, tool_call
from tests.unit.core.test_waits import POLL, SID, codex

START = {"cmd": "cargo build --release", "workdir": "/srv/app", "yield_time_ms": 10000}
SLEEP = {"command": "sleep 60 && echo waited", "description": "Wait for the teammates"}
STATUS = {"command": "cat status.md", "description": "Check the teammates"}


def codex_input(polls: int) -> list[dict[str, Any]]:
    """A Codex request's input: the prompt, the build left running, ``polls`` 30 s polls."""
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Build it."}]}
    ]
    calls = [("exec_command", START, codex(10.0))] + [("write_stdin", POLL, codex(30.0))] * polls
    for i, (name, args, out) in enumerate(calls):
        items.append(
            {"type": "function_call", "name": name, "arguments": json.dumps(args), "call_id": f"call_{i}"}
        )
        items.append({"type": "function_call_output", "call_id": f"call_{i}", "output": out})
    return items


def claude_messages(rounds: int) -> list[dict[str, Any]]:
    """A Claude Code request's messages: the prompt, then ``rounds`` of a 60 s sleep and a status
    check (the same status every time)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Wait for the teammates."}]
    for i in range(rounds):
        for j, (args, out) in enumerate(((SLEEP, "waited"), (STATUS, "2 of 3 teammates working"))):
            tid = f"toolu_{i:03d}{j}"
            messages.append(
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": tid, "name": "Bash", "input": args}],
                }
            )
            messages.append(
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tid, "content": out}]}
            )
    return messages


async def post(url: str, body: dict[str, Any]) -> bytes:
    async with aiohttp.ClientSession() as s, s.post(url, data=orjson.dumps(body)) as r:
        assert r.status == 200
        return await r.read()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_codex_polls_pass_untouched(
    upstream: FakeUpstream, make_proxy: ProxyFactory, stream: bool
) -> None:
    """Thirty identical polls (15 min) and the model's 31st: every byte through, both ways."""
    fake = FakeResponses(lambda n, body: [function_call("write_stdin", json.dumps(POLL))])
    upstream.handler = fake.handle
    base = await make_proxy()
    body = {"model": "gpt-5", "input": codex_input(30), "stream": stream, "store": False}
    got = await post(f"{base}/v1/responses", body)
    assert upstream.requests[0].body == orjson.dumps(body)
    assert got == fake.answers[0]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_claude_sleeps_between_status_checks_pass_untouched(
    upstream: FakeUpstream, make_proxy: ProxyFactory, stream: bool
) -> None:
    fake = FakeMessages(lambda n, body: [tool_use("Bash", SLEEP)])
    upstream.handler = fake.handle
    base = await make_proxy()
    body = {"model": "claude", "max_tokens": 1000, "messages": claude_messages(12), "stream": stream}
    got = await post(f"{base}/v1/messages", body)
    assert upstream.requests[0].body == orjson.dumps(body)
    assert got == fake.answers[0]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_long_codex_wait_gets_one_reminder_and_no_stop(
    upstream: FakeUpstream, make_proxy: ProxyFactory, stream: bool
) -> None:
    """Start (10 s) and 60 polls of 30 s: the 30 minutes are reached at the last poll; the
    reminder is a user message item right after its output; the model's next poll passes."""
    fake = FakeResponses(lambda n, body: [function_call("write_stdin", json.dumps(POLL))])
    upstream.handler = fake.handle
    base = await make_proxy()
    items = codex_input(60)
    got = await post(
        f"{base}/v1/responses", {"model": "gpt-5", "input": items, "stream": stream, "store": False}
    )
    reached = fake.bodies[0]["input"]
    text = PROCESS_TEXT.format(duration="30 minutes", subject=f"process {SID}", checks=61)
    assert reached == [
        *items,
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
    ]
    assert got == fake.answers[0]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_long_claude_sleep_gets_one_reminder_and_no_stop(
    upstream: FakeUpstream, make_proxy: ProxyFactory, stream: bool
) -> None:
    """Thirty 60 s sleeps between status checks: the reminder after the 30th sleep's result
    (a text block in that user message), nothing else; the model's next sleep passes."""
    fake = FakeMessages(lambda n, body: [tool_use("Bash", SLEEP)])
    upstream.handler = fake.handle
    base = await make_proxy()
    messages = claude_messages(30)
    got = await post(
        f"{base}/v1/messages", {"model": "claude", "max_tokens": 1000, "messages": messages, "stream": stream}
    )
    reached = fake.bodies[0]["messages"]
    text = SLEEP_TEXT.format(duration="30 minutes", checks=30)
    at = len(messages) - 3  # the results of the 30th sleep
    expected = [*messages]
    expected[at] = {**messages[at], "content": [*messages[at]["content"], {"type": "text", "text": text}]}
    assert reached == expected
    assert got == fake.answers[0]


NOTHING = {"command": "sleep 0 && echo still waiting", "description": "Wait"}


def sleeps_of_nothing(n: int) -> list[dict[str, Any]]:
    """A Claude Code request's messages: the prompt, then ``n`` steps of ``sleep 0 && echo still
    waiting`` answered the same every time (no time passes)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Wait for the build."}]
    for i in range(n):
        tid = f"toolu_{i:03d}"
        use = {"type": "tool_use", "id": tid, "name": "Bash", "input": NOTHING}
        messages.append({"role": "assistant", "content": [use]})
        messages.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": tid, "content": "still waiting"}],
            }
        )
    return messages


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("wire", ["messages", "chat"])
async def test_a_sleep_that_waits_for_nothing_is_an_ordinary_repeat(
    upstream: FakeUpstream, make_proxy: ProxyFactory, wire: str, stream: bool
) -> None:
    """Before: ``sleep 0 && echo still waiting`` counted as waiting, so 320 of them in a row got no
    reminder, no withheld result, no cap (the wait reminder counts waited time, and none passed).
    Now it is the same command with the same result: reminded at the 3rd, 5th and 8th, its 6th
    (the escalation ladder), 7th and 8th (the circuit breaker too) results withheld, and the
    model's next one stopped."""
    if wire == "messages":
        fake = FakeMessages(lambda n, body: [tool_use("Bash", NOTHING)])
        upstream.handler = fake.handle
        path = "/v1/messages"
        body: dict[str, Any] = {"model": "claude", "max_tokens": 1000, "messages": sleeps_of_nothing(8)}
    else:
        upstream.handler = scripted_model(lambda n: [tool_call("bash", json.dumps(NOTHING), f"c{n}")])
        path = "/v1/chat/completions"
        messages = repeated_call_messages(8, "bash", json.dumps(NOTHING), "still waiting")
        body = {"model": "m", "messages": messages}
    body["stream"] = stream
    base = await make_proxy()
    got = await post(f"{base}{path}", body)
    sent = upstream.requests[0].body
    assert sent.count(b"[loopguard]") == 3 + 3  # three reminders, three withheld results
    assert sent.count(b'"still waiting"') == 8 - 3  # the results kept as they were
    assert b"[loopguard] Stopped" in got
