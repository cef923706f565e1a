"""A recording relay in front of the llama server: every upstream request and its answer, as sent.

The bench puts it between loopguard (or, in the direct arm, the agent) and llama.cpp, so that what
the model really received is known: how many upstream requests an agent request cost, and whether
each request's messages extend the previous one's (the server's prefix cache is kept) or not.
Bodies are forwarded unchanged and answers streamed back as they come.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web


@dataclass
class Exchange:
    """One upstream request: ``body`` (its bytes), ``messages`` (parsed), ``stream``, ``seed``
    (the body's, None when absent), and the
    answer's ``calls`` (``[name, arguments]``), ``text``, ``prompt_tokens`` and
    ``completion_tokens`` (read from the JSON answer or the SSE chunks)."""

    body: bytes
    messages: list[dict[str, Any]]
    stream: bool
    seed: int | None = None
    calls: list[list[str]] = field(default_factory=list)
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0


def _read_answer(ex: Exchange, raw: bytes) -> None:
    """Fill ``ex``'s answer fields from the answer bytes (JSON or SSE); unreadable parts are skipped."""
    objs: list[dict[str, Any]] = []
    if ex.stream:
        for line in raw.decode(errors="replace").splitlines():
            if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
                try:
                    objs.append(json.loads(line[5:]))
                except ValueError:
                    continue
    else:
        try:
            objs.append(json.loads(raw))
        except ValueError:
            return
    calls: dict[int, list[str]] = {}
    for obj in objs:
        usage = obj.get("usage") or {}
        if usage:
            ex.prompt_tokens = usage.get("prompt_tokens", 0)
            ex.completion_tokens = usage.get("completion_tokens", 0)
        for choice in obj.get("choices") or []:
            part = choice.get("delta") or choice.get("message") or {}
            ex.text += part.get("content") or ""
            for i, c in enumerate(part.get("tool_calls") or []):
                slot = calls.setdefault(c.get("index", i), ["", ""])
                fn = c.get("function") or {}
                slot[0] = slot[0] or fn.get("name") or ""
                slot[1] += fn.get("arguments") or ""
    ex.calls = [calls[i] for i in sorted(calls)]


class Relay:
    """The relay app: ``POST /v1/chat/completions`` (and any path) forwarded to ``upstream`` (a
    base URL ending in ``/v1``); :attr:`exchanges` grows by one per request, in arrival order."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.exchanges: list[Exchange] = []
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None

    async def start(self) -> str:
        """Listen on a free localhost port; returns the base URL (``http://127.0.0.1:<port>/v1``)."""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))
        self.url = f"http://127.0.0.1:{port}/v1"
        return self.url

    async def stop(self) -> None:
        """Close the client session and the listener."""
        if self._http is not None:
            await self._http.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        """Forward one request, record it and its answer."""
        body = await request.read()
        tail = request.path.removeprefix("/v1")
        ex: Exchange | None = None
        if request.method == "POST" and tail.endswith("/chat/completions"):
            try:
                parsed = json.loads(body)
            except ValueError:
                parsed = {}
            ex = Exchange(body, parsed.get("messages") or [], bool(parsed.get("stream")), parsed.get("seed"))
            self.exchanges.append(ex)
        assert self._http is not None
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with self._http.request(
            request.method, self.upstream + tail, data=body or None, headers=headers
        ) as up:
            resp = web.StreamResponse(status=up.status)
            resp.content_type = up.content_type
            await resp.prepare(request)
            raw = bytearray()
            async for chunk in up.content.iter_any():
                raw += chunk
                await resp.write(chunk)
            await resp.write_eof()
        if ex is not None:
            _read_answer(ex, bytes(raw))
        return resp
