"""The real Claude Code and Codex CLI, headless through the real server to a scripted model: two
loops that must be stopped, one that must be withheld and stopped, and two healthy sessions that
must be left alone byte for byte. Each scenario runs once per agent; the harnesses are
:mod:`tests.helpers.claude_code` and :mod:`tests.helpers.codex_cli` (skipped with an install hint
when the pinned
CLI is not installed), a TCP tap between the agent and loopguard keeps what the agent sent.

How each agent does the scenario's steps (the tools the pinned versions offer):

- a shell command: Claude Code ``Bash {"command", "description"}``, Codex ``exec_command {"cmd"}``;
- an edit of ``app.txt``: Claude Code ``Edit`` (a missing ``old_string`` is an ``is_error`` result
  ``<tool_use_error>String to replace not found in file.\\nString: …``); Codex 0.171 offers no
  edit tool to a custom provider, so the model runs ``apply_patch <<'EOF' … EOF`` through
  ``exec_command``, which Codex intercepts and applies itself (a missing line: ``apply_patch
  verification failed: Failed to find expected lines in PATH:\\n<the line>``);
- a plan update: neither pinned version offers a plan tool (Claude Code 2.1's TodoWrite is
  disabled in ``-p`` sessions, Codex's ``update_plan`` is not offered to a custom model), so the
  plan is written to ``PLAN.md`` (Claude Code ``Write``, Codex ``printf … > PLAN.md``), the same
  plan each time;
- waiting on a running command: Codex starts it with ``exec_command`` and polls it with
  ``write_stdin {"chars": ""}`` (each empty poll waits at least 5 s, whatever ``yield_time_ms``
  says: Codex's own floor); Claude Code 2.1 has no ``TaskOutput``/``BashOutput`` (a background
  ``Bash`` says "You will be notified when it completes. To check interim output, use Read on
  that file path"), so its model waits with ``sleep 0.5 && echo still running`` and then reads the
  output file.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import ProxyFactory
from tests.helpers.claude_code import find_claude, run_claude
from tests.helpers.codex_cli import find_codex, run_codex
from tests.helpers.fake_messages import FakeMessages, text, tool_use
from tests.helpers.fake_responses import FakeResponses, function_call, message
from tests.helpers.fakes import FakeUpstream
from tests.helpers.tcp_tap import tap

AGENTS = ("claude_code", "codex")
FINAL = "Done."
STOPPED = "[loopguard] Stopped:"
CHECK_PY = """\
lines = open("app.txt").read().splitlines()
bad = [line for line in lines if not line.startswith("LINE")]
print(f"{len(lines) - len(bad)} passed, {len(bad)} failed")
raise SystemExit(1 if bad else 0)
"""
PLAN = "1. build\n2. test\n"
#: Waits until the test creates ``go`` in the work directory, then prints its line.
WAITER = "while [ ! -f go ]; do sleep 0.2; done; echo finished"


@dataclass(frozen=True)
class Op:
    """One step the scripted model asks for: ``kind`` ``shell`` (``arg``: a command line),
    ``edit`` (``arg``: (old, new) in ``app.txt``), ``plan``, ``start`` (``arg``: a command left
    running), ``poll`` (wait on the started command), ``read`` (``arg``: a path) or ``say``
    (a final text)."""

    kind: str
    arg: Any = None


Script = Callable[[int, str], Op]


@dataclass
class Session:
    returncode: int | None
    final: str
    stats: dict[str, Any]
    #: the bodies that reached the model server (decoded)
    bodies: list[dict[str, Any]]
    #: what the agent sent and what it got, as the tap saw it, and what the model server got
    #: and answered
    sent: list[bytes]
    got: list[bytes]
    reached: list[bytes]
    answered: list[bytes]


def claude_block(op: Op, work: Path) -> list[dict[str, Any]]:
    if op.kind == "say":
        return [text(op.arg or FINAL)]
    if op.kind == "edit":
        old, new = op.arg
        return [tool_use("Edit", {"file_path": str(work / "app.txt"), "old_string": old, "new_string": new})]
    if op.kind == "plan":
        return [tool_use("Write", {"file_path": str(work / "PLAN.md"), "content": PLAN})]
    if op.kind == "start":
        return [tool_use("Bash", {"command": op.arg, "description": "Run it", "run_in_background": True})]
    if op.kind == "poll":
        return [tool_use("Bash", {"command": "sleep 0.5 && echo still running", "description": "Wait"})]
    if op.kind == "read":
        return [tool_use("Read", {"file_path": op.arg})]
    return [tool_use("Bash", {"command": op.arg, "description": "Run it"})]


def codex_items(op: Op, last: str) -> list[dict[str, Any]]:
    if op.kind == "say":
        return [message(op.arg or FINAL)]
    if op.kind == "poll":
        sid = re.search(r"Process running with session ID (\d+)", last)
        args = {"session_id": int(sid.group(1)) if sid else 0, "chars": "", "yield_time_ms": 500}
        return [function_call("write_stdin", json.dumps(args))]
    if op.kind == "edit":
        old, new = op.arg
        patch = f"*** Begin Patch\n*** Update File: app.txt\n@@\n-{old}\n+{new}\n*** End Patch\n"
        cmd = f"apply_patch <<'EOF'\n{patch}EOF\n"
    elif op.kind == "plan":
        cmd = f"printf {shlex.quote(PLAN)} > PLAN.md"
    elif op.kind == "read":
        cmd = f"cat {shlex.quote(op.arg)}"
    else:
        cmd = op.arg
    args: dict[str, Any] = {"cmd": cmd}
    if op.kind == "start":
        args["yield_time_ms"] = 500
    return [function_call("exec_command", json.dumps(args))]


def last_claude_result(body: dict[str, Any]) -> str:
    for m in reversed(body["messages"]):
        if m["role"] == "user" and isinstance(m["content"], list):
            for b in reversed(m["content"]):
                if b.get("type") == "tool_result":
                    c = b["content"]
                    return c if isinstance(c, str) else json.dumps(c)
    return ""


def last_codex_result(body: dict[str, Any]) -> str:
    outs = [
        i["output"] for i in body["input"] if isinstance(i, dict) and i.get("type") == "function_call_output"
    ]
    return str(outs[-1]) if outs else ""


async def stats_of(base: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(f"{base}/loop-guard") as r:
        return dict(await r.json())


async def session(
    agent: str,
    upstream: FakeUpstream,
    make_proxy: ProxyFactory,
    tmp_path: Path,
    work: Path,
    script: Script,
    timeout: float = 120,
) -> Session:
    """One headless run of ``agent`` in ``work`` through a tap and a fresh loopguard (shipped
    defaults) to a fake model answering with ``script(n, last result text)``."""
    base = await make_proxy(None)
    port = int(base.rsplit(":", 1)[1])
    if agent == "claude_code":
        binary = find_claude()
        fake_m = FakeMessages(
            lambda n, body: claude_block(script(n, last_claude_result(body)), work),
            side=(lambda body: "tools" not in body, lambda body: [text("A title")]),
        )
        upstream.handler = fake_m.handle
        async with tap(port) as t:
            run = await run_claude(
                binary,
                f"http://127.0.0.1:{t.port}",
                "Fix app.txt.",
                work,
                tmp_path / "home",
                allowed_tools=("Bash", "Read", "Edit", "Write"),
                timeout=timeout,
            )
        final = run.result().get("result", "") if run.returncode is not None and run.stdout.strip() else ""
        bodies, answered = fake_m.bodies, fake_m.answers
    else:
        binary = find_codex()
        fake_r = FakeResponses(
            lambda n, body: codex_items(script(n, last_codex_result(body)), last_codex_result(body))
        )
        upstream.handler = fake_r.handle
        async with tap(port) as t:
            run = await run_codex(
                binary, f"http://127.0.0.1:{t.port}/v1", "Fix app.txt.", work, tmp_path / "home", timeout
            )
        final = run.stdout
        bodies, answered = fake_r.bodies, fake_r.answers
    return Session(
        run.returncode,
        final,
        await stats_of(base),
        bodies,
        [body for _, body in t.requests()],
        [body for _, body in t.responses()],
        [r.body for r in upstream.requests],
        list(answered),
    )


@pytest.fixture
def work(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    (path / "app.txt").write_text("".join(f"line {i}\n" for i in range(10)))
    (path / "check.py").write_text(CHECK_PY)
    (path / "status.txt").write_text("build: pending\n")
    return path


def assert_untouched(s: Session) -> None:
    """Every byte the agent sent reached the model server and every byte it answered reached the
    agent; loopguard decided nothing."""
    assert s.sent == s.reached
    assert s.got == s.answered
    assert (s.stats["rewritten_requests"], s.stats["reminders_injected"], s.stats["results_withheld"]) == (
        0,
        0,
        0,
    )
    assert (s.stats["stops"], s.stats["internal_errors"]) == (0, 0)


# --- loops -------------------------------------------------------------------------------------------

#: Drifting retries of one edit whose old text is not in the file (a small model's noise).
DRIFT = [f"line {x}" for x in ("1O", "1O ", "l0", "1 O", "10.", "1o", "I0", "lO", "1 0", "10!", "1_0", "10,")]


@pytest.mark.parametrize("agent", AGENTS)
async def test_an_edit_never_found_with_drifting_arguments_is_withheld_then_stopped(
    agent: str, upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path, work: Path
) -> None:
    def script(n: int, last: str) -> Op:
        return Op("edit", (DRIFT[n], "line 10")) if n < len(DRIFT) else Op("say", "Giving up.")

    s = await session(agent, upstream, make_proxy, tmp_path, work, script)
    assert s.returncode == 0
    assert s.stats["results_withheld"] >= 1 and s.stats["stops"] == 1
    assert STOPPED in s.final
    assert len(s.bodies) < len(DRIFT)


@pytest.mark.parametrize("agent", AGENTS)
async def test_the_same_search_with_the_same_output_is_stopped_by_call_8(
    agent: str, upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path, work: Path
) -> None:
    """``grep -n 'line 3' app.txt`` asked 30 times: calls 1-6 run, the 7th answer is the stop."""

    def script(n: int, last: str) -> Op:
        return Op("shell", "grep -n 'line 3' app.txt") if n < 30 else Op("say", "Giving up.")

    s = await session(agent, upstream, make_proxy, tmp_path, work, script)
    assert s.returncode == 0
    assert STOPPED in s.final
    assert (len(s.bodies), s.stats["stops"], s.stats["results_withheld"]) == (7, 1, 1)


@pytest.mark.parametrize("agent", AGENTS)
async def test_a_status_command_repeated_between_plan_updates_is_stopped(
    agent: str, upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path, work: Path
) -> None:
    """The same plan written, the status read, again and again (nothing changes after the first
    plan): the status command's results are withheld and the turn is stopped."""

    def script(n: int, last: str) -> Op:
        if n >= 30:
            return Op("say", "Giving up.")
        return Op("plan") if n % 2 == 0 else Op("shell", "cat status.txt")

    s = await session(agent, upstream, make_proxy, tmp_path, work, script)
    assert s.returncode == 0
    assert STOPPED in s.final
    assert (len(s.bodies), s.stats["stops"]) == (10, 1)


