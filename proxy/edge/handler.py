"""The forwarding handler: every request no route of the proxy's own takes, top to bottom.

:func:`proxy_handler` → read the body (:mod:`proxy.edge.connections`: its timeout, the size limit)
→ decide (:func:`_decide`: the request side, :func:`proxy.request.rewrite.decide_request`, with the
state it asks for fetched first and written after) → the log line's fields → send upstream and
relay the answer (:func:`proxy.edge.upstream.send_and_relay`) → the log line, then the capture
line (:mod:`proxy.edge.capture`).

- Only ``POST`` bodies on a dialect's path are read by the guards (:func:`proxy.edge.wire.dialect_of`);
  every header and the query string go upstream as they came (hop-by-hop ones aside) and are
  never logged (the log line has ``request.path``).
- Fail open: any exception inside the guards is logged (no content) and counted, and the
  original bytes are forwarded.
- Agent disconnect cancels the handler (``handler_cancellation``) and closes the upstream request
  at once (logged ``disconnected: true``, counted in ``disconnects``).
- An unknown Responses ``previous_response_id`` is counted in ``unguarded`` and logged once per
  chain (``unknown_previous_response``).
- Incidents of a request (the circuit breaker's ``duplicate``/``cap`` denials and a ``stop``) are
  recorded right after its decision (:mod:`proxy.edge.incidents`).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import Any

import structlog
from aiohttp import web
from aiohttp.web_urldispatcher import _default_expect_handler  # what every route uses unless told

from proxy import dialects
from proxy.core.volatile import compile_masks
from proxy.dialects import gemini, jsonbody, openai_responses
from proxy.edge import capture, connections, forward
from proxy.edge.admin import own_miss
from proxy.edge.answers import body_timeout_response, shutdown_response, too_large_response
from proxy.edge.keys import (
    CAPTURE_KEY,
    CONFIG_KEY,
    DECIDED_MS,
    DELIVERED,
    INCIDENTS_KEY,
    METRICS_KEY,
    OPEN_KEY,
    PREFIX_KEY,
    RESPONSES_KEY,
    SHARED_KEY,
    SHUTDOWN_KEY,
    STATS_KEY,
    UPSTREAM_ANSWER,
    UPSTREAM_KEY,
    runtime_of,
)
from proxy.edge.observe import action_summary
from proxy.edge.shutdown import body_before_grace_over
from proxy.edge.streamed import stream_body
from proxy.edge.upstream import send_and_relay
from proxy.edge.wire import dialect_of, wire_of
from proxy.request import plain
from proxy.request.conversation import key_digest
from proxy.request.response_store import UNKNOWN_PREVIOUS, store_key
from proxy.request.rewrite import RequestDecision, decide_plain, decide_request

log = structlog.get_logger("loopguard")


async def proxy_handler(request: web.Request) -> web.StreamResponse:
    """Every request no route of the proxy's own takes: forwarded (module doc)."""
    own = own_miss(request)
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


async def expect_handler(request: web.Request) -> web.StreamResponse | None:
    """The forwarding route's ``Expect`` handler: a body its ``Content-Length`` says is over
    ``upstream.max_body_mb`` gets the 413 at once instead of ``100 Continue`` (RFC 9110
    §10.1.1: a server may answer with a final status instead; the client then never sends the
    body). Anything else as aiohttp does (``100 Continue``, or 417 for another expectation)."""
    if _declared_too_large(request) and own_miss(request) is None:
        request.app[STATS_KEY].requests += 1  # the handler, which counts requests, does not run
        return too_large_response(request)
    return await _default_expect_handler(request)


