"""Waiting on a running process is not looping (proxy.core.waits, proxy.guards.waiting): the shapes
are those of the recorded Codex and Claude Code sessions (shared/fixtures/realtraj-native)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from proxy.config import Config, WaitingConfig, load_config
from proxy.core.actions import Remind
from proxy.core.transcript import ToolCall, ToolResult
from proxy.core.waits import has_output, is_wait, poll_of, sleep_ms, started, waited_ms
from proxy.guards import Context, build_guards, evaluate
from proxy.guards.waiting import PROCESS_TEXT, SLEEP_TEXT, Waiting
from tests.helpers.agent_steps import Call, History
from tests.helpers.rule_helpers import call_at, transcript

SID = 59664
POLL = {"session_id": SID, "chars": "", "yield_time_ms": 30000, "max_output_tokens": 12000}


def codex(wall: float, status: str = "running", output: str = "", sid: int = SID) -> str:
    """A Codex exec_command / write_stdin result as codex-rs writes it."""
    line = (
        f"Process running with session ID {sid}"
        if status == "running"
        else f"Process exited with code {status}"
    )
    count = len(output.split())
    head = f"Chunk ID: f3382c\nWall time: {wall:.4f} seconds\n{line}\n"
    return f"{head}Original token count: {count}\nOutput:\n{output}"


def task(status: str, output: str | None = None) -> str:
    """A Claude Code TaskOutput result."""
    ready = "not_ready" if status == "running" else "success"
    text = f"<retrieval_status>{ready}</retrieval_status>\n\n<task_id>b2ed671</task_id>\n\n"
    text += f"<task_type>local_bash</task_type>\n\n<status>{status}</status>"
    if output is not None:
        text += f"\n\n<exit_code>0</exit_code>\n\n<output>\n{output}\n</output>"
    return text


def poll(wall: float = 30.0, status: str = "running", output: str = "") -> Call:
    return ("write_stdin", POLL, codex(wall, status, output))


def start(cmd: str = "cargo build --release", wall: float = 10.0) -> Call:
    args = {"cmd": cmd, "workdir": "/srv/app", "yield_time_ms": 10000}
    return ("exec_command", args, codex(wall))


def call(
    name: str, args: Any, text: str | None, is_error: bool | None = None, pending: bool = False
) -> ToolCall:
    result = None if text is None and not pending else ToolResult(3, text or "", is_error, pending)
    return ToolCall(0, 0, 1, 2, "c1", name, None, args, result)


@pytest.mark.parametrize(
    ("name", "args", "text", "wait", "process", "ms"),
    [
        pytest.param(
            "write_stdin", POLL, codex(30.0045), True, "session:59664", 30004, id="codex_poll_running"
        ),
        pytest.param("write_stdin", POLL, codex(0.0, "1"), False, "session:59664", 0, id="codex_poll_exited"),
        pytest.param(
            "write_stdin",
            {**POLL, "chars": "y\n"},
            codex(1.0),
            False,
            None,
            1000,
            id="codex_writing_input_is_not_a_wait",
        ),
        pytest.param("write_stdin", POLL, None, True, "session:59664", 0, id="codex_poll_pending_waits"),
        pytest.param(
            "TaskOutput",
            {"task_id": "b2ed671", "block": True, "timeout": 60000},
            task("running"),
            True,
            "task:b2ed671",
            60000,
            id="claude_taskoutput_blocking_running",
        ),
        pytest.param(
            "TaskOutput",
            {"task_id": "b2ed671", "block": False, "timeout": 5000},
            task("running"),
            True,
            "task:b2ed671",
            0,
            id="claude_taskoutput_nonblocking_reports_no_time",
        ),
        pytest.param(
            "TaskOutput",
            {"task_id": "b2ed671", "block": True, "timeout": 600000},
            task("completed", "ok"),
            False,
            "task:b2ed671",
            0,
            id="claude_taskoutput_completed",
        ),
        pytest.param(
            "BashOutput",
            {"bash_id": "bash_1"},
            "<status>running</status>\n\n<stdout>\nstep 3\n</stdout>",
            True,
            "task:bash_1",
            0,
            id="claude_bashoutput_running",
        ),
        pytest.param(
            "Bash",
            {"command": "sleep 60 && echo done", "description": "Wait"},
            "done",
            True,
            None,
            60000,
            id="claude_sleep_and_echo",
        ),
        pytest.param(
            "exec_command",
            {"cmd": "sleep 1m; sleep 30"},
            codex(90.0, "0"),
            True,
            None,
            90000,
            id="codex_sleeps",
        ),
        pytest.param(
            "Bash",
            {"command": "sleep 5 && make test"},
            "ok",
            False,
            None,
            0,
            id="sleep_then_a_command_is_a_command",
        ),
        pytest.param("Bash", {"command": "sleep 5 > /tmp/x"}, "", False, None, 0, id="sleep_writing_a_file"),
        pytest.param(
            "Bash", {"command": "sleep 10"}, "Error: killed", True, None, 10000, id="sleep_text_result"
        ),
        pytest.param(
            "exec_command", {"cmd": "git status"}, codex(0.1, "0", "clean"), False, None, 100, id="a_command"
        ),
        # a wait exempts a call only while time passes: a sleep that waits for nothing is a command
        pytest.param(
            "Bash",
            {"command": "sleep 0 && echo still waiting"},
            "still waiting",
            False,
            None,
            0,
            id="sleep_0_waits_for_nothing",
        ),
        pytest.param(
            "Bash", {"command": "sleep 0"}, None, False, None, 0, id="sleep_0_pending_waits_for_nothing"
        ),
        pytest.param("Bash", {"command": "sleep 0.5; echo x"}, "x", True, None, 500, id="half_second_sleep"),
        pytest.param("Bash", {"command": "sleep 0.05; echo x"}, "x", False, None, 50, id="a_50_ms_sleep"),
        pytest.param("Bash", {"command": "sleep 1 && echo x"}, "x", True, None, 1000, id="one_second_sleep"),
        pytest.param(
            "exec_command",
            {"cmd": "sleep 30 && echo done"},
            codex(0.002, "0", "done"),
            False,
            None,
            2,
            id="codex_sleep_whose_wall_time_says_it_did_not_wait",
        ),
    ],
)
def test_what_waits(name: str, args: Any, text: str | None, wait: bool, process: str | None, ms: int) -> None:
    c = call(name, args, text, pending=text is None)
    assert (is_wait(c), poll_of(c), waited_ms(c)) == (wait, process, ms)


@pytest.mark.parametrize(
    ("name", "args", "text", "expected"),
    [
        pytest.param("exec_command", {"cmd": "make"}, codex(10.0), "session:59664", id="codex_left_running"),
        pytest.param(
            "Bash",
            {"command": "go test ./...", "run_in_background": True},
            "Command running in background with ID: bc95948. Output is being written to: /tmp/x.output",
            "task:bc95948",
            id="claude_background",
        ),
        pytest.param("exec_command", {"cmd": "make"}, codex(1.0, "0"), None, id="codex_exited"),
    ],
)
def test_started(name: str, args: Any, text: str, expected: str | None) -> None:
    assert started(call(name, args, text)) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(codex(30.0), False, id="codex_empty"),
        pytest.param(codex(30.0, output="Compiling foo v0.1\n"), True, id="codex_output"),
        pytest.param(task("running"), False, id="task_none"),
        pytest.param(task("completed", "PASS"), True, id="task_output"),
        pytest.param("<status>running</status>\n\n<stdout>\n\n</stdout>", False, id="bashoutput_blank"),
    ],
)
def test_has_output(text: str, expected: bool) -> None:
    assert has_output(ToolResult(3, text)) is expected


def test_sleep_durations() -> None:
    sleeps = ["sleep 60", "sleep 1.5", "sleep 2m", "sleep 1h", "sleep 2 3", "sleep 60 && echo 'waited 60'"]
    assert [sleep_ms(call("Bash", {"command": s}, "")) for s in sleeps] == [
        60000,
        1500,
        120000,
        3600000,
        5000,
        60000,
    ]
    assert sleep_ms(call("Bash", {"command": "sleep $N"}, "")) is None
    assert sleep_ms(call("shell", {"command": ["bash", "-lc", "sleep 30"]}, "")) == 30000


def actions(h: History, **waiting: Any) -> list[tuple[str, str, int, int]]:
    """Every default guard over ``h``: (rule, kind, call number, count)."""
    cfg = Config()
    if waiting:
        cfg = Config(guards=dataclasses.replace(cfg.guards, waiting=WaitingConfig(**waiting)))
    t = transcript(h)
    return [
        (a.rule, a.kind, call_at(t, a), a.count) for a in evaluate(t, build_guards(cfg.guards), Context())
    ]


def test_codex_polls_a_running_build_no_action() -> None:
    """Thirty polls of a running build (each 30 s, empty output) then its output: what Codex did
    in codex-agentv-1f4427577930-0, withheld and stopped before."""
    h = History().step(start()).steps([poll() for _ in range(30)])
    h.step(poll(2.0, "0", "Finished release [optimized]\n"))
    assert actions(h) == []


def test_codex_status_checks_between_polls_no_action() -> None:
    """A status command between polls (the same output each time) is not a repeat: time passed."""
    capture = ("exec_command", {"cmd": "workmux capture grade -n 200"}, codex(0.0001, "0", "grading 3/9\n"))
    h = History().step(start())
    for _ in range(8):
        h.step(poll()).step(poll()).step(capture)
    assert actions(h) == []


def test_claude_sleeps_between_tasklist_checks_no_action() -> None:
    tasklist = ("TaskList", {}, "#1 [in_progress] Port the parser (teammate: parser)\n#2 [pending] Docs")
    h = History()
    for _ in range(10):
        h.step(("Bash", {"command": "sleep 60 && echo waited", "description": "Wait"}, "waited")).step(
            tasklist
        )
    assert actions(h) == []


def test_claude_taskoutput_polls_no_action() -> None:
    bg = (
        "Bash",
        {"command": "npm test", "run_in_background": True},
        "Command running in background with ID: b1.",
    )
    check = ("TaskOutput", {"task_id": "b1", "block": False, "timeout": 5000}, task("running"))
    h = (
        History()
        .step(bg)
        .steps([check] * 20)
        .step(("TaskOutput", {"task_id": "b1"}, task("completed", "12 passed")))
    )
    assert actions(h) == []


def test_the_same_poll_after_exit_is_an_ordinary_repeat() -> None:
    """Once a poll says the process exited, the wait is over: repeating that poll with the same
    result is counted like any repeat (calls 5-12; the running polls before are not part of it)."""
    h = History().step(start()).steps([poll()] * 3).steps([poll(0.0, "0", "done\n")] * 8)
    assert actions(h) == [
        ("repeat_reminder", "remind", 7, 3),
        ("repeat_reminder", "remind", 9, 5),
        ("repeat_reminder", "remind", 12, 8),
        ("circuit_breaker", "withhold", 11, 7),
        ("circuit_breaker", "withhold", 12, 8),
        ("escalation", "withhold", 10, 2),
        ("escalation", "withhold", 11, 2),
        ("escalation", "withhold", 12, 2),
    ]


def wait_reminders(h: History, **settings: Any) -> list[tuple[int, int, str]]:
    t = transcript(h)
    out = Waiting(WaitingConfig(**settings))(t, None)
    assert all(isinstance(a, Remind) and a.call is None and a.rule == "waiting" for a in out)
    return [(call_at(t, a), a.count, a.text) for a in out]


def process_text(duration: str, checks: int, subject: str = f"process {SID}") -> str:
    return PROCESS_TEXT.format(duration=duration, subject=subject, checks=checks)


def test_a_long_quiet_wait_is_reminded_once_then_at_each_doubling() -> None:
    """Start (10 s) + 150 polls of 30 s: 30 min is reached at poll 60 (call 61), 60 min at call
    121; nothing at 90 min. The counts are the quiet seconds."""
    h = History().step(start()).steps([poll()] * 150)
    assert wait_reminders(h) == [
        (61, 1810, process_text("30 minutes", 61)),
        (121, 3610, process_text("60 minutes", 121)),
    ]


def test_new_output_restarts_the_quiet_time() -> None:
    h = (
        History()
        .step(start())
        .steps([poll()] * 50)
        .step(poll(output="Compiling 12/40\n"))
        .steps([poll()] * 65)
    )
    assert wait_reminders(h) == [(112, 1800, process_text("30 minutes", 60))]


def test_exit_ends_the_wait_and_a_new_request_starts_over() -> None:
    h = History().step(start()).steps([poll()] * 50).step(poll(1.0, "0")).step(start()).steps([poll()] * 50)
    assert wait_reminders(h) == []
    h = History().step(start()).steps([poll()] * 50).user("how is it going?").steps([poll()] * 50)
    assert wait_reminders(h) == []


def test_sleeps_are_reminded_by_their_duration() -> None:
    sleep = ("Bash", {"command": "sleep 300 && echo waited"}, "waited")
    status = ("TaskList", {}, "#1 [in_progress]")
    h = History()
    for _ in range(7):
        h.step(sleep).step(status)
    assert wait_reminders(h) == [(11, 1800, SLEEP_TEXT.format(duration="30 minutes", checks=6))]
    # an edit in between: not one wait any more
    edit = (
        "Edit",
        {"file_path": "a.py", "old_string": "x", "new_string": "y"},
        "The file a.py has been updated.",
    )
    h = History()
    for _ in range(4):
        h.step(sleep).step(status).step(sleep).step(edit)
    assert wait_reminders(h) == []


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        pytest.param({"remind_after_ms": 0}, [], id="off"),
        pytest.param({"remind_after_ms": 600_000}, [21, 41, 81], id="ten_minutes"),
    ],
)
def test_remind_after_ms(settings: dict[str, Any], expected: list[int]) -> None:
    h = History().step(start()).steps([poll()] * 100)
    assert [at for at, _, _ in wait_reminders(h, **settings)] == expected


def test_a_blocking_taskoutput_counts_its_timeout() -> None:
    check = ("TaskOutput", {"task_id": "b1", "block": True, "timeout": 600000}, task("running"))
    h = History().steps([check] * 7)
    subject = "background task b1"
    assert wait_reminders(h) == [
        (3, 1800, process_text("30 minutes", 3, subject)),
        (6, 3600, process_text("60 minutes", 6, subject)),
    ]


def test_waits_are_never_withheld_through_the_default_guards() -> None:
    """Four hours of polling without output: reminders only, from this rule only."""
    h = History().step(start()).steps([poll()] * 480)
    assert actions(h) == [
        ("waiting", "remind", 61, 1810),
        ("waiting", "remind", 121, 3610),
        ("waiting", "remind", 241, 7210),
        ("waiting", "remind", 481, 14410),
    ]


@pytest.mark.parametrize("profile", ["dsh-loop-guard", "dsh-circuit-breaker", "dsh-repeat-tool-guard"])
def test_waits_are_never_withheld_under_the_seed_profiles(profile: str) -> None:
    """The per-turn caps of ``turn_guard`` (40 calls, the 3rd identical call) do not count waits
    either: 60 polls in one turn, then the output."""
    cfg = load_config(Path(__file__).resolve().parents[3] / "config" / "profiles" / f"{profile}.yaml")
    h = History().step(start()).steps([poll()] * 60).step(poll(1.0, "0", "Finished\n"))
    t = transcript(h)
    got = [(a.rule, a.kind, call_at(t, a)) for a in evaluate(t, build_guards(cfg.guards), Context())]
    assert [a for a in got if a[1] != "remind"] == []
