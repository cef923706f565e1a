"""The upstream half of a forwarded request: send it (the app's one ``ClientSession``), relay the
answer to the agent, and answer for the upstream when it fails (:mod:`proxy.edge.answers`).

- The answer is relayed with its status and headers (minus hop-by-hop) and its body chunk by
  chunk as it arrives (SSE included): nothing is buffered or re-encoded, except that answers the
  response side reads go through it (:mod:`proxy.edge.relay`: tool-call deltas held until their
  choice's decision, JSON bodies buffered; unchanged when nothing is decided).
- Upstream unreachable: 502. Upstream silent past ``upstream.read_timeout_s``: 504 before any of
  the answer was sent. Upstream closing mid-stream: an SSE stream gets a final error event and the
  connection is closed without the terminating chunk, so the agent sees an error, never a silent
  success. An event stream goes to the agent whole events at a time (:class:`GatedStream`), so
  an event the upstream broke off in is dropped and the error event is read on its own.
- A kept-alive connection the upstream closed at its idle timeout as the request went out is
  retried once on a fresh connection (:data:`STALE_CONNECTION`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from proxy.edge import forward, recovery, relay, stopped
from proxy.edge.answers import error_event, shutdown_response, timeout_response, unreachable_response
from proxy.edge.keys import (
    CAPTURE_KEY,
    CONFIG_KEY,
    DELIVERED,
    INCIDENTS_KEY,
    INFLIGHT_KEY,
    RESPONSES_KEY,
    SESSION_KEY,
    SHARED_KEY,
    SHUTDOWN_KEY,
    STATS_KEY,
    UPSTREAM_ANSWER,
    UPSTREAM_KEY,
    runtime_of,
)
from proxy.edge.shutdown import until_grace_over
from proxy.edge.streamed import relay_streamed
from proxy.edge.wire import wire_of
from proxy.request.response_store import Answer, store_key
from proxy.request.rewrite import RequestDecision
from proxy.response.sse import EventGate

DONE_MARK = b"[DONE]"

#: What a request on a kept-alive connection the upstream has just closed fails with, before any
#: answer: retried once on a fresh connection (aiohttp drops the dead connection from its pool).
#: Only a reused connection is retried (:class:`Connector`); on a fresh one the upstream got the
#: request, so the failure is a 502.
STALE_CONNECTION = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


#: The attempt of the request being sent in this task (``{"reused": bool}``), for the connector.
_ATTEMPT: contextvars.ContextVar[dict[str, bool] | None] = contextvars.ContextVar("attempt", default=None)


class Connector(aiohttp.TCPConnector):
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


async def client_session(app: web.Application) -> AsyncIterator[None]:
    """The app's one upstream ``ClientSession`` (a ``cleanup_ctx``): its pool, timeouts and header
    limits from ``upstream.*`` and ``listen.max_connections``; it decompresses nothing."""
    up = app[CONFIG_KEY].upstream
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=up.connect_timeout_s, sock_read=up.read_timeout_s
    )
    app[SESSION_KEY] = aiohttp.ClientSession(
        # one upstream connection per agent connection: a request never waits for a pooled one
        # (aiohttp's default pool of 100 made the 101st concurrent request wait with no timeout)
        connector=Connector(limit=app[CONFIG_KEY].listen.max_connections, limit_per_host=0),
        timeout=timeout,
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        max_line_size=forward.HEADER_LIMIT,
        max_field_size=forward.HEADER_LIMIT,
    )
    yield
    await app[SESSION_KEY].close()


async def send_and_relay(
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
    upstream refuses the stream or sends an empty one (:func:`proxy.edge.streamed.relay_streamed`)."""
    app = request.app
    st = app[STATS_KEY]
    base, auth = app[UPSTREAM_KEY]
    if auth and "authorization" not in headers:
        headers["Authorization"] = auth
    sent_headers = headers
    if "Accept-Encoding" in headers and (
        streamed is not None or relay.reads(wire_of(request), runtime_of(request).cfg)
    ):
        sent_headers = headers.copy()  # an answer the response side reads: asked uncompressed
        sent_headers["Accept-Encoding"] = "identity"

    attempt: dict[str, bool] = {}

    async def send() -> aiohttp.ClientResponse:
        attempt["reused"] = False  # set by Connector when the pool hands out a kept-alive connection
        _ATTEMPT.set(attempt)
        return await app[SESSION_KEY].request(
            request.method,
            # as built: yarl would resolve dot segments and re-quote escapes (the target goes as sent)
            URL(url, encoded=True),
            headers=sent_headers,
            data=(streamed if streamed is not None else body) if body or request.can_read_body else None,
            allow_redirects=False,
            skip_auto_headers=forward.SKIP_AUTO_HEADERS,
        )

    try:
        try:
            sent = await until_grace_over(app, send)
        except STALE_CONNECTION as exc:
            if isinstance(exc, aiohttp.ClientConnectorError) or not attempt["reused"]:
                # no connection at all, or a fresh one the upstream read the request on and then
                # dropped: sending it again could run a generation twice
                raise
            # a kept-alive connection the upstream closed at its idle timeout as the request went
            # out: once more, on a fresh connection
            fields["retried"] = True
            sent = await until_grace_over(app, send)
        if sent is None:
            return shutdown_response(request, fields)
        upstream = sent
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        if isinstance(exc, READ_TIMEOUT) and not isinstance(exc, aiohttp.ClientConnectorError):
            return timeout_response(base, fields, st, request)
        return unreachable_response(base, fields, st, request, exc)

    fields.update(status=upstream.status, upstream_ms=round((time.perf_counter() - t_send) * 1000, 3))
    app[INFLIGHT_KEY].add(upstream)
    side: relay.ResponseSide | None = None
    rt = runtime_of(request)
    try:
        # an answer that repeats a withheld call: asked again (recovery.*), read whole first
        chosen = await recovery.recover(
            request,
            upstream,
            url,
            sent_headers,
            streamed if streamed is not None else body,
            decision,
            wire_of(request),
            rt.cfg,
            fields,
        )
        if chosen is not upstream:
            app[INFLIGHT_KEY].discard(upstream)
            upstream = chosen  # type: ignore[assignment]  # relayed as the upstream's response
            app[INFLIGHT_KEY].add(upstream)
            fields["status"] = upstream.status
    except BaseException:
        app[INFLIGHT_KEY].discard(upstream)
        upstream.close()
        raise
    try:
        side = relay.plan(
            wire_of(request),
            upstream,
            decision,
            rt.guards,
            rt.cfg,
            keeper(request, decision),
            tap=CAPTURE_KEY in app and decision is not None and decision.transcript is not None,
        )
    except Exception as exc:  # fail open: relay the answer as is
        relay.failed(st, "plan", exc)
    try:
        if streamed is not None and (relay.readable_stream(upstream) or 400 <= upstream.status < 500):
            answer = await relay_streamed(request, upstream, side, fields)
            if answer is not None:
                return answer
            # the upstream refused the stream, or sent none: the request once more, as it came
            app[INFLIGHT_KEY].discard(upstream)
            upstream.close()
            return await send_and_relay(request, url, headers, body, fields, t_send, decision)
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        response.headers.extend(forward.filter_headers(upstream.headers.items()))
        sse = upstream.content_type == "text/event-stream"
        # an event stream goes out whole events at a time, so that an error event can end it
        out: web.StreamResponse | GatedStream = GatedStream(response) if sse else response
        try:
            whole = await _whole_answer(request, upstream) if side is None else None
            if whole is not None:  # the answer came whole: headers and body in one write
                headers_out = response.headers
                response = web.Response(status=upstream.status, reason=upstream.reason, headers=headers_out)
                response.body = whole
                await response.prepare(request)
            elif side is None:
                await response.prepare(request)
                tail = b""
                async for chunk in upstream.content.iter_any():
                    await out.write(chunk)
                    if sse and DONE_MARK in tail + chunk:
                        request[DELIVERED] = True  # the agent has the whole answer
                    tail = chunk[-16:]
            elif side.kind == "json":
                response = await relay.relay_json(request, upstream, response, side, st)
                fields["status"] = response.status  # a stop delivered as an error is a 400
            elif side.kind == "observe":
                await response.prepare(request)
                await relay.relay_observed(upstream, out, side, st)
            else:
                response.headers.popall("Content-Length", None)  # the body may change
                if not side.hold:  # held (stop.deliver: error): prepared when its bytes go out
                    await response.prepare(request)
                stop = await relay.relay_sse(upstream, out, side, st, request)
                if stop is not None:  # stopped before anything was sent: the upstream API's error
                    fields["status"] = stopped.STATUS
                    response = stopped.stop_response(side.wire, stop)
                    await response.prepare(request)
                    out = response  # nothing went through the gate
                elif not response.prepared:  # an empty answer, held
                    await response.prepare(request)
            if isinstance(out, GatedStream):
                await out.flush()
            await response.write_eof()
        except asyncio.CancelledError:
            if side is not None and side.delivered:
                request[DELIVERED] = True  # the agent hung up after the whole answer
            raise
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionResetError) as exc:
            # Its traceback holds the frames it came through (this request's body, decision and
            # response side among their locals), and aiohttp's reader that raised it holds it
            # (``StreamReader.set_exception``): a reference cycle that kept all of that alive
            # until a full collection. Nothing here reads the traceback.
            exc.__traceback__ = None
            if isinstance(exc, READ_TIMEOUT) and not response.prepared:
                return timeout_response(base, fields, st, request)  # a buffered JSON answer: nothing sent yet
            if request.get(DELIVERED) or (side is not None and side.delivered):
                return response  # the agent had the whole answer and hung up: not a failure
            if app[SHUTDOWN_KEY].is_set() and upstream not in app[INFLIGHT_KEY]:
                # the shutdown's grace period ended and closed this upstream response
                if not response.prepared:  # a buffered JSON answer: the agent has nothing yet
                    return shutdown_response(request, fields)
                fields["shutdown"] = True
                if isinstance(out, GatedStream):
                    out.drop(fields)
                    with contextlib.suppress(Exception):
                        await response.write(
                            error_event(request, "loopguard is shutting down", "proxy_shutdown", 503)
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
            if isinstance(out, GatedStream):
                out.drop(fields)
                stalled = isinstance(exc, READ_TIMEOUT)
                with contextlib.suppress(Exception):
                    await response.write(
                        error_event(
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


class GatedStream:
    """The agent's event stream, written through an :class:`proxy.response.sse.EventGate`: whole
    events only, so that when the upstream breaks mid-event the half event is dropped
    (:meth:`drop`) and the error event reaches the agent's parser on its own."""

    __slots__ = ("gate", "response")

    def __init__(self, response: web.StreamResponse) -> None:
        self.response = response
        self.gate = EventGate()

    @property
    def prepared(self) -> bool:
        return self.response.prepared

    async def prepare(self, request: web.BaseRequest) -> None:
        await self.response.prepare(request)

    async def write(self, data: bytes) -> None:
        now = self.gate.feed(data)
        if now:
            await self.response.write(now)

    async def flush(self) -> None:
        """The stream ended as the upstream ended it: what the gate holds goes out as it is."""
        rest = self.gate.flush()
        if rest:
            await self.response.write(rest)

    def drop(self, fields: dict[str, Any]) -> None:
        """The stream broke: the half event held back is dropped (``dropped_bytes`` in the log)."""
        dropped = self.gate.drop()
        if dropped:
            fields["dropped_bytes"] = dropped


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


def keeper(request: web.Request, decision: RequestDecision | None) -> Any:
    """The response side's ``on_answer`` for this request: the answer goes to the response store,
    kept for this request's credential (None when the store wants nothing of it)."""
    chain = decision.chain if decision is not None else None
    if chain is None or not (chain.keep or chain.lost):
        return None
    store = request.app[RESPONSES_KEY]
    shared = request.app[SHARED_KEY]
    headers = request.headers
    query = request.rel_url.raw_query_string

    def keep(answer: Answer) -> Any:
        key = store_key(headers, answer.response_id, query)
        if store.after_answer(chain, answer, key) and shared.shared:  # written before the agent has it
            return asyncio.ensure_future(shared.keep(key, store.peek(key)))
        return None

    return keep
