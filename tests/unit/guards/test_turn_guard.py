"""turn_guard (DESIGN §6.3): pure tests over message lists, no sockets."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest

from proxy.config import Config, TurnGuardConfig, build
from proxy.core.actions import Withhold
from proxy.dialects.openai_chat import parse_request
from proxy.guards import build_guards
from proxy.guards.narration import Narration
from proxy.guards.turn_guard import MUTED_TEXT, TRIP_TEXT, TurnGuard
from proxy.request.rewrite import decide_request
from tests.helpers.agent_steps import Call, History
from tests.helpers.fakes import only_guard
from tests.helpers.resume_check import assert_resumes

OK = "ok"
FAIL = "Error: boom"
#: the loop rules (DESIGN §6.5), on by default, registered after turn_guard and narration
LOOP_RULES = ("recurrence", "cycles", "repeated_failure", "monologue", "echo_loop")


def guard(**cfg: Any) -> TurnGuard:
    return TurnGuard(build(TurnGuardConfig, {"enabled": True, **cfg}, "guards.turn_guard"))


def run(h: History, **cfg: Any) -> list[Withhold]:
    actions = guard(**cfg)(parse_request({"messages": h.messages}), None)
    assert all(isinstance(a, Withhold) for a in actions)
    return actions  # type: ignore[return-value]


def withheld(h: History, actions: list[Withhold]) -> list[int]:
    """1-based call numbers whose results are withheld."""
    by_position = {h.result_position(n): n for n in range(1, h.calls + 1)}
    return [by_position[a.position] for a in actions]


def writes(n: int, path: str = "fix.py") -> list[Call]:
    return [("write_file", {"path": path, "content": f"print({i})  # attempt {i}"}, OK) for i in range(n)]


def reads(*paths: str, result: str = OK) -> list[Call]:
    return [("read_file", {"path": p}, result) for p in paths]


def full(reason_evidence: str, limits: str, key: str) -> str:
    return TRIP_TEXT.format(evidence=reason_evidence, limits=limits, key=key)


# --- each limit at its default number (DESIGN §6.3) -----------------------------------------------


def test_rewrite_loop_trips_at_the_sixth_call_on_fix_py() -> None:
    h = History().steps([*writes(5), ("bash", {"command": "python fix.py"}, "NameError: x")])
    (a,) = run(h)
    assert withheld(h, [a]) == [6]
    assert (a.rule, a.reason, a.tool, a.count, a.limit, a.call_id, a.fresh) == (
        "turn_guard",
        "same_target",
        "bash",
        6,
        6,
        "c6",
        True,
    )
    assert a.text == (
        "[loopguard] The result of this call is withheld: this is call 6 on fix.py in this turn. "
        "The limit is 6 calls on the same target per turn (max_same_target). Stop calling tools now "
        "and answer the user in plain text: say what you tried, where you are stuck, and what the "
        "user must decide or provide before you go on."
    )


def test_edit_run_edit_run_loop_trips_at_the_sixth_call_on_the_file() -> None:
    calls: list[Call] = []
    for i, write in enumerate(writes(4)):
        calls += [write, ("bash", {"command": f"python ./fix.py --try {i}"}, "Traceback")]
    h = History().steps(calls)
    assert withheld(h, run(h, mute_after_trip=False)) == [6, 7, 8]
    assert [a.count for a in run(h)] == [6, 7, 8]


def test_command_run_before_the_write_counts_too() -> None:
    h = History().steps([("bash", {"command": "python fix.py"}, OK), *writes(5)])
    (a,) = run(h)
    assert withheld(h, [a]) == [6]
    assert (a.tool, a.reason, a.count) == ("write_file", "same_target", 6)


def test_command_words_that_are_no_target_of_the_turn_do_not_count() -> None:
    h = History().steps([("bash", {"command": f"python script_{i}.py"}, OK) for i in range(8)])
    assert run(h) == []  # "python" is a word of every command but no call's target


def test_five_failures_from_three_tools_withhold_the_sixth_call() -> None:
    h = History().steps(
        [
            ("read_file", {"path": "a.py"}, "cat: a.py: No such file or directory"),
            ("bash", {"command": "pytest"}, "Exit code: 1"),
            ("grep", {"pattern": "main", "path": "src"}, '{"error": "src: not a directory"}'),
            ("read_file", {"path": "b.py"}, "Error: permission denied"),
            ("bash", {"command": "python b.py"}, "Traceback (most recent call last):"),
            ("read_file", {"path": "c.py"}, OK),
        ]
    )
    (a,) = run(h)
    assert withheld(h, [a]) == [6]
    assert (a.reason, a.tool, a.count, a.limit) == ("failures", "read_file", 5, 5)
    assert a.text == full(
        "the last 5 tool results in this turn were failures.", "5 failed results in a row", "max_failures"
    )


def test_a_success_at_position_four_resets_the_failure_run() -> None:
    results = [FAIL, "bash: x: command not found", FAIL, OK, FAIL, "exit code 2", OK]
    tools = ["read_file", "bash", "grep", "read_file", "bash", "grep", "read_file"]
    h = History().steps(
        [(t, {"path": f"f{i}"}, r) for i, (t, r) in enumerate(zip(tools, results, strict=True))]
    )
    assert run(h) == []


def test_41_distinct_calls_in_one_turn_withhold_only_the_41st() -> None:
    h = History().steps(reads(*(f"src/m{i}.py" for i in range(41))))
    (a,) = run(h)
    assert withheld(h, [a]) == [41]
    assert (a.reason, a.count, a.limit) == ("turn_calls", 41, 40)
    assert a.text == full(
        "this is tool call 41 in this turn.", "40 tool calls per turn", "max_calls_per_turn"
    )


def test_41_distinct_calls_across_two_turns_withhold_nothing() -> None:
    h = History().steps(reads(*(f"src/m{i}.py" for i in range(20))))
    h.user().steps(reads(*(f"src/n{i}.py" for i in range(21))))
    assert run(h) == []


# --- same call, mute, turns ------------------------------------------------------------------------


def test_third_identical_call_trips_even_when_not_consecutive() -> None:
    h = History().steps(reads("a.py", "b.py", "a.py", "c.py", "a.py"))
    (a,) = run(h)
    assert withheld(h, [a]) == [5]
    assert (a.reason, a.count, a.limit) == ("same_call", 3, 3)
    assert a.text == full(
        "this is call 3 of read_file with these same arguments in this turn.",
        "3 identical calls per turn",
        "max_same_call",
    )


def test_free_text_fields_do_not_make_a_call_different() -> None:
    h = History().steps([("bash", {"command": "make", "description": f"try {i}"}, OK) for i in range(3)])
    assert [a.reason for a in run(h)] == ["same_call"]


@pytest.mark.parametrize(
    ("mute", "texts"),
    [
        (True, ["full", "muted", "muted"]),
        (False, ["full", "full", "full"]),
    ],
    ids=["mute_on", "mute_off"],
)
def test_mute_after_trip(mute: bool, texts: list[str]) -> None:
    h = History().steps(reads("a.py", "a.py", "a.py", "a.py", "b.py", "b.py", "b.py"))
    actions = run(h, mute_after_trip=mute)
    assert withheld(h, actions) == [3, 4, 7]
    expected = {
        3: full(
            "this is call 3 of read_file with these same arguments in this turn.",
            "3 identical calls per turn",
            "max_same_call",
        ),
        4: full(
            "this is call 4 of read_file with these same arguments in this turn.",
            "3 identical calls per turn",
            "max_same_call",
        ),
        7: full(
            "this is call 3 of read_file with these same arguments in this turn.",
            "3 identical calls per turn",
            "max_same_call",
        ),
    }
    muted = MUTED_TEXT.format(limits="3 identical calls per turn")
    assert muted == (
        "[loopguard] Result withheld: over the limit of 3 identical calls per turn again. Stop calling "
        "tools and answer the user."
    )
    got = [a.text for a in actions]
    assert got == [expected[n] if kind == "full" else muted for n, kind in zip([3, 4, 7], texts, strict=True)]


def test_a_user_message_starts_a_new_ledger() -> None:
    h = History().steps([*writes(5), *reads("a.py", "a.py")])
    h.user("try again").steps([("bash", {"command": "python fix.py"}, OK), *reads("a.py")])
    assert run(h) == []


def test_each_turn_gets_its_own_first_full_trip() -> None:
    h = History().steps(reads("a.py", "a.py", "a.py", "a.py")).user().steps(reads("a.py", "a.py", "a.py"))
    actions = run(h)
    assert withheld(h, actions) == [3, 4, 7]
    assert [a.text.startswith("[loopguard] The result") for a in actions] == [True, False, True]


@pytest.mark.parametrize(
    ("limit", "history"),
    [
        ("max_same_call", History().steps(reads("a", "a", "a", "a"))),
        ("max_same_target", History().steps(writes(8))),
        ("max_failures", History().steps(reads(*"abcdefgh", result=FAIL))),
        ("max_calls_per_turn", History().steps(reads(*(f"f{i}" for i in range(45))))),
    ],
)
def test_a_limit_of_zero_turns_that_limit_off(limit: str, history: History) -> None:
    others = {k: 0 for k in ("max_same_call", "max_same_target", "max_failures", "max_calls_per_turn")}
    assert run(history, **others) == []
    assert run(history, **{**others, limit: getattr(TurnGuardConfig(), limit)}) != []


def test_several_limits_at_once_report_the_first_in_order() -> None:
    # call 6 is the 3rd identical call, the 6th on a.py and follows 5 failures
    h = History().steps([("read_file", {"path": "a.py", "n": n}, FAIL) for n in (0, 1, 2, 0, 1, 0)])
    off = {"max_same_call": 0, "max_same_target": 0, "max_failures": 0}
    assert [(a.reason, a.count) for a in run(h)] == [("same_call", 3)]
    assert [(a.reason, a.count) for a in run(h, max_same_call=0)] == [("same_target", 6)]
    assert [(a.reason, a.count) for a in run(h, max_same_call=0, max_same_target=0)] == [("failures", 5)]
    assert run(h, **off) == []
    assert withheld(h, run(h)) == [6]


# --- replay details ---------------------------------------------------------------------------------


def test_parallel_calls_count_failures_of_earlier_steps_only() -> None:
    h = History().step(*reads(*"abcdef", result=FAIL))  # six failing calls in one step
    assert run(h) == []
    h.step(*reads("g"))
    assert [(a.reason, a.count) for a in run(h)] == [("failures", 6)]


def test_a_tripping_call_without_its_result_gets_no_action_but_counts() -> None:
    h = History().steps(reads("a", "a")).step(("read_file", {"path": "a"}, None))
    assert run(h) == []
    h.messages.append({"role": "tool", "tool_call_id": "c3", "content": OK})
    h.step(*reads("a"))
    actions = run(h)
    assert withheld(h, actions) == [3, 4]
    assert actions[1].text.startswith("[loopguard] Result withheld")  # call 3 was the first trip


def test_withheld_results_still_count_as_failures_by_what_the_tool_returned() -> None:
    h = History().steps([*reads("x", "x", "x", result=FAIL), *reads("y", "z", "w", result=OK)])
    # call 3 is withheld (3rd identical) but its result did fail: call 4 follows 3 failures
    assert [(a.reason, a.count) for a in run(h, max_failures=3)] == [("same_call", 3), ("failures", 3)]


def test_earlier_trips_are_rederived_identically_and_not_fresh() -> None:
    h = History().steps([*writes(5), ("bash", {"command": "python fix.py"}, "x")])
    (first,) = run(h)
    assert first.fresh
    h.steps(reads("notes.md", "todo.md"))
    assert run(h) == [dataclasses.replace(first, fresh=False)]


def test_target_overrides_apply() -> None:
    h = History().steps([("search", {"query": "loop guard", "page": i}, OK) for i in range(6)])
    assert run(h) == []
    (a,) = run(h, targets={"search": ["query"]})
    assert (a.reason, a.count) == ("same_target", 6)
    assert "call 6 on loop guard" in a.text


def test_long_targets_are_cut_in_the_text() -> None:
    cmd = "python -c '" + "x" * 300 + "'"
    h = History().steps([("bash", {"command": cmd, "n": i}, OK) for i in range(6)])
    (a,) = run(h)
    assert f"on {cmd[:200]}… (+{len(cmd) - 200} more chars) in this turn." in a.text


def test_custom_failure_patterns() -> None:
    h = History().steps(reads(*"abcdef", result="FAILED: 2 tests"))
    assert run(h) == []
    assert [a.reason for a in run(h, failure_patterns=["^FAILED:"])] == ["failures"]


# --- the ledger (GET /loop-guard?conversation=) ----------------------------------------------------


def test_ledger_summary_of_the_current_turn() -> None:
    h = History().steps(reads("old.py", "old.py", "old.py")).user()
    h.steps([*writes(5), ("bash", {"command": "python fix.py"}, FAIL), *reads("a.py", "a.py")])
    h.step(*reads("b.py", result=FAIL), ("bash", {"command": "ls"}, FAIL))
    ledger = guard().ledger(parse_request({"messages": h.messages}))
    assert ledger.summary() == {
        "turn": 2,
        "calls": 10,
        "same_call": [{"tool": "read_file", "target": "a.py", "count": 2}],
        "same_target": [{"target": "fix.py", "count": 6}, {"target": "a.py", "count": 2}],
        "consecutive_failures": 2,
        "trips": 1,
        "tripped": [{"call": 6, "tool": "bash", "limit": "max_same_target", "count": 6, "value": 6}],
    }


def test_ledger_summary_keeps_the_last_ten_trips() -> None:
    h = History().steps(reads(*(f"m{i}.py" for i in range(52))))
    summary = guard().ledger(parse_request({"messages": h.messages})).summary()
    assert (summary["calls"], summary["trips"], summary["same_call"], summary["same_target"]) == (
        52,
        12,
        [],
        [],
    )
    assert [t["call"] for t in summary["tripped"]] == list(range(43, 53))
    assert summary["tripped"][-1] == {
        "call": 52,
        "tool": "read_file",
        "limit": "max_calls_per_turn",
        "count": 52,
        "value": 40,
    }


@pytest.mark.parametrize("new_turn", [False, True], ids=["turn_with_calls", "turn_without_calls"])
def test_ledger_right_after_evaluation_equals_a_fresh_replay(new_turn: bool) -> None:
    h = History().steps([*writes(6), *reads("a", "a", "a", result=FAIL)])
    if new_turn:
        h.user()
    t = parse_request({"messages": h.messages})
    g = guard()
    g(t)
    assert g.ledger(t) == guard().ledger(t)
    other = parse_request({"messages": h.messages})  # an equal transcript, another object
    g(t)
    assert g.ledger(other) == guard().ledger(t)


def test_empty_ledger_when_the_turn_has_no_calls() -> None:
    h = History().steps(reads("a.py")).user()
    assert guard().ledger(parse_request({"messages": h.messages})).summary() == {
        "turn": 2,
        "calls": 0,
        "same_call": [],
        "same_target": [],
        "consecutive_failures": 0,
        "trips": 0,
        "tripped": [],
    }


# --- registry and the request pipeline -------------------------------------------------------------


def test_registered_after_circuit_breaker_with_narration_last() -> None:
    cfg = build(Config, {"guards": {"turn_guard": {"enabled": True}}})
    assert [g.name for g in build_guards(cfg.guards)] == [
        "repeat_reminder",
        "circuit_breaker",
        "turn_guard",
        "narration",
        *LOOP_RULES,
        "same_target",
        "waiting",
        "escalation",
    ]
    defaults = [g.name for g in build_guards(Config().guards)]
    assert defaults == [
        "repeat_reminder",
        "circuit_breaker",
        *LOOP_RULES,
        "same_target",
        "waiting",
        "escalation",
    ]
    no_narration = build(Config, only_guard("turn_guard", narrate_after_ms=0))
    (only,) = build_guards(no_narration.guards)
    assert isinstance(only, TurnGuard) and not isinstance(only, Narration)


def test_decide_request_rewrites_the_tripping_result() -> None:
    h = History().steps([*writes(5), ("bash", {"command": "python fix.py"}, "NameError: x")])
    cfg = build(Config, only_guard("turn_guard"))
    d = decide_request(h.body(), {}, build_guards(cfg.guards), ())
    assert d.changed
    sent = orjson.loads(d.body)["messages"]
    assert sent[:-1] == h.messages[:-1]
    assert sent[-1]["content"].startswith("[loopguard] The result of this call is withheld: this is call 6")


# --- resuming from a kept state -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("build_history", "denied"),
    [
        (lambda: History().steps([*writes(5), ("bash", {"command": "python fix.py"}, "NameError: x")]), [6]),
        (lambda: History().steps(reads("a", "a", "a")).user().steps(reads("a", "a", "a", "a")), [3, 6, 7]),
        (lambda: History().steps(reads(*"abcdefgh", result=FAIL)), [6, 7, 8]),
    ],
    ids=["same_target", "same_call_per_turn", "failures"],
)
def test_a_state_advanced_in_two_parts_withholds_what_the_whole_run_does(
    build_history: Any, denied: list[int]
) -> None:
    h = build_history()
    t = parse_request({"messages": h.messages})
    g = guard()

    def ledger_kept() -> None:  # kept by the advance to the end
        assert g.ledger(t) == guard().ledger(t)

    # cut at every step's assistant message
    whole = assert_resumes(g, t, cuts=[step.position for step in t.steps], after=ledger_kept)
    assert withheld(h, whole) == denied  # type: ignore[arg-type]


def test_ledger_after_a_resumed_evaluation_equals_a_fresh_replay() -> None:
    h = History().steps([*writes(6), *reads("a", "a", "a", result=FAIL)])
    t = parse_request({"messages": h.messages})
    g = guard()
    state = g.begin()
    g.advance(state, t, None, t.steps[-1].position)
    g.advance(state.copy(), t, None, t.message_count)
    ledger = g.ledger(t)
    assert ledger == g.replay([c for c in t.calls if c.turn == ledger.turn], ledger.turn)
    assert [(trip.index, trip.call.call_id, trip.reason) for trip in ledger.trips] == [
        (6, "c6", "same_target"),
        (9, "c9", "same_call"),
    ]
