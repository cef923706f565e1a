"""The proxy's own routes under ``/loop-guard`` (:data:`ADMIN_ROUTES`): stats (``GET /loop-guard``;
with ``?conversation=KEY`` that conversation's turn-guard ledger, :mod:`proxy.request.memory`),
health, Prometheus metrics and the config reload.

Access: with ``admin_token`` set every route wants ``Authorization: Bearer <token>`` (401
otherwise); without it the routes that show or change what conversations did
(:data:`LOOPBACK_ONLY`) answer loopback peers only (403 to others). Anything else under
``/loop-guard``, in any spelling a server could read as it (:func:`normalised`), is a 404 or 405
(:func:`own_miss`): never forwarded, it would carry the admin token upstream.
"""

from __future__ import annotations

import contextlib
import ipaddress
from urllib.parse import unquote

import orjson
from aiohttp import web

from proxy.edge import forward
from proxy.edge.connections import error_body
from proxy.edge.keys import (
    LIVE_KEY,
    METRICS_KEY,
    PREFIX_KEY,
    RESPONSES_KEY,
    SHARED_KEY,
    STATS_KEY,
    runtime_of,
)
from proxy.edge.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from proxy.edge.runtime import reload_logged
from proxy.request.conversation import key_digest
from proxy.request.prefix_cache import PrefixCache
from proxy.request.shared import newer

#: The proxy's own routes (path → the methods each answers): everything else under
#: ``/loop-guard`` is answered 404 or 405 by the proxy, never forwarded (:func:`own_miss`).
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
    token = runtime_of(request).cfg.admin_token
    if token and request.headers.get("Authorization", "") != f"Bearer {token}":
        raise web.HTTPUnauthorized(
            text=error_body("missing or wrong admin token", "unauthorized", 401).decode(),
            content_type="application/json",
        )
    if not token and request.path in LOOPBACK_ONLY and not _loopback(request):
        message = "loopguard: without admin_token this route answers loopback clients only; set admin_token"
        raise web.HTTPForbidden(
            text=error_body(message, "forbidden", 403).decode(), content_type="application/json"
        )


#: What :func:`normalised` trims from both ends of a path segment: whitespace and controls.
_TRIM = "".join(map(chr, range(0x21))) + "\x7f"


def normalised(target: str) -> str:
    """The path of a request target as the most lenient server might read it, to decide what is
    the proxy's (:func:`own_miss`): percent-escapes decoded (until none is left, at most three
    rounds: ``%252e`` too), backslashes as slashes, lower case, each segment cut at ``;`` (path
    parameters) and trimmed of whitespace and controls, empty and ``.`` segments dropped, ``..``
    resolved (RFC 3986 §5.2.4). The query is not part of it.

    >>> normalised("/v1/../Loop-Guard%20%5Cmetrics?x=1")
    '/loop-guard/metrics'
    >>> normalised("/%2e/loop-guard/./")
    '/loop-guard'
    """
    path = target.partition("?")[0].partition("#")[0]
    for _ in range(3):
        decoded = unquote(path)
        if decoded == path:
            break
        path = decoded
    segments: list[str] = []
    for segment in path.replace("\\", "/").lower().split("/"):
        segment = segment.partition(";")[0].strip(_TRIM)
        if segment == "..":
            if segments:
                segments.pop()
        elif segment and segment != ".":
            segments.append(segment)
    return "/" + "/".join(segments)


def own_miss(request: web.Request) -> web.Response | None:
    """The answer to a request for the proxy's own paths that no route took: 405 with ``Allow``
    for a route's path with another method, else 404; None for a path that is not the proxy's.
    What is the proxy's is decided on the :func:`normalised` target, so a trailing slash, a typo,
    a doubled slash, dot segments (``/./loop-guard/metrics``, ``/v1/../loop-guard/metrics``), another
    case (``/Loop-Guard``), a backslash or a percent-escape (``/loop-guard%20/metrics``) are the
    proxy's too. Such a request is never forwarded: it carries the admin token, which the
    upstream must not see, and an upstream that resolves the target would answer it at
    ``/loop-guard``."""
    target = request.raw_path
    if "%" not in target and "loop-guard" not in target.lower():
        return None  # no spelling of the proxy's paths: the common case, decided at once
    own = normalised(forward.origin_form(target))
    if own != "/loop-guard" and not own.startswith("/loop-guard/"):
        return None
    path = request.path
    allowed = ADMIN_ROUTES.get(path)
    if allowed is not None and request.method not in allowed:
        return web.Response(
            status=405,
            body=error_body(f"loopguard: {path} answers {', '.join(allowed)}", "method_not_allowed", 405),
            content_type="application/json",
            headers={"Allow": ", ".join(allowed)},
        )
    return web.Response(
        status=404,
        body=error_body(f"loopguard: no route {path}", "not_found", 404),
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
    if "conversation" in request.query:  # one conversation's turn-guard ledger (DESIGN §6.3)
        key = key_digest(request.query["conversation"])  # the tables hold digests only
        memory = runtime_of(request).memory
        remote = await request.app[SHARED_KEY].fetch_state(key)
        if remote is not None:  # another replica's newer request
            with contextlib.suppress(Exception):
                if newer(memory.store.get(key, memory.clock()), remote):
                    memory.store.put(key, remote)
        view = memory.view(key, memory.clock())
        if view is None:
            message = (
                f"no turn_guard ledger for conversation {key} (unknown, expired, or turn_guard off; "
                "a fingerprinted conversation's first request, before its first tool call, is logged "
                "under the key its later lines name opened_as: ask for their conversation key)"
            )
            return web.Response(
                status=404, body=error_body(message, "not_found", 404), content_type="application/json"
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


async def reload_handler(request: web.Request) -> web.Response:
    """``POST /loop-guard/reload`` (admin token): 200 ``{"status": "reloaded"}``, or 400 with an
    OpenAI-style error whose message names the key."""
    _check_admin(request)
    error = await reload_logged(request.app[LIVE_KEY], "http")
    if error is not None:
        return web.Response(
            status=400,
            body=error_body(f"loopguard: config not reloaded: {error}", "invalid_config", 400),
            content_type="application/json",
        )
    return web.json_response({"status": "reloaded"})
