"""``previous_response_id`` chains through the real server, with the official openai
SDK (``client.responses.create``, streamed and not) against a stateful fake Responses server that
rebuilds the history as the real one does (and rejects a call left without its output): a looping
chain is guarded as in full-input form and stopped; the user can go on from the stopped response;
an id loopguard does not hold (a restart) is forwarded unguarded, counted and logged once."""

from __future__ import annotations

import gzip
import re
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from openai import AsyncOpenAI
from structlog.testing import capture_logs

from proxy.request.response_store import NOT_RUN_TEXT, UNKNOWN_PREVIOUS
from tests.conftest import ProxyFactory
from tests.helpers.fake_responses import FakeResponses, custom_call, function_call, message
from tests.helpers.fakes import FakeUpstream
from tests.helpers.proxy_server import serve

RESULT = "print('hi')"
PROMPT = "Fix the bug in app.py"
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        "strict": False,
    },
    {"type": "custom", "name": "shell", "description": "Run a shell command (raw text)."},
]
DONE = "app.py prints hi; nothing to fix."


def looping_script(tool: str = "function") -> Any:
    """Repeats one call for ever; answers a user who speaks after the calls (not a loopguard
    reminder) with a message."""

    def script(n: int, body: dict[str, Any]) -> list[dict[str, Any]]:
        history = body["input"]
        calls = [i for i in history if i.get("type") in ("function_call", "custom_tool_call")]
        last = history[-1] if history else {}
        content = last.get("content")
        text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content or [])
        if calls and last.get("role") == "user" and not text.startswith("[loopguard]"):
            return [message(DONE)]
        if tool == "custom":
            return [custom_call("shell", "cat app.py")]
        return [function_call("read_file", '{"path": "app.py"}')]

    return script


async def respond(client: AsyncOpenAI, stream: bool, **kwargs: Any) -> Any:
    """One ``client.responses.create``; streamed, the response of ``response.completed``."""
    if not stream:
        return await client.responses.create(model="m", tools=TOOLS, **kwargs)  # type: ignore[arg-type]
    events = await client.responses.create(model="m", tools=TOOLS, stream=True, **kwargs)  # type: ignore[arg-type]
    final = None
    async for ev in events:
        if ev.type == "response.completed":
            final = ev.response
    assert final is not None
    return final


async def chain_loop(client: AsyncOpenAI, stream: bool, chained: bool = True) -> tuple[Any, int, int]:
    """An agent loop that runs every call (the same result each time) until the model answers
    without one. ``chained``: send only the new items with ``previous_response_id`` (else the
    whole history, ``store: false``). Returns the last response, the calls run, the requests."""
    history: list[Any] = [{"role": "user", "content": PROMPT}]
    new: list[Any] = list(history)
    prev = None
    runs = 0
    for step in range(1, 21):
        if chained:
            final = await respond(
                client, stream, input=new, **({"previous_response_id": prev} if prev else {})
            )
        else:
            final = await respond(client, stream, input=history, store=False)
        prev = final.id
        history += [i.model_dump(exclude_none=True) for i in final.output]
        calls = [i for i in final.output if i.type in ("function_call", "custom_tool_call")]
        if not calls:
            return final, runs, step
        runs += len(calls)
        kind = {"function_call": "function_call_output", "custom_tool_call": "custom_tool_call_output"}
        new = [{"type": kind[c.type], "call_id": c.call_id, "output": RESULT} for c in calls]
        history += new
    raise AssertionError("the loop was never stopped")


