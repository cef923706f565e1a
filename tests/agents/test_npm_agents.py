"""pi, Cline CLI, Continue CLI and opencode, each installed from npm and run headless and
unmodified (:mod:`tests.helpers.npm_agents`) through a TCP tap and the real loopguard server to a
scripted fake model (:mod:`tests.helpers.wire_script`) on each wire format the agent speaks. Skipped
with an install hint when the pinned version is not installed (``.ci/run`` installs them).

- the exact-repeat loop: the model asks for the same read of the agent's own read tool 20
  times; the loop must end with the agent exiting on its own by its 8th call, loopguard's stop
  text printed where the agent prints answers (Cline's own detector ends it first, at the 5th
  identical call; a cycle of two reads, which it does not see, is ended by loopguard's stop);
- a healthy run: two different reads, a successful edit, a passing command, an answer: no
  action, and every byte the agent sent reached the fake and every byte the fake answered
  reached the agent.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import ProxyFactory
from tests.helpers import npm_agents
from tests.helpers.agent_cli import CliRun
from tests.helpers.fakes import FakeUpstream
from tests.helpers.tcp_tap import Tap, tap
from tests.helpers.wire_script import Call, ScriptedModel, reminders, results

PROMPT = "Read a.txt and tell me what it says."
A_TEXT = "hello from a\n"
B_TEXT = "hello from b\n"
FINAL = "All done: a.txt now says bye."
STOP = "[loopguard] Stopped: the model kept calling "
#: loopguard's stop after an ignored withheld result, as the agent prints it.
STOP_TEXT = (
    STOP + "{tool} after 2 reminders and a withheld result that said it was not getting anywhere, so"
    " loopguard ended its turn here; that last call was not run. Send a message to continue."
)
#: Cline's own user message answering a text-only answer in --yolo mode.
CLINE_YOLO_REPLY = (
    "[SYSTEM] This run is not complete until you call one of these terminal completion tools:"
    " submit_and_exit."
)
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

Runner = Callable[[str, str, str, str, Path, Path], Awaitable[CliRun]]


@dataclass(frozen=True)
class Agent:
    """One agent CLI: how to find and run it, and its own read / edit / shell tools."""

    name: str
    find: Callable[[], str]
    run: Runner
    read: Callable[[Path], Call]
    #: (path, old line, new line, wire) → the edit call
    edit: Callable[[Path, str, str, str], Call]
    shell: Callable[[str], Call]


async def _opencode(binary: str, base: str, wire: str, prompt: str, work: Path, home: Path) -> CliRun:
    assert wire == "chat"
    return await npm_agents.run_opencode(binary, base, prompt, work, home)


def cline_edit(path: Path, old: str, new: str, wire: str) -> Call:
    """Cline's edit: ``editor`` on Chat Completions; on Responses (the ``openai-native``
    provider) it offers ``apply_patch`` (a patch in Codex's grammar) instead."""
    if wire == "responses":
        patch = f"*** Begin Patch\n*** Update File: {path}\n@@\n-{old}\n+{new}\n*** End Patch"
        return Call("apply_patch", {"input": patch})
    return Call("editor", {"path": str(path), "old_text": old, "new_text": new})


AGENTS = {
    "pi": Agent(
        "pi",
        npm_agents.find_pi,
        npm_agents.run_pi,
        lambda p: Call("read", {"path": str(p)}),
        lambda p, old, new, wire: Call("edit", {"path": str(p), "edits": [{"oldText": old, "newText": new}]}),
        lambda cmd: Call("bash", {"command": cmd}),
    ),
    "cline": Agent(
        "cline",
        npm_agents.find_cline,
        npm_agents.run_cline,
        lambda p: Call("read_files", {"files": [{"path": str(p)}]}),
        cline_edit,
        lambda cmd: Call("run_commands", {"commands": [cmd]}),
    ),
    "continue": Agent(
        "continue",
        npm_agents.find_continue,
        npm_agents.run_continue,
        lambda p: Call("Read", {"filepath": str(p)}),
        lambda p, old, new, wire: Call("Edit", {"file_path": str(p), "old_string": old, "new_string": new}),
        lambda cmd: Call("Bash", {"command": cmd}),
    ),
    "opencode": Agent(
        "opencode",
        npm_agents.find_opencode,
        _opencode,
        lambda p: Call("read", {"filePath": str(p)}),
        lambda p, old, new, wire: Call("edit", {"filePath": str(p), "oldString": old, "newString": new}),
        lambda cmd: Call("bash", {"command": cmd}),
    ),
}

#: Every (agent, wire format) tested.
VARIANTS = [
    ("pi", "chat"),
    ("pi", "responses"),
    ("pi", "messages"),
    ("cline", "chat"),
    ("cline", "responses"),
    ("continue", "chat"),
    ("continue", "messages"),
    ("opencode", "chat"),
]


@dataclass
class Session:
    run: CliRun
    tap: Tap
    stats: dict[str, Any]
    model: ScriptedModel

    @property
    def output(self) -> str:
        return ANSI.sub("", self.run.stdout)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    w = tmp_path / "work"
    w.mkdir()
    (w / "a.txt").write_text(A_TEXT)
    (w / "b.txt").write_text(B_TEXT)
    return w


async def session(
    agent: Agent,
    wire: str,
    upstream: FakeUpstream,
    make_proxy: ProxyFactory,
    work: Path,
    home: Path,
    model: ScriptedModel,
    config: dict[str, Any] | None = None,
) -> Session:
    """One run of ``agent`` on ``wire`` in ``work`` through a tap and a fresh loopguard to ``model``."""
    binary = agent.find()
    upstream.handler = model.handle
    base = await make_proxy(config)
    async with tap(int(base.rsplit(":", 1)[1])) as t:
        run = await agent.run(binary, f"http://127.0.0.1:{t.port}/v1", wire, PROMPT, work, home)
    async with aiohttp.ClientSession() as s, s.get(f"{base}/loop-guard") as r:
        stats = await r.json()
    assert model.errors == [], model.errors
    return Session(run, t, stats, model)


def counts(s: Session) -> tuple[int, int, int, int]:
    """(reminders, withheld results, stops, rewritten requests) loopguard counted."""
    return (
        s.stats.get("reminders_injected", 0),
        s.stats.get("results_withheld", 0),
        s.stats.get("stops", 0),
        s.stats.get("rewritten_requests", 0),
    )


@pytest.mark.parametrize(("name", "wire"), VARIANTS)
async def test_healthy_run_is_untouched_byte_for_byte(
    name: str, wire: str, upstream: FakeUpstream, make_proxy: ProxyFactory, work: Path, tmp_path: Path
) -> None:
    """Two different reads, a successful edit, a passing command, then an answer: the agent runs
    all four calls and prints the answer; loopguard takes no action, and what the agent sent is
    what the fake got, what the fake answered is what the agent got, byte for byte."""
    agent = AGENTS[name]
    a, b = work / "a.txt", work / "b.txt"
    steps = [
        agent.read(a),
        agent.read(b),
        agent.edit(a, "hello from a", "bye from a", wire),
        agent.shell(f"cat {a}"),
    ]
    model = ScriptedModel(wire, steps, final=FINAL)
    s = await session(agent, wire, upstream, make_proxy, work, tmp_path / "home", model)
    assert s.run.returncode == 0, (s.run.stdout, s.run.stderr)
    assert FINAL in s.output
    assert a.read_text() == "bye from a\n"
    assert len(model.bodies) == 5
    got = results(model.bodies[-1])
    assert len(got) == 4
    assert "hello from a" in got[0] and "hello from b" in got[1] and "bye from a" in got[3]
    assert reminders(model.bodies[-1]) == []
    assert counts(s) == (0, 0, 0, 0)
    assert [body for _, body in s.tap.requests()] == [r.body for r in upstream.requests]
    assert [body for _, body in s.tap.responses()] == model.answers()


#: Exact-repeat loop, per variant: (script requests, calls run = results the agent sent back,
#: exit code, (reminders, withheld, stops, rewritten requests)). With a stop, the last request's
#: answer is loopguard's stop; Cline's own detector aborts its 5th identical call first.
REPEAT = {
    ("pi", "chat"): (7, 6, 0, (2, 1, 1, 4)),
    ("pi", "responses"): (7, 6, 0, (2, 1, 1, 4)),
    ("pi", "messages"): (7, 6, 0, (2, 1, 1, 4)),
    ("cline", "chat"): (5, 4, 0, (1, 0, 0, 2)),
    ("cline", "responses"): (5, 4, 0, (1, 0, 0, 2)),
    ("continue", "chat"): (7, 6, 0, (2, 1, 1, 4)),
    ("continue", "messages"): (7, 6, 0, (2, 1, 1, 4)),
    ("opencode", "chat"): (7, 6, 0, (2, 1, 1, 4)),
}


@pytest.mark.parametrize(("name", "wire"), VARIANTS)
async def test_exact_repeat_loop_ends_by_the_8th_call(
    name: str, wire: str, upstream: FakeUpstream, make_proxy: ProxyFactory, work: Path, tmp_path: Path
) -> None:
    """The same read 20 times: the agent exits on its own by its 8th call, with loopguard's stop
    as the answer it prints (or, for Cline, its own detector first)."""
    agent = AGENTS[name]
    model = ScriptedModel(wire, [agent.read(work / "a.txt")] * 20)
    s = await session(agent, wire, upstream, make_proxy, work, tmp_path / "home", model)
    requests, ran, code, actions = REPEAT[(name, wire)]
    got = results(model.bodies[-1])
    print(name, wire, len(model.bodies), len(got), s.run.returncode, counts(s))
    assert (len(model.bodies), len(got), s.run.returncode) == (requests, ran, code), s.run.stderr[-2000:]
    assert counts(s) == actions
    assert reminders(model.bodies[-1])[0].startswith(
        "[loopguard] You have made the same tool call several times in a row."
    )
    if actions[2]:
        assert STOP_TEXT.format(tool=agent.read(work).name) in s.output
    else:
        assert STOP not in s.output and "[abort]" in s.output


@pytest.mark.parametrize("wire", ["chat", "responses"])
async def test_cline_cycle_is_ended_by_loopguards_stop(
    wire: str, upstream: FakeUpstream, make_proxy: ProxyFactory, work: Path, tmp_path: Path
) -> None:
    """Reads of a.txt and b.txt in turn, which Cline's own detector (identical calls only) does
    not see: cycle and recurrence reminders, one withheld result, then loopguard's stop as the
    8th answer, which Cline prints and exits 0 on: 7 calls ran."""
    agent = AGENTS["cline"]
    model = ScriptedModel(wire, [agent.read(work / ("a.txt", "b.txt")[n % 2]) for n in range(30)])
    s = await session(agent, wire, upstream, make_proxy, work, tmp_path / "home", model)
    assert (len(model.bodies), len(results(model.bodies[-1])), s.run.returncode) == (8, 7, 0)
    assert counts(s) == (3, 1, 1, 3)
    assert STOP_TEXT.format(tool="read_files") in s.output


async def test_cline_yolo_answers_the_stop_and_runs_on(
    upstream: FakeUpstream, make_proxy: ProxyFactory, work: Path, tmp_path: Path
) -> None:
    """What Cline does with a stop in ``--yolo`` mode (pinned as it is today, not as it should
    be): it answers every text-only answer with its own user message "[SYSTEM] This run is not
    complete until you call one of these terminal completion tools: submit_and_exit. …"; loopguard
    reads that as a new turn, so the stop does not hold, the cycle's next calls run, and the run
    never ends on its own (killed here after 20 s)."""
    agent = AGENTS["cline"]
    model = ScriptedModel("chat", [agent.read(work / ("a.txt", "b.txt")[n % 2]) for n in range(30)])
    upstream.handler = model.handle
    base = await make_proxy(None)
    run = await npm_agents.run_cline(
        agent.find(), f"{base}/v1", "chat", PROMPT, work, tmp_path / "home", timeout=20, yolo=True
    )
    assert run.returncode is None  # killed: the output it buffered is lost
    # every request's history (Cline trims a long one, and the script runs out into "Giving up."
    # answers that it keeps answering: the stop need not be in the last request any more)
    echoed = [str(m.get("content")) for b in model.bodies for m in b["messages"] if m["role"] == "assistant"]
    assert any(STOP_TEXT.format(tool="read_files") in text for text in echoed)
    after_stop = next(
        m["content"]
        for b in model.bodies
        for i, m in enumerate(b["messages"])
        if m["role"] == "user" and i > 0 and STOP in str(b["messages"][i - 1].get("content"))
    )
    assert after_stop.startswith(CLINE_YOLO_REPLY)
    assert max(len(results(b)) for b in model.bodies) > 7  # calls after the stop ran
