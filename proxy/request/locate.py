"""Locate the messages: a request body as an object, and where its history's bytes are.

The first stage of :func:`proxy.request.rewrite.decide_request`. Two ways to the same answer:

- **Decoded whole** (:func:`proxy.dialects.jsonbody.decode`): every body below
  :data:`proxy.request.prefix_cache.FAST_MIN` bytes, and every body no kept prefix starts. With
  the prefix cache on, the offset of the history's ``[`` and the offered tools are found too, for
  :mod:`proxy.request.read` to resume a kept prefix there.
- **Found by bytes** (:class:`Resume`): a body that starts, byte for byte, with the head and
  history of a kept prefix (one of the ``candidates`` the cache handed back by the digest of the
  body's first bytes, any conversation key: the decisions are a function of the bytes) is not
  decoded whole. Only the kept head, a sentinel ``0`` for the kept items and what follows them are
  decoded: O(head + new bytes). A body that must be read in full (the rest not JSON orjson reads,
  the history member not a list or given again after it, other offered tools) is decoded whole.

Nothing here keeps or counts anything: the cache only handed its entries in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.dialects import Dialect, jsonbody, text_calls
from proxy.request.prefix_cache import Prefix, Span

#: Why a body is not guarded (``RequestDecision.unguarded``): JSON that is not a chat request the
#: dialect reads (not an object here; the read stage's :class:`proxy.errors.DialectError`).
NOT_CHAT = "not_chat"


def tools_key(tools: Any) -> bytes | None:
    """Compact JSON of a request's offered tools (:func:`proxy.dialects.text_calls.offered_tools`,
    None: ``null``), what a kept prefix holds of them (:attr:`Prefix.tools`); None when they cannot
    be written (nested too deep), and the request is then read in full and not kept."""
    try:
        return jsonbody.kept(jsonbody.dumps(tools))  # kept in the entry: its own size
    except (RecursionError, TypeError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class Point:
    """Where a request resumes a kept entry: its first ``n`` items (``length`` bytes from the
    history's ``[``), the parse state after them (``fold``, copied before feeding), the
    fingerprint items among them (``key_items``), and what the entry kept one item earlier
    (``before``, ``key_before``; None when ``n`` is not the entry's whole history)."""

    n: int
    length: int
    fold: Any
    key_items: tuple[Any, ...]
    before: Any
    key_before: tuple[Any, ...]

    def spans(self, entry: Prefix, start: int) -> list[Span]:
        """The first ``n`` kept items' spans in a body whose history's ``[`` is at ``start``."""
        if entry.absolute and start == len(entry.head):
            return list(entry.absolute[: self.n])
        return [(start + s, start + e) for s, e in entry.spans[: self.n]]


def point(raw: bytes, start: int, entry: Prefix) -> Point | None:
    """The longest kept prefix of ``entry`` that ``raw``'s history (its ``[`` at ``start``)
    starts with, byte for byte: every kept item, or every one but the last (then the entry's
    ``before`` state resumes); None: neither."""
    if raw.startswith(entry.items, start):
        n = len(entry.spans)
        return Point(n, len(entry.items), entry.fold, entry.key_items, entry.before, entry.key_before)
    if entry.before is None or len(entry.spans) < 2:
        return None
    length = entry.spans[-2][1]
    if not raw.startswith(entry.items[:length], start):
        return None
    return Point(len(entry.spans) - 1, length, entry.before, entry.key_before, None, ())


@dataclass(frozen=True, slots=True)
class Resume:
    """A kept prefix a body starts with, found by its bytes: the kept ``entry``, where the body
    resumes it (``at``: every kept item, or every one but the last), the ``new`` items after it
    decoded and their byte ``tail`` spans, and the request's offered ``tools`` (their
    :func:`tools_key` is the entry's)."""

    entry: Prefix
    at: Point
    new: list[Any]
    tail: list[Span]
    tools: Any

    @property
    def start(self) -> int:
        """Offset of the history's ``[`` in the body."""
        return len(self.entry.head)


@dataclass(frozen=True, slots=True)
class Located:
    """What :func:`locate` found. ``body``: the body as an object (found by bytes: its history
    member holds only the new items). ``model``/``stream``: from the body (None when not a string
    / a bool). ``resume``: the kept prefix found by bytes (None: decoded whole). Decoded whole
    with the prefix cache on: ``start``, the offset of the history's ``[`` (None: no history
    list to resume, read in full), with the offered ``tools`` and their ``offered``
    :func:`tools_key`."""

    body: dict[str, Any]
    model: str | None
    stream: bool | None
    resume: Resume | None = None
    start: int | None = None
    tools: Any = None
    offered: bytes | None = None

    def key_body(self, member: str) -> dict[str, Any]:
        """A body whose conversation key is the whole body's: found by bytes, the kept
        fingerprint items and the new ones (:func:`proxy.request.conversation.fingerprint_items`)."""
        if self.resume is None:
            return self.body
        return {**self.body, member: [*self.resume.at.key_items, *self.resume.new]}


def _by_bytes(raw: bytes, member: str, candidates: Iterable[Prefix]) -> tuple[dict[str, Any], Resume] | None:
    """The first of ``candidates`` whose head and history bytes start ``raw``, and ``raw`` decoded
    after it (module doc); None: none, or ``raw`` must be decoded whole."""
    for entry in candidates:
        start = len(entry.head)
        at = point(raw, start, entry) if raw.startswith(entry.head) else None
        if at is None:
            continue
        cut = start + at.length
        try:
            doc = orjson.loads(b"".join((entry.head, b"[0", raw[cut:])))
        except orjson.JSONDecodeError:
            return None
        if not isinstance(doc, dict):
            return None
        listed = doc.get(member)
        if not (isinstance(listed, list) and listed and type(listed[0]) is int and listed[0] == 0):
            return None
        new = listed[1:]
        try:
            tail, end = jsonbody.items_after(raw, cut, new)
        except ValueError:
            return None
        if len(tail) != len(new) or member in jsonbody.keys_after(raw, end, doc):
            return None
        tools = text_calls.offered_tools(doc)
        if tools_key(tools) != entry.tools:
            return None
        doc[member] = new
        return doc, Resume(entry, at, new, tail, tools)
    return None


def _history(raw: bytes, body: dict[str, Any], member: str) -> tuple[int, Any, bytes] | None:
    """The offset of the history's ``[``, the offered tools and their :func:`tools_key`, or None
    when there is no history list to resume (missing, not a list, not found) or the tools cannot
    be written."""
    if not isinstance(body.get(member), list):
        return None
    start = jsonbody.member_start(raw, jsonbody.root(raw), member, body)
    if start is None or raw[start : start + 1] != b"[":
        return None
    tools = text_calls.offered_tools(body)
    offered = tools_key(tools)
    if offered is None:
        return None
    return start, tools, offered


def locate(
    raw: bytes,
    dialect: Dialect,
    candidates: Sequence[Prefix] = (),
    *,
    history: bool = False,
    whole: Callable[[dict[str, Any]], bool] | None = None,
) -> Located | str:
    """The body ``raw`` as a :class:`Located`, or why it cannot be guarded: the
    :class:`proxy.dialects.jsonbody.Unreadable` reason of a body that is not JSON,
    :data:`NOT_CHAT` for JSON that is not an object.

    ``candidates``: kept prefixes ``raw`` may start with (module doc); ``whole(body)`` True
    refuses the one found (the Responses chain stage's rule,
    :func:`proxy.request.chain.reads_whole`). ``history``: find the history's ``[`` and the offered
    tools when decoded whole (the prefix cache is on)."""
    member: str | None = getattr(dialect, "ITEMS", None)
    foldable = member is not None and hasattr(dialect, "Fold")  # a dialect without a fold: read in full
    found = _by_bytes(raw, member, candidates) if candidates and foldable and member is not None else None
    if found is not None and whole is not None and whole(found[0]):
        found = None
    if found is not None:
        body: Any = found[0]
    else:
        try:
            body = jsonbody.decode(raw)
        except jsonbody.Unreadable as exc:
            return exc.reason
        if not isinstance(body, dict):
            return NOT_CHAT
    model = body.get("model") if isinstance(body.get("model"), str) else None
    stream = body.get("stream") if isinstance(body.get("stream"), bool) else None
    if found is not None:
        return Located(body, model, stream, found[1])
    where = _history(raw, body, member) if history and foldable and member is not None else None
    if where is None:
        return Located(body, model, stream)
    return Located(body, model, stream, None, *where)
