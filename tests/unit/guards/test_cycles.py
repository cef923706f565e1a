"""cycles (DESIGN §6.5): a period of 2-5 calls, compared by tool and target, repeated 3 times →
reminder; the 4th repetition → withhold (progress-aware)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.config import Config, CyclesConfig, build
from proxy.core.actions import Remind, Withhold
from proxy.guards import Context, build_guards, evaluate
from proxy.guards.cycles import Cycles
from proxy.response.assemble import AssembledCall
from proxy.response.decide import StopJudge
from tests.helpers.agent_steps import History
from tests.helpers.rule_helpers import call_at, summary, transcript

GREP_A = ("bash", {"command": 'grep -rn "class X" .'}, "x.py:1:class X")
GREP_B = ("bash", {"command": 'grep -rn "class X" --include=*.py .'}, "x.py:1:class X")


def read(path: str, result: str = "content") -> tuple[str, dict[str, Any], str]:
    return ("read_file", {"path": path}, result)


def edit(path: str, new: str = "y", result: str = "Edited.") -> tuple[str, dict[str, Any], str]:
    return ("edit_file", {"path": path, "old": "x", "new": new}, result)


def pytest_cmd(result: str = "1 failed") -> tuple[str, dict[str, Any], str]:
    return ("bash", {"command": "pytest -q"}, result)


def guard(**settings: Any) -> Cycles:
    return Cycles(build(CyclesConfig, settings))


@pytest.mark.parametrize(
    ("calls", "settings", "expected"),
    [
        pytest.param([GREP_A, GREP_B] * 2, {}, [], id="two_rounds_nothing"),
        pytest.param([GREP_A, GREP_B] * 3, {}, [("remind", 6, 3)], id="third_round_reminder"),
        pytest.param([GREP_A, GREP_B] * 3 + [GREP_A], {}, [("remind", 6, 3)], id="fourth_round_started"),
        pytest.param(
            [GREP_A, GREP_B] * 5,
            {},
            [("remind", 6, 3), ("withhold", 8, 4), ("withhold", 9, 4), ("withhold", 10, 5)],
            id="fourth_round_withheld_and_every_later_call",
        ),
        pytest.param([GREP_A, GREP_B] * 4, {"withhold_at": 0}, [("remind", 6, 3)], id="withhold_off"),
        pytest.param(
            [read("a.py"), edit("a.py", "1"), pytest_cmd()] * 3,
            {},
            [("remind", 9, 3)],
            id="period_3_read_edit_test",
        ),
        pytest.param(
            [
                edit("fix.py", f"v{i}") if i % 2 == 0 else ("bash", {"command": "python fix.py"}, "boom")
                for i in range(6)
            ],
            {},
            [("remind", 6, 3)],
            id="edit_run_ping_pong_different_content_is_a_cycle",
        ),
        pytest.param([GREP_A] * 8, {}, [], id="exact_repeat_is_not_a_cycle"),
        pytest.param(
            [c for p in ("a.py", "b.py", "c.py", "d.py") for c in (read(p), edit(p))],
            {},
            [],
            id="per_item_batch_over_different_files",
        ),
        pytest.param(
            [c for i in range(4) for c in (read("a.py", f"v{i}"), edit("a.py", f"v{i + 1}"))],
            {},
            [],
            id="re_reading_after_each_edit_is_progress_never_reminded",
        ),
        pytest.param(
            [c for _ in range(4) for c in (read("a.py", "v0"), edit("a.py", "v1", "Error: no match"))],
            {},
            [("remind", 6, 3), ("withhold", 8, 4)],
            id="read_and_failing_edit_same_results_reminded_then_withheld",
        ),
        pytest.param(
            [c for i in range(4) for c in (edit("a.py", f"v{i}"), pytest_cmd())],
            {},
            [("remind", 6, 3)],
            id="new_edits_same_test_failure_reminded_never_withheld",
        ),
        pytest.param(
            [c for i in range(4) for c in (read("a.py", f"v{i}"), edit("a.py", f"v{i + 1}"))],
            {"progress_aware": False},
            [("remind", 6, 3), ("withhold", 8, 4)],
            id="progress_aware_off_withholds_anyway",
        ),
        pytest.param(
            [("search", {"query": q}, "hits") for q in ("a", "b") * 3],
            {},
            [("remind", 6, 3)],
            id="no_target_compared_by_arguments",
        ),
        pytest.param(
            [("search", {"query": q}, "hits") for q in ("a", "b", "c", "d", "e", "f")],
            {},
            [],
            id="no_target_different_arguments",
        ),
        pytest.param(
            [GREP_A, GREP_B] * 3,
            {"repetitions": 2, "withhold_at": 3},
            [("remind", 4, 2), ("withhold", 6, 3)],
            id="repetitions_2",
        ),
        pytest.param([read(p) for p in "abcdef"] * 3, {}, [], id="period_6_beyond_max_period"),
        pytest.param(
            [read(p) for p in "abcdef"] * 3, {"max_period": 6}, [("remind", 18, 3)], id="max_period_6"
        ),
    ],
)
def test_cycles(calls: list[Any], settings: dict[str, Any], expected: list[tuple[str, int, int]]) -> None:
    assert summary(guard(**settings), History().steps(calls)) == expected


def test_user_message_starts_afresh() -> None:
    h = History().steps([GREP_A, GREP_B] * 2).user("look elsewhere").steps([GREP_A, GREP_B])
    assert summary(guard(), h) == []


def test_reminder_and_withhold_texts_and_positions() -> None:
    h = History().steps([GREP_A, GREP_B] * 4)
    t = transcript(h)
    remind, withhold = guard()(t, None)
    assert remind == Remind(
        after=h.result_position(6),
        text=(
            "[loopguard] You are going in circles: the same 2 steps have now repeated 3 times in a row, "
            "and the last round gave the same results as the round before:\n"
            '  1. bash grep -rn "class X" .\n'
            '  2. bash grep -rn "class X" --include=*.py .\n'
            "Another round will end the same way. Stop and rethink: what did these results tell you, "
            "and what different step would get you further? If you are stuck, tell the user."
        ),
        rule="cycles",
        tool="bash",
        count=3,
        limit=3,
        fresh=False,
        call=5,
    )
    assert withhold == Withhold(
        position=h.result_position(8),
        call_id="c8",
        text=(
            "[loopguard] The result of this call is withheld: it continues a cycle of 2 steps "
            "(bash → bash) that you have now repeated 4 times without a different outcome. Break the "
            "cycle: use the results you already have, try a different approach, or tell the user what is "
            "blocking you."
        ),
        rule="cycles",
        tool="bash",
        count=4,
        limit=4,
        fresh=True,
        reason="cycle",
    )


def judge(h: History, config: dict[str, Any] | None = None) -> StopJudge:
    cfg = build(Config, config or {})
    t = transcript(h)
    guards = build_guards(cfg.guards)
    ctx = Context(conversation="c")
    return StopJudge(t, evaluate(t, guards, ctx), guards, ctx, cfg)


@pytest.mark.parametrize(
    ("rounds", "next_call", "stops"),
    [
        pytest.param(5, GREP_A, True, id="two_withheld_then_the_cycle_goes_on"),
        pytest.param(5, ("bash", {"command": "cat x.py"}, ""), False, id="breaking_the_cycle"),
        pytest.param(4, GREP_A, False, id="one_withheld_only"),
    ],
)
def test_response_side_stops_a_cycle_that_ignores_its_denials(
    rounds: int, next_call: tuple[str, dict[str, Any], str], stops: bool
) -> None:
    """Calls 8, 9 and 10 of A B ×5 are withheld (cycles); the answer continuing the cycle with a
    call whose result is not known yet is judged by the previous pair and ends the turn."""
    h = History().steps([GREP_A, GREP_B] * rounds)
    stop = judge(h)([AssembledCall("n", next_call[0], orjson.dumps(next_call[1]).decode())])
    assert (stop is not None) == stops
    if stop is not None:
        assert (stop.rule, stop.reason, stop.tool) == ("stop", "denials", "bash")


def test_a_long_cycle_resumed_at_every_message_decides_the_same_with_a_small_state() -> None:
    """600 calls of A B: the reminder on call 6, then every call from 8 on withheld; advancing
    one message at a time from a copy of the state gives the same actions, and the verdict memo
    is pruned (a copy stays small however long the turn)."""
    g = guard()
    t = transcript(History().steps([GREP_A, GREP_B] * 300))
    whole = g(t, None)
    assert [(a.kind, call_at(t, a)) for a in whole] == [("remind", 6)] + [
        ("withhold", k) for k in range(8, 601)
    ]
    state = g.begin()
    pieces: list[Any] = []
    for upto in range(1, t.message_count + 1):
        state = state.copy()
        pieces.extend(g.advance(state, t, None, upto))
        assert len(state.memo) <= 16 * 5 * 5 + 5
    assert pieces == whole
    assert min(k for k, _ in state.memo) > 100  # the early calls' verdicts were dropped
