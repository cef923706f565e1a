"""What a guarded request leaves behind: the proxy's RSS after sequential big requests, guarded
against plain chat; not part of CI.

    python bench/retained.py [--requests 250] [--mib 4] [--dialects chat,responses,messages,gemini]
                             [--stream] [--root DIR] [--pck-mib 0]

Runs the real ``loopguard serve`` (its own process, default config, so the serve path's raised
collector thresholds) from ``--root`` (default: this checkout; another checkout measures the code
before a change) in front of a small fake upstream (an aiohttp app in a child process answering
each dialect with the same tool call, JSON or SSE) and sends, one after another, ``--requests``
requests of new conversations in each dialect: a 3-call loop (three identical calls with the same
result, ``--mib`` MiB of results in all: the repeat reminder fires) and, for comparison, a plain
chat of the same bytes (user and assistant text, nothing to guard). After each run the proxy's
``VmRSS`` (``/proc/<pid>/status``) is read and the proxy stopped; one row per run.

``--pck-mib N``: instead, every request is the first of a conversation of its own keyed by a
unique ``prompt_cache_key`` of N MiB (a small 3-call history): what the prefix cache keeps per
conversation, against what it says it keeps (``GET /loop-guard``, ``prefix_cache.bytes``).

The target (memory bounded by what is live): the guarded runs' RSS within twice the plain chat's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
PATHS = {
    "chat": "/v1/chat/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
    "gemini": "/v1beta/models/gemini-2.5-pro:generateContent",
}
CMD = {"command": "cat build.log"}


def body(
    dialect: str, size: int, stream: bool, tag: int, plain: bool = False, extra: Any = None, calls: int = 3
) -> bytes:
    """A request of ``dialect`` whose history is a loop of ``calls`` identical calls with the same
    result, ``size`` bytes of results in all (or, ``plain``, chat text of the same bytes); ``tag``
    makes its conversation new; ``extra``: more top-level members."""
    per = max(1, size // calls)
    r = (f"line {tag} of the build log: compiling module\n" * (per // 40 + 1))[:per]
    args = orjson.dumps(CMD).decode()
    b: dict[str, Any]
    if dialect == "chat":
        msgs: list[Any] = [{"role": "system", "content": "You are a coding agent."}]
        msgs.append({"role": "user", "content": f"fix the build {tag}"})
        for i in range(calls):
            if plain:
                msgs += [{"role": "assistant", "content": "checking"}, {"role": "user", "content": r}]
            else:
                call = {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": args}}
                msgs += [
                    {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": f"c{i}", "content": r},
                ]
        b = {"model": "m", "messages": msgs, "stream": stream}
    elif dialect == "responses":
        items: list[Any] = [{"type": "message", "role": "user", "content": f"fix the build {tag}"}]
        for i in range(calls):
            items += [
                {"type": "function_call", "call_id": f"c{i}", "name": "shell", "arguments": args},
                {"type": "function_call_output", "call_id": f"c{i}", "output": r},
            ]
        b = {"model": "m", "input": items, "stream": stream, "store": False}
    elif dialect == "messages":
        msgs = [{"role": "user", "content": f"fix the build {tag}"}]
        for i in range(calls):
            use = {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": CMD}
            result = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": r}
            msgs += [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]
        b = {"model": "m", "max_tokens": 100, "messages": msgs, "stream": stream}
    else:
        cs: list[Any] = [{"role": "user", "parts": [{"text": f"fix the build {tag}"}]}]
        for _ in range(calls):
            fc = {"functionCall": {"name": "run_shell_command", "args": CMD}}
            fr = {"functionResponse": {"name": "run_shell_command", "response": {"output": r}}}
            cs += [{"role": "model", "parts": [fc]}, {"role": "user", "parts": [fr]}]
        b = {"contents": cs}
    if extra:
        b.update(extra)
    return orjson.dumps(b)


def path(dialect: str, stream: bool) -> str:
    p = PATHS[dialect]
    if dialect == "gemini" and stream:
        p = p.replace(":generateContent", ":streamGenerateContent") + "?alt=sse"
    return p


def _frames(events: list[tuple[str, Any]]) -> bytes:
    return b"".join(b"event: " + n.encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for n, e in events)


def answer(dialect: str, stream: bool) -> tuple[str, bytes]:
    """(content type, body) of the upstream's answer in ``dialect``: the same call once more."""
    args = orjson.dumps(CMD).decode()
    if dialect == "chat":
        call = {"id": "c9", "type": "function", "function": {"name": "bash", "arguments": args}}
        if not stream:
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
            obj = {"id": "x", "object": "chat.completion", "created": 1, "model": "m", "choices": [choice]}
            return "application/json", orjson.dumps(obj)
        base = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m"}
        first = {"index": 0, **call, "function": {"name": "bash", "arguments": ""}}
        deltas = [
            ({"role": "assistant", "tool_calls": [first]}, None),
            ({"tool_calls": [{"index": 0, "function": {"arguments": args}}]}, None),
            ({}, "tool_calls"),
        ]
        chunks = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": f}]} for d, f in deltas]
        return "text/event-stream", b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + (
            b"data: [DONE]\n\n"
        )
    if dialect == "responses":
        item = {"type": "function_call", "id": "fc_1", "call_id": "c9", "name": "shell", "arguments": args}
        item["status"] = "completed"
        usage = {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}
        resp = {"id": "resp_1", "object": "response", "created_at": 1, "status": "completed", "model": "m"}
        resp |= {"output": [item], "usage": usage}
        if not stream:
            return "application/json", orjson.dumps(resp)
        opened = {**item, "arguments": "", "status": "in_progress"}
        at = {"output_index": 0, "item_id": "fc_1"}
        events = [
            ("response.created", {"response": {**resp, "status": "in_progress", "output": []}}),
            ("response.output_item.added", {"output_index": 0, "item": opened}),
            ("response.function_call_arguments.delta", {**at, "delta": args}),
            ("response.function_call_arguments.done", {**at, "arguments": args}),
            ("response.output_item.done", {"output_index": 0, "item": item}),
            ("response.completed", {"response": resp}),
        ]
        return "text/event-stream", _frames(
            [(n, {"type": n, "sequence_number": i, **e}) for i, (n, e) in enumerate(events)]
        )
    if dialect == "messages":
        block = {"type": "tool_use", "id": "toolu_9", "name": "Bash", "input": CMD}
        msg = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [block]}
        msg |= {
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }
        if not stream:
            return "application/json", orjson.dumps(msg)
        events = [
            ("message_start", {"message": {**msg, "content": [], "stop_reason": None}}),
            ("content_block_start", {"index": 0, "content_block": {**block, "input": {}}}),
            (
                "content_block_delta",
                {"index": 0, "delta": {"type": "input_json_delta", "partial_json": args}},
            ),
            ("content_block_stop", {"index": 0}),
            (
                "message_delta",
                {"delta": {"stop_reason": "tool_use", "stop_sequence": None}, "usage": {"output_tokens": 1}},
            ),
            ("message_stop", {}),
        ]
        return "text/event-stream", _frames([(n, {"type": n, **e}) for n, e in events])
    content = {"role": "model", "parts": [{"functionCall": {"name": "run_shell_command", "args": CMD}}]}
    usage = {"promptTokenCount": 1, "candidatesTokenCount": 1, "totalTokenCount": 2}
    obj = {"candidates": [{"content": content, "finishReason": "STOP", "index": 0}], "usageMetadata": usage}
    if not stream:
        return "application/json", orjson.dumps(obj)
    return "text/event-stream", b"data: " + orjson.dumps(obj) + b"\r\n\r\n"