def seen(history: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What the model saw of a history: each item's kind, and its text or tool name."""
    out: list[tuple[Any, ...]] = []
    for i in history:
        kind = i.get("type", "message")
        if kind == "message":
            content = i["content"]
            text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
            out.append((kind, i["role"], text))
        elif kind.endswith("_output"):
            out.append((kind, i["output"]))
        else:
            out.append((kind, i.get("name")))
    return out


async def get(base: str, path: str) -> Any:
    async with aiohttp.ClientSession() as s, s.get(base + path) as r:
        return await (r.json() if path == "/loop-guard" else r.text())


@pytest.mark.parametrize("tool", ["function", "custom"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_looping_chain_is_guarded_like_the_full_input_form_and_stopped(
    upstream: FakeUpstream, make_proxy: ProxyFactory, stream: bool, tool: str
) -> None:
    fake = FakeResponses(looping_script(tool), stateful=True)
    upstream.handler = fake.handle
    base = await make_proxy()
    client = AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0)
    try:
        final, runs, requests = await chain_loop(client, stream)
        # the same loop sending its whole history each time (store: false: nothing kept)
        full_fake = FakeResponses(looping_script(tool), stateful=True)
        upstream.handler = full_fake.handle
        full_final, full_runs, full_requests = await chain_loop(client, stream, chained=False)
    finally:
        await client.close()
    assert (runs, requests) == (full_runs, full_requests) == (6, 7)  # as in the demo
    assert [i.type for i in final.output] == ["message"]
    assert final.output_text.startswith("[loopguard] Stopped: the model kept calling")
    assert final.output_text == full_final.output_text
    # each chained request carried only its new item (plus loopguard's reminder after the 3rd and
    # the 5th call); the upstream's rebuilt history is what the full form showed the model
    assert [len(b["input"]) for b in fake.bodies] == [1, 1, 1, 2, 1, 2, 1]
    assert [b.get("previous_response_id") is not None for b in fake.bodies] == [False] + [True] * 6
    assert [seen(h) for h in fake.histories] == [seen(h) for h in full_fake.histories]
    last = seen(fake.histories[-1])
    reminders = [s for s in last if s[:2] == ("message", "user") and s[2].startswith("[loopguard]")]
    withheld = [s for s in last if s[0].endswith("_output") and s[1].startswith("[loopguard] The result")]
    assert (len(reminders), len(withheld)) == (2, 1)
    stats = await get(base, "/loop-guard")
    assert stats["unguarded"] == {}
    assert stats["stops"] == 2  # one per form
    assert stats["responses_store"]["entries"] == 7  # the chained answers; store: false kept none


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_the_user_goes_on_from_a_stopped_response(
    upstream: FakeUpstream, make_proxy: ProxyFactory, stream: bool
) -> None:
    """The upstream still holds its own answer (the call loopguard dropped): loopguard gives it
    that call's output and the stop message first, so the chain goes on (a real server rejects
    a call without its output)."""
    fake = FakeResponses(looping_script(), stateful=True)
    upstream.handler = fake.handle
    base = await make_proxy()
    client = AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0)
    try:
        stopped, _, _ = await chain_loop(client, stream)
        after = await respond(client, stream, input="Thanks. Is it fixed?", previous_response_id=stopped.id)
    finally:
        await client.close()
    assert after.output_text == DONE
    dropped = fake.held[stopped.id][-1]  # the model's 7th call, which the agent never got
    assert dropped["type"] == "function_call"
    assert seen(fake.histories[-1][-4:]) == [
        ("function_call", "read_file"),
        ("function_call_output", NOT_RUN_TEXT),
        ("message", "assistant", stopped.output_text),
        ("message", "user", "Thanks. Is it fixed?"),
    ]
    assert fake.histories[-1][-3]["call_id"] == dropped["call_id"]
    assert fake.bodies[-1]["input"][-1] == {
        "type": "message",
        "role": "user",
        "content": "Thanks. Is it fixed?",
    }


async def test_an_unknown_previous_response_is_forwarded_unguarded_counted_and_logged_once(
    upstream: FakeUpstream,
) -> None:
    """The proxy restarts in the middle of a chain (the upstream still holds it): the rest of that
    chain goes through unguarded, each request counted, the chain logged once; a second chain
    lost the same way is logged too."""
    fake = FakeResponses(looping_script(), stateful=True)
    upstream.handler = fake.handle
    prev: dict[str, str] = {}

    async def steps(base: str, who: str, n: int) -> None:
        client = AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0)
        try:
            for _ in range(n):
                if who in prev:
                    call = fake.held[prev[who]][-1]
                    items = [{"type": "function_call_output", "call_id": call["call_id"], "output": RESULT}]
                    r = await client.responses.create(model="m", input=items, previous_response_id=prev[who])
                else:
                    r = await client.responses.create(model="m", input=PROMPT)
                prev[who] = r.id
        finally:
            await client.close()

    async with serve(None, upstream.url) as (base, _):
        await steps(base, "a", 3)
        await steps(base, "b", 2)
    with capture_logs() as logs:
        async with serve(None, upstream.url) as (base, _):
            sent_before = len(upstream.requests)
            await steps(base, "a", 5)  # calls 4–8 of a loop: unguarded, so never reminded
            await steps(base, "b", 1)
            stats = await get(base, "/loop-guard")
            metrics = await get(base, "/loop-guard/metrics")
    assert stats["unguarded"] == {UNKNOWN_PREVIOUS: 6}
    assert f'loopguard_unguarded_requests_total{{reason="{UNKNOWN_PREVIOUS}"}} 6.0' in metrics
    assert (stats["reminders_injected"], stats["results_withheld"], stats["stops"]) == (0, 0, 0)
    assert not any(b"[loopguard]" in r.body for r in upstream.requests[sent_before:])
    unknown = [e for e in logs if e["event"] == UNKNOWN_PREVIOUS]
    assert len(unknown) == 2  # once per chain
    assert unknown[0]["log_level"] == "warning" and "previous_response_id" not in unknown[0]
    assert re.fullmatch(r"id-[0-9a-f]{16}", unknown[0]["previous_response_id_digest"])
    requests = [e for e in logs if e["event"] == "request"]
    assert [e.get("unguarded") for e in requests] == [UNKNOWN_PREVIOUS] * 6
    assert stats["responses_store"]["entries"] == 0  # nothing of a lost chain is kept


