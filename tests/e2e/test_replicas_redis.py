"""Several replicas sharing state through a real ``redis-server``: two ``loopguard
serve`` processes in front of one fake upstream get alternating requests of the same
conversations. What reaches the upstream is byte for byte what one proxy alone sends (narration
timing and marks are shared), the two incident logs hold one line per conversation and kind (a
retry sent to the other replica included), a ``previous_response_id`` chain is guarded across
replicas as one proxy guards it, and the stats add up. A Redis outage fails open: requests are
still answered and guarded with local state, and a counter and one warning per operation say
what was lost."""

from __future__ import annotations

import asyncio
import re
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from openai import AsyncOpenAI

from proxy.guards.narration import TEXT as NARRATION
from proxy.request.conversation import key_digest
from tests.e2e.test_responses_chain_e2e import looping_script, respond, seen
from tests.e2e.test_shutdown import free_port
from tests.helpers.fake_responses import FakeResponses
from tests.helpers.fakes import FakeUpstream, looping_handler, repeated_call_messages
from tests.helpers.proxy_server import serve, serve_process
from tests.helpers.redis_server import RedisServer, redis_server

CHAT = "/v1/chat/completions"
CONVERSATIONS = ("conv-a", "conv-b")
STEPS = 8
#: Narration after 1.5 s of silence, once: the run waits 2.2 s before step 4.
TURN_GUARD = {"enabled": True, "narrate_after_ms": 1500, "narrate_every_ms": 3_600_000}
NARRATION_HEAD = NARRATION.split("{duration}")[0]
SILENCE = re.compile(rb"working for \d+ seconds?")


@pytest.fixture
async def redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    async with redis_server(tmp_path) as server:
        yield server


@dataclass
class Replica:
    proc: asyncio.subprocess.Process
    base: str
    log: Path
    incidents: Path

    def lines(self) -> list[dict[str, Any]]:
        return [orjson.loads(x) for x in self.log.read_bytes().splitlines() if x.startswith(b"{")]


def replica_config(redis_url: str, incidents: Path, **state: Any) -> dict[str, Any]:
    """A replica on ``redis_url``: Redis calls may take up to 5 s here (the default 50 ms is for
    production; on a loaded 2-core test machine a call can take longer, and these tests want no
    fail-open unless they cause it)."""
    return {
        "state": {"backend": redis_url, "timeout_ms": 5000, **state},
        "guards": {"turn_guard": TURN_GUARD, "circuit_breaker": {"incident_log": str(incidents)}},
    }


async def start_replica(upstream_url: str, tmp_path: Path, name: str, config: dict[str, Any]) -> Replica:
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_bytes(orjson.dumps(config))  # JSON is YAML
    log = tmp_path / f"{name}.log"
    port = free_port()
    with log.open("wb") as err:
        proc = await serve_process(upstream_url, port, cfg, stderr=err)
    replica = Replica(
        proc, f"http://127.0.0.1:{port}", log, Path(config["guards"]["circuit_breaker"]["incident_log"])
    )
    for _ in range(400):
        if b'"listening"' in log.read_bytes():
            return replica
        assert proc.returncode is None, log.read_text()
        await asyncio.sleep(0.05)
    raise AssertionError(f"replica {name} did not start: {log.read_text()}")


async def stop(*replicas: Replica) -> None:
    for r in replicas:
        if r.proc.returncode is None:
            r.proc.send_signal(signal.SIGTERM)
    for r in replicas:
        try:
            assert await asyncio.wait_for(r.proc.wait(), 15) == 0
        finally:
            if r.proc.returncode is None:
                r.proc.kill()
                await r.proc.wait()


@pytest.fixture
async def replicas(
    upstream: FakeUpstream, redis: RedisServer, tmp_path: Path
) -> AsyncIterator[tuple[Replica, Replica]]:
    """Two replicas on one Redis (started together), stopped at the end."""
    a, b = await asyncio.gather(
        *(
            start_replica(upstream.url, tmp_path, name, replica_config(redis.url, tmp_path / f"{name}.jsonl"))
            for name in ("a", "b")
        )
    )
    try:
        yield a, b
    finally:
        await stop(a, b)


