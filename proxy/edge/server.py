"""HTTP edge (aiohttp): routes, app lifecycle, forwarding and relay.

Routes: ``GET /loop-guard`` (stats JSON; with ``?conversation=KEY`` that conversation's turn-guard
ledger, :mod:`proxy.request.memory`), ``GET /loop-guard/healthz``, ``GET /loop-guard/metrics``,
``POST /loop-guard/reload`` (:data:`ADMIN_ROUTES`); anything else under ``/loop-guard`` is a 404
or 405 (:func:`_own_miss`: never forwarded, it would carry the admin token upstream); every other
path and method is forwarded to the upstream (:mod:`proxy.edge.forward`). Without
``admin_token`` the routes that show conversations answer loopback peers only
(:data:`LOOPBACK_ONLY`). ``POST …/chat/completions``,
``…/responses``, ``…/v1/messages`` (Anthropic Messages) and ``…/models/{m}:generateContent`` /
``:streamGenerateContent`` (Gemini) bodies go through the guards first
(:func:`proxy.request.rewrite.decide_request`, :data:`proxy.dialects.REGISTRY`). Every header,
``x-api-key``, ``authorization``, ``x-goog-api-key``, ``anthropic-version`` and ``anthropic-beta``
included, goes upstream as it came (hop-by-hop ones aside) and is never logged; so does the query
string (Gemini's ``?key=``), which the log line leaves out (it logs ``request.path``).

Behaviour at the edge:
- The upstream response is relayed with its status and headers (minus hop-by-hop) and its body
  chunk by chunk as it arrives (SSE included): nothing is buffered or re-encoded, except that
  answers to chat completions go through the response side (:mod:`proxy.edge.relay`: tool-call deltas
  held until their choice's decision, JSON bodies buffered; unchanged when nothing is decided).
- Shutdown (:func:`serve_forever`): one ``listen.shutdown_grace_s`` for every forwarded request
  still open; then a request waiting for the upstream's headers (or a JSON answer not yet sent)
  gets a 503, a stream its error event, and the process exits about :data:`FINISH_S` later.
- Agent disconnect cancels the handler (``handler_cancellation``) and closes the upstream request
  at once (logged ``disconnected: true``, counted in ``disconnects``), so a model server that
  watches its connection stops generating. llama-cpp-python only watches a *stream*'s: with
  ``upstream.stream_json_requests`` a non-streaming chat request goes upstream as a stream and
  its answer is assembled into JSON (:mod:`proxy.response.as_stream`, :func:`_relay_streamed`).
- Upstream unreachable: 502 with an OpenAI-style JSON error. Upstream closing mid-stream: an SSE
  stream gets a final ``data: {"error": …}`` event and the connection is closed without the
  terminating chunk, so the agent sees an error, never a silent success.
- The agent side (:mod:`proxy.edge.connections`, ``listen.*``): a request whose headers take longer
  than ``header_timeout_s`` is closed, a body that stalls for ``body_timeout_s`` gets a 408, a
  connection past ``max_connections`` a 503 at once; a half-closed request (HTTP/1.0, or
  ``Connection: close``, then EOF) gets its answer.
- Fail open: any exception inside the guards is logged (no content) and counted, and the original
  bytes are forwarded.
- Responses ``previous_response_id`` chains (:mod:`proxy.request.response_store`): the store is looked up
  by the request side and fed by the response side (the answer is kept before its last bytes
  reach the agent); an unknown id is counted in ``unguarded`` and logged once per chain
  (``unknown_previous_response``). Any error there fails open like the guards.
- Circuit-breaker incidents of a request are recorded right after its decision
  (:mod:`proxy.edge.incidents`; the file is written by a background task opened in ``cleanup_ctx``).
- Hot reload (issue 16): ``SIGHUP`` and ``POST /loop-guard/reload`` re-read the config file
  (:mod:`proxy.edge.runtime`). What a request uses of the config (guards, the response side, the admin
  token, the conversation-key headers) is the :class:`Runtime` it started with
  (:func:`_rt`), so a request in flight finishes under its config. An invalid file, or one that
  changes a key only a restart can change (:data:`proxy.config.RESTART_ONLY`), is rejected
  naming the key (the endpoint answers 400 with the message), and the running config stays.
- Several replicas (issue 16, ``state.backend``): the request side's state is fetched before and
  written after the (pure) decision, a kept Responses answer before its last bytes reach the
  agent, incidents are claimed by the writer (:mod:`proxy.edge.shared_state`).
- Observe mode (issue 16, ``mode``): the guards get the observed rules
  (:meth:`proxy.config.Config.observed_rules`); their actions are logged, counted and
  recorded but not applied, and the response side's observed part reads the answer in a shadow
  (:class:`proxy.edge.relay.Shadow`) that changes no byte.
- Capture (``capture.path``, :mod:`proxy.edge.capture`): after a guarded request's log line, one
  capture line with the history the agent sent and the upstream's chat answer as the response
  side's tap read it; fails open like the guards.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import ipaddress
import signal
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson
import structlog
from aiohttp import web
from aiohttp.web_urldispatcher import _default_expect_handler  # what every route uses unless told
from multidict import CIMultiDict

from proxy import dialects
from proxy.config import Config
from proxy.config.redact import redact_url
from proxy.core.volatile import compile_masks
from proxy.dialects import anthropic_messages, gemini, jsonbody, openai_chat, openai_responses
from proxy.edge import capture, connections, forward, relay
from proxy.edge.capture import CaptureLog
from proxy.edge.incidents import IncidentLog
from proxy.edge.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from proxy.edge.metrics import Metrics
from proxy.edge.observe import SERVER_LOG, Stats, action_summary
from proxy.edge.runtime import Live, Runtime, build_runtime, reload_logged
from proxy.edge.shared_state import SharedState
from proxy.request import plain
from proxy.request.conversation import key_digest
from proxy.request.memory import Memory
from proxy.request.prefix_cache import PrefixCache
from proxy.request.response_store import UNKNOWN_PREVIOUS, Answer, ResponseStore, store_key
from proxy.request.rewrite import RequestDecision, decide_plain, decide_request
from proxy.request.shared import newer
from proxy.response import as_stream

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


#: The current config and guards (:mod:`proxy.edge.runtime`; replaced by a reload).
LIVE_KEY = web.AppKey("live", Live)
#: The state replicas share (``state.backend``; in memory by default).
SHARED_KEY = web.AppKey("shared_state", SharedState)

log = structlog.get_logger("loopguard")


_error_body = connections.error_body


def _error_json(request: web.Request | None, message: str, type_: str, code: int) -> bytes:
    """The JSON body of an error loopguard answers itself: Anthropic's form (``{"type": "error",
    "error": {"type", "message"}}``) on a guarded Messages path, which the anthropic SDK and Claude
    Code read, else the OpenAI form (:func:`proxy.edge.connections.error_body`)."""
    if request is not None and _guarded(request) == "messages":
        return orjson.dumps({"type": "error", "error": {"type": type_, "message": message}})
    return _error_body(message, type_, code)


#: The longest request line and header line accepted, both ways (bytes): aiohttp's 8,190 turned
#: long ``Authorization`` tokens and cookies that upstreams accept into 400s (issue 14, item 3).
HEADER_LIMIT = 64 * 1024

#: ``request[DELIVERED]``: the agent has received the whole answer (an SSE ``[DONE]`` or the
#: stream's end as the response side read it), so a hang-up from now on is not a disconnect.
DELIVERED: Any = (
    web.RequestKey("loopguard.delivered", bool) if hasattr(web, "RequestKey") else "loopguard.delivered"
)
#: ``request[RUNTIME]``: the :class:`Runtime` the request started with.
RUNTIME: Any = (
    web.RequestKey("loopguard.runtime", Runtime) if hasattr(web, "RequestKey") else "loopguard.runtime"
)
DONE_MARK = b"[DONE]"
#: Seconds a shutdown gives the requests it ended at the end of its grace period to write their
#: answers (a 503, an error event) and log lines, and aiohttp to close the connections: the
#: whole shutdown takes at most ``listen.shutdown_grace_s`` plus about three times this.
FINISH_S = 1.0
#: Seconds an answer given before the whole request body came waits for the rest (see start()).
LINGER_S = 1.0

#: What a request on a kept-alive connection the upstream has just closed fails with, before any
#: answer: retried once on a fresh connection (aiohttp drops the dead connection from its pool).
#: Only a reused connection is retried (:class:`_Connector`); on a fresh one the upstream got the
#: request, so the failure is a 502.
STALE_CONNECTION = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


#: The attempt of the request being sent in this task (``{"reused": bool}``), for the connector.
_ATTEMPT: contextvars.ContextVar[dict[str, bool] | None] = contextvars.ContextVar("attempt", default=None)


class _Connector(aiohttp.TCPConnector):
    """aiohttp's connector, telling the request being sent (:data:`_ATTEMPT`) whether the pool
    handed it a kept-alive connection: a protocol it handed out before. Instead of a trace
    config, whose hooks aiohttp calls on every request for every event."""

    async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:
        conn = await super().connect(req, traces, timeout)
        protocol = conn.protocol
        attempt = _ATTEMPT.get()
        if protocol is not None:
            if attempt is not None:
                attempt["reused"] = getattr(protocol, "_lg_handed_out", False)
            protocol._lg_handed_out = True  # a ResponseHandler has a __dict__
        return conn


#: A read from the upstream that waited longer than ``upstream.read_timeout_s`` (aiohttp >= 3.10
#: names it apart from a connect timeout; older versions give the common parent).
READ_TIMEOUT: type[Exception] = getattr(aiohttp, "SocketTimeoutError", aiohttp.ServerTimeoutError)


def _timeout_response(
    base: str, fields: dict[str, Any], st: Any, request: web.Request | None = None
) -> web.Response:
    """504 for an upstream that stopped sending (before its headers, or in a JSON answer the
    proxy was still buffering): an error body in the wire's form (:func:`_error_json`; issue 14,
    item 1)."""
    st.upstream_errors += 1
    fields.update(status=504, upstream_error="UpstreamTimeout")
    return web.Response(
        status=504,
        body=_error_json(
            request,
            f"loopguard: upstream {redact_url(base)} sent nothing for longer than upstream.read_timeout_s",
            "upstream_timeout",
            504,
        ),
        content_type="application/json",
    )


def _body_timeout_response(request: web.Request, received: int) -> web.Response:
    """408 for an agent whose request body stalled for ``listen.body_timeout_s`` (issue 14,
    item 1): nothing was sent upstream; the connection is closed after this answer."""
    timeout_s = request.app[CONFIG_KEY].listen.body_timeout_s
    log.warning(
        "agent_timeout",
        phase="body",
        method=request.method,
        path=request.path,
        received_bytes=received,
        content_length=request.content_length,
        timeout_s=timeout_s,
        status=408,
    )
    response = web.Response(
        status=408,
        body=_error_body(
            f"loopguard: the request body stalled: nothing received for {timeout_s:g} s "
            "(listen.body_timeout_s)",
            "request_timeout",
            408,
        ),
        content_type="application/json",
    )
    response.force_close()
    return response


def _rt(request: web.Request) -> Runtime:
    """The :class:`Runtime` of this request: the current one when the request first asks."""
    rt = request.get(RUNTIME)
    if rt is None:
        rt = request[RUNTIME] = request.app[LIVE_KEY].current
    return rt


async def reload_handler(request: web.Request) -> web.Response:
    """``POST /loop-guard/reload`` (admin token): 200 ``{"status": "reloaded"}``, or 400 with an
    OpenAI-style error whose message names the key."""
    _check_admin(request)
    error = await reload_logged(request.app[LIVE_KEY], "http")
    if error is not None:
        return web.Response(
            status=400,
            body=_error_body(f"loopguard: config not reloaded: {error}", "invalid_config", 400),
            content_type="application/json",
        )
    return web.json_response({"status": "reloaded"})


#: The proxy's own routes (path → the methods each answers): everything else under
#: ``/loop-guard`` is answered 404 or 405 by the proxy, never forwarded (:func:`_own_miss`).
ADMIN_ROUTES = {
    "/loop-guard": ("GET", "HEAD"),
    "/loop-guard/healthz": ("GET", "HEAD"),
    "/loop-guard/metrics": ("GET", "HEAD"),
    "/loop-guard/reload": ("POST",),
}
#: The routes that show or change what conversations did (incidents, per-conversation ledgers
#: with call targets, a reload): without ``admin_token`` they answer loopback peers only.
#: Health and metrics stay open: they hold no conversation's data, and probes and scrapers
#: (Kubernetes, a load balancer, Prometheus in another container) are not on loopback.
LOOPBACK_ONLY = frozenset({"/loop-guard", "/loop-guard/reload"})


def _loopback(request: web.Request) -> bool:
    """The peer is this host's loopback (``127.0.0.0/8``, ``::1``, an IPv4-mapped one)."""
    try:
        address = ipaddress.ip_address(request.remote or "")
    except ValueError:  # a unix socket, or no peer
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def _check_admin(request: web.Request) -> None:
    """401 without the right ``admin_token`` when one is set; without one, 403 for a peer that
    is not on loopback asking a :data:`LOOPBACK_ONLY` route (a proxy bound to 0.0.0.0 in a
    container must not show its conversations to the network)."""
    token = _rt(request).cfg.admin_token
    if token and request.headers.get("Authorization", "") != f"Bearer {token}":
        raise web.HTTPUnauthorized(
            text=_error_body("missing or wrong admin token", "unauthorized", 401).decode(),
            content_type="application/json",
        )
    if not token and request.path in LOOPBACK_ONLY and not _loopback(request):
        message = "loopguard: without admin_token this route answers loopback clients only; set admin_token"
        raise web.HTTPForbidden(
            text=_error_body(message, "forbidden", 403).decode(), content_type="application/json"
        )


