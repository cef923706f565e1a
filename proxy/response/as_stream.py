"""Non-streaming chat requests sent upstream as streams (``upstream.stream_json_requests``), sans-I/O.

Why: a model server frees its slot when the connection of a *stream* closes, but some keep
generating a non-streamed answer to its end after the client went away (llama-cpp-python 0.3.x
runs it in a worker thread that never looks at the connection: measured, a 3,000-token answer kept
the server busy for 181 s after the agent hung up; the same request streamed stopped within 0.2 s).
With the switch on, loopguard asks for the answer as a stream, reads it through the stream
guard (so the runaway and degenerate-text cuts apply and close the upstream at once, as for any
stream) and gives the agent the one ``chat.completion`` JSON object it asked for.

- :func:`stream_request`: the request body with ``"stream": true`` and, when the body has no
  ``stream_options``, ``"stream_options": {"include_usage": true}`` (so the answer can carry
  ``usage``). Only those bytes change: a ``"stream": false``/``null`` member's value is replaced
  in place, or the members are inserted after the opening brace; nothing else is re-serialized
  (a big integer elsewhere keeps its digits).
- :class:`Assembly`: the (guarded) SSE bytes in, the agent's answer out: the assembled
  completion (:class:`proxy.response.assemble.CompletionAssembler`), or the upstream's own error when the
  stream carried one (``data: {"error": …}``, its bytes as they came), or a 502 when the stream
  stopped short.
- :func:`stream_rejected`: the upstream refused the stream itself (``error.param`` ``stream`` or
  ``stream_options``, as OpenAI answers for a model an unverified organization may not stream):
  the caller sends the original request once more, unchanged. So does an event stream without a
  single event (llama-cpp-python's answer to ``tool_choice: "auto"`` with tools and a stream,
  "Automatic streaming tool choice is not supported", comes as an empty 200 stream):
  :attr:`Assembly.empty`.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from proxy.dialects import jsonbody
from proxy.response.assemble import CompletionAssembler
from proxy.response.sse import SSEFramer

#: Coarse tokens: one bracket, or a run of anything else (strings included, whole) up to the next
#: bracket; used to count the nesting depth between a member and either end of the body.
_COARSE = re.compile(rb'[{}\[\]]|(?:[^"{}\[\]]+|"[^"\\]*(?:\\.[^"\\]*)*")+')
_WS = b" \t\r\n"


def _closes_at(raw: bytes, start: int) -> int:
    """From ``start`` (outside any string, inside the top-level object), where the bracket that
    brings the depth to 0 is, or -1."""
    depth = 1
    for m in _COARSE.finditer(raw, start):
        c = raw[m.start()]
        if c in b"{[":
            depth += 1
        elif c in b"}]":
            depth -= 1
            if depth == 0:
                return m.start()
    return -1


def _depth_at(raw: bytes, end: int) -> int:
    """The nesting depth at ``end`` (outside any string): brackets opened before it minus closed."""
    depth = 0
    for m in _COARSE.finditer(raw, 0, end):
        c = raw[m.start()]
        if c in b"{[":
            depth += 1
        elif c in b"}]":
            depth -= 1
    return depth


def top_level_values(raw: bytes, name: str) -> list[tuple[int, int]]:
    """The byte spans of the values of the members called ``name`` of the top-level object
    ``raw`` (valid JSON), in order. The key is found as written (``"stream"``, not spelled with
    escapes). Whether a match is a top-level member is told by counting brackets between it and
    the nearer end of the body, so a member near either end costs next to nothing."""
    spans: list[tuple[int, int]] = []
    end = _last_brace(raw)
    key = re.compile(rb'"' + re.escape(name.encode()) + rb'"[ \t\r\n]*:[ \t\r\n]*')
    for m in key.finditer(raw):
        if m.start() > 0 and raw[m.start() - 1] == 0x5C:
            continue  # an escaped quote: inside a string
        if m.start() <= end - m.end():
            top = _depth_at(raw, m.start()) == 1
        else:
            top = _closes_at(raw, m.end()) == end
        if not top:
            continue
        spans.append((m.end(), jsonbody.value_end(raw, m.end())))
    return spans


def _last_brace(raw: bytes) -> int:
    """The position of the top-level object's closing brace (the last byte but whitespace)."""
    end = len(raw) - 1
    while end > 0 and raw[end] in _WS:
        end -= 1
    return end


