"""Failure classification of tool results (proxy.failures, issue 4): the default patterns on both
sides of the line, the JSON rule, the protocol flag, edge-only matching, custom patterns."""

from __future__ import annotations

import re

import pytest

from proxy.failures import (
    DEFAULT_FAILURE_PATTERNS,
    EDGE_CHARS,
    FailureRule,
    compile_pattern,
    edge_spans,
    edge_text,
)
from proxy.transcript import ToolResult

RULE = FailureRule()
P_ERROR, P_LOWER, P_TOOLS, P_WRAPPER, P_TRACEBACK, P_EXCEPTION, P_EXIT, P_SHELL, P_DASH = (
    DEFAULT_FAILURE_PATTERNS
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
    ("issue_exit_code_2", "exit code 2", P_EXIT),
    ("issue_exit_code_colon_1", "Exit code: 1", P_EXIT),
    ("issue_exited_with_code_127", "exited with code 127", P_EXIT),
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
    (
        "ssh_permission_denied",
        "Cloning into 'app'...\ngit@github.com: Permission denied (publickey).",
        P_SHELL,
    ),
]

SUCCESSES = [
    ("issue_grep_hit", "src/errors.py:10: class ErrorHandler"),
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
    ("issue_exit_code_0", "exit code 0"),
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
    assert flagged == {*DEFAULT_FAILURE_PATTERNS, "json"}  # every default pattern is pinned


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
