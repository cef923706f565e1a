"""Credential-free URLs for logs and error messages (user info and query values dropped or marked)."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

#: What :func:`redact_url` writes, with ``marked``, in place of user info and query values.
REDACTED = "<redacted>"


def redact_url(url: str, *, marked: bool = False) -> str:
    """``url`` without user info or query (either may carry a credential), for logs and errors.

    ``marked`` (``check-config``): say what was there instead of dropping it: the user info
    becomes ``<redacted>@`` and each query value ``<redacted>`` (parameter names kept), so
    ``https://u:pw@h/v1?api-key=k`` gives ``https://<redacted>@h/v1?api-key=<redacted>``.
    A value that is not a URL (no host) comes back with only its scheme and path.
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # a port that is not a number, an unclosed [: keep nothing but the scheme
        return f"{urlsplit(url).scheme}://{REDACTED}" if marked else ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{port}" if port else host
    query = ""
    if marked:
        if "@" in parts.netloc:
            netloc = f"{REDACTED}@{netloc}"
        query = "&".join(
            f"{p.split('=', 1)[0]}={REDACTED}" if "=" in p else REDACTED for p in parts.query.split("&") if p
        )
    if not netloc and url.startswith(f"{parts.scheme}://"):  # unix:///path keeps its //
        return f"{parts.scheme}://{parts.path}" + (f"?{query}" if query else "")
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))
