"""Fast fake OpenAI-compatible upstream for the benchmark (its own process, loopback only).

A minimal HTTP/1.1 server on a bare asyncio protocol (keep-alive; bodies are read into one reused
buffer and only their ends are searched) so that the upstream costs as little CPU as possible and
every arm is measured against the same fixed answers:

- ``POST`` whose body has ``"stream": true``: ``text/event-stream``, 64 events paced 5 ms apart
  (chunked transfer encoding, one event per chunk; the first is sent with the headers).
- any other ``POST``: a fixed ``chat.completion`` JSON (one tool call), with Content-Length; a
  body without ``"tools"`` (the plain chat workload) gets a text answer instead.
- ``GET`` (health checks, ``/v1/models``): a small JSON.

Usage: ``python bench/fake_upstream.py [--port 0]``; prints ``PORT <n>`` on stdout when listening.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys

from workloads import CHAT_COMPLETION, COMPLETION, MODEL, SSE_INTERVAL_S, sse_events

#: Only the first and last SCAN bytes of a large body are searched for ``"stream": true`` (clients
#: put it before or after ``messages``, next to the other small parameters); a body up to 4 × SCAN
#: is searched whole.
SCAN = 16 * 1024
_STREAM_TRUE = re.compile(rb'"stream"\s*:\s*true')
_JSON_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
    b"Connection: keep-alive\r\n\r\n"
)
_COMPLETION_RESPONSE = _JSON_HEAD % len(COMPLETION) + COMPLETION
_CHAT_RESPONSE = _JSON_HEAD % len(CHAT_COMPLETION) + CHAT_COMPLETION
_MODELS = b'{"object":"list","data":[{"id":"%s","object":"model","owned_by":"bench"}]}' % MODEL.encode()
_MODELS_RESPONSE = _JSON_HEAD % len(_MODELS) + _MODELS
_SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"
)
_SSE_CHUNKS = [b"%x\r\n%s\r\n" % (len(e), e) for e in sse_events()]


def _has_stream_true(buf: bytes | bytearray, start: int, end: int) -> bool:
    i = buf.find(b'"stream"', start, end)
    while i >= 0:
        if _STREAM_TRUE.match(buf, i, end):
            return True
        i = buf.find(b'"stream"', i + 8, end)
    return False


class Conn(asyncio.BufferedProtocol):
    """One client connection, read into one reused buffer.

    Requests are answered in order; a client does not send the next request on a connection before
    the previous response has ended (no pipelining), so reading simply continues after a stream.
    Request bodies need a Content-Length (every arm sends one); chunked ones get 411."""

    def __init__(self) -> None:
        self.buf = bytearray(1 << 18)
        self.view = memoryview(self.buf)
        self.start = 0  # first unconsumed byte
        self.end = 0  # end of the data read
        self.transport: asyncio.Transport | None = None
        self.remaining = -1  # body bytes still to come; -1 while reading a request head
        self.method = b""
        self.close_after = False
        self.length = 0
        self.got = 0  # body bytes received so far
        self.head = bytearray()  # the first SCAN bytes of the body
        self.tail = bytearray()  # the last SCAN bytes of the body (the whole body when small)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.start == self.end:
            self.start = self.end = 0
        elif self.end == len(self.buf):
            n = self.end - self.start
            if self.start == 0:  # a head larger than the buffer: grow
                self.buf.extend(bytes(len(self.buf)))
            else:
                self.buf[:n] = self.buf[self.start : self.end]
                self.start, self.end = 0, n
            self.view = memoryview(self.buf)
        return self.view[self.end :]

    def buffer_updated(self, nbytes: int) -> None:
        self.end += nbytes
        while self.transport is not None and self.start < self.end:
            if self.remaining < 0 and not self._head():
                return
            if self.remaining >= 0 and not self._body():
                return

    def _head(self) -> bool:
        i = self.buf.find(b"\r\n\r\n", self.start, self.end)
        if i < 0:
            return False
        lines = bytes(self.buf[self.start : i]).split(b"\r\n")
        self.start = i + 4
        self.method = lines[0].split(b" ", 1)[0]
        length, self.close_after = 0, False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                assert self.transport is not None
                self.transport.write(b"HTTP/1.1 411 Length Required\r\nContent-Length: 0\r\n\r\n")
                self.transport.close()
                return False
            elif name == b"connection" and b"close" in value.lower():
                self.close_after = True
        self.remaining = self.length = length
        self.got = 0
        self.head.clear()
        self.tail.clear()
        return True

    def _body(self) -> bool:
        n = min(self.end - self.start, self.remaining)
        if n and self.method == b"POST":
            seg = self.view[self.start : self.start + n]
            if self.length <= 4 * SCAN:
                self.tail += seg
            else:
                if self.got < SCAN:
                    self.head += seg[: SCAN - self.got]
                if self.got + n > self.length - SCAN:
                    self.tail += seg[max(0, self.length - SCAN - self.got) :]
            self.got += n
        self.start += n
        self.remaining -= n
        if self.remaining:
            return False
        self.remaining = -1
        self.respond()
        return True

    def respond(self) -> None:
        assert self.transport is not None
        if _has_stream_true(self.head, 0, len(self.head)) or _has_stream_true(self.tail, 0, len(self.tail)):
            asyncio.get_running_loop().create_task(self.send_stream(self.close_after))
            return
        if self.method != b"POST":
            self.transport.write(_MODELS_RESPONSE)
        elif b'"tools"' in self.head or b'"tools"' in self.tail:
            self.transport.write(_COMPLETION_RESPONSE)
        else:  # no tools offered (the plain chat workload): a text answer
            self.transport.write(_CHAT_RESPONSE)
        if self.close_after:
            self.transport.close()

    async def send_stream(self, close: bool) -> None:
        transport = self.transport
        assert transport is not None
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        transport.write(_SSE_HEAD + _SSE_CHUNKS[0])
        for i, chunk in enumerate(_SSE_CHUNKS[1:], start=1):
            delay = t0 + i * SSE_INTERVAL_S - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if transport.is_closing():
                return
            transport.write(chunk)
        transport.write(b"0\r\n\r\n")
        if close:
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Conn, args.host, args.port, backlog=1024)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
