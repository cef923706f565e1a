"""The real mini-swe-agent 2.x (``mini``, from PyPI: :mod:`tests.helpers.py_agents`) through loopguard to
a scripted fake model, in its three wire modes: tool calls on Chat Completions (``litellm``, the
default), tool calls on the Responses API (``--model-class litellm_response``) and text actions
(``mini_textbased.yaml`` and ``--model-class litellm_textbased``: one
```` ```mswea_bash_command ```` block per answer, results as user messages
``<returncode>…</returncode>\\n<output>…</output>``).

Run: ``mini -y --exit-immediately -t <task> -m openai/fake-model -c <mode's config> -c
model.model_kwargs.api_base=<loopguard>/v1 -c model.cost_tracking=ignore_errors -o <traj>``,
``MSWEA_CONFIGURED`` set (no first-run setup prompt), no stdin.

What mini does with loopguard's stop (an answer without a tool call / action): it is a format
error. mini keeps no assistant message for it, adds the user message ``Tool call error:\\n\\n
<error>\\nNo tool calls found in the response. …`` (text mode: ``Format error:\\n\\n<error>…``)
and asks again; after ``max_consecutive_format_errors`` (3) in a row it exits on its own with
``RepeatedFormatError``. The stop holds through those replies (:mod:`proxy.core.harness_replies`), and
loopguard appends its reason to each (:mod:`proxy.guards.stop_note`): the one place in mini's
history the model reads after a stop. The stop text itself is in the trajectory (``-o``), in the
format-error message's ``extra.response``; mini's console prints the format-error replies.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from tests.conftest import ProxyFactory
from tests.helpers.fake_responses import FakeResponses, function_call, message
from tests.helpers.fakes import FakeUpstream, completion, tool_call
from tests.helpers.py_agents import MINI, AgentRun, base_env, run_agent
from tests.helpers.tcp_tap import tap

LOOP_CMD = "echo run >> runs.log; cat app.txt 2>/dev/null || echo 'app.txt: not found'"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
#: The fake gives up after this many requests (a hard stop when nothing ends the loop).
LIMIT = 30
#: A healthy run: two different reads, a successful edit, a passing command, then submit.
HEALTHY = [
    "echo run >> runs.log; cat app.txt",
    "echo run >> runs.log; ls -la",
    "echo run >> runs.log; sed -i 's/hello/goodbye/' app.txt",
    "echo run >> runs.log; grep -q goodbye app.txt && echo ok",
    SUBMIT,
]
MODES = ("chat", "responses", "text")


@pytest.fixture
def mini() -> str:
    return MINI.find()


def say(n: int) -> str:
    """The answer's text: new every time (a model repeating its text too is the monologue
    rule's, stopped earlier; these tests are about the repeated call)."""
    return f"Attempt {n + 1}: I will run a command."


def fence(n: int, cmd: str) -> str:
    return f"{say(n)}\n\n```mswea_bash_command\n{cmd}\n```"


class ChatFake:
    """A Chat Completions model whose answer to request ``n`` is ``script(n)``: a command (as a
    ``bash`` tool call, or in text mode a fenced action) or None for a text answer."""

    def __init__(self, script: Any, text_mode: bool) -> None:
        self.script = script
        self.text_mode = text_mode
        self.bodies: list[dict[str, Any]] = []
        self.answers: list[bytes] = []

    async def handle(self, request: web.Request, body: bytes) -> web.StreamResponse:
        req = orjson.loads(body)
        n = len(self.bodies)
        self.bodies.append(req)
        cmd = self.script(n)
        if cmd is None:
            answer = completion(content="Giving up.")
        elif self.text_mode:
            answer = completion(content=fence(n, cmd))
        else:
            answer = completion([tool_call("bash", json.dumps({"command": cmd}), f"call_{n}")], say(n))
        raw = orjson.dumps(answer)
        self.answers.append(raw)
        assert not req.get("stream"), "mini asks without streaming"
        return web.Response(body=raw, content_type="application/json")


def responses_fake(script: Any) -> FakeResponses:
    def items(n: int, body: dict[str, Any]) -> list[dict[str, Any]]:
        cmd = script(n)
        if cmd is None:
            return [message("Giving up.")]
        return [message(say(n)), function_call("bash", json.dumps({"command": cmd}))]

    return FakeResponses(items)


def looping(n: int) -> str | None:
    return LOOP_CMD if n < LIMIT else None


def healthy(n: int) -> str | None:
    return HEALTHY[n] if n < len(HEALTHY) else None