def _own_miss(request: web.Request) -> web.Response | None:
    """The answer to a request under ``/loop-guard`` that no route took (a trailing slash, a
    typo, another method, a doubled slash): 405 with ``Allow`` for a route's path with another
    method, else 404; None for a path that is not the proxy's. Such a request is never
    forwarded: it carries the admin token, which the upstream must not see."""
    path = "/" + request.path.lstrip("/")
    if path != "/loop-guard" and not path.startswith("/loop-guard/"):
        return None
    allowed = ADMIN_ROUTES.get(path)
    if allowed is not None and request.method not in allowed:
        return web.Response(
            status=405,
            body=_error_body(f"loopguard: {path} answers {', '.join(allowed)}", "method_not_allowed", 405),
            content_type="application/json",
            headers={"Allow": ", ".join(allowed)},
        )
    return web.Response(
        status=404,
        body=_error_body(f"loopguard: no route {path}", "not_found", 404),
        content_type="application/json",
    )


async def metrics(request: web.Request) -> web.Response:
    _check_admin(request)
    return web.Response(
        body=request.app[METRICS_KEY].render(), headers={"Content-Type": METRICS_CONTENT_TYPE}
    )


async def healthz(request: web.Request) -> web.Response:
    _check_admin(request)
    return web.json_response({"status": "ok"}, dumps=lambda o: orjson.dumps(o).decode())


