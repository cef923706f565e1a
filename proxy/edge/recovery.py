"""Re-sample and fallback at the edge (``recovery.resample``, ``recovery.fallback``): ask the
upstream again, or a second upstream, when its answer repeats a call whose result this turn had
withheld (the trigger and the bodies: :mod:`proxy.response.resample`).

:func:`recover` runs between the upstream's answer and the response side (:func:`proxy.edge.relay.plan`):

- It acts only when a re-sample is possible for the request: ``resample.attempts`` > 0 or
  ``fallback.url`` set, the request read by the guards with calls withheld in its current turn
  (:func:`proxy.response.resample.withheld_keys`), and a 200 answer the response side can read
  (JSON or an event stream, not compressed). Otherwise the upstream's answer is returned as it
  is and streams as always (byte for byte, as it arrives).
- When possible, the answer is held whole (a stream too: the agent must not get a first answer
  and then a second one; its calls are complete only at its end) and read. When none of its calls
  repeats a withheld one, it goes on to the response side as it came. Else the request is sent
  again, up to ``attempts`` times, each body with ``params`` and the attempt's seed
  (:func:`proxy.response.resample.resample_body`), and the first answer that does not repeat goes
  to the response side instead, its own status, headers and bytes (the agent receives it as the
  upstream sent it). If every attempt repeated and ``fallback.url`` is set, the fallback is
  asked once (its model, its credential, bounded by ``timeout_s``). If still none, the original
  answer goes to the response side and is decided exactly as without recovery (withheld later,
  or stopped).
- Fail open: an attempt that fails (connection error, a status other than 200, a timeout, an
  answer that cannot be read) ends the re-sampling (outcome ``error``; the fallback is still
  asked when set); an error of the fallback leaves the original answer. An error of this module
  itself is logged (no content) and counted in ``internal_errors``; the original answer then goes
  on as it came (or, when it was already read, as the bytes read).
- Counted (:class:`proxy.edge.observe.Stats`): ``resample_requests``, ``resample_recovered``,
  ``fallback_requests``, ``fallback_recovered``, ``extra_upstream_calls`` and per (kind, outcome)
  ``recovery``; each intervention is an action (:class:`proxy.core.actions.Recover`, rule
  ``resample`` or ``fallback``, ``count`` the upstream calls made, ``reason`` the outcome) in the
  request's log line. Never a body or a credential.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from proxy.config import Config
from proxy.core.actions import Recover
from proxy.edge import forward
from proxy.edge.keys import INFLIGHT_KEY, SESSION_KEY, STATS_KEY
from proxy.edge.observe import Stats, action_summary
from proxy.request.rewrite import RequestDecision
from proxy.response import resample as rs

log = structlog.get_logger("loopguard")

#: The answer wires a re-sample reads (``proxy.edge.wire.wire_of``).
WIRES = ("chat", "responses", "messages", "gemini", "gemini_array")


class _Content:
    """The body of a :class:`Held` answer, read as aiohttp's ``StreamReader`` is read by the relay."""

    __slots__ = ("_data", "_error", "_read")

    def __init__(self, data: bytes, error: BaseException | None) -> None:
        self._data = data
        self._error = error
        self._read = False

    async def iter_any(self) -> AsyncIterator[bytes]:
        if not self._read:
            self._read = True
            if self._data:
                yield self._data
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def is_eof(self) -> bool:
        return self._error is None and self._read

    def at_eof(self) -> bool:
        return self.is_eof()

    async def read(self) -> bytes:
        chunks = [c async for c in self.iter_any()]
        return b"".join(chunks)


class Held:
    """An upstream answer read whole, relayed from memory as the upstream's response would be
    (its status, reason, headers and bytes; a read error that ended it is raised after the bytes
    read, as the upstream's stream would have raised it)."""

    __slots__ = ("content", "content_type", "headers", "reason", "status")

    def __init__(
        self, upstream: aiohttp.ClientResponse, data: bytes, error: BaseException | None = None
    ) -> None:
        self.status = upstream.status
        self.reason = upstream.reason
        self.headers: CIMultiDictProxy[str] = upstream.headers
        self.content_type = upstream.content_type
        self.content = _Content(data, error)

    @property
    def content_length(self) -> int | None:
        length = self.headers.get("Content-Length")
        return int(length) if length is not None and length.isdigit() else None

    def close(self) -> None:
        """Nothing to close: the upstream's response was read whole and closed."""


def _readable(upstream: aiohttp.ClientResponse) -> bool:
    enc = upstream.headers.get("Content-Encoding")
    return (
        upstream.status == 200
        and upstream.content_type in ("text/event-stream", "application/json")
        and (enc is None or enc.strip().lower() in ("", "identity"))
    )


