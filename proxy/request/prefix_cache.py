"""What the previous request of a conversation established, so the next one reads only its new
messages (issue 15).

An agent sends its whole history on every step: each request is the previous one plus one step.
Without this module every request re-reads the transcript of its whole history and re-finds the
byte span of every message (the span finding of :func:`proxy.dialects.jsonbody.items`: an
``orjson.dumps`` and a compare per message), so the cost of a request grows with its history.
:class:`PrefixCache` keeps, per conversation (DESIGN §4 key) and dialect, the bytes of the
previous request's history (from the ``[`` of its ``messages`` / ``input`` through its last item),
each item's byte span, and the dialect's parse state after the last item (its ``Fold``,
:mod:`proxy.dialects`). :func:`read` checks a request against it with one ``bytes.startswith``:
when the history begins with exactly those bytes, the transcript resumes from the kept state
and only the new items are read and spanned.

The parse state also depends on the request's offered ``tools``: calls written as text are read
only for offered names, their values typed by the offered schemas
(:mod:`proxy.dialects.text_calls`). An entry keeps the offered tools (as compact JSON of
:func:`proxy.dialects.text_calls.offered_tools`), and a request resumes from it only when it
offers exactly those; ``tool_choice`` is always the request's own.

Decisions never depend on it (DESIGN principle 2): a miss (the first request, a restart,
another replica, an edited or compacted history, other whitespace or key order, an evicted
entry) reads the whole history, and both ways give the same transcript and the same spans
(``tests/unit/request/test_prefix_cache.py`` replays every fixture both ways). The guards still run over
the whole transcript. A body whose history member is given twice, or is not a list, is always
read in full and never kept.

The edits a request's actions made before its guards' cut (:func:`proxy.guards.resume.cut`) are
kept with its entry (:meth:`PrefixCache.keep_edits`, :class:`proxy.dialects.edits.Kept`): the
next request, when it resumes that entry and its enforced actions before that cut are the same
ones, reuses them and writes only the actions at or after the cut (:func:`apply_edits`; the
upstream bytes are those of a full apply either way), in every dialect.

Bounded memory: entries are dropped least recently used first once their bytes pass
``max_bytes``. An entry counts :data:`HISTORY_FACTOR` times its history's JSON bytes (the bytes
and the decoded texts of its parse state), :data:`CALL_BYTES` per tool call and
:data:`ITEM_BYTES` per item (the parse state, the spans), its head and fingerprint items, and
once the guards' checkpoint is attached (:meth:`PrefixCache.keep_checkpoint`)
:data:`CHECKPOINT_CALL_BYTES` per call and :data:`ACTION_BYTES` per kept action, and its kept
edits' bytes (:attr:`proxy.dialects.edits.Kept.size`). Measured with
``tracemalloc`` on ``bench/workloads.memory_body`` (1,000 conversations x 10 requests, 32 MiB):
what the cache holds is 49.5 MB traced for 33.5 MB counted with the old count (1.48x; the
checkpoints 5.2 KB each, uncounted), 32.5 MB for 33.5 MB counted with this one; the process's
RSS growth over the run went from +67.7 MB to +52.1 MB (+18.4 MB with the cache off). Not
thread-safe: the server calls it from its event loop.

Fast path (:func:`find`, :func:`resume`): a body of :data:`FAST_MIN` bytes or more is looked up
before it is decoded, by the digest of its first :data:`HEAD_BYTES` bytes, and only the kept
head, a sentinel for the kept items and the bytes after them are decoded; the conversation key
is computed over the kept fingerprint items and the new ones
(:func:`proxy.request.conversation.fingerprint_items`), and the kept items an action edits are
decoded from their spans (:func:`full_body`).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.core.actions import Action
from proxy.core.transcript import Transcript
from proxy.dialects import Dialect, jsonbody, text_calls
from proxy.guards.resume import cut
from proxy.request.conversation import fingerprint_items

Span = tuple[int, int]
#: Bytes an entry counts per tool call of its history (the parse state's call record, its decoded
#: arguments, its result) and per item (its span, its said record), beyond the history's bytes.
CALL_BYTES = 2048
ITEM_BYTES = 384
#: Times an entry counts its history's bytes: the bytes, and the decoded texts its parse state
#: holds (results, what was said, call arguments).
HISTORY_FACTOR = 2
#: Bodies of at least this many bytes are looked up without decoding them first (:func:`find`);
#: smaller ones are decoded whole (a decode costs less than the look-up there).
FAST_MIN = 64 * 1024
#: The bytes of a body's start whose digest indexes the entries for :func:`find`.
HEAD_BYTES = 4096


#: Bytes a kept guards' checkpoint counts per tool call before its cut and per action it holds.
CHECKPOINT_CALL_BYTES = 384
ACTION_BYTES = 256


def entry_size(history_bytes: int, calls: int, items: int) -> int:
    """What an entry counts against the budget (bytes): see the module docstring."""
    return HISTORY_FACTOR * history_bytes + CALL_BYTES * calls + ITEM_BYTES * items


def checkpoint_size(checkpoint: Any, calls: int) -> int:
    """What the guards' ``checkpoint`` (:class:`proxy.guards.resume.Checkpoint`) of a history
    with ``calls`` tool calls counts against the budget (bytes): see the module docstring."""
    actions = sum(len(a) for a in getattr(checkpoint, "actions", ()))
    return CHECKPOINT_CALL_BYTES * calls + ACTION_BYTES * actions


@dataclass(frozen=True, slots=True)
class Prefix:
    """One conversation's kept history. ``items``: the body's bytes from the history's ``[``
    through the end of its last item. ``spans``: each item's (start, end), relative to that
    ``[``. ``fold``: the dialect's parse state after the last item (never fed again: copied
    before resuming). ``size``: what it counts against the budget. ``tools``: the offered tools
    that state was read against (:func:`tools_key`). ``checkpoint``: what the guards kept of it."""

    items: bytes
    spans: tuple[Span, ...]
    fold: Any
    size: int
    tools: bytes = b"null"
    #: the guards' checkpoint of this history (:class:`proxy.guards.resume.Checkpoint`), once
    #: they have run over it (:meth:`PrefixCache.keep_checkpoint`)
    checkpoint: Any = None
    #: the body's bytes before the history's ``[`` (for :func:`find`)
    head: bytes = b""
    #: the history items the conversation key's fingerprint reads, decoded
    #: (:func:`proxy.request.conversation.fingerprint_items`)
    key_items: tuple[Any, ...] = ()
    #: the digest of the body's first :data:`HEAD_BYTES` bytes, when they are all in ``head`` and
    #: ``items`` (None: not indexed for :func:`find`)
    digest: int | None = None
    #: the edits its request made before its cut (:class:`proxy.dialects.edits.Kept`), once
    #: made (:meth:`PrefixCache.keep_edits`); counted in ``size``
    edits: Any = None
    #: the parse state after every item but the last, and the fingerprint items of those: a
    #: request whose history starts with them and changes only the last kept item resumes there
    #: (Claude Code moves its ``cache_control`` marker off the previous last message on every
    #: request); None: no such point (one item)
    before: Any = None
    key_before: tuple[Any, ...] = ()
    #: ``spans`` plus ``len(head)``: the items' spans in the body itself, reused as they are by a
    #: request whose history starts at the same byte
    absolute: tuple[Span, ...] = ()


@dataclass(slots=True)
class Stats:
    """Counters for ``GET /loop-guard`` and ``/loop-guard/metrics``: ``hits`` (requests that resumed a
    kept prefix), ``misses`` (requests read in full with the cache on), ``evictions`` (entries
    dropped for the budget), ``bytes`` and ``entries`` (kept now), ``fast_hits`` (hits found
    before the body was decoded, :func:`find`), ``edit_hits`` (requests that reused the previous
    request's edits, :func:`apply_edits`)."""

    hits: int = 0
    misses: int = 0
    #: hits found by :func:`find` (the body never decoded whole); also counted in ``hits``
    fast_hits: int = 0
    evictions: int = 0
    bytes: int = 0
    entries: int = 0
    edit_hits: int = 0


class PrefixCache:
    """Kept prefixes by (dialect path suffix, conversation key), least recently used dropped first
    once their sizes pass ``max_bytes`` (bytes; > 0). An entry larger than the budget alone is not
    kept. Entries are also indexed by (dialect, digest of the body's first :data:`HEAD_BYTES`
    bytes), for :func:`find`; one digest may index several conversations (sessions of one agent
    share a system prompt)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be > 0")
        self.max_bytes = max_bytes
        self.stats = Stats()
        self._entries: OrderedDict[tuple[str, str], Prefix] = OrderedDict()
        #: (dialect, digest) -> the keys of the entries with that digest, most recently kept last
        self._heads: dict[tuple[str, int], dict[str, None]] = {}

    def get(self, dialect: str, key: str) -> Prefix | None:
        """The kept prefix of a conversation (now the most recently used), or None."""
        entry = self._entries.get((dialect, key))
        if entry is not None:
            self._entries.move_to_end((dialect, key))
        return entry

    def candidates(self, dialect: str, raw: bytes) -> list[Prefix]:
        """The entries indexed by the digest of ``raw``'s first :data:`HEAD_BYTES` bytes, most
        recently kept first (not yet checked against ``raw``)."""
        bucket = self._heads.get((dialect, hash(raw[:HEAD_BYTES])))
        if not bucket:
            return []
        return [self._entries[(dialect, key)] for key in reversed(bucket)]

    def _unindex(self, dialect: str, key: str, entry: Prefix) -> None:
        if entry.digest is None:
            return
        bucket = self._heads.get((dialect, entry.digest))
        if bucket is not None:
            bucket.pop(key, None)
            if not bucket:
                del self._heads[(dialect, entry.digest)]

    def put(self, dialect: str, key: str, entry: Prefix) -> None:
        """Keep ``entry`` for a conversation (replacing what it had), then drop the least recently
        used entries until the budget holds."""
        old = self._entries.pop((dialect, key), None)
        if old is not None:
            self.stats.bytes -= old.size
            self._unindex(dialect, key, old)
        if entry.size <= self.max_bytes:
            self._entries[(dialect, key)] = entry
            self.stats.bytes += entry.size
            if entry.digest is not None:
                self._heads.setdefault((dialect, entry.digest), {})[key] = None
        self._trim()

    def _trim(self) -> None:
        while self.stats.bytes > self.max_bytes:
            (d, k), dropped = self._entries.popitem(last=False)
            self._unindex(d, k, dropped)
            self.stats.bytes -= dropped.size
            self.stats.evictions += 1
        self.stats.entries = len(self._entries)

    def keep_checkpoint(self, dialect: str, key: str, entry: Prefix, checkpoint: Any) -> None:
        """Attach the guards' ``checkpoint`` to ``entry`` when it is still the conversation's kept
        prefix (another request may have replaced it since); it then counts
        :func:`checkpoint_size` more (and may push out older entries)."""
        if checkpoint is not None and self._entries.get((dialect, key)) is entry:
            grown = entry.size + checkpoint_size(checkpoint, len(entry.fold.calls))
            self.put(dialect, key, dataclasses.replace(entry, checkpoint=checkpoint, size=grown))

    def keep_edits(self, dialect: str, key: str, entry: Prefix, edits: Any) -> None:
        """Attach the request's ``edits`` (:class:`proxy.dialects.edits.Kept`) to ``entry`` when
        it is still the conversation's kept prefix (the entry its request put, or that entry with
        its checkpoint attached: the same ``fold``), counting their bytes; dropped when the entry
        would pass the budget alone."""
        current = self._entries.get((dialect, key))
        if edits is None or current is None or current.fold is not entry.fold:
            return
        old = current.edits.size if current.edits is not None else 0
        size = current.size - old + edits.size
        if size > self.max_bytes:
            return
        self._entries[(dialect, key)] = dataclasses.replace(current, edits=edits, size=size)
        self.stats.bytes += size - current.size
        self._trim()

    def clear(self) -> None:
        """Drop every entry (as a restart does; the counters stay)."""
        self._entries.clear()
        self._heads.clear()
        self.stats.bytes = 0
        self.stats.entries = 0

    def snapshot(self) -> dict[str, int]:
        """The counters and the budget, for ``GET /loop-guard``."""
        s = self.stats
        return {
            "hits": s.hits,
            "misses": s.misses,
            "fast_hits": s.fast_hits,
            "evictions": s.evictions,
            "bytes": s.bytes,
            "entries": s.entries,
            "edit_hits": s.edit_hits,
            "max_bytes": self.max_bytes,
        }


def tools_key(tools: Any) -> bytes | None:
    """Compact JSON of a request's offered tools (:func:`proxy.dialects.text_calls.offered_tools`,
    None: ``null``), what an entry keeps of them; None when they cannot be written (nested too
    deep), and the request is then read in full and not kept."""
    try:
        return jsonbody.dumps(tools)
    except (RecursionError, TypeError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class Read:
    """What :func:`read` found: the ``transcript``, the history items' byte ``spans`` (None:
    not known), the guards' ``checkpoint`` of the kept prefix it resumed from (None: a full
    read, or none kept), and the ``entry`` it kept for this request (None: nothing kept), to
    attach this request's checkpoint to (:meth:`PrefixCache.keep_checkpoint`)."""

    transcript: Transcript
    spans: list[Span] | None = None
    checkpoint: Any = None
    entry: Prefix | None = None
    #: the edits kept with the prefix it resumed from (:attr:`Prefix.edits`; None: a full read)
    edits: Any = None


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
    if raw[start : start + length] != entry.items[:length]:
        return None
    return Point(len(entry.spans) - 1, length, entry.before, entry.key_before, None, ())