async def stats(request: web.Request) -> web.Response:
    _check_admin(request)
    if "conversation" in request.query:  # one conversation's turn-guard ledger (issue 4)
        key = key_digest(request.query["conversation"])  # the tables hold digests only
        memory = _rt(request).memory
        remote = await request.app[SHARED_KEY].fetch_state(key)
        if remote is not None:  # another replica's newer request
            with contextlib.suppress(Exception):
                if newer(memory.store.get(key, memory.clock()), remote):
                    memory.store.put(key, remote)
        view = memory.view(key, memory.clock())
        if view is None:
            message = f"no turn_guard ledger for conversation {key} (unknown, expired, or turn_guard off)"
            return web.Response(
                status=404, body=_error_body(message, "not_found", 404), content_type="application/json"
            )
        return web.json_response(view, dumps=lambda o: orjson.dumps(o).decode())
    snapshot = request.app[STATS_KEY].snapshot()
    snapshot["responses_store"] = request.app[RESPONSES_KEY].snapshot()
    prefixes = request.app[PREFIX_KEY]
    if isinstance(prefixes, PrefixCache):
        snapshot["prefix_cache"] = prefixes.snapshot()
    totals = await request.app[SHARED_KEY].totals()
    if totals is not None:  # several replicas: the sum of their counters (proxy.edge.shared_state)
        snapshot["replicas"] = totals
    return web.json_response(snapshot, dumps=lambda o: orjson.dumps(o).decode())


