"""Where a request goes upstream and with which headers: URL mapping and header filtering.

- ``/v1/<rest>`` goes to ``<upstream base>/<rest>``; any other path to the upstream's origin with
  the same path; the target's path and query go as sent (DESIGN §3): dot segments, escapes and
  doubled slashes are the upstream's to read, not resolved or re-quoted on the way. A query on
  the upstream base URL itself (Azure's ``…/deployments/d?api-version=2024-02-01``) goes with
  every request: its parameters first, then the request's query as sent; a parameter the
  request names itself is the request's (the agent's choice wins, as it would talking to the
  upstream directly).
- Hop-by-hop headers (RFC 9110 §7.6.1, plus any named in ``Connection``) are dropped both ways;
  everything else, ``Authorization`` included, passes untouched.
- Bodies are relayed as bytes: the upstream session does not decompress, and adds no
  ``Accept-Encoding``/``User-Agent``/``Accept``/``Content-Type`` the agent did not send.
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Iterable
from urllib.parse import unquote, urlsplit, urlunsplit

from multidict import CIMultiDict
from yarl import URL

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

#: The longest request line and header line accepted, both ways (bytes): aiohttp's 8,190 turned
#: long ``Authorization`` tokens and cookies that upstreams accept into 400s.
HEADER_LIMIT = 64 * 1024


@functools.lru_cache(maxsize=8)
def _base_parts(base: str) -> tuple[str, str, str, tuple[tuple[str, str], ...]]:
    # the configured base in its encoded form (an IDN host in punycode, a space as %20): the
    # URL built from it goes out as built (no re-quoting, so the agent's target stays as sent)
    parts = urlsplit(str(URL(base)))
    params = tuple((_name(raw), raw) for raw in parts.query.split("&") if raw)
    return parts.scheme, parts.netloc, parts.path.rstrip("/"), params


def _name(param: str) -> str:
    """The decoded name of one ``name=value`` query parameter."""
    return unquote(param.split("=", 1)[0])


def _merged_query(base: tuple[tuple[str, str], ...], query: str) -> str:
    """The base URL's parameters (as written) the request does not name, then ``query`` as sent."""
    if not base:
        return query
    named = {_name(p) for p in query.split("&") if p}
    kept = "&".join(raw for name, raw in base if name not in named)
    return f"{kept}&{query}" if kept and query else kept or query


def origin_form(target: str) -> str:
    """The path and query of a request target as the upstream gets it (RFC 9112 §3.2): an
    origin-form target (``/…``) exactly as sent, its slashes included (``//health`` stays
    ``//health``: a doubled slash is the agent's, and the upstream's to answer); an
    absolute-form one (``http://host/path?q``, what a client sends to a proxy it was told is an
    HTTP proxy) reduced to its path and query (``/`` for none).

    >>> origin_form("//health")
    '//health'
    >>> origin_form("http://x//health?a=1")
    '//health?a=1'
    """
    if target.startswith("/") or "://" not in target:
        return target
    parts = urlsplit(target)
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def upstream_url(base: str, raw_path: str) -> str:
    """Map an incoming raw path (with query) onto the upstream base URL.

    >>> upstream_url("http://h:8080/v1", "/v1/chat/completions?x=1")
    'http://h:8080/v1/chat/completions?x=1'
    >>> upstream_url("http://h:8080/api/v1/", "/health")
    'http://h:8080/health'
    >>> upstream_url("http://h/openai/deployments/d?api-version=2024-02-01", "/v1/chat/completions")
    'http://h/openai/deployments/d/chat/completions?api-version=2024-02-01'
    """
    path, _, query = raw_path.partition("?")
    scheme, netloc, base_path, base_query = _base_parts(base)
    if path == "/v1" or path.startswith("/v1/"):
        path = base_path + path[3:]
    return urlunsplit((scheme, netloc, path, _merged_query(base_query, query), ""))


#: What a request to the upstream never carries: hop-by-hop headers plus Host and Content-Length
#: (aiohttp sets both for the upstream), and Expect: the proxy answers an agent's
#: ``Expect: 100-continue`` itself (aiohttp's server sends the 100 when the body is read), and an
#: upstream that never sends 100 would otherwise wait for a body the proxy holds back.
REQUEST_DROP = HOP_BY_HOP | {"host", "content-length", "expect"}


def filter_headers(headers: Iterable[tuple[str, str]], drop: frozenset[str] = HOP_BY_HOP) -> CIMultiDict[str]:
    """Copy headers (duplicates and order kept) minus ``drop`` (lower-case names; default the
    hop-by-hop ones) and any named in a ``Connection`` header, case-insensitive."""
    items = [(k, v, k.lower()) for k, v in headers]
    for _, v, low in items:
        if low == "connection":
            drop = drop | {t.strip().lower() for t in v.split(",") if t.strip()}
    return CIMultiDict([(k, v) for k, v, low in items if low not in drop])


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
