"""Failure classification of tool results (proxy.core.failures): the default patterns on
both sides of the line, the explicit exit status and its precedence, the JSON rule, the protocol
flag, edge-only matching, custom patterns, the default user-rejection patterns, and pinned counts
on recorded agent runs (read from ../shared/fixtures/realtraj or $LOOPGUARD_REALTRAJ)."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.config import RepeatedFailureConfig
from proxy.core.failures import (
    DEFAULT_FAILURE_PATTERNS,
    EDGE_CHARS,
    EXIT_STATUS,
    EXIT_STATUS_PATTERNS,
    FailureRule,
    compile_pattern,
    edge_spans,
    edge_text,
    exit_status,
)
from proxy.core.transcript import ToolResult
from proxy.guards.repeated_failure import RepeatedFailure

RULE = FailureRule()
(
    P_ERROR,
    P_LOWER,
    P_TOOLS,
    P_WRAPPER,
    P_TRACEBACK,
    P_EXCEPTION,
    P_SHELL,
    P_DASH,
    P_LINT,
    P_NO_REPLACEMENT,
    P_USAGE,
    P_NOT_FOUND,
    P_SWE_REFUSED,
) = DEFAULT_FAILURE_PATTERNS
P_EXIT = EXIT_STATUS  # an exit status is rule step 2, not a pattern

# SWE-agent's footer after every observation
SWE_FOOTER = "\n\n(Open file: /repo/app/models.py)\n(Current directory: /repo)\nbash-$"
SWE_LINT_REJECTION = (
    "Your proposed edit has introduced new syntax error(s). Please understand the fixes and retry "
    "your edit commmand.\n\nERRORS:\n- E999 IndentationError: unexpected indent\n\n"
    "This is how your edit would have looked if applied\n"
    "-------------------------------------------------\n[File: /repo/app/models.py (40 lines total)]\n"
    + "\n".join(f"{i}:    value = {i}" for i in range(10, 22))
    + "\n-------------------------------------------------\n\n"
    "This is the original code before your edit\n-------------------------------------------------\n"
    + "\n".join(f"{i}:    value = {i}" for i in range(10, 22))
    + "\n-------------------------------------------------\n"
    "Your changes have NOT been applied. Please fix your edit command and try again.\n"
    "You either need to 1) Specify the correct start/end line arguments or 2) Correct your edit code.\n"
    "DO NOT re-run the same failed edit command. Running it again will lead to the same error." + SWE_FOOTER
)

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/work/fix.py", line 3, in <module>\n'
    "    main()\n"
    "NameError: name 'main' is not defined"
)
PRINTS_THEN_TRACEBACK = "\n".join(f"step {i}: ok" for i in range(12)) + (
    "\nTraceback (most recent call last):\n"
    '  File "/work/app/main.py", line 12, in <module>\n'
    "    run()\n"
    '  File "/work/app/db.py", line 88, in fetch\n'
    "    return rows[0]['user_id']\n"
    "KeyError: 'user_id'\n"
)

FAILURES = [
    ("node_error_prefix", "Error: ENOENT: no such file or directory, open 'config.yaml'", P_ERROR),
    (
        "pip_error",
        "ERROR: Could not find a version that satisfies the requirement foo==9.9",
        P_ERROR,
    ),
    ("uppercase_error_word", "ERROR failed to connect to localhost:5432", P_ERROR),
    ("crlf_line_endings", "Error: boom\r\nat step 3\r\n", P_ERROR),
    ("git_fatal", "fatal: not a git repository (or any of the parent directories): .git", P_LOWER),
    ("git_error", "error: pathspec 'mian' did not match any file(s) known to git", P_LOWER),
    ("rustc_error_code", "error[E0425]: cannot find value `x` in this scope\n --> src/main.rs:2:13", P_LOWER),
    ("npm_err", "npm ERR! code ENOENT\nnpm ERR! syscall open\nnpm ERR! path /work/package.json", P_TOOLS),
    ("make_stop", "make: *** No rule to make target 'bild'.  Stop.", P_TOOLS),
    (
        "claude_code_tool_use_error",
        "<tool_use_error>File has not been read yet. Read it first before writing to it.</tool_use_error>",
        P_WRAPPER,
    ),
    ("python_traceback", TRACEBACK, P_TRACEBACK),
    ("prints_then_traceback_last_line", PRINTS_THEN_TRACEBACK, P_EXCEPTION),
    ("bare_assertion_error_last_line", "collected 3 items\nrunning checks\nAssertionError", P_EXCEPTION),
    ("exit_code_2", "exit code 2", P_EXIT),
    ("mini_swe_agent_returncode_1_empty_output", "<returncode>1</returncode>\n<output>\n</output>", P_EXIT),
    (
        "mini_swe_agent_returncode_1_clean_output",
        "<returncode>1</returncode>\n<output>\n=== Understanding ForeignKey structure ===\n</output>",
        P_EXIT,
    ),
    (
        "mini_swe_agent_timeout_returncode_minus_1",
        "<exception>An error occurred while executing the command: Command 'bash -c pytest' timed "
        "out after 60 seconds</exception>\n<returncode>-1</returncode>\n<output>\n</output>",
        P_EXIT,
    ),
    ("exit_code_tag", "<exit_code>2</exit_code>\nusage: tool [-h] file", P_EXIT),
    (
        "echoed_status_of_the_real_command_wins_over_the_wrapper_0",
        "<returncode>0</returncode>\n<output>\nrunning checks\nexit code: 1\n</output>",
        P_EXIT,
    ),
    ("exit_code_colon_1", "Exit code: 1", P_EXIT),
    ("exited_with_code_127", "exited with code 127", P_EXIT),
    (
        "codex_exit_header",
        "Exit code: 1\nWall time: 0.4 seconds\nOutput:\nFAILED tests/test_api.py::test_login",
        P_EXIT,
    ),
    ("process_exited", "Process exited with code 127", P_EXIT),
    (
        "footer_after_long_output",
        "\n".join(f"src/app.py:{i}:1: F401 unused import" for i in range(30))
        + "\nFound 30 errors.\n[Command finished with exit code 1]",
        P_EXIT,
    ),
    ("openhands_footer", "building...\n[The command completed with exit code 1.]", P_EXIT),
    (
        "go_exit_status",
        "--- FAIL: TestParse (0.00s)\n    parse_test.go:12: got 1, want 2\nFAIL\nexit status 1\n"
        "FAIL\texample.com/parse\t0.003s",
        P_EXIT,
    ),
    ("json_error_string", '{"error": "file not found: notes.md"}', "json"),
    (
        "json_rpc_error_not_first_key",
        '{"jsonrpc": "2.0", "id": 7, "error": {"code": -32602, "message": "Invalid params"}}',
        "json",
    ),
    ("bash_command_not_found", "bash: line 1: pyhton: command not found", P_SHELL),
    ("zsh_command_not_found", "zsh: command not found: pnpm", P_SHELL),
    ("dash_not_found", "sh: 1: rg: not found", P_DASH),
    ("cat_no_such_file", "cat: src/mian.py: No such file or directory", P_SHELL),
    (
        "python_cannot_open",
        "python3: can't open file '/work/fix.py': [Errno 2] No such file or directory",
        P_SHELL,
    ),
    ("script_permission_denied", "bash: ./deploy.sh: Permission denied", P_SHELL),
    ("swe_agent_lint_rejection", SWE_LINT_REJECTION, P_LINT),
    (
        "swe_agent_lint_rejection_undefined_name",
        "Your proposed edit has introduced new syntax error(s). Please read this error message "
        "carefully and then retry editing the file.\n\nERRORS:\n- F821 undefined name 'test_reproduce'"
        + SWE_FOOTER,
        P_LINT,
    ),
    (
        "openhands_lint_rejection",
        "[Your proposed edit has introduced new syntax error(s). Please understand the errors and "
        "retry your edit command.]\nERRORS:\n/workspace/app.py:1:3: E999 IndentationError: "
        "unexpected indent",
        P_LINT,
    ),
    (
        "str_replace_not_found",
        "No replacement was performed, old_str `def emit(self, text):` did not appear verbatim in "
        "/repo/app/log.py.",
        P_NO_REPLACEMENT,
    ),
    (
        "str_replace_not_unique",
        "No replacement was performed. Multiple occurrences of old_str `x = 1` in lines [3, 9]. "
        "Please ensure it is unique",
        P_NO_REPLACEMENT,
    ),
    ("swe_agent_usage", "Usage: search_file <search_term> [<file>]" + SWE_FOOTER, P_USAGE),
    ("swe_agent_usage_find_file", "Usage: find_file <file_name> [<dir>]" + SWE_FOOTER, P_USAGE),
    (
        "swe_agent_usage_open_literal_backslash_n",
        "Usage: open <file> [<line_number>].\\nNOTE: Files must be in /repo. Relative paths preferred.",
        P_USAGE,
    ),
    (
        "swe_agent_usage_then_error_line",
        "Usage: search_file <search_term> [<file>]\n"
        "Error: File name models.py not found. Please provide a valid file name." + SWE_FOOTER,
        P_ERROR,
    ),
    ("swe_agent_open_missing_file", "File pycode.py not found" + SWE_FOOTER, P_NOT_FOUND),
    ("swe_agent_missing_directory", "Directory forms not found" + SWE_FOOTER, P_NOT_FOUND),
    ("swe_agent_no_file_open", "No file open. Use the `open` command first." + SWE_FOOTER, P_SWE_REFUSED),
    (
        "swe_agent_too_many_hits",
        'More than 139 files matched for "import" in /repo. Please narrow your search.' + SWE_FOOTER,
        P_SWE_REFUSED,
    ),
    (
        "ssh_permission_denied",
        "Cloning into 'app'...\ngit@github.com: Permission denied (publickey).",
        P_SHELL,
    ),
]

SUCCESSES = [
    ("grep_hit_naming_an_error_class", "src/errors.py:10: class ErrorHandler"),
    (
        "grep_hits_mentioning_errors",
        "src/errors.py:10:class ErrorHandler(Exception):\n"
        'src/errors.py:24:    raise ErrorHandler("Error: bad input")\n'
        "tests/test_errors.py:5:from src.errors import ErrorHandler",
    ),
    ("grep_hit_exit_code_prose", "docs/cli.md:42:The CLI exits with exit code 2 on bad flags"),
    ("grep_hit_command_not_found", 'scripts/check.sh:7:    echo "command not found: $1"'),
    (
        "python_file_with_errors",
        "import logging\n\nclass ValidationError(Exception):\n"
        '    """Raised when input is invalid."""\n\n'
        "def check(x):\n    if x is None:\n"
        '        raise ValidationError("Error: x is required")\n'
        "    try:\n        return open(x).read()\n    except FileNotFoundError:\n        return None\n",
    ),
    ("python_constants", 'ERROR_CODES = {"E1": "bad input"}\nERRORS_SEEN = 0'),
    (
        "readme_prose",
        "# Troubleshooting\n\nIf the tool prints `Error: config not found`, create the file.\n"
        "The CLI returns exit code 2 on usage errors and exit code 1 on failures.\n",
    ),
    ("markdown_heading", "## Error handling\n\nErrors are returned as JSON objects."),
    ("ls_listing", "README.md\nerrors.py\nerror_handler.py\ntest_errors.py"),
    ("git_log", "a1b2c3d Fix ErrorHandler crash on empty input\n9f8e7d6 Add error pages"),
    (
        "pytest_passed",
        "============================= test session starts ==============================\n"
        "collected 12 items\n\ntests/test_errors.py ............                    [100%]\n\n"
        "============================== 12 passed in 0.31s ==============================",
    ),
    ("exit_code_0", "exit code 0"),
    (
        "mini_swe_agent_returncode_0_around_grep_hits",
        "<returncode>0</returncode>\n<output>\nError: config not found\nERROR: could not connect\n"
        "Traceback (most recent call last):\n</output>",
    ),
    (
        "mini_swe_agent_returncode_0_script_prints_caught_exception",
        "<returncode>0</returncode>\n<output>\n" + TRACEBACK + "\nException caught: name 'main' is "
        "not defined\n</output>",
    ),
    (
        "codex_exit_0_with_error_output",
        "Exit code: 0\nWall time: 0.2 seconds\nOutput:\nError: no such table: app_user",
    ),
    ("footer_exit_0_after_traceback", TRACEBACK + "\n[Command finished with exit code 0]"),
    ("process_exited_0", "KeyError: 'x'\nProcess exited with code 0"),
    ("codex_exit_0", "Exit code: 0\nWall time: 1.2 seconds\nOutput:\nok"),
    ("footer_exit_0", "done\n[Command finished with exit code 0]"),
    ("json_error_null", '{"error": null, "result": {"rows": 3}}'),
    ("json_error_nested", '{"status": "ok", "data": {"error": "cached"}}'),
    ("json_errors_key", '{"errors": [], "warnings": 2}'),
    ("json_array_of_log_entries", '[{"level": "error", "msg": "disk full"}]'),
    (
        "log_lines_with_timestamps",
        "2024-05-01 12:00:01 INFO starting\n2024-05-01 12:00:02 ERROR db timeout\n"
        "2024-05-01 12:00:03 INFO retry ok",
    ),
    (
        "traceback_example_in_the_middle_of_docs",
        "\n".join(f"Line {i} of the guide." for i in range(8))
        + "\n```\n"
        + TRACEBACK
        + "\n```\n"
        + "\n".join(f"More text {i}." for i in range(8)),
    ),
    ("permission_check_passed", "Permission check passed for /srv/data"),
    ("no_errors_found", "No errors found.\n0 errors, 0 warnings\nErrors: 0"),
    (
        "click_help_output",
        "Usage: cli [OPTIONS] COMMAND [ARGS]...\n\nOptions:\n  --help  Show this message and exit.",
    ),
    (
        "argparse_help_output",
        "usage: manage.py [-h] [--version] subcommand\n\npositional arguments:\n  subcommand",
    ),
    ("usage_prose", "Usage: run the script with <file> as its argument."),
    ("swe_agent_search_found_nothing", 'No matches found for "ErrorList" in /repo/forms.py' + SWE_FOOTER),
    (
        "swe_agent_edit_applied",
        "[File: /repo/app/models.py (40 lines total)]\n(10 more lines above)\n"
        + "\n".join(f"{i}:    value = {i}" for i in range(11, 20))
        + "\nFile updated. Please review the changes and make sure they are correct (correct "
        "indentation, no duplicate lines, etc). Edit the file again if necessary." + SWE_FOOTER,
    ),
    (
        "code_mentioning_editor_messages",
        '    msg = "No replacement was performed"\n    raise FileNotFoundError("File x not found")\n'
        "    # Your proposed edit has introduced new syntax error(s)",
    ),
    ("log_line_mentioning_file_not_found", "config: File settings.yaml not found, using defaults"),
    ("empty_result", ""),
]


@pytest.mark.parametrize(("text", "reason"), [r[1:] for r in FAILURES], ids=[r[0] for r in FAILURES])
def test_default_rule_flags_failure(text: str, reason: str) -> None:
    assert RULE.reason(text) == reason
    assert RULE(ToolResult(3, text)) is True


@pytest.mark.parametrize("text", [r[1] for r in SUCCESSES], ids=[r[0] for r in SUCCESSES])
def test_default_rule_does_not_flag(text: str) -> None:
    assert RULE.reason(text) is None
    assert RULE(ToolResult(3, text)) is False


def test_table_is_big_enough_on_both_sides() -> None:
    assert len(FAILURES) >= 20 and len(SUCCESSES) >= 20
    flagged = {r[2] for r in FAILURES}
    assert flagged == {*DEFAULT_FAILURE_PATTERNS, "json", EXIT_STATUS}  # every default pattern is pinned


@pytest.mark.parametrize(
    ("is_error", "text", "expected"),
    [(True, "all good", True), (False, "Error: boom", False), (None, "Error: boom", True)],
    ids=["flag_true_wins", "flag_false_wins", "no_flag_uses_text"],
)
def test_protocol_error_flag_decides_when_present(is_error: bool | None, text: str, expected: bool) -> None:
    assert RULE(ToolResult(1, text, is_error)) is expected


def test_missing_result_is_unknown() -> None:
    assert RULE(None) is None


@pytest.mark.parametrize(
    ("text", "spans"),
    [
        ("one line", [(0, 8)]),
        ("a\nb\nc\n\n  \n", [(0, 5)]),
        ("\n".join("abcdefghij"), [(0, 9), (10, 19)]),  # 10 lines: first 5 and last 5
        ("\n".join("abcdefghijkl"), [(0, 9), (14, 23)]),  # 12 lines: the middle two are skipped
        ("x" * 5000, [(0, EDGE_CHARS), (5000 - EDGE_CHARS, 5000)]),  # one long line: both ends
    ],
    ids=["single_line", "trailing_blank_lines_ignored", "ten_lines", "twelve_lines", "one_long_line"],
)
def test_edge_spans(text: str, spans: list[tuple[int, int]]) -> None:
    assert edge_spans(text) == spans


def test_patterns_see_only_the_first_and_last_five_lines() -> None:
    lines = [f"line {i}" for i in range(20)]
    middle = [*lines[:8], "Error: buried in the middle", *lines[8:]]
    assert RULE.reason("\n".join(middle)) is None
    assert edge_text("\n".join(lines)) == "\n".join(lines[:5] + lines[-5:])
    for i in (0, 4, 15, 19):
        moved = [*lines]
        moved[i] = "Error: at the edge"
        assert RULE.reason("\n".join(moved)) == P_ERROR, i


def test_cut_inside_a_long_line_does_not_start_a_line() -> None:
    text = "x" * 4000 + " Error: not at a line start " + "y" * 1000
    assert RULE.reason(text) is None


def test_custom_patterns_replace_the_defaults() -> None:
    rule = FailureRule([r"(?i)^segmentation fault", r"FAILED \d+ tests?"])
    assert rule(ToolResult(1, "Segmentation fault (core dumped)")) is True
    assert rule(ToolResult(1, "ran 9 tests\nFAILED 2 tests")) is True
    assert rule(ToolResult(1, "Error: boom")) is False  # not in the list any more
    assert rule(ToolResult(1, '{"error": "x"}')) is True  # the JSON rule is not a pattern
    assert FailureRule([])(ToolResult(1, "Error: boom")) is False


def test_patterns_that_cannot_be_combined_still_work() -> None:
    rule = FailureRule([r"(a+)x\1", r"oops"])  # a back-reference: searched one by one
    assert rule(ToolResult(1, "aaxaa")) is True
    assert rule(ToolResult(1, "oops")) is True
    assert rule(ToolResult(1, "axaa b")) is True
    assert rule(ToolResult(1, "ax")) is False


@pytest.mark.parametrize("pattern", ["", "x*", "^", "(?m)$"])
def test_pattern_matching_an_empty_result_is_rejected(pattern: str) -> None:
    with pytest.raises(ValueError, match="matches an empty result"):
        compile_pattern(pattern)


def test_bad_regex_raises_re_error() -> None:
    with pytest.raises(re.error):
        compile_pattern("(")


def test_memoized_verdicts_equal_fresh_ones_and_the_memo_stays_bounded() -> None:
    rule = FailureRule()
    texts = ["Error: boom", "ok", "Traceback (most recent call last):\n  x", "fine\nexit code 0"]
    first = [rule.failed_text(t) for t in texts]
    assert first == [True, False, True, False]
    assert [rule.failed_text(t) for t in texts] == first  # served from the memo
    for i in range(FailureRule.MEMO_ENTRIES + 10):
        rule.failed_text(f"line {i}")
    assert len(rule._memo) == FailureRule.MEMO_ENTRIES
    assert rule.failed_text("Error: boom") is True  # evicted, recomputed the same


# --- rule step 2: an explicit exit status at the edges decides ------------------------------

LONG_OUTPUT = [f"collected item {i}" for i in range(20)]


@pytest.mark.parametrize(
    ("text", "failed"),
    [
        ("<returncode>0</returncode>\n<output>\n" + TRACEBACK + "\n</output>", False),
        ("<returncode>1</returncode>\n<output>\nall 12 checks passed\n</output>", True),
        ("Exit code: 0\nWall time: 0.1 seconds\nOutput:\n" + PRINTS_THEN_TRACEBACK, False),
        ("all 12 checks passed\n[Command finished with exit code 1]", True),
        # a status line in the middle of a long output is not at the edges: the patterns decide
        ("\n".join([*LONG_OUTPUT[:8], "Exit code: 1", *LONG_OUTPUT[8:]]), False),
        ("\n".join(["Error: boom", *LONG_OUTPUT[:8], "Exit code: 0", *LONG_OUTPUT[8:]]), True),
        # any non-zero status at the edges wins over a 0
        ("<returncode>0</returncode>\n<output>\nok\nexit status 2\n</output>", True),
        ("exit code 0\nsome output\nexit code 0", False),
    ],
    ids=[
        "returncode_0_with_traceback_inside_is_success",
        "returncode_1_with_clean_output_is_failure",
        "codex_exit_0_with_traceback_is_success",
        "footer_exit_1_with_clean_output_is_failure",
        "status_1_in_the_middle_patterns_decide_clean",
        "status_0_in_the_middle_patterns_decide_error",
        "non_zero_status_wins_over_zero",
        "only_zero_statuses_is_success",
    ],
)
def test_explicit_exit_status_decides_before_the_patterns(text: str, failed: bool) -> None:
    assert RULE(ToolResult(1, text)) is failed
    assert RULE.failed_text(text) is failed
    assert (RULE.reason(text) is not None) is failed


@pytest.mark.parametrize(
    ("is_error", "text", "expected"),
    [(False, "<returncode>1</returncode>\n<output>\n</output>", False), (True, "Exit code: 0\nok", True)],
    ids=["flag_false_beats_returncode_1", "flag_true_beats_exit_code_0"],
)
def test_protocol_flag_beats_the_exit_status(is_error: bool, text: str, expected: bool) -> None:
    assert RULE(ToolResult(1, text, is_error)) is expected


@pytest.mark.parametrize(
    ("text", "status"),
    [
        ("<returncode>0</returncode>\n<output>\nok\n</output>", 0),
        ("<returncode>127</returncode>\n<output>\nbash: rg: command not found\n</output>", 127),
        ("<exit_code>3</exit_code>", 3),
        ("Exit code: 1\nWall time: 0.4 seconds", 1),
        ("[Command finished with exit code 2]", 2),
        ("[The command completed with exit code 1.]", 1),
        ("Process exited with code 127", 127),
        ("exit status 1", 1),
        ("Return code: 0", 0),
        ("ok\nexit code 0\nexit code 4", 4),
        ("The CLI returns exit code 2 on bad input", None),
        ("docs/cli.md:3:exit code 2", None),
        ("    return exit_code(1)", None),
        ("no status here", None),
        ("", None),
    ],
    ids=[
        "returncode_0",
        "returncode_127",
        "exit_code_tag",
        "codex_header",
        "finished_footer",
        "openhands_footer",
        "process_exited",
        "go_exit_status",
        "return_code_0",
        "first_non_zero_wins",
        "prose_that_goes_on",
        "grep_hit",
        "indented_code",
        "none",
        "empty",
    ],
)
def test_exit_status(text: str, status: int | None) -> None:
    assert exit_status(text) == status


def test_every_exit_status_pattern_has_one_group_for_the_number() -> None:
    for pattern in EXIT_STATUS_PATTERNS:
        assert re.compile(pattern).groups == 1, pattern
        assert compile_pattern(pattern).search("") is None


def test_exit_status_applies_with_custom_patterns_too() -> None:
    rule = FailureRule([r"^Error"])
    assert rule(ToolResult(1, "<returncode>1</returncode>\n<output>\n</output>")) is True
    assert rule(ToolResult(1, "<returncode>0</returncode>\n<output>\nError: printed\n</output>")) is False
    assert FailureRule([])(ToolResult(1, "Exit code: 1")) is True


# --- user rejections (DEFAULT_REJECTION_PATTERNS, searched by repeated_failure) ---------------

REJECTED = RepeatedFailure(RepeatedFailureConfig()).rejected

REJECTIONS = [
    ("did_not_approve", "Error: the user did not approve this command"),
    ("user_declined", "User declined"),
    ("doesnt_want_to_proceed", "The user doesn't want to proceed with this tool use."),
    ("permission_denied_by_user", "Permission denied by user"),
    ("rejected_this_tool_call", "The user rejected this tool call."),
    ("tool_use_was_rejected", "Tool use was rejected"),
    ("user_denied_the_request", "user denied the request"),
    ("command_rejected_by_user", "Command rejected by user"),
    ("chose_not_to_run", "The user chose not to run this"),
    (
        "claude_code",
        "The user doesn't want to take this action right now. STOP what you are doing and wait for "
        "the user to tell you how to proceed.",
    ),
    ("codex", "exec command rejected by user"),
    ("opencode", "The user rejected permission to use this specific tool call"),
    ("cline", "The user denied this operation."),
    ("curly_apostrophe", "The user doesn\u2019t want to proceed"),
    ("rejection_after_long_output", "\n".join(LONG_OUTPUT) + "\nRejected by the user."),
]
NOT_REJECTIONS = [
    ("bash_permission_denied", "bash: ./x: Permission denied"),
    ("cat_permission_denied", "cat: x: Permission denied"),
    ("the_user_asked_me", "Note: the user asked me to refactor the parser first."),
    ("code_user_rejected_attribute", "    if request.ok:\n        user.rejected = True\n        user.save()"),
    ("user_denied_column", "user_denied_count = 0"),
    ("rejection_buried_in_the_middle", "\n".join([*LONG_OUTPUT[:8], "User declined", *LONG_OUTPUT[8:]])),
]


@pytest.mark.parametrize("text", [r[1] for r in REJECTIONS], ids=[r[0] for r in REJECTIONS])
def test_default_rejection_patterns_match_user_rejections(text: str) -> None:
    assert REJECTED(ToolResult(1, text)) is True


@pytest.mark.parametrize("text", [r[1] for r in NOT_REJECTIONS], ids=[r[0] for r in NOT_REJECTIONS])
def test_default_rejection_patterns_do_not_match_other_results(text: str) -> None:
    assert REJECTED(ToolResult(1, text)) is False


# --- recorded agent runs (third-party data, read in place, never copied) ---------------------

REALTRAJ = Path(
    os.environ.get("LOOPGUARD_REALTRAJ") or Path(__file__).resolve().parents[4] / "shared/fixtures/realtraj"
)
needs_realtraj = pytest.mark.skipif(
    not (REALTRAJ / "coder-pallets__flask-4992-3-programmer.json").is_file(),
    reason=f"recorded agent runs not found at {REALTRAJ} (set $LOOPGUARD_REALTRAJ)",
)


def tool_results(path: Path) -> Iterator[tuple[str, str]]:
    """(tool name, result text) of each tool result of one recorded run."""
    names: dict[str, str] = {}
    for message in json.loads(path.read_text())["messages"]:
        for call in message.get("tool_calls") or ():
            names[call["id"]] = call["function"]["name"]
        if message["role"] == "tool":
            yield names.get(message.get("tool_call_id", ""), "?"), message["content"]


@needs_realtraj
def test_swe_agent_lint_rejected_edits_are_failures_in_a_recorded_run() -> None:
    edits = [
        text
        for name, text in tool_results(REALTRAJ / "coder-pallets__flask-4992-3-programmer.json")
        if name == "edit"
    ]
    verdicts = Counter(RULE.reason(text) for text in edits)
    assert len(edits) == 38
    assert verdicts == {P_LINT: 37, None: 1}


@needs_realtraj
def test_returncode_decides_in_a_recorded_mini_swe_agent_run() -> None:
    results = [text for _, text in tool_results(REALTRAJ / "mini-bench1-django__django-11133.json")]
    zero = [t for t in results if t.startswith("<returncode>0</returncode>")]
    one = [t for t in results if t.startswith("<returncode>1</returncode>")]
    assert (len(results), len(zero), len(one)) == (131, 127, 4)
    assert [RULE(ToolResult(1, t)) for t in zero] == [False] * 127
    assert [RULE(ToolResult(1, t)) for t in one] == [True] * 4


@needs_realtraj
def test_verdicts_on_all_recorded_runs() -> None:
    """Every mini-swe-agent result's verdict is its returncode's; the counts per reason over all
    recorded runs are pinned (a changed default pattern shows here)."""
    reasons: Counter[str | None] = Counter()
    for path in sorted(REALTRAJ.glob("*.json")):
        for _, text in tool_results(path):
            reasons[RULE.reason(text)] += 1
            m = re.search(r"^<returncode>(-?\d+)</returncode>", text, re.MULTILINE)
            if path.name.startswith("mini-"):
                assert m is not None, path.name
                assert RULE.failed_text(text) is (int(m.group(1)) != 0), path.name
    assert reasons == {
        None: 2251,
        EXIT_STATUS: 205,
        P_LINT: 166,
        P_TRACEBACK: 33,
        P_ERROR: 13,
        P_SHELL: 9,
        P_NOT_FOUND: 4,
        P_EXCEPTION: 3,
        P_USAGE: 1,
    }