def _error_event(request: web.Request, message: str, type_: str, code: int) -> bytes:
    """The SSE event that ends a broken stream: ``data: {"error": …}`` for chat completions, an
    ``error`` event (``{"type": "error", "code", "message", "param"}``) for the Responses API, an
    ``error`` event (``{"type": "error", "error": {"type", "message"}}``, Anthropic's form, which
    its SDK raises as an API error) for Messages."""
    wire = _guarded(request)
    if wire == "responses":
        obj: dict[str, Any] = {"type": "error", "code": type_, "message": message, "param": None}
        return b"event: error\ndata: " + orjson.dumps(obj) + b"\n\n"
    if wire == "messages":
        obj = {"type": "error", "error": {"type": type_, "message": message}}
        return b"event: error\ndata: " + orjson.dumps(obj) + b"\n\n"
    return b"data: " + _error_body(message, type_, code) + b"\n\n"


def _dialect(request: web.Request) -> dialects.Dialect | None:
    """The dialect that guards this request (:data:`proxy.dialects.REGISTRY`), None = passthrough."""
    return dialects.for_path(request.path) if request.method == "POST" else None


def _guarded(request: web.Request) -> str | None:
    """The wire of the answer the response side reads (``chat``, ``responses``, ``messages``,
    ``gemini``), or None. A Gemini ``:streamGenerateContent`` without ``alt=sse`` answers one JSON
    array that streams: relayed unread (:mod:`proxy.response.gemini_stream`)."""
    dialect = _dialect(request)
    if dialect is openai_chat:
        return "chat"
    if dialect is anthropic_messages:
        return "messages"
    if dialect is gemini:
        streamed = gemini.is_stream(request.path)
        return "gemini" if not streamed or request.query.get("alt") == "sse" else None
    return "responses" if dialect is openai_responses else None


def _header_key(headers: Any, names: tuple[str, ...]) -> str | None:
    """The conversation key when a ``conversation_key`` header gives it (DESIGN §4's first rule:
    known before the body is read; its digest, as the decision's), else None."""
    value = next((headers[n] for n in names if headers.get(n)), None)
    return key_digest(value) if value is not None else None


async def _decide(request: web.Request, raw: bytes, dialect: dialects.Dialect) -> RequestDecision:
    app = request.app
    rt = _rt(request)
    memory = rt.memory
    store = app[RESPONSES_KEY]
    shared = app[SHARED_KEY]
    now_ms = memory.clock()
    request[DECIDED_MS] = now_ms  # the capture records the time the guards decided at

    def run(state_for: Any, previous: Any) -> RequestDecision:
        if previous is not None:  # the store holds this credential's responses only (store_key)
            previous = functools.partial(_scoped, previous, request.headers)
        return decide_request(
            raw,
            request.headers,
            rt.guards,
            rt.cfg.conversation_key.headers,
            now_ms=now_ms,
            state_for=state_for,
            dialect=dialect,
            previous=previous,
            prefixes=app[PREFIX_KEY],  # type: ignore[arg-type]
            observed=rt.observed,
        )

    try:  # with a shared backend, what the decision asks for is fetched first (proxy.edge.shared_state)
        decision = await shared.decide(
            run,
            memory.state_for(now_ms),
            store.get if dialect is openai_responses else None,
            memory.store.put,
            store.put,
            hint=_header_key(request.headers, rt.cfg.conversation_key.headers),
        )
    except Exception as exc:  # fail open: the guards must never break the agent
        app[STATS_KEY].internal_errors += 1
        log.error("guard_error", error=type(exc).__name__, path=request.path)
        return RequestDecision(raw, (), False)
    try:  # remember first-seen times, narration reminders, the ledger (proxy.request.memory)
        memory.commit(decision, now_ms)
        state = memory.store.get(decision.conversation, now_ms) if shared.shared and memory.enabled else None
    except Exception as exc:  # fail open: a memory bug must not change the decision
        app[STATS_KEY].internal_errors += 1
        log.error("memory_error", error=type(exc).__name__, path=request.path)
        return decision
    if state is not None and decision.transcript is not None:
        await shared.save_state(decision.conversation, state)
    return decision


def _scoped(lookup: Callable[[str], Any], headers: Any, rid: str) -> Any:
    """``lookup`` of response ``rid`` as kept for the credential in ``headers`` (its
    :func:`proxy.request.response_store.store_key`)."""
    return lookup(store_key(headers, rid))


def _unknown_previous(request: web.Request, decision: RequestDecision) -> None:
    """Log a ``previous_response_id`` the store does not hold, once per chain (fails open)."""
    app = request.app
    assert decision.chain is not None and decision.chain.previous is not None
    try:
        first = app[RESPONSES_KEY].note_unknown(store_key(request.headers, decision.chain.previous))
    except Exception as exc:
        app[STATS_KEY].internal_errors += 1
        log.error("store_error", error=type(exc).__name__)
        return
    if first:
        log.warning(
            "unknown_previous_response",
            conversation=decision.conversation or None,
            # a digest: the id is the agent's to choose and may be megabytes long
            previous_response_id_digest=key_digest(decision.chain.previous),
            hint="forwarded unguarded: loopguard does not hold this response (a restart, another "
            "replica, or evicted: responses_store.*); the rest of this chain is counted, not logged",
        )


def _keeper(request: web.Request, decision: RequestDecision | None) -> Any:
    """The response side's ``on_answer`` for this request: the answer goes to the response store,
    kept for this request's credential (None when the store wants nothing of it)."""
    chain = decision.chain if decision is not None else None
    if chain is None or not (chain.keep or chain.lost):
        return None
    store = request.app[RESPONSES_KEY]
    shared = request.app[SHARED_KEY]
    headers = request.headers

    def keep(answer: Answer) -> Any:
        key = store_key(headers, answer.response_id)
        if store.after_answer(chain, answer, key) and shared.shared:  # written before the agent has it
            return asyncio.ensure_future(shared.keep(key, store.peek(key)))
        return None

    return keep


