"""What the agent and the model send never leaves through the proxy's own outputs (DESIGN §7:
never message content, never credentials).

A full run of the real ``loopguard serve`` (a child process, ``--log-level debug``) in front of a
fake model that loops, so that reminders, withholds, stops, cuts and circuit-breaker incidents
happen, with a marker in every request header, the upstream URL's credentials and query, every
message, the tool definitions, every tool call id and argument, every tool result, the model's
answers and the model's response headers; chat completions JSON and SSE, and the Responses API
(``POST /v1/responses``); plus malformed requests that make aiohttp log, upstream failures and
agent disconnects; and Anthropic Messages (``POST /v1/messages?beta=true``, the marker in
``x-api-key``, ``authorization``, ``anthropic-version``, ``anthropic-beta``, ``system``, thinking
signatures and every block). Then the marker must be in none of: stdout, stderr,
the incident log, ``GET /loop-guard/metrics``, ``GET /loop-guard`` and its per-conversation views,
``GET /loop-guard/healthz``.

What the proxy does log by design, and the test therefore keeps free of the marker: tool names
(action evidence and incidents), the model name, the URL path (never its query), and the
conversation key (the digest of a header value or ``prompt_cache_key``; else a hash). The one
per-conversation ledger view (``?conversation=``, turn_guard on) shows each call's target (its
``path``/``command`` argument, DESIGN §6.3) and nothing else of the arguments: pinned below.

The logs must also hold the expected events (request lines with their rule names, bad_request
lines, incidents), so that an empty or broken log cannot pass.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.request.conversation import key_digest
from tests.helpers.fakes import FakeUpstream, completion, sse_events, tool_call
from tests.helpers.proxy_server import serve_process

PREFIX = "SECRET-MARKER"
UID = uuid.uuid4().hex
MARKER = f"{PREFIX}-{UID}"
ADMIN = f"{PREFIX}-admin-{uuid.uuid4().hex}"
CHAT = "/v1/chat/completions"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def leaks(text: str) -> list[str]:
    """The marker's (and its fragments') places in ``text``, with some context."""
    out = []
    for needle in (PREFIX, UID, UID[:12]):
        i = text.find(needle)
        if i >= 0:
            out.append(text[max(0, i - 300) : i + 100])
    return out


# --- the fake model ---------------------------------------------------------------------------

#: Response headers the model server sends (a session cookie, request ids, an org name).
UPSTREAM_HEADERS = {
    "Set-Cookie": f"session={MARKER}; Path=/",
    "x-request-id": MARKER,
    "openai-organization": MARKER,
    "x-secret-echo": MARKER,
}


def loop_call(n: int) -> dict[str, Any]:
    """The one call the looping model makes every time (the same tool, the same arguments)."""
    args = orjson.dumps({"path": f"src/{MARKER}.py", "query": MARKER, "token": f"sk-{MARKER}"}).decode()
    return tool_call("read_file", args, f"call_{MARKER}_{n}")


def answer_for(mode: str, n: int) -> tuple[list[dict[str, Any]] | None, str | None]:
    """(tool calls, content) of the fake model's answer number ``n`` in a conversation of
    ``mode``."""
    if mode == "runaway":  # one answer with four identical writes: cut to the first two
        calls = [loop_call(n * 10 + i) for i in range(4)]
        for c in calls:
            c["function"]["name"] = "write_file"
        return calls, f"Writing it four times {MARKER}"
    if mode == "degenerate":  # a text that ends in one span over and over: cut (SSE) / reported
        return None, f"The answer is {MARKER}. " + f"{MARKER} again and " * 40
    return [loop_call(n)], f"Let me read the file again, {MARKER}."


def responses_answer(n: int) -> dict[str, Any]:
    """The looping model's answer in the Responses API: some text and the same call again."""
    call = loop_call(n)
    return {
        "id": f"resp_{MARKER}",
        "object": "response",
        "model": "fake-model",
        "status": "completed",
        "output": [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": f"Reading it again, {MARKER}."}],
            },
            {
                "type": "function_call",
                "call_id": call["id"],
                "name": "read_file",
                "arguments": call["function"]["arguments"],
            },
        ],
    }


