"""Upstream I/O: URL mapping, header filtering, and relaying responses chunk by chunk.

- ``/v1/<rest>`` goes to ``<upstream base>/<rest>``; any other path to the upstream's origin with
  the same path; the query string is kept as sent (DESIGN §3).
- Hop-by-hop headers (RFC 9110 §7.6.1, plus any named in ``Connection``) are dropped both ways;
  everything else, ``Authorization`` included, passes untouched.
- Bodies are relayed as bytes: the upstream session does not decompress, and adds no
  ``Accept-Encoding``/``User-Agent``/``Accept``/``Content-Type`` the agent did not send.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from urllib.parse import unquote, urlsplit, urlunsplit

from multidict import CIMultiDict

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)

#: Headers aiohttp's client would add on its own; skipped so the upstream sees only the agent's.
SKIP_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")


def upstream_url(base: str, raw_path: str) -> str:
    """Map an incoming raw path (with query) onto the upstream base URL.

    >>> upstream_url("http://h:8080/v1", "/v1/chat/completions?x=1")
    'http://h:8080/v1/chat/completions?x=1'
    >>> upstream_url("http://h:8080/api/v1/", "/health")
    'http://h:8080/health'
    """
    path, _, query = raw_path.partition("?")
    parts = urlsplit(base)
    if path == "/v1" or path.startswith("/v1/"):
        path = parts.path.rstrip("/") + path[3:]
    return urlunsplit((parts.scheme, parts.netloc, path, query, ""))


def filter_headers(headers: Iterable[tuple[str, str]], drop: Iterable[str] = ()) -> CIMultiDict[str]:
    """Copy headers (duplicates and order kept) minus hop-by-hop ones, those listed in a
    ``Connection`` header, and ``drop`` (case-insensitive)."""
    items = list(headers)
    dropped = set(HOP_BY_HOP) | {d.lower() for d in drop}
    for k, v in items:
        if k.lower() == "connection":
            dropped |= {t.strip().lower() for t in v.split(",") if t.strip()}
    return CIMultiDict((k, v) for k, v in items if k.lower() not in dropped)


def redact_url(url: str) -> str:
    """``url`` without user info or query (either may carry a credential), for logs and errors."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def split_credentials(url: str) -> tuple[str, str | None]:
    """Split user info out of an upstream URL: ``http://u:p@h/v1`` → (``http://h/v1``, the Basic
    ``Authorization`` value). The value is sent only when the agent sends no ``Authorization`` of
    its own (aiohttp refuses both at once)."""
    parts = urlsplit(url)
    if parts.username is None:
        return url, None
    netloc = parts.hostname or ""
    if ":" in netloc:
        netloc = f"[{netloc}]"
    if parts.port:
        netloc = f"{netloc}:{parts.port}"
    userinfo = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
    auth = "Basic " + base64.b64encode(userinfo).decode("ascii")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment)), auth