def _record_incidents(app: web.Application, decision: RequestDecision) -> None:
    """Circuit-breaker incidents (DESIGN §6.2): the fresh first-of-kind denials of this request go
    to the stats and the incident log (written in the background). Fails open like the guards."""
    try:
        incidents = app[INCIDENTS_KEY].record(
            decision.actions, decision.conversation, now_ms=int(time.time() * 1000)
        )
    except Exception as exc:
        app[STATS_KEY].internal_errors += 1
        log.error("incident_error", error=type(exc).__name__)
        return
    app[STATS_KEY].record_incidents(incidents)


async def proxy_handler(request: web.Request) -> web.StreamResponse:
    """Every request no route of the proxy's own takes: forwarded (module doc)."""
    own = _own_miss(request)
    if own is not None:
        return own
    opened = request.app[OPEN_KEY]
    task = asyncio.current_task()
    opened.add(task)
    try:
        return await _proxy(request)
    finally:
        opened.discard(task)


def _declared_too_large(request: web.Request) -> bool:
    """The request's ``Content-Length`` is over ``upstream.max_body_mb``."""
    length = request.content_length
    return length is not None and length > request.client_max_size


def _too_large_response(request: web.Request) -> web.Response:
    """413 for a body over ``upstream.max_body_mb`` (an error body in the wire's form), logged
    as a request line; nothing is sent upstream."""
    limit = request.app[CONFIG_KEY].upstream.max_body_mb
    log.warning(  # the request line's fields, as for any request
        "request",
        method=request.method,
        path=request.path,
        conversation=None,
        model=None,
        stream=None,
        rewritten=False,
        actions=[],
        status=413,
        too_large=True,
    )
    return web.Response(
        status=413,
        body=_error_json(
            request,
            f"loopguard: request body over {limit:g} MiB (upstream.max_body_mb)",
            "request_too_large",
            413,
        ),
        content_type="application/json",
    )


async def _expect(request: web.Request) -> web.StreamResponse | None:
    """The forwarding route's ``Expect`` handler: a body its ``Content-Length`` says is over
    ``upstream.max_body_mb`` gets the 413 at once instead of ``100 Continue`` (RFC 9110
    §10.1.1: a server may answer with a final status instead; the client then never sends the
    body). Anything else as aiohttp does (``100 Continue``, or 417 for another expectation)."""
    if _declared_too_large(request) and _own_miss(request) is None:
        request.app[STATS_KEY].requests += 1  # the handler, which counts requests, does not run
        return _too_large_response(request)
    return await _default_expect_handler(request)


def _shutdown_response(request: web.Request, fields: dict[str, Any]) -> web.Response:
    """503 for a request the shutdown ended before the agent had any of its answer (an error
    body in the wire's form, :func:`_error_json`); the connection closes after it."""
    fields.update(status=503, shutdown=True)
    response = web.Response(
        status=503,
        body=_error_json(request, "loopguard is shutting down", "proxy_shutdown", 503),
        content_type="application/json",
    )
    response.force_close()
    return response


async def _until_grace_over(app: web.Application, send: Callable[[], Any]) -> aiohttp.ClientResponse | None:
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


async def _proxy(request: web.Request) -> web.StreamResponse:
    app = request.app
    rt = _rt(request)  # this request's config and guards, whatever a reload does meanwhile
    st = app[STATS_KEY]
    st.requests += 1
    if _declared_too_large(request):  # said by Content-Length: no need to read it first
        return _too_large_response(request)
    try:
        raw = await connections.read_body(request, app[CONFIG_KEY].listen.body_timeout_s)
    except connections.BodyTimeout as exc:
        return _body_timeout_response(request, exc.received)
    except web.HTTPRequestEntityTooLarge:
        return _too_large_response(request)
    t_start = time.perf_counter()

    decision = RequestDecision(raw, (), False)
    # With every request-side guard off there is nothing to decide: the body is not even parsed.
    dialect = _dialect(request) if rt.guards else None
    if dialect is not None and "content-encoding" in request.headers:
        decision = RequestDecision(raw, (), False, unguarded="content_encoding")
    elif dialect is not None and dialect in rt.plain and plain.nothing_to_guard(raw):
        # no tool call, result or offered tool anywhere in the bytes: the guards would find
        # nothing; the answer's side still runs what applies to any answer (relay.plan)
        decision = decide_plain(raw, request.headers, rt.cfg.conversation_key.headers, dialect)
        if decision.unguarded is None:
            st.guarded_requests += 1
            st.nothing_to_guard += 1
    elif dialect is not None:
        decision = await _decide(request, raw, dialect)
        if decision.unguarded is None:
            st.guarded_requests += 1  # read by the guards (unreadable ones count under unguarded)
        if decision.changed:
            st.rewritten_requests += 1
        st.record_actions(decision.actions)
        if decision.actions:
            _record_incidents(app, decision)

    url = forward.upstream_url(app[UPSTREAM_KEY][0], forward.origin_form(request.raw_path))
    headers = forward.filter_headers(request.headers.items(), forward.REQUEST_DROP)
    streamed = _as_stream(request, decision)
    fields = {
        "method": request.method,
        "path": request.path,
        "conversation": decision.conversation or None,
        "model": decision.model,
        "stream": decision.stream,
        "rewritten": decision.changed,
        **(gemini.log_fields(request.path) if dialect is gemini else {}),
        "actions": [action_summary(a) for a in decision.actions if a.fresh],
    }
    if decision.unguarded:  # a chat request the guards could not read: counted, said in the log
        st.unguarded[decision.unguarded] += 1
        fields["unguarded"] = decision.unguarded
        if decision.unguarded == UNKNOWN_PREVIOUS and decision.chain is not None:
            _unknown_previous(request, decision)
    elif decision.chain is not None and decision.chain.previous is not None:
        fields["chain_items"] = decision.chain.count  # guarded over the kept chain
    t_send = time.perf_counter()
    fields["added_ms"] = round((t_send - t_start) * 1000, 3)
    app[METRICS_KEY].observe_added(t_send - t_start)
    if streamed is not None:
        fields["as_stream"] = True
    try:
        return await _forward(request, url, headers, decision.body, fields, t_send, decision, streamed)
    except asyncio.CancelledError:
        if app[SHUTDOWN_KEY].is_set() and not request.get(DELIVERED):
            fields["shutdown"] = True  # ended by the shutdown after the grace period
        elif not request.get(DELIVERED):
            fields["disconnected"] = True  # the agent went away; the upstream request is closed
        raise
    finally:
        if "disconnected" in fields:
            st.disconnects += 1
        failed = "upstream_error" in fields or "disconnected" in fields or "shutdown" in fields
        (log.warning if failed else log.info)("request", **fields)
        if CAPTURE_KEY in app and decision.transcript is not None:
            _capture(request, raw, decision)


