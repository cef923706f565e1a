"""The agents' tool table (proxy/core/agents.py, DESIGN §2.2 "know the agents"): what each major
agent's tools do, which agent an offered tool set is, what an edit changes, and the success and
failure shapes of their results — checked against the tool results the real agents sent
(``shared/fixtures/realtraj-native``)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from proxy.core import agents
from proxy.core.failures import AGENT_FAILURE, FailureRule

KINDS = {
    "claude-code": {
        "Read": "read",
        "Write": "mutate",
        "Edit": "mutate",
        "MultiEdit": "mutate",
        "NotebookEdit": "mutate",
        "Bash": "execute",
        "BashOutput": "wait",
        "KillShell": "execute",
        "Glob": "search",
        "Grep": "search",
        "LS": "read",
        "WebFetch": "read",
        "WebSearch": "search",
        "TodoWrite": "plan",
        "Task": "delegate",
        "TaskOutput": "wait",
        "TaskList": "plan",
        "ExitPlanMode": "ask",
        "AskUserQuestion": "ask",
        "Skill": "read",
    },
    "codex": {
        "shell": "execute",
        "shell_command": "execute",
        "exec_command": "execute",
        "write_stdin": "execute",
        "apply_patch": "mutate",
        "update_plan": "plan",
        "view_image": "read",
        "web_search": "search",
    },
    "qwen-code": {
        "read_file": "read",
        "write_file": "mutate",
        "replace": "mutate",
        "run_shell_command": "execute",
        "glob": "search",
        "search_file_content": "search",
        "list_directory": "read",
        "todo_write": "plan",
    },
    "opencode": {
        "read": "read",
        "write": "mutate",
        "edit": "mutate",
        "bash": "execute",
        "glob": "search",
        "grep": "search",
        "list": "read",
        "todowrite": "plan",
        "task": "delegate",
    },
    "gemini-cli": {
        "read_file": "read",
        "write_file": "mutate",
        "replace": "mutate",
        "run_shell_command": "execute",
        "glob": "search",
        "search_file_content": "search",
        "google_web_search": "search",
        "web_fetch": "read",
        "save_memory": "mutate",
    },
    "swe-agents": {"str_replace_editor": "mutate", "bash": "execute", "execute_bash": "execute"},
}


@pytest.mark.parametrize(
    ("agent", "name", "kind"),
    [(a, n, k) for a, tools in KINDS.items() for n, k in tools.items()],
    ids=[f"{a}-{n}" for a, tools in KINDS.items() for n in tools],
)
def test_each_agents_tool_has_its_kind(agent: str, name: str, kind: str) -> None:
    (entry,) = [a for a in agents.AGENTS if a.name == agent]
    assert entry.tools[name].kind == kind
    assert agents.tool(name, entry) is entry.tools[name]


def test_one_name_has_one_kind_in_every_agent() -> None:
    """So a guard that does not know the agent reads a tool name the same way."""
    kinds: dict[str, set[str]] = {}
    for agent in agents.AGENTS:
        for name, entry in agent.tools.items():
            kinds.setdefault(name, set()).add(entry.kind)
    assert {n: k for n, k in kinds.items() if len(k) > 1} == {}


@pytest.mark.parametrize(
    ("tools", "agent"),
    [
        pytest.param(["Bash", "Edit", "Glob", "Grep", "Read", "TodoWrite"], "claude-code", id="claude_code"),
        pytest.param(["exec_command", "write_stdin", "apply_patch", "update_plan"], "codex", id="codex"),
        pytest.param(["read_file", "replace", "run_shell_command", "todo_write"], "qwen-code", id="qwen"),
        pytest.param(["read_file", "run_shell_command", "google_web_search"], "gemini-cli", id="gemini"),
        pytest.param(["read", "edit", "bash", "todowrite", "task"], "opencode", id="opencode"),
        pytest.param(["str_replace_editor", "bash", "think"], "swe-agents", id="swe_agent"),
        pytest.param(["read_file", "get_weather"], None, id="unknown"),
        pytest.param([], None, id="no_tools"),
    ],
)
def test_the_offered_tools_say_which_agent_is_talking(tools: list[str], agent: str | None) -> None:
    found = agents.agent_for(tools)
    assert (found.name if found else None) == agent


@pytest.mark.parametrize(
    ("name", "arguments", "sub", "kind"),
    [
        pytest.param("write_stdin", {"session_id": 3, "chars": ""}, None, "wait", id="codex_poll"),
        pytest.param("write_stdin", {"session_id": 3}, None, "wait", id="codex_poll_no_chars"),
        pytest.param("write_stdin", {"session_id": 3, "chars": "y\n"}, None, "execute", id="codex_input"),
        pytest.param(
            "str_replace_editor", {"command": "view", "path": "a"}, "view", "read", id="editor_view"
        ),
        pytest.param(
            "str_replace_editor", {"command": "create", "path": "a"}, "create", "mutate", id="create"
        ),
        pytest.param("str_replace_editor", {"command": "zap", "path": "a"}, "zap", None, id="unknown_sub"),
        pytest.param("get_weather", {}, None, None, id="unknown_tool"),
    ],
)
def test_kind_of_a_call(name: str, arguments: dict[str, Any], sub: str | None, kind: str | None) -> None:
    assert agents.kind_of(name, arguments, sub) == kind


@pytest.mark.parametrize(
    ("name", "a", "b", "shape"),
    [
        pytest.param(
            "Edit",
            "<tool_use_error>String to replace not found in file.\nString: def f(x):</tool_use_error>",
            "<tool_use_error>String to replace not found in file.\nString: def f(y):\n  x</tool_use_error>",
            "<tool_use_error>String to replace not found in file.",
            id="claude_code_missing_text",
        ),
        pytest.param(
            "apply_patch",
            "apply_patch verification failed: Failed to find expected lines in /r/a.py:\nx = 1",
            "apply_patch verification failed: Failed to find expected lines in /r/a.py:\nx = 2\ny = 3",
            "apply_patch verification failed: Failed to find expected lines in /r/a.py:",
            id="codex_missing_lines",
        ),
        pytest.param(
            "replace",
            "Failed to edit, 0 occurrences found for old_string (a) in /r/a.py. No edits made.",
            "Failed to edit, 0 occurrences found for old_string (b) in /r/a.py. No edits made.",
            "Failed to edit, 0 occurrences found for old_string",
            id="gemini_missing_text",
        ),
        pytest.param(
            "apply_patch",
            "apply_patch verification failed: Failed to find expected lines in /r/a.py:\nx = 1",
            "apply_patch verification failed: Failed to find expected lines in /r/b.py:\nx = 1",
            None,
            id="another_file_is_another_failure",
        ),
        pytest.param(
            "Edit",
            "<tool_use_error>String to replace not found in file.\nString: a</tool_use_error>",
            "<tool_use_error>File has not been read yet. Read it first before writing to it.",
            None,
            id="another_error_is_another_failure",
        ),
        pytest.param("Edit", "The file /r/a.py has been updated successfully.", "same", None, id="a_success"),
        pytest.param("get_weather", "Error: x", "Error: x", None, id="unknown_tool"),
    ],
)
def test_same_failure_is_compared_without_the_echo(name: str, a: str, b: str, shape: str | None) -> None:
    assert agents.same_failure(name, a, b) == shape


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("Edit", "The file /r/a.py has been updated successfully."),
        (
            "Edit",
            "The file /r/a.py has been updated. All occurrences of 'x' were successfully replaced with 'y'.",
        ),
        ("Write", "File created successfully at: /r/a.py"),
        ("Write", "The file /r/a.py has been overwritten successfully."),
        (
            "apply_patch",
            "Exit code: 0\nWall time: 0 seconds\nOutput:\nSuccess. Updated the following files:\nM /r/a",
        ),
        ("replace", "Successfully modified file: /r/a.py (1 replacements)."),
        ("write_file", "Successfully overwrote file: /r/a.py."),
    ],
)
def test_success_lines(name: str, text: str) -> None:
    assert agents.succeeded(name, text) is True
    assert agents.failure_shape(name, text) is None


@pytest.mark.parametrize(
    "text",
    [
        "apply_patch verification failed: Failed to find expected lines in /r/a.py:\n    x = 1",
        "Failed to edit, 0 occurrences found for old_string (x) in /r/a.py. No edits made.",
        "Failed to edit, expected 1 occurrence but found 3 for old_string in file: /r/a.py",
    ],
)
def test_an_agents_failure_line_is_a_failure_whatever_the_configured_patterns(text: str) -> None:
    assert FailureRule()(None) is None
    assert FailureRule().failed_text(text) is True
    assert FailureRule(patterns=()).failed_text(text) is True
    assert FailureRule(patterns=()).reason(text) == AGENT_FAILURE


PATCH = (
    "*** Begin Patch\n*** Update File: src/a.py\n@@ def f():\n-    x = 1\n+    x = 2\n     return x\n"
    "@@\n-y = 1\n+y = 2\n*** Add File: src/b.py\n+print(1)\n*** Delete File: src/c.py\n*** End Patch\n"
)


def test_what_a_patch_changes() -> None:
    assert agents.patch_files(PATCH) == ("src/a.py", "src/b.py", "src/c.py")
    assert agents.patch_change(PATCH) == (
        ("src/a.py", "    x = 1\n    return x", "    x = 2\n    return x"),
        ("src/a.py", "y = 1", "y = 2"),
        ("src/b.py", None, "print(1)"),
        ("src/c.py", "", None),
    )


@pytest.mark.parametrize(
    ("name", "arguments", "raw", "change"),
    [
        pytest.param(
            "Edit",
            {"file_path": "a", "old_string": "x", "new_string": "y"},
            None,
            (("", "x", "y"),),
            id="claude_code_edit",
        ),
        pytest.param("Write", {"file_path": "a", "content": "z"}, None, (("", None, "z"),), id="write"),
        pytest.param(
            "MultiEdit",
            {
                "file_path": "a",
                "edits": [{"old_string": "x", "new_string": "y"}, {"old_string": "p", "new_string": "q"}],
            },
            None,
            (("", "x", "y"), ("", "p", "q")),
            id="multi_edit",
        ),
        pytest.param(
            "edit",
            {"filePath": "a", "oldString": "x", "newString": "y"},
            None,
            (("", "x", "y"),),
            id="opencode_edit",
        ),
        pytest.param(
            "apply_patch",
            "INVALID",
            "*** Begin Patch\n*** Update File: a\n@@\n-x\n+y\n*** End Patch",
            (("a", "x", "y"),),
            id="codex_custom_tool_raw_patch",
        ),
        pytest.param(
            "apply_patch",
            {"input": "*** Begin Patch\n*** Update File: a\n-x\n+y\n"},
            None,
            (("a", "x", "y"),),
            id="codex_function_form",
        ),
        pytest.param("Bash", {"command": "ls"}, None, None, id="not_an_edit"),
        pytest.param("frobnicate", {"old": "x"}, None, None, id="unknown_tool"),
    ],
)
def test_what_an_edit_changes(name: str, arguments: Any, raw: Any, change: Any) -> None:
    assert agents.change_of(name, arguments, raw) == change


@pytest.mark.parametrize(
    ("change", "earlier", "undoes"),
    [
        ((("", "B", "A"),), (("", "A", "B"),), True),
        ((("", "A", "B"),), (("", "A", "B"),), False),
        ((("", "B", "C"),), (("", "A", "B"),), False),
        ((("f", "B", "A"),), (("g", "A", "B"),), False),
        ((("", None, "A"),), (("", "A", None),), False),
    ],
    ids=["swapped", "same_edit", "a_further_edit", "another_file", "whole_file"],
)
def test_an_edit_that_takes_an_earlier_one_back(change: Any, earlier: Any, undoes: bool) -> None:
    assert agents.undoes(change, earlier) is undoes


# --- the real agents' results -------------------------------------------------------------------


def _native() -> Path:
    env = os.environ.get("LOOPGUARD_REALTRAJ_NATIVE")
    return (
        Path(env) if env else Path(__file__).resolve().parents[4] / "shared" / "fixtures" / "realtraj-native"
    )


def _edit_results() -> list[tuple[str, str, bool]]:
    """(tool, result text, failed) of every Claude Code edit and Codex patch in the native sessions."""
    out: list[tuple[str, str, bool]] = []
    for path in sorted(_native().glob("*.json")):
        fx = json.loads(path.read_text())
        for body in [fx["request_bodies_final"], *(fx.get("compaction_segments") or [])]:
            names: dict[str, str] = {}
            for m in body.get("messages") or []:
                for b in m["content"] if isinstance(m["content"], list) else []:
                    if b.get("type") == "tool_use":
                        names[b["id"]] = b["name"]
                    elif b.get("type") == "tool_result" and names.get(b["tool_use_id"]) in ("Edit", "Write"):
                        content = b.get("content")
                        if isinstance(content, list):
                            content = "\n".join(x.get("text", "") for x in content if isinstance(x, dict))
                        out.append((names[b["tool_use_id"]], content or "", bool(b.get("is_error"))))
            for item in body.get("input") or []:
                if item.get("type") == "custom_tool_call":
                    names[item["call_id"]] = item["name"]
                elif (
                    item.get("type") == "custom_tool_call_output"
                    and names.get(item["call_id"]) == "apply_patch"
                ):
                    text = item["output"] if isinstance(item["output"], str) else json.dumps(item["output"])
                    out.append(("apply_patch", text, not text.startswith("Exit code: 0")))
    return out


def test_every_real_edit_result_is_a_success_line_or_a_failure_shape() -> None:
    """Each successful Claude Code Edit/Write and Codex apply_patch result of the native sessions
    has one of its tool's success lines; each failed one has a failure shape, which a user's
    rejection (not a tool failure) does not."""
    results = _edit_results()
    if not results:
        pytest.skip(f"native sessions not found at {_native()}")
    missing = [
        (name, text[:80]) for name, text, failed in results if not failed and not agents.succeeded(name, text)
    ]
    assert missing == []
    unshaped = {
        re.sub(r"/\S+", "PATH", text.split("\n")[0])[:60]
        for name, text, failed in results
        if failed and agents.failure_shape(name, text) is None
    }
    assert unshaped == {"The user doesn't want to proceed with this tool use. The too"}
    assert sum(1 for _, _, failed in results if not failed) >= 400


@pytest.mark.parametrize(
    ("name", "text", "nothing"),
    [
        ("grep", "No files found", True),  # OpenCode
        ("glob", "No files found", True),
        ("Grep", "No matches found", True),  # Claude Code
        ("Glob", "No files found", True),
        ("search_file_content", 'No matches found for pattern "x" in path ".".', True),  # Gemini CLI
        ("glob", 'No files found matching pattern "*.cfg" within /r.', True),
        ("Grep", "Found 0 files", True),
        ("Grep", "", True),
        ("grep", "  \n", True),
        ("grep", "Found 1 matches\n/r/a.ts:\n  Line 3: x", False),
        ("Glob", "/r/src/a.ts", False),
        ("grep", "Error: Ripgrep JSON record exceeded the limit", False),
        ("grep", "Nothing here: No files found", False),  # only at the start
        # not a search: an empty read, a quiet command
        ("read", "", False),
        ("bash", "", False),
        ("Bash", "No files found", False),
        ("mystery_tool", "No files found", False),
    ],
)
def test_a_search_that_found_nothing(name: str, text: str, nothing: bool) -> None:
    assert agents.found_nothing(name, {"pattern": "x"}, text) is nothing
