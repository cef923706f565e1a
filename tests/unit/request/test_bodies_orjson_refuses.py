"""Bodies orjson refuses are still guarded, and a rewrite keeps every untouched byte.

Before: one lone surrogate (``"\\udcff"``, which Python's ``json.dumps`` writes), a number beyond
float range (``1e400``) or nesting past orjson's 1,024 levels turned every guard off with no
counter and ``conversation: null``; integers past 64 bits came out as floats when a body was
rewritten. Now :func:`proxy.dialects.jsonbody.decode` reads them, :func:`proxy.dialects.openai_chat.apply`
splices bytes, and what truly cannot be read is counted (``unguarded_requests{reason}``).
"""

from __future__ import annotations

import json
import math
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy.config import Config
from proxy.core.effects import progress_rules
from proxy.dialects import jsonbody
from proxy.guards import build_guards
from proxy.request.rewrite import NOT_CHAT, decide_request
from tests.conftest import ProxyFactory
from tests.helpers.fakes import FakeUpstream, completion, repeated_call_messages, sse_events, tool_call

CFG = Config()
GUARDS = build_guards(CFG.guards, *progress_rules(CFG.progress))
DEEP = 2000  # levels: past orjson's 1,024 and the json module's recursion limit
#: what the default guards do on 7 identical calls with identical results (pinned on a clean body)
SEVENTH = [
    ("repeat_reminder", "remind", 6, False),
    ("repeat_reminder", "remind", 10, False),
    ("circuit_breaker", "withhold", 14, True),
    ("escalation", "withhold", 12, False),
    ("escalation", "withhold", 14, True),
]


def looping(n: int = 7, **extra: Any) -> dict[str, Any]:
    return {"model": "m", **extra, "messages": repeated_call_messages(n)}


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def summary(actions: Any) -> list[tuple[str, str, int, bool]]:
    return [(a.rule, a.kind, getattr(a, "position", getattr(a, "after", -1)), a.fresh) for a in actions]


def decide(raw: bytes) -> Any:
    return decide_request(raw, {}, GUARDS, CFG.conversation_key.headers)


def with_user_text(body: dict[str, Any], text: str) -> dict[str, Any]:
    body["messages"][0]["content"] = text
    return body


# (id, raw body, bytes that must leave exactly as they came)
READABLE = [
    pytest.param(
        json.dumps(with_user_text(looping(), "Fix app.py \udcff")).encode(),
        b'"Fix app.py \\udcff"',
        id="lone_surrogate_in_a_message",
    ),
    pytest.param(
        json.dumps(looping(temperature=0.5)).encode().replace(b"0.5", b"1e400"),
        b'"temperature": 1e400',
        id="number_beyond_float_range",
    ),
    pytest.param(
        json.dumps(looping(seed=18446744073709551617)).encode(),
        b'"seed": 18446744073709551617',
        id="integer_past_64_bits",
    ),
    pytest.param(
        json.dumps(looping(metadata="X")).encode().replace(b'"X"', deep(DEEP).encode()),
        b'"metadata": ' + deep(DEEP).encode(),
        id="nesting_past_1024_outside_messages",
    ),
    pytest.param(
        json.dumps(looping(temperature=float("nan"))).encode(),
        b'"temperature": NaN',
        id="nan_python_writes",
    ),
    pytest.param(
        json.dumps(looping(x_scores=[float("inf"), float("-inf")])).encode(),
        b'"x_scores": [Infinity, -Infinity]',
        id="infinity_python_writes",
    ),
    pytest.param(
        json.dumps(looping(top_p=1.0, max_tokens=100)).encode().replace(b"1.0", b"1.0E0"),
        b'"top_p": 1.0E0, "max_tokens": 100',
        id="number_text",
    ),
]


@pytest.mark.parametrize(("raw", "kept"), READABLE)
def test_bodies_orjson_refuses_are_guarded_like_clean_ones(raw: bytes, kept: bytes) -> None:
    assert kept in raw
    decision = decide(raw)
    assert summary(decision.actions) == SEVENTH
    assert decision.unguarded is None
    assert decision.conversation != ""
    assert decision.changed
    out = decision.body
    assert out.count(kept) == 1  # untouched bytes leave as they came
    before = raw.split(b'"messages": ', 1)[0]
    assert out.startswith(before + b'"messages": ')  # everything before the messages, byte for byte
    clean = decide(json.dumps(looping()).encode())
    # the messages after the rewrite equal the clean body's rewrite, apart from the user text
    got = jsonbody.decode(out)["messages"]
    want = orjson.loads(clean.body)["messages"]
    got[0]["content"] = want[0]["content"]
    assert got == want


