"""The shutdown's grace period (SIGTERM, SIGINT): stop accepting, let the forwarded requests in
flight finish for up to ``listen.shutdown_grace_s``, then end the rest. A request whose body is
still coming, or still waiting for the upstream's headers, or a JSON answer not yet sent, gets a
503
(:func:`proxy.edge.answers.shutdown_response`), a stream its error event; the process exits about
:data:`FINISH_S` later, once their answers and log lines are written.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import structlog
from aiohttp import web

from proxy.edge.keys import GRACE_OVER_KEY, INFLIGHT_KEY, OPEN_KEY, PENDING_KEY, SHUTDOWN_KEY

log = structlog.get_logger("loopguard")

T = TypeVar("T")

#: Seconds a shutdown gives the requests it ended at the end of its grace period to write their
#: answers (a 503, an error event) and log lines, and aiohttp to close the connections: the
#: whole shutdown takes at most ``listen.shutdown_grace_s`` plus about three times this.
FINISH_S = 1.0


async def until_grace_over(app: web.Application, send: Callable[[], Any]) -> aiohttp.ClientResponse | None:
    """``await send()`` (the upstream's response headers), or None when a shutdown's grace
    period ended first (its send was cancelled, :func:`end_grace`; or the headers came but
    this request had not taken them before the grace ended: the response is closed)."""
    grace_over = app[GRACE_OVER_KEY]
    if grace_over.is_set():
        return None  # end_grace's sweep is past: nothing would end this send
    task = asyncio.ensure_future(send())
    pending = app[PENDING_KEY]
    pending.add(task)
    try:
        upstream: aiohttp.ClientResponse = await task
        if grace_over.is_set():
            # The headers came, and the grace ended before this handler ran again: cancelling
            # the finished send did nothing, and the response joins INFLIGHT_KEY after the
            # sweep that closes it, so the agent would wait for the whole answer (or get a cut
            # connection from the runner's cleanup) instead of its 503.
            upstream.close()
            return None
        return upstream
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if app[GRACE_OVER_KEY].is_set() and task.cancelled() and not (current and current.cancelling()):
            return None  # the shutdown, not the agent, ended it
        raise
    finally:
        pending.discard(task)


async def body_before_grace_over(app: web.Application, read: Callable[[], Awaitable[T]]) -> T | None:
    """``await read()`` (the agent's request body), or None when a shutdown's grace period ended
    first (:func:`end_grace` cancelled the read): an agent still uploading then gets its 503 at
    the grace's end instead of the runner's cut connection a second later. An agent that hangs
    up cancels the read as before (CancelledError)."""
    grace_over = app[GRACE_OVER_KEY]
    if grace_over.is_set():
        return None
    task = asyncio.ensure_future(read())
    pending = app[PENDING_KEY]
    pending.add(task)
    try:
        return await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if grace_over.is_set() and task.cancelled() and not (current and current.cancelling()):
            return None  # the shutdown, not the agent, ended it
        raise
    finally:
        pending.discard(task)


def end_grace(app: web.Application) -> None:
    """End what a shutdown's grace period left running (:func:`graceful_stop`, after
    ``SHUTDOWN_KEY``): a request whose body is still coming or still waiting for the upstream's
    headers gets a 503, a stream its error event, a JSON answer not yet sent a 503 (their
    handlers answer). Synchronous: no
    handler runs between setting ``GRACE_OVER_KEY`` and the sweep."""
    app[GRACE_OVER_KEY].set()
    for task in list(app[PENDING_KEY]):
        task.cancel()
    for upstream in list(app[INFLIGHT_KEY]):
        app[INFLIGHT_KEY].discard(upstream)
        upstream.close()


async def graceful_stop(runner: web.AppRunner, grace_s: float) -> None:
    """The shutdown after the signal: requests ended from now on are ended by it (``SHUTDOWN_KEY``), no new
    connections are accepted, the forwarded requests open now get ``grace_s`` seconds to finish,
    :func:`end_grace` ends the rest and they get :data:`FINISH_S` to write their answers and log
    lines. The caller then cleans the runner up."""
    app = runner.app
    log.info("shutting_down", grace_s=grace_s, in_flight=len(app[OPEN_KEY]))
    app[SHUTDOWN_KEY].set()
    for site in list(runner.sites):
        await site.stop()  # no new connections
    deadline = time.monotonic() + grace_s
    while app[OPEN_KEY] and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    end_grace(app)
    finish = time.monotonic() + FINISH_S
    while app[OPEN_KEY] and time.monotonic() < finish:
        await asyncio.sleep(0.02)  # their answers and log lines