def serve_upstream(port: int) -> None:
    """The fake upstream (this script run with ``--upstream-port``): each dialect's answer, read
    from the request's path and its ``"stream"``."""
    from aiohttp import web

    async def handle(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        p = request.path
        dialect = next(
            (d for d, s in PATHS.items() if p.endswith(s.rsplit("/", 1)[-1].split(":")[0])), "chat"
        )
        if ":generateContent" in p or ":streamGenerateContent" in p:
            dialect = "gemini"
        stream = "alt=sse" in request.query_string or b'"stream":true' in raw[-64:] + raw[:64]
        ct, data = answer(dialect, stream)
        return web.Response(body=data, content_type=ct)

    app = web.Application(client_max_size=256 << 20)
    app.router.add_route("*", "/{tail:.*}", handle)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.1)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def drive(base: str, bodies: Any, n: int, stream: bool, dialect: str) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as s:
        for i in range(n):
            data = bodies(i)
            headers = {"content-type": "application/json"}
            async with s.post(base + path(dialect, stream), data=data, headers=headers) as r:
                await r.read()
                if r.status != 200:
                    raise SystemExit(f"{dialect}: status {r.status}")


def run_one(
    root: Path, upstream: str, label: str, dialect: str, n: int, bodies: Any, stream: bool
) -> dict[str, Any]:
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="retained-"))
    log = (tmp / "proxy.log").open("wb")
    cmd = [sys.executable, "-m", "proxy", "serve", "--upstream", upstream, "--port", str(port)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPGUARD_")}
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=log)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http(base + "/loop-guard/healthz")
        start = rss_mib(proc.pid)
        t0 = time.monotonic()
        asyncio.run(drive(base, bodies, n, stream, dialect))
        seconds = time.monotonic() - t0
        end = rss_mib(proc.pid)
        with urllib.request.urlopen(base + "/loop-guard", timeout=10) as r:
            stats = json.load(r)
        kept = (stats.get("prefix_cache") or {}).get("bytes", 0)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        log.close()
    row = {"run": label, "dialect": dialect, "requests": n, "rss_start_mib": round(start, 1)}
    row |= {
        "rss_end_mib": round(end, 1),
        "prefix_cache_mb": round(kept / 1e6, 1),
        "seconds": round(seconds, 1),
    }
    print(
        f"{label:<10} {dialect:<10} {n:>5} req  RSS {start:6.1f} -> {end:7.1f} MiB   "
        f"prefix cache says {kept / 1e6:6.1f} MB   {seconds:5.1f} s",
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=250)
    ap.add_argument("--mib", type=float, default=4.0)
    ap.add_argument("--dialects", default="chat,responses,messages,gemini")
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose proxy runs")
    ap.add_argument("--pck-mib", type=float, default=0.0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--upstream-port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.upstream_port:
        serve_upstream(args.upstream_port)
        return 0
    up_port = free_port()
    up = subprocess.Popen([sys.executable, __file__, "--upstream-port", str(up_port)])
    rows = []
    try:
        wait_http(f"http://127.0.0.1:{up_port}/v1/models")
        upstream = f"http://127.0.0.1:{up_port}/v1"
        size = int(args.mib * 2**20)
        if args.pck_mib:
            key = "k" * int(args.pck_mib * 2**20)
            for dialect in args.dialects.split(","):

                def keyed(i: int, d: str = dialect) -> bytes:
                    return body(d, 16 * 1024, args.stream, i, extra={"prompt_cache_key": f"{i}-{key}"})

                rows.append(run_one(args.root, upstream, "pck", dialect, args.requests, keyed, args.stream))
            return 0
        rows.append(
            run_one(
                args.root,
                upstream,
                "plain",
                "chat",
                args.requests,
                lambda i: body("chat", size, args.stream, i, plain=True),
                args.stream,
            )
        )
        for dialect in args.dialects.split(","):

            def guarded(i: int, d: str = dialect) -> bytes:
                return body(d, size, args.stream, i)

            rows.append(run_one(args.root, upstream, "guarded", dialect, args.requests, guarded, args.stream))
        plain = rows[0]["rss_end_mib"]
        worst = max(r["rss_end_mib"] for r in rows[1:])
        verdict = "PASS" if worst <= 2 * plain else "FAIL"
        print(
            f"guarded worst {worst:.1f} MiB vs plain chat {plain:.1f} MiB: "
            f"{worst / plain:.2f}x (target <= 2x) {verdict}"
        )
        return 0 if verdict == "PASS" else 1
    finally:
        up.terminate()
        up.wait(timeout=30)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    sys.exit(main())