def messages_answer(n: int) -> dict[str, Any]:
    """The looping model's answer in Anthropic Messages: thinking, some text, the same call again."""
    call = loop_call(n)
    return {
        "id": f"msg_{MARKER}",
        "type": "message",
        "role": "assistant",
        "model": "fake-model",
        "content": [
            {"type": "thinking", "thinking": f"thinking about {MARKER}", "signature": MARKER},
            {"type": "text", "text": f"Reading it again, {MARKER}."},
            {
                "type": "tool_use",
                "id": f"toolu_{MARKER}_{n}",
                "name": "read_file",
                "input": orjson.loads(call["function"]["arguments"]),
            },
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }


async def model(request: web.Request, body: bytes) -> web.StreamResponse:
    mode = request.headers.get("x-fake-mode", "loop")
    if request.method == "GET":  # /v1/models and the like
        return web.json_response({"data": [{"id": MARKER}]}, headers=UPSTREAM_HEADERS)
    try:
        req = orjson.loads(body)
        assert isinstance(req, dict)
    except Exception:
        return web.json_response(
            {"error": {"message": f"bad JSON: {body[:200]!r}", "type": "invalid_request_error"}},
            status=400,
            headers=UPSTREAM_HEADERS,
        )
    if mode == "error":
        return web.json_response(
            {"error": {"message": f"model crashed on {MARKER}", "type": "server_error"}},
            status=500,
            headers=UPSTREAM_HEADERS,
        )
    if mode == "bad_header":  # an answer aiohttp's client cannot parse: the proxy's 502
        assert request.transport is not None
        request.transport.write(
            b"HTTP/1.1 200 OK\r\nX-Broken: " + MARKER.encode() + b"\r\r\nContent-Length: 2\r\n\r\n{}"
        )
        request.transport.close()
        return web.Response()
    if request.path.endswith("/v1/messages"):
        n = sum(1 for m in req.get("messages", []) if m.get("role") == "assistant")
        return web.json_response(messages_answer(n), headers=UPSTREAM_HEADERS)
    if request.path.endswith("/responses"):
        n = sum(1 for item in req.get("input", []) if item.get("type") == "function_call")
        return web.json_response(responses_answer(n), headers=UPSTREAM_HEADERS)
    n = sum(1 for m in req.get("messages", []) if m.get("role") == "assistant")
    calls, content = answer_for(mode, n)
    if not req.get("stream"):
        return web.json_response(
            completion(calls, content=content),
            headers=UPSTREAM_HEADERS,
            dumps=lambda o: orjson.dumps(o).decode(),
        )
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **UPSTREAM_HEADERS})
    await resp.prepare(request)
    events = sse_events(calls, content=content)
    if mode == "drop":  # the model server dies mid-stream
        events = events[:3]
    for i, ev in enumerate(events):
        await resp.write(ev)
        if mode == "slow" and i >= 2:
            await asyncio.sleep(0.2)
    if mode == "drop":
        assert request.transport is not None
        request.transport.close()
        return resp
    await resp.write_eof()
    return resp


# --- the agent --------------------------------------------------------------------------------


def agent_headers(conversation: str | None, mode: str) -> dict[str, str]:
    """Every header an agent may send, each carrying the marker (but the conversation key)."""
    h = {
        "Authorization": f"Bearer sk-{MARKER}",
        "x-api-key": MARKER,
        "api-key": MARKER,
        "Cookie": f"session={MARKER}; csrftoken={MARKER}",
        "User-Agent": f"secret-agent/{MARKER}",
        "OpenAI-Organization": MARKER,
        "OpenAI-Project": MARKER,
        "X-Custom-Secret": MARKER,
        "Referer": f"https://example.invalid/{MARKER}",
        "X-Forwarded-For": f"10.0.0.1, {MARKER}",
        "x-fake-mode": mode,
    }
    if conversation is not None:
        h["x-session-id"] = conversation
    return h


def first_messages() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": f"You are an agent. The deploy key is {MARKER}."},
        {"role": "user", "content": f"Fix the bug; my password is {MARKER}."},
    ]