#: Every response-side check off: the answers are not read by the response side at all.
NO_RESPONSE_SIDE = {
    "stop": {"after_ignored_denials": 0, "on_cap": False},
    "guards": {"monologue": {"stop_at": 0}, "escalation": {"stop": False}},
    "response": {
        "max_calls_per_response": 0,
        "max_identical_per_response": 0,
        "max_identical_reads_per_response": 0,
        "degenerate_text": {"enabled": False},
    },
}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_chains_are_kept_with_the_response_side_off_and_answers_pass_byte_for_byte(
    upstream: FakeUpstream, make_proxy: ProxyFactory, stream: bool
) -> None:
    fake = FakeResponses(looping_script(), stateful=True)
    upstream.handler = fake.handle
    base = await make_proxy(NO_RESPONSE_SIDE)
    prev = None
    got: list[bytes] = []
    async with aiohttp.ClientSession() as s:
        for k in range(8):
            if prev is None:
                body: dict[str, Any] = {"model": "m", "input": PROMPT}
            else:
                call = fake.held[prev][-1]
                out = {"type": "function_call_output", "call_id": call["call_id"], "output": RESULT}
                body = {"model": "m", "input": [out], "previous_response_id": prev}
            async with s.post(f"{base}/v1/responses", json={**body, "stream": stream}) as r:
                assert r.status == 200
                got.append(await r.read())
            prev = list(fake.held)[-1]
            assert k == 0 or fake.bodies[-1]["previous_response_id"] is not None
    assert got == fake.answers  # nothing read by the response side: the exact bytes
    stats = await get(base, "/loop-guard")
    assert stats["unguarded"] == {} and stats["stops"] == 0
    assert (stats["reminders_injected"], stats["results_withheld"]) == (2, 2)  # results 6, 7 withheld
    assert stats["responses_store"]["entries"] == 8


