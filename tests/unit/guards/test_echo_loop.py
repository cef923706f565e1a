"""echo_loop (the loop fixture T3): the same command template re-run with only a quoted literal
changed while the output just echoes it."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.config import EchoLoopConfig, build
from proxy.core.actions import Remind
from proxy.guards.echo_loop import EchoLoop
from tests.helpers.agent_steps import History
from tests.helpers.rule_helpers import summary, transcript


def heredoc(word: str) -> tuple[str, dict[str, Any], str]:
    command = ["bash", "-lc", f"python3 - <<'PY'\nprint('{word}')\nPY"]
    output = orjson.dumps({"output": f"{word}\n", "metadata": {"exit_code": 0, "duration_seconds": 0.01}})
    return ("shell", {"command": command, "workdir": "/srv/app"}, output.decode())


def cat(path: str, content: str) -> tuple[str, dict[str, Any], str]:
    return ("bash", {"command": f'cat "{path}"'}, content)


def guard(**settings: Any) -> EchoLoop:
    return EchoLoop(build(EchoLoopConfig, settings))


@pytest.mark.parametrize(
    ("calls", "settings", "expected"),
    [
        pytest.param(
            [heredoc(w) for w in ("stub", "todo script", "script stub")],
            {},
            [("remind", 3, 3)],
            id="three_echoing_runs",
        ),
        pytest.param([heredoc(w) for w in ("stub", "todo")], {}, [], id="two_runs_nothing"),
        pytest.param(
            [heredoc(w) for w in ("a1", "b2", "c3", "d4", "e5", "f6")],
            {},
            [("remind", 3, 3)],
            id="once_per_chain",
        ),
        pytest.param(
            [heredoc(w) for w in ("stub", "todo", "noop")], {"repeats": 2}, [("remind", 2, 2)], id="repeats_2"
        ),
        pytest.param(
            [heredoc("stub"), ("bash", {"command": "ls"}, "a b"), heredoc("todo"), heredoc("noop")],
            {},
            [],
            id="another_call_breaks_the_chain",
        ),
        pytest.param(
            [cat(p, f"# {p}\nimport {p[0]}\n") for p in ("a.py", "b.py", "c.py", "d.py")],
            {},
            [],
            id="batch_of_different_files_output_is_new",
        ),
        pytest.param(
            [cat(f"{p}/__init__.py", "") for p in ("a", "b", "c", "d")],
            {},
            [],
            id="batch_of_empty_files",
        ),
        pytest.param(
            [("bash", {"command": f'touch "{p}"'}, "") for p in ("a", "b", "c", "d")],
            {},
            [],
            id="nothing_echoed",
        ),
        pytest.param([heredoc("stub")] * 4, {}, [], id="identical_calls_are_not_echo_runs"),
        pytest.param(
            [("write_stdin", {"session_id": 3, "chars": ""}, f"Output: rows {i}") for i in range(5)],
            {},
            [],
            id="polling",
        ),
        pytest.param(
            [heredoc(w) for w in ("ab", "cd", "ef")],
            {"min_literal_chars": 3},
            [],
            id="literals_shorter_than_min_ignored",
        ),
    ],
)
def test_echo_loop(calls: list[Any], settings: dict[str, Any], expected: list[tuple[str, int, int]]) -> None:
    assert summary(guard(**settings), History().steps(calls)) == expected


def test_user_message_starts_afresh() -> None:
    h = (
        History()
        .steps([heredoc("stub"), heredoc("todo")])
        .user("write the real script")
        .steps([heredoc("x1")])
    )
    assert summary(guard(), h) == []


def test_reminder_text() -> None:
    h = History().steps([heredoc(w) for w in ("stub", "todo", "noop")])
    (action,) = guard()(transcript(h), None)
    assert action == Remind(
        after=h.result_position(3),
        text=(
            "[loopguard] Your last 3 calls ran the same shell command with only a quoted text changed, "
            "and each output just echoed that text back:\n"
            '- template: {"command":["bash","-lc","python3 - <<\'…\'\\nprint(\'…\')\\nPY"],'
            '"workdir":"/srv/app"}\n'
            "Nothing new is coming back: each output is only the text you put in. Write the "
            "actual code or command the task needs, or tell the user what is blocking you."
        ),
        rule="echo_loop",
        tool="shell",
        count=3,
        limit=3,
        fresh=True,
        call=2,
    )
