"""Running the proxy: :func:`start` binds ``cfg.listen`` (tests and the demo use it with port 0),
:func:`serve_forever` is ``loopguard serve``: the startup line, the signals (SIGTERM/SIGINT shut
down, :mod:`proxy.edge.shutdown`; SIGHUP reloads, :mod:`proxy.edge.runtime`) and the stop.

The agent side's limits (:mod:`proxy.edge.connections`, ``listen.*``): a request whose headers
take longer than ``header_timeout_s`` is closed, a body that stalls for ``body_timeout_s`` gets a
408, a connection past ``max_connections`` a 503 at once; a half-closed request (HTTP/1.0, or
``Connection: close``, then EOF) gets its answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
from collections.abc import Callable

import structlog
from aiohttp import web

from proxy.config import Config
from proxy.config.redact import redact_url
from proxy.edge import connections, forward
from proxy.edge.admin import LOOPBACK_ONLY
from proxy.edge.app import create_app
from proxy.edge.keys import LIVE_KEY
from proxy.edge.observe import SERVER_LOG
from proxy.edge.shutdown import FINISH_S, graceful_stop

log = structlog.get_logger("loopguard")

#: Seconds an answer given before the whole request body came waits for the rest (see start()).
LINGER_S = 1.0


async def start(
    cfg: Config, loader: Callable[[], Config] | None = None, shutdown_timeout_s: float | None = None
) -> tuple[web.AppRunner, int]:
    """Start serving ``cfg`` on ``cfg.listen``; returns the runner and the bound port
    (useful with port 0). Stop with ``await runner.cleanup()``. ``loader``: see :func:`create_app`.
    ``shutdown_timeout_s``: how long ``runner.cleanup()`` lets requests in flight run (None:
    ``listen.shutdown_grace_s``; :func:`serve_forever` runs the grace itself and gives less)."""
    runner = web.AppRunner(
        create_app(cfg, loader),
        handler_cancellation=True,
        access_log=None,
        auto_decompress=False,
        logger=SERVER_LOG,  # aiohttp's own errors, told without what the agent sent
        # aiohttp waits this long for a handler, then as long again after cancelling it
        shutdown_timeout=cfg.listen.shutdown_grace_s if shutdown_timeout_s is None else shutdown_timeout_s,
        max_line_size=forward.HEADER_LIMIT,
        max_field_size=forward.HEADER_LIMIT,
        # an answer sent before the whole body came (a 408 after a stalled body, a 413) drains
        # the rest for at most this long before closing (aiohttp's default is 10 s, a connection
        # slot held that long; without draining, a reset could destroy the answer)
        lingering_time=LINGER_S,
    )
    await runner.setup()
    assert runner.server is not None
    # agent-side limits: header timeout, max_connections, half-close (module doc)
    connections.adopt(runner.server, cfg.listen.max_connections, cfg.listen.header_timeout_s)
    connections.ensure_fd_limit(cfg.listen.max_connections)
    site = web.TCPSite(runner, cfg.listen.host, cfg.listen.port)
    try:
        await site.start()
    except OSError:  # the address is in use (or not ours): close what setup opened, then say so
        await runner.cleanup()
        raise
    port = runner.addresses[0][1]
    return runner, port


#: The collector's thresholds once serving (``gc.set_threshold``; Python's are 700, 10, 10): the
#: youngest generation collected after 10,000 allocations instead of 700. A request over a long
#: history allocates tens of thousands of objects that live until it ends (its transcript, the
#: guards' states), which each young collection walks again; counted under callgrind
#: (``bench/instructions.py``, the agent session's last 10%, 5 MB bodies), 78.3 → 73.4 million
#: instructions a request, and the small request unchanged. Garbage in cycles waits for at most
#: that many allocations (a few MB).
GC_THRESHOLDS = (10_000, 10, 10)


def settle_heap() -> int:
    """Collect once, then move every object alive now (modules, the config, the app: about 60k
    objects) out of the collector's sight for good (``gc.freeze``), so the full collections
    that the requests' garbage triggers walk only what was made since (measured: a full
    collection over the started app took 150–180 ms on a loaded 2-core machine, and 0.002 ms
    once frozen); then :data:`GC_THRESHOLDS`. Returns the number of objects frozen."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    return gc.get_freeze_count()


async def serve_forever(
    cfg: Config,
    loader: Callable[[], Config] | None = None,
    source: str | None = None,
    loop_name: str = "asyncio",
) -> None:
    """Serve until SIGTERM or SIGINT (handlers installed, so this works as PID 1 too), then shut
    down: stop accepting, let requests in flight finish for up to ``listen.shutdown_grace_s``,
    end the rest (a stream gets the error event), write their log lines, return (exit 0).
    SIGHUP re-reads the config through ``loader`` (:func:`proxy.edge.runtime.reload`; a rejected
    file is logged). ``source``: the config file's path, for the startup line (None: built-in
    defaults); ``loop_name``: the event loop it runs on, for the same line. Raises OSError when
    the address cannot be bound (the CLI says so in one line, exit 2)."""
    runner, port = await start(cfg, loader, shutdown_timeout_s=FINISH_S)
    settle_heap()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # no signals off the main thread
            loop.add_signal_handler(sig, stop.set)
    app = runner.app
    with contextlib.suppress(NotImplementedError, RuntimeError, AttributeError):
        loop.add_signal_handler(signal.SIGHUP, app[LIVE_KEY].on_signal)
    # after the handlers: a SIGHUP sent once this line is seen reloads instead of killing
    log.info(
        "listening",
        host=cfg.listen.host,
        port=port,
        upstream=redact_url(cfg.upstream.url),
        config=source or "(defaults)",
        guards=cfg.modes(),
        recovery=cfg.recovery.active() or None,
        capture=cfg.capture.path or None,
        state=redact_url(cfg.state.backend),
        event_loop=loop_name,
    )
    key_env = cfg.recovery.fallback.api_key_env
    if cfg.recovery.fallback.url and key_env and not os.environ.get(key_env):
        log.warning(
            "recovery_fallback_key_missing",
            variable=key_env,
            note="recovery.fallback.api_key_env names a variable that is unset or empty: the fallback "
            "is not asked (outcome error) until loopguard is started with it set",
        )
    if not cfg.admin_token:
        log.warning(
            "admin_loopback_only",
            routes=sorted(LOOPBACK_ONLY),
            note="admin_token is not set: these routes answer loopback clients only (403 to others); "
            "set admin_token to reach them from elsewhere (a container's published port included)",
        )
    try:
        await stop.wait()
        await graceful_stop(runner, cfg.listen.shutdown_grace_s)
    finally:
        await runner.cleanup()
        log.info("stopped")
