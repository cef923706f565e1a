"""The response side at the edge (aiohttp): relay a chat-completion, Responses, Messages or Gemini
answer through the guards (:mod:`proxy.response.stream_guard` / :mod:`proxy.response.decide` for
chat, :mod:`proxy.response.responses_stream` for the Responses API,
:mod:`proxy.response.messages_stream` for Anthropic Messages, :mod:`proxy.response.gemini_stream`
for the Gemini API).

Which responses are read (:func:`plan`): answers to ``POST …/chat/completions``,
``POST …/responses``, ``POST …/messages`` and Gemini's ``…:generateContent`` /
``…:streamGenerateContent`` (SSE with ``alt=sse``, else one JSON array that streams, read element
by element as it arrives: ``gemini_array``) with status 200,
``Content-Type`` ``text/event-stream`` (SSE) or ``application/json``, and no ``Content-Encoding``
(``identity`` aside). So that answers come readable, the agent's ``Accept-Encoding`` on those
requests goes upstream as ``identity`` while the response side is on (:func:`reads`; no header is
added when the agent sent none): the openai and anthropic SDKs send ``gzip, deflate`` by default,
and a compressing upstream's answer would pass unread. An answer compressed anyway passes
through untouched and unread (decompressing and re-encoding it would cost more than it is worth);
that answer, and every other one the response side was to read and could not, is counted in
``unguarded_responses{reason}`` and named in the request's log line (``unguarded_response``):
:data:`UNREAD_REASONS`. Everything else is plain passthrough.

- SSE (:func:`relay_sse`): each upstream read goes through the wire's stream guard
  (:class:`proxy.response.stream_guard.StreamGuard` for chat, ``ResponsesStreamGuard``,
  ``MessagesStreamGuard``) and what it returns is written at once. On ``abort`` (runaway or
  degenerate cut) the upstream response is closed before the final bytes are written, so the
  server stops generating.
- JSON (:func:`relay_json`): the body is buffered, decided (:func:`proxy.response.decide.decide_json`)
  and then written, rewritten or as the original bytes.
- Responses answers also tell the response store what the agent got
  (:mod:`proxy.request.response_store`): ``ResponseSide.on_answer`` is called with the
  :class:`proxy.request.response_store.Answer` as soon as it is known, *before* the bytes that end the
  answer are written (so the agent's next request, which may name its id, always finds it kept).
  When the response side reads nothing (its checks all off, a ``gzip``/``deflate`` body) and the
  store wants the answer, the bytes pass through unchanged while
  :class:`proxy.response.responses_stream.ResponseCapture` reads them (kind ``observe``).
- A non-streaming request sent upstream as a stream (``upstream.stream_json_requests``,
  :mod:`proxy.response.as_stream`; :func:`relay_as_json`): the SSE answer goes through the same
  :class:`StreamGuard` (so runaway and degenerate cuts close the upstream at once), and what it
  lets through is assembled into the one JSON answer the agent asked for.
- Chat answers to requests that offered ``tools`` carry the request's repair of calls written as
  text (:mod:`proxy.response.repair`, ``response.repair_text_tool_calls``) into both paths.
- Fail open: an exception in the response-side logic is logged (no content) and counted in
  ``internal_errors``; the bytes received and not yet forwarded are forwarded unchanged and the
  rest of the response is relayed as is.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import structlog
from aiohttp import web

from proxy.config import Config
from proxy.core.actions import Action, Stop
from proxy.edge.incidents import STOP_KIND, IncidentLog
from proxy.edge.observe import Stats, action_summary
from proxy.edge.stopped import STOP_HEADER, enforced_stop, stop_event, stop_response
from proxy.guards import Context, Guard
from proxy.request.response_store import Answer, Chain
from proxy.request.rewrite import RequestDecision
from proxy.response import gemini_stream, messages_stream, repair
from proxy.response import responses_stream as responses_answer
from proxy.response.as_stream import Assembly
from proxy.response.decide import (
    StopJudge,
    cuts_enabled,
    decide_json,
    deciders,
    earlier_stops,
    observed_actions,
)
from proxy.response.gemini_stream import GeminiArrayGuard, GeminiStreamGuard
from proxy.response.messages_stream import MessagesStreamGuard
from proxy.response.repair import Repairer
from proxy.response.responses_stream import ResponseCapture, ResponsesStreamGuard
from proxy.response.stream_guard import FramedGuard, StreamGuard

log = structlog.get_logger("loopguard")

#: Why an answer the response side was to read went out unread (``ResponseSide.unread``):
#: compressed although asked not to be; a 200 answer neither SSE nor JSON; an event past
#: :data:`proxy.response.stream_guard.MAX_EVENT_BYTES` (the rest of the stream relayed unread); the
#: response side failed and failed open; a Gemini answer with several candidates or one other than
#: the first (which one the agent acts on is not known; :data:`proxy.response.gemini_stream.CANDIDATES`).
CONTENT_ENCODING = "content_encoding"
CONTENT_TYPE = "content_type"
TOO_LARGE = "too_large"
INTERNAL_ERROR = "internal_error"
CANDIDATES = gemini_stream.CANDIDATES
UNREAD_REASONS = (CONTENT_ENCODING, CONTENT_TYPE, TOO_LARGE, INTERNAL_ERROR, CANDIDATES)


class Writer(Protocol):
    """Where a relayed body goes: the agent's response, or a gate in front of it
    (:class:`proxy.edge.upstream.GatedStream`)."""

    async def write(self, data: bytes) -> None: ...


class StreamWriter(Writer, Protocol):
    """A :class:`Writer` that is prepared (its status and headers sent) on demand: an answer held
    whole (``stop.deliver: error``) sends its headers only when its bytes go out."""

    @property
    def prepared(self) -> bool: ...

    async def prepare(self, request: web.BaseRequest) -> Any: ...


@dataclass
class ResponseSide:
    """What the response side needs for one request, and the actions it took."""

    kind: str  # "sse" | "json" | "observe" (read for the store only, relayed unchanged)
    cfg: Config
    judge: StopJudge | None
    #: the answer's wire: ``chat`` (chat completions), ``responses`` (the Responses API),
    #: ``messages`` (Anthropic Messages) or ``gemini`` (the Gemini API)
    wire: str = "chat"
    actions: list[Action] = field(default_factory=list)
    #: the agent has the whole answer (the stream said how it ended): an agent that hangs up now
    #: is done, not gone
    delivered: bool = False
    #: called once with the answer the agent gets, before its last bytes are written (Responses);
    #: what it returns, when awaitable (the shared store's write), is awaited by :meth:`settle`
    on_answer: Callable[[Answer], Awaitable[None] | None] | None = None
    #: what ``observe`` reads with
    capture: ResponseCapture | None = None
    pending: Awaitable[None] | None = None
    #: calls written as text are repaired (chat answers to requests that offered tools)
    repair: Repairer | None = None
    #: the observed part of the response side, reading the same bytes, changing none
    shadow: Shadow | None = None
    #: the upstream's answer for the capture (``capture.path``, chat only): SSE assembled, JSON whole
    tap: Assembly | bytearray | None = None
    #: why the answer (or its rest) went out unread (:data:`UNREAD_REASONS`), None: it was read
    unread: str | None = None
    #: ``stop.deliver: error`` and this answer could be stopped (:attr:`StopJudge.possible`): an
    #: SSE answer is held, headers included, until decided, so a stop can be the HTTP error
    hold: bool = False

    def read(self, chunk: bytes, stats: Stats) -> None:
        """Upstream bytes, as they came, for the shadow and the capture tap (never raises)."""
        if self.shadow is not None:
            self.shadow.feed(chunk, stats)
        if self.tap is not None:
            try:
                if isinstance(self.tap, bytearray):
                    self.tap += chunk
                else:
                    self.tap.feed(chunk)
            except Exception as exc:
                failed(stats, "tap", exc)
                self.tap = None

    def upstream_answer(self) -> bytes | None:
        """The upstream's ``chat.completion`` as read by the tap (None: not read, or incomplete)."""
        tap, self.tap = self.tap, None
        if isinstance(tap, bytearray):
            return bytes(tap)
        if tap is None:
            return None
        tap.finish()
        answer = tap.answer()
        return answer[1] if answer is not None and answer[0] == 200 else None

    def observed(self, stats: Stats) -> None:
        """Add the shadow's actions, marked observed (a shadow stop only when no stop was
        applied: one answer is stopped once). Fails open."""
        shadow, self.shadow = self.shadow, None
        if shadow is not None:
            self.actions.extend(observed_actions(self.actions, shadow.finish(stats)))

    def answered(self, answer: Answer | None, stats: Stats) -> None:
        """Hand ``answer`` to ``on_answer`` once (fails open)."""
        callback, self.on_answer = self.on_answer, None
        if callback is None or answer is None:
            self.on_answer = callback
            return
        try:
            self.pending = callback(answer)
        except Exception as exc:
            failed(stats, "store", exc)

    async def settle(self) -> None:
        """Await what ``on_answer`` started (the answer's write to the shared store, bounded by
        ``state.timeout_ms`` and failing open), so it is done before the agent has the answer."""
        pending, self.pending = self.pending, None
        if pending is not None:
            await pending


