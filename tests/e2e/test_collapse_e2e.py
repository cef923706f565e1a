"""``recovery.collapse`` end to end: the real server in front of a scripted fake upstream, in every
dialect whose history is in the body (chat, Responses, Messages, Gemini), JSON and SSE.

An agent repeats one call with one result; each request of the conversation is its history so far.
Pinned: the exact bytes the upstream gets (the run folded into its first step and the note; the
guards' reminders on folded steps gone with them), that the agent's answer is the upstream's byte
for byte, that request k+1's upstream body starts with request k's folded prefix (the upstream's
prefix cache breaks once, where folding starts), and the counters in ``GET /loop-guard`` and the
metrics."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy.core.collapse import NOTE, guidance
from tests.helpers import fake_gemini, fake_messages, fake_responses
from tests.helpers.fakes import FakeUpstream, completion, sse_events

ANSWER = "Done."
PROMPT = "Why does the app start in debug mode?"
SAME = ("read_file", {"path": "app.yaml"}, "debug: true")
OTHERS = [("read_file", {"path": "b.yaml"}, "b: 1"), ("read_file", {"path": "c.yaml"}, "c: 2")]
TOOLS_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}
COLLAPSE = {"recovery": {"collapse": {"enabled": True}}}


@dataclass(frozen=True)
class Wire:
    """One dialect as an agent speaks it: its path, its body, its step items and the note."""

    path: Callable[[bool], str]
    body: Callable[[list[Any], bool], dict[str, Any]]
    member: str
    prompt: Callable[[], list[Any]]
    step: Callable[[int, tuple[str, dict[str, Any], str]], list[Any]]
    #: the first step's items with the note delivered (as a user item, or inside its result)
    noted: Callable[[list[Any], str], list[Any]]


#: the re-sample and fallback counters, untouched by collapse
NO_RESAMPLE = {
    "resample_requests": 0,
    "resample_recovered": 0,
    "fallback_requests": 0,
    "fallback_recovered": 0,
    "extra_upstream_calls": 0,
}


def _chat_step(i: int, call: tuple[str, dict[str, Any], str]) -> list[Any]:
    name, args, result = call
    fn = {"name": name, "arguments": orjson.dumps(args).decode()}
    call = {"id": f"c{i}", "type": "function", "function": fn}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{i}", "content": result},
    ]


def _responses_step(i: int, call: tuple[str, dict[str, Any], str]) -> list[Any]:
    name, args, result = call
    return [
        {"type": "function_call", "call_id": f"c{i}", "name": name, "arguments": orjson.dumps(args).decode()},
        {"type": "function_call_output", "call_id": f"c{i}", "output": result},
    ]


def _messages_step(i: int, call: tuple[str, dict[str, Any], str]) -> list[Any]:
    name, args, result = call
    return [
        {"role": "assistant", "content": [{"type": "tool_use", "id": f"c{i}", "name": name, "input": args}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"c{i}", "content": result}]},
    ]


def _gemini_step(i: int, call: tuple[str, dict[str, Any], str]) -> list[Any]:
    name, args, result = call
    return [
        {"role": "model", "parts": [{"functionCall": {"name": name, "args": args}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": name, "response": {"output": result}}}]},
    ]


def _messages_noted(items: list[Any], note: str) -> list[Any]:
    call, result = items
    return [call, {**result, "content": [*result["content"], {"type": "text", "text": note}]}]


WIRES = {
    "chat": Wire(
        lambda stream: "/v1/chat/completions",
        lambda items, stream: {
            "model": "m",
            "messages": items,
            "tools": [{"type": "function", "function": {"name": "read_file", "parameters": TOOLS_SCHEMA}}],
            **({"stream": True} if stream else {}),
        },
        "messages",
        lambda: [{"role": "user", "content": PROMPT}],
        _chat_step,
        lambda items, note: [*items, {"role": "user", "content": note}],
    ),
    "responses": Wire(
        lambda stream: "/v1/responses",
        lambda items, stream: {
            "model": "m",
            "input": items,
            "tools": [{"type": "function", "name": "read_file", "parameters": TOOLS_SCHEMA}],
            "store": False,
            **({"stream": True} if stream else {}),
        },
        "input",
        lambda: [{"type": "message", "role": "user", "content": PROMPT}],
        _responses_step,
        lambda items, note: [
            *items,
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": note}]},
        ],
    ),
    "messages": Wire(
        lambda stream: "/v1/messages",
        lambda items, stream: {
            "model": "m",
            "max_tokens": 256,
            "messages": items,
            "tools": [{"name": "read_file", "input_schema": TOOLS_SCHEMA}],
            **({"stream": True} if stream else {}),
        },
        "messages",
        lambda: [{"role": "user", "content": PROMPT}],
        _messages_step,
        _messages_noted,
    ),
    "gemini": Wire(
        lambda stream: (
            "/v1beta/models/gemini-2.5-pro:"
            + ("streamGenerateContent?alt=sse" if stream else "generateContent")
        ),
        lambda items, stream: {
            "contents": items,
            "tools": [{"functionDeclarations": [{"name": "read_file", "parameters": TOOLS_SCHEMA}]}],
        },
        "contents",
        lambda: [{"role": "user", "parts": [{"text": PROMPT}]}],
        _gemini_step,
        lambda items, note: [*items, {"role": "user", "parts": [{"text": note}]}],
    ),
}


class ChatFake:
    """A chat model that answers every request with :data:`ANSWER`, recording its answer bytes."""

    def __init__(self) -> None:
        self.answers: list[bytes] = []

    async def handle(self, request: web.Request, raw: bytes) -> web.StreamResponse:
        if orjson.loads(raw).get("stream"):
            data = b"".join(sse_events(None, content=ANSWER))
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(data)
            await resp.write_eof()
        else:
            data = orjson.dumps(completion(None, content=ANSWER))
            resp = web.Response(body=data, content_type="application/json")
        self.answers.append(data)
        return resp


def _fake(wire: str) -> Any:
    if wire == "chat":
        return ChatFake()
    if wire == "responses":
        return fake_responses.FakeResponses(lambda n, body: [fake_responses.message(ANSWER)])
    if wire == "messages":
        return fake_messages.FakeMessages(lambda n, body: [fake_messages.text(ANSWER)])
    return fake_gemini.FakeGemini(lambda n, body: [fake_gemini.text(ANSWER)])


def _history(w: Wire, repeats: int, others: int = 0) -> list[Any]:
    items = w.prompt()
    for i in range(repeats):
        items += w.step(i, SAME)
    for j in range(others):
        items += w.step(repeats + j, OTHERS[j])
    return items


#: The default guards' reminders on a run of N identical reads: after the 3rd and the 5th step.
REMINDED = {3: 1, 4: 1, 5: 2}


def _note(repeats: int) -> str:
    """The note on a run of ``repeats`` under the default guards: the reminders of its folded
    steps are told in it."""
    return NOTE.format(count=repeats) + guidance(REMINDED[repeats], 0)


def _expected(w: Wire, repeats: int, others: int, note: str | None) -> list[Any]:
    """The history the upstream should get: folded when ``note`` is given."""
    if note is None:
        return _history(w, repeats, others)
    items = w.prompt() + w.noted(w.step(0, SAME), note)
    for j in range(others):
        items += w.step(repeats + j, OTHERS[j])
    return items


#: The conversation: the run grows from 2 to 5 steps at the tail, then two other calls follow.
SEQUENCE = [(2, 0), (3, 0), (4, 0), (5, 0), (5, 1), (5, 2)]


async def _post(base: str, path: str, body: bytes) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json", "x-session-id": "collapse", "x-api-key": "k"}
    async with aiohttp.ClientSession() as s, s.post(base + path, data=body, headers=headers) as r:
        return r.status, await r.read()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("wire", list(WIRES))
async def test_a_growing_run_reaches_the_upstream_folded_into_its_first_step_and_a_note(
    upstream: FakeUpstream, make_proxy, wire: str, stream: bool
) -> None:
    w = WIRES[wire]
    fake = _fake(wire)
    upstream.handler = fake.handle
    base = await make_proxy(COLLAPSE)
    sent: list[bytes] = []
    for k, (repeats, others) in enumerate(SEQUENCE):
        body = w.body(_history(w, repeats, others), stream)
        status, answer = await _post(base, w.path(stream), orjson.dumps(body))
        assert status == 200, answer
        # the agent's answer is the upstream's, byte for byte
        assert answer == fake.answers[k]
        got = upstream.requests[k].body
        note = _note(repeats) if repeats >= 3 else None
        want = w.body(_expected(w, repeats, others, note), stream)
        assert got == orjson.dumps(want), f"request {k}"
        sent.append(got)
    # the prefix: request 0 to 1 shares everything through the first step's result (the cache
    # breaks there, where folding starts); requests 1 to 4 share everything up to the note's
    # count (the run grows at the tail); after the run, each request only appends
    first_result = sent[0].index(SAME[2].encode()) + len(SAME[2])
    assert first_result <= _common(sent[0], sent[1]) < sent[1].index(b"Note: ")
    counted = sent[1].index(b" was made ") + len(b" was made ")
    for k in (1, 2):
        assert _common(sent[k], sent[k + 1]) == counted
    # after the run, the folded history is a stable prefix: the next request only appends
    for k in (3, 4):
        last_item = orjson.dumps(_expected(w, *SEQUENCE[k], _note(5))[-1])
        assert sent[k + 1].startswith(sent[k][: sent[k].rindex(last_item) + len(last_item)])
    async with aiohttp.ClientSession() as s, s.get(base + "/loop-guard") as r:
        snap = await r.json()
    # folds at requests 1-5; steps left out 2+3+4+4+4; the cache broke once, at request 1
    assert snap["recovery"] == {
        "collapsed_requests": 5,
        "folded_steps": 17,
        "prefix_breaks": 1,
        **NO_RESAMPLE,
    }
    assert snap["per_rule"]["collapse"] == 3  # fresh: the run ended at the newest step (requests 1-3)
    async with aiohttp.ClientSession() as s, s.get(base + "/loop-guard/metrics") as r:
        metrics = await r.text()
    assert 'loopguard_recovery_total{kind="collapse",outcome="folded"} 5.0' in metrics
    assert 'loopguard_recovery_total{kind="collapse",outcome="prefix_break"} 1.0' in metrics
    assert "loopguard_recovery_folded_steps_total 17.0" in metrics
    assert 'loopguard_actions_total{kind="fold",mode="enforce",rule="collapse"} 3.0' in metrics


def _common(a: bytes, b: bytes) -> int:
    """The length of the bytes ``a`` and ``b`` begin with alike."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


