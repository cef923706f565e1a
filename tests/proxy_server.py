"""Start the real loopguard server from a test, in front of a given upstream."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from proxy.edge.server import start
from proxy.ops.config import Config, build


def proxy_config(config: dict[str, Any] | None, upstream_url: str) -> Config:
    """``config`` (plain data, validated; its other ``listen`` settings kept) listening on a free
    loopback port, forwarding to ``upstream_url``."""
    cfg = build(Config, config or {})
    return dataclasses.replace(
        cfg,
        listen=dataclasses.replace(cfg.listen, host="127.0.0.1", port=0),
        upstream=dataclasses.replace(cfg.upstream, url=upstream_url),
    )


@contextlib.asynccontextmanager
async def serve(
    config: dict[str, Any] | None, upstream_url: str
) -> AsyncIterator[tuple[str, web.Application]]:
    """A proxy the test stops itself (e.g. to restart it); yields its base URL and app."""
    runner, port = await start(proxy_config(config, upstream_url))
    try:
        yield f"http://127.0.0.1:{port}", runner.app
    finally:
        await runner.cleanup()