def enabled(cfg: Config) -> bool:
    return bool(StopJudge.enabled(cfg) or cuts_enabled(cfg))


def reads(guarded: bool | str | None, cfg: Config) -> bool:
    """The response side (or re-sample and fallback, ``recovery.*``) reads the answer to this
    request (``guarded``: its wire, see :func:`plan`): the agent's ``Accept-Encoding`` then goes
    upstream as ``identity``."""
    recovery = cfg.recovery.resample.attempts > 0 or bool(cfg.recovery.fallback.url)
    return bool(guarded) and (enabled(cfg) or recovery)


def _encoding(upstream: aiohttp.ClientResponse) -> str | None:
    """The answer's ``Content-Encoding``, None when it is not compressed."""
    enc = upstream.headers.get("Content-Encoding")
    return None if enc is None or enc.strip().lower() in ("", "identity") else enc


class Shadow:
    """The observed part of the response side (``mode: observe``): it reads the bytes
    the agent gets unchanged (an SSE body chunk by chunk through its own stream guard, a JSON
    body whole at the end) and decides what enforcing would (a stop with every request action
    and every guard, the cuts when ``response.mode`` is observed), but holds, changes and aborts
    nothing: the guard's output is dropped. :meth:`finish` gives its actions
    (:func:`proxy.response.decide.observed_actions` marks them).
    An exception in it is counted (``internal_errors``) and ends the shadow only."""

    __slots__ = ("_body", "_cfg", "_failed", "_guard", "_judge", "_repair", "_wire")

    def __init__(
        self, wire: str, sse: bool, cfg: Config, judge: StopJudge | None, fix: Repairer | None = None
    ) -> None:
        self._wire = wire
        self._cfg = cfg
        self._judge = judge
        self._repair = fix  # chat only: the repair the enforced side would make (response.mode)
        self._guard: FramedGuard | None = None
        if sse:
            self._guard = StreamGuard(cfg, judge, fix) if wire == "chat" else _STREAM_GUARDS[wire](cfg, judge)
        self._body = bytearray()
        self._failed = False

    @property
    def complete(self) -> bool:
        """The stream said how it ended (SSE; False for JSON and after the shadow's own cut)."""
        return self._guard is not None and self._guard.complete and not self._guard.aborted

    def feed(self, chunk: bytes, stats: Stats) -> None:
        if self._failed:
            return
        try:
            if self._guard is None:
                self._body += chunk
            elif not self._guard.aborted:
                self._guard.feed(chunk)
        except Exception as exc:
            failed(stats, "shadow", exc)
            self._failed = True

    def finish(self, stats: Stats) -> list[Action]:
        actions: list[Action] = []
        try:
            if self._guard is not None:
                if not self._failed and not self._guard.aborted:
                    self._guard.finish()
                actions = list(self._guard.actions)
            elif not self._failed and self._wire == "responses":
                _, actions, _ = responses_answer.decide_json_answer(bytes(self._body), self._judge, self._cfg)
            elif not self._failed and self._wire == "messages":
                _, actions = messages_stream.decide_json(bytes(self._body), self._judge, self._cfg)
            elif not self._failed and self._wire == "gemini":
                _, actions = gemini_stream.decide_json(bytes(self._body), self._judge, self._cfg)
            elif not self._failed:
                _, actions = decide_json(bytes(self._body), self._judge, self._cfg, self._repair)
        except Exception as exc:
            failed(stats, "shadow", exc)
        self._body.clear()
        return actions


