"""A non-streaming chat request sent upstream as a stream (``upstream.stream_json_requests``,
:mod:`proxy.response.as_stream`), and its answer assembled back into JSON.

Why: llama-cpp-python stops generating when the agent hangs up only for a *stream*; sent as one,
a JSON request the agent gave up on stops costing the model server too. An upstream that refuses
the stream, or sends an empty one, gets the request once more as it came.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import structlog
from aiohttp import web

from proxy.edge import forward, relay, stopped
from proxy.edge.answers import incomplete_stream_response, shutdown_response, timeout_response
from proxy.edge.keys import CONFIG_KEY, INFLIGHT_KEY, SHUTDOWN_KEY, STATS_KEY, UPSTREAM_KEY
from proxy.edge.wire import wire_of
from proxy.request.rewrite import RequestDecision
from proxy.response import as_stream

log = structlog.get_logger("loopguard")


def stream_body(request: web.Request, decision: RequestDecision) -> bytes | None:
    """The body to send upstream as a stream (``upstream.stream_json_requests``,
    :mod:`proxy.response.as_stream`), or None to send ``decision.body`` as it is. Fails open."""
    app = request.app
    if not app[CONFIG_KEY].upstream.stream_json_requests or wire_of(request) != "chat":
        return None
    if "content-encoding" in request.headers:
        return None
    try:
        return as_stream.stream_request(decision.body, parsed=decision.transcript is not None)
    except Exception as exc:  # fail open: the request goes as the agent sent it
        app[STATS_KEY].internal_errors += 1
        log.error("as_stream_error", error=type(exc).__name__, path=request.path)
        return None


#: Upstream response headers that describe an event stream, not the JSON answer made of it.
_STREAM_HEADERS = ("Content-Type", "Content-Length", "X-Accel-Buffering")


async def relay_streamed(
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
            return timeout_response(base, fields, st)
        if app[SHUTDOWN_KEY].is_set() and upstream not in app[INFLIGHT_KEY]:
            return shutdown_response(request, fields)
        return incomplete_stream_response(fields, st, error)
    status, body = answer
    stop = stopped.enforced_stop(side.actions) if side is not None else None
    if stop is not None and side is not None and side.cfg.stop.deliver == "error":
        fields["status"] = stopped.STATUS
        return stopped.stop_response("chat", stop)
    fields["status"] = status
    for name in _STREAM_HEADERS:
        headers.popall(name, None)
    headers["Content-Type"] = "application/json"
    if stop is not None:
        headers[stopped.STOP_HEADER] = stop.reason or stop.rule
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
            return timeout_response(app[UPSTREAM_KEY][0], fields, app[STATS_KEY])
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