def _feed(fold: Any, items: list[Any], first: int) -> Any:
    """Feed ``items`` (history positions ``first``…) to ``fold``; returns a copy of it taken
    before the last one (None when ``items`` is empty)."""
    before = None
    for pos, item in enumerate(items, first):
        if pos == first + len(items) - 1:
            before = fold.copy()
        fold.feed(pos, item)
    return before


def _keep(
    raw: bytes,
    start: int,
    spans: list[Span],
    fold: Any,
    offered: bytes,
    key_items: list[Any],
    before: Any = None,
    key_before: list[Any] | None = None,
    kept: tuple[tuple[Span, ...], int] | None = None,
) -> Prefix | None:
    """The entry of a history read (its items at ``spans``, ``start``: its ``[``), None when it
    has no item. ``before``/``key_before``: the parse state and fingerprint items after every
    item but the last. ``kept``: the relative spans of the first items as the resumed entry
    holds them, and how many (so only the new ones are shifted)."""
    if not spans:
        return None
    last = spans[-1][1]
    extra = start + sum(len(jsonbody.dumps(item, default=str)) for item in key_items)  # head, key items
    size = entry_size(last - start, len(fold.calls), len(spans)) + extra
    digest = hash(raw[:HEAD_BYTES]) if last >= HEAD_BYTES else None
    if kept is not None:
        old, n = kept
        rel = old[:n] + tuple((s - start, e - start) for s, e in spans[n:])
    else:
        rel = tuple((s - start, e - start) for s, e in spans)
    return Prefix(
        raw[start:last],
        rel,
        fold,
        size,
        offered,
        None,
        raw[:start],
        tuple(key_items),
        digest,
        before=before if len(spans) > 1 else None,
        key_before=tuple(key_before or ()),
        absolute=tuple(spans),
    )