def test_big_integers_inside_arguments_objects_stay_exact() -> None:
    body = looping()
    for m in body["messages"]:
        for tc in m.get("tool_calls", []):
            tc["function"]["arguments"] = {"path": "app.py", "offset": 18446744073709551617}
    raw = json.dumps(body).encode()
    decision = decide(raw)
    assert [a.kind for a in decision.actions if a.fresh] == ["withhold", "withhold"]
    assert decision.body.count(b'"offset": 18446744073709551617') == 7
    assert b"1.8446744073709552e+19" not in decision.body


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        pytest.param(b'{"model": "m", "messages": [', "not_json", id="truncated"),
        pytest.param(b'{"model": "m", "temperature": Nan, "messages": []}', "not_json", id="not_a_constant"),
        pytest.param(b"\xff\xfe{}", "not_json", id="not_utf8"),
        pytest.param(
            b'{"model": "m", "messages": [{"role": "user", "content": ' + deep(DEEP).encode() + b"}]}",
            "nesting",
            id="nesting_past_1024_inside_messages",
        ),
        pytest.param(deep(DEEP).encode(), "nesting", id="nesting_past_1024_top_level_array"),
        pytest.param(b"[]", NOT_CHAT, id="array_body"),
        pytest.param(b'{"model": "m", "messages": 3}', NOT_CHAT, id="messages_not_a_list"),
        pytest.param(b'{"model": "m", "messages": ["hi"]}', NOT_CHAT, id="message_not_an_object"),
    ],
)
def test_unreadable_bodies_go_unchanged_with_their_reason(raw: bytes, reason: str) -> None:
    decision = decide(raw)
    assert decision.body is raw
    assert (decision.actions, decision.changed, decision.unguarded) == ((), False, reason)


def test_decode_reads_what_orjson_refuses() -> None:
    assert jsonbody.decode(b'"\\udcff"') == "\udcff"
    assert jsonbody.decode(b"[1e400, -1e400]") == [float("inf"), float("-inf")]
    assert jsonbody.decode(b'{"a": ' + deep(DEEP).encode() + b', "b": 1}') == {"a": jsonbody.TOO_DEEP, "b": 1}
    nan, inf, minus = jsonbody.decode(b"[NaN, Infinity, -Infinity]")  # as json.loads reads them
    assert math.isnan(nan) and (inf, minus) == (float("inf"), float("-inf"))
    with pytest.raises(jsonbody.Unreadable, match="not_json"):
        jsonbody.decode(b'{"a": infinity}')


# --- through the real server ----------------------------------------------------------------------------


def lenient_model() -> Any:
    """A fake model that reads bodies with the json module (as Python servers do; what it cannot
    read counts as a non-streaming request) and answers one more identical call, streamed when
    asked."""

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        try:
            req = json.loads(body)
        except (ValueError, RecursionError):
            req = {}
        calls = [tool_call("read_file", '{"path": "app.py"}', "call_8")]
        if req.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for ev in sse_events(calls):
                await resp.write(ev)
            await resp.write_eof()
            return resp
        return web.json_response(completion(calls), dumps=lambda o: orjson.dumps(o).decode())

    return handler


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_server_guards_a_body_with_nan_as_python_writes_it(
    upstream: FakeUpstream, make_proxy: ProxyFactory, stream: bool
) -> None:
    """``json.dumps`` writes ``NaN``/``Infinity`` by default: such a looping conversation is
    guarded (its results withheld), and the upstream gets the agent's bytes apart from the edits."""
    upstream.handler = lenient_model()
    base = await make_proxy()
    raw = json.dumps(looping(stream=stream, temperature=float("nan"), x_scores=[float("-inf")])).encode()
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{base}/v1/chat/completions", data=raw) as r:
            assert r.status == 200
            await r.read()
        async with s.get(f"{base}/loop-guard") as r:
            stats = await r.json()
    sent = upstream.requests[0].body
    assert sent == decide(raw).body != raw  # the spliced bytes
    assert sent.startswith(
        b'{"model": "m", "stream": %s, "temperature": NaN, "x_scores": [-Infinity], '
        % (b"true" if stream else b"false")
    )
    assert stats["unguarded"] == {}
    assert stats["results_withheld"] == 1


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_server_guards_a_surrogate_body_and_counts_unreadable_ones(
    upstream: FakeUpstream, make_proxy: ProxyFactory, stream: bool
) -> None:
    upstream.handler = lenient_model()
    base = await make_proxy()
    body = with_user_text(looping(stream=stream, seed=18446744073709551617), "Fix app.py \udcff")
    raw = json.dumps(body).encode()
    unreadable = b'{"model": "m", "messages": [{"role": "user", "content": ' + deep(DEEP).encode() + b"}]}"
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{base}/v1/chat/completions", data=raw) as r:
            assert r.status == 200
            await r.read()
        async with s.post(f"{base}/v1/chat/completions", data=unreadable) as r:
            assert r.status == 200
            await r.read()
        async with s.post(f"{base}/v1/chat/completions", data=b"not json") as r:
            await r.read()
        async with s.get(f"{base}/loop-guard") as r:
            stats = await r.json()
        async with s.get(f"{base}/loop-guard/metrics") as r:
            metrics = await r.text()
    assert upstream.requests[0].body == decide(raw).body  # the spliced bytes
    assert b'"seed": 18446744073709551617' in upstream.requests[0].body
    assert upstream.requests[1].body == unreadable
    assert upstream.requests[2].body == b"not json"
    assert stats["unguarded"] == {"nesting": 1, "not_json": 1}
    assert stats["results_withheld"] == 1  # one result (circuit_breaker and escalation both withheld it)
    assert 'loopguard_unguarded_requests_total{reason="nesting"} 1.0' in metrics
    assert 'loopguard_unguarded_requests_total{reason="not_json"} 1.0' in metrics
