"""A patch run through Codex's shell tool is read as the patch it carries (proxy/core/agents.py,
DESIGN §2.2): Codex 0.171 offers no edit tool to a custom model provider, so its model edits with
``exec_command {"cmd": "apply_patch <<'EOF' … EOF"}``, which Codex intercepts and applies itself.
Such a call is on the patch's first file, as the ``apply_patch`` tool; its change (old/new
hunks) is what the edit ledger keeps; its failures have ``apply_patch``'s shape. Any other shell
command is read as before. The result texts are the real Codex 0.171's (``exec_command`` through
loopguard, tests/agents/test_agent_scenarios.py)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.core import agents
from proxy.core.effects import EditLedger, EffectRule, Situations, is_mutation
from proxy.core.targets import TargetRule, call_on
from tests.helpers.agent_steps import History
from tests.helpers.rule_helpers import transcript

PATCH = "*** Begin Patch\n*** Update File: app.txt\n@@\n-line 1\n+LINE 1\n*** End Patch"
HEREDOC = f"apply_patch <<'EOF'\n{PATCH}\nEOF\n"
CHANGE = (("app.txt", "line 1", "LINE 1"),)
TWO_FILES = (
    "*** Begin Patch\n*** Update File: src/a.py\n@@ def f():\n-    x = 1\n+    x = 2\n"
    "*** Add File: src/b.py\n+print(1)\n*** End Patch"
)
#: What Codex 0.171 answers an exec_command that ran a patch, and one whose patch did not apply.
PATCHED = (
    "Wall time: 0.0000 seconds\nOutput:\nExit code: 0\nWall time: 0 seconds\nOutput:\n"
    "Success. Updated the following files:\nM app.txt\n"
)


def not_found(old: str) -> str:
    return f"apply_patch verification failed: Failed to find expected lines in /w/app.txt:\n{old}"


@pytest.mark.parametrize(
    ("name", "arguments", "patch"),
    [
        pytest.param("exec_command", {"cmd": HEREDOC}, PATCH, id="exec_command_heredoc"),
        pytest.param(
            "exec_command",
            {"cmd": f'cd /w && applypatch << "PATCH"\n{PATCH}\nPATCH', "yield_time_ms": 1000},
            PATCH,
            id="exec_command_cd_then_heredoc",
        ),
        pytest.param("shell", {"command": ["apply_patch", PATCH]}, PATCH, id="shell_argv_list"),
        pytest.param("shell", {"command": ["bash", "-lc", HEREDOC]}, PATCH, id="shell_bash_lc_wrapper"),
        pytest.param("shell", {"command": ["/bin/zsh", "-c", HEREDOC]}, PATCH, id="shell_zsh_c_wrapper"),
        pytest.param("shell_command", {"command": HEREDOC}, PATCH, id="shell_command_heredoc"),
    ],
)
def test_a_shell_call_that_runs_a_patch_is_read_as_the_patch(name: str, arguments: Any, patch: str) -> None:
    assert agents.shell_patch(name, arguments) == patch
    assert agents.runs_as(name, arguments) == "apply_patch"
    assert agents.kind_of(name, arguments) == "mutate"
    assert agents.patched_files(name, arguments, None) == ("app.txt",)
    assert agents.change_of(name, arguments, None) == CHANGE
    assert call_on(TargetRule(), name, arguments) == ("apply_patch", "app.txt")
    assert is_mutation(name, arguments) is True
    assert EffectRule().may_change(name, arguments) is True


def test_a_shell_patch_of_two_files_is_on_the_first_and_changes_both() -> None:
    arguments = {"cmd": f"apply_patch <<'EOF'\n{TWO_FILES}\nEOF"}
    assert call_on(TargetRule(), "exec_command", arguments) == ("apply_patch", "src/a.py")
    assert agents.change_of("exec_command", arguments, None) == (
        ("src/a.py", "    x = 1", "    x = 2"),
        ("src/b.py", None, "print(1)"),
    )


@pytest.mark.parametrize(
    ("name", "arguments", "target"),
    [
        pytest.param("exec_command", {"cmd": "git status"}, "git status", id="a_plain_command"),
        pytest.param(
            "exec_command",
            {"cmd": f"{HEREDOC}echo done"},
            f"{HEREDOC}echo done",
            id="a_command_after_the_heredoc_runs_in_the_shell",
        ),
        pytest.param(
            "exec_command", {"cmd": f"echo hi; {HEREDOC}"}, f"echo hi; {HEREDOC}", id="a_command_before_it"
        ),
        pytest.param(
            "exec_command",
            {"cmd": f"cat > p.diff <<'EOF'\n{PATCH}\nEOF"},
            f"cat > p.diff <<'EOF'\n{PATCH}\nEOF",
            id="a_patch_written_to_a_file",
        ),
        pytest.param(
            "exec_command",
            {"cmd": "apply_patch <<'EOF'\nhello\nEOF"},
            "apply_patch <<'EOF'\nhello\nEOF",
            id="a_heredoc_that_is_not_a_patch",
        ),
        pytest.param(
            "exec_command",
            {"cmd": f"apply_patch <<'EOF'\n{PATCH}\n"},
            f"apply_patch <<'EOF'\n{PATCH}\n",
            id="a_heredoc_never_closed",
        ),
        pytest.param(
            "shell", {"command": ["python", "apply_patch.py"]}, "python apply_patch.py", id="an_argv_list"
        ),
        pytest.param(
            "shell", {"command": ["bash", "-x", HEREDOC]}, f"bash -x {HEREDOC}", id="a_shell_flag_not_c"
        ),
        pytest.param("Bash", {"command": HEREDOC}, HEREDOC, id="claude_code_does_not_intercept_patches"),
    ],
)
def test_a_shell_command_that_does_not_run_a_patch_is_read_as_before(
    name: str, arguments: Any, target: str
) -> None:
    assert agents.shell_patch(name, arguments) is None
    assert agents.runs_as(name, arguments) == name
    assert agents.kind_of(name, arguments) == "execute"
    assert agents.patched_files(name, arguments, None) == ()
    assert agents.change_of(name, arguments, None) is None
    assert call_on(TargetRule(), name, arguments) == (name, " ".join(target.split()))
    assert is_mutation(name, arguments) is False


def test_a_failing_shell_patch_has_the_patch_tools_failure_shape() -> None:
    arguments = {"cmd": HEREDOC}
    shape = "apply_patch verification failed: Failed to find expected lines in /w/app.txt:"
    assert agents.failure_shape("exec_command", not_found("line 1O"), arguments=arguments) == shape
    assert agents.same_failure(
        "exec_command", not_found("line 1O"), not_found("l0"), arguments=arguments
    ) == (shape)
    assert agents.failure_shape("exec_command", PATCHED, arguments=arguments) is None
    # a command that is not a patch has no failure shapes, whatever its output says
    assert agents.failure_shape("exec_command", not_found("x"), arguments={"cmd": "cat log.txt"}) is None
    assert agents.failure_shape("exec_command", not_found("x")) is None


def shell_patch(old: str, new: str, result: str) -> tuple[str, dict[str, Any], str]:
    patch = f"*** Begin Patch\n*** Update File: app.txt\n@@\n-{old}\n+{new}\n*** End Patch"
    return ("exec_command", {"cmd": f"apply_patch <<'EOF'\n{patch}\nEOF\n"}, result)


@pytest.mark.parametrize(
    ("steps", "progress"),
    [
        pytest.param(
            [shell_patch(f"line {n}", f"LINE {n}", PATCHED) for n in range(10)],
            [True] * 10,
            id="ten_different_patches",
        ),
        pytest.param(
            [shell_patch("a", "b", PATCHED), shell_patch("b", "a", PATCHED), shell_patch("a", "b", PATCHED)],
            [True, False, False],
            id="a_revert_and_a_repeat",
        ),
        pytest.param(
            [shell_patch("a", "b", not_found("a")), shell_patch("a", "b", PATCHED)],
            [False, True],
            id="a_failed_patch_is_no_progress",
        ),
        pytest.param(
            [("exec_command", {"cmd": "python3 check.py"}, "Wall time: 0.0 seconds\nOutput:\nok\n")],
            [False],
            id="a_command",
        ),
    ],
)
def test_which_successful_shell_patches_are_progress(steps: list[Any], progress: list[bool]) -> None:
    t = transcript(History().steps(steps))
    ledger = EditLedger(Situations())
    assert [ledger.progress(c, call_on(TargetRule(), c.name, c.arguments)) for c in t.calls] == progress