def plan(
    guarded: bool | str,
    upstream: aiohttp.ClientResponse,
    decision: RequestDecision | None,
    guards: tuple[Guard, ...],
    cfg: Config,
    on_answer: Callable[[Answer], None] | None = None,
    tap: bool = False,
) -> ResponseSide | None:
    """The response side for this upstream response, or None for plain passthrough. ``guarded``:
    the answer's wire (``"chat"``, ``"responses"``, ``"messages"``, ``"gemini"``; True means chat),
    or False/None.
    ``on_answer``: the response store's hook for a Responses answer (None: not wanted).
    ``tap``: read the upstream's chat answer for the capture (:attr:`ResponseSide.tap`)."""
    side = _plan(guarded, upstream, decision, guards, cfg, on_answer)
    if not tap:
        return side
    readable = upstream.status == 200 and _encoding(upstream) is None
    sse = upstream.content_type == "text/event-stream"
    if readable and guarded in (True, "chat") and (sse or upstream.content_type == "application/json"):
        if side is None:  # the response side reads nothing: relayed unchanged, read for the capture
            side = ResponseSide("observe", cfg, None, "chat")
        side.tap = Assembly() if sse else bytearray()
    return side


def _plan(
    guarded: bool | str,
    upstream: aiohttp.ClientResponse,
    decision: RequestDecision | None,
    guards: tuple[Guard, ...],
    cfg: Config,
    on_answer: Callable[[Answer], None] | None = None,
) -> ResponseSide | None:
    if not guarded or upstream.status != 200:
        return None
    wire = "chat" if guarded is True else str(guarded)
    ctype = upstream.content_type
    if wire == "gemini_array" and ctype == "text/event-stream":
        wire = "gemini"  # asked for the array, answered with events: read as events
    if ctype == "text/event-stream" or (wire == "gemini_array" and ctype == "application/json"):
        kind = "sse"  # read as it streams (the array's elements as events)
    elif ctype == "application/json":
        kind = "json"
    elif enabled(cfg):  # an answer the response side cannot read: counted, relayed unchanged
        return ResponseSide("observe", cfg, None, wire, unread=CONTENT_TYPE)
    else:
        return None
    encoding = _encoding(upstream)
    # observe mode: what is enforced runs as before; what is observed runs in a shadow
    transcript = decision.transcript if decision is not None else None
    ctx = Context(conversation=decision.conversation if decision else "", now_ms=int(time.time() * 1000))
    checkpoint = decision.checkpoint if decision is not None else None
    lazy = None
    if decision is not None and decision.plain:  # no call in its history: a judge only when needed
        transcript, lazy = None, lambda: decision.transcript
    elif transcript is None and not _cuts(cfg) and (on_answer is None or wire != "responses"):
        return None  # no judge (nothing read), no cut on, no store to feed: nothing reads the answer
    d = deciders(transcript, decision.actions if decision else (), guards, ctx, cfg, checkpoint, lazy)
    enforce_cfg, judge = d.cfg, d.judge
    fix = shadow_fix = None
    if wire == "chat" and decision is not None:  # tool calls written as text
        fix = repair.for_request(enforce_cfg, transcript, decision.body)
        shadow_fix = repair.for_request(d.shadow_cfg, transcript, decision.body)
    # what can apply to this answer: the repair of calls written as text only with a repairer
    # (a chat request that offered tools), so an answer nothing else reads passes through
    enforcing = judge is not None or _cuts(enforce_cfg) or fix is not None
    observing = d.shadow_judge is not None or _cuts(d.shadow_cfg) or shadow_fix is not None
    shadow = (
        Shadow(wire, kind == "sse", d.shadow_cfg, d.shadow_judge, shadow_fix)
        if encoding is None and observing
        else None
    )
    if not enforcing or encoding is not None:
        unread = CONTENT_ENCODING if encoding is not None and (enforcing or observing) else None
        if on_answer is None or wire != "responses":
            if shadow is None and unread is None:
                return None
            return ResponseSide("observe", cfg, None, wire, shadow=shadow, unread=unread)
        capture = ResponseCapture(kind == "sse", encoding)
        return ResponseSide(
            "observe",
            cfg,
            None,
            "responses",
            on_answer=on_answer,
            capture=capture,
            shadow=shadow,
            unread=unread,
        )
    hold = (
        kind == "sse"
        and enforce_cfg.stop.deliver == "error"
        and judge is not None
        and bool(getattr(judge, "possible", False))
    )
    return ResponseSide(
        kind,
        enforce_cfg,
        judge,
        wire,
        on_answer=on_answer if wire == "responses" else None,
        shadow=shadow,
        repair=fix,
        hold=hold,
    )


