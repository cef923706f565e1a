"""The shared-state layer without Redis: the byte forms of a conversation's state and
a Responses entry, which copy a replica goes on with, and :class:`SharedState` over a scripted
backend (what it fetches, when it decides again, how it fails open)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from structlog.testing import capture_logs

from proxy.config import Config, StateConfig, TurnGuardConfig, build
from proxy.core.state import ConversationState, NarrationMark
from proxy.dialects import openai_chat
from proxy.edge.observe import Stats
from proxy.edge.shared_state import LOST, SharedState, sum_counters
from proxy.errors import ConfigError
from proxy.guards import build_guards
from proxy.request.conversation import key_digest
from proxy.request.memory import Memory
from proxy.request.response_store import Entry
from proxy.request.rewrite import decide_request
from proxy.request.shared import (
    Fetched,
    InMemoryBackend,
    decode_entry,
    decode_state,
    encode_entry,
    encode_state,
    newer,
)

STATE = ConversationState(
    {-1: 5, 0: 1_000},
    {3: 2_000},
    (NarrationMark(4, "call_2", 3_000, 180_000), NarrationMark(9, None, 4_000, 240_000)),
    b'{"calls":3}',
    4_500,
)

#: A conversation key as the server holds it (a header's value is held as its digest).
C = key_digest("c")


@pytest.mark.parametrize(
    "state",
    [STATE, ConversationState(), ConversationState({0: 1}, {}, (), None, 1)],
    ids=["full", "empty", "no_ledger"],
)
def test_a_state_round_trips_through_its_bytes(state: ConversationState) -> None:
    assert decode_state(encode_state(state)) == state


def test_an_entry_round_trips_through_its_description_and_segments() -> None:
    entry = Entry((b'[{"a":1}]', b'[{"b":2}]'), 2, 18, b'[{"r":1}]', 1)
    meta, segments = encode_entry(entry)
    assert len(segments) == 3
    assert decode_entry(meta, segments) == entry
    missing = dict(segments)
    missing.pop(next(iter(missing)))
    assert decode_entry(meta, missing) is None  # a segment expired: as good as unknown


NEWER = [
    pytest.param(None, None, False, id="nothing_anywhere"),
    pytest.param(STATE, None, False, id="backend_holds_none"),
    pytest.param(None, STATE, True, id="only_the_backend_knows_it"),
    pytest.param(STATE, STATE, False, id="same_copy"),
    pytest.param(ConversationState(seen_ms=4_000), STATE, True, id="backend_copy_from_a_later_request"),
    pytest.param(STATE, ConversationState(seen_ms=4_000), False, id="local_copy_from_a_later_request"),
]


@pytest.mark.parametrize(("local", "remote", "want"), NEWER)
def test_newer_says_which_copy_a_replica_goes_on_with(
    local: ConversationState | None, remote: ConversationState | None, want: bool
) -> None:
    assert newer(local, remote) is want


def test_sum_counters_adds_numbers_and_mappings_key_by_key() -> None:
    got = sum_counters(
        {
            "a": {"requests": 2, "per_rule": {"x": 1}, "note": "s"},
            "b": {"requests": 3, "per_rule": {"x": 2, "y": 1}},
        }
    )
    assert got == {"per_rule": {"x": 3, "y": 1}, "requests": 5}


class Scripted(InMemoryBackend):
    """A backend holding given states; records each fetch; ``fail``: every call raises."""

    shared = True

    def __init__(self, states: Mapping[str, ConversationState] | None = None, fail: bool = False) -> None:
        self.states = dict(states or {})
        self.fetches: list[tuple[list[str], list[str]]] = []
        self.saved: list[tuple[str, ConversationState]] = []
        self.fail = fail

    async def fetch(self, conversations: Sequence[str], responses: Sequence[str]) -> Fetched:
        self.fetches.append((list(conversations), list(responses)))
        if self.fail:
            raise ConnectionRefusedError
        return Fetched({k: self.states.get(k) for k in conversations}, dict.fromkeys(responses))

    async def save_state(self, key: str, state: ConversationState) -> None:
        if self.fail:
            raise ConnectionRefusedError
        self.saved.append((key, state))

    async def claim_incident(self, agent: str, kind: str) -> bool:
        if self.fail:
            raise ConnectionRefusedError
        return False


def _run(memory: Memory, now_ms: int, seen: list[ConversationState | None]) -> Any:
    guards = build_guards(Config().guards)

    def run(state_for: Any, previous: Any) -> Any:
        def noting(key: str) -> ConversationState | None:
            value = state_for(key)
            seen.append(value)
            return value

        body = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
        return decide_request(
            body, {"x-session-id": C}, guards, ("x-session-id",), now_ms, noting, openai_chat
        )

    return run


def _memory() -> Memory:
    """The memory glue of the default guards plus the turn guard (which makes it remember)."""
    guards = Config().guards
    return Memory(build_guards(dataclasses.replace(guards, turn_guard=TurnGuardConfig(enabled=True))))


async def test_a_newer_state_in_the_backend_is_adopted_and_the_request_decided_again() -> None:
    remote = ConversationState({1: 100}, {}, (), None, 900)
    backend = Scripted({C: remote})
    shared = SharedState(StateConfig(backend="redis://x"), Stats(), backend=backend)
    memory = _memory()
    seen: list[ConversationState | None] = []
    await shared.decide(
        _run(memory, 1_000, seen), memory.state_for(1_000), None, memory.store.put, lambda *a: None
    )
    assert seen == [None, remote]  # first over local state (none), then over the backend's
    assert backend.fetches == [([C], [])]  # one fetch: the second run asked for nothing new
    assert memory.store.get(C, 1_000) == remote


async def test_an_unchanged_state_is_decided_once() -> None:
    backend = Scripted()
    shared = SharedState(StateConfig(backend="redis://x"), Stats(), backend=backend)
    memory = _memory()
    seen: list[ConversationState | None] = []
    await shared.decide(
        _run(memory, 1_000, seen), memory.state_for(1_000), None, memory.store.put, lambda *a: None
    )
    assert seen == [None]
    assert backend.fetches == [([C], [])]


async def test_a_failing_backend_fails_open_counts_each_loss_and_warns_once_per_operation() -> None:
    stats = Stats()
    backend = Scripted(fail=True)
    shared = SharedState(StateConfig(backend="redis://x", retry_s=0), stats, backend=backend)
    memory = _memory()
    with capture_logs() as logs:
        for _ in range(3):
            seen: list[ConversationState | None] = []
            decision = await shared.decide(
                _run(memory, 1_000, seen), memory.state_for(1_000), None, memory.store.put, lambda *a: None
            )
            assert seen == [None] and decision.conversation == C  # decided with local state
            await shared.save_state(C, STATE)
            assert await shared.claim(C, "duplicate") is True  # a line rather than none
    assert dict(stats.backend_errors) == {"fetch": 3, "save_state": 3, "claim_incident": 3}
    warnings = [e for e in logs if e["event"] == "state_backend_error"]
    assert [(w["op"], w["error"], w["lost"]) for w in warnings] == [
        ("fetch", "ConnectionRefusedError", LOST["fetch"]),
        ("save_state", "ConnectionRefusedError", LOST["save_state"]),
        ("claim_incident", "ConnectionRefusedError", LOST["claim_incident"]),
    ]
    backend.fail = False
    with capture_logs() as logs:
        await shared.save_state(C, STATE)
    assert [e["event"] for e in logs] == ["state_backend_restored"]
    assert backend.saved == [(C, STATE)]


async def test_after_a_failure_the_backend_rests_for_retry_s() -> None:
    stats = Stats()
    backend = Scripted(fail=True)
    shared = SharedState(StateConfig(backend="redis://x", retry_s=3600), stats, backend=backend)
    for _ in range(3):
        await shared.save_state(C, STATE)
    assert stats.backend_errors["save_state"] == 3  # all lost, counted
    assert backend.saved == []
    backend.fail = False
    await shared.save_state(C, STATE)
    assert backend.saved == []  # still resting: not asked


async def test_without_a_shared_backend_nothing_is_fetched_or_counted() -> None:
    stats = Stats()
    shared = SharedState(StateConfig(), stats)
    memory = _memory()
    seen: list[ConversationState | None] = []
    await shared.decide(
        _run(memory, 1_000, seen), memory.state_for(1_000), None, memory.store.put, lambda *a: None
    )
    assert seen == [None]
    assert await shared.claim(C, "cap") is True
    assert await shared.totals() is None
    assert dict(stats.backend_errors) == {}


async def test_a_conversation_key_known_from_a_header_is_fetched_first_and_decided_once() -> None:
    remote = ConversationState({1: 100}, {}, (), None, 900)
    backend = Scripted({C: remote})
    shared = SharedState(StateConfig(backend="redis://x"), Stats(), backend=backend)
    memory = _memory()
    seen: list[ConversationState | None] = []
    await shared.decide(
        _run(memory, 1_000, seen), memory.state_for(1_000), None, memory.store.put, lambda *a: None, hint=C
    )
    assert seen == [remote]  # one decision, over the backend's copy
    assert backend.fetches == [([C], [])]


BAD_STATE = [
    pytest.param({"backend": "memcached://h:1"}, "state.backend", id="not_a_redis_url"),
    pytest.param({"timeout_ms": 0}, "state.timeout_ms", id="zero_timeout"),
    pytest.param({"retry_s": -1}, "state.retry_s", id="negative_retry"),
    pytest.param({"prefix": ""}, "state.prefix", id="empty_prefix"),
    pytest.param({"stats_interval_s": 0}, "state.stats_interval_s", id="zero_interval"),
    pytest.param({"backnd": "memory"}, "state.backnd", id="unknown_key"),
]


@pytest.mark.parametrize(("state", "key"), BAD_STATE)
def test_a_bad_state_section_fails_naming_the_key(state: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        build(Config, {"state": state})
    assert err.value.key == key


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "rediss://h:6380", "unix:///run/redis.sock"])
def test_redis_urls_are_accepted(url: str) -> None:
    assert build(Config, {"state": {"backend": url}}).state.shared
