"""Incremental Server-Sent Events framer: bytes in, events out, each with its exact raw bytes.

Sans-I/O: :meth:`SSEFramer.feed` takes whatever the socket delivered and returns the events that
became complete; at the end of the stream :meth:`SSEFramer.end` returns the event the end
completes (its blank line ended by a CR that was the last byte), then :meth:`SSEFramer.finish`
the bytes of an unfinished event. Concatenating every event's ``raw`` and the ``finish()`` tail
gives back exactly the input, whatever the read boundaries, so a relay can forward events
untouched (byte-exact passthrough) while reading them.

Framing follows the WHATWG event-stream rules: lines end with CRLF, LF or CR (mixed in one stream
too); a blank line ends an event; a line starting with ``:`` is a comment (``: keep-alive``,
``: OPENROUTER PROCESSING``); ``field:value`` loses one leading space of the value (``data:x`` and
``data: x`` are the same); ``data`` lines are joined with LF; a UTF-8 BOM at the very start is
ignored. Lines are decoded only once complete, so a multi-byte UTF-8 character split across reads
is decoded whole; invalid UTF-8 becomes U+FFFD in the parsed fields (``raw`` is untouched). A CR
at the end of a read is held until the next byte shows whether it starts a CRLF (so which bytes
make an event never depends on the read boundaries); at the end of the stream it is a line end
(:meth:`SSEFramer.end`), so a stream whose lines end in bare CR has its last event read too.

Why not a library: the team rule is libraries over hand-rolled framing, and the candidates were
checked. httpx-sse's ``SSEDecoder`` (and the OpenAI SDK's private copy of it) decodes *text lines*
into field values: it never sees the bytes, so it cannot say which bytes made up an event, and the
package imports httpx (a second HTTP client) at import time. aiohttp-sse only writes events
(server side); aiohttp-sse-client is an unmaintained (2021) EventSource client with reconnects and
no raw bytes either. Byte-exact passthrough needs event boundaries in the byte stream, which is the
small part below; field parsing is a dozen lines on top of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

_EOL = re.compile(rb"\r\n|\r|\n")
_BOM = "\ufeff"


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One event. ``raw``: its exact bytes, up to and including the blank line that ended it.
    ``data``: the ``data`` lines joined with LF, or None when the event has no ``data`` field
    (comments only, or a stray blank line). ``event``: the ``event`` field, or None."""

    raw: bytes
    data: str | None = None
    event: str | None = None


