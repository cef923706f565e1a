"""The real Codex CLI through loopguard to a scripted fake Responses server: Codex runs
headless (:mod:`tests.helpers.codex_cli`), a TCP tap between Codex and loopguard keeps the bytes Codex
sent and got, the fake (:mod:`tests.helpers.fake_responses`) keeps what reached it. Skipped with an
install hint when the pinned Codex is not installed (``.ci/run`` installs it).

Wire shapes of Codex's calls and results: see :mod:`tests.helpers.codex_cli`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.core.progress import same_text
from proxy.core.volatile import DEFAULT_MASKS
from tests.conftest import ProxyFactory
from tests.helpers.codex_cli import OUTPUT_WRAPPER, CodexRun, find_codex, run_codex
from tests.helpers.fake_responses import FakeResponses, function_call, message, reasoning
from tests.helpers.fakes import FakeUpstream
from tests.helpers.tcp_tap import tap

FINAL = "All done: the greeting was printed."
#: The looping command: one line appended to runs.log per run (how many times Codex really ran
#: it), the same output every time.
LOOP_CMD = "echo run >> runs.log; cat app.txt 2>/dev/null || echo 'app.txt: not found'"
#: The fake gives up after this many requests (a hard stop when nothing ends the loop).
LIMIT = 30
#: Progress masks with Codex's chunk id added (the default list does not cover it).


@pytest.fixture
def codex() -> str:
    return find_codex()


async def stats_of(base: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(f"{base}/loop-guard") as r:
        return await r.json()


def items_of_type(body: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [i for i in body["input"] if isinstance(i, dict) and i.get("type") == kind]


def reminders(body: dict[str, Any]) -> list[str]:
    """The ``[loopguard]`` texts of user message items (the reminders loopguard inserts)."""
    return [
        p["text"]
        for m in items_of_type(body, "message")
        if m.get("role") == "user" and isinstance(m.get("content"), list)
        for p in m["content"]
        if p.get("type") == "input_text" and p.get("text", "").startswith("[loopguard]")
    ]


def outputs(body: dict[str, Any]) -> list[str]:
    return [o["output"] for o in items_of_type(body, "function_call_output")]


def runs(workdir: Path) -> int:
    log = workdir / "runs.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


async def codex_session(
    codex: str,
    upstream: FakeUpstream,
    make_proxy: ProxyFactory,
    tmp_path: Path,
    fake: FakeResponses,
    config: dict[str, Any] | None = None,
    prompt: str = "Print a greeting.",
) -> tuple[CodexRun, Any, dict[str, Any]]:
    """One ``codex exec`` through a tap and a fresh loopguard to ``fake``: (run, tap, stats)."""
    upstream.handler = fake.handle
    base = await make_proxy(config)
    work = tmp_path / "work"
    work.mkdir()
    async with tap(int(base.rsplit(":", 1)[1])) as t:
        run = await run_codex(codex, f"http://127.0.0.1:{t.port}/v1", prompt, work, tmp_path / "home")
    return run, t, await stats_of(base)


def fake_outputs(fake: FakeResponses, n: int) -> list[dict[str, Any]]:
    """The output items of the fake's answer to request ``n`` (from its response.completed)."""
    completed = fake.answers[n].rsplit(b"event: response.completed\ndata: ", 1)[1]
    return json.loads(completed)["response"]["output"]


def looping_fake(limit: int = LIMIT) -> FakeResponses:
    """A model that repeats the same ``exec_command`` call (after a reasoning item), until
    request ``limit``, which it answers with a text message."""

    def script(n: int, body: dict[str, Any]) -> list[dict[str, Any]]:
        if n >= limit:
            return [message("Giving up.")]
        return [reasoning(), function_call("exec_command", json.dumps({"cmd": LOOP_CMD}))]

    return FakeResponses(script)


# --- a session that does not loop ------------------------------------------------------------------


