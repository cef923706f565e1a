"""recovery.reminders through the real server, in every dialect: what the upstream sees when an
agent repeats one call seven times (the default guards: the repeat reminders after the 3rd and 5th
call, the 6th and 7th results withheld). plain and redirect change the texts and nothing else: the
same body as quote, byte for byte, with each text replaced in place; redirect's names the offered
tools the turn has not used."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from tests.conftest import ProxyFactory
from tests.helpers import messages_blocks, responses_items
from tests.helpers.fakes import FakeUpstream, tool_call
from tests.helpers.gemini_contents import gemini_body
from tests.helpers.messages_blocks import messages_body
from tests.helpers.responses_items import responses_body

ARGS = '{"path": "src/app.py"}'
CONTENT = "DEBUG = True\n"
TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in ("read_file", "edit_file", "bash")
]


def history(n: int = 7) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Why does the app start in debug mode?"}]
    for i in range(n):
        cid = f"call_{i}"
        messages.append(
            {"role": "assistant", "content": None, "tool_calls": [tool_call("read_file", ARGS, cid)]}
        )
        messages.append({"role": "tool", "tool_call_id": cid, "content": CONTENT})
    return messages


WIRES = {
    "chat": ("/v1/chat/completions", lambda m: {"model": "m", "messages": m, "tools": TOOLS}),
    "responses": (
        "/v1/responses",
        lambda m: {**responses_body(m, tools=responses_items.chat_tools(TOOLS)), "store": False},
    ),
    "messages": (
        "/v1/messages",
        lambda m: {**messages_body(m, tools=messages_blocks.chat_tools(TOOLS)), "max_tokens": 100},
    ),
    "gemini": ("/v1beta/models/g:generateContent", lambda m: gemini_body(m, TOOLS)),
}


async def sent(
    upstream: FakeUpstream, make_proxy: ProxyFactory, style: str, wire: str, stream: bool
) -> tuple[bytes, dict[str, Any]]:
    """The body the upstream got for the 7-call history in ``wire``, and the proxy's stats."""

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.json_response({})

    upstream.handler = handler
    base = await make_proxy({"recovery": {"reminders": style}})
    path, make = WIRES[wire]
    body = make(history())
    if wire != "gemini":
        body["stream"] = stream
    elif stream:
        path = "/v1beta/models/g:streamGenerateContent?alt=sse"
    async with aiohttp.ClientSession() as s:
        async with s.post(base + path, data=orjson.dumps(body)) as r:
            assert r.status == 200
        async with s.get(f"{base}/loop-guard") as r:
            stats = await r.json()
    return upstream.requests[-1].body, stats


#: The four texts in quote mode, in order: the repeat reminders after the 3rd and 5th call, the
#: escalation's withheld 6th result, the circuit breaker's withheld 7th.
QUOTE = (
    "[loopguard] You have made the same tool call several times in a row. Before calling it again, re-read "
    "its last result: if it did not give you what you need, change your approach or your arguments instead "
    "of repeating the call.",
    "[loopguard] You are repeating the same tool call without making progress.\n- tool: read_file\n"
    '- consecutive_calls: 5\n- arguments: {"path":"src/app.py"}\nDo not call this tool with these exact '
    "arguments again. Use the results you already have, try a different approach, or tell the user what is "
    "blocking you.",
    "[loopguard] The result of this call is withheld: you were reminded 2 times that your calls to read_file "
    "on src/app.py were not getting anywhere, and this call got the same result as an earlier one. Stop "
    "calling read_file for this: use the results you already have, try a different approach, or tell the "
    "user what is blocking you.",
    "[loopguard] The result of this call is withheld: you have now called read_file with these same "
    "arguments 7 times, and the limit is 6. Repeating it will not give you anything new. Stop making this "
    "call: use the results you already have, change your approach, or tell the user what is blocking you.",
)
REPEATED = (
    "[loopguard] You have made the same tool call {n} times in a row, and it returned the same result each "
    "time.\n"
)
ESCALATED = (
    "[loopguard] The result of this call is withheld: you were reminded 2 times that these calls were not "
    "getting anywhere, and this call got the same result as an earlier one.\n"
)
DUPLICATE = (
    "[loopguard] The result of this call is withheld: you have now made this same call 7 times, and the "
    "limit is 6. Repeating it will not give you anything new.\n"
)
INSTEAD = (
    "What those calls returned is already above: use it instead of asking for it again. Tools you have not "
    "used since the user's last message: edit_file, bash. If you have what you need, answer the user now "
    "with what you know; if not, say what is blocking you."
)
STOP_REPEATING = "Do not make that call again: change your approach, or tell the user what is blocking you."
TEXTS = {
    "plain": (
        REPEATED.format(n=3) + STOP_REPEATING,
        REPEATED.format(n=5) + STOP_REPEATING,
        ESCALATED + "Stop making this call: try a different approach, or tell the user what is blocking you.",
        DUPLICATE
        + "Stop making this call: use the results you already have, change your approach, or tell the "
        "user what is blocking you.",
    ),
    "redirect": (
        REPEATED.format(n=3) + INSTEAD,
        REPEATED.format(n=5) + INSTEAD,
        ESCALATED + INSTEAD,
        DUPLICATE + INSTEAD,
    ),
}