def _sse(wire: str, upstream: Any) -> bool:
    """The answer is read as a stream (events, or Gemini's streamed array)."""
    return upstream.content_type == "text/event-stream" or wire == "gemini_array"


def _answer_wire(wire: str, upstream: Any) -> str:
    if wire == "gemini_array" and upstream.content_type == "text/event-stream":
        return "gemini"  # asked for the array, answered with events
    return wire


def possible(wire: str | None, decision: RequestDecision | None, cfg: Config) -> frozenset[rs.Key]:
    """The withheld keys when a re-sample is possible for this request (its wire read, recovery
    on, calls withheld in its turn), else an empty set (no cost: nothing is held)."""
    rec = cfg.recovery
    if not (rec.resample.attempts or rec.fallback.url):
        return frozenset()
    if wire not in WIRES or decision is None or decision.transcript is None:
        return frozenset()
    return rs.withheld_keys(decision.transcript, decision.actions)


async def _read_all(upstream: aiohttp.ClientResponse) -> bytes:
    body = bytearray()
    async for chunk in upstream.content.iter_any():
        body += chunk
    return bytes(body)


def _repeats(wire: str, upstream: Any, data: bytes, keys: frozenset[rs.Key], cfg: Config) -> tuple[bool, str]:
    """(repeats a withheld call, its tool); raises ValueError when the answer cannot be read."""
    calls = rs.answer_calls(_answer_wire(wire, upstream), _sse(wire, upstream), data, cfg)
    if calls is None:
        raise ValueError("unreadable answer")
    call = rs.repeated(calls, keys)
    return call is not None, call.name if call is not None else ""


async def recover(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    url: str,
    headers: CIMultiDict[str],
    body: bytes,
    decision: RequestDecision | None,
    wire: str | None,
    cfg: Config,
    fields: dict[str, Any],
) -> aiohttp.ClientResponse | Held:
    """The answer the response side gets: ``upstream`` itself when no re-sample is possible, else
    a :class:`Held` answer (the first that does not repeat a withheld call, or the original).
    ``url``, ``headers``, ``body``: the request as it was sent upstream. Never raises but for
    cancellation (the agent went away: every upstream response opened here is closed)."""
    app = request.app
    stats = app[STATS_KEY]
    try:
        keys = possible(wire, decision, cfg) if _readable(upstream) else frozenset()
    except Exception as exc:  # fail open: the answer as it comes
        stats.internal_errors += 1
        log.error("recovery_error", error=type(exc).__name__, where="trigger")
        return upstream
    if not keys or wire is None:
        return upstream
    data = b""
    try:
        data = await _read_all(upstream)
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return Held(upstream, data, exc)  # the relay answers the error as it would have
    finally:
        upstream.close()  # read whole (or broken): the connection is done
    try:
        again, tool = _repeats(wire, upstream, data, keys, cfg)
    except ValueError:  # an answer that cannot be read: the response side relays it as it does
        return Held(upstream, data)
    except Exception as exc:
        stats.internal_errors += 1
        log.error("recovery_error", error=type(exc).__name__, where="read")
        return Held(upstream, data)
    if not again:
        return Held(upstream, data)
    chosen = None
    rec = cfg.recovery
    asking = _Asking(request, url, headers, body, wire, cfg, keys, tool, stats, fields)
    try:
        if rec.resample.attempts:
            chosen = await _resample(asking)
        if chosen is None and rec.fallback.url:
            chosen = await _fallback(asking)
    except Exception as exc:  # fail open: the original answer, decided as without recovery
        stats.internal_errors += 1
        log.error("recovery_error", error=type(exc).__name__, where="ask")
        chosen = None
    return chosen if chosen is not None else Held(upstream, data)


@dataclass(frozen=True, slots=True)
class _Asking:
    """What asking again needs of the request: the request itself, its ``url``, ``headers`` and
    ``body`` as sent upstream, its answer ``wire``, the config, the withheld ``keys`` and the
    repeated call's ``tool``; ``stats`` and the log line's ``fields`` to count it in."""

    request: web.Request
    url: str
    headers: CIMultiDict[str]
    body: bytes
    wire: str
    cfg: Config
    keys: frozenset[rs.Key]
    tool: str
    stats: Stats
    fields: dict[str, Any]