async def test_the_note_goes_inside_the_first_result_with_tool_suffix_delivery(
    upstream: FakeUpstream, make_proxy
) -> None:
    fake = ChatFake()
    upstream.handler = fake.handle
    base = await make_proxy({**COLLAPSE, "guards": {"repeat_reminder": {"inject_as": "tool_suffix"}}})
    w = WIRES["chat"]
    status, _ = await _post(base, w.path(False), orjson.dumps(w.body(_history(w, 4), False)))
    assert status == 200
    items = w.prompt() + w.step(0, SAME)
    items[-1] = {**items[-1], "content": f"{SAME[2]}\n\n{_note(4)}"}
    assert upstream.requests[0].body == orjson.dumps(w.body(items, False))


async def test_collapse_off_sends_the_history_as_it_came(upstream: FakeUpstream, make_proxy) -> None:
    fake = ChatFake()
    upstream.handler = fake.handle
    base = await make_proxy()
    w = WIRES["chat"]
    raw = orjson.dumps(w.body(_history(w, 5), False))
    status, _ = await _post(base, w.path(False), raw)
    assert status == 200
    sent = upstream.requests[0].json()["messages"]
    # every step as it came (the default guards' reminders added after the 3rd and 5th)
    assert [m for m in sent if m["role"] != "user"] == [m for m in _history(w, 5) if m["role"] != "user"]
    assert not any(NOTE[:20] in m["content"] for m in sent if m["role"] == "user")
    async with aiohttp.ClientSession() as s, s.get(base + "/loop-guard") as r:
        snap = await r.json()
    assert snap["recovery"] == {
        "collapsed_requests": 0,
        "folded_steps": 0,
        "prefix_breaks": 0,
        **NO_RESAMPLE,
    }