async def _proxy(request: web.Request) -> web.StreamResponse:
    """Read, decide, forward and log one request (the module doc's path)."""
    app = request.app
    rt = runtime_of(request)  # this request's config and guards, whatever a reload does meanwhile
    st = app[STATS_KEY]
    st.requests += 1
    if _declared_too_large(request):  # said by Content-Length: no need to read it first
        return too_large_response(request)
    # listen.* is restart-only: the start's config holds it, not the reloadable runtime
    read = functools.partial(connections.read_body, request, app[CONFIG_KEY].listen.body_timeout_s)
    try:
        # a body still coming is read until the shutdown's grace ends (then a 503, not a cut)
        raw = await read() if request.content.is_eof() else await body_before_grace_over(app, read)
    except connections.BodyTimeout as exc:
        return body_timeout_response(request, exc.received)
    except web.HTTPRequestEntityTooLarge:
        return too_large_response(request)
    if raw is None:  # the grace ended while the agent was still sending its body
        ended: dict[str, Any] = {"method": request.method, "path": request.path}
        response = shutdown_response(request, ended)
        log.warning("request", **ended, body_incomplete=True)
        return response
    t_start = time.perf_counter()

    decision = RequestDecision(raw, (), False)
    # With every request-side guard off (and nothing to fold) there is nothing to decide: the
    # body is not even parsed.
    dialect = dialect_of(request) if rt.guards or rt.collapse is not None else None
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
    streamed = stream_body(request, decision)
    fields = {
        "method": request.method,
        "path": request.path,
        "conversation": decision.conversation or None,
        **({"opened_as": decision.opened_as} if decision.opened_as else {}),
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
        return await send_and_relay(request, url, headers, decision.body, fields, t_send, decision, streamed)
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


def _header_key(headers: Any, names: tuple[str, ...]) -> str | None:
    """The conversation key when a ``conversation_key`` header gives it (DESIGN §4's first rule:
    known before the body is read; its digest, as the decision's), else None."""
    value = next((headers[n] for n in names if headers.get(n)), None)
    return key_digest(value) if value is not None else None


async def _decide(request: web.Request, raw: bytes, dialect: dialects.Dialect) -> RequestDecision:
    """The request side's decision on ``raw`` under this request's :class:`Runtime`, with the
    state it reads fetched first and written after (:mod:`proxy.edge.shared_state`); the body
    unchanged and nothing decided when the guards fail (fail open)."""
    app = request.app
    rt = runtime_of(request)
    memory = rt.memory
    store = app[RESPONSES_KEY]
    shared = app[SHARED_KEY]
    now_ms = memory.clock()
    request[DECIDED_MS] = now_ms  # the capture records the time the guards decided at

    def run(state_for: Any, previous: Any) -> RequestDecision:
        if previous is not None:  # the store holds this credential's responses only (store_key)
            previous = functools.partial(_scoped, previous, request)
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
            collapse=rt.collapse,
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


def _store_key(request: web.Request, rid: str) -> str:
    """Response ``rid`` as kept for the credential of ``request`` (its headers and raw query:
    :func:`proxy.request.response_store.store_key`)."""
    return store_key(request.headers, rid, request.rel_url.raw_query_string)


def _scoped(lookup: Callable[[str], Any], request: web.Request, rid: str) -> Any:
    """``lookup`` of response ``rid`` as kept for the credential of ``request``."""
    return lookup(_store_key(request, rid))


def _unknown_previous(request: web.Request, decision: RequestDecision) -> None:
    """Log a ``previous_response_id`` the store does not hold, once per chain (fails open)."""
    app = request.app
    assert decision.chain is not None and decision.chain.previous is not None
    try:
        first = app[RESPONSES_KEY].note_unknown(_store_key(request, decision.chain.previous))
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


def _record_incidents(app: web.Application, decision: RequestDecision) -> None:
    """Incidents (DESIGN §6.2; :func:`proxy.edge.incidents.incident_kind`): the fresh first-of-kind
    denials and stops of this request go to the stats and the incident log (written in the
    background). Fails open like the guards."""
    try:
        incidents = app[INCIDENTS_KEY].record(
            decision.actions, decision.conversation, now_ms=int(time.time() * 1000)
        )
    except Exception as exc:
        app[STATS_KEY].internal_errors += 1
        log.error("incident_error", error=type(exc).__name__)
        return
    app[STATS_KEY].record_incidents(incidents)


def _capture(request: web.Request, raw: bytes, decision: RequestDecision) -> None:
    """One capture line for a guarded request (:mod:`proxy.edge.capture`); fails open."""
    app = request.app
    cfg = runtime_of(request).cfg
    if dialect_of(request) is gemini:
        return  # capture and replay read chat, Responses and Messages histories
    try:
        upstream_answer = request.get(UPSTREAM_ANSWER)
        data = capture.line(
            time_ms=request.get(DECIDED_MS) or runtime_of(request).memory.clock(),
            conversation=decision.conversation,
            dialect=wire_of(request) or "chat",
            body=jsonbody.decode(raw),
            answer=capture.answer_of(upstream_answer) if upstream_answer else None,
            contents=cfg.capture.contents,
            masks=compile_masks(cfg.progress.masks),
        )
        app[CAPTURE_KEY].write(data)
    except Exception as exc:
        app[STATS_KEY].internal_errors += 1
        log.error("capture_error", error=type(exc).__name__)
