"""same_target on parallel calls: the reminder goes after the step, so what it says must be true
there. A threshold reached in the middle of a step (Claude Code's parallel Edits of one file) is
reminded about at the step's last call, with the run's length and last arguments there; a run
that ended inside the step is not reminded about. Each reminder's claims are checked with
:func:`tests.helpers.reminder_facts.check_reminder` against the history before it."""

from __future__ import annotations

import pytest

from proxy.core.actions import Remind
from tests.helpers.agent_steps import History
from tests.helpers.reminder_facts import check_reminder
from tests.helpers.resume_check import assert_resumes
from tests.helpers.rule_helpers import summary, transcript
from tests.unit.guards.test_same_target import drift, drifting, guard

HISTORIES = {
    "seven_parallel_calls_one_reminder_for_all": (History().step(*drifting(7)), [("remind", 7, 7)]),
    "a_run_that_ends_inside_the_step_is_not_reminded": (
        History().step(*drifting(3), drift("d", path="u.py")),
        [],
    ),
    "a_threshold_reached_mid_step_counts_the_whole_step": (
        History().steps(drifting(2)).step(drift("c"), drift("d")),
        [("remind", 4, 4)],
    ),
    "one_call_per_step_as_before": (History().steps(drifting(5)), [("remind", 3, 3), ("remind", 5, 5)]),
}


@pytest.mark.parametrize(("history", "expected"), list(HISTORIES.values()), ids=list(HISTORIES))
def test_same_target_reminds_at_the_end_of_the_step(
    history: History, expected: list[tuple[str, int, int]]
) -> None:
    assert summary(guard(), history) == expected


@pytest.mark.parametrize("history", [h for h, _ in HISTORIES.values()], ids=list(HISTORIES))
def test_every_reminder_is_true_where_it_goes(history: History) -> None:
    actions = guard()(transcript(history), None)
    for a in actions:
        assert isinstance(a, Remind)
        assert check_reminder(history.messages[: a.after + 1], a.text) == []


@pytest.mark.parametrize(("history", "expected"), list(HISTORIES.values()), ids=list(HISTORIES))
def test_advanced_in_two_parts_anywhere_gives_the_whole_run(
    history: History, expected: list[tuple[str, int, int]]
) -> None:
    assert len(assert_resumes(guard(), transcript(history))) == len(expected)
