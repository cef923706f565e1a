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
(``tests/test_prefix_cache.py`` replays every fixture both ways). The guards still run over
the whole transcript. A body whose history member is given twice, or is not a list, is always
read in full and never kept.

The edits a request's actions made before its guards' cut (:func:`proxy.guards.resume.cut`) are
kept with its entry (:meth:`PrefixCache.keep_edits`, :class:`proxy.dialects.edits.Kept`): the
next request, when it resumes that entry and its enforced actions before that cut are the same
ones, reuses them and writes only the actions at or after the cut (:func:`apply_edits`; the
upstream bytes are those of a full apply either way), in every dialect.

Bounded memory: entries are dropped least recently used first once their bytes pass
``max_bytes``. An entry counts its history's JSON bytes plus :data:`CALL_BYTES` per tool call and
:data:`ITEM_BYTES` per item for the parse state (an estimate; measured with ``tracemalloc`` on the
bench's histories, within 15% of what an entry holds), plus its kept edits' bytes
(:attr:`proxy.dialects.edits.Kept.size`). Not thread-safe: the server calls it
from its event loop.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.actions import Action
from proxy.dialects import Dialect, jsonbody, text_calls
from proxy.guards.resume import cut
from proxy.transcript import Transcript

Span = tuple[int, int]
#: Bytes an entry counts per tool call of its history (the parse state's call record, its decoded
#: arguments, its result) and per item (its span, its said record), beyond the history's bytes.
CALL_BYTES = 2048
ITEM_BYTES = 256


def entry_size(history_bytes: int, calls: int, items: int) -> int:
    """What an entry counts against the budget (bytes): see the module docstring."""
    return history_bytes + CALL_BYTES * calls + ITEM_BYTES * items


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
    #: the edits its request made before its cut (:class:`proxy.dialects.edits.Kept`), once
    #: made (:meth:`PrefixCache.keep_edits`); counted in ``size``
    edits: Any = None


@dataclass(slots=True)
class Stats:
    """Counters for ``/loop-guard/stats`` and ``/metrics``: ``hits`` (requests that resumed a
    kept prefix), ``misses`` (requests read in full with the cache on), ``evictions`` (entries
    dropped for the budget), ``bytes`` and ``entries`` (kept now), ``edit_hits`` (requests that
    reused the previous request's edits, :func:`apply_edits`)."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    bytes: int = 0
    entries: int = 0
    edit_hits: int = 0


class PrefixCache:
    """Kept prefixes by (dialect path suffix, conversation key), least recently used dropped first
    once their sizes pass ``max_bytes`` (bytes; > 0). An entry larger than the budget alone is not
    kept."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be > 0")
        self.max_bytes = max_bytes
        self.stats = Stats()
        self._entries: OrderedDict[tuple[str, str], Prefix] = OrderedDict()

    def get(self, dialect: str, key: str) -> Prefix | None:
        """The kept prefix of a conversation (now the most recently used), or None."""
        entry = self._entries.get((dialect, key))
        if entry is not None:
            self._entries.move_to_end((dialect, key))
        return entry

    def put(self, dialect: str, key: str, entry: Prefix) -> None:
        """Keep ``entry`` for a conversation (replacing what it had), then drop the least recently
        used entries until the budget holds."""
        old = self._entries.pop((dialect, key), None)
        if old is not None:
            self.stats.bytes -= old.size
        if entry.size <= self.max_bytes:
            self._entries[(dialect, key)] = entry
            self.stats.bytes += entry.size
        self._trim()

    def _trim(self) -> None:
        while self.stats.bytes > self.max_bytes:
            _, dropped = self._entries.popitem(last=False)
            self.stats.bytes -= dropped.size
            self.stats.evictions += 1
        self.stats.entries = len(self._entries)

    def keep_checkpoint(self, dialect: str, key: str, entry: Prefix, checkpoint: Any) -> None:
        """Attach the guards' ``checkpoint`` to ``entry`` when it is still the conversation's kept
        prefix (another request may have replaced it since)."""
        if checkpoint is not None and self._entries.get((dialect, key)) is entry:
            self._entries[(dialect, key)] = dataclasses.replace(entry, checkpoint=checkpoint)

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
        self.stats.bytes = 0
        self.stats.entries = 0

    def snapshot(self) -> dict[str, int]:
        """The counters and the budget, for ``/loop-guard/stats``."""
        s = self.stats
        return {
            "hits": s.hits,
            "misses": s.misses,
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
    if kept is not None and kept.tools == offered and raw.startswith(kept.items, start):
        n = len(kept.spans)
        tail, end = jsonbody.items_after(raw, start + len(kept.items), listed[n:])
        if n + len(tail) == len(listed):
            spans = [(start + s, start + e) for s, e in kept.spans] + tail
            fold = kept.fold.copy()
            checkpoint = kept.checkpoint
            kept_edits = kept.edits
            for pos in range(n, len(listed)):
                fold.feed(pos, listed[pos])
    if fold is None:
        spans = jsonbody.items(raw, start, listed)
        end = jsonbody.items_after(raw, spans[-1][1])[1] if spans else jsonbody.items_after(raw, start + 1)[1]
        fold = dialect.Fold(tools)
        for pos, item in enumerate(listed):
            fold.feed(pos, item)
        cache.stats.misses += 1
    else:
        cache.stats.hits += 1
    assert spans is not None
    if len(spans) != len(listed) or member in jsonbody.keys_after(raw, end, body):
        return Read(dialect.parse_request(body))  # the member given twice: decoders read the last
    transcript = fold.finish(len(listed), body.get("tool_choice"))
    entry = None
    if spans:
        last = spans[-1][1]
        size = entry_size(last - start, len(fold.calls), len(spans))
        entry = Prefix(raw[start:last], tuple((s - start, e - start) for s, e in spans), fold, size, offered)
        cache.put(dialect.PATH_SUFFIX, key, entry)
    return Read(transcript, spans, checkpoint, entry, kept_edits)


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