def read(raw: bytes, body: dict[str, Any], dialect: Dialect, key: str, cache: PrefixCache | None) -> Read:
    """The transcript of a decoded request body (``raw`` decoded: ``body``), as
    ``dialect.parse_request(body)`` gives it, and the byte spans of its history's items (what
    :func:`proxy.dialects.jsonbody.items` gives; None when the history member is missing, not a
    list, or given twice: the dialect's ``apply`` then finds them itself), as a :class:`Read`.
    Resumes from the conversation's kept prefix when the history starts with its bytes, and
    keeps this request's history for the next one. ``cache`` None: a full read, nothing kept.

    Raises what ``dialect.parse_request`` raises (:class:`proxy.errors.DialectError`).
    """
    member: str | None = getattr(dialect, "ITEMS", None)
    if cache is None or member is None or not hasattr(dialect, "Fold"):  # a dialect without a fold
        return Read(dialect.parse_request(body))
    listed = body.get(member)
    if not isinstance(listed, list):
        return Read(dialect.parse_request(body))
    start = jsonbody.member_start(raw, jsonbody.root(raw), member, body)
    if start is None or raw[start : start + 1] != b"[":
        return Read(dialect.parse_request(body))
    tools = text_calls.offered_tools(body)
    offered = tools_key(tools)
    if offered is None:
        return Read(dialect.parse_request(body))
    kept = cache.get(dialect.PATH_SUFFIX, key)
    fold: Any = None
    checkpoint: Any = None
    kept_edits: Any = None
    spans: list[Span] | None = None
    key_items: list[Any] = []
    key_before: list[Any] = []
    before: Any = None
    at = point(raw, start, kept) if kept is not None and kept.tools == offered else None
    resumed: tuple[tuple[Span, ...], int] | None = None
    if at is not None and kept is not None and at.n <= len(listed):
        n = at.n
        tail, end = jsonbody.items_after(raw, start + at.length, listed[n:])
        if n + len(tail) == len(listed):
            spans = at.spans(kept, start) + tail
            fold = at.fold.copy()
            checkpoint = kept.checkpoint
            kept_edits = kept.edits
            before = _feed(fold, listed[n:], n)
            if before is None:  # nothing new: the point's own earlier state
                before = at.before
            key_items = fingerprint_items([*at.key_items, *listed[n:]])
            key_before = (
                fingerprint_items([*at.key_items, *listed[n:-1]]) if n < len(listed) else list(at.key_before)
            )
            resumed = (kept.spans, n)
    if fold is None:
        spans = jsonbody.items(raw, start, listed)
        end = jsonbody.items_after(raw, spans[-1][1])[1] if spans else jsonbody.items_after(raw, start + 1)[1]
        fold = dialect.Fold(tools)
        before = _feed(fold, listed, 0)
        key_items = fingerprint_items(listed)
        key_before = fingerprint_items(listed[:-1])
        cache.stats.misses += 1
    else:
        cache.stats.hits += 1
    assert spans is not None
    if len(spans) != len(listed) or member in jsonbody.keys_after(raw, end, body):
        return Read(dialect.parse_request(body))  # the member given twice: decoders read the last
    transcript = fold.finish(len(listed), body.get("tool_choice"))
    entry = _keep(raw, start, spans, fold, offered, key_items, before, key_before, resumed)
    if entry is not None:
        cache.put(dialect.PATH_SUFFIX, key, entry)
    return Read(transcript, spans, checkpoint, entry, kept_edits)