def request_body(messages: list[dict[str, Any]], stream: bool, conversation: str | None) -> bytes:
    body: dict[str, Any] = {
        "model": "fake-model",
        "messages": messages,
        "stream": stream,
        "user": MARKER,
        "metadata": {"secret": MARKER},
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "read_file",
                    "description": f"Reads a file {MARKER}",
                    "parameters": {"type": "object", "properties": {MARKER: {"type": "string"}}},
                },
            }
        ],
    }
    if conversation is not None:
        body["prompt_cache_key"] = MARKER  # a header names the conversation: this is not its key
    return orjson.dumps(body)


def assemble(raw: bytes) -> dict[str, Any]:
    """The assistant message of an SSE answer (content and tool calls put together)."""
    content = ""
    calls: dict[int, dict[str, Any]] = {}
    for line in raw.split(b"\n"):
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        obj = orjson.loads(line[6:])
        if "error" in obj:
            continue
        for choice in obj.get("choices", []):
            delta = choice.get("delta") or {}
            content += delta.get("content") or ""
            for tc in delta.get("tool_calls") or []:
                slot = calls.setdefault(tc["index"], {"type": "function", "function": {"arguments": ""}})
                if tc.get("id"):
                    slot["id"] = tc["id"]
                fn = tc.get("function") or {}
                if fn.get("name"):
                    slot["function"]["name"] = fn["name"]
                slot["function"]["arguments"] += fn.get("arguments") or ""
    msg: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
    return msg


async def conversation(
    s: aiohttp.ClientSession, base: str, key: str | None, mode: str, stream: bool, steps: int
) -> list[int]:
    """An agent that runs every call the model makes (each result carrying the marker, the same
    every time) and, when its turn is stopped, says 'continue'. Returns the statuses."""
    messages = first_messages()
    statuses = []
    for _ in range(steps):
        async with s.post(
            f"{base}{CHAT}?api-version={MARKER}",
            data=request_body(messages, stream, key),
            headers=agent_headers(key, mode),
        ) as r:
            try:
                raw = await r.read()
            except aiohttp.ClientPayloadError:  # the proxy ends a stream the upstream broke
                statuses.append(-1)
                break
            statuses.append(r.status)
        if r.status != 200:
            break
        msg = assemble(raw) if stream else orjson.loads(raw)["choices"][0]["message"]
        msg["reasoning_content"] = f"thinking about {MARKER}"
        messages.append(msg)
        if not msg.get("tool_calls"):
            # a bare "continue" goes on with the same request (a continuation, whole text), so the
            # circuit breaker keeps counting across the stop; "continue <more>" would be a new one
            messages.append({"role": "user", "content": "continue"})
            continue
        for tc in msg["tool_calls"]:
            result = f"Error: {MARKER} is not readable\n" if mode == "failing" else f"def f():  # {MARKER}\n"
            messages.append({"role": "tool", "tool_call_id": tc["id"], "content": result})
    return statuses


async def responses_conversation(
    s: aiohttp.ClientSession, base: str, key: str | None, steps: int
) -> list[int]:
    """The same looping agent on ``POST /v1/responses``: input items, each call's output the same."""
    items: list[dict[str, Any]] = [
        {"role": "user", "content": f"Fix the bug; my password is {MARKER}."},
    ]
    statuses = []
    for _ in range(steps):
        body = {
            "model": "fake-model",
            "instructions": f"You are an agent. The deploy key is {MARKER}.",
            "input": items,
            "user": MARKER,
            "tools": [{"type": "function", "name": "read_file", "description": MARKER, "parameters": {}}],
        }
        async with s.post(
            # a key in the query scopes the kept responses (store_key) and is never logged either
            f"{base}/v1/responses?api-version={MARKER}&api-key={MARKER}",
            data=orjson.dumps(body),
            headers=agent_headers(key, "loop"),
        ) as r:
            statuses.append(r.status)
            answer = await r.json()
        if not any(item["type"] == "function_call" for item in answer["output"]):  # stopped
            items += [*answer["output"], {"role": "user", "content": "continue"}]
            continue
        for item in answer["output"]:
            items.append(item)
            if item["type"] == "function_call":
                items.append(
                    {
                        "type": "function_call_output",
                        "call_id": item["call_id"],
                        "output": f"def f():  # {MARKER}",
                    }
                )
    return statuses