def config_args(mode: str, api_base: str) -> list[str]:
    spec = "mini_textbased.yaml" if mode == "text" else "mini.yaml"
    args = ["-c", spec, "-c", f"model.model_kwargs.api_base={api_base}"]
    args += ["-c", "model.cost_tracking=ignore_errors"]
    if mode != "chat":
        args += ["--model-class", "litellm_response" if mode == "responses" else "litellm_textbased"]
    return args


async def mini_session(
    mini: str,
    mode: str,
    script: Any,
    upstream: FakeUpstream,
    make_proxy: ProxyFactory,
    tmp_path: Path,
) -> tuple[AgentRun, Any, Any, dict[str, Any], dict[str, Any]]:
    """One ``mini`` run through a tap and a fresh loopguard: (run, fake, tap, stats, trajectory)."""
    fake: Any = responses_fake(script) if mode == "responses" else ChatFake(script, mode == "text")
    upstream.handler = fake.handle
    base = await make_proxy()
    work = tmp_path / "work"
    work.mkdir()
    (work / "app.txt").write_text("hello\n")
    traj = tmp_path / "traj.json"
    env = base_env(tmp_path / "home")
    env |= {"MSWEA_CONFIGURED": "true", "MSWEA_SILENT_STARTUP": "1"}
    env["MSWEA_GLOBAL_CONFIG_DIR"] = str(tmp_path / "cfg")
    async with tap(int(base.rsplit(":", 1)[1])) as t:
        argv = [mini, "-y", "--exit-immediately", "-t", "Print app.txt.", "-m", "openai/fake-model"]
        argv += [*config_args(mode, f"http://127.0.0.1:{t.port}/v1"), "-o", str(traj)]
        run = await run_agent(argv, work, env, timeout=180)
    async with aiohttp.ClientSession() as s, s.get(f"{base}/loop-guard") as r:
        stats = await r.json()
    return run, fake, t, stats, json.loads(traj.read_text()) if traj.exists() else {}


def runs(tmp_path: Path) -> int:
    log = tmp_path / "work" / "runs.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def user_texts(body: dict[str, Any]) -> list[str]:
    """The user messages' texts of a Chat or Responses request."""
    out = []
    for m in body.get("messages", body.get("input", [])):
        if isinstance(m, dict) and m.get("role") == "user":
            c = m.get("content")
            if isinstance(c, list):
                c = "\n".join(p.get("text", "") for p in c if isinstance(p, dict))
            out.append(c if isinstance(c, str) else "")
    return out


@pytest.mark.parametrize("mode", MODES)
async def test_looping_mini_ends_on_its_own_after_loopguards_stop(
    mini: str, mode: str, upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """The model repeats one command: loopguard stops the 7th answer, the stop holds through
    mini's three format-error replies, mini exits on its own (``RepeatedFormatError``) having run
    the command 6 times; each reply reached the model with loopguard's reason appended."""
    run, fake, _, stats, traj = await mini_session(mini, mode, looping, upstream, make_proxy, tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert traj["info"]["exit_status"] == "RepeatedFormatError"
    assert (runs(tmp_path), len(fake.bodies), stats["stops"]) == (6, 9, 3)
    header = "Format error:" if mode == "text" else "Tool call error:"
    tool = "mswea_bash_command" if mode == "text" else "bash"
    last = user_texts(fake.bodies[-1])
    replies = [u for u in last if u.startswith(header)]
    assert len(replies) == 2
    for r in replies:
        assert f"[loopguard] Stopped: the model kept calling {tool} without getting anywhere (1 withheld" in r
    # what the user finds: mini's console shows its format-error replies; the trajectory keeps
    # the stopped answers, loopguard's stop text in each
    assert run.stdout.count(header) == 3
    responses = [m["extra"]["response"] for m in traj["messages"] if m.get("extra", {}).get("response")]
    assert f"[loopguard] Stopped: the model kept calling {tool}" in json.dumps(responses[-1])


@pytest.mark.parametrize("mode", MODES)
async def test_healthy_mini_run_is_untouched(
    mini: str, mode: str, upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """Different reads, a successful edit, a passing command, submit: no action, and what mini
    sent reached the model byte for byte both ways."""
    run, fake, t, stats, traj = await mini_session(mini, mode, healthy, upstream, make_proxy, tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert traj["info"]["exit_status"] == "Submitted"
    assert (tmp_path / "work" / "app.txt").read_text() == "goodbye\n"
    assert (runs(tmp_path), len(fake.bodies)) == (4, 5)
    assert [body for _, body in t.requests()] == [r.body for r in upstream.requests]
    assert [body for _, body in t.responses()] == fake.answers
    assert (stats["rewritten_requests"], stats["stops"]) == (0, 0)