async def chat_run(bases: list[str]) -> None:
    """Each conversation's requests 1..STEPS (its history grows by one looping step each time),
    the conversations interleaved, each request to the next base in turn (with two bases the
    replicas alternate within a conversation); 2.2 s of silence before step 4."""
    async with aiohttp.ClientSession() as s:
        for step in range(1, STEPS + 1):
            if step == 4:
                await asyncio.sleep(2.2)
            for i, conv in enumerate(CONVERSATIONS):
                base = bases[(step + i) % len(bases)]
                body = {"model": "m", "messages": repeated_call_messages(step)}
                async with s.post(base + CHAT, json=body, headers={"x-session-id": conv}) as r:
                    assert r.status == 200
                    await r.read()


def incidents_of(*paths: Path) -> list[tuple[str, str]]:
    out = []
    for p in paths:
        if p.exists():
            out += [(x["agent"], x["kind"]) for x in map(orjson.loads, p.read_bytes().splitlines())]
    return sorted(out)


async def stats(s: aiohttp.ClientSession, base: str) -> Any:
    async with s.get(base + "/loop-guard") as r:
        return await r.json()


async def test_alternating_replicas_send_what_one_proxy_sends_and_log_each_incident_once(
    upstream: FakeUpstream, replicas: tuple[Replica, Replica], tmp_path: Path
) -> None:
    a, b = replicas
    upstream.handler = looping_handler
    await chat_run([a.base, b.base])
    shared = [r.body for r in upstream.requests]
    async with aiohttp.ClientSession() as s:
        a_stats, b_stats = await stats(s, a.base), await stats(s, b.base)
    # a retry of every request of conv-a, each to the replica that did not serve it first: the
    # one that carried a fresh denial is the same incident, claimed already
    async with aiohttp.ClientSession() as s:
        for step in range(1, STEPS + 1):
            base = (a.base, b.base)[(step + 1) % 2]
            body = {"model": "m", "messages": repeated_call_messages(step)}
            async with s.post(base + CHAT, json=body, headers={"x-session-id": "conv-a"}) as r:
                assert r.status == 200
    await stop(a, b)

    upstream.requests.clear()
    single_log = tmp_path / "single.jsonl"
    config = {"guards": {"turn_guard": TURN_GUARD, "circuit_breaker": {"incident_log": str(single_log)}}}
    async with serve(config, upstream.url) as (base, _):
        await chat_run([base])
    single = [r.body for r in upstream.requests]

    assert len(shared) == len(single) == STEPS * len(CONVERSATIONS)
    # the reminder says how long the agent was silent, in whole seconds: the two runs' clocks
    # may round differently, so that number is compared within each run (a mark renders the same
    # on every later request, whichever replica sends it) and masked between the runs
    for run in (shared, single):
        for conv in range(len(CONVERSATIONS)):  # the bodies alternate between the conversations
            bodies = run[conv :: len(CONVERSATIONS)]
            assert len({m for body in bodies for m in SILENCE.findall(body)}) == 1
    assert [SILENCE.sub(b"working for N", x) for x in shared] == [
        SILENCE.sub(b"working for N", x) for x in single
    ]
    for conv_last in shared[-2:]:  # one narration per conversation, re-sent where it was injected
        assert conv_last.count(NARRATION_HEAD.encode()) == 1
    assert sum(x.count(NARRATION_HEAD.encode()) > 0 for x in shared) == 2 * (STEPS - 3)
    want = incidents_of(single_log)
    assert want and len(set(want)) == len(want)
    assert {agent for agent, _ in want} == {key_digest(c) for c in CONVERSATIONS}
    assert incidents_of(a.incidents, b.incidents) == want  # once each, over both replicas

    # stats: each replica its own, the sum over both under "replicas"
    assert (a_stats["requests"], b_stats["requests"]) == (STEPS, STEPS)
    assert b_stats["replicas"]["replicas"] == 2
    assert b_stats["replicas"]["requests"] == 2 * STEPS
    assert b_stats["replicas"]["per_rule"] == {
        k: a_stats["per_rule"].get(k, 0) + b_stats["per_rule"].get(k, 0)
        for k in a_stats["per_rule"].keys() | b_stats["per_rule"].keys()
    }
    assert a_stats["state_backend_errors"] == b_stats["state_backend_errors"] == {}


