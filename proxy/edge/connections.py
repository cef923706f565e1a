"""The agent's connections: timeouts, a connection limit, half-close.

aiohttp's server protocol (:class:`aiohttp.web_protocol.RequestHandler`) gives, out of the box:
a connection that sends nothing, or only part of its headers, is closed after
``keepalive_timeout`` (3,630 s) and never before; a stalled request body is waited for forever;
there is no limit on connections; and a client that sends its request and then shuts its write
side (``shutdown(SHUT_WR)``, as some HTTP/1.0 clients do) loses the answer, because the protocol's
``eof_received`` returns None and asyncio then closes the transport (the handler is cancelled).

Here, with ``listen.*`` (:class:`proxy.config.ListenConfig`):

- :class:`AgentHandler` times the request headers (``header_timeout_s``: from the connection's
  opening, and on a kept-alive connection from the first byte of the next request; an idle
  kept-alive connection keeps aiohttp's ``keepalive_timeout``) and keeps a half-closed
  connection open for writing until the requests it sent are answered, then closes it. TCP
  cannot tell a half-close from a hang-up, so an EOF counts as a half-close only after a
  request that said it is the connection's last (HTTP/1.0 without keep-alive, or
  ``Connection: close``: what such clients send); after a keep-alive request it is a hang-up
  and the upstream request is closed at once, as before. A request whose body the EOF cut
  short is dropped, as before.
- :class:`AgentServer` answers a connection past ``max_connections`` at once with a 503 and
  closes it (:class:`_Refused`), without reading it into aiohttp.
- :func:`read_body` reads the request body with an idle timeout (``body_timeout_s``).
- :func:`ensure_fd_limit` raises the soft ``RLIMIT_NOFILE`` to fit the limit.

What this relies on in aiohttp beyond its public API, all of it here and checked by
``tests/e2e/test_agent_side.py::test_aiohttp_internals_we_rely_on`` (see :data:`AIOHTTP_INTERNALS`):
``web.Server`` is the protocol factory the sites pass to ``loop.create_server`` and builds its
``RequestHandler`` from ``self._loop`` and ``self._kwargs`` (so :meth:`AgentServer.__call__`
does the same with the subclass; :func:`adopt` swaps the class of the server an ``AppRunner``
made, so nothing of the runner or the application is rebuilt); a ``RequestHandler`` keeps the
parsed requests not yet taken up in ``_messages`` (``(message, payload)`` pairs, read only),
calls its server's ``request_factory`` (public) as it takes one up, and awaits
``finish_response`` (public) once at the end of every response.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
import time
from typing import Any

import orjson
import structlog
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

log = structlog.get_logger("loopguard")

#: The private names of aiohttp this module reads (see the module docstring).
AIOHTTP_INTERNALS = {
    web.Server: ("_loop", "_kwargs"),
    RequestHandler: ("_messages",),
}

#: How long a refused connection (past ``max_connections``) is kept after its 503, reading and
#: discarding what the client sends, so that closing it does not reset the connection (a reset
#: can destroy the 503 before the client reads it). Seconds.
REFUSED_LINGER_S = 2.0
#: A ``connection_limit`` warning at most this often (seconds), with the count refused since.
REFUSED_LOG_EVERY_S = 10.0
#: File descriptors the process needs besides the agents' connections and one upstream connection
#: per agent connection (the upstream pool's limit is ``listen.max_connections``): the listening
#: socket, the event loop, stdio, the incident log, refused connections while they linger.
FD_RESERVE = 128


def error_body(message: str, type_: str, code: int) -> bytes:
    """An OpenAI-style error body: ``{"error": {"message", "type", "code"}}``."""
    return orjson.dumps({"error": {"message": message, "type": type_, "code": code}})


def raw_response(status: int, reason: str, body: bytes, *extra: str) -> bytes:
    """A complete ``Connection: close`` HTTP/1.1 response with a JSON body, for the places that
    answer below aiohttp's request handling (a header timeout, a refused connection)."""
    head = [
        f"HTTP/1.1 {status} {reason}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *extra,
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode("ascii") + body


class BodyTimeout(Exception):
    """The request body sent nothing for ``listen.body_timeout_s``; ``received``: bytes read."""

    def __init__(self, received: int) -> None:
        super().__init__(received)
        self.received = received


async def read_body(request: web.Request, idle_s: float | None) -> bytes:
    """The whole request body, like ``request.read()`` (413 past ``client_max_size``), but
    raising :class:`BodyTimeout` when no byte arrives for ``idle_s`` seconds between two reads
    (None: wait forever)."""
    content = request.content
    if idle_s is None or content.is_eof():  # no wait, or every byte already here: no timer to arm
        return await request.read()
    limit = request.client_max_size
    body = bytearray()
    if limit and hasattr(content, "set_read_chunk_size"):  # as request.read() does (newer aiohttp):
        content.set_read_chunk_size(limit)  # big buffers, fewer pause/resume cycles on 20 MB

    def add(chunk: bytes) -> None:
        body.extend(chunk)
        if limit and len(body) > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(body))

    try:
        if sys.version_info >= (3, 11):
            loop = asyncio.get_running_loop()
            async with asyncio.timeout(idle_s) as deadline:  # one timer, moved on by each chunk
                while chunk := await content.readany():
                    add(chunk)
                    deadline.reschedule(loop.time() + idle_s)
        else:  # pragma: no cover - Python 3.10
            while chunk := await asyncio.wait_for(content.readany(), idle_s):
                add(chunk)
    except asyncio.TimeoutError:
        raise BodyTimeout(len(body)) from None
    return bytes(body)


