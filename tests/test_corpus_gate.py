"""Corpus gate (issue 7): every loop fixture is acted on in time, no legit fixture is blocked.

Replays each fixture of ``tests/fixtures/loops`` (or ``$LOOPGUARD_LOOP_FIXTURES``) through the real
server with the shipped default config (:mod:`tests.corpus`). Run with ``-s`` to see the table.
Nothing is skipped or special-cased: every fixture found is replayed and judged by the same rule.
"""

from __future__ import annotations

import pytest

from tests.corpus import Replay, Verdict, judge, load_fixtures, replay, table

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


#: The harness tests pin every number they depend on, so that changes to the shipped defaults
#: cannot move their expectations: two guards (the seeds' rules), the stop and the runaway limits.
SEED = {
    "guards": {
        "repeat_reminder": {"progress_aware": False, "thresholds": [3, 5, 8]},
        "circuit_breaker": {"progress_aware": False, "duplicate_limit": 6},
        **{
            g: {"enabled": False}
            for g in (
                "recurrence",
                "cycles",
                "repeated_failure",
                "monologue",
                "echo_loop",
                "turn_guard",
                "escalation",
            )
        },
    },
    "stop": {"after_ignored_denials": 2},
    "response": {"max_calls_per_response": 32, "max_identical_per_response": 4},
}


def _with(config: dict[str, object], guard: str, **settings: object) -> dict[str, object]:
    guards = dict(config["guards"])  # type: ignore[call-overload]
    guards[guard] = {**guards[guard], **settings}
    return {**config, "guards": guards}


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


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_reminder_after_a_step_of_several_calls_counts_at_its_last_call(stream: bool) -> None:
    """Six identical parallel calls in one message: the runaway cut drops call 5 on (the first call
    the agent did not get); the reminders after the step (gentle at 3, detailed at 5) count at call
    6, the step's last call: the agent ran all six before the model read them."""
    fx = _fixture([[("read_file", '{"path": "a"}', "same")] * 6])
    r = await replay(fx, SEED, stream)
    assert [(o.call, o.kind, o.message, o.side, o.rules) for o in r.observations] == [
        (5, "cut", 1, "response", ("runaway",)),
        (6, "remind", 8, "request", ("repeat_reminder",)),
    ]
    assert [(m.call, m.upto, m.text.split(".")[0]) for m in r.reminders] == [
        (6, 8, "[loopguard] You have made the same tool call several times in a row"),
        (6, 8, "[loopguard] You are repeating the same tool call without making progress"),
    ]
    assert judge(r) == Verdict(False, "by call 3", "late (call 5)")
    in_time = Replay({**fx, "expect": {"intervene_by_call": 5}}, stream, r.observations)
    assert judge(in_time) == Verdict(True, "by call 5", "ok")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_appended_reminders_count_at_the_steps_last_call_withholds_at_their_own(stream: bool) -> None:
    """``tool_suffix`` delivery, steps of two calls (read_file, then ls, untracked and exempt) whose
    results come back in reverse order, so the step's last result is read_file's: a reminder
    appended to it counts at the step's last call (ls), a withhold at read_file's own call; the
    reminder appended to a denial text is a reminder too."""
    config = _with(SEED, "repeat_reminder", inject_as="tool_suffix", exclude=["ls"])
    config = _with(config, "circuit_breaker", exempt=["ls"])
    fx = _fixture([[("read_file", '{"path": "a"}', "same"), ("ls", "{}", "x")]] * 8)
    messages = fx["messages"]
    for k, m in enumerate(list(messages)):
        if m["role"] == "assistant":  # type: ignore[index]
            messages[k + 1], messages[k + 2] = messages[k + 2], messages[k + 1]  # type: ignore[index]
    r = await replay(fx, config, stream)
    assert [(o.call, o.kind, o.rules) for o in r.observations] == [
        (6, "remind", ("repeat_reminder",)),  # read_file's 3rd call is call 5
        (10, "remind", ("repeat_reminder",)),  # its 5th is call 9
        (13, "withhold", ("circuit_breaker",)),  # its 7th
        (15, "withhold", ("circuit_breaker",)),  # its 8th ...
        (16, "remind", ("repeat_reminder",)),  # ... and the reminder appended to that denial
    ]
    # history before each reminder: up to the result it was appended to (read_file's, listed last)
    assert [(m.call, m.upto, m.message) for m in r.reminders] == [(6, 10, 10), (10, 16, 16), (16, 25, 25)]
    assert [m.text.split("\n")[0] for m in r.reminders][1:] == [
        "[loopguard] You are repeating the same tool call without making progress."
    ] * 2
    assert "- consecutive_calls: 8" in r.reminders[2].text


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