async def test_collapse_works_with_every_guard_off(upstream: FakeUpstream, make_proxy) -> None:
    fake = ChatFake()
    upstream.handler = fake.handle
    off = {name: {"enabled": False} for name in ("repeat_reminder", "circuit_breaker")}
    base = await make_proxy({**COLLAPSE, "guards": off})
    w = WIRES["chat"]
    status, _ = await _post(base, w.path(False), orjson.dumps(w.body(_history(w, 3), False)))
    assert status == 200
    # the rules still on remind after the 3rd step: the note tells it
    want = w.body(_expected(w, 3, 0, NOTE.format(count=3) + guidance(1, 0)), False)
    assert upstream.requests[0].body == orjson.dumps(want)


async def test_in_observe_mode_a_fold_is_logged_and_counted_and_changes_no_byte(
    upstream: FakeUpstream, make_proxy
) -> None:
    fake = ChatFake()
    upstream.handler = fake.handle
    base = await make_proxy({**COLLAPSE, "mode": "observe"})
    w = WIRES["chat"]
    raw = orjson.dumps(w.body(_history(w, 4), False))
    status, _ = await _post(base, w.path(False), raw)
    assert status == 200
    assert upstream.requests[0].body == raw
    async with aiohttp.ClientSession() as s, s.get(base + "/loop-guard") as r:
        snap = await r.json()
    assert snap["recovery"] == {
        "collapsed_requests": 0,
        "folded_steps": 0,
        "prefix_breaks": 0,
        **NO_RESAMPLE,
    }
    assert snap["observed_per_rule"]["collapse"] == 1
    assert snap["observed"]["fold"] == 1
