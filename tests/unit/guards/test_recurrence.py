"""recurrence (DESIGN §6.5): the same call for the 3rd time within 20 calls of a turn, not all in a
row, progress-aware."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.config import Config, RecurrenceConfig, build
from proxy.core.actions import Remind
from proxy.guards import build_guards
from proxy.guards.recurrence import Recurrence
from tests.helpers.agent_steps import History
from tests.helpers.rule_helpers import summary, transcript

READ = ("read_file", {"path": "a.py"}, "x = 1")
LS = ("bash", {"command": "ls"}, "a.py b.py")
GREP = ("grep", {"pattern": "x"}, "a.py:1:x = 1")


def read(result: str) -> tuple[str, dict[str, Any], str]:
    return ("read_file", {"path": "a.py"}, result)


def guard(**settings: Any) -> Recurrence:
    return Recurrence(build(RecurrenceConfig, settings))


@pytest.mark.parametrize(
    ("calls", "settings", "expected"),
    [
        pytest.param([READ, LS, READ, GREP, READ], {}, [("remind", 5, 3)], id="third_in_window_fires"),
        pytest.param([READ, LS, READ, GREP, READ, LS, READ], {}, [("remind", 5, 3)], id="once_per_crossing"),
        pytest.param([READ, READ, READ], {}, [], id="all_in_a_row_left_to_repeat_reminder"),
        pytest.param([LS, READ, READ, READ], {}, [], id="in_a_row_after_another_call"),
        pytest.param(
            [read("v1"), LS, read("v2"), GREP, read("v3")], {}, [], id="new_result_each_time_is_progress"
        ),
        pytest.param(
            [read("v1"), LS, read("v2"), GREP, read("v3")],
            {"progress_aware": False},
            [("remind", 5, 3)],
            id="progress_aware_off_counts_every_identical_call",
        ),
        pytest.param(
            [
                read("at 2026-01-01T10:00:00Z took 0.5s"),
                LS,
                read("at 2026-01-01T10:00:09Z took 0.7s"),
                GREP,
                read("at 2026-01-01T10:01:00Z took 1.2s"),
            ],
            {},
            [("remind", 5, 3)],
            id="volatile_spans_masked",
        ),
        pytest.param(
            [
                READ,
                *[("bash", {"command": f"ls {i}"}, "") for i in range(10)],
                READ,
                *[("bash", {"command": f"cat {i}"}, "") for i in range(10)],
                READ,
            ],
            {},
            [],
            id="first_occurrence_left_the_window_of_20",
        ),
        pytest.param(
            [
                READ,
                *[("bash", {"command": f"ls {i}"}, "") for i in range(10)],
                READ,
                *[("bash", {"command": f"cat {i}"}, "") for i in range(10)],
                READ,
            ],
            {"window": 30},
            [("remind", 23, 3)],
            id="wider_window",
        ),
        pytest.param([READ, LS, READ, GREP], {"occurrences": 2}, [("remind", 3, 2)], id="occurrences_2"),
        pytest.param(
            [("read_file", {"path": "a.py", "offset": i * 100}, f"lines {i}") for i in range(5)],
            {},
            [],
            id="paging_with_an_offset",
        ),
        pytest.param(
            [("bash", {"command": "make", "description": d}, "ok") for d in ("a", "b")]
            + [LS, ("bash", {"command": "make", "description": "c"}, "ok")],
            {},
            [("remind", 4, 3)],
            id="description_ignored",
        ),
    ],
)
def test_recurrence(calls: list[Any], settings: dict[str, Any], expected: list[tuple[str, int, int]]) -> None:
    assert summary(guard(**settings), History().steps(calls)) == expected


@pytest.mark.parametrize(
    "build_history",
    [
        pytest.param(
            lambda: History().steps([READ, LS, READ]).user("I changed it").steps([READ]), id="user_message"
        ),
        pytest.param(
            lambda: History().steps(
                [
                    read("v1"),
                    ("edit_file", {"path": "a.py", "old": "1", "new": "2"}, "ok"),
                    read("v2"),
                    ("edit_file", {"path": "a.py", "old": "2", "new": "3"}, "ok"),
                    read("v3"),
                ]
            ),
            id="re_reading_a_file_after_editing_it",
        ),
        pytest.param(
            lambda: History().steps(
                [("job_status", {"id": 7}, s) for s in ("queued", "running 10%", "running 60%", "done")]
                + [LS, ("job_status", {"id": 7}, "done")]
            ),
            id="polling_a_job_whose_status_changes",
        ),
        pytest.param(
            lambda: History().step(*[("read_file", {"path": f"f{i}.py"}, "x") for i in range(6)]),
            id="batch_of_different_files",
        ),
    ],
)
def test_false_positive_guard_rails(build_history: Any) -> None:
    assert summary(guard(), build_history()) == []


def test_reminder_position_text_and_freshness() -> None:
    h = History().steps([READ, LS, READ, GREP, READ])
    t = transcript(h)
    (action,) = guard()(t, None)
    assert action == Remind(
        after=h.result_position(5),
        text=(
            "[loopguard] You keep coming back to the same tool call: read_file with the same arguments, "
            "3 times in your last 5 calls, and it returned the same result each time.\n"
            "- tool: read_file\n"
            '- arguments: {"path":"a.py"}\n'
            "Calling it again will not tell you anything new. Use the result you already have, or do "
            "something different."
        ),
        rule="recurrence",
        tool="read_file",
        count=3,
        limit=3,
        fresh=True,
        call=4,
    )
    h.steps([LS])
    (again,) = guard()(transcript(h), None)
    assert (again.after, again.fresh) == (action.after, False)


def test_runs_in_a_row_are_counted_when_repeat_reminder_is_off() -> None:
    h = History().steps([LS, READ, READ, READ])
    assert summary(Recurrence(RecurrenceConfig(), leave_runs=False), h) == [("remind", 4, 3)]
    cfg = build(Config, {"guards": {"repeat_reminder": {"enabled": False}}})
    (rec,) = [g for g in build_guards(cfg.guards) if getattr(g, "name", "") == "recurrence"]
    assert summary(rec, h) == [("remind", 4, 3)]
    (rec,) = [g for g in build_guards(Config().guards) if getattr(g, "name", "") == "recurrence"]
    assert summary(rec, h) == []


def test_tool_suffix_delivery() -> None:
    t = transcript(History().steps([READ, LS, READ, GREP, READ]))
    (action,) = Recurrence(RecurrenceConfig(), "tool_suffix")(t, None)
    assert action.delivery == "tool_suffix"
