"""Load generator for the benchmark (its own process; aiohttp client, keep-alive connections).

Reads one JSON command per line on stdin and answers each with one JSON line on stdout:

- ``{"op": "batch", "url": BASE, "workload": W, "concurrency": C, "duration": S, "min": N, "max": M}``
  sends ``POST BASE/v1/chat/completions`` with workload ``W``'s body (``small``, ``agent``,
  ``chat``, ``stream``, or ``size:<name>`` from :data:`workloads.SIZES`) from ``C`` concurrent workers until
  ``S`` seconds have passed and at least ``N`` requests were made (never more than ``M``).
  Answer: ``n``, ``errors``, ``first_error``, ``elapsed`` (s), ``lat`` (ms per request); streams
  also ``ttfb`` (ms to the first event), ``gaps`` (ms between consecutive events, all requests),
  ``events`` (events per request), ``reads`` and ``multi_reads`` (reads that carried more than one
  event: chunks merged on the way).
- ``{"op": "memory", "url": BASE, "start": K0, "count": N, "concurrency": C, "conversations": V}``
  sends requests ``K0 … K0+N-1`` where request ``k`` is request ``k // V + 1`` of conversation
  ``k % V`` (:func:`workloads.memory_body`). Answer: ``n``, ``errors``, ``first_error``, ``elapsed``.
- ``{"op": "session", "url": BASE, "start": B0, "end": B1, "requests": N}`` sends the agent
  session of :func:`workloads.session_bodies` one request after the other (concurrency 1).
  Answer: ``n``, ``errors``, ``first_error``, ``lat`` (ms per request, in order), ``bytes`` (each
  body's size).
- ``{"op": "quit"}``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import time
from typing import Any

import aiohttp
import orjson
import workloads

#: ``BENCH_KEY`` is set by run.py (LiteLLM's master key; the other arms ignore it).
HEADERS = {
    "Content-Type": "application/json",
    "Authorization": f"Bearer {os.environ.get('BENCH_KEY', 'sk-bench')}",
}
PATH = "/v1/chat/completions"


class LoadGen:
    def __init__(self) -> None:
        self.sessions: dict[str, aiohttp.ClientSession] = {}
        self.bodies: dict[str, bytes] = {}
        self.sessions_bodies: dict[tuple[Any, ...], list[bytes]] = {}

    def session(self, url: str) -> aiohttp.ClientSession:
        if url not in self.sessions:
            self.sessions[url] = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=64, keepalive_timeout=120),
                timeout=aiohttp.ClientTimeout(total=300),
            )
        return self.sessions[url]

    def body(self, workload: str) -> bytes:
        if workload not in self.bodies:
            if workload == "small":
                self.bodies[workload] = workloads.small_body()
            elif workload == "chat":
                self.bodies[workload] = workloads.chat_body()
            elif workload == "stream":
                self.bodies[workload] = workloads.small_body(stream=True)
            elif workload == "agent":
                self.bodies[workload] = workloads.history_body(workloads.SIZES["1MB"])
            elif workload.startswith("size:"):
                self.bodies[workload] = workloads.history_body(workloads.SIZES[workload[5:]])
            else:
                raise ValueError(f"unknown workload {workload!r}")
        return self.bodies[workload]

    async def batch(self, cmd: dict[str, Any]) -> dict[str, Any]:
        url = cmd["url"].rstrip("/") + PATH
        workload = cmd["workload"]
        body = self.body(workload)
        stream = workload == "stream"
        session = self.session(cmd["url"])
        out: dict[str, Any] = {"n": 0, "errors": 0, "first_error": None, "lat": []}
        if stream:
            out.update(ttfb=[], gaps=[], events=[], reads=0, multi_reads=0)
        started = 0
        t_begin = time.perf_counter()
        deadline = t_begin + cmd["duration"]
        lo, hi = cmd.get("min", 1), cmd.get("max", 1_000_000)

        async def worker() -> None:
            nonlocal started
            while started < hi and (started < lo or time.perf_counter() < deadline):
                started += 1
                t0 = time.perf_counter()
                try:
                    async with session.post(url, data=body, headers=HEADERS) as r:
                        if stream:
                            times: list[float] = []
                            async for chunk in r.content.iter_any():
                                now = time.perf_counter()
                                k = chunk.count(b"\n\n")
                                out["reads"] += 1
                                if k > 1:
                                    out["multi_reads"] += 1
                                times.extend([now] * k)
                        else:
                            await r.read()
                        status = r.status
                    t1 = time.perf_counter()
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                    out["errors"] += 1
                    out["first_error"] = out["first_error"] or f"{type(exc).__name__}: {exc}"
                    continue
                if status != 200:
                    out["errors"] += 1
                    out["first_error"] = out["first_error"] or f"HTTP {status}"
                    continue
                out["n"] += 1
                out["lat"].append(round((t1 - t0) * 1000, 4))
                if stream:
                    out["events"].append(len(times))
                    if times:
                        out["ttfb"].append(round((times[0] - t0) * 1000, 4))
                        out["gaps"].extend(round((b - a) * 1000, 4) for a, b in itertools.pairwise(times))

        await asyncio.gather(*(worker() for _ in range(cmd["concurrency"])))
        out["elapsed"] = time.perf_counter() - t_begin
        return out

    async def memory(self, cmd: dict[str, Any]) -> dict[str, Any]:
        url = cmd["url"].rstrip("/") + PATH
        session = self.session(cmd["url"])
        conversations = cmd["conversations"]
        todo = iter(range(cmd["start"], cmd["start"] + cmd["count"]))
        out: dict[str, Any] = {"n": 0, "errors": 0, "first_error": None}
        t_begin = time.perf_counter()

        async def worker() -> None:
            for k in todo:
                body = workloads.memory_body(k % conversations, k // conversations + 1)
                try:
                    async with session.post(url, data=body, headers=HEADERS) as r:
                        await r.read()
                        ok = r.status == 200
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                    out["errors"] += 1
                    out["first_error"] = out["first_error"] or f"{type(exc).__name__}: {exc}"
                    continue
                if ok:
                    out["n"] += 1
                else:
                    out["errors"] += 1
                    out["first_error"] = out["first_error"] or f"HTTP {r.status}"

        await asyncio.gather(*(worker() for _ in range(cmd["concurrency"])))
        out["elapsed"] = time.perf_counter() - t_begin
        return out

    async def session_run(self, cmd: dict[str, Any]) -> dict[str, Any]:
        url = cmd["url"].rstrip("/") + PATH
        key = ("session", cmd["start"], cmd["end"], cmd["requests"])
        if key not in self.sessions_bodies:
            self.sessions_bodies[key] = workloads.session_bodies(cmd["start"], cmd["end"], cmd["requests"])
        bodies = self.sessions_bodies[key]
        session = self.session(cmd["url"])
        out: dict[str, Any] = {"n": 0, "errors": 0, "first_error": None, "lat": [], "bytes": []}
        for body in bodies:
            t0 = time.perf_counter()
            try:
                async with session.post(url, data=body, headers=HEADERS) as r:
                    await r.read()
                    status = r.status
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                out["errors"] += 1
                out["first_error"] = out["first_error"] or f"{type(exc).__name__}: {exc}"
                continue
            t1 = time.perf_counter()
            if status != 200:
                out["errors"] += 1
                out["first_error"] = out["first_error"] or f"HTTP {status}"
                continue
            out["n"] += 1
            out["lat"].append(round((t1 - t0) * 1000, 4))
            out["bytes"].append(len(body))
        return out

    async def close(self) -> None:
        for s in self.sessions.values():
            await s.close()


async def main() -> None:
    gen = LoadGen()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        while line := await reader.readline():
            cmd = orjson.loads(line)
            if cmd["op"] == "quit":
                break
            if cmd["op"] == "prepare":  # build the bodies before anything is timed
                for w in cmd["workloads"]:
                    gen.body(w)
                result: dict[str, Any] = {"ok": True}
            elif cmd["op"] == "batch":
                result = await gen.batch(cmd)
            elif cmd["op"] == "memory":
                result = await gen.memory(cmd)
            elif cmd["op"] == "session":
                result = await gen.session_run(cmd)
            else:
                result = {"error": f"unknown op {cmd['op']!r}"}
            sys.stdout.buffer.write(orjson.dumps(result) + b"\n")
            sys.stdout.flush()
    finally:
        await gen.close()


if __name__ == "__main__":
    asyncio.run(main())