def _cuts(cfg: Config) -> bool:
    """The runaway or degenerate-text checks are on (they read any answer)."""
    r = cfg.response
    return bool(
        r.max_calls_per_response
        or r.max_identical_per_response
        or r.max_identical_reads_per_response
        or r.degenerate_text.enabled
    )


class IncompleteStream(aiohttp.ClientPayloadError):
    """The upstream's event stream ended without a ``finish_reason`` and without ``[DONE]`` (an
    empty 200 stream included, as llama-cpp-python sends when it rejects a streaming tool choice):
    the answer stopped short, so the agent's stream ends with the error event, not as a success."""


def failed(stats: Stats, where: str, exc: Exception) -> None:
    stats.internal_errors += 1
    log.error("response_guard_error", error=type(exc).__name__, where=where)


#: The stream guard of each answer wire (``ResponseSide.wire``); chat completions by default.
_STREAM_GUARDS: dict[str, type[FramedGuard]] = {
    "responses": ResponsesStreamGuard,
    "messages": MessagesStreamGuard,
    "gemini": GeminiStreamGuard,
    "gemini_array": GeminiArrayGuard,
}


async def relay_sse(
    upstream: aiohttp.ClientResponse,
    response: StreamWriter,
    side: ResponseSide,
    stats: Stats,
    request: web.Request | None = None,
) -> Stop | None:
    """Relay an SSE body through a :class:`StreamGuard`. Upstream read errors propagate (the
    caller ends the agent's stream with an error event) after the held bytes are released.

    ``stop.deliver: error``: with ``side.hold`` nothing is written (``response`` is prepared, by
    ``request``, only when there is something to write) until the answer is decided; a stop
    then returns it, nothing written, for the caller to answer the HTTP error
    (:mod:`proxy.edge.stopped`). A stop in a stream already under way ends it with the error
    event instead. Returns None otherwise."""
    guard: FramedGuard | None = (
        StreamGuard(side.cfg, side.judge, side.repair)
        if side.wire == "chat"
        else _STREAM_GUARDS[side.wire](side.cfg, side.judge)
    )
    unsettled = bytearray()  # bytes received and not yet forwarded, as of the last good feed
    error_mode = side.cfg.stop.deliver == "error"
    held: bytearray | None = bytearray() if side.hold else None

    async def write(data: bytes) -> None:
        nonlocal held
        if held is not None:
            held += data
            return
        if not response.prepared and request is not None:
            await response.prepare(request)
        await response.write(data)

    async def let_go() -> None:  # the answer is decided (or broken): what was held goes out
        nonlocal held
        data, held = held, None
        if data is not None:
            await write(bytes(data))

    async def stopped(stop: Stop) -> Stop | None:
        """A stop delivered as an error: the HTTP error when nothing was sent, else the event."""
        upstream.close()  # the server stops generating now
        if held is not None:
            return stop
        await write(stop_event(side.wire, stop))
        side.delivered = True
        return None

    try:
        async for chunk in upstream.content.iter_any():
            side.read(chunk, stats)
            if guard is None:
                await write(chunk)
                continue
            try:
                out = guard.feed(chunk)
                unsettled += chunk
                del unsettled[: len(unsettled) - (guard.received - guard.settled)]
            except Exception as exc:  # fail open: forward what is pending, then relay as is
                failed(stats, "sse", exc)
                side.actions.extend(guard.actions)
                side.unread = INTERNAL_ERROR
                guard = None
                await write(bytes(unsettled) + chunk)
                await let_go()
                continue
            stop = enforced_stop(guard.actions) if error_mode else None
            if stop is not None:
                return await stopped(stop)
            if out.abort:
                upstream.close()  # the server stops generating now
            if isinstance(guard, ResponsesStreamGuard) and guard.answer is not None:
                side.answered(guard.answer, stats)
                await side.settle()
            if out.data:
                await write(out.data)
            if guard.complete and guard.received == guard.settled:
                side.delivered = True
            if out.abort:
                await let_go()
                return None
        if guard is not None:
            try:
                tail = guard.finish()
                complete = guard.complete
            except Exception as exc:
                failed(stats, "sse", exc)
                side.unread = INTERNAL_ERROR
                tail = bytes(unsettled)
                complete = True  # our own failure: nothing known about the upstream's stream
            stop = enforced_stop(guard.actions) if error_mode else None
            if stop is not None:
                return await stopped(stop)
            if isinstance(guard, ResponsesStreamGuard) and guard.answer is not None:
                side.answered(guard.answer, stats)  # its final event ended only with the stream
                await side.settle()
            if tail:
                await write(tail)
            await let_go()
            if not complete:
                raise IncompleteStream("the upstream stream ended without a finish_reason or [DONE]")
        await let_go()
        return None
    except (aiohttp.ClientError, asyncio.TimeoutError):
        if guard is not None:
            try:
                released = guard.release()
            except Exception as exc:
                failed(stats, "sse", exc)
                released = bytes(unsettled)
            if released:
                await write(released)
        await let_go()
        raise
    finally:
        if guard is not None:
            side.actions.extend(guard.actions)
            side.unread = side.unread or guard.unread
        side.observed(stats)