class SSEFramer:
    """Incremental framer; one instance per stream. Linear in the bytes fed, however they are
    split: every byte is scanned for a line end once, and the bytes of dispatched events are
    dropped once per :meth:`feed` (one 32 MiB event no longer takes seconds).
    :attr:`pending` is how many bytes of an unfinished event it holds."""

    __slots__ = ("_buf", "_data", "_event", "_pos", "_scan", "_started")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0  # start of the first line not parsed yet (the event starts at 0)
        self._scan = 0  # bytes before this were searched for a line end already
        self._data: list[str] | None = None
        self._event: str | None = None
        self._started = False  # a line has been parsed (the BOM rule applies to the first only)

    @property
    def pending(self) -> int:
        """Bytes held for the event not finished yet."""
        return len(self._buf)

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Add bytes from the stream; returns the events completed by them, in order."""
        buf = self._buf
        buf += chunk
        out: list[SSEEvent] = []
        pos = self._pos
        start = 0  # where the current event starts in buf
        while True:
            found = _line_end(buf, max(pos, self._scan))
            if isinstance(found, int):
                self._scan = found
                break
            eol, nxt = found
            line = buf[pos:eol]
            pos = self._scan = nxt
            if line:
                self._line(line.decode("utf-8", "replace"))
                continue
            out.append(SSEEvent(bytes(buf[start:pos]), self._joined(), self._event))
            start = pos
            self._data = None
            self._event = None
        if start:
            del buf[:start]
            pos -= start
            self._scan -= start
        self._pos = pos
        return out

    def end(self) -> list[SSEEvent]:
        """The stream ended: a CR held at the end of the last read ends its line (no byte can
        follow to make it a CRLF). Returns the event that completes (a blank line: at most one);
        :meth:`finish` then gives the bytes still unfinished."""
        buf = self._buf
        last = len(buf) - 1
        if last < self._pos or buf[last] != 0x0D or self._scan != last:
            return []
        line = buf[self._pos : last]
        self._pos = self._scan = len(buf)
        if line:
            self._line(line.decode("utf-8", "replace"))
            return []  # an event without its blank line is never dispatched
        event = SSEEvent(bytes(buf), self._joined(), self._event)
        self.finish()
        return [event]

    def finish(self) -> bytes:
        """The stream ended: the bytes of the unfinished event, if any (never dispatched, as the
        spec says; returned so a relay can still forward them)."""
        rest = bytes(self._buf)
        self._buf.clear()
        self._pos = 0
        self._scan = 0
        self._data = None
        self._event = None
        return rest

    def _joined(self) -> str | None:
        return None if self._data is None else "\n".join(self._data)

    def _line(self, line: str) -> None:
        if not self._started:
            self._started = True
            line = line.removeprefix(_BOM)
        if line.startswith(":"):
            return
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            if self._data is None:
                self._data = []
            self._data.append(value)
        elif name == "event":
            self._event = value


#: The most an :class:`EventGate` holds of one unfinished event before it opens (bytes): a body
#: that is not an event stream, though labelled one, must not be buffered whole.
GATE_MAX_HELD = 16 * 1024 * 1024


class EventGate:
    """What of an event stream may go to the agent now: everything up to the last point where the
    agent's event-stream parser holds nothing (after a blank line, or after comment lines that
    follow one); the rest is held until the event it belongs to ends.

    Why: an error event written after a partial event is read as part of it (the parser joins it
    to the unfinished ``data`` line), so the agent's SDK raises a decode or connection error
    instead of the API error the event carries. With the partial event held back, a stream that
    breaks mid-event is ended by dropping the held bytes (:meth:`drop`) and writing the error
    event on its own; a stream that ends normally gets the held bytes (:meth:`flush`), so the
    agent receives the upstream's bytes exactly, only never half an event before its end.

    The gate opens for good (everything passes at once, as without it) when the stream shows it
    is not framed as the SDKs read it: a second ``data`` line before a blank line while the first
    one held a whole JSON value on its own (a server that ends its events with a single line end,
    read line by line by its clients; a value spread over several ``data`` lines is one event and
    stays held), or one event past :data:`GATE_MAX_HELD`. A CR at the end of a read is held until
    the next byte shows whether it starts a CRLF, as in :class:`SSEFramer`. Linear in the bytes
    fed."""

    __slots__ = ("_buf", "_data", "_empty", "_open", "_pos", "_scan")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0  # start of the first line not read yet
        self._scan = 0  # bytes before this were searched for a line end already
        self._empty = True  # the agent's parser holds no field of an unfinished event at _pos
        #: where the unfinished event's first data line is in the buffer (start, end); None: none
        #: yet; (-1, -1): it was read and holds no whole value (the event has several data lines)
        self._data: tuple[int, int] | None = None
        self._open = False

    @property
    def held(self) -> int:
        """Bytes held back (the unfinished event's)."""
        return len(self._buf)

    def feed(self, chunk: bytes) -> bytes:
        """Bytes from the stream; returns those that may go to the agent now."""
        if self._open or (not self._buf and _ends_event(chunk)):
            return chunk  # the common read: whole events, the parser empty before and after it
        buf = self._buf
        buf += chunk
        pos = self._pos
        safe = 0  # bytes before this may go out
        while True:
            found = _line_end(buf, max(pos, self._scan))
            if isinstance(found, int):
                self._scan = found
                break
            eol, nxt = found
            start, pos = pos, nxt
            self._scan = pos
            if start == eol:  # a blank line: the event ends, the parser holds nothing
                self._empty, self._data, safe = True, None, pos
            elif buf[start] == 0x3A:  # a comment line changes nothing in the parser
                if self._empty:
                    safe = pos
            else:
                self._empty = False
                if _is_data(buf, start, eol):
                    if self._data is None:
                        self._data = (start, eol)
                    elif self._data[0] >= 0:  # the event's second data line: read the first once
                        if _whole_json(buf, *self._data):  # one line end between events
                            return self._opened(buf)
                        self._data = (-1, -1)  # one value over several data lines: held
        out = bytes(buf[:safe])
        del buf[:safe]
        self._pos = pos - safe
        self._scan -= safe
        if self._data is not None and self._data[0] >= 0 and safe:  # the event is after what went out
            self._data = (self._data[0] - safe, self._data[1] - safe)
        if len(buf) > GATE_MAX_HELD:
            return out + self._opened(buf)
        return out

    def flush(self) -> bytes:
        """The stream ended as the upstream meant it to: the held bytes, to go out as they are."""
        rest = bytes(self._buf)
        self._reset()
        return rest

    def drop(self) -> int:
        """The stream broke: forget the held bytes (the agent never gets that half event);
        returns how many there were."""
        n = len(self._buf)
        self._reset()
        return n

    def _opened(self, buf: bytearray) -> bytes:
        self._open = True
        rest = bytes(buf)
        self._reset()
        return rest

    def _reset(self) -> None:
        self._buf.clear()
        self._pos = self._scan = 0
        self._empty, self._data = True, None


def _line_end(buf: bytearray, at: int) -> tuple[int, int] | int:
    """The first complete line end in ``buf`` at or after offset ``at``: (where it starts, where
    the next line starts). When there is none yet, the offset the next search resumes from: the
    buffer's end, or a CR at its very end, held until the next byte shows whether it starts a
    CRLF (split across reads). Shared by :class:`SSEFramer` and :class:`EventGate`, which must
    see the same lines."""
    m = _EOL.search(buf, at)
    if m is None:
        return len(buf)
    if m.end() == len(buf) and m.end() - m.start() == 1 and buf[m.start()] == 0x0D:
        return m.start()
    return m.start(), m.end()


def _ends_event(chunk: bytes) -> bool:
    """``chunk`` ends with a blank line whose last line end is an LF (``\n\n``, ``\r\n\r\n``,
    ``\n\r\n``, ``\r\r\n``): read from a line's start, it leaves the parser holding nothing.
    (A CR at the very end could still become a CRLF: left to the scan.)"""
    if len(chunk) < 2 or chunk[-1] != 0x0A:
        return False
    if chunk[-2] == 0x0A:
        return True
    return len(chunk) >= 3 and chunk[-2] == 0x0D and chunk[-3] in (0x0A, 0x0D)


def _is_data(buf: bytearray, start: int, end: int) -> bool:
    """The line ``buf[start:end]`` is a ``data`` field (``data``, ``data:…``)."""
    return buf.startswith(b"data", start) and (end == start + 4 or buf[start + 4] == 0x3A)


def _whole_json(buf: bytearray, start: int, end: int) -> bool:
    """The ``data`` line ``buf[start:end]`` holds a whole JSON object or array on its own."""
    value = bytes(buf[start + 5 : end]).strip()
    if not value.startswith((b"{", b"[")):
        return False
    try:
        orjson.loads(value)
    except orjson.JSONDecodeError:
        return False
    return True
