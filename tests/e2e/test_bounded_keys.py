"""What an agent chooses and the proxy keeps per conversation is bounded: a conversation key (a
``conversation_key`` header, ``prompt_cache_key``) and a ``previous_response_id`` of megabytes
are held and logged as fixed-size digests, through the real server, and the state store is
bounded by bytes as well as by entries (a ledger names call targets, which can be large)."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest
from structlog.testing import capture_logs

from proxy.core.state import ENTRY_OVERHEAD, TIME_BYTES, ConversationState, StateStore, state_size
from proxy.edge.keys import INCIDENTS_KEY, MEMORY_KEY, PREFIX_KEY, RESPONSES_KEY
from proxy.request.conversation import key_digest
from proxy.request.response_store import UNKNOWN_PREVIOUS, store_key
from tests.helpers.fakes import FakeUpstream, repeated_call_messages
from tests.helpers.proxy_server import serve

MIB = 1 << 20
CHAT = "/v1/chat/completions"
#: Turn guard on (it keeps per-conversation state), the circuit breaker trips on the 3rd call.
CONFIG = {"guards": {"turn_guard": {"enabled": True}, "circuit_breaker": {"duplicate_limit": 2}}}


def big_key(i: int, size: int) -> str:
    return (f"key-{i:04d}-" * (size // 8 + 1))[:size]


@pytest.mark.parametrize(
    ("where", "size"),
    [
        pytest.param("prompt_cache_key", MIB, id="prompt_cache_key_1_mib"),
        pytest.param("x-session-id", 60 * 1024, id="header_60_kib"),  # header lines stop at 64 KiB
    ],
)
async def test_a_huge_conversation_key_is_held_and_logged_as_its_digest(
    upstream: FakeUpstream, where: str, size: int
) -> None:
    keys = [big_key(i, size) for i in range(6)]
    with capture_logs() as logs:
        async with serve(CONFIG, upstream.url) as (base, app), aiohttp.ClientSession() as s:
            for key in keys:
                body: dict[str, Any] = {"model": "m", "messages": repeated_call_messages(3)}
                headers = {"Content-Type": "application/json"}
                if where == "prompt_cache_key":
                    body["prompt_cache_key"] = key
                else:
                    headers[where] = key
                async with s.post(base + CHAT, data=orjson.dumps(body), headers=headers) as r:
                    assert r.status == 200
            async with s.get(base + "/loop-guard") as r:
                stats = await r.json()
            states = list(app[MEMORY_KEY].store._items)
            prefixes = [k for _, k in app[PREFIX_KEY]._entries]
            seen = [agent for agent, _ in app[INCIDENTS_KEY]._seen]
    digests = [key_digest(k) for k in keys]
    requests = [e for e in logs if e["event"] == "request"]
    assert [e["conversation"] for e in requests] == digests
    assert max(len(orjson.dumps(e)) for e in logs) < 2048
    assert (states, prefixes, seen) == (digests, digests, digests)
    assert [i["agent"] for i in stats["incidents"]] == digests
    assert len(orjson.dumps(stats)) < 16 * 1024


async def test_a_huge_previous_response_id_is_logged_and_remembered_as_a_digest(
    upstream: FakeUpstream,
) -> None:
    rid = "resp_" + big_key(0, 2 * MIB)
    body = orjson.dumps({"model": "m", "input": "hi", "previous_response_id": rid})
    with capture_logs() as logs:
        async with serve(None, upstream.url) as (base, app), aiohttp.ClientSession() as s:
            for _ in range(2):
                async with s.post(
                    base + "/v1/responses", data=body, headers={"Authorization": "Bearer k"}
                ) as r:
                    assert r.status == 200
            lost = list(app[RESPONSES_KEY]._lost)
    (unknown,) = [e for e in logs if e["event"] == UNKNOWN_PREVIOUS]  # once per chain
    assert unknown["previous_response_id_digest"] == key_digest(rid) == "id-" + key_digest(rid)[3:]
    assert max(len(orjson.dumps(e)) for e in logs) < 2048
    assert lost == [store_key({"authorization": "Bearer k"}, rid)]
    assert len(lost[0]) == 34


# --- the state store: bytes as well as entries -------------------------------------------------------


def state(ledger_bytes: int, seen_ms: int = 1) -> ConversationState:
    return ConversationState({0: seen_ms}, {}, (), b"x" * ledger_bytes, seen_ms)


def test_state_size_counts_the_key_the_ledger_and_each_time() -> None:
    assert state_size("id-0123456789abcdef", state(1000)) == ENTRY_OVERHEAD + 19 + 1000 + TIME_BYTES


@pytest.mark.parametrize(
    ("ledgers", "kept"),
    [
        pytest.param([10_000] * 5, ["c2", "c3", "c4"], id="oldest_dropped_past_the_budget"),
        pytest.param([10_000, 40_000], ["c0"], id="one_over_the_budget_alone_is_not_kept"),
        pytest.param([100] * 5, ["c1", "c2", "c3", "c4"], id="count_limit_still_applies"),
    ],
)
def test_the_state_store_is_bounded_by_bytes_as_well_as_entries(ledgers: list[int], kept: list[str]) -> None:
    store = StateStore(max_conversations=4, max_bytes=35_000)
    for i, size in enumerate(ledgers):
        store.put(f"c{i}", state(size))
    assert list(store._items) == kept
    assert store.size == sum(state_size(k, store.get(k, 1)) for k in kept)  # type: ignore[arg-type]
    assert store.size <= 35_000


def test_a_replaced_state_is_counted_once() -> None:
    store = StateStore(max_bytes=100_000)
    store.put("c", state(50_000))
    store.put("c", state(10))
    assert store.size == state_size("c", state(10))