async def messages_conversation(
    s: aiohttp.ClientSession, base: str, key: str | None, steps: int
) -> list[int]:
    """The same looping agent on Anthropic Messages (``POST /v1/messages?beta=true``, Claude
    Code's path): the marker in ``system``, every message, every ``tool_result``, the
    ``anthropic-version`` / ``anthropic-beta`` headers (``x-api-key`` and ``authorization`` are
    in every agent's headers)."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": f"Fix the bug; my password is {MARKER}."}]},
    ]
    headers = {**agent_headers(key, "loop"), "anthropic-version": MARKER, "anthropic-beta": MARKER}
    statuses = []
    for _ in range(steps):
        body = {
            "model": "fake-model",
            "max_tokens": 1024,
            "system": [
                {
                    "type": "text",
                    "text": f"The deploy key is {MARKER}.",
                    "cache_control": {"type": "ephemeral"},
                }
            ],
            "messages": messages,
            "metadata": {"user_id": MARKER},
            "tools": [{"name": "read_file", "description": MARKER, "input_schema": {"type": "object"}}],
        }
        async with s.post(
            f"{base}/v1/messages?beta=true&key={MARKER}", data=orjson.dumps(body), headers=headers
        ) as r:
            statuses.append(r.status)
            answer = await r.json()
        messages.append({"role": "assistant", "content": answer["content"]})
        results = [
            {
                "type": "tool_result",
                "tool_use_id": b["id"],
                "content": [{"type": "text", "text": f"def f():  # {MARKER}"}],
            }
            for b in answer["content"]
            if b["type"] == "tool_use"
        ]
        messages.append({"role": "user", "content": results or "continue"})
    return statuses


async def hang_up_mid_stream(s: aiohttp.ClientSession, base: str) -> None:
    """An agent that reads the start of a stream and goes away."""
    messages = first_messages()
    async with s.post(
        base + CHAT,
        data=request_body(messages, True, "conv-hangup"),
        headers=agent_headers("conv-hangup", "slow"),
    ) as r:
        assert r.status == 200
        await r.content.readany()
        r.close()  # hang up: the connection goes, not back to the pool


async def raw_exchange(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        await writer.drain()
        return await asyncio.wait_for(reader.read(200), 5)
    finally:
        writer.close()


def malformed_requests() -> list[bytes]:
    """Requests aiohttp refuses (a 400 it logs through the proxy's filter), each with the marker."""
    m = MARKER.encode()
    body = b'{"messages": [{"role": "user", "content": "' + m + b'"}]}'
    return [
        # a header line ending in a stray CR
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-" + m + b"\r\r\n"
        b"Content-Length: 2\r\n\r\n{}",
        # an Authorization header over the proxy's 64 KiB header limit
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-"
        + m
        + b"x" * 70_000
        + b"\r\nContent-Length: 2\r\n\r\n{}",
        # a malformed chunked body
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-" + m + b"\r\n"
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\n" + body + b"\r\n0\r\n\r\n",
        # bad request lines
        b"POST /v1/chat/completions?key=" + m + b" HTTP/1.1 junk\r\nHost: x\r\n\r\n",
        m + b"\r\n\r\n",
        b"GET /v1/models?key=" + m + b" HTTP/9.9\r\nHost: x\r\n\r\n",
        # a header without a colon, a bad Content-Length
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-" + m + b"\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + m + b"\r\n\r\n",
    ]


# --- the run ----------------------------------------------------------------------------------


async def start_proxy(upstream_url: str, tmp_path: Path) -> tuple[Any, str, Path, Path, Path]:
    port = free_port()
    incidents = tmp_path / "incidents.jsonl"
    cfg = tmp_path / "lg.yaml"
    cfg.write_text(
        orjson.dumps(
            {
                "admin_token": ADMIN,
                "upstream": {"max_body_mb": 1},
                "guards": {
                    "circuit_breaker": {"incident_log": str(incidents)},
                    "turn_guard": {"enabled": True},
                },
            }
        ).decode()
    )
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("wb") as o, err.open("wb") as e:
        proc = await serve_process(upstream_url, port, cfg, ["--log-level", "debug"], stdout=o, stderr=e)
    for _ in range(400):
        if b'"listening"' in err.read_bytes() or proc.returncode is not None:
            break
        await asyncio.sleep(0.05)
    assert b'"listening"' in err.read_bytes(), err.read_text()
    return proc, f"http://127.0.0.1:{port}", out, err, incidents


async def test_no_secret_reaches_logs_incidents_metrics_or_stats(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    upstream.handler = model
    host_port = upstream.url.removeprefix("http://").removesuffix("/v1")
    upstream_url = f"http://user:{MARKER}@{host_port}/v1?api-version={MARKER}"
    proc, base, out_path, err_path, incident_path = await start_proxy(upstream_url, tmp_path)
    port = int(base.rsplit(":", 1)[1])
    admin = {"Authorization": f"Bearer {ADMIN}"}
    views: dict[str, bytes] = {}
    try:
        async with aiohttp.ClientSession() as s:
            runs = [
                ("conv-json", "loop", False, 16),
                ("conv-sse", "loop", True, 16),
                (None, "loop", True, 10),  # no header: the fingerprint key
                ("conv-failing", "failing", False, 8),
                ("conv-ledger", "loop", False, 3),
                ("conv-runaway-json", "runaway", False, 2),
                ("conv-runaway-sse", "runaway", True, 2),
                ("conv-degenerate-json", "degenerate", False, 1),
                ("conv-degenerate-sse", "degenerate", True, 1),
                ("conv-error", "error", False, 1),
                ("conv-drop", "drop", True, 1),
                ("conv-bad-header", "bad_header", False, 1),
            ]
            statuses = await asyncio.gather(
                *(conversation(s, base, *run) for run in runs),
                responses_conversation(s, base, "conv-responses", 10),
                responses_conversation(s, base, None, 8),
                messages_conversation(s, base, "conv-messages", 10),
                messages_conversation(s, base, None, 8),
            )
            assert [502] in statuses and [500] in statuses and [-1] in statuses, statuses
            await hang_up_mid_stream(s, base)
            # passthrough paths, a long (accepted) Authorization, a body over max_body_mb, not JSON
            async with s.get(f"{base}/v1/models?key={MARKER}", headers=agent_headers(None, "loop")) as r:
                assert r.status == 200
            long_auth = {**agent_headers(None, "loop"), "Authorization": f"Bearer {MARKER}" + "t" * 9000}
            async with s.post(
                base + CHAT, data=request_body(first_messages(), False, None), headers=long_auth
            ) as r:
                assert r.status == 200
            big = b'{"messages": [{"role": "user", "content": "' + MARKER.encode() * 40_000 + b'"}]}'
            async with s.post(base + CHAT, data=big, headers=agent_headers(None, "loop")) as r:
                assert r.status == 413
            async with s.post(
                base + CHAT, data=f"not json {MARKER}", headers=agent_headers(None, "loop")
            ) as r:
                assert r.status == 400
            for payload in malformed_requests():
                head = await raw_exchange(port, payload)
                assert head.startswith((b"HTTP/1.0 4", b"HTTP/1.1 4")), (payload[:80], head)
            # the proxy's own endpoints, with a wrong token (the marker) and the right one
            async with s.get(base + "/loop-guard", headers={"Authorization": f"Bearer {MARKER}"}) as r:
                assert r.status == 401
            for path in ("/loop-guard", "/loop-guard/metrics", "/loop-guard/healthz"):
                async with s.get(base + path, headers=admin) as r:
                    assert r.status == 200, path
                    views[path] = await r.read()
            for key in ("conv-json", "conv-sse", "conv-failing", "conv-ledger"):
                async with s.get(f"{base}/loop-guard?conversation={key}", headers=admin) as r:
                    assert r.status == 200, key
                    views[key] = await r.read()
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 40)
    out, err = out_path.read_text(), err_path.read_text()
    incident_log = incident_path.read_text()

    # the marker really went everywhere it could: the upstream got it in every header and body
    assert len(upstream.requests) > 40
    for rec in upstream.requests:
        if rec.method == "POST":
            assert MARKER in rec.body.decode(errors="replace") or rec.body == b"{}"
        assert rec.headers.get("x-api-key") == MARKER, rec.headers
        if rec.path_qs.startswith("/v1/messages"):
            assert (rec.headers.get("anthropic-version"), rec.headers.get("anthropic-beta")) == (
                MARKER,
                MARKER,
            )

    # nowhere in what the proxy writes or shows
    assert proc.returncode == 0
    assert out == ""  # the proxy writes to stderr only
    assert leaks(err) == []
    assert leaks(incident_log) == []
    for name, view in views.items():
        text = view.decode()
        if name.startswith("conv-"):
            text = without_targets(orjson.loads(view))
        assert leaks(text) == [], name

    # ... and that is not because they are empty
    lines = [orjson.loads(x) for x in err.splitlines()]  # JSON lines only: nothing else got out
    events = Counter(x["event"] for x in lines)
    assert events["listening"] == events["shutting_down"] == events["stopped"] == 1
    # one line per malformed request but the one that is no HTTP at all (aiohttp tells that one
    # at debug level to its logger, where nothing passes: internet noise, TLS on a plain port)
    assert events["bad_request"] == len(malformed_requests()) - 1, events
    requests = [x for x in lines if x["event"] == "request"]
    too_large = [x for x in requests if x.get("status") == 413]
    assert len(too_large) == 1  # the 413 is logged too, and never forwarded
    assert len(requests) - len(too_large) == len(upstream.requests)  # one per forwarded request
    rules = Counter((a["rule"], a["kind"]) for x in requests for a in x["actions"])
    for rule, kind in [
        ("repeat_reminder", "remind"),
        ("circuit_breaker", "withhold"),
        ("turn_guard", "withhold"),
        ("stop", "stop"),
        ("runaway", "cut"),
        ("degenerate_text", "cut"),
        ("repeated_failure", "remind"),
    ]:
        assert rules[(rule, kind)] > 0, (rule, kind, rules)
    assert any(x.get("disconnected") for x in requests)
    assert any(x.get("upstream_error") for x in requests)
    assert {x["conversation"] for x in requests} >= {
        key_digest(k) for k in ("conv-json", "conv-sse", "conv-failing")
    }
    on_responses = Counter(a["rule"] for x in requests if x["path"] == "/v1/responses" for a in x["actions"])
    assert on_responses["repeat_reminder"] > 0 and on_responses["circuit_breaker"] > 0, on_responses
    on_messages = Counter(a["rule"] for x in requests if x["path"] == "/v1/messages" for a in x["actions"])
    assert on_messages["repeat_reminder"] > 0 and on_messages["circuit_breaker"] > 0, on_messages
    kinds = Counter(orjson.loads(x)["kind"] for x in incident_log.splitlines())
    assert kinds["duplicate"] >= 2 and kinds["stop"] >= 2, kinds
    stats = orjson.loads(views["/loop-guard"])
    assert stats["reminders_injected"] > 0 and stats["results_withheld"] > 0 and stats["stops"] > 0
    assert stats["incidents"] and stats["internal_errors"] == 0
    assert b"loopguard_actions_total{" in views["/loop-guard/metrics"]
    ledger = orjson.loads(views["conv-ledger"])
    assert [(x["tool"], x["count"]) for x in ledger["same_call"]] == [("read_file", 2)], ledger
    assert MARKER in ledger["same_call"][0]["target"]  # by design, see the module's docstring


def without_targets(view: Any) -> str:
    """A ledger view with its ``target`` values (a call's path or command, shown by design)
    blanked."""

    def walk(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: "<target>" if k == "target" else walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        return x

    return orjson.dumps(walk(view)).decode()