def stream_request(raw: bytes, parsed: bool = False) -> bytes | None:
    """``raw`` with ``"stream": true`` (and ``stream_options.include_usage`` when the body has no
    ``stream_options``), or None when it is not to be converted: not a JSON object, already
    ``"stream": true``, or a ``stream`` value that is neither ``false`` nor ``null``.
    ``parsed``: the caller already knows ``raw`` is a JSON object (the guards read it)."""
    if not parsed:
        try:
            if not isinstance(orjson.loads(raw), dict):
                return None
        except orjson.JSONDecodeError:
            return None
    opening = raw.find(b"{")
    if opening < 0 or raw[:opening].strip(_WS):
        return None
    # A key spelled with escapes ("str\\u0065am") is not looked for: the members are then
    # inserted first, the body's own later one wins (JSON's last member), the upstream answers
    # JSON and that is relayed as any JSON answer.
    spans = top_level_values(raw, "stream") if b'"stream"' in raw else []
    if spans and raw[spans[-1][0] : spans[-1][1]] not in (b"false", b"null"):
        return None  # already a stream, or a value the upstream would have to judge
    has_options = b'"stream_options"' in raw and bool(top_level_values(raw, "stream_options"))
    insert = b"" if spans else b'"stream":true'
    if not has_options:
        insert += (b"," if insert else b"") + b'"stream_options":{"include_usage":true}'
    first = opening + 1
    while first < len(raw) and raw[first] in _WS:
        first += 1
    if insert and raw[first : first + 1] != b"}":
        insert += b","  # members follow
    view = memoryview(raw)
    pieces: list[bytes | memoryview] = [view[: opening + 1], insert]
    pos = opening + 1
    for start, end in spans:
        pieces += [view[pos:start], b"true"]
        pos = end
    pieces.append(view[pos:])
    return b"".join(pieces)


def stream_rejected(status: int, body: bytes) -> bool:
    """The upstream refused to stream this request (a 4xx whose OpenAI-style ``error.param`` is
    ``stream`` or ``stream_options``): worth sending the original, non-streaming request."""
    if not 400 <= status < 500 or len(body) > 65536:
        return False
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    err = obj.get("error") if isinstance(obj, dict) else None
    return isinstance(err, dict) and err.get("param") in ("stream", "stream_options")


class Assembly:
    """The agent's JSON answer from the SSE bytes the stream guard let through (or the upstream's
    bytes as they came, without a guard). Feed with :meth:`feed`, end with :meth:`finish`, then
    read :meth:`answer`."""

    __slots__ = ("_asm", "_framer", "complete", "error", "events", "unreadable")

    def __init__(self) -> None:
        self._framer = SSEFramer()
        self._asm = CompletionAssembler()
        #: ``data:`` events read (0 at the end = an empty stream: :attr:`empty`)
        self.events = 0
        #: the stream said how it ended (``[DONE]`` or a ``finish_reason``)
        self.complete = False
        #: the data of an event that is not a chunk (``{"error": …}``): the answer is that error
        self.error: bytes | None = None
        #: an event that is not JSON at all
        self.unreadable = False

    @property
    def empty(self) -> bool:
        return self.events == 0

    def feed(self, data: bytes) -> None:
        for ev in self._framer.feed(data):
            self._event(ev.data)

    def finish(self) -> None:
        for ev in self._framer.end():  # the last event, when a bare CR that was the last byte ended it
            self._event(ev.data)
        self._framer.finish()  # an unterminated last event is not an event

    def _event(self, data: str | None) -> None:
        if data is None:
            return
        self.events += 1
        if self.error is not None or self.unreadable:
            return
        if data.strip() == "[DONE]":
            self.complete = True
            return
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            self.unreadable = True
            return
        if not isinstance(obj, dict):
            self.unreadable = True
        elif not isinstance(obj.get("choices"), list):
            self.error = data.encode()
        else:
            self._asm.add(obj)
            if any(isinstance(p, dict) and p.get("finish_reason") is not None for p in obj["choices"]):
                self.complete = True

    def answer(self) -> tuple[int, bytes] | None:
        """(status, JSON body) for the agent; None when the stream stopped short (no
        ``finish_reason``, no ``[DONE]``) or could not be read: the caller answers 502."""
        if self.error is not None:
            return error_status(self.error), self.error
        if self.unreadable or not self.complete:
            return None
        return 200, orjson.dumps(self._asm.result())


def error_status(body: bytes) -> int:
    """The status for an error event's body: its ``error.code`` (or ``code``/``status``) when
    that is an HTTP error status, else 502 (the upstream failed after it had said 200)."""
    try:
        obj: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return 502
    candidates: list[Any] = []
    if isinstance(obj, dict):
        err = obj.get("error")
        if isinstance(err, dict):
            candidates += [err.get("code"), err.get("status")]
        candidates += [obj.get("code"), obj.get("status")]
    for c in candidates:
        if isinstance(c, int) and not isinstance(c, bool) and 400 <= c <= 599:
            return c
    return 502