async def test_plain_session_reaches_the_model_byte_identical(
    codex: str, upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    def script(n: int, body: dict[str, Any]) -> list[dict[str, Any]]:
        if n == 0:
            return [function_call("exec_command", json.dumps({"cmd": "echo run >> runs.log; echo hello"}))]
        return [message(FINAL)]

    fake = FakeResponses(script)
    run, t, stats = await codex_session(codex, upstream, make_proxy, tmp_path, fake)
    assert run.returncode == 0, run.stderr
    assert FINAL in run.stdout
    assert runs(tmp_path / "work") == 1

    sent = t.requests()
    assert [h.split(b" ")[:2] for h, _ in sent] == [[b"POST", b"/v1/responses"]] * 2
    # what Codex sent (the tap's bytes) is what the model server got, byte for byte, both ways
    assert [body for _, body in sent] == [r.body for r in upstream.requests]
    assert [body for _, body in t.responses()] == fake.answers
    assert (stats["guarded_requests"], stats["rewritten_requests"], stats["stops"]) == (2, 0, 0)

    # the wire shapes (tests.helpers.codex_cli's docstring): the call echoed back, the wrapped output
    first, second = fake.bodies
    assert first["stream"] is True and first["store"] is False and "instructions" not in first
    assert "exec_command" in [tool.get("name") for tool in first["tools"]]
    call, out = second["input"][-2:]
    assert call == next(i for i in fake_outputs(fake, 0) if i["type"] == "function_call")
    assert (out["type"], out["call_id"], out["id"][:4]) == ("function_call_output", call["call_id"], "fco_")
    m = OUTPUT_WRAPPER.fullmatch(out["output"])
    assert m and (m["code"], m["output"]) == ("0", "hello\n"), out["output"]


# --- a looping session --------------------------------------------------------------------------------


def test_codex_outputs_of_the_same_command_are_the_same_result_after_the_default_masks() -> None:
    """Two real outputs of the same command (Codex 0.171.0) differ in the chunk id and the wall
    time; the default masks (proxy/core/volatile.py) make them the same result, and still tell a
    different output apart. The same for a command still running (its session id)."""
    tail = "Process exited with code 0\nOriginal token count: 2\nOutput:\nmissing\n"
    a = f"Chunk ID: d4a3e6\nWall time: 0.0000 seconds\n{tail}"
    b = f"Chunk ID: e8bd7c\nWall time: 0.0012 seconds\n{tail}"
    c = b.replace("missing", "present")
    assert a != b
    assert same_text(a, b, DEFAULT_MASKS)
    assert not same_text(a, c, DEFAULT_MASKS)
    running = "Chunk ID: {}\nWall time: 10.0 seconds\nProcess running with session ID {}\nOutput:\n"
    assert same_text(running.format("0a1b2c", 50343), running.format("ffe012", 71002), DEFAULT_MASKS)


async def test_looping_session_gets_reminders_and_withheld_outputs(
    codex: str, upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """Codex repeats one command; with the default config, loopguard's reminders (user message
    items) and a withheld output reach the model in Codex's own requests (the first 7 requests:
    the same with and without the response-side stop, which ends the session at the 7th answer;
    without it Codex goes on to the fake's limit, withheld outputs and all)."""
    fake = looping_fake()
    run, t, stats = await codex_session(codex, upstream, make_proxy, tmp_path, fake)
    bodies = fake.bodies
    assert run.returncode == 0, run.stderr
    assert len(bodies) >= 7
    seventh = bodies[6]

    # the results Codex sent look the same to loopguard, not to a plain compare
    raw = outputs(seventh)[:5]
    assert all(OUTPUT_WRAPPER.fullmatch(o) for o in raw)
    assert len(set(raw)) == 5
    assert all(same_text(raw[0], o, DEFAULT_MASKS) for o in raw)

    # reminders: user message items with an input_text part, from the 4th request on (after three
    # identical calls), kept in place in every later request
    assert [len(reminders(b)) for b in bodies[:7]] == [0, 0, 0, 1, 1, 2, 2]
    first, second = reminders(seventh)
    assert first.startswith("[loopguard] You have made the same tool call several times in a row.")
    assert second.startswith("[loopguard] You are repeating the same tool call without making progress.")
    assert "- tool: exec_command\n- consecutive_calls: 5\n" in second
    # a withheld output in the 7th: the newest result is the denial text instead of the wrapper
    *_, newest = outputs(seventh)
    assert newest.startswith("[loopguard] The result of this call is withheld:"), newest
    assert "exec_command" in newest

    # none of it is in what Codex sent: the edits are loopguard's alone
    sent = [json.loads(body) for _, body in t.requests()]
    assert len(sent) == len(bodies)
    assert not any(reminders(b) for b in sent)
    assert all(OUTPUT_WRAPPER.fullmatch(o) for b in sent for o in outputs(b))
    assert stats["reminders_injected"] >= 2 and stats["results_withheld"] >= 1

    # Codex ran the command every time the model asked, withheld result or not (the last answer,
    # the fake's text or loopguard's stop, asked for none)
    assert runs(tmp_path / "work") == len(bodies) - 1


async def test_looping_session_ends_with_loopguards_stop(
    codex: str, upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """The response side for ``/responses``: the 7th request's answer (the same call again) is
    turned into loopguard's stop text; Codex shows it as the final message and exits 0 on its
    own, without running that call."""
    fake = looping_fake()
    run, _, stats = await codex_session(codex, upstream, make_proxy, tmp_path, fake)
    assert run.returncode == 0, run.stderr
    assert "[loopguard] Stopped: the model kept calling exec_command" in run.stdout
    assert (len(fake.bodies), runs(tmp_path / "work"), stats["stops"]) == (7, 6, 1)


async def test_deliver_error_makes_codex_exec_exit_1_with_the_stop_text_and_no_retry(
    codex: str, upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """``stop.deliver: error``: the 7th answer becomes an HTTP 400 with code ``loop_detected``;
    ``codex exec`` exits 1 at once, prints the error body (the stop text in it) on stderr after
    ``ERROR:``, and sent that request once (no retry): 7 requests, 6 runs, 1 stop, 1 incident."""
    fake = looping_fake()
    run, _, stats = await codex_session(
        codex, upstream, make_proxy, tmp_path, fake, config={"stop": {"deliver": "error"}}
    )
    assert run.returncode == 1, run.stderr
    want = 'ERROR: {"error":{"message":"[loopguard] Stopped: the model kept calling exec_command after 2'
    assert want in run.stderr, run.stderr
    assert '"code":"loop_detected"' in run.stderr
    assert "[loopguard] Stopped" not in run.stdout
    assert (len(fake.bodies), runs(tmp_path / "work"), stats["stops"]) == (7, 6, 1)
    assert [i["kind"] for i in stats["incidents"]] == ["stop"]