def _capture(request: web.Request, raw: bytes, decision: RequestDecision) -> None:
    """One capture line for a guarded request (:mod:`proxy.edge.capture`); fails open."""
    app = request.app
    cfg = _rt(request).cfg
    if _dialect(request) is gemini:
        return  # capture and replay read chat, Responses and Messages histories
    try:
        upstream_answer = request.get(UPSTREAM_ANSWER)
        data = capture.line(
            time_ms=request.get(DECIDED_MS) or _rt(request).memory.clock(),
            conversation=decision.conversation,
            dialect=_guarded(request) or "chat",
            body=jsonbody.decode(raw),
            answer=capture.answer_of(upstream_answer) if upstream_answer else None,
            contents=cfg.capture.contents,
            masks=compile_masks(cfg.progress.masks),
        )
        app[CAPTURE_KEY].write(data)
    except Exception as exc:
        app[STATS_KEY].internal_errors += 1
        log.error("capture_error", error=type(exc).__name__)


def _as_stream(request: web.Request, decision: RequestDecision) -> bytes | None:
    """The body to send upstream as a stream (``upstream.stream_json_requests``,
    :mod:`proxy.response.as_stream`), or None to send ``decision.body`` as it is. Fails open."""
    app = request.app
    if not app[CONFIG_KEY].upstream.stream_json_requests or _guarded(request) != "chat":
        return None
    if "content-encoding" in request.headers:
        return None
    try:
        return as_stream.stream_request(decision.body, parsed=decision.transcript is not None)
    except Exception as exc:  # fail open: the request goes as the agent sent it
        app[STATS_KEY].internal_errors += 1
        log.error("as_stream_error", error=type(exc).__name__, path=request.path)
        return None