class AgentHandler(RequestHandler):
    """aiohttp's server protocol with a header timeout and half-close support (module doc)."""

    __slots__ = (
        "_lg_active",
        "_lg_bytes",
        "_lg_eof",
        "_lg_header_s",
        "_lg_last",
        "_lg_loop",
        "_lg_prev",
        "_lg_timer",
    )

    def __init__(
        self,
        manager: web.Server,
        *,
        loop: asyncio.AbstractEventLoop,
        header_timeout_s: float | None,
        **kwargs: Any,
    ) -> None:
        super().__init__(manager, loop=loop, **kwargs)
        self._lg_loop = loop
        self._lg_header_s = header_timeout_s
        self._lg_timer: asyncio.TimerHandle | None = None
        self._lg_bytes = 0  # bytes received since the header clock started
        self._lg_eof = False  # the agent shut its write side: answer what it sent, then close
        self._lg_active: Any = None  # the request being handled (made, not yet fully answered)
        self._lg_prev: Any = None  # the request answered last (its body may still be read off)
        self._lg_last = False  # that answer closes the connection: no next request

    def _between_requests(self) -> bool:
        """Waiting for a request's headers: nothing parsed and unhandled, nothing being handled."""
        return self._lg_active is None and not self._messages

    def request_made(self, request: Any) -> None:
        """Called by :func:`_tracked_factory` as aiohttp makes the request object for a parsed
        message (its headers are complete; it is handled from now on)."""
        self._lg_active = request

    def _start_header_clock(self) -> None:
        if self._lg_header_s is not None:
            self._lg_bytes = 0
            self._lg_timer = self._lg_loop.call_later(self._lg_header_s, self._header_timeout)

    def _stop_header_clock(self) -> None:
        if self._lg_timer is not None:
            self._lg_timer.cancel()
            self._lg_timer = None

    def _header_timeout(self) -> None:
        self._lg_timer = None
        if self.transport is None or not self._between_requests():
            return  # the headers came in time; the next request starts its own clock
        log.warning(
            "agent_timeout", phase="headers", received_bytes=self._lg_bytes, timeout_s=self._lg_header_s
        )
        if self._lg_bytes:  # part of a request came: say why it is dropped
            message = (
                f"loopguard: the request headers were not complete within {self._lg_header_s:g} s "
                "(listen.header_timeout_s)"
            )
            body = error_body(message, "request_timeout", 408)
            self.transport.write(raw_response(408, "Request Timeout", body))
        self.force_close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._start_header_clock()

    def data_received(self, data: bytes) -> None:
        if data and self._lg_timer is None and self._next_request_starts():
            self._start_header_clock()  # the first byte of the next request on a kept-alive connection
        if self._lg_timer is not None:
            self._lg_bytes += len(data)
        super().data_received(data)

    def _next_request_starts(self) -> bool:
        """Bytes now are a new request's: not a body still being read off after its answer
        (aiohttp's lingering), not after an answer that closes the connection or an EOF."""
        if self._lg_eof or self._lg_last or not self._between_requests():
            return False
        prev = self._lg_prev
        return prev is None or prev.content.is_eof()

    async def finish_response(self, request: Any, resp: Any, start_time: Any) -> Any:
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            self._stop_header_clock()  # the next request's clock starts at its first byte
            self._lg_active = None
            self._lg_prev = request
            self._lg_last = getattr(resp, "keep_alive", None) is False
            if self._lg_eof and not self._messages:
                self.close()  # all the half-closed agent sent is answered: close after this

    def eof_received(self) -> bool | None:
        """The agent sent EOF. When its last request said it is the last one (HTTP/1.0 without
        keep-alive, or ``Connection: close``), the EOF is a half-close: keep the connection open
        for the answers (True: asyncio then only stops reading) and close it after them.
        Otherwise None, and the transport closes as aiohttp does: with nothing to answer, with a
        request whose body the EOF cut short, and for a keep-alive request, whose EOF is the
        agent hanging up (TCP cannot tell the two apart; the upstream request is closed at once)."""
        if self._between_requests():
            return None
        active = self._lg_active
        queued = [(getattr(msg, "should_close", True), payload) for msg, payload in self._messages]
        pending = ([(not active.keep_alive, active.content)] if active is not None else []) + queued
        last_says_close = pending[-1][0]
        cut = any(not payload.is_eof() for _, payload in pending)
        if cut or not last_says_close:
            return None
        self._lg_eof = True
        return True

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_header_clock()
        self._lg_active = self._lg_prev = None
        super().connection_lost(exc)


