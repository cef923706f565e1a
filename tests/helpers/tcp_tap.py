"""A TCP tap: a loopback port that pipes each connection to a target port and keeps every byte
that passes either way, so a test sees exactly what an agent sent and received (no HTTP library
in between to decode, decompress or re-frame anything); :func:`http_messages` splits the kept
bytes into HTTP/1.1 messages."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


@dataclass
class Connection:
    """The bytes of one connection: ``sent`` by the client, ``received`` from the target."""

    sent: bytearray = field(default_factory=bytearray)
    received: bytearray = field(default_factory=bytearray)


@dataclass
class Tap:
    """The tap's port and its connections, in the order they were accepted."""

    port: int = 0
    connections: list[Connection] = field(default_factory=list)

    def requests(self) -> list[tuple[bytes, bytes]]:
        """Every HTTP request the clients sent, (head, body), connection by connection."""
        return [m for c in self.connections for m in http_messages(bytes(c.sent))]

    def responses(self) -> list[tuple[bytes, bytes]]:
        """Every HTTP response the clients got, (head, decoded-from-chunks body)."""
        return [m for c in self.connections for m in http_messages(bytes(c.received))]


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, keep: bytearray) -> None:
    try:
        while data := await reader.read(65536):
            keep += data
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


@contextlib.asynccontextmanager
async def tap(target_port: int, host: str = "127.0.0.1") -> AsyncIterator[Tap]:
    """A :class:`Tap` in front of ``host:target_port`` while the block runs."""
    state = Tap()
    tasks: set[asyncio.Task[None]] = set()

    async def accept(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        conn = Connection()
        state.connections.append(conn)
        target_r, target_w = await asyncio.open_connection(host, target_port)
        both = asyncio.gather(_pipe(client_r, target_w, conn.sent), _pipe(target_r, client_w, conn.received))
        task = asyncio.ensure_future(both)
        tasks.add(task)
        await task

    server = await asyncio.start_server(accept, host, 0)
    state.port = server.sockets[0].getsockname()[1]
    try:
        yield state
    finally:
        server.close()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()


def http_messages(data: bytes) -> list[tuple[bytes, bytes]]:
    """Split a stream of HTTP/1.1 messages into (head, body): a body is ``Content-Length`` bytes,
    or the decoded chunks of ``Transfer-Encoding: chunked``, or (a response without either) the
    rest of the stream. A truncated last message is returned as far as it goes."""
    out: list[tuple[bytes, bytes]] = []
    pos = 0
    while pos < len(data):
        end = data.find(b"\r\n\r\n", pos)
        if end < 0:
            break
        head = data[pos:end]
        pos = end + 4
        fields = {}
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            fields[name.strip().lower()] = value.strip()
        if b"chunked" in fields.get(b"transfer-encoding", b"").lower():
            body = bytearray()
            while True:
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    pos = len(data)
                    break
                size = int(data[pos:eol].split(b";")[0], 16)
                pos = eol + 2
                if size == 0:
                    trailer_end = data.find(b"\r\n", pos)  # no trailers expected: the empty line
                    pos = len(data) if trailer_end < 0 else trailer_end + 2
                    break
                body += data[pos : pos + size]
                pos += size + 2
            out.append((head, bytes(body)))
        elif b"content-length" in fields:
            n = int(fields[b"content-length"])
            out.append((head, data[pos : pos + n]))
            pos += n
        elif head.startswith(b"HTTP/"):
            out.append((head, data[pos:]))
            pos = len(data)
        else:
            out.append((head, b""))
    return out
