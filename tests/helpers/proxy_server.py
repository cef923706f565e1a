"""Start the real loopguard server from a test, in front of a given upstream."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from proxy.config import Config, build
from proxy.edge.serve import start


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


ROOT = Path(__file__).resolve().parents[2]


async def serve_process(
    upstream_url: str,
    port: int,
    config: Path,
    extra: Sequence[str] = (),
    prefix: Sequence[str] = (),
    **streams: Any,
) -> asyncio.subprocess.Process:
    """The real ``python -m proxy serve`` as a child process (``prefix``: a wrapper such as
    ``unshare …``; ``extra``: more CLI arguments; ``streams``: ``stdout``/``stderr`` as for
    :func:`asyncio.create_subprocess_exec`), unbuffered, run from the project root."""
    argv = [sys.executable, "-m", "proxy", "serve", "--upstream", upstream_url, "--port", str(port)]
    return await asyncio.create_subprocess_exec(
        *prefix,
        *argv,
        "--config",
        str(config),
        *extra,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        **streams,
    )