class _Refused(asyncio.Protocol):
    """A connection past ``listen.max_connections``: a 503 at once, then closed (after reading
    and discarding for up to :data:`REFUSED_LINGER_S`, or at the client's EOF)."""

    def __init__(self, response: bytes) -> None:
        self._response = response
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(self._response)
        if transport.can_write_eof():
            transport.write_eof()
        self._timer = asyncio.get_running_loop().call_later(REFUSED_LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        pass  # discarded

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._timer is not None:
            self._timer.cancel()


class AgentServer(web.Server):
    """aiohttp's low-level server making :class:`AgentHandler` protocols, and :class:`_Refused`
    ones past ``max_connections``. Made by :func:`adopt` from the server an ``AppRunner`` built."""

    max_connections: int
    header_timeout_s: float | None
    _lg_refused: int
    _lg_logged_at: float

    def __call__(self) -> asyncio.Protocol:  # type: ignore[override]
        if len(self.connections) >= self.max_connections:
            return self._refuse()
        return AgentHandler(self, loop=self._loop, header_timeout_s=self.header_timeout_s, **self._kwargs)

    def _refuse(self) -> _Refused:
        self._lg_refused += 1
        now = time.monotonic()
        if now - self._lg_logged_at >= REFUSED_LOG_EVERY_S:
            log.warning("connection_limit", max_connections=self.max_connections, refused=self._lg_refused)
            self._lg_refused = 0
            self._lg_logged_at = now
        message = (
            f"loopguard: too many connections (listen.max_connections = {self.max_connections}); "
            "retry shortly"
        )
        body = error_body(message, "too_many_connections", 503)
        return _Refused(raw_response(503, "Service Unavailable", body, "Retry-After: 1"))


def _tracked_factory(make: Any, message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> Any:
    """``web.Server.request_factory`` (public), wrapped: tells the :class:`AgentHandler` that a
    request is being handled, the moment aiohttp takes it off its queue."""
    request = make(message, payload, protocol, writer, task)
    if isinstance(protocol, AgentHandler):
        protocol.request_made(request)
    return request


def adopt(server: web.Server, max_connections: int, header_timeout_s: float | None) -> AgentServer:
    """Turn the ``web.Server`` an ``AppRunner`` made (after ``setup()``, before any site starts)
    into an :class:`AgentServer` in place; the runner and its sites keep using the same object."""
    server.__class__ = AgentServer
    assert isinstance(server, AgentServer)
    server.request_factory = functools.partial(_tracked_factory, server.request_factory)
    server.max_connections = max_connections
    server.header_timeout_s = header_timeout_s
    server._lg_refused = 0
    server._lg_logged_at = -REFUSED_LOG_EVERY_S
    return server


def ensure_fd_limit(max_connections: int) -> None:
    """Raise the soft ``RLIMIT_NOFILE`` (up to the hard one) so ``max_connections`` agent
    connections, as many upstream ones, plus :data:`FD_RESERVE` fit; warn (``fd_limit_low``)
    when they cannot. Without it, running out of descriptors makes every accept fail and asyncio
    stop accepting for a second at a time: new agents hang instead of being told."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return
    need = 2 * max_connections + FD_RESERVE  # each agent connection, and its upstream one
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    target = need if hard == resource.RLIM_INFINITY else min(hard, need)
    if target > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    if soft < need:
        log.warning(
            "fd_limit_low",
            soft=soft,
            hard=hard,
            needed=need,
            max_connections=max_connections,
            hint="raise the limit (ulimit -n) or lower listen.max_connections",
        )