async def relay_json(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    response: web.StreamResponse,
    side: ResponseSide,
    stats: Stats,
) -> web.StreamResponse:
    """Buffer a JSON body, decide, write it: returns the response written, a
    :class:`aiohttp.web.Response` with ``response``'s status and headers sent with the body in one
    write (a JSON answer is held whole: headers alone, then the body, cost the agent a second
    segment and the proxy a second system call). An upstream read error propagates after the
    bytes received so far are written unchanged through ``response``."""
    body = bytearray()
    try:
        async for chunk in upstream.content.iter_any():
            body += chunk
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        if isinstance(exc, asyncio.TimeoutError):
            raise  # nothing sent yet: the caller answers 504
        await response.prepare(request)
        await response.write(bytes(body))
        raise
    raw = bytes(body)
    side.read(raw, stats)
    side.observed(stats)
    try:
        if side.wire == "responses":
            new, actions, answer = responses_answer.decide_json_answer(raw, side.judge, side.cfg)
            side.answered(answer, stats)
            await side.settle()
        elif side.wire == "messages":
            new, actions = messages_stream.decide_json(raw, side.judge, side.cfg)
        elif side.wire == "gemini":
            new, actions, unread = gemini_stream.decide_json_answer(raw, side.judge, side.cfg)
            side.unread = side.unread or unread
        else:
            new, actions = decide_json(raw, side.judge, side.cfg, side.repair)
        side.actions.extend(actions)
    except Exception as exc:
        failed(stats, "json", exc)
        side.unread = INTERNAL_ERROR
        new = None
    stop = enforced_stop(side.actions) if new is not None else None
    if stop is not None and side.cfg.stop.deliver == "error":
        out = stop_response(side.wire, stop)
    else:
        out = web.Response(status=response.status, reason=response.reason, headers=response.headers)
        out.headers.popall("Content-Length", None)  # the body's own length (a rewrite changes it)
        out.body = raw if new is None else new
        if stop is not None:
            out.headers[STOP_HEADER] = stop.reason or stop.rule
    await out.prepare(request)
    await out.write_eof()
    return out


