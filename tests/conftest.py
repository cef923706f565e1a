"""Shared fixtures: a fake upstream on a real port and the real loopguard server in front of it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import structlog
from aiohttp import web
from openai import AsyncOpenAI

from proxy.edge.serve import start
from tests.helpers.fakes import FakeUpstream, Recorded, looping_handler
from tests.helpers.proxy_server import proxy_config


@pytest.fixture(autouse=True)
def _logging_as_at_start() -> Iterator[None]:
    """Every test starts with structlog's defaults (events printed to stdout): a test that
    configures logging (the CLI, ``configure_logging``) must not decide where the next test's
    events go, whatever order the tests run in."""
    yield
    structlog.reset_defaults()


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    """A fake model server; records requests; answers with ``fake.handler`` (a looping model by
    default)."""
    fake = FakeUpstream(handler=looping_handler)

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        fake.requests.append(Recorded(request.method, request.raw_path, dict(request.headers), body))
        assert fake.handler is not None
        return await fake.handler(request, body)

    app = web.Application(client_max_size=128 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", handle)
    # long header lines accepted, as real model servers do (the proxy forwards them)
    runner = web.AppRunner(app, handler_cancellation=True, max_line_size=65536, max_field_size=65536)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    fake.url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    yield fake
    await runner.cleanup()


ProxyFactory = Callable[..., Awaitable[str]]


@pytest.fixture
async def make_proxy(upstream: FakeUpstream) -> AsyncIterator[ProxyFactory]:
    """``await make_proxy(config_dict=None, upstream_url=None)`` starts the real loopguard server
    (same code path as ``loopguard serve``) and returns its base URL (``http://127.0.0.1:PORT``)."""
    runners: list[web.AppRunner] = []

    async def factory(config: dict[str, Any] | None = None, upstream_url: str | None = None) -> str:
        cfg = proxy_config(config, upstream_url or upstream.url)
        runner, port = await start(cfg)
        runners.append(runner)
        return f"http://127.0.0.1:{port}"

    yield factory
    for r in runners:
        await r.cleanup()


@pytest.fixture
async def sdk(make_proxy) -> AsyncIterator[Any]:
    """``await sdk(config)`` → an AsyncOpenAI client on a fresh proxy (closed at the end)."""
    clients: list[AsyncOpenAI] = []

    async def factory(config: dict[str, Any] | None = None, **headers: str) -> AsyncOpenAI:
        base = await make_proxy(config)
        client = AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0, default_headers=headers)
        client.base = base  # type: ignore[attr-defined]
        clients.append(client)
        return client

    yield factory
    for c in clients:
        await c.close()
