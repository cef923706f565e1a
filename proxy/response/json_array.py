"""Incremental framer for a JSON array that streams: bytes in, its elements out, each with its exact
raw bytes (the interface of :class:`proxy.response.sse.SSEFramer`, so a stream guard reads it as it
reads events).

Gemini's ``:streamGenerateContent`` without ``alt=sse`` answers one JSON array whose elements are
the same ``GenerateContentResponse`` objects the SSE form carries one per event, written as they
are generated: ``[{…}\\n,\\r\\n{…}\\n]`` (https://ai.google.dev/api/generate-content). Each element
is an *event* here: ``raw`` is every byte since the previous element ended (the ``[`` or ``,`` and
the whitespace before the object) through the object's closing brace, ``data`` the object's text.
What follows the last element (``\\n]``) is never an event: :meth:`JSONArrayFramer.finish` returns
it. Concatenating every ``raw`` and the ``finish()`` tail gives back exactly the input, whatever the
read boundaries.

An element is found by counting brackets outside strings (a backslash escapes the next byte inside
a string), so reads may split anywhere, inside a string or an escape included; the object itself is
decoded by the caller. A byte the array grammar does not allow where it stands (an element that is
not an object, text after the closing bracket, no ``[`` first) ends the framing: every byte held
and received from then on is one last event whose ``data`` is ``""`` (which no JSON reader takes),
and every later read is one more such event, so the caller relays the rest as it came.
"""

from __future__ import annotations

import re

from proxy.response.sse import SSEEvent

_SPECIAL = re.compile(rb'["\\{}\[\]]')
_IN_STRING = re.compile(rb'["\\]')
_WS = frozenset(b" \t\r\n")


class JSONArrayFramer:
    """Incremental framer; one instance per stream. :attr:`pending` is how many bytes of an
    unfinished element (and the separator before it) it holds."""

    __slots__ = ("_buf", "_depth", "_elem", "_scan", "_state", "_string")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._scan = 0  # bytes of _buf before this are read
        self._state = "open"  # | "first" (after [) | "next" (after an element) | "expect" (after ,)
        # | "element" | "closed" (after ]) | "broken"
        self._depth = 0
        self._string = False
        self._elem = 0  # where the element being read starts in _buf

    @property
    def pending(self) -> int:
        return len(self._buf)

    @property
    def closed(self) -> bool:
        """The array's closing bracket has come (the stream said it is whole)."""
        return self._state == "closed"

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Add bytes from the stream; returns the elements completed by them, in order."""
        if self._state == "broken":
            return [SSEEvent(bytes(chunk), "")] if chunk else []
        buf = self._buf
        buf += chunk
        out: list[SSEEvent] = []
        start = 0  # where the current event's raw bytes start in buf
        i = self._scan
        n = len(buf)
        while i < n:
            if self._state == "element":
                if self._string:
                    m = _IN_STRING.search(buf, i)
                    if m is None:
                        i = n
                        break
                    if buf[m.start()] == 0x5C:  # a backslash: the next byte is escaped
                        if m.start() + 1 >= n:
                            i = m.start()
                            break  # wait for the escaped byte
                        i = m.start() + 2
                        continue
                    self._string = False
                    i = m.end()
                    continue
                m = _SPECIAL.search(buf, i)
                if m is None:
                    i = n
                    break
                c = buf[m.start()]
                i = m.end()
                if c == 0x22:
                    self._string = True
                elif c in (0x7B, 0x5B):
                    self._depth += 1
                elif c == 0x5C:
                    pass  # a backslash outside a string: the decoder refuses the element
                else:
                    self._depth -= 1
                    if self._depth == 0:
                        data = bytes(buf[self._elem : i]).decode("utf-8", "replace")
                        out.append(SSEEvent(bytes(buf[start:i]), data))
                        start = i
                        self._state = "next"
                continue
            c = buf[i]
            if c in _WS:
                i += 1
                continue
            state = self._state
            if state == "open" and c == 0x5B:
                self._state = "first"
            elif state == "next" and c == 0x2C:
                self._state = "expect"
            elif state in ("first", "next") and c == 0x5D:
                self._state = "closed"
            elif state in ("first", "expect") and c == 0x7B:
                self._state, self._depth, self._string, self._elem = "element", 1, False, i
            else:
                self._state = "broken"
                out.append(SSEEvent(bytes(buf[start:]), ""))
                buf.clear()
                self._scan = 0
                return out
            i += 1
        if start:
            del buf[:start]
            i -= start
            self._elem -= start
        self._scan = i
        return out

    def end(self) -> list[SSEEvent]:
        """The stream ended: no element is completed by the end itself (the SSE framer's
        interface)."""
        return []

    def finish(self) -> bytes:
        """The stream ended: the bytes after the last element (the closing bracket), or of an
        unfinished element."""
        rest = bytes(self._buf)
        self._buf.clear()
        self._scan = 0
        return rest