async def _forward(
    request: web.Request,
    url: str,
    headers: CIMultiDict[str],
    body: bytes,
    fields: dict[str, Any],
    t_send: float,
    decision: RequestDecision | None = None,
    streamed: bytes | None = None,
) -> web.StreamResponse:
    """Send the request upstream and relay the response; fills ``fields`` for the log line.
    Answers to chat completions go through the response side (:mod:`proxy.edge.relay`).
    ``streamed``: the body as a stream request (``upstream.stream_json_requests``), sent instead
    of ``body``; its answer is assembled into JSON, and ``body`` is sent once more when the
    upstream refuses the stream or sends an empty one (:func:`_relay_streamed`)."""
    app = request.app
    st = app[STATS_KEY]
    base, auth = app[UPSTREAM_KEY]
    if auth and "authorization" not in headers:
        headers["Authorization"] = auth
    sent_headers = headers
    if "Accept-Encoding" in headers and (
        streamed is not None or relay.reads(_guarded(request), _rt(request).cfg)
    ):
        sent_headers = headers.copy()  # an answer the response side reads: asked uncompressed
        sent_headers["Accept-Encoding"] = "identity"

    attempt: dict[str, bool] = {}

    async def send() -> aiohttp.ClientResponse:
        attempt["reused"] = False  # set by _Connector when the pool hands out a kept-alive connection
        _ATTEMPT.set(attempt)
        return await app[SESSION_KEY].request(
            request.method,
            url,
            headers=sent_headers,
            data=(streamed if streamed is not None else body) if body or request.can_read_body else None,
            allow_redirects=False,
            skip_auto_headers=forward.SKIP_AUTO_HEADERS,
        )

    try:
        try:
            sent = await _until_grace_over(app, send)
        except STALE_CONNECTION as exc:
            if isinstance(exc, aiohttp.ClientConnectorError) or not attempt["reused"]:
                # no connection at all, or a fresh one the upstream read the request on and then
                # dropped: sending it again could run a generation twice
                raise
            # a kept-alive connection the upstream closed at its idle timeout as the request went
            # out: once more, on a fresh connection (issue 14, item 10)
            fields["retried"] = True
            sent = await _until_grace_over(app, send)
        if sent is None:
            return _shutdown_response(request, fields)
        upstream = sent
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        if isinstance(exc, READ_TIMEOUT) and not isinstance(exc, aiohttp.ClientConnectorError):
            return _timeout_response(base, fields, st, request)
        st.upstream_errors += 1
        fields.update(status=502, upstream_error=type(exc).__name__)
        return web.Response(
            status=502,
            body=_error_json(
                request,
                f"loopguard: upstream {redact_url(base)} unreachable ({type(exc).__name__})",
                "upstream_unreachable",
                502,
            ),
            content_type="application/json",
        )

    fields.update(status=upstream.status, upstream_ms=round((time.perf_counter() - t_send) * 1000, 3))
    app[INFLIGHT_KEY].add(upstream)
    side: relay.ResponseSide | None = None
    try:
        rt = _rt(request)
        side = relay.plan(
            _guarded(request),
            upstream,
            decision,
            rt.guards,
            rt.cfg,
            _keeper(request, decision),
            tap=CAPTURE_KEY in app and decision is not None and decision.transcript is not None,
        )
    except Exception as exc:  # fail open: relay the answer as is
        relay.failed(st, "plan", exc)
    try:
        if streamed is not None and (relay.readable_stream(upstream) or 400 <= upstream.status < 500):
            answer = await _relay_streamed(request, upstream, side, fields)
            if answer is not None:
                return answer
            # the upstream refused the stream, or sent none: the request once more, as it came
            app[INFLIGHT_KEY].discard(upstream)
            upstream.close()
            return await _forward(request, url, headers, body, fields, t_send, decision)
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        response.headers.extend(forward.filter_headers(upstream.headers.items()))
        try:
            whole = await _whole_answer(request, upstream) if side is None else None
            if whole is not None:  # the answer came whole: headers and body in one write
                headers_out = response.headers
                response = web.Response(status=upstream.status, reason=upstream.reason, headers=headers_out)
                response.body = whole
                await response.prepare(request)
            elif side is None:
                await response.prepare(request)
                sse = upstream.content_type == "text/event-stream"
                tail = b""
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                    if sse and DONE_MARK in tail + chunk:
                        request[DELIVERED] = True  # the agent has the whole answer
                    tail = chunk[-16:]
            elif side.kind == "json":
                response = await relay.relay_json(request, upstream, response, side, st)
            elif side.kind == "observe":
                await response.prepare(request)
                await relay.relay_observed(upstream, response, side, st)
            else:
                response.headers.popall("Content-Length", None)  # the body may change
                await response.prepare(request)
                await relay.relay_sse(upstream, response, side, st)
            await response.write_eof()
        except asyncio.CancelledError:
            if side is not None and side.delivered:
                request[DELIVERED] = True  # the agent hung up after the whole answer
            raise
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionResetError) as exc:
            if isinstance(exc, READ_TIMEOUT) and not response.prepared:
                return _timeout_response(
                    base, fields, st, request
                )  # a buffered JSON answer: nothing sent yet
            if request.get(DELIVERED) or (side is not None and side.delivered):
                return response  # the agent had the whole answer and hung up: not a failure
            if app[SHUTDOWN_KEY].is_set() and upstream not in app[INFLIGHT_KEY]:
                # the shutdown's grace period ended and closed this upstream response
                if not response.prepared:  # a buffered JSON answer: the agent has nothing yet
                    return _shutdown_response(request, fields)
                fields["shutdown"] = True
                if upstream.content_type == "text/event-stream":
                    with contextlib.suppress(Exception):
                        await response.write(
                            _error_event(request, "loopguard is shutting down", "proxy_shutdown", 503)
                        )
                if request.transport is not None:
                    request.transport.close()
                return response
            if request.transport is None or request.transport.is_closing():
                # The agent went away while we wrote to it (often right after [DONE]): not an
                # upstream error, and nothing left to tell anyone.
                fields["disconnected"] = True
                return response
            st.upstream_errors += 1
            fields["upstream_error"] = type(exc).__name__
            if upstream.content_type == "text/event-stream":
                stalled = isinstance(exc, READ_TIMEOUT)
                with contextlib.suppress(Exception):
                    await response.write(
                        _error_event(
                            request,
                            "loopguard: upstream sent nothing for longer than upstream.read_timeout_s"
                            if stalled
                            else "loopguard: upstream closed the stream before it finished",
                            "upstream_timeout" if stalled else "upstream_disconnected",
                            504 if stalled else 502,
                        )
                    )
            # Close without the terminating chunk: the agent must not mistake this for success.
            if request.transport is not None:
                request.transport.close()
            return response
        return response
    finally:
        app[INFLIGHT_KEY].discard(upstream)
        upstream.close()
        if side is not None and side.tap is not None:
            with contextlib.suppress(Exception):  # the capture's copy of the answer; fails open
                request[UPSTREAM_ANSWER] = side.upstream_answer()
        if side is not None:
            conversation = decision.conversation if decision is not None else ""
            chain = decision.chain if decision is not None else None
            relay.record(side, st, app[INCIDENTS_KEY], conversation, body, fields, chain)


async def _whole_answer(request: web.Request, upstream: aiohttp.ClientResponse) -> bytes | None:
    """The upstream's whole body when all of it has already arrived (a ``Content-Length`` answer
    that is not an event stream, to a request that is not ``HEAD``), else None: then nothing was
    read and the caller relays the body chunk by chunk. Nothing waits for bytes to come."""
    length = upstream.content_length
    if (
        not length
        or request.method == "HEAD"
        or upstream.content_type == "text/event-stream"
        or upstream.status in (204, 304)
    ):
        return None
    if not upstream.content.is_eof():  # not all here yet
        return None
    return await upstream.content.read()  # what has arrived, at once (the parser ended it)


#: Upstream response headers that describe an event stream, not the JSON answer made of it.
_STREAM_HEADERS = ("Content-Type", "Content-Length", "X-Accel-Buffering")