@dataclass(frozen=True, slots=True)
class Found:
    """A kept prefix :func:`find` verified against a body. ``body``: the body decoded with its
    history member holding only the ``new`` items (the ones after the kept prefix); ``tail``:
    their byte spans; ``tools``: the request's offered tools (its ``tools_key`` is the entry's)."""

    entry: Prefix
    body: dict[str, Any]
    new: list[Any]
    tail: list[Span]
    tools: Any
    #: where it resumes the entry (every kept item, or every one but the last)
    at: Point

    @property
    def start(self) -> int:
        """Offset of the history's ``[`` in the body."""
        return len(self.entry.head)

    def key_body(self, member: str) -> dict[str, Any]:
        """A body whose conversation key is the whole body's
        (:func:`proxy.request.conversation.fingerprint_items`)."""
        return {**self.body, member: [*self.at.key_items, *self.new]}


def find(raw: bytes, dialect: Dialect, cache: PrefixCache) -> Found | None:
    """The kept prefix ``raw`` resumes, found without decoding ``raw`` whole (issue 15), or None:
    ``raw`` shorter than :data:`FAST_MIN`, no entry whose head and history bytes start ``raw``
    (entries sharing the digest of ``raw``'s first :data:`HEAD_BYTES` bytes tried most recently
    kept first, of any conversation key: the decisions are a function of the bytes), or a body
    that must be read in full (the rest not JSON orjson reads, the history member not a list or
    given again after it, other offered tools). Only the kept bytes before the history (the
    entry's ``head``), a sentinel ``0`` for the kept items and what follows them are decoded:
    O(head + new bytes). Nothing is counted or kept until :func:`resume`."""
    member: str | None = getattr(dialect, "ITEMS", None)
    if len(raw) < FAST_MIN or member is None or not hasattr(dialect, "Fold"):
        return None
    for entry in cache.candidates(dialect.PATH_SUFFIX, raw):
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
        return Found(entry, doc, new, tail, tools, at)
    return None


