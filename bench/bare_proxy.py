"""A minimal aiohttp reverse proxy: the floor for a Python proxy in the benchmark.

It does what any transparent proxy must and nothing else: read the request body, forward method,
path, query, headers (minus hop-by-hop) and body to the upstream over a keep-alive client session,
and relay the response status, headers and body chunk by chunk as they arrive (SSE is never
buffered). No parsing, no logging, no access log.

Usage: ``python bench/bare_proxy.py --upstream http://127.0.0.1:PORT [--port 0]``; prints
``PORT <n>`` on stdout when listening.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import aiohttp
from aiohttp import web

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", str)


def _headers(items: object, drop: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    return [(k, v) for k, v in items if k.lower() not in HOP_BY_HOP and k.lower() not in drop]  # type: ignore[attr-defined]


async def handle(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    app = request.app
    async with app[SESSION].request(
        request.method,
        app[UPSTREAM] + request.raw_path,
        headers=_headers(request.headers.items(), ("host", "content-length")),
        data=body,
        allow_redirects=False,
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
    ) as upstream:
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        response.headers.extend(_headers(upstream.headers.items()))
        await response.prepare(request)
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response


async def _session(app: web.Application):  # type: ignore[no-untyped-def]
    app[SESSION] = aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
    )
    yield
    await app[SESSION].close()


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--upstream", required=True, help="upstream origin, e.g. http://127.0.0.1:8080")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[UPSTREAM] = args.upstream.rstrip("/")
    app.cleanup_ctx.append(_session)
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, auto_decompress=False)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    print(f"PORT {runner.addresses[0][1]}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
