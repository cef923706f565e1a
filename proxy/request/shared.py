"""State shared by several replicas (so a conversation spread over replicas behind a load
balancer is guarded as if one process saw it): the backend interface and the wire forms.

One loopguard process keeps its per-conversation state in memory (:mod:`proxy.core.state`,
:mod:`proxy.request.response_store`, :mod:`proxy.edge.incidents`, :mod:`proxy.edge.observe`). Several
replicas behind a load balancer share it through a :class:`Backend` (``state.backend``):

- :class:`InMemoryBackend` (``memory``, the default) shares nothing: every call returns at once
  and the local stores are the whole state, exactly as before there were backends.
- ``redis://…`` (:class:`proxy.edge.shared_state.RedisBackend`) keeps a copy of each
  conversation's :class:`~proxy.core.state.ConversationState`, each kept Responses
  :class:`~proxy.request.response_store.Entry`, one claim per incident, and each replica's counters.

The decisions stay pure (:func:`proxy.request.rewrite.decide_request` is synchronous and never
awaits): the server fetches what a request needs *before* deciding and writes what it learnt
*after* (:class:`proxy.edge.shared_state.SharedState`). This module holds what that needs without
I/O: the :class:`Backend` protocol, the byte forms of a state and an entry (:func:`encode_state`,
:func:`decode_state`, :func:`encode_entry`, :func:`decode_entry`), and :func:`newer`, which of two
copies of a conversation's state a replica goes on with.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from proxy.core.state import ConversationState, NarrationMark
from proxy.request.response_store import Entry


@dataclass(frozen=True, slots=True)
class Fetched:
    """What a backend holds for one request: ``states`` by conversation key and ``entries`` by
    response id, None where it holds nothing."""

    states: Mapping[str, ConversationState | None] = field(default_factory=dict)
    entries: Mapping[str, Entry | None] = field(default_factory=dict)


class Backend(Protocol):
    """Where replicas share state. Every method may raise (a network error, a timeout): the
    caller (:class:`proxy.edge.shared_state.SharedState`) fails open on any exception."""

    #: False for the in-memory backend (nothing to fetch or write: the local stores are the state)
    shared: bool

    async def fetch(self, conversations: Sequence[str], responses: Sequence[str]) -> Fetched:
        """The states of ``conversations`` and the entries of ``responses`` (one round trip for
        the states and the entries' descriptions, one more for their items)."""
        ...

    async def save_state(self, key: str, state: ConversationState) -> None:
        """Replace conversation ``key``'s state (it expires :data:`proxy.core.state.TTL_MS`
        after its ``seen_ms``)."""
        ...

    async def save_entry(self, rid: str, entry: Entry, new_segments: int) -> None:
        """Keep response ``rid``'s entry; its last ``new_segments`` segments are new (the others
        are held already for the response it continues, and only have their age reset)."""
        ...

    async def claim_incident(self, agent: str, kind: str) -> bool:
        """True for the first replica to claim the incident ``(agent, kind)`` (then it writes it)."""
        ...

    async def publish_stats(self, replica: str, counters: Mapping[str, Any]) -> None:
        """Publish this replica's counters (:func:`proxy.edge.observe.Stats.counters`)."""
        ...

    async def replica_stats(self) -> dict[str, Mapping[str, Any]]:
        """The counters every replica published recently, by replica id."""
        ...

    async def close(self) -> None: ...


class InMemoryBackend:
    """``state.backend: memory``: one process, nothing shared (today's behaviour)."""

    shared = False

    async def fetch(self, conversations: Sequence[str], responses: Sequence[str]) -> Fetched:
        return Fetched()

    async def save_state(self, key: str, state: ConversationState) -> None:
        return None

    async def save_entry(self, rid: str, entry: Entry, new_segments: int) -> None:
        return None

    async def claim_incident(self, agent: str, kind: str) -> bool:
        return True

    async def publish_stats(self, replica: str, counters: Mapping[str, Any]) -> None:
        return None

    async def replica_stats(self) -> dict[str, Mapping[str, Any]]:
        return {}

    async def close(self) -> None:
        return None


def encode_state(state: ConversationState) -> bytes:
    """``state`` as compact JSON: ``{"turns": [[pos, ms]…], "texts": […], "narrations":
    [[after, call_id, at_ms, silent_ms]…], "ledger": str|null, "seen": ms}``."""
    return orjson.dumps(
        {
            "turns": sorted(state.turns.items()),
            "texts": sorted(state.texts.items()),
            "narrations": [[m.after, m.call_id, m.at_ms, m.silent_ms] for m in state.narrations],
            "ledger": state.ledger.decode() if state.ledger is not None else None,
            "seen": state.seen_ms,
        }
    )


def decode_state(raw: bytes) -> ConversationState:
    """The inverse of :func:`encode_state`. Raises ``ValueError``/``KeyError``/``TypeError`` on
    bytes it did not write."""
    obj = orjson.loads(raw)
    ledger = obj["ledger"]
    return ConversationState(
        {int(p): int(ms) for p, ms in obj["turns"]},
        {int(p): int(ms) for p, ms in obj["texts"]},
        tuple(NarrationMark(int(a), c, int(t), int(s)) for a, c, t, s in obj["narrations"]),
        ledger.encode() if isinstance(ledger, str) else None,
        int(obj["seen"]),
    )


def newer(local: ConversationState | None, remote: ConversationState | None) -> bool:
    """True when a replica should go on with ``remote`` rather than its own ``local`` copy: the
    backend's copy is from a later (or the same) request and differs. A local copy from a later
    request (the backend missed a write, during an outage) is kept, and written back after."""
    if remote is None or remote == local:
        return False
    return local is None or remote.seen_ms >= local.seen_ms


def digest(segment: bytes) -> str:
    """The key of a segment of items (32 hex digits of SHA-256): the responses of one chain
    share their segments, so each is held once in the backend."""
    return hashlib.sha256(segment).hexdigest()[:32]


def encode_entry(entry: Entry) -> tuple[bytes, dict[str, bytes]]:
    """``entry`` as its description (JSON: segment digests, counts, the repair's digest) and the
    segments by digest (the repair items are one more segment)."""
    segments = {digest(s): s for s in entry.segments}
    repair = digest(entry.repair) if entry.repair else None
    if repair is not None:
        segments[repair] = entry.repair
    meta = {
        "segments": [digest(s) for s in entry.segments],
        "count": entry.count,
        "size": entry.size,
        "repair": repair,
        "repair_count": entry.repair_count,
    }
    return orjson.dumps(meta), segments


def entry_digests(meta: bytes) -> list[str]:
    """The digests of the segments (and repair) a description names, in order."""
    obj = orjson.loads(meta)
    return [*obj["segments"], *([obj["repair"]] if obj["repair"] else [])]


def decode_entry(meta: bytes, segments: Mapping[str, bytes]) -> Entry | None:
    """The entry a description names, from its segments; None when one is missing (expired or
    evicted before the description: the entry is then as good as unknown)."""
    obj = orjson.loads(meta)
    names = entry_digests(meta)
    if any(segments.get(n) is None for n in names):
        return None
    return Entry(
        tuple(segments[n] for n in obj["segments"]),
        int(obj["count"]),
        int(obj["size"]),
        segments[obj["repair"]] if obj["repair"] else b"",
        int(obj["repair_count"]),
    )
