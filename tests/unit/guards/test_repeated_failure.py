"""repeated_failure (DESIGN §6.5): one tool failing 3 times in a row on one target; re-issuing a
call that failed or that the user rejected."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.config import RepeatedFailureConfig, build
from proxy.core.actions import Remind
from proxy.guards.repeated_failure import RepeatedFailure
from tests.helpers.agent_steps import History
from tests.helpers.resume_check import assert_resumes
from tests.helpers.rule_helpers import summary, transcript

NOT_FOUND = "ERROR: apply_diff failed: the SEARCH block was not found (41% similar)\nBest match: line 6"
OK = "Applied."
REJECTED = "The user rejected this edit and left feedback:\n<feedback>\nNo timeout please.\n</feedback>"


def diff(tail: str, result: str = NOT_FOUND, path: str = "client.py") -> tuple[str, dict[str, Any], str]:
    return ("apply_diff", {"path": path, "diff": f"<<<<<<< SEARCH\ndef f({tail}"}, result)


def read(path: str = "client.py") -> tuple[str, dict[str, Any], str]:
    return ("read_file", {"path": path}, "def f(): pass")


CELL_ERROR = "  Cell In[{n}], line 1\n    edit(\n         ^\nSyntaxError: incomplete input\n[Jupyter cwd: /w]"


def cell(n: int) -> tuple[str, dict[str, Any], str]:
    return ("execute_ipython_cell", {"code": f"edit('a.py', '''x{n}"}, CELL_ERROR.format(n=n))


def guard(**settings: Any) -> RepeatedFailure:
    return RepeatedFailure(build(RepeatedFailureConfig, settings))


@pytest.mark.parametrize(
    ("calls", "settings", "expected"),
    [
        pytest.param(
            [diff("a"), diff("ab"), diff("abc")], {}, [("remind", 3, 3)], id="three_failures_args_differ"
        ),
        pytest.param([diff("a"), diff("ab")], {}, [], id="two_failures_nothing"),
        pytest.param(
            [diff("a"), read(), diff("ab"), read(), diff("abc")],
            {},
            [("remind", 5, 3)],
            id="other_calls_between_do_not_reset",
        ),
        pytest.param(
            [diff("a"), diff("ab", OK), diff("abc"), diff("abcd")],
            {},
            [],
            id="a_success_on_the_target_resets",
        ),
        pytest.param(
            [diff("a"), diff("ab", path="other.py"), diff("abc")],
            {},
            [],
            id="failures_on_other_targets_apart",
        ),
        pytest.param(
            [diff(c) for c in ("a", "ab", "abc", "abcd", "abcde", "abcdef")],
            {},
            [("remind", 3, 3)],
            id="once_per_run",
        ),
        pytest.param([cell(2), cell(3), cell(4)], {}, [("remind", 3, 3)], id="tool_without_target"),
        pytest.param([diff("a"), diff("ab"), diff("abc")], {"failures": 0}, [], id="failures_off"),
        pytest.param([diff("a"), diff("a")], {}, [("remind", 2, 2)], id="reissued_failed_call"),
        pytest.param(
            [diff("a"), diff("a"), diff("a"), diff("a")],
            {},
            [("remind", 2, 2)],
            id="reissue_reminder_once_not_also_at_three",
        ),
        pytest.param([diff("a"), read(), diff("a")], {}, [("remind", 3, 2)], id="reissue_not_in_a_row"),
        pytest.param(
            [diff("a", REJECTED), diff("a", REJECTED)], {}, [("remind", 2, 2)], id="reissued_rejected_call"
        ),
        pytest.param(
            [diff("a", REJECTED), diff("a", OK)], {}, [], id="reissued_after_rejection_then_accepted_no_loop"
        ),
        pytest.param(
            [diff("a"), ("edit_file", {"path": "client.py", "old": "a", "new": "b"}, "Edited."), diff("a")],
            {},
            [],
            id="rerun_after_an_edit_is_right_never_reminded",
        ),
        pytest.param(
            [diff("a"), diff("a", "ERROR: apply_diff failed: the SEARCH block was not found (12% similar)")],
            {},
            [],
            id="same_call_new_error_text_is_not_the_same_result",
        ),
        pytest.param([diff("a", OK), diff("a", OK)], {}, [], id="identical_after_success"),
        pytest.param([diff("a"), diff("a")], {"reissue": False}, [], id="reissue_off"),
        pytest.param(
            [
                ("bash", {"command": "make", "description": "build"}, "make: *** [all] Error 2"),
                ("bash", {"command": "make", "description": "again"}, "make: *** [all] Error 2"),
            ],
            {},
            [("remind", 2, 2)],
            id="description_ignored",
        ),
        # failing in a new way each time is finding things out, not failing the same way again
        pytest.param(
            [
                ("bash", {"command": "make", "description": d}, e)
                for d, e in [
                    ("build", "make: *** No rule to make target 'all'. Stop."),
                    ("build the lib", "Makefile:3: *** missing separator. Stop."),
                    ("build again", "cc: error: main.c: No such file or directory"),
                ]
            ],
            {},
            [],
            id="three_different_failures",
        ),
        pytest.param(
            [
                diff("a"),
                diff("ab", "ERROR: apply_diff failed: line 3 is out of range"),
                diff("abc"),
                diff("abcd"),
            ],
            {},
            [],
            id="another_error_starts_the_run_again",
        ),
        pytest.param(
            [
                diff("a"),
                diff("ab", "ERROR: apply_diff failed: line 3 is out of range"),
                *[diff(t) for t in "xyz"],
            ],
            {},
            [("remind", 5, 3)],
            id="the_same_error_three_times_after_another",
        ),
        # OpenCode names the file it reads filePath: reads of three missing files are three targets
        pytest.param(
            [("read", {"filePath": f"/r/{f}.ts"}, f"Error: File not found: /r/{f}.ts") for f in "abc"],
            {},
            [],
            id="failed_reads_of_different_files",
        ),
        pytest.param(
            [
                ("read", {"filePath": "/r/a.ts", "offset": k}, "Error: File not found: /r/a.ts")
                for k in (0, 10, 20)
            ],
            {},
            [("remind", 3, 3)],
            id="failed_reads_of_one_file",
        ),
    ],
)
def test_repeated_failure(
    calls: list[Any], settings: dict[str, Any], expected: list[tuple[str, int, int]]
) -> None:
    assert summary(guard(**settings), History().steps(calls)) == expected


def test_user_message_starts_afresh() -> None:
    h = History().steps([diff("a"), diff("ab")]).user("try the other file").steps([diff("abc"), read()])
    assert summary(guard(), h) == []
    h = History().steps([diff("a")]).user("the file is fixed now, retry").steps([diff("a")])
    assert summary(guard(), h) == []


def test_failing_text_quotes_the_error_line() -> None:
    h = History().steps([cell(2), cell(3), cell(4)])
    (action,) = guard()(transcript(h), None)
    assert action == Remind(
        after=h.result_position(3),
        text=(
            "[loopguard] execute_ipython_cell has now failed 3 times in a row. "
            "The last error:\n"
            "  SyntaxError: incomplete input\n"
            "Trying again the same way will fail the same way. Read the error and fix its cause first "
            "(re-check your assumptions), change your approach, or tell the user what is blocking you."
        ),
        rule="repeated_failure",
        tool="execute_ipython_cell",
        count=3,
        limit=3,
        fresh=True,
        call=2,
    )


def test_failing_text_names_the_target() -> None:
    (action,) = guard()(transcript(History().steps([diff("a"), diff("ab"), diff("abc")])), None)
    assert action.text.startswith(
        "[loopguard] apply_diff on client.py has now failed 3 times in a row. The last error:\n"
        "  ERROR: apply_diff failed: the SEARCH block was not found (41% similar)\n"
    )


def test_reissue_texts() -> None:
    (failed,) = guard()(transcript(History().steps([diff("a"), diff("a")])), None)
    assert failed.text == (
        "[loopguard] You made the same call again, with the exact same arguments and nothing changed "
        "in between, and it failed again with the same result as the last time.\n"
        "- tool: apply_diff\n"
        '- arguments: {"diff":"<<<<<<< SEARCH\\ndef f(a","path":"client.py"}\n'
        "- result: ERROR: apply_diff failed: the SEARCH block was not found (41% similar)\n"
        "Repeating it unchanged will not give a different result. Change the arguments or the "
        "approach, or tell the user what is blocking you."
    )
    (rejected,) = guard()(transcript(History().steps([diff("a", REJECTED), diff("a", REJECTED)])), None)
    assert rejected.text.splitlines()[0] == (
        "[loopguard] You made the same call again, with the exact same arguments and nothing changed "
        "in between, and it was rejected by the user again with the same result as the last time."
    )
    assert rejected.text.splitlines()[3] == "- result: The user rejected this edit and left feedback:"
    assert "(the user rejected it: do what they asked instead)" in rejected.text


def test_error_preview_chars() -> None:
    long = "Error: " + "x" * 300
    calls = [("bash", {"command": "run"}, long)] * 2
    (action,) = guard(error_preview_chars=20)(transcript(History().steps(calls)), None)
    assert "- result: Error: xxxxxxxxxxxxx… (+287 more chars)\n" in action.text


SPLITS = {
    "failures_classified_once_the_target_has_enough_calls": (
        History().steps([diff("a"), read(), diff("ab"), read(), diff("abc"), diff("abcd")]),
        [("remind", 5, 3)],
    ),
    "a_success_before_the_count_is_reached_still_resets": (
        History().steps([diff("a"), diff("ab", OK), diff("abc"), diff("abcd"), diff("abcde")]),
        [("remind", 5, 3)],
    ),
    "reissue_then_failing_run": (
        History().steps([diff("a"), diff("a"), diff("b"), diff("c", path="other.py"), diff("c")]),
        [("remind", 2, 2), ("remind", 3, 3)],
    ),
    "a_new_turn_starts_afresh": (
        History()
        .steps([diff("a"), diff("ab")])
        .user("Look at server.py instead.")
        .steps([diff("abc"), diff("a"), diff("a"), diff("b")]),
        [("remind", 5, 2)],  # call 3 is the first failure of the new turn
    ),
    "continue_goes_on_with_the_turn": (
        History().steps([diff("a"), diff("ab")]).user("continue").steps([diff("abc")]),
        [("remind", 3, 3)],
    ),
}


@pytest.mark.parametrize(("history", "expected"), list(SPLITS.values()), ids=list(SPLITS))
def test_advanced_in_two_parts_anywhere_gives_the_whole_run(
    history: History, expected: list[tuple[str, int, int]]
) -> None:
    """Resumable: the state after any message position, advanced (or a copy of it) over the rest,
    decides what the whole-transcript call decides."""
    g = guard()
    assert summary(g, history) == expected
    assert_resumes(g, transcript(history))