async def chain_run(clients: list[AsyncOpenAI]) -> int:
    """A looping agent on ``previous_response_id`` (only new items each time), each request to
    the next client in turn, until the model answers without a call; returns the requests."""
    new: list[Any] = [{"role": "user", "content": "Fix the bug in app.py"}]
    prev = None
    for step in range(1, 21):
        client = clients[step % len(clients)]
        final = await respond(client, False, input=new, **({"previous_response_id": prev} if prev else {}))
        prev = final.id
        calls = [i for i in final.output if i.type == "function_call"]
        if not calls:
            assert final.output_text.startswith("[loopguard] Stopped: the model kept calling")
            return step
        new = [{"type": "function_call_output", "call_id": c.call_id, "output": "print('hi')"} for c in calls]
    raise AssertionError("the loop was never stopped")


async def test_a_previous_response_id_chain_is_guarded_across_replicas(
    upstream: FakeUpstream, replicas: tuple[Replica, Replica]
) -> None:
    a, b = replicas
    fake = FakeResponses(looping_script(), stateful=True)
    upstream.handler = fake.handle
    clients = [AsyncOpenAI(base_url=f"{r.base}/v1", api_key="sk-test", max_retries=0) for r in (a, b)]
    try:
        requests = await chain_run(clients)
    finally:
        for c in clients:
            await c.close()
    async with aiohttp.ClientSession() as s:
        a_stats, b_stats = await stats(s, a.base), await stats(s, b.base)

    alone = FakeResponses(looping_script(), stateful=True)
    upstream.handler = alone.handle
    async with serve({"guards": {"turn_guard": TURN_GUARD}}, upstream.url) as (base, _):
        client = AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0)
        try:
            alone_requests = await chain_run([client])
        finally:
            await client.close()

    assert requests == alone_requests == 5
    assert [seen(h) for h in fake.histories] == [seen(h) for h in alone.histories]
    assert [b.get("previous_response_id") is not None for b in fake.bodies] == [False] + [True] * 4
    assert a_stats["unguarded"] == b_stats["unguarded"] == {}
    # every chained request was guarded over the chain the other replica kept
    chained = [x for r in (a, b) for x in r.lines() if x.get("event") == "request" and "chain_items" in x]
    assert len(chained) == 4
    assert not [x for r in (a, b) for x in r.lines() if x.get("event") == "unknown_previous_response"]


async def test_a_redis_outage_fails_open_with_a_counter_and_one_warning_per_operation(
    upstream: FakeUpstream, redis: RedisServer, tmp_path: Path
) -> None:
    upstream.handler = looping_handler
    config = replica_config(redis.url, tmp_path / "a.jsonl", retry_s=0)
    replica = await start_replica(upstream.url, tmp_path, "a", config)
    try:
        async with aiohttp.ClientSession() as s:

            async def send(step: int) -> bytes:
                body = {"model": "m", "messages": repeated_call_messages(step)}
                async with s.post(replica.base + CHAT, json=body, headers={"x-session-id": "c"}) as r:
                    assert r.status == 200
                    await r.read()
                return upstream.requests[-1].body

            for step in (1, 2):
                await send(step)
            redis.kill()
            await redis.process.wait()
            after = [await send(step) for step in range(3, 7)]
            got = await stats(s, replica.base)
            async with s.get(replica.base + "/loop-guard/metrics") as r:
                metrics = await r.text()
    finally:
        await stop(replica)
    # decisions went on with local state: the looping steps got their reminder and withholds
    assert all(b"[loopguard]" in body for body in after)
    assert got["state_backend_errors"]["fetch"] == 4
    assert got["state_backend_errors"]["save_state"] == 4
    assert 'loopguard_state_backend_errors_total{op="fetch"} 4.0' in metrics
    assert 'loopguard_state_backend_errors_total{op="save_state"} 4.0' in metrics
    warnings = [x for x in replica.lines() if x.get("event") == "state_backend_error"]
    by_op = {x["op"]: x for x in warnings}
    assert [x["op"] for x in warnings].count("fetch") == 1
    assert [x["op"] for x in warnings].count("save_state") == 1
    assert by_op["fetch"]["level"] == "warning"
    assert by_op["fetch"]["lost"].startswith("decided with this replica's state only")
    assert (
        by_op["save_state"]["lost"] == "this request's narration timing and first-seen times are not shared"
    )
    assert "replicas" not in got  # the totals could not be read