def resume(found: Found, raw: bytes, dialect: Dialect, key: str, cache: PrefixCache) -> Read:
    """:func:`read` of ``raw`` from what :func:`find` found: the kept parse state fed the new
    items, the new entry kept under ``key`` (this request's key, whichever key the resumed entry
    was kept under). Raises :class:`proxy.errors.DialectError` as :func:`read` does."""
    kept, start, at, new = found.entry, found.start, found.at, found.new
    n = at.n
    spans = at.spans(kept, start) + found.tail
    fold = at.fold.copy()
    before = _feed(fold, new, n)
    if before is None:  # nothing new: the point's own earlier state
        before = at.before
    transcript = fold.finish(n + len(new), found.body.get("tool_choice"))
    cache.stats.hits += 1
    cache.stats.fast_hits += 1
    key_items = fingerprint_items([*at.key_items, *new])
    key_before = fingerprint_items([*at.key_items, *new[:-1]]) if new else list(at.key_before)
    entry = _keep(raw, start, spans, fold, kept.tools, key_items, before, key_before, (kept.spans, n))
    if entry is not None:
        cache.put(dialect.PATH_SUFFIX, key, entry)
    return Read(transcript, spans, kept.checkpoint, entry, kept.edits)


def full_body(found: Found, raw: bytes, member: str, positions: Any) -> dict[str, Any]:
    """``found.body`` with its history member as long as the whole body's: the new items, and
    of the kept ones those at ``positions`` decoded from their bytes (the items a dialect's
    ``apply`` reads: those its actions edit); the other kept items are None."""
    kept, start = found.entry, found.start
    n = found.at.n
    items: list[Any] = [None] * n + found.new
    for p in positions:
        if 0 <= p < n:
            s, e = kept.spans[p]
            items[p] = jsonbody.decode(raw[start + s : start + e])
    return {**found.body, member: items}


def apply_edits(
    cache: PrefixCache | None,
    dialect: Dialect,
    key: str,
    found: Read,
    raw: bytes,
    actions: Sequence[Action],
    body: Any,
) -> bytes | None:
    """``dialect.apply(raw, actions, body, found.spans)``, reusing the edits the previous request
    of the conversation made before its cut when ``found`` resumed from it (the history's bytes
    through that cut are then the same: :func:`proxy.dialects.edits.apply_kept`), and keeping this
    request's edits before its own cut (:func:`proxy.guards.resume.cut`) with ``found.entry``.
    The same bytes either way. A dialect without ``apply_kept``, a read that kept nothing or
    found no spans is a plain ``apply``."""
    kept_apply = getattr(dialect, "apply_kept", None)
    if cache is None or found.entry is None or found.spans is None or kept_apply is None:
        if found.spans is not None:
            return dialect.apply(raw, actions, body, found.spans)
        return dialect.apply(raw, actions, body)
    done = kept_apply(raw, actions, body, found.spans, found.edits, cut(found.transcript))
    if done.reused:
        cache.stats.edit_hits += 1
    cache.keep_edits(dialect.PATH_SUFFIX, key, found.entry, done.kept)
    return done.body  # type: ignore[no-any-return]
