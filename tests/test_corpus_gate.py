"""Corpus gate (issue 7): every loop fixture is acted on in time, no legit fixture is blocked.

Replays each fixture of ``tests/fixtures/loops`` (or ``$LOOPGUARD_LOOP_FIXTURES``) through the real
server with the shipped default config (:mod:`tests.corpus`). Run with ``-s`` to see the table.
Nothing is skipped or special-cased: every fixture found is replayed and judged by the same rule.
"""

from __future__ import annotations

import pytest

from tests.corpus import Replay, judge, load_fixtures, replay, table

FIXTURES = load_fixtures()


async def _all(stream: bool) -> list[Replay]:
    return [await replay(fx, None, stream) for fx in FIXTURES]


def test_fixtures_found() -> None:
    assert FIXTURES, "no loop fixtures found"
    assert {fx["kind"] for fx in FIXTURES} <= {"loop", "legit"}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_corpus_gate(stream: bool) -> None:
    replays = await _all(stream)
    print(f"\ncorpus gate ({'sse' if stream else 'json'}), default config:\n{table(replays)}")
    failures = [f"{r.fixture['id']}: {judge(r).reason}" for r in replays if not judge(r).ok]
    assert not failures, "; ".join(failures)


def _fixture(steps: list[list[tuple[str, str, str]]], kind: str = "loop") -> dict[str, object]:
    """A fixture: one assistant message per entry of ``steps``, each a list of (tool, arguments,
    result)."""
    messages: list[dict[str, object]] = [{"role": "user", "content": "go"}]
    n = 0
    for calls in steps:
        wire, results = [], []
        for name, args, result in calls:
            n += 1
            wire.append({"id": f"c{n}", "type": "function", "function": {"name": name, "arguments": args}})
            results.append({"role": "tool", "tool_call_id": f"c{n}", "content": result})
        messages += [{"role": "assistant", "content": None, "tool_calls": wire}, *results]
    return {"id": "X1", "kind": kind, "messages": messages, "expect": {"intervene_by_call": 3}}


SEED = {
    "guards": {
        "repeat_reminder": {"progress_aware": False},
        "circuit_breaker": {"progress_aware": False},
        **{
            g: {"enabled": False}
            for g in ("recurrence", "cycles", "repeated_failure", "monologue", "echo_loop")
        },
    }
}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_harness_maps_what_the_proxy_did_to_call_numbers(stream: bool) -> None:
    """Ten identical calls, one per message: reminders at calls 3, 5, 8 (after their results),
    withholds from call 7, a stop of the 9th call (two withheld results ignored)."""
    fx = _fixture([[("read_file", '{"path": "a"}', "same")]] * 10)
    r = await replay(fx, SEED, stream)
    got = sorted((o.call, o.kind, o.rules) for o in r.observations)
    assert got == [
        (3, "remind", ("repeat_reminder",)),
        (5, "remind", ("repeat_reminder",)),
        (7, "withhold", ("circuit_breaker",)),
        (8, "remind", ("repeat_reminder",)),
        (8, "withhold", ("circuit_breaker",)),
        (9, "stop", ("stop",)),
        (9, "withhold", ("circuit_breaker",)),
        (10, "stop", ("stop",)),
        (10, "withhold", ("circuit_breaker",)),
    ]


async def test_harness_finds_the_call_a_reminder_concerns_inside_one_step() -> None:
    """Six identical parallel calls in one message: the reminder after the step concerns call 3
    (the step cut after call 3 already brings it), and a runaway cut drops call 5 on."""
    fx = _fixture([[("read_file", '{"path": "a"}', "same")] * 6])
    r = await replay(fx, SEED, False)
    assert sorted((o.call, o.kind) for o in r.observations)[:2] == [(3, "remind"), (5, "cut")]
    assert judge(r).ok


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_harness_reads_legacy_function_calls(stream: bool) -> None:
    messages: list[dict[str, object]] = [{"role": "user", "content": "go"}]
    for _ in range(5):
        fc = {"name": "get_weather", "arguments": '{"city": "Tokyo"}'}
        messages += [
            {"role": "assistant", "content": None, "function_call": fc},
            {"role": "function", "name": "get_weather", "content": "sunny"},
        ]
    fx = {"id": "X2", "kind": "loop", "messages": messages, "expect": {"intervene_by_call": 3}}
    r = await replay(fx, SEED, stream)
    assert [(o.call, o.kind) for o in r.observations] == [(3, "remind"), (5, "remind")]


async def test_a_degenerate_text_cut_is_a_block_on_a_legit_fixture() -> None:
    messages = [
        {"role": "user", "content": "write"},
        {"role": "assistant", "content": "ok " + "la la " * 600},
    ]
    fx = {"id": "X3", "kind": "legit", "messages": messages, "expect": {"no_block": True}}
    r = await replay(fx, None, True)
    assert [(o.call, o.kind, o.rules) for o in r.observations] == [(1, "cut", ("degenerate_text",))]
    assert not judge(r).ok