async def test_a_gzip_answer_is_kept(upstream: FakeUpstream, make_proxy: ProxyFactory) -> None:
    """An upstream that compresses its JSON answers (the response side leaves those unread):
    the store still learns each answer, so the chain stays guarded."""
    fake = FakeResponses(looping_script(), stateful=True)

    async def gzipped(request: web.Request, raw: bytes) -> web.StreamResponse:
        plain = await fake.handle(request, raw)
        assert isinstance(plain, web.Response) and plain.body is not None
        data = gzip.compress(bytes(plain.body))  # type: ignore[arg-type]
        return web.Response(
            body=data, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"}
        )

    upstream.handler = gzipped
    base = await make_proxy()
    client = AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0)
    try:
        r = await respond(client, False, input=PROMPT)
        for _ in range(7):
            items = [{"type": "function_call_output", "call_id": r.output[0].call_id, "output": RESULT}]
            r = await respond(client, False, input=items, previous_response_id=r.id)
    finally:
        await client.close()
    stats = await get(base, "/loop-guard")
    assert stats["unguarded"] == {} and stats["stops"] == 0  # a compressed answer is not rewritten
    assert (stats["reminders_injected"], stats["results_withheld"]) == (2, 2)  # but the chain is guarded
    assert stats["responses_store"]["entries"] == 8


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(
    ("where", "tenant_a", "tenant_b"),
    [
        pytest.param("Authorization", "Bearer sk-tenant-a", "Bearer sk-tenant-b", id="bearer"),
        pytest.param("api-key", "azure-key-a", "azure-key-b", id="azure_api_key"),
        pytest.param("x-goog-api-key", "AIza-a", "AIza-b", id="google_api_key"),
        pytest.param("Authorization", "Bearer sk-tenant-a", None, id="no_credential"),
        pytest.param("?api-key=", "azure-key-a", "azure-key-b", id="query_api_key"),
        pytest.param("?key=", "AIza-a", "AIza-b", id="query_key"),
        pytest.param("?key=", "AIza-a", None, id="query_key_then_none"),
    ],
)
async def test_a_response_id_is_known_only_under_the_credential_that_created_it(
    upstream: FakeUpstream,
    make_proxy: ProxyFactory,
    where: str,
    tenant_a: str,
    tenant_b: str | None,
    stream: bool,
) -> None:
    """Tenant A's chain reads the same file three times; another credential naming A's last
    response id must not be guarded over A's history (its reminder would quote A's call into
    the other tenant's request): to it the id is unknown, and its bytes go upstream unchanged.
    A itself, continuing the same id, gets the reminder. A credential is whatever the upstream
    could read: a header, or a key in the query string (``?api-key=``, ``?key=``), with the
    same headers for both tenants."""
    fake = FakeResponses(looping_script(), stateful=True)
    upstream.handler = fake.handle
    base = await make_proxy()

    def tenant(value: str | None) -> tuple[str, dict[str, str]]:
        if where.startswith("?"):  # the same headers for both: only the query tells them apart
            return f"{where}{value}" if value else "", {"Authorization": "Bearer shared-gateway-key"}
        return "", {where: value} if value is not None else {}

    a, b = tenant(tenant_a), tenant(tenant_b)

    async def post(who: tuple[str, dict[str, str]], body: dict[str, Any]) -> Any:
        query, headers = who
        async with (
            aiohttp.ClientSession() as s,
            s.post(base + "/v1/responses" + query, json={**body, "stream": stream}, headers=headers) as r,
        ):
            assert r.status == 200
            if not stream:
                return await r.json()
            text = (await r.read()).decode()
            done = [orjson.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
            return next(e["response"] for e in done if e.get("type") == "response.completed")

    answer = await post(a, {"model": "m", "input": PROMPT})
    for _ in range(2):
        call = answer["output"][-1]
        out = [{"type": "function_call_output", "call_id": call["call_id"], "output": RESULT}]
        answer = await post(a, {"model": "m", "input": out, "previous_response_id": answer["id"]})
    call = answer["output"][-1]
    third = {
        "model": "m",
        "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": RESULT}],
        "previous_response_id": answer["id"],
        "stream": stream,
    }
    sent = len(upstream.requests)
    await post(b, third)
    await post(a, third)
    other, owner = (r.json() for r in upstream.requests[sent:])
    assert other == third  # unguarded: as the other tenant sent it
    assert [i.get("type", "message") for i in owner["input"]] == ["function_call_output", "message"]
    assert seen(owner["input"][1:])[0][:2] == ("message", "user")
    assert seen(owner["input"][1:])[0][2].startswith("[loopguard]")
    stats = await get(base, "/loop-guard")
    assert stats["unguarded"] == {UNKNOWN_PREVIOUS: 1}
    assert stats["reminders_injected"] == 1
