"""A person's messages through the real server: what a person writes is never read as a harness's
own shape. ReAct-style ``Observation:`` notes after the same code sample are no fenced action's
results (no reminder, no withheld message: every byte both ways); a request that only starts like a
harness's "Please use a tool." is a new request (the first call after it is not withheld), as
``progress.continuation_patterns`` match the whole text."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from tests.conftest import ProxyFactory
from tests.helpers.fakes import FakeUpstream, completion, scripted_model, sse_events, tool_call
from tests.helpers.gemini_contents import gemini_body
from tests.helpers.messages_blocks import messages_body
from tests.helpers.responses_items import responses_body

SAMPLE = "Try this:\n\n```bash\nls -la /srv/app\n```"
NOTE = "Observation: it printed nothing, same as before."


def react_notes(n: int) -> list[dict[str, Any]]:
    """A chat: a question, then ``n`` rounds of the same code sample answered by a person's note."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "How do I see what is in /srv/app?"},
    ]
    for _ in range(n):
        messages += [{"role": "assistant", "content": SAMPLE}, {"role": "user", "content": NOTE}]
    return messages


async def post(base: str, body: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{base}/v1/chat/completions", data=orjson.dumps(body)) as r:
            assert r.status == 200
            got = await r.read()
        async with s.get(f"{base}/loop-guard") as r:
            stats = await r.json()
    return got, stats


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_persons_observation_notes_after_the_same_sample_pass_untouched(
    upstream: FakeUpstream, make_proxy: ProxyFactory, stream: bool
) -> None:
    """Before: the notes were read as the sample's results; the same call with the same result
    drew "same tool call" reminders and the 6th note was replaced by the withheld text. Now the
    request reaches the model byte for byte, and so does the model's next sample the agent."""
    upstream.handler = scripted_model(lambda n: [], content=SAMPLE)
    base = await make_proxy()
    body = {"model": "m", "messages": react_notes(8), "stream": stream}
    got, stats = await post(base, body)
    assert upstream.requests[0].body == orjson.dumps(body)
    assert got == (b"".join(sse_events(None, SAMPLE)) if stream else orjson.dumps(completion(None, SAMPLE)))
    assert (stats["rewritten_requests"], stats["stops"], stats["per_rule"]) == (0, 0, {})


CMD = '{"command": "cat config.yaml"}'
CONFIG = "port: 80\nhost: example.org\n"
REQUEST = "Please use a tool to check config.yaml once more, I just fixed it."


def checks_then(user: str) -> list[dict[str, Any]]:
    """The same ``cat config.yaml`` five times with the same result (reminded at the 3rd and the
    5th), a user message ``user``, and the same call once more with its result."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Why does the server not start?"}]
    for i in range(6):
        if i == 5:
            messages.append({"role": "user", "content": user})
        cid = f"call_{i}"
        messages.append({"role": "assistant", "content": None, "tool_calls": [tool_call("bash", CMD, cid)]})
        messages.append({"role": "tool", "tool_call_id": cid, "content": CONFIG})
    return messages


WIRES = {
    "chat": ("/v1/chat/completions", lambda m: {"model": "m", "messages": m}),
    "responses": ("/v1/responses", lambda m: {**responses_body(m), "store": False}),
    "messages": ("/v1/messages", lambda m: {**messages_body(m), "max_tokens": 100}),
    "gemini": ("/v1beta/models/g:generateContent", gemini_body),
}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("wire", list(WIRES))
@pytest.mark.parametrize(
    ("user", "withheld"),
    [
        (REQUEST, 0),  # a request that starts like a harness's "Please use a tool."
        ("continue", 1),  # a continuation: the loop goes on, its next stale call is withheld
    ],
    ids=["request", "continue"],
)
async def test_a_request_that_only_starts_like_a_continuation_starts_a_new_turn(
    upstream: FakeUpstream, make_proxy: ProxyFactory, wire: str, stream: bool, user: str, withheld: int
) -> None:
    """Before: the pattern ``please (?:use|call) (?:a|one of the) tools?\\b`` matched the start of
    the user's request, so the call after it counted on in the old turn and was withheld (the
    user had just fixed the file). Now the whole text must match: a new turn, nothing withheld;
    the two reminders of the old turn are re-injected in place either way."""

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.json_response({})

    upstream.handler = handler
    base = await make_proxy()
    path, make = WIRES[wire]
    body = make(checks_then(user))
    if wire != "gemini":
        body["stream"] = stream
    elif stream:
        path = "/v1beta/models/g:streamGenerateContent?alt=sse"
    async with aiohttp.ClientSession() as s:
        async with s.post(base + path, data=orjson.dumps(body)) as r:
            assert r.status == 200
        async with s.get(f"{base}/loop-guard") as r:
            stats = await r.json()
    sent = upstream.requests[0].body
    assert sent.count(b"[loopguard]") == 2 + withheld
    assert stats["per_rule"] == ({"escalation": 1} if withheld else {})
    assert sent.count(b"port: 80") == 6 - withheld  # every result but a withheld one, as it was
