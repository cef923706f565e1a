"""A real ``redis-server`` (Debian's package, installed by ``.ci/run``) for a test: a free
loopback port, a temporary directory, no persistence."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from tests.e2e.test_shutdown import free_port


@dataclass
class RedisServer:
    url: str
    process: asyncio.subprocess.Process

    def kill(self) -> None:
        """End the server at once (an outage)."""
        self.process.kill()


@contextlib.asynccontextmanager
async def redis_server(tmp_path: Path) -> AsyncIterator[RedisServer]:
    """Start ``redis-server`` and yield it once it answers PING; stopped at the end."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (.ci/run installs Debian's redis-server)")
    port = free_port()
    data = tmp_path / "redis"
    data.mkdir()
    proc = await asyncio.create_subprocess_exec(
        binary,
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--save", "",
        "--appendonly", "no",
        "--dir", str(data),
        "--daemonize", "no",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    client = aioredis.Redis.from_url(url)
    try:
        for _ in range(200):
            try:
                await client.ping()
                break
            except (OSError, aioredis.ConnectionError):
                await asyncio.sleep(0.05)
        else:
            raise AssertionError("redis-server did not start")
        yield RedisServer(url, proc)
    finally:
        await client.aclose()
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