# --- healthy sessions --------------------------------------------------------------------------------


@pytest.mark.parametrize("agent", AGENTS)
async def test_ten_different_edits_of_one_file_then_a_passing_test_are_left_alone(
    agent: str, upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path, work: Path
) -> None:
    def script(n: int, last: str) -> Op:
        if n < 10:
            return Op("edit", (f"line {n}", f"LINE {n}"))
        return Op("shell", "python3 check.py") if n == 10 else Op("say")

    s = await session(agent, upstream, make_proxy, tmp_path, work, script)
    assert s.returncode == 0
    assert FINAL in s.final
    assert len(s.bodies) == 12
    assert (work / "app.txt").read_text() == "".join(f"LINE {i}\n" for i in range(10))
    assert "10 passed, 0 failed" in last_result_of(agent, s.bodies[-1])
    assert_untouched(s)


def last_result_of(agent: str, body: dict[str, Any]) -> str:
    return last_claude_result(body) if agent == "claude_code" else last_codex_result(body)


@pytest.mark.parametrize("agent", AGENTS)
async def test_twenty_polls_of_a_running_command_then_its_output_are_left_alone(
    agent: str, upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path, work: Path
) -> None:
    """A command left running, twenty waits on it (each result: still running, no output), then
    its output: no reminder, no withheld result, no stop, not a byte changed."""
    output: list[str] = []

    def script(n: int, last: str) -> Op:
        if n == 0:
            return Op("start", WAITER)
        if n == 1 and agent == "claude_code":
            found = re.search(r"Output is being written to: (\S+\.output)", last)
            output.append(found.group(1) if found else "")
        if n <= 20:
            return Op("poll")
        if n == 21:
            (work / "go").touch()  # the command finishes now; Codex's poll gets its output
            return Op("poll")
        if n == 22 and agent == "claude_code":  # after one more wait, the output file
            return Op("read", output[0])
        return Op("say")

    s = await session(agent, upstream, make_proxy, tmp_path, work, script, timeout=240)
    assert s.returncode == 0
    assert FINAL in s.final
    # the output in request 22 (Codex: the 21st poll) or 23 (Claude Code: the Read after a 21st
    # wait), then the final text; Claude Code may send one more request after it, when it notices
    # that the background command has finished
    at = 22 if agent == "codex" else 23
    assert len(s.bodies) in ((24, 25) if agent == "claude_code" else (23,))
    results = [last_result_of(agent, b) for b in s.bodies[2:22]]
    if agent == "codex":
        assert all("Process running with session ID" in r and r.endswith("Output:\n") for r in results), (
            results
        )
    else:
        assert results == ["still running"] * 20
    assert "finished" in last_result_of(agent, s.bodies[at])
    assert_untouched(s)