async def _ask(
    asking: _Asking,
    url: str,
    headers: CIMultiDict[str],
    body: bytes,
    rule: str,
    timeout: aiohttp.ClientTimeout | None = None,
) -> tuple[str, Held | None]:
    """One extra upstream call for ``rule`` (``resample``, ``fallback``): (outcome, the answer
    when it recovered). A failure is logged (warning ``recovery_upstream_error``: the rule, and the
    status or the error's type; never the URL, which may carry a credential)."""
    app, wire, cfg, keys = asking.request.app, asking.wire, asking.cfg, asking.keys
    kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    try:
        async with app[SESSION_KEY].request(
            asking.request.method,
            URL(url, encoded=True),
            headers=headers,
            data=body,
            allow_redirects=False,
            skip_auto_headers=forward.SKIP_AUTO_HEADERS,
            **kwargs,
        ) as resp:
            app[INFLIGHT_KEY].add(resp)
            try:
                if not _readable(resp):
                    log.warning(
                        "recovery_upstream_error",
                        rule=rule,
                        status=resp.status,
                        content_type=resp.content_type,
                        content_encoding=resp.headers.get("Content-Encoding"),
                    )
                    return rs.ERROR, None
                data = await _read_all(resp)
            finally:
                app[INFLIGHT_KEY].discard(resp)
            again, _ = _repeats(wire, resp, data, keys, cfg)
            return (rs.REPEATED, None) if again else (rs.RECOVERED, Held(resp, data))
    except asyncio.CancelledError:
        raise
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
        log.warning("recovery_upstream_error", rule=rule, error=type(exc).__name__)
        return rs.ERROR, None


async def _resample(asking: _Asking) -> Held | None:
    conf = asking.cfg.recovery.resample
    outcome, chosen, made = rs.REPEATED, None, 0
    for attempt in range(1, conf.attempts + 1):
        seed = rs.seed_for(asking.body, attempt) if conf.new_seed else None
        new = rs.resample_body(asking.wire, asking.body, conf.params, seed)
        if new is None:
            outcome = rs.ERROR
            break
        made += 1
        outcome, chosen = await _ask(asking, asking.url, asking.headers, new, rs.RESAMPLE_RULE)
        if outcome != rs.REPEATED:
            break
    _count(asking, rs.RESAMPLE_RULE, made, conf.attempts, outcome)
    return chosen


async def _fallback(asking: _Asking) -> Held | None:
    conf = asking.cfg.recovery.fallback
    request, wire = asking.request, asking.wire
    outcome, chosen, made = rs.ERROR, None, 0
    sent = _fallback_headers(request, asking.headers, wire, conf.api_key_env)
    new = rs.fallback_body(wire, asking.body, conf.model)
    if sent is not None and new is not None:
        base, auth = forward.split_credentials(conf.url)
        if auth and "Authorization" not in sent:
            sent["Authorization"] = auth
        target = rs.fallback_path(wire, forward.origin_form(request.raw_path), conf.model)
        url = forward.upstream_url(base, target)
        made = 1
        timeout = aiohttp.ClientTimeout(total=conf.timeout_s)
        try:
            outcome, chosen = await asyncio.wait_for(
                _ask(asking, url, sent, new, rs.FALLBACK_RULE, timeout),
                conf.timeout_s,
            )
        except asyncio.TimeoutError:
            log.warning("recovery_upstream_error", rule=rs.FALLBACK_RULE, error="TimeoutError")
            outcome, chosen = rs.ERROR, None
    _count(asking, rs.FALLBACK_RULE, made, 1, outcome)
    return chosen


def _fallback_headers(
    request: web.Request, headers: CIMultiDict[str], wire: str, api_key_env: str
) -> CIMultiDict[str] | None:
    """The headers for the fallback: the agent's as sent upstream, without the main upstream's own
    credential (from its URL's user info); with ``api_key_env``, the wire's credential header
    replaced by that variable's value (None: the variable is unset or empty)."""
    sent = headers.copy()
    if "Authorization" not in request.headers:
        sent.popall("Authorization", None)  # the main upstream's, not the agent's
    if not api_key_env:
        return sent
    value = os.environ.get(api_key_env, "")
    if not value:
        log.warning("recovery_fallback_key_missing", variable=api_key_env)
        return None
    name, prefix = rs.CREDENTIAL[rs.base_wire(wire)]
    for header in ("Authorization", "x-api-key", "x-goog-api-key"):
        sent.popall(header, None)
    sent[name] = prefix + value
    return sent


def _count(asking: _Asking, rule: str, made: int, limit: int, outcome: str) -> None:
    """Count one intervention and log it as an action in the request's line."""
    with contextlib.suppress(Exception):
        asking.stats.record_recovery(rule, outcome, made)
        action = Recover(rule=rule, tool=asking.tool, count=made, limit=limit, reason=outcome)
        asking.stats.record_actions([action])
        asking.fields.setdefault("actions", []).append(action_summary(action))
