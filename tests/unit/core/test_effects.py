"""What a call may change (proxy/core/effects.py) and what a call is on (proxy/core/targets.py):
the facts behind "the same call in the same situation"."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.config import Config, build
from proxy.core.canonical import INVALID
from proxy.core.effects import (
    EditLedger,
    EffectRule,
    Situations,
    effect_rule,
    epochs,
    is_mutation,
    shell_read_only,
)
from proxy.core.failures import FailureRule, RejectionRule
from proxy.core.targets import TargetRule, call_on, subcommand
from proxy.errors import ConfigError
from tests.helpers.agent_steps import History
from tests.helpers.rule_helpers import transcript

RULE = EffectRule()


@pytest.mark.parametrize(
    ("tool", "arguments", "changes"),
    [
        pytest.param("read_file", {"path": "a.py"}, False, id="read_verb"),
        pytest.param("mcp__fs__read_text_file", {"path": "a.py"}, False, id="mcp_read"),
        pytest.param("WebFetch", {"url": "https://x"}, False, id="camel_case_fetch"),
        pytest.param("list_dir", {"path": "."}, False, id="list"),
        pytest.param("get_weather", {"city": "Tokyo"}, False, id="get"),
        pytest.param("think", {"thought": "hm"}, False, id="think_is_read_only_by_default"),
        pytest.param("todo_write", {"todos": []}, False, id="todo_list_changes_nothing_outside"),
        pytest.param("write_file", {"path": "a.py", "content": "x"}, True, id="write_verb"),
        pytest.param("edit_file", {"path": "a.py"}, True, id="edit_verb"),
        pytest.param("read_and_write", {"path": "a.py"}, True, id="a_write_word_wins"),
        pytest.param("make_api_call", {"endpoint": "/x"}, True, id="make_is_a_write_word"),
        pytest.param("frobnicate", {}, True, id="unknown_tool_may_change"),
        pytest.param("str_replace_editor", {"command": "view", "path": "a.py"}, False, id="subcommand_view"),
        pytest.param(
            "str_replace_editor", {"command": "str_replace", "path": "a.py"}, True, id="subcommand_edit"
        ),
        pytest.param("open", {"command": "open a.py 30"}, False, id="swe_agent_own_command_open"),
        pytest.param("scroll_down", {"command": "scroll_down"}, False, id="swe_agent_scroll"),
        pytest.param("edit", {"command": "edit 3:4\nx\nend_of_edit"}, True, id="swe_agent_edit"),
        pytest.param("bash", {"command": "cat a.py | grep -n def"}, False, id="shell_read_pipeline"),
        pytest.param("bash", {"command": "python fix.py"}, True, id="shell_unknown_program"),
        pytest.param("shell", {"command": ["bash", "-lc", "git status -sb"]}, False, id="codex_argv"),
        pytest.param("shell", {"command": ["git", "commit", "-m", "x"]}, True, id="argv_git_commit"),
        # the agents' table (proxy.core.agents): what its kinds say, beyond the name words
        pytest.param("AskUserQuestion", {"questions": []}, False, id="claude_code_asks_the_user"),
        pytest.param("ExitPlanMode", {"plan": "x"}, False, id="claude_code_plan_approval"),
        pytest.param("Skill", {"skill": "pdf"}, False, id="claude_code_skill_loads_instructions"),
        pytest.param("TaskCreate", {"subject": "x"}, False, id="claude_code_task_list"),
        pytest.param("Task", {"prompt": "x"}, True, id="claude_code_sub_agent_may_change"),
        pytest.param("apply_patch", {"input": "*** Begin Patch"}, True, id="codex_patch"),
        pytest.param("exec_command", {"cmd": "git status"}, False, id="codex_exec_reads_by_its_command"),
        pytest.param(
            "write_stdin", {"session_id": 1, "chars": ""}, True, id="a_wait_keeps_the_generic_reading"
        ),
    ],
)
def test_which_calls_may_change_state(tool: str, arguments: dict[str, Any], changes: bool) -> None:
    assert RULE.may_change(tool, arguments) is changes


@pytest.mark.parametrize(
    ("command", "read_only"),
    [
        ("cd /testbed && sed -n '10,20p' a.py", True),
        ('grep -rn "a|b" src 2>&1 | head -5', True),
        ("ls >/dev/null 2>&1", True),
        ("git diff -- a.py && git log -3", True),
        ("find . -name '*.py' -type f", True),
        ("sed -i 's/a/b/' a.py", False),
        ("git diff > patch.txt", False),
        ("echo x >> notes.md", False),
        ("cat > a.py << 'EOF'\nprint(1)\nEOF", False),
        ("find . -name '*.pyc' -delete", False),
        ("find . -name x -exec rm {} +", False),
        ("cp a.py.orig a.py", False),
        ("git checkout -- a.py", False),
        ("cat $(ls)", False),
        ("FOO=1 grep x a.py", True),
    ],
)
def test_shell_commands(command: str, read_only: bool) -> None:
    assert shell_read_only(command, frozenset(RULE.config[2])) is read_only


def test_configured_tool_patterns() -> None:
    rule = EffectRule(read_only_tools=("run_linter",), state_changing_tools=("read_and_mark",))
    assert (rule.may_change("run_linter", {}), rule.may_change("read_and_mark", {})) == (False, True)
    cfg = build(Config, {"progress": {"read_only_tools": ["run_linter"], "read_only_commands": ["cat"]}})
    assert effect_rule(cfg.progress).may_change("bash", {"command": "grep x a"}) is True
    with pytest.raises(ConfigError) as e:
        build(Config, {"progress": {"read_only_commands": ["cat", " "]}})
    assert "progress.read_only_commands[1]: must not be empty" in str(e.value)


def situation(steps: list[tuple[str, dict[str, Any], str]]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    t = transcript(History().steps(steps))
    e = epochs(t.calls, EffectRule(), FailureRule())
    return e.before, e.after


def test_a_successful_new_write_changes_the_situation_a_read_does_not() -> None:
    read = ("read_file", {"path": "a.py"}, "x")
    write = ("write_file", {"path": "a.py", "content": "y"}, "wrote a.py")
    assert situation([read, write, read]) == ((0, 0, 1), (0, 1, 1))


def test_a_failed_or_rejected_write_changes_nothing() -> None:
    failed = ("write_file", {"path": "a.py", "content": "y"}, "Error: permission denied")
    assert situation([failed]) == ((0,), (0,))
    rejected = ("write_file", {"path": "a.py", "content": "y"}, "The user rejected this tool call.")
    t = transcript(History().steps([rejected]))
    e = epochs(t.calls, EffectRule(), FailureRule(), rejections=RejectionRule([r"(?i)user rejected"]))
    assert e.after == (0,)


def test_the_same_write_with_the_same_result_again_changes_nothing_new() -> None:
    cp = ("bash", {"command": "cp a.orig a"}, "")
    edit = ("bash", {"command": "python fix1.py"}, "fixed")
    assert situation([cp, cp]) == ((0, 1), (1, 1))
    # with an edit between them the second cp is still no new change (the same call, the same
    # result); the edit is one, so a call after the second cp is not in the first one's situation
    assert situation([cp, edit, cp]) == ((0, 1, 2), (1, 2, 2))


@pytest.mark.parametrize(
    ("tool", "arguments", "expected"),
    [
        ("str_replace_editor", {"command": "view", "path": "./a.py"}, ("str_replace_editor view", "a.py")),
        ("bash", {"command": "ls"}, ("bash", "ls")),
        ("edit", {"command": "edit 95:96\n  x = 1\nend_of_edit\n"}, ("edit", "edit")),
        ("open", {"command": "open src/a.py 232\n"}, ("open", "open src/a.py")),
        ("search", {"query": "x"}, ("search", None)),
        (
            "apply_patch",
            {"input": "*** Begin Patch\n*** Update File: ./src/a.py\n"},
            ("apply_patch", "src/a.py"),
        ),
    ],
)
def test_what_a_call_is_on(tool: str, arguments: dict[str, Any], expected: tuple[str, str | None]) -> None:
    assert call_on(TargetRule(), tool, arguments) == expected


def test_a_codex_custom_tool_patch_is_on_its_first_file() -> None:
    raw = "*** Begin Patch\n*** Update File: /r/a.py\n@@\n-x\n+y\n*** Update File: /r/b.py\n*** End Patch"
    assert call_on(TargetRule(), "apply_patch", INVALID, raw) == ("apply_patch", "/r/a.py")
    assert call_on(TargetRule(), "custom", INVALID, raw) == ("custom", None)


@pytest.mark.parametrize(
    ("arguments", "sub"),
    [
        ({"command": "view", "path": "a.py"}, "view"),
        ({"action": "create", "file": "a.py"}, "create"),
        ({"command": "ls"}, None),  # bash: no other target argument
        ({"command": "ls", "timeout": 10}, None),
        ({"command": "View It", "path": "a.py"}, None),  # not one lower-case word
    ],
)
def test_subcommands(arguments: dict[str, Any], sub: str | None) -> None:
    assert subcommand(arguments) == sub


@pytest.mark.parametrize(
    ("tool", "arguments", "mutation"),
    [
        pytest.param("Edit", {"file_path": "a"}, True, id="claude_code_edit"),
        pytest.param("apply_patch", "INVALID", True, id="codex_patch"),
        pytest.param("replace", {"file_path": "a"}, True, id="gemini_replace"),
        pytest.param("str_replace_editor", {"command": "str_replace", "path": "a"}, True, id="editor_edit"),
        pytest.param("str_replace_editor", {"command": "view", "path": "a"}, False, id="editor_view"),
        pytest.param("Bash", {"command": "sed -i s/a/b/ a"}, False, id="a_shell_is_not_an_edit_tool"),
        pytest.param("write_stdin", {"chars": "x"}, False, id="codex_stdin"),
        pytest.param("edit_file", {"path": "a"}, True, id="unknown_tool_named_for_editing"),
        pytest.param("run_edit_script", {"path": "a"}, False, id="unknown_tool_that_runs"),
        pytest.param("read_file", {"path": "a"}, False, id="a_read"),
    ],
)
def test_which_calls_edit_a_file(tool: str, arguments: Any, mutation: bool) -> None:
    assert is_mutation(tool, arguments) is mutation


OK = "The file /r/a.py has been updated successfully."


def cc_edit(old: str, new: str, result: str = OK) -> tuple[str, dict[str, Any], str]:
    return ("Edit", {"file_path": "/r/a.py", "old_string": old, "new_string": new}, result)


@pytest.mark.parametrize(
    ("steps", "progress"),
    [
        pytest.param(
            [cc_edit("a", "b"), cc_edit("b", "c"), cc_edit("c", "d")], [True, True, True], id="new_changes"
        ),
        pytest.param(
            [cc_edit("a", "b"), cc_edit("b", "a"), cc_edit("a", "b")], [True, False, False], id="undo_redo"
        ),
        pytest.param(
            [
                cc_edit(
                    "a",
                    "b",
                    "<tool_use_error>String to replace not found in file.\nString: a</tool_use_error>",
                ),
                cc_edit("a", "b"),
            ],
            [False, True],
            id="a_failed_edit_is_no_progress_and_not_kept",
        ),
        pytest.param(
            [
                cc_edit(
                    "a",
                    "b",
                    "The user doesn't want to proceed with this tool use. The tool use was rejected.",
                )
            ],
            [False],
            id="a_rejected_edit",
        ),
        pytest.param(
            [
                ("Write", {"file_path": "/r/a.py", "content": "x"}, "File created successfully at: /r/a.py"),
                ("Write", {"file_path": "/r/a.py", "content": "y"}, OK),
                ("Write", {"file_path": "/r/a.py", "content": "x"}, OK),
            ],
            [True, True, False],
            id="a_file_written_back_to_an_earlier_content",
        ),
        pytest.param([("Bash", {"command": "python fix.py"}, "ok")], [False], id="not_an_edit"),
    ],
)
def test_which_successful_edits_are_progress(steps: list[Any], progress: list[bool]) -> None:
    t = transcript(History().steps(steps))
    situations = Situations(rejections=RejectionRule([r"(?i)the user doesn't want to proceed"]))
    ledger = EditLedger(situations)
    on = ("Edit", "/r/a.py")
    assert [ledger.progress(c, on) for c in t.calls] == progress