async def _relay_streamed(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    side: relay.ResponseSide | None,
    fields: dict[str, Any],
) -> web.StreamResponse | None:
    """The agent's answer to a request sent upstream as a stream (``upstream.stream_json_requests``):
    a 200 event stream assembled into one ``chat.completion`` (:func:`proxy.edge.relay.relay_as_json`),
    a 4xx passed through as it came, or None when the original request is to be sent once more
    (an empty event stream, or a 4xx that refuses the stream itself: ``stream_fallback``)."""
    app = request.app
    st = app[STATS_KEY]
    base = app[UPSTREAM_KEY][0]
    headers = forward.filter_headers(upstream.headers.items())
    if not relay.readable_stream(upstream):  # a 4xx: small; read it to see what it refuses
        return await _refused(request, upstream, fields)
    assembly, error = await relay.relay_as_json(upstream, side, st)
    if assembly.empty and not isinstance(error, asyncio.TimeoutError) and not app[SHUTDOWN_KEY].is_set():
        fields["stream_fallback"] = "empty_stream"
        return None
    answer = assembly.answer()
    if answer is None:
        if isinstance(error, asyncio.TimeoutError):
            return _timeout_response(base, fields, st)
        if app[SHUTDOWN_KEY].is_set() and upstream not in app[INFLIGHT_KEY]:
            return _shutdown_response(request, fields)
        st.upstream_errors += 1
        fields.update(status=502, upstream_error=type(error).__name__ if error else "IncompleteStream")
        return web.Response(
            status=502,
            body=_error_body(
                "loopguard: upstream closed the stream before it finished", "upstream_disconnected", 502
            ),
            content_type="application/json",
        )
    status, body = answer
    fields["status"] = status
    for name in _STREAM_HEADERS:
        headers.popall(name, None)
    headers["Content-Type"] = "application/json"
    return web.Response(status=status, body=body, headers=headers)


async def _refused(
    request: web.Request, upstream: aiohttp.ClientResponse, fields: dict[str, Any]
) -> web.StreamResponse | None:
    """A 4xx answer to a request sent as a stream: None when it refuses the stream itself
    (:func:`proxy.response.as_stream.stream_rejected`), else passed through as it came."""
    app = request.app
    raw = bytearray()
    try:
        while len(raw) <= 65536:
            chunk = await upstream.content.read(65537 - len(raw))
            if not chunk:
                break
            raw += chunk
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        if isinstance(exc, asyncio.TimeoutError):
            return _timeout_response(app[UPSTREAM_KEY][0], fields, app[STATS_KEY])
    else:
        if upstream.content.at_eof() and as_stream.stream_rejected(upstream.status, bytes(raw)):
            fields["stream_fallback"] = "rejected"
            return None
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
    response.headers.extend(forward.filter_headers(upstream.headers.items()))
    await response.prepare(request)
    await response.write(bytes(raw))
    try:
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        app[STATS_KEY].upstream_errors += 1
        fields["upstream_error"] = type(exc).__name__
        if request.transport is not None:
            request.transport.close()  # not the whole body: the agent must not take it as one
        return response
    await response.write_eof()
    return response


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


async def _client_session(app: web.Application) -> AsyncIterator[None]:
    up = app[CONFIG_KEY].upstream
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=up.connect_timeout_s, sock_read=up.read_timeout_s
    )
    app[SESSION_KEY] = aiohttp.ClientSession(
        # one upstream connection per agent connection: a request never waits for a pooled one
        # (aiohttp's default pool of 100 made the 101st concurrent request wait with no timeout)
        connector=_Connector(limit=app[CONFIG_KEY].listen.max_connections, limit_per_host=0),
        timeout=timeout,
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        max_line_size=HEADER_LIMIT,
        max_field_size=HEADER_LIMIT,
    )
    yield
    await app[SESSION_KEY].close()


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
    app.cleanup_ctx.append(_client_session)
    app.cleanup_ctx.append(_shared_state)
    app.cleanup_ctx.append(_incident_log)
    app.cleanup_ctx.append(_capture_log)
    app.router.add_get("/loop-guard", stats)
    app.router.add_get("/loop-guard/healthz", healthz)
    app.router.add_get("/loop-guard/metrics", metrics)
    app.router.add_post("/loop-guard/reload", reload_handler)
    app.router.add_route("*", "/{tail:.*}", proxy_handler, expect_handler=_expect)
    return app


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
        max_line_size=HEADER_LIMIT,
        max_field_size=HEADER_LIMIT,
        # an answer sent before the whole body came (a 408 after a stalled body, a 413) drains
        # the rest for at most this long before closing (aiohttp's default is 10 s, a connection
        # slot held that long; without draining, a reset could destroy the answer)
        lingering_time=LINGER_S,
    )
    await runner.setup()
    assert runner.server is not None
    # agent-side limits (issue 14, items 1 and 9): header timeout, max_connections, half-close
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


def end_grace(app: web.Application) -> None:
    """End what a shutdown's grace period left running (:func:`serve_forever`, after
    ``SHUTDOWN_KEY``): a request still waiting for the upstream's headers gets a 503, a stream its
    error event, a JSON answer not yet sent a 503 (their handlers answer). Synchronous: no
    handler runs between setting ``GRACE_OVER_KEY`` and the sweep."""
    app[GRACE_OVER_KEY].set()
    for task in list(app[PENDING_KEY]):
        task.cancel()
    for upstream in list(app[INFLIGHT_KEY]):
        app[INFLIGHT_KEY].discard(upstream)
        upstream.close()


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
        capture=cfg.capture.path or None,
        state=redact_url(cfg.state.backend),
        event_loop=loop_name,
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
        log.info("shutting_down", grace_s=cfg.listen.shutdown_grace_s, in_flight=len(app[OPEN_KEY]))
        app[SHUTDOWN_KEY].set()
        for site in list(runner.sites):
            await site.stop()  # no new connections
        deadline = time.monotonic() + cfg.listen.shutdown_grace_s
        while app[OPEN_KEY] and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        end_grace(app)
        finish = time.monotonic() + FINISH_S
        while app[OPEN_KEY] and time.monotonic() < finish:
            await asyncio.sleep(0.02)  # their answers and log lines
    finally:
        await runner.cleanup()
        log.info("stopped")
