"""The answers loopguard gives itself instead of the upstream's: upstream unreachable (502), silent
(504) or cut short (502, or a stream's error event), a request body that stalled (408) or is too
large (413), a shutdown (503). Each body is in the wire's own error form (:func:`error_json`,
:func:`error_event`), so the agent's SDK raises it as an API error; each fills the request's log
fields (``status``, ``upstream_error``, ``shutdown``) and counts what it must.
"""

from __future__ import annotations

from typing import Any

import orjson
import structlog
from aiohttp import web

from proxy.config.redact import redact_url
from proxy.edge.connections import error_body
from proxy.edge.keys import CONFIG_KEY
from proxy.edge.wire import wire_of

log = structlog.get_logger("loopguard")


def error_json(request: web.Request | None, message: str, type_: str, code: int) -> bytes:
    """The JSON body of an error loopguard answers itself: Anthropic's form (``{"type": "error",
    "error": {"type", "message"}}``) on a guarded Messages path, which the anthropic SDK and Claude
    Code read, else the OpenAI form (:func:`proxy.edge.connections.error_body`)."""
    if request is not None and wire_of(request) == "messages":
        return orjson.dumps({"type": "error", "error": {"type": type_, "message": message}})
    return error_body(message, type_, code)


def error_event(request: web.Request, message: str, type_: str, code: int) -> bytes:
    """The SSE event that ends a broken stream: ``data: {"error": …}`` for chat completions, an
    ``error`` event (``{"type": "error", "code", "message", "param"}``) for the Responses API, an
    ``error`` event (``{"type": "error", "error": {"type", "message"}}``, Anthropic's form, which
    its SDK raises as an API error) for Messages."""
    wire = wire_of(request)
    if wire == "responses":
        obj: dict[str, Any] = {"type": "error", "code": type_, "message": message, "param": None}
        return b"event: error\ndata: " + orjson.dumps(obj) + b"\n\n"
    if wire == "messages":
        obj = {"type": "error", "error": {"type": type_, "message": message}}
        return b"event: error\ndata: " + orjson.dumps(obj) + b"\n\n"
    return b"data: " + error_body(message, type_, code) + b"\n\n"


def timeout_response(
    base: str, fields: dict[str, Any], st: Any, request: web.Request | None = None
) -> web.Response:
    """504 for an upstream that stopped sending (before its headers, or in a JSON answer the
    proxy was still buffering): an error body in the wire's form (:func:`error_json`), so the
    agent's SDK raises it instead of waiting on a silent upstream."""
    st.upstream_errors += 1
    fields.update(status=504, upstream_error="UpstreamTimeout")
    return web.Response(
        status=504,
        body=error_json(
            request,
            f"loopguard: upstream {redact_url(base)} sent nothing for longer than upstream.read_timeout_s",
            "upstream_timeout",
            504,
        ),
        content_type="application/json",
    )


def body_timeout_response(request: web.Request, received: int) -> web.Response:
    """408 for an agent whose request body stalled for ``listen.body_timeout_s`` (a stalled
    client must not hold a connection slot forever): nothing was sent upstream; the connection
    is closed after this answer."""
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
        body=error_body(
            f"loopguard: the request body stalled: nothing received for {timeout_s:g} s "
            "(listen.body_timeout_s)",
            "request_timeout",
            408,
        ),
        content_type="application/json",
    )
    response.force_close()
    return response


def too_large_response(request: web.Request) -> web.Response:
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
        body=error_json(
            request,
            f"loopguard: request body over {limit:g} MiB (upstream.max_body_mb)",
            "request_too_large",
            413,
        ),
        content_type="application/json",
    )


def shutdown_response(request: web.Request, fields: dict[str, Any]) -> web.Response:
    """503 for a request the shutdown ended before the agent had any of its answer (an error
    body in the wire's form, :func:`error_json`); the connection closes after it."""
    fields.update(status=503, shutdown=True)
    response = web.Response(
        status=503,
        body=error_json(request, "loopguard is shutting down", "proxy_shutdown", 503),
        content_type="application/json",
    )
    response.force_close()
    return response


def unreachable_response(
    base: str, fields: dict[str, Any], st: Any, request: web.Request, exc: BaseException
) -> web.Response:
    """502 for an upstream that could not be reached, or failed before its headers (an error
    body in the wire's form, :func:`error_json`)."""
    st.upstream_errors += 1
    fields.update(status=502, upstream_error=type(exc).__name__)
    return web.Response(
        status=502,
        body=error_json(
            request,
            f"loopguard: upstream {redact_url(base)} unreachable ({type(exc).__name__})",
            "upstream_unreachable",
            502,
        ),
        content_type="application/json",
    )


def incomplete_stream_response(fields: dict[str, Any], st: Any, error: BaseException | None) -> web.Response:
    """502 for a stream sent upstream for a JSON request (``upstream.stream_json_requests``) that
    ended before its answer was whole: the agent asked for JSON, so the error is JSON too."""
    st.upstream_errors += 1
    fields.update(status=502, upstream_error=type(error).__name__ if error else "IncompleteStream")
    return web.Response(
        status=502,
        body=error_body(
            "loopguard: upstream closed the stream before it finished", "upstream_disconnected", 502
        ),
        content_type="application/json",
    )
