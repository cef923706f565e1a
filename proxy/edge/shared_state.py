"""The state replicas share, at the edge: the Redis backend and the fail-open wrapper
around any :class:`proxy.request.shared.Backend`.

:class:`SharedState` is what the server uses. With ``state.backend: memory`` (the default) every
method is today's behaviour: nothing awaits, nothing is fetched or written. With a Redis URL:

- **Before deciding** (:meth:`SharedState.decide`): when a ``conversation_key`` header names the
  conversation, its state is fetched first. Then the request is decided against the local
  stores with lookups that note what the decision asked for (the conversation's state, a
  ``previous_response_id``'s entry). Those are fetched from Redis in one operation; when Redis
  holds a newer state (:func:`proxy.request.shared.newer`) or an entry the replica lacked, the
  local stores adopt it and the request is decided again (at most :data:`MAX_RUNS` times: a
  chained request first asks for its entry, then for the conversation the whole chain belongs
  to). So a decision is always made by the pure, synchronous
  :func:`proxy.request.rewrite.decide_request` over local data.
- **After deciding** (:meth:`SharedState.save_state`): the conversation's new state is written
  back before the request goes upstream; a kept Responses answer (:meth:`SharedState.keep`) is
  written before its last bytes reach the agent (:meth:`proxy.edge.relay.ResponseSide.settle`).
- **Incidents** (:meth:`SharedState.claim`): the incident log's writer claims ``(agent, kind)``
  in Redis (``SET NX``) before writing a line: one line per conversation and kind over all
  replicas (a client retry of the request that carried it, sent to another replica, included).
- **Stats** (:meth:`SharedState.publish`, :meth:`SharedState.totals`): each replica publishes
  its counters every ``state.stats_interval_s`` and whenever its ``GET /loop-guard`` is read;
  that endpoint adds the sum over the replicas that published within three intervals.

Consistency: an agent waits for an answer before its next request, so requests of one
conversation arrive one after the other; each is decided over the state the previous one wrote,
whichever replica served it (read your latest write). Two requests of one conversation at the
same time on two replicas (a client retry while the first is running) are decided each over
what it read; the later write wins. Wall clocks: narration timing compares times written by
different replicas, so their clocks must agree (NTP) to well under ``narration_after_s``.

Fail open: every backend call is bounded by ``state.timeout_ms`` (connect included) and any
exception (refused, timed out, a reply it cannot read) is caught: the request goes on with local
state, ``state_backend_errors[op]`` (stats) and ``loopguard_state_backend_errors_total{op}``
count it, and the first failure of each operation in an outage logs ``state_backend_error`` with
what was lost (:data:`LOST`) and ``error``, the exception's type. After a failure Redis is not
asked for ``state.retry_s`` seconds (those calls count too, and log ``error``: the type of the
failure that started the rest, with ``resting: true``); the first success after logs
``state_backend_restored``.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import orjson
import structlog

from proxy.config import ResponsesStoreConfig, StateConfig
from proxy.core.state import TTL_MS, ConversationState
from proxy.edge.observe import Stats
from proxy.request.response_store import Entry
from proxy.request.rewrite import RequestDecision
from proxy.request.shared import (
    Backend,
    Fetched,
    InMemoryBackend,
    decode_entry,
    decode_state,
    encode_entry,
    encode_state,
    entry_digests,
    newer,
)

log = structlog.get_logger("loopguard")

T = TypeVar("T")

#: The most times one request is decided (see the module doc).
MAX_RUNS = 4
#: How long a claimed incident stays claimed in Redis (ms): as long as a conversation's state.
INCIDENT_TTL_MS = TTL_MS
#: What a failed operation costs, for the warning line.
LOST = {
    "fetch": "decided with this replica's state only (narration timing and previous_response_id "
    "chains other replicas saw are unknown to this request)",
    "save_state": "this request's narration timing and first-seen times are not shared",
    "save_entry": "this response cannot be continued with previous_response_id on another replica",
    "claim_incident": "the incident is written without the claim (another replica may write it too)",
    "publish_stats": "this replica's counters are missing from the totals",
    "replica_stats": "GET /loop-guard shows this replica's counters only",
}

StateFor = Callable[[str], ConversationState | None]
Previous = Callable[[str], Entry | None]


class RedisBackend:
    """:class:`proxy.request.shared.Backend` on Redis (the ``redis`` package's asyncio client).

    Keys (all under ``state.prefix``): ``conv:<key>`` a conversation's state, by its fixed-size
    key (:func:`proxy.request.conversation.key_digest`, the same on every replica; expires
    :data:`proxy.core.state.TTL_MS` after its last write), ``resp:<key>`` an entry's description
    (by :func:`proxy.request.response_store.store_key`: the credential's and the id's digest)
    and ``seg:<digest>`` its segments (expire ``responses_store.max_age_s`` after their last write;
    null = never: bound them with Redis's ``maxmemory``), ``incident:<kind>:<agent>`` a claim,
    hash ``stats`` each replica's counters."""

    shared = True

    def __init__(self, cfg: StateConfig, store: ResponsesStoreConfig | None = None) -> None:
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        timeout = cfg.timeout_ms / 1000
        self._redis = aioredis.Redis.from_url(
            cfg.backend,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),  # no retries: a failure fails open at once
            health_check_interval=0,
        )
        self._prefix = cfg.prefix
        self._stats_max_age_s = 3 * cfg.stats_interval_s
        age = (store or ResponsesStoreConfig()).max_age_s
        self._entry_ttl_ms = int(age * 1000) if age is not None else None

    def _key(self, kind: str, name: str) -> str:
        return f"{self._prefix}{kind}:{name}"

    async def fetch(self, conversations: Sequence[str], responses: Sequence[str]) -> Fetched:
        if not conversations and not responses:
            return Fetched()
        pipe = self._redis.pipeline(transaction=False)
        for key in conversations:
            pipe.get(self._key("conv", key))
        for rid in responses:
            pipe.get(self._key("resp", rid))
        out = await pipe.execute()
        held_states = out[: len(conversations)]
        states = {
            k: decode_state(v) if v is not None else None
            for k, v in zip(conversations, held_states, strict=True)
        }
        metas = dict(zip(responses, out[len(conversations) :], strict=True))
        entries: dict[str, Entry | None] = dict.fromkeys(responses)
        names = sorted({n for m in metas.values() if m is not None for n in entry_digests(m)})
        if names:
            got = await self._redis.mget([self._key("seg", n) for n in names])
            held = {n: s for n, s in zip(names, got, strict=True) if s is not None}
            for rid, meta in metas.items():
                if meta is not None:
                    entries[rid] = decode_entry(meta, held)
        return Fetched(states, entries)

    async def save_state(self, key: str, state: ConversationState) -> None:
        await self._redis.set(self._key("conv", key), encode_state(state), px=TTL_MS)

    async def save_entry(self, rid: str, entry: Entry, new_segments: int) -> None:
        meta, segments = encode_entry(entry)
        fresh = {s for s in entry.segments[len(entry.segments) - new_segments :]}
        if entry.repair:
            fresh.add(entry.repair)
        ttl = self._entry_ttl_ms
        pipe = self._redis.pipeline(transaction=False)
        for name, segment in segments.items():
            if segment in fresh:
                pipe.set(self._key("seg", name), segment, px=ttl)
            elif ttl is not None:
                pipe.pexpire(self._key("seg", name), ttl)
        pipe.set(self._key("resp", rid), meta, px=ttl)
        await pipe.execute()

    async def claim_incident(self, agent: str, kind: str) -> bool:
        key = self._key("incident", f"{kind}:{agent}")
        return bool(await self._redis.set(key, b"1", nx=True, px=INCIDENT_TTL_MS))

    async def publish_stats(self, replica: str, counters: Mapping[str, Any]) -> None:
        value = orjson.dumps({"at": time.time(), "counters": counters})
        await self._redis.hset(f"{self._prefix}stats", replica, value)

    async def replica_stats(self) -> dict[str, Mapping[str, Any]]:
        raw = await self._redis.hgetall(f"{self._prefix}stats")
        now = time.time()
        out: dict[str, Mapping[str, Any]] = {}
        for replica, value in raw.items():
            obj = orjson.loads(value)
            if now - float(obj["at"]) <= self._stats_max_age_s:
                out[replica.decode()] = obj["counters"]
        return out

    async def close(self) -> None:
        await self._redis.aclose()


def sum_counters(replicas: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The sum of several replicas' counters: numbers added, mappings added key by key."""
    out: dict[str, Any] = {}
    for counters in replicas.values():
        for name, value in counters.items():
            if isinstance(value, dict):
                into = out.setdefault(name, {})
                for k, n in value.items():
                    into[k] = into.get(k, 0) + n
            elif isinstance(value, int | float) and not isinstance(value, bool):
                out[name] = out.get(name, 0) + value
    return {k: dict(sorted(v.items())) if isinstance(v, dict) else v for k, v in sorted(out.items())}


def counters(snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """The counters of a :meth:`proxy.edge.observe.Stats.snapshot` (no uptime, no incident list)."""
    return {k: v for k, v in snapshot.items() if k not in ("uptime_s", "incidents")}


class _Noting:
    """Lookups that note what a decision asked for, and what the local stores answered."""

    __slots__ = ("_previous", "_state_for", "entries", "states")

    def __init__(self, state_for: StateFor | None, previous: Previous | None) -> None:
        self._state_for = state_for
        self._previous = previous
        self.states: dict[str, ConversationState | None] = {}
        self.entries: dict[str, Entry | None] = {}

    def state(self, key: str) -> ConversationState | None:
        assert self._state_for is not None
        self.states[key] = value = self._state_for(key)
        return value

    def entry(self, rid: str) -> Entry | None:
        assert self._previous is not None
        self.entries[rid] = value = self._previous(rid)
        return value


class SharedState:
    """The server's view of the shared state (module doc). ``backend``: given (tests), else
    built from ``cfg`` (:class:`InMemoryBackend` for ``memory``, :class:`RedisBackend` else)."""

    def __init__(
        self,
        cfg: StateConfig,
        stats: Stats,
        store: ResponsesStoreConfig | None = None,
        backend: Backend | None = None,
    ) -> None:
        self.cfg = cfg
        self.stats = stats
        if backend is None:
            backend = RedisBackend(cfg, store) if cfg.shared else InMemoryBackend()
        self.backend: Backend = backend
        self.replica = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self._down_until = 0.0
        self._failing: set[str] = set()
        #: the error type of the failure that started the current rest (``retry_s``)
        self._cause = ""

    @property
    def shared(self) -> bool:
        return self.backend.shared

    async def _call(self, op: str, call: Callable[[], Awaitable[T]], default: T) -> T:
        """``await call()`` bounded by ``state.timeout_ms``; ``default`` when it fails (counted,
        the first failure of ``op`` in an outage logged) or while Redis rests (``retry_s``)."""
        if time.monotonic() < self._down_until:
            self._lost(op, self._cause, resting=True)
            return default
        try:
            result = await asyncio.wait_for(call(), self.cfg.timeout_ms / 1000)
        except Exception as exc:
            self._down_until = time.monotonic() + self.cfg.retry_s
            self._cause = type(exc).__name__
            self._lost(op, self._cause)
            return default
        if self._failing:
            log.info("state_backend_restored", failed_ops=sorted(self._failing))
            self._failing.clear()
        return result

    def _lost(self, op: str, error: str, resting: bool = False) -> None:
        """Count a lost ``op``; log the first of an outage with ``error`` (the exception type:
        while resting, the one of the failure that started the rest) and, when the call was not
        even made because Redis rests, ``resting: true``."""
        self.stats.backend_errors[op] += 1
        if op in self._failing:
            return
        self._failing.add(op)
        fields: dict[str, Any] = {"resting": True} if resting else {}
        log.warning(
            "state_backend_error", op=op, error=error, lost=LOST[op], retry_s=self.cfg.retry_s, **fields
        )

    async def decide(
        self,
        run: Callable[[StateFor | None, Previous | None], RequestDecision],
        state_for: StateFor | None,
        previous: Previous | None,
        adopt_state: Callable[[str, ConversationState], None],
        adopt_entry: Callable[[str, Entry], None],
        hint: str | None = None,
    ) -> RequestDecision:
        """``run(state_for, previous)`` (the pure decision over the local lookups), again after
        the local stores adopted newer data from the backend (module doc). ``hint``: the
        conversation key when it is known before deciding (a ``conversation_key`` header): its
        state is fetched first, so a conversation that moved here is decided once. Without a
        shared backend: ``run`` once."""
        if not self.shared:
            return run(state_for, previous)
        fetched_states: set[str] = set()
        fetched_entries: set[str] = set()
        if hint and state_for is not None:
            got = await self._call("fetch", lambda: self.backend.fetch([hint], []), None)
            if got is None:
                return run(state_for, previous)  # the backend failed: local state only
            fetched_states.add(hint)
            remote = got.states.get(hint)
            if remote is not None and newer(state_for(hint), remote):
                adopt_state(hint, remote)
        for runs in range(1, MAX_RUNS + 1):
            noted = _Noting(state_for, previous)
            decision = run(noted.state if state_for is not None else None, noted.entry if previous else None)
            asked_states, asked_entries = noted.states, noted.entries
            if runs == MAX_RUNS:
                break
            need_states = [k for k in asked_states if k not in fetched_states]
            # an entry held locally is the one the backend holds (a response id's entry never changes)
            need_entries = [r for r, e in asked_entries.items() if e is None and r not in fetched_entries]
            if not need_states and not need_entries:
                return decision
            got = await self._call(
                "fetch", lambda s=need_states, e=need_entries: self.backend.fetch(s, e), None
            )
            if got is None:
                return decision
            fetched_states.update(need_states)
            fetched_entries.update(need_entries)
            again = False
            for key in need_states:
                remote = got.states.get(key)
                if remote is not None and newer(asked_states[key], remote):
                    adopt_state(key, remote)
                    again = True
            for rid in need_entries:
                entry = got.entries.get(rid)
                if entry is not None:
                    adopt_entry(rid, entry)
                    again = True
            if not again:
                return decision
        return decision

    async def fetch_state(self, key: str) -> ConversationState | None:
        """The backend's state of ``key`` (None: none, not shared, or failed), for the ledger view."""
        if not self.shared:
            return None
        got = await self._call("fetch", lambda: self.backend.fetch([key], []), None)
        return got.states.get(key) if got is not None else None

    async def save_state(self, key: str, state: ConversationState | None) -> None:
        """Write conversation ``key``'s state after a decision (nothing when not shared or None)."""
        if self.shared and state is not None:
            await self._call("save_state", lambda: self.backend.save_state(key, state), None)

    async def keep(self, rid: str, entry: Entry | None) -> None:
        """Write a kept Responses entry (its input and output segments are the new ones)."""
        if self.shared and entry is not None:
            await self._call("save_entry", lambda: self.backend.save_entry(rid, entry, 2), None)

    async def claim(self, agent: str, kind: str) -> bool:
        """True when this replica writes incident ``(agent, kind)`` (always without a shared
        backend, and when the backend fails: a second line rather than none)."""
        if not self.shared:
            return True
        return await self._call("claim_incident", lambda: self.backend.claim_incident(agent, kind), True)

    async def publish(self) -> None:
        if self.shared:
            snapshot = counters(self.stats.snapshot())
            publish = self.backend.publish_stats
            await self._call("publish_stats", lambda: publish(self.replica, snapshot), None)

    async def totals(self) -> dict[str, Any] | None:
        """``{"replicas": n, **summed counters}`` over the replicas that published recently (this
        one first publishes its own); None when not shared or the backend failed."""
        if not self.shared:
            return None
        await self.publish()
        replicas = await self._call("replica_stats", self.backend.replica_stats, None)
        if replicas is None:
            return None
        return {"replicas": len(replicas), **sum_counters(replicas)}

    async def run_publisher(self) -> None:
        """Publish the counters every ``state.stats_interval_s`` until cancelled."""
        while True:
            await asyncio.sleep(self.cfg.stats_interval_s)
            await self.publish()

    async def close(self) -> None:
        if self.shared:
            await self.publish()
            try:
                await self.backend.close()
            except Exception as exc:
                log.warning("state_backend_error", op="close", error=type(exc).__name__)