async def relay_observed(
    upstream: aiohttp.ClientResponse, response: Writer, side: ResponseSide, stats: Stats
) -> None:
    """Relay the body unchanged, chunk by chunk (``response`` prepared by the caller), while
    ``side.capture`` reads it for the store; a failure there stops the reading, never the relay.
    A JSON body is decoded when its last byte has arrived (``Content-Length``) or the upstream
    ended it, before that byte is written or the agent's body is ended. ``side.shadow`` (observe
    mode) reads the same chunks and decides what enforcing would, changing none."""
    try:
        await _relay_observed(upstream, response, side, stats, side.capture, upstream.content_length)
    finally:
        side.observed(stats)


async def _relay_observed(
    upstream: aiohttp.ClientResponse,
    response: Writer,
    side: ResponseSide,
    stats: Stats,
    capture: ResponseCapture | None,
    length: int | None,
) -> None:
    received = 0
    async for chunk in upstream.content.iter_any():
        received += len(chunk)
        side.read(chunk, stats)
        if side.shadow is not None and side.shadow.complete:
            side.delivered = True
        if capture is not None:
            try:
                capture.feed(chunk)
                if length is not None and received >= length:
                    capture.finish()
                if capture.answer is not None:
                    side.answered(capture.answer, stats)
            except Exception as exc:
                failed(stats, "capture", exc)
                capture = None
        await side.settle()
        await response.write(chunk)
        if capture is not None and capture.complete:
            side.delivered = True
    if capture is not None:
        try:
            capture.finish()
            side.answered(capture.answer, stats)
        except Exception as exc:
            failed(stats, "capture", exc)
        await side.settle()


