"""A JSON request body as bytes: read it even where orjson cannot, and edit it in place.

Reading (:func:`decode`): orjson first (fast); what orjson refuses but is still JSON is read with
the standard library: lone surrogates written as escapes (``"\\udcff"``, which
Python's ``json.dumps`` produces), numbers beyond float range (``1e400`` reads as ``inf``).
Nesting deeper than either decoder's limit (orjson: 1,024 levels; ``json``: about 1,000) is read
member by member: a top-level member too deep to decode becomes :data:`TOO_DEEP` (the guards never
read ``tools`` or ``metadata``), a too-deep value inside ``messages`` makes the body unreadable.
``NaN``, ``Infinity`` and ``-Infinity`` are not JSON (RFC 8259 §6) but Python's ``json.dumps``
writes them by default (``allow_nan=True``), so an agent written in Python may send them
(``"temperature": NaN``, a tool result holding ``-Infinity``): they are read as ``json.loads``
reads them (float ``nan``, ``inf``, ``-inf``), and since a rewrite splices bytes they reach the
upstream as the agent wrote them.

Editing (:func:`splice`): the body that goes upstream is the original bytes with only the edited
spans replaced. Re-serializing a decoded body would change what the guards never
touched: integers past 64 bits became floats, number text (``1.0``, ``1E5``) and whitespace were
rewritten. :func:`value_end`, :func:`members` and :func:`items` find byte spans with a few regular
expressions and a bracket counter, no recursion (no depth limit). They assume valid JSON: call them
only on bytes :func:`decode` accepted. Written here because no maintained library reports byte
offsets of JSON values.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import orjson

from proxy.errors import DialectError

#: Stands for a top-level member nested too deep to decode (see :func:`decode`).
TOO_DEEP: Any = type("TooDeep", (), {"__repr__": lambda self: "TOO_DEEP"})()

_WS = re.compile(rb"[ \t\n\r]*")
#: A JSON string literal, unrolled so long runs of plain characters cost one step.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
_SCALAR = re.compile(rb"[^\s,\]}]+")
_AFTER_VALUE = frozenset((b"", b" ", b"\t", b"\n", b"\r", b",", b"]", b"}"))
_NO_HINT: Any = object()


class Unreadable(DialectError):
    """The body is not JSON the guards can read. ``reason``: ``not_json`` (not JSON at all, not
    UTF-8), ``nesting`` (a message nested past every decoder's limit)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _stdlib(raw: bytes | str) -> Any:
    # JSON is UTF-8 (RFC 8259 §8.1): bytes are decoded strictly as such, so a UTF-16/32 body or
    # one starting with a BOM is not JSON here (json.loads would guess the encoding, and byte
    # offsets would no longer match what it read)
    text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    return json.loads(text)  # NaN / Infinity / -Infinity read as floats (module docstring)


def decode(raw: bytes | str) -> Any:
    """Decode a JSON document. Returns the value (dicts, lists, str, int, float, bool, None;
    top-level members too deep to decode are :data:`TOO_DEEP`).

    Raises :class:`Unreadable` (``not_json`` or ``nesting``).
    """
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:
        return _stdlib(raw)
    except RecursionError:
        pass
    except ValueError as exc:  # includes UnicodeDecodeError
        raise Unreadable("not_json") from exc
    return _decode_members(raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass"))


def _decode_deep(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _stdlib(raw)


def _decode_members(raw: bytes) -> Any:
    """Decode a document too deep for both decoders, one top-level member at a time."""
    start = _WS.match(raw).end()
    if raw[start : start + 1] != b"{":
        raise Unreadable("nesting")
    out: dict[str, Any] = {}
    for key, (vs, ve) in members(raw, start).items():
        try:
            out[key] = _decode_deep(raw[vs:ve])
        except RecursionError:
            if key == "messages":
                raise Unreadable("nesting") from None
            out[key] = TOO_DEEP
        except ValueError as exc:
            raise Unreadable("not_json") from exc
    return out


def _key(buf: bytes, start: int, end: int) -> str:
    """The member key whose string literal spans ``buf[start:end]`` (quotes included). Without a
    backslash a JSON string is its UTF-8 bytes between the quotes (RFC 8259 §7: control
    characters must be escaped, and the bytes were accepted by a decoder), so only keys with an
    escape pay for a JSON decode."""
    inner = buf[start + 1 : end - 1]
    if b"\\" not in inner:
        return inner.decode("utf-8", "surrogatepass")
    return str(json.loads(buf[start:end]))


def _skip_ws(buf: bytes, i: int) -> int:
    return _WS.match(buf, i).end()


def value_end(buf: bytes, start: int, hint: Any = _NO_HINT) -> int:
    """End offset (exclusive) of the JSON value that begins at byte ``start`` (no whitespace).

    ``hint``: the decoded value, when known. Its compact orjson form is compared with the bytes at
    ``start`` first (agents' serializers — JavaScript's ``JSON.stringify``, serde_json, httpx —
    write what orjson writes), which costs a memory compare instead of a scan: 20 MB of messages
    in about 50 ms instead of 500. A hint that does not match costs nothing but the compare.
    """
    if hint is not _NO_HINT:
        try:
            text = orjson.dumps(hint)
        except (TypeError, orjson.JSONEncodeError):
            text = b""
        end = start + len(text)
        if text and buf.startswith(text, start) and buf[end : end + 1] in _AFTER_VALUE:
            return end
    first = buf[start : start + 1]
    if first == b'"':
        return _STRING.match(buf, start).end()
    if first not in (b"{", b"["):
        return _SCALAR.match(buf, start).end()
    depth = 0
    for m in _TOKEN.finditer(buf, start):
        tok = m.group()
        if tok in (b"{", b"["):
            depth += 1
        elif tok in (b"}", b"]"):
            depth -= 1
            if depth == 0:
                return m.end()
    raise ValueError(f"unterminated value at byte {start}")


def _members(buf: bytes, start: int, hints: Any, until: str | None = None) -> Iterator[tuple[str, int, int]]:
    """(key, value start, value end) of each member; stops before reading the value of ``until``
    (its end is then -1)."""
    i = _skip_ws(buf, start + 1)
    if buf[i : i + 1] == b"}":
        return
    while True:
        ke = _STRING.match(buf, i).end()
        key = _key(buf, i, ke)
        i = _skip_ws(buf, ke)
        i = _skip_ws(buf, i + 1)  # the colon
        if key == until:
            yield key, i, -1
            return
        hint = hints.get(key, _NO_HINT) if isinstance(hints, dict) else _NO_HINT
        ve = value_end(buf, i, hint)
        yield key, i, ve
        i = _skip_ws(buf, ve)
        if buf[i : i + 1] == b"}":
            return
        i = _skip_ws(buf, i + 1)  # the comma


def members(buf: bytes, start: int, hints: Any = None) -> dict[str, tuple[int, int]]:
    """Members of the object whose ``{`` is at byte ``start``: key → (value start, value end).
    A repeated key keeps its last span (as decoders keep the last value). ``hints``: the decoded
    object (see :func:`value_end`)."""
    return {key: (vs, ve) for key, vs, ve in _members(buf, start, hints)}


def member_start(buf: bytes, start: int, key: str, hints: Any = None) -> int | None:
    """Offset of the value of the first member ``key`` of the object at ``start`` (that value and
    the members after it are not read), or None. A key given twice is found at its first place,
    where decoders keep the last value: edits there are then ignored by the upstream, never
    misplaced."""
    for k, vs, _ in _members(buf, start, hints, until=key):
        if k == key:
            return vs
    return None


def items(buf: bytes, start: int, hints: Any = None, count: int | None = None) -> list[tuple[int, int]]:
    """Spans (start, end) of the elements of the array whose ``[`` is at byte ``start``; only the
    first ``count`` when given. ``hints``: the decoded list (see :func:`value_end`)."""
    out: list[tuple[int, int]] = []
    i = _skip_ws(buf, start + 1)
    if buf[i : i + 1] == b"]" or count == 0:
        return out
    known = len(hints) if isinstance(hints, list) else 0
    while True:
        end = value_end(buf, i, hints[len(out)] if len(out) < known else _NO_HINT)
        out.append((i, end))
        if count is not None and len(out) >= count:
            return out
        i = _skip_ws(buf, end)
        if buf[i : i + 1] == b"]":
            return out
        i = _skip_ws(buf, i + 1)


def items_after(buf: bytes, end: int, hints: Any = None) -> tuple[list[tuple[int, int]], int]:
    """Spans of the elements that follow the array element ending at byte ``end`` (exclusive),
    and the offset just past the array's ``]``. ``hints``: those elements decoded (see
    :func:`value_end`). Raises ValueError when no ``,`` or ``]`` follows an element."""
    out: list[tuple[int, int]] = []
    known = len(hints) if isinstance(hints, list) else 0
    i = _skip_ws(buf, end)
    while buf[i : i + 1] == b",":
        i = _skip_ws(buf, i + 1)
        e = value_end(buf, i, hints[len(out)] if len(out) < known else _NO_HINT)
        out.append((i, e))
        i = _skip_ws(buf, e)
    if buf[i : i + 1] != b"]":
        raise ValueError(f"no array end at byte {i}")
    return out, i + 1


def keys_after(buf: bytes, end: int, hints: Any = None) -> list[str]:
    """Keys of the members that follow the member value ending at byte ``end`` (exclusive) in
    an object, in order, repeats kept. ``hints``: the decoded object (see :func:`value_end`)."""
    out: list[str] = []
    i = _skip_ws(buf, end)
    while buf[i : i + 1] == b",":
        i = _skip_ws(buf, i + 1)
        ke = _STRING.match(buf, i).end()
        key = _key(buf, i, ke)
        out.append(key)
        i = _skip_ws(buf, _skip_ws(buf, ke) + 1)  # the colon
        hint = hints.get(key, _NO_HINT) if isinstance(hints, dict) else _NO_HINT
        i = _skip_ws(buf, value_end(buf, i, hint))
    return out


def root(buf: bytes) -> int:
    """Offset of the first byte of the document's top-level value."""
    return _skip_ws(buf, 0)


def kept(data: bytes) -> bytes:
    """``data`` in a bytes object of its own size, for bytes kept past the request (a cache's or
    store's record). orjson's ``dumps`` hands back its output buffer as it grew it: at least
    4 KiB whatever the length (a 300-byte result holds 4,096; 5,000 bytes hold about 56 KiB,
    measured with ``tracemalloc`` on orjson 3.13), while ``sys.getsizeof`` and ``len`` say the
    length. A slice or a concatenation is already its own size; this copies once."""
    return memoryview(data).tobytes()


def dumps(value: Any, default: Callable[[Any], Any] | None = None) -> bytes:
    """Compact JSON of ``value`` (orjson's bytes); when it holds a string with a lone surrogate,
    the standard library's, ASCII only (surrogates as ``\\u`` escapes). ``default`` as in both."""
    try:
        return orjson.dumps(value, default=default)
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=True, default=default).encode()


def splice(buf: bytes, edits: Iterable[tuple[int, int, bytes]]) -> bytes:
    """``buf`` with each ``(start, end, replacement)`` span replaced. Spans must not overlap;
    an insertion is ``(at, at, bytes)``. Edits at the same offset keep their given order (the
    sort is stable). The unedited runs are views of ``buf``, copied once, by the join: a 5 MB
    history with a thousand withheld results was copied twice before (its runs sliced, then
    joined), about 5 ms of the request."""
    ordered = sorted(edits, key=_start)
    view = memoryview(buf)
    parts: list[bytes | memoryview] = []
    pos = 0
    for start, end, replacement in ordered:
        if start < pos:
            raise ValueError(f"overlapping edit at byte {start}")
        parts.append(view[pos:start])
        parts.append(replacement)
        pos = end
    parts.append(view[pos:])
    return b"".join(parts)


_start = operator.itemgetter(0)
