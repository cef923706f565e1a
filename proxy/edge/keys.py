"""What the app and each request hold: the typed keys of ``app[...]`` and ``request[...]``, and
:func:`runtime_of`, the config a request runs under.

The app's state is built once by :func:`proxy.edge.app.create_app`; a request's keys are set as
it goes through :mod:`proxy.edge.handler` and :mod:`proxy.edge.upstream`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web

from proxy.config import Config
from proxy.edge.capture import CaptureLog
from proxy.edge.incidents import IncidentLog
from proxy.edge.metrics import Metrics
from proxy.edge.observe import Stats
from proxy.edge.runtime import Live, Runtime
from proxy.edge.shared_state import SharedState
from proxy.request.memory import Memory
from proxy.request.response_store import ResponseStore

# What the app holds (``app[...]``), set by create_app or its cleanup contexts.
#: The config the app started with: what only a restart changes is read here; a request reads
#: the config it started with from its Runtime (:func:`runtime_of`).
CONFIG_KEY = web.AppKey("config", Config)
STATS_KEY = web.AppKey("stats", Stats)
METRICS_KEY = web.AppKey("metrics", Metrics)
GUARDS_KEY = web.AppKey("guards", tuple)
SESSION_KEY = web.AppKey("session", aiohttp.ClientSession)
#: (upstream base URL without user info, ``Authorization`` value built from that user info or None)
UPSTREAM_KEY = web.AppKey("upstream", tuple)
INCIDENTS_KEY = web.AppKey("incidents", IncidentLog)
#: Per-conversation memory of the turn guard and narration (proxy.request.memory / proxy.core.state).
MEMORY_KEY = web.AppKey("memory", Memory)
#: The Responses API's previous_response_id chains (proxy.request.response_store).
RESPONSES_KEY = web.AppKey("responses_store", ResponseStore)
#: What each conversation's previous request established (proxy.request.prefix_cache; None: off).
PREFIX_KEY = web.AppKey("prefix_cache", object)
#: Set when a shutdown began (SIGTERM/SIGINT): requests ended from now on are ended by it.
SHUTDOWN_KEY = web.AppKey("shutdown", asyncio.Event)
#: The upstream responses being relayed now (closed at the end of a shutdown's grace period).
INFLIGHT_KEY = web.AppKey("inflight", set)
#: The tasks handling a forwarded request now (a shutdown's grace waits for them).
OPEN_KEY = web.AppKey("open", set)
#: The tasks sending a request upstream that has not answered its headers yet (cancelled at the
#: end of a shutdown's grace period: their agents get a 503).
PENDING_KEY = web.AppKey("pending", set)
#: Set when a shutdown's grace period is over.
GRACE_OVER_KEY = web.AppKey("grace_over", asyncio.Event)
#: The capture writer (``capture.path``, :mod:`proxy.edge.capture`), or absent when off.
CAPTURE_KEY = web.AppKey("capture", CaptureLog)
#: The current config and guards (:mod:`proxy.edge.runtime`; replaced by a reload).
LIVE_KEY = web.AppKey("live", Live)
#: The state replicas share (``state.backend``; in memory by default).
SHARED_KEY = web.AppKey("shared_state", SharedState)

# What each request holds (``request[...]``; a plain string key on aiohttp without RequestKey).
#: ``request[DECIDED_MS]``: the time (ms since the epoch) the request side decided at.
DECIDED_MS: Any = (
    web.RequestKey("loopguard.decided_ms", int) if hasattr(web, "RequestKey") else "loopguard.decided_ms"
)
#: ``request[UPSTREAM_ANSWER]``: the upstream's chat answer as the capture tap read it (bytes).
UPSTREAM_ANSWER: Any = (
    web.RequestKey("loopguard.upstream_answer", bytes)
    if hasattr(web, "RequestKey")
    else "loopguard.upstream_answer"
)
#: ``request[DELIVERED]``: the agent has received the whole answer (an SSE ``[DONE]`` or the
#: stream's end as the response side read it), so a hang-up from now on is not a disconnect.
DELIVERED: Any = (
    web.RequestKey("loopguard.delivered", bool) if hasattr(web, "RequestKey") else "loopguard.delivered"
)
#: ``request[RUNTIME]``: the :class:`Runtime` the request started with.
RUNTIME: Any = (
    web.RequestKey("loopguard.runtime", Runtime) if hasattr(web, "RequestKey") else "loopguard.runtime"
)


def runtime_of(request: web.Request) -> Runtime:
    """The :class:`Runtime` of this request: the current one when the request first asks."""
    rt = request.get(RUNTIME)
    if rt is None:
        rt = request[RUNTIME] = request.app[LIVE_KEY].current
    return rt