def readable_stream(upstream: aiohttp.ClientResponse) -> bool:
    """A 200 event stream loopguard can read (not compressed)."""
    return (
        upstream.status == 200
        and upstream.content_type == "text/event-stream"
        and _encoding(upstream) is None
    )


async def relay_as_json(
    upstream: aiohttp.ClientResponse, side: ResponseSide | None, stats: Stats
) -> tuple[Assembly, Exception | None]:
    """Read a streamed answer to a request the agent sent without ``stream`` through the stream
    guard (when the response side is on) into an :class:`Assembly`; the caller turns it into the
    agent's JSON answer. On a cut the upstream is closed at once and reading stops. An upstream
    read error ends the reading (what the guard held is assembled unchanged) and is returned
    with the assembly: an answer that was complete before it is still whole."""
    enforcing = side is not None and side.kind != "observe"
    guard: StreamGuard | None = (
        StreamGuard(side.cfg, side.judge, side.repair) if side is not None and enforcing else None
    )
    assembly = Assembly()
    unsettled = bytearray()  # bytes received and not yet settled by the guard
    error: Exception | None = None
    try:
        try:
            async for chunk in upstream.content.iter_any():
                if side is not None:
                    side.read(chunk, stats)
                if guard is None:
                    assembly.feed(chunk)
                    continue
                try:
                    out = guard.feed(chunk)
                    unsettled += chunk
                    del unsettled[: len(unsettled) - (guard.received - guard.settled)]
                except Exception as exc:  # fail open: assemble what the upstream sent, unguarded
                    failed(stats, "sse", exc)
                    if side is not None:
                        side.actions.extend(guard.actions)
                        side.unread = INTERNAL_ERROR
                    guard = None
                    assembly.feed(bytes(unsettled) + chunk)
                    continue
                assembly.feed(out.data)
                if out.abort:
                    upstream.close()  # the server stops generating now
                    break
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            error = exc
        if guard is not None:
            try:  # the end of the stream decides what is open; after an error, held bytes go as is
                assembly.feed(guard.finish() if error is None else guard.release())
            except Exception as exc:
                failed(stats, "sse", exc)
                assembly.feed(bytes(unsettled))
        assembly.finish()
        return assembly, error
    finally:
        if guard is not None and side is not None:
            side.actions.extend(guard.actions)
            side.unread = side.unread or guard.unread
        if side is not None:
            side.observed(stats)


def record(
    side: ResponseSide,
    stats: Stats,
    incidents: IncidentLog,
    conversation: str,
    request_body: bytes,
    fields: dict[str, Any],
    chain: Chain | None = None,
) -> None:
    """Count and log the response side's actions; a stop that is the conversation's first (no
    earlier stop in its history, :func:`proxy.response.decide.earlier_stops`) is an incident. A
    ``previous_response_id`` request's history is its kept ``chain``. An answer that went out
    unread is counted (``unguarded_responses{reason}``) and said in the log line."""
    if side.unread is not None:
        stats.unguarded_responses[side.unread] += 1
        fields["unguarded_response"] = side.unread
    if not side.actions:
        return
    stats.record_actions(side.actions)
    fields.setdefault("actions", []).extend(action_summary(a) for a in side.actions)
    if not any(isinstance(a, Stop) for a in side.actions):
        return
    try:
        chained = chain is not None and chain.previous is not None and not chain.lost
        if incidents.seen(conversation, STOP_KIND):
            history: list[Stop] = []  # already recorded here: the history cannot change that
        else:
            history = earlier_stops(chain.history() if chained else request_body, side.cfg.stop)
        found = incidents.record([*history, *side.actions], conversation, now_ms=int(time.time() * 1000))
    except Exception as exc:  # fail open, like the request side
        failed(stats, "incident", exc)
        return
    stats.record_incidents(found)