def _json(text: str) -> bytes:
    """``text`` as it stands inside a JSON body (a string's bytes without its quotes)."""
    return orjson.dumps(text)[1:-1]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("wire", list(WIRES))
@pytest.mark.parametrize("style", ["plain", "redirect"])
async def test_the_upstream_sees_the_styles_texts_in_place_of_the_quoting_ones(
    upstream: FakeUpstream, make_proxy: ProxyFactory, style: str, wire: str, stream: bool
) -> None:
    quoted, quote_stats = await sent(upstream, make_proxy, "quote", wire, stream)
    got, stats = await sent(upstream, make_proxy, style, wire, stream)
    # quote: today's four texts, each once, in order
    at = [quoted.find(_json(q)) for q in QUOTE]
    assert all(a >= 0 for a in at) and at == sorted(at)
    assert [quoted.count(_json(q)) for q in QUOTE] == [1, 1, 1, 1] and quoted.count(b"[loopguard]") == 4
    expected = quoted
    for q, text in zip(QUOTE, TEXTS[style], strict=True):
        expected = expected.replace(_json(q), _json(text))
    assert got == expected  # every other byte as in quote mode: the same actions at the same places
    assert b"- tool:" not in got and b"- arguments:" not in got and b"read_file on" not in got
    for key in ("per_rule", "results_withheld", "rewritten_requests", "reminders_injected"):
        assert stats.get(key) == quote_stats.get(key), key
    assert stats["per_rule"] == {"circuit_breaker": 1, "escalation": 1}


@pytest.mark.parametrize("wire", list(WIRES))
async def test_a_later_request_gets_the_same_texts_again(
    upstream: FakeUpstream, make_proxy: ProxyFactory, wire: str
) -> None:
    """Redirect's texts are a function of the history before them: a request with two more steps
    (one of them an edit_file call, a tool the earlier texts name as not used) re-derives them
    byte for byte, so the upstream's prefix cache stays valid."""
    first, _ = await sent(upstream, make_proxy, "redirect", wire, False)
    messages = history()
    for i, (name, args) in enumerate(
        [("edit_file", '{"path": "src/app.py"}'), ("bash", '{"command": "ls"}')]
    ):
        cid = f"call_x{i}"
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [tool_call(name, args, cid)]},
            {"role": "tool", "tool_call_id": cid, "content": "ok"},
        ]

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.json_response({})

    upstream.handler = handler
    base = await make_proxy({"recovery": {"reminders": "redirect"}})
    path, make = WIRES[wire]
    async with aiohttp.ClientSession() as s, s.post(base + path, data=orjson.dumps(make(messages))) as r:
        assert r.status == 200
    later = upstream.requests[-1].body
    for text in TEXTS["redirect"]:
        assert first.count(_json(text)) == 1 and later.count(_json(text)) == 1
