"""The proxy application: its state (:mod:`proxy.edge.keys`), its routes (:mod:`proxy.edge.admin`
under ``/loop-guard``, :mod:`proxy.edge.handler` for everything else) and the resources opened
and closed with it (``cleanup_ctx``: the upstream session, the shared state's publisher, the
incident log's and the capture's writers)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import structlog
from aiohttp import web

from proxy.config import Config
from proxy.edge import admin, forward
from proxy.edge.capture import CaptureLog
from proxy.edge.handler import expect_handler, proxy_handler
from proxy.edge.incidents import IncidentLog
from proxy.edge.keys import (
    CAPTURE_KEY,
    CONFIG_KEY,
    GRACE_OVER_KEY,
    GUARDS_KEY,
    INCIDENTS_KEY,
    INFLIGHT_KEY,
    LIVE_KEY,
    MEMORY_KEY,
    METRICS_KEY,
    OPEN_KEY,
    PENDING_KEY,
    PREFIX_KEY,
    RESPONSES_KEY,
    SHARED_KEY,
    SHUTDOWN_KEY,
    STATS_KEY,
    UPSTREAM_KEY,
)
from proxy.edge.metrics import Metrics
from proxy.edge.observe import Stats
from proxy.edge.runtime import Live, build_runtime
from proxy.edge.shared_state import SharedState
from proxy.edge.upstream import client_session
from proxy.request.prefix_cache import PrefixCache
from proxy.request.response_store import ResponseStore

log = structlog.get_logger("loopguard")


def create_app(cfg: Config, loader: Callable[[], Config] | None = None) -> web.Application:
    """The proxy application for ``cfg`` (no sockets opened until it is run). ``loader``: what
    a reload calls to re-read the config (:func:`proxy.edge.runtime.reload`; None: no reload)."""
    app = web.Application(client_max_size=cfg.upstream.max_body_mb * 1024 * 1024)
    app[CONFIG_KEY] = cfg
    app[UPSTREAM_KEY] = forward.split_credentials(cfg.upstream.url)
    app[STATS_KEY] = Stats()
    app[SHUTDOWN_KEY] = asyncio.Event()
    app[GRACE_OVER_KEY] = asyncio.Event()
    app[INFLIGHT_KEY] = set()
    app[OPEN_KEY] = set()
    app[PENDING_KEY] = set()
    app[PREFIX_KEY] = PrefixCache(cfg.prefix_cache.max_bytes) if cfg.prefix_cache.max_bytes > 0 else None
    app[METRICS_KEY] = Metrics(app[STATS_KEY], app[PREFIX_KEY])  # type: ignore[arg-type]
    runtime = build_runtime(cfg)
    app[LIVE_KEY] = Live(runtime, loader)
    app[GUARDS_KEY] = runtime.guards
    app[MEMORY_KEY] = runtime.memory
    app[SHARED_KEY] = SharedState(cfg.state, app[STATS_KEY], cfg.responses_store)
    claim = app[SHARED_KEY].claim if app[SHARED_KEY].shared else None
    app[INCIDENTS_KEY] = IncidentLog(cfg.guards.circuit_breaker.incident_log, claim=claim)
    app[RESPONSES_KEY] = ResponseStore(cfg.responses_store)
    app.cleanup_ctx.append(client_session)
    app.cleanup_ctx.append(_shared_state)
    app.cleanup_ctx.append(_incident_log)
    app.cleanup_ctx.append(_capture_log)
    app.router.add_get("/loop-guard", admin.stats)
    app.router.add_get("/loop-guard/healthz", admin.healthz)
    app.router.add_get("/loop-guard/metrics", admin.metrics)
    app.router.add_post("/loop-guard/reload", admin.reload_handler)
    app.router.add_route("*", "/{tail:.*}", proxy_handler, expect_handler=expect_handler)
    return app


async def _incident_log(app: web.Application) -> AsyncIterator[None]:
    incidents = app[INCIDENTS_KEY]
    await incidents.start()
    yield
    await incidents.close()


async def _capture_log(app: web.Application) -> AsyncIterator[None]:
    path = app[CONFIG_KEY].capture.path
    if path:
        loop = asyncio.get_running_loop()

        def failed(exc: BaseException | None) -> None:  # on the writer thread
            with contextlib.suppress(RuntimeError):  # the loop is closed
                loop.call_soon_threadsafe(_capture_failed, app, exc)

        app[CAPTURE_KEY] = CaptureLog(app[CONFIG_KEY].capture, failed)
    yield
    if CAPTURE_KEY in app:
        await asyncio.to_thread(app[CAPTURE_KEY].close)


def _capture_failed(app: web.Application, exc: BaseException | None) -> None:
    """A capture line could not be written: counted (``capture_write_errors``); the first one
    is logged as a warning with the path and the error (never the line)."""
    stats = app[STATS_KEY]
    stats.capture_write_errors += 1
    if stats.capture_write_errors == 1:
        log.warning(
            "capture_write_error",
            path=app[CONFIG_KEY].capture.path,
            error=type(exc).__name__ if exc is not None else None,
            detail=getattr(exc, "strerror", None),
            note="later failures are only counted (capture_write_errors)",
        )


async def _shared_state(app: web.Application) -> AsyncIterator[None]:
    shared = app[SHARED_KEY]
    publisher = asyncio.create_task(shared.run_publisher()) if shared.shared else None
    yield
    if publisher is not None:
        publisher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await publisher
    await shared.close()
