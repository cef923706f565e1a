"""same_target (DESIGN §2.2): the same tool on one target, arguments drifting, the result not
changing → reminder at the thresholds; resumable: split anywhere, the same actions."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.config import SameTargetConfig, build
from proxy.guards.same_target import SameTarget
from tests.helpers.agent_steps import Call, History
from tests.helpers.resume_check import assert_resumes
from tests.helpers.rule_helpers import summary, transcript


def drift(note: str, result: str = "x = 1", path: str = "t.py") -> Call:
    return ("read_file", {"path": path, "note": note}, result)


THINK: Call = ("think", {"thought": "hm"}, "Your thought has been logged.")
EDIT: Call = ("edit_file", {"path": "t.py", "old": "1", "new": "2"}, "Edited.")


FILE = "/r/app.py"
EDITED = f"The file {FILE} has been updated successfully."


def edit(old: str, new: str, **extra: Any) -> Call:
    """Claude Code's Edit of app.py, answered with its constant success line."""
    return ("Edit", {"file_path": FILE, "old_string": old, "new_string": new, **extra}, EDITED)


def not_found(old: str) -> Call:
    """Claude Code's Edit whose old text is missing: the error echoes it."""
    error = f"<tool_use_error>String to replace not found in file.\nString: {old}</tool_use_error>"
    return ("Edit", {"file_path": FILE, "old_string": old, "new_string": "y"}, error)


def grep(pattern: str, result: str, path: str = "/r/src") -> Call:
    """OpenCode's grep in one directory."""
    return ("grep", {"pattern": pattern, "path": path}, result)


def glob(pattern: str, result: str) -> Call:
    """OpenCode's glob in the project."""
    return ("glob", {"pattern": pattern, "path": "/r"}, result)


def guard(**settings: Any) -> SameTarget:
    return SameTarget(build(SameTargetConfig, settings))


def drifting(n: int) -> list[Call]:
    return [drift(chr(ord("a") + k)) for k in range(n)]


HISTORIES = {
    "three_drifting_calls_same_result": (History().steps(drifting(3)), [("remind", 3, 3)]),
    "two_drifting_calls_nothing": (History().steps(drifting(2)), []),
    "every_threshold_of_a_long_run": (
        History().steps(drifting(8)),
        [("remind", 3, 3), ("remind", 5, 5), ("remind", 8, 8)],
    ),
    "identical_calls_are_repeat_reminders": (History().steps([drift("a")] * 3), []),
    "a_new_result_ends_the_run": (History().steps([drift("a"), drift("b"), drift("c", "x = 2")]), []),
    "another_target_ends_the_run": (History().steps([drift("a"), drift("b", path="u.py"), drift("c")]), []),
    "a_call_without_target_ends_the_run": (History().steps([drift("a"), drift("b"), THINK, drift("c")]), []),
    "an_edit_in_between_is_a_change": (History().steps([drift("a"), drift("b"), EDIT, drift("c")]), []),
    "a_new_request_ends_the_run": (
        History().steps(drifting(2)).user("Now look at the tests instead.").steps([drift("c")]),
        [],
    ),
    "continue_goes_on_with_the_run": (
        History().steps(drifting(2)).user("continue").steps([drift("c")]),
        [("remind", 3, 3)],
    ),
    "ten_successful_edits_with_new_changes_are_progress": (
        History().steps([edit(f"v = {k}", f"v = {k + 1}") for k in range(10)]),
        [],
    ),
    "edits_going_back_and_forth_are_a_rewrite_loop": (
        History().steps([edit("A", "B"), edit("B", "A")] * 3),
        [("remind", 3, 3), ("remind", 5, 5)],
    ),
    "the_same_edit_again_is_no_progress": (
        History().steps([edit("A", "B"), edit("A", "B", replace_all=True), edit("A", "B")]),
        [("remind", 3, 3)],
    ),
    "a_new_edit_after_a_revert_starts_again": (
        History().steps([edit("A", "B"), edit("B", "A"), edit("A", "C"), edit("C", "D")]),
        [],
    ),
    "failing_edits_echoing_their_old_text_are_one_failure": (
        History().steps([not_found(f"def f{k}():") for k in range(5)]),
        [("remind", 3, 3), ("remind", 5, 5)],
    ),
    # searching with one pattern after another that each find nothing is exploration
    "greps_with_different_patterns_finding_nothing": (
        History().steps([grep(p, "No files found") for p in ("loadConfig", "readConfig", "config.load")]),
        [],
    ),
    "globs_with_different_patterns_finding_nothing": (
        History().steps(
            [glob(p, "No files found") for p in ("**/*.cfg", "**/config.*", "src/**/set*", "*.ini")]
        ),
        [],
    ),
    "claude_code_greps_finding_nothing": (
        History().steps(
            [("Grep", {"pattern": p, "path": "/r/src"}, "No matches found") for p in ("a(", "a\\(", "a[(]")]
        ),
        [],
    ),
    "gemini_searches_finding_nothing": (
        History().steps(
            [
                (
                    "search_file_content",
                    {"pattern": p, "path": "/r"},
                    f'No matches found for pattern "{p}" in path "/r".',
                )
                for p in ("foo", "bar", "baz")
            ]
        ),
        [],
    ),
    # ... while drifting searches that keep finding the same thing are still a run
    "greps_with_drifting_patterns_finding_the_same_file": (
        History().steps([grep(p, "Found 1 matches\n/r/src/a.ts:\n  Line 3: x") for p in ("x", "x ", " x")]),
        [("remind", 3, 3)],
    ),
    "a_search_finding_nothing_ends_a_run": (
        History().steps([*drifting(2), grep("x", "No files found", path="t.py"), drift("c")]),
        [],
    ),
    "run_after_a_new_request_counts_afresh": (
        History().steps(drifting(2)).user("Now look at the tests instead.").steps(drifting(3)),
        [("remind", 5, 3)],
    ),
}


@pytest.mark.parametrize(("history", "expected"), list(HISTORIES.values()), ids=list(HISTORIES))
def test_same_target(history: History, expected: list[tuple[str, int, int]]) -> None:
    assert summary(guard(), history) == expected


@pytest.mark.parametrize(("history", "expected"), list(HISTORIES.values()), ids=list(HISTORIES))
def test_advanced_in_two_parts_anywhere_gives_the_whole_run(
    history: History, expected: list[tuple[str, int, int]]
) -> None:
    whole = assert_resumes(guard(), transcript(history))
    assert len(whole) == len(expected)


def test_a_run_of_one_failure_says_it_failed_the_same_way() -> None:
    (first, _) = guard()(transcript(History().steps([not_found(f"def f{k}():") for k in range(5)])), None)
    assert first.text == (
        f"[loopguard] You called Edit on {FILE} 3 times in a row, with different arguments each time, "
        "and it failed the same way each time:\n"
        "  <tool_use_error>String to replace not found in file.\n"
        "- tool: Edit\n"
        f'- last arguments: {{"file_path":"{FILE}","new_string":"y","old_string":"def f2():"}}\n'
        "Changing the arguments this way does not fix it. Read the error and check its cause first "
        "(for an edit: read the file again, as it is now), do something different, or tell the user "
        "what is blocking you."
    )
