"""What the previous request of a conversation established, kept so the next one reads only its
new messages: the store of the request pipeline (:func:`proxy.request.rewrite.decide_request`).

An agent sends its whole history on every step: each request is the previous one plus one step.
Without kept state every request re-reads the transcript of its whole history and re-finds the
byte span of every message (the span finding of :func:`proxy.dialects.jsonbody.items`: an
``orjson.dumps`` and a compare per message), so the cost of a request grows with its history.
:class:`PrefixCache` keeps, per conversation (DESIGN §4 key) and dialect, a :class:`Prefix`: the
bytes of the previous request's history (from the ``[`` of its ``messages`` / ``input`` through
its last item), each item's byte span, the dialect's parse state after the last item (its
``Fold``, :mod:`proxy.dialects`), the guards' checkpoint and the edits made before the guards'
cut. This module only keeps and hands back; the stages that use what it holds are
:mod:`proxy.request.locate` (a body found by its bytes), :mod:`proxy.request.read` (the kept
parse state resumed), :mod:`proxy.guards.resume` (the kept checkpoint) and
:mod:`proxy.request.edits` (the kept edits reused).

Two look-ups: :meth:`PrefixCache.get`, a conversation's entry (a body decoded whole), and
:meth:`PrefixCache.candidates`, the entries whose body started with the same first
:data:`HEAD_BYTES` bytes, for a body of :data:`FAST_MIN` bytes or more, found before it is
decoded. One store: :meth:`PrefixCache.keep`, after the request was decided.

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

Bounded memory: entries are dropped least recently used first once their bytes pass
``max_bytes``. An entry counts :data:`HISTORY_FACTOR` times its history's JSON bytes (the bytes
and the decoded texts of its parse state), :data:`CALL_BYTES` per tool call and
:data:`ITEM_BYTES` per item (the parse state, the spans), :data:`TOOLS_FACTOR` times its offered
tools' JSON, its head and fingerprint items, the rest of its request's body when it keeps a
view of it (:attr:`Prefix.items`), and
once the guards' checkpoint is attached (:meth:`PrefixCache.keep_checkpoint`)
:data:`CHECKPOINT_BYTES`, :data:`CHECKPOINT_CALL_BYTES` per call and :data:`ACTION_BYTES` per kept
action, and its kept edits' bytes (:attr:`proxy.dialects.edits.Kept.size`). Measured with
``tracemalloc`` (what clearing the cache frees) on ``bench/workloads.memory_body`` (1,000
conversations x 10 requests, 32 MiB; a kept entry: 15.4 KB of history, 12 calls, 26 items):
54.7 KB for the history and its parse state (counted 59.6 KB; 21.1 KB for 20.7 KB after 3
calls), 27.2 KB for the checkpoint (counted 27.4 KB; the count before this one said 8.2 KB),
4.4 KB for the edits (counted 5.7 KB; before they were kept at their own size, 24 KB).
Bytes the cache keeps are at their own size (:func:`proxy.dialects.jsonbody.kept`: orjson's output
holds 4 KiB or more whatever its length). Not thread-safe: the server calls it from its event
loop.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

Span = tuple[int, int]
#: Bytes an entry counts per tool call of its history (the parse state's call record, its decoded
#: arguments; its result's text is in :data:`HISTORY_FACTOR`) and per item (its two spans, its
#: said record), beyond the history's bytes.
CALL_BYTES = 1024
ITEM_BYTES = 384
#: Times an entry counts its history's bytes: the bytes, and the decoded texts its parse state
#: holds (results, what was said, call arguments).
HISTORY_FACTOR = 2
#: Times an entry counts its offered tools' compact JSON (:attr:`Prefix.tools`): those bytes, and
#: the decoded tools its parse state reads calls written as text against (about 6 times the JSON).
TOOLS_FACTOR = 8
#: Bodies of at least this many bytes are looked up without decoding them first
#: (:meth:`PrefixCache.candidates`); smaller ones are decoded whole (a decode costs less than the
#: look-up there).
FAST_MIN = 64 * 1024
#: The bytes of a body's start whose digest indexes the entries for :meth:`PrefixCache.candidates`.
HEAD_BYTES = 4096


#: Bytes a kept guards' checkpoint counts: its guards' state records (:data:`CHECKPOINT_BYTES`,
#: whatever the history), per tool call before its cut (each progress-aware guard's situation
#: numbers, the repeat keys and canonical arguments, the turn records) and per action it holds.
CHECKPOINT_BYTES = 4096
CHECKPOINT_CALL_BYTES = 1792
ACTION_BYTES = 128


def entry_size(history_bytes: int, calls: int, items: int, tools: int = 0) -> int:
    """What an entry counts against the budget (bytes) for a history of ``history_bytes`` with
    ``calls`` tool calls and ``items`` items, read against offered tools of ``tools`` bytes of
    compact JSON: see the module docstring."""
    return HISTORY_FACTOR * history_bytes + CALL_BYTES * calls + ITEM_BYTES * items + TOOLS_FACTOR * tools


def checkpoint_size(checkpoint: Any, calls: int) -> int:
    """What the guards' ``checkpoint`` (:class:`proxy.guards.resume.Checkpoint`) of a history
    with ``calls`` tool calls counts against the budget (bytes): see the module docstring."""
    actions = sum(len(a) for a in getattr(checkpoint, "actions", ()))
    return CHECKPOINT_BYTES + CHECKPOINT_CALL_BYTES * calls + ACTION_BYTES * actions


@dataclass(frozen=True, slots=True)
class Prefix:
    """One conversation's kept history. ``items``: the body's bytes from the history's ``[``
    through the end of its last item: a ``memoryview`` of the request's body when the bytes
    outside the history are at most the history's own (slicing a 5 MB history out of its body
    on every request was a copy the size of the history; the view keeps the whole body alive
    instead, and ``size`` counts those outside bytes), else a copy (a body of 1 MiB of
    ``metadata`` and a small history keeps only the history). ``spans``: each item's (start,
    end), relative to that ``[``. ``fold``: the dialect's parse state after the last item
    (never fed again: copied before resuming). ``size``: what it counts against the budget.
    ``tools``: the offered tools that state was read against
    (:func:`proxy.request.locate.tools_key`). ``checkpoint``: what the guards kept of it."""

    items: bytes | memoryview
    spans: tuple[Span, ...]
    fold: Any
    size: int
    tools: bytes = b"null"
    #: the guards' checkpoint of this history (:class:`proxy.guards.resume.Checkpoint`), once
    #: they have run over it (:meth:`PrefixCache.keep_checkpoint`)
    checkpoint: Any = None
    #: the body's bytes before the history's ``[`` (for :func:`proxy.request.locate.locate`)
    head: bytes = b""
    #: the history items the conversation key's fingerprint reads, decoded
    #: (:func:`proxy.request.conversation.fingerprint_items`)
    key_items: tuple[Any, ...] = ()
    #: the digest of the body's first :data:`HEAD_BYTES` bytes, when they are all in ``head`` and
    #: ``items`` (None: not indexed for :meth:`PrefixCache.candidates`)
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
    before the body was decoded, :meth:`PrefixCache.candidates`), ``edit_hits`` (requests that
    reused the previous request's edits, :func:`proxy.request.edits.write`)."""

    hits: int = 0
    misses: int = 0
    #: hits found by their bytes (the body never decoded whole); also counted in ``hits``
    fast_hits: int = 0
    evictions: int = 0
    bytes: int = 0
    entries: int = 0
    edit_hits: int = 0


class PrefixCache:
    """Kept prefixes by (dialect path suffix, conversation key), least recently used dropped first
    once their sizes pass ``max_bytes`` (bytes; > 0). An entry larger than the budget alone is not
    kept. Entries are also indexed by (dialect, digest of the body's first :data:`HEAD_BYTES`
    bytes), for :meth:`candidates`; one digest may index several conversations (sessions of one
    agent share a system prompt)."""

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
        recently kept first (not yet checked against ``raw``; none are used or moved); none for a
        body shorter than :data:`FAST_MIN` (decoding it costs less than this look-up)."""
        if len(raw) < FAST_MIN:
            return []
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

    def keep(
        self,
        dialect: str,
        key: str,
        entry: Prefix | None,
        checkpoint: Any = None,
        edits: Any = None,
        *,
        hit: bool | None = None,
        fast: bool = False,
        reused: bool = False,
    ) -> None:
        """What a decided request established, kept for conversation ``key``: its ``entry``
        (:meth:`put`; None: nothing to keep) with the guards' ``checkpoint``
        (:meth:`keep_checkpoint`) and its ``edits`` (:meth:`keep_edits`) attached, in that order;
        and the counters: ``hit`` True a resumed prefix (``fast``: found by its bytes), False a
        history read in full that could have been resumed, None neither; ``reused``: it reused
        the previous request's edits."""
        if hit is True:
            self.stats.hits += 1
            if fast:
                self.stats.fast_hits += 1
        elif hit is False:
            self.stats.misses += 1
        if reused:
            self.stats.edit_hits += 1
        if entry is None:
            return
        self.put(dialect, key, entry)
        self.keep_checkpoint(dialect, key, entry, checkpoint)
        self.keep_edits(dialect, key, entry, edits)

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
