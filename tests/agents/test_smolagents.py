"""The real smolagents (``smolagents[openai]`` from PyPI, :mod:`tests.helpers.py_agents`) through loopguard
to a scripted fake Chat Completions model: the ``smolagent`` CLI's ``ToolCallingAgent`` with its
own ``python_interpreter`` tool (the loop), and a ``ToolCallingAgent`` with file and shell tools
(``tests/helpers/smolagents_tools.py``: the healthy run).

What smolagents 1.26 sends (``OpenAIModel``, ``stream: true``, ``tool_choice: "required"``,
``stop: ["Observation:", "Calling tools:"]``): structured calls come back in every answer, but the
history is text: each step's calls as an assistant message ``\\nCalling tools:\\n[{'id': …,
'type': 'function', 'function': {'name': 'python_interpreter', 'arguments': {'code': …}}}]`` (a
Python repr) and the results as a user message ``Observation:\\n…``; loopguard reads them as calls
and results (:mod:`proxy.dialects.text_actions`). After loopguard's stop (a text answer),
smolagents keeps the text as an assistant message (its console streams it), and answers
``Error:\\nError while parsing tool call from model output: …`` (a harness reply: the stop holds);
it goes on to its ``max_steps`` (20) and asks for a final answer without tools, then exits.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import ProxyFactory
from tests.helpers.fakes import FakeUpstream, scripted_model, tool_call
from tests.helpers.py_agents import SMOLAGENTS, AgentRun, base_env, run_agent
from tests.helpers.tcp_tap import tap

DRIVER = Path(__file__).resolve().parents[1] / "helpers" / "smolagents_tools.py"
LOOP_CODE = "print(sum(range(10)))"
#: smolagents' own step limit (``max_steps``, 20): the looping fake is never told to stop.
MAX_STEPS = 20


@pytest.fixture
def smolagent() -> str:
    return SMOLAGENTS.find()


async def session(
    argv: list[str], upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path, handler: Any
) -> tuple[AgentRun, Any, dict[str, Any]]:
    upstream.handler = handler
    base = await make_proxy()
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("hello\n")
    (work / "b.txt").write_text("world\n")
    async with tap(int(base.rsplit(":", 1)[1])) as t:
        api = f"http://127.0.0.1:{t.port}/v1"
        run = await run_agent([a.replace("{api}", api) for a in argv], work, base_env(tmp_path / "home"))
    async with aiohttp.ClientSession() as s, s.get(f"{base}/loop-guard") as r:
        stats = await r.json()
    return run, t, stats


def observations(body: dict[str, Any]) -> int:
    """The tool results smolagents sent back: its ``Observation:`` user messages."""
    return sum(
        1
        for m in body["messages"]
        if m["role"] == "user" and any(p.get("text", "").startswith("Observation:") for p in m["content"])
    )


async def test_looping_smolagent_cli_is_stopped_and_exits_on_its_own(
    smolagent: str, upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """The model repeats one ``python_interpreter`` call: smolagents runs it 6 times, loopguard
    stops every later answer (its text on smolagents' console), smolagents gives up at its step
    limit and exits 0 on its own."""
    handler = scripted_model(
        lambda n: [tool_call("python_interpreter", json.dumps({"code": LOOP_CODE}), f"call_{n}")]
    )
    argv = [smolagent, "Add up 0..9.", "--model-type", "OpenAIModel", "--action-type", "tool_calling"]
    argv += [
        "--model-id",
        "fake-model",
        "--api-base",
        "{api}",
        "--api-key",
        "sk-x",
        "--tools",
        "python_interpreter",
    ]
    run, t, stats = await session(argv, upstream, make_proxy, tmp_path, handler)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    sent = [json.loads(body) for _, body in t.requests()]
    # every step's request plus the final-answer request at the step limit
    assert len(sent) == MAX_STEPS + 1
    assert observations(sent[-1]) == 6
    assert stats["stops"] == MAX_STEPS + 1 - 6
    assert "[loopguard] Stopped: the model kept calling python_interpreter" in run.stdout
    # smolagents' console streams each stopped answer, then its own parse error
    assert run.stdout.count("[loopguard] Stopped: the model kept calling python_interpreter") == MAX_STEPS - 6
    assert "Reached max steps." in run.stdout


async def test_healthy_tool_calling_agent_is_untouched(
    smolagent: str, upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """Two different reads, a successful edit, a passing command, the final answer: no action,
    and every byte both ways as sent."""
    script = [
        ("read_file", {"path": "a.txt"}),
        ("read_file", {"path": "b.txt"}),
        ("replace_in_file", {"path": "a.txt", "old": "hello", "new": "goodbye"}),
        ("run_command", {"command": "grep -q goodbye a.txt && echo ok"}),
        ("final_answer", {"answer": "a.txt now says goodbye"}),
    ]
    handler = scripted_model(
        lambda n: [tool_call(*(lambda s: (s[0], json.dumps(s[1])))(script[min(n, 4)]), f"c{n}")]
    )
    python = str(Path(smolagent).parent / "python")
    run, t, stats = await session(
        [python, str(DRIVER), "{api}", "Change hello to goodbye in a.txt."],
        upstream,
        make_proxy,
        tmp_path,
        handler,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.stdout.rstrip().endswith("FINAL: a.txt now says goodbye")
    assert (tmp_path / "work" / "a.txt").read_text() == "goodbye\n"
    sent = t.requests()
    assert len(sent) == 5
    assert observations(json.loads(sent[-1][1])) == 4
    assert [body for _, body in sent] == [r.body for r in upstream.requests]
    assert (stats["rewritten_requests"], stats["stops"], stats["reminders_injected"]) == (0, 0, 0)
