"""The real Claude Code through loopguard to a scripted fake Messages server: Claude Code
runs headless (:mod:`tests.helpers.claude_code`), a TCP tap between Claude Code and loopguard keeps the
bytes it sent and got, the fake (:mod:`tests.helpers.fake_messages`) keeps what reached it; some runs go
straight to the fake, to pin what Claude Code does on its own. Skipped with an install hint when
the pinned Claude Code is not installed (``.ci/run`` installs it).

Wire shapes of Claude Code's requests, calls and results: see :mod:`tests.helpers.claude_code`."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import ProxyFactory
from tests.helpers.claude_code import (
    API_KEY,
    AUTH_TOKEN,
    CLAUDE_VERSION,
    FAKE_TOKEN,
    ClaudeRun,
    find_claude,
    run_claude,
    version_of,
)
from tests.helpers.fake_messages import Block, FakeMessages, text, thinking, tool_use
from tests.helpers.fakes import FakeUpstream
from tests.helpers.tcp_tap import Tap, http_messages, tap

PROMPT = "Show me app.txt."
FINAL = "All done: app.txt says hello."
#: The looping command: one line appended to runs.log per run (how many times Claude Code really
#: ran it), the same output every time.
LOOP_CMD = "echo run >> runs.log; cat app.txt"
#: The fake gives up after this many tool calls (a hard stop when nothing ends the loop).
LIMIT = 30
#: Claude Code's own "system" message after every 5 tool steps without text.
NUDGE = (
    "The user hasn't heard from you in a while. As you continue, keep them updated when there's "
    "something to tell \u2014 a finding, a change of plan."
)
#: The headers Claude Code sends that loopguard must pass on untouched (and never log).
PASSED_HEADERS = (
    b"authorization",
    b"x-api-key",
    b"anthropic-version",
    b"anthropic-beta",
    b"x-app",
    b"user-agent",
)


@pytest.fixture
def claude() -> str:
    return find_claude()


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """The work directory: an ``app.txt`` for the model's calls to read."""
    path = tmp_path / "work"
    path.mkdir()
    (path / "app.txt").write_text("hello app\n")
    return path


def root_of(url: str) -> str:
    """``http://h:p/v1`` → ``http://h:p`` (Claude Code appends ``/v1/messages`` itself)."""
    return url.removesuffix("/v1")


def not_main_loop(body: dict[str, Any]) -> bool:
    """A request without tools (a title or summary request) is not a step of the agent's loop."""
    return "tools" not in body


def side_answer(body: dict[str, Any]) -> list[Block]:
    return [text("A title")]


async def stats_of(base: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(f"{base}/loop-guard") as r:
        return await r.json()


def runs(workdir: Path) -> int:
    log = workdir / "runs.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def blocks_of(body: dict[str, Any], role: str, kind: str) -> list[dict[str, Any]]:
    return [
        b
        for m in body["messages"]
        if m["role"] == role and isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == kind
    ]


def results(body: dict[str, Any]) -> list[dict[str, Any]]:
    return blocks_of(body, "user", "tool_result")


def reminders(body: dict[str, Any]) -> list[str]:
    """The ``[loopguard]`` texts of user messages' ``text`` blocks (the reminders loopguard adds)."""
    return [b["text"] for b in blocks_of(body, "user", "text") if b["text"].startswith("[loopguard]")]


def roles(body: dict[str, Any]) -> list[str]:
    return [m["role"] for m in body["messages"]]


def undo_edits(got: dict[str, Any], sent: dict[str, Any]) -> dict[str, Any]:
    """``got`` (what reached the model) without loopguard's reminder blocks, its withheld results'
    contents put back from ``sent`` (what the agent sent), for comparing the two."""
    out = json.loads(json.dumps(got))
    originals = {r["tool_use_id"]: r["content"] for r in results(sent)}
    for m in out["messages"]:
        if m["role"] != "user" or not isinstance(m["content"], list):
            continue
        m["content"] = [
            b for b in m["content"] if not (b.get("type") == "text" and b["text"].startswith("[loopguard]"))
        ]
        for b in m["content"]:
            if b.get("type") == "tool_result" and str(b["content"]).startswith("[loopguard]"):
                b["content"] = originals[b["tool_use_id"]]
    return out


def looping_fake(call: dict[str, Any], limit: int = LIMIT) -> FakeMessages:
    """A model that repeats one tool call (``{"name": …, "input": …}``) until request ``limit``,
    which it answers with a text."""

    def script(n: int, body: dict[str, Any]) -> list[Block]:
        return [tool_use(call["name"], call["input"])] if n < limit else [text("Giving up.")]

    return FakeMessages(script, side=(not_main_loop, side_answer))


def bash(command: str) -> dict[str, Any]:
    return {"name": "Bash", "input": {"command": command, "description": "Show app.txt"}}


def read_call(work: Path) -> dict[str, Any]:
    return {"name": "Read", "input": {"file_path": str(work / "app.txt")}}


async def direct_session(
    claude: str, upstream: FakeUpstream, tmp_path: Path, work: Path, fake: FakeMessages, **kw: Any
) -> ClaudeRun:
    """One ``claude -p`` straight to ``fake`` (no loopguard)."""
    upstream.handler = fake.handle
    return await run_claude(claude, root_of(upstream.url), PROMPT, work, tmp_path / "home", **kw)


async def proxied_session(
    claude: str,
    upstream: FakeUpstream,
    make_proxy: ProxyFactory,
    tmp_path: Path,
    work: Path,
    fake: FakeMessages,
    config: dict[str, Any] | None = None,
    prompt: str = PROMPT,
    auth: str = AUTH_TOKEN,
) -> tuple[ClaudeRun, Tap, dict[str, Any]]:
    """One ``claude -p`` through a tap and a fresh loopguard to ``fake``: (run, tap, stats)."""
    upstream.handler = fake.handle
    base = await make_proxy(config)
    async with tap(int(base.rsplit(":", 1)[1])) as t:
        run = await run_claude(
            claude, f"http://127.0.0.1:{t.port}", prompt, work, tmp_path / "home", auth=auth
        )
    return run, t, await stats_of(base)


def exchanges(t: Tap) -> list[tuple[bytes, bytes]]:
    """(request body, response body) of every HTTP exchange that passed the tap."""
    return [
        (req, resp)
        for c in t.connections
        for (_, req), (_, resp) in zip(
            http_messages(bytes(c.sent)), http_messages(bytes(c.received)), strict=True
        )
    ]


def head_fields(head: bytes) -> dict[bytes, bytes]:
    fields = {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        fields[name.strip().lower()] = value.strip()
    return fields


# --- Claude Code on its own ---------------------------------------------------------------------------


def test_the_pinned_version_is_the_one_found(claude: str) -> None:
    assert version_of(claude) == CLAUDE_VERSION


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace to see the connections")
async def test_claude_code_opens_loopback_connections_only(
    claude: str, upstream: FakeUpstream, tmp_path: Path, work: Path
) -> None:
    """With the harness's environment, every ``connect()`` of Claude Code and its children goes
    to the fake's port on 127.0.0.1 (no DNS, no other host)."""
    fake = FakeMessages(lambda n, body: [text(FINAL)])
    trace = tmp_path / "connect.trace"
    run = await direct_session(
        claude,
        upstream,
        tmp_path,
        work,
        fake,
        prefix=("strace", "-f", "-qq", "-e", "trace=connect", "-o", str(trace)),
    )
    assert run.returncode == 0, run.stderr
    assert run.result()["result"] == FINAL
    port = upstream.url.rsplit(":", 1)[1].removesuffix("/v1")
    targets = re.findall(r"connect\(\d+, \{(sa_family=[^}]*)\}", trace.read_text())
    assert targets, trace.read_text()
    assert set(targets) == {f'sa_family=AF_INET, sin_port=htons({port}), sin_addr=inet_addr("127.0.0.1")'}


@pytest.mark.parametrize("tool", ["Bash", "Read"])
async def test_without_loopguard_every_repeated_call_runs(
    claude: str, upstream: FakeUpstream, tmp_path: Path, work: Path, tool: str
) -> None:
    """What a new user saw: a model that repeats one call 30 times, straight to the
    server: Claude Code runs all 30 (it has no loop breaker), sends 31 requests and ends with the
    model's text; every result is the same bytes; no side requests at all."""
    call = (
        bash(LOOP_CMD) if tool == "Bash" else {"name": "Read", "input": {"file_path": str(work / "app.txt")}}
    )
    fake = looping_fake(call)
    run = await direct_session(claude, upstream, tmp_path, work, fake)
    assert run.returncode == 0, run.stderr
    assert (run.result()["result"], run.result()["num_turns"]) == ("Giving up.", LIMIT + 1)
    assert len(fake.bodies) == LIMIT + 1
    assert [(r.method, r.path_qs) for r in fake.requests] == [("POST", "/v1/messages?beta=true")] * (
        LIMIT + 1
    )
    assert fake.side_bodies == []
    assert runs(work) == (LIMIT if tool == "Bash" else 0)

    last = fake.bodies[-1]
    got = results(last)
    assert len(got) == LIMIT
    want = {"content": "hello app", "is_error": False} if tool == "Bash" else {"content": "1\thello app\n2\t"}
    assert all({k: v for k, v in r.items() if k in ("content", "is_error")} == want for r in got)
    # Claude Code's own "system" messages: the environment at [1], then a nudge after steps 5, 10, 15
    system = [i for i, m in enumerate(last["messages"]) if m["role"] == "system"]
    assert system == [1, 12, 23, 34]
    assert all(last["messages"][i]["content"] == NUDGE for i in system[1:])
    assert not reminders(last)


# --- through loopguard: a session without a loop ------------------------------------------------------


#: Each way of giving the key: the header it becomes (and the one that is absent).
AUTH_HEADERS = {
    AUTH_TOKEN: (b"authorization", b"Bearer " + FAKE_TOKEN.encode(), b"x-api-key"),
    API_KEY: (b"x-api-key", FAKE_TOKEN.encode(), b"authorization"),
}


@pytest.mark.parametrize("auth", [AUTH_TOKEN, API_KEY])
async def test_plain_session_reaches_the_model_byte_identical(
    claude: str, upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path, work: Path, auth: str
) -> None:
    """Thinking, text and Bash, then Read, then a text: every byte Claude Code sent reaches the
    fake, every byte the fake answered reaches Claude Code; the headers pass untouched (the key as
    ``Authorization`` or ``x-api-key``); the wire shapes of :mod:`tests.helpers.claude_code`'s docstring
    (the answer's blocks come back as they were sent, the thinking block's signature too)."""

    def script(n: int, body: dict[str, Any]) -> list[Block]:
        if n == 0:
            greet = tool_use("Bash", {"command": "echo run >> runs.log; echo hello", "description": "Greet"})
            return [thinking("The user wants a greeting first."), text("Let me greet."), greet]
        if n == 1:
            return [tool_use("Read", {"file_path": str(work / "app.txt")})]
        return [text(FINAL)]

    fake = FakeMessages(script, side=(not_main_loop, side_answer))
    run, t, stats = await proxied_session(claude, upstream, make_proxy, tmp_path, work, fake, auth=auth)
    assert run.returncode == 0, run.stderr
    assert run.result()["result"] == FINAL
    assert runs(work) == 1

    sent = t.requests()
    assert [h.split(b" ")[:2] for h, _ in sent] == [[b"POST", b"/v1/messages?beta=true"]] * 3
    assert [r.path_qs for r in upstream.requests] == ["/v1/messages?beta=true"] * 3
    # what Claude Code sent (the tap's bytes) is what the model server got, byte for byte, both ways
    assert [body for _, body in sent] == [r.body for r in upstream.requests]
    assert [body for _, body in t.responses()] == fake.answers
    for (head, _), got in zip(sent, upstream.requests, strict=True):
        fields, lower = head_fields(head), {k.lower().encode(): v.encode() for k, v in got.headers.items()}
        assert {h: lower.get(h) for h in PASSED_HEADERS} == {h: fields.get(h) for h in PASSED_HEADERS}
    key_header, key_value, absent = AUTH_HEADERS[auth]
    assert (fields[key_header], fields.get(absent)) == (key_value, None)
    assert fields[b"anthropic-version"] == b"2023-06-01"
    assert fields[b"anthropic-beta"].startswith(b"claude-code-20250219,")
    assert (stats["rewritten_requests"], stats["stops"], stats["internal_errors"]) == (0, 0, 0)

    # the wire shapes (tests.helpers.claude_code's docstring)
    first, second, third = fake.bodies
    assert list(first) == [
        "model",
        "messages",
        "system",
        "tools",
        "metadata",
        "max_tokens",
        "thinking",
        "context_management",
        "output_config",
        "stream",
    ]
    assert (first["model"], first["stream"], first["max_tokens"]) == ("claude-opus-5-5", True, 128000)
    assert [b["type"] for b in first["system"]] == ["text"] * 3
    ephemeral = {"type": "ephemeral"}
    assert [b.get("cache_control") for b in first["system"]] == [None, ephemeral, ephemeral]
    assert {"Bash", "Read"} <= {tool["name"] for tool in first["tools"]}
    assert roles(first) == ["user", "system"]
    assert [b["type"] for b in first["messages"][0]["content"]] == ["text", "text"]
    assert first["messages"][0]["content"][1]["text"] == PROMPT
    assert set(first["messages"][1]) == {"role", "content", "output_config"}
    # the cache breakpoint: on the newest block only; the system message's one block becomes a string
    assert first["messages"][1]["content"][0]["cache_control"] == ephemeral
    assert isinstance(third["messages"][1]["content"], str)
    assert roles(third) == ["user", "system", "assistant", "user", "assistant", "user"]
    # the calls come back exactly as the fake sent them
    call = third["messages"][2]["content"]
    assert [call, third["messages"][4]["content"]] == fake.step_blocks[:2]
    assert [b["type"] for b in call] == ["thinking", "text", "tool_use"]
    bash_result, read_result = (m["content"] for m in third["messages"][3::2])
    assert bash_result == [
        {"tool_use_id": call[2]["id"], "type": "tool_result", "content": "hello", "is_error": False}
    ]
    assert read_result == [
        {
            "tool_use_id": third["messages"][4]["content"][0]["id"],
            "type": "tool_result",
            "content": "1\thello app\n2\t",
            "cache_control": ephemeral,
        }
    ]
    assert "cache_control" not in json.dumps(second["messages"][:-1])
    assert third["system"] == first["system"] and third["tools"] == first["tools"]


async def test_count_tokens_requests_pass_untouched(
    claude: str, upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path, work: Path
) -> None:
    """Claude Code's side requests: ``claude -p /context`` sends 25 ``count_tokens`` requests and
    no ``/messages`` one; each reaches the fake byte for byte, each answer Claude Code."""
    fake = FakeMessages(lambda n, body: [text(FINAL)])
    run, t, stats = await proxied_session(
        claude, upstream, make_proxy, tmp_path, work, fake, prompt="/context"
    )
    assert run.returncode == 0, run.stderr
    assert run.result()["result"].startswith("## Context Usage")
    sent = t.requests()
    assert [h.split(b" ")[:2] for h, _ in sent] == [[b"POST", b"/v1/messages/count_tokens?beta=true"]] * 25
    # sent over several connections at once: each (request, answer) pair the same at both ends
    assert sorted(exchanges(t)) == sorted(
        (r.body, a) for r, a in zip(fake.requests, fake.answers, strict=True)
    )
    assert fake.bodies == []
    assert all(set(json.loads(body)) == {"model", "messages", "tools"} for _, body in sent)
    assert b"token-counting-2024-11-01" in head_fields(sent[0][0])[b"anthropic-beta"]
    assert (stats["rewritten_requests"], stats["stops"], stats["internal_errors"]) == (0, 0, 0)


# --- through loopguard: a looping session -------------------------------------------------------------


async def test_looping_session_gets_reminders_and_withheld_results(
    claude: str, upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path, work: Path
) -> None:
    """Claude Code repeats one Bash command; with the default config, loopguard's reminders (a
    ``text`` block after the step's ``tool_result`` blocks) and a withheld result (the
    ``tool_result`` content replaced by the denial text) reach the model in Claude Code's own
    requests, from the 4th request on; none of it is in what Claude Code sent."""
    fake = looping_fake(bash(LOOP_CMD))
    run, t, stats = await proxied_session(claude, upstream, make_proxy, tmp_path, work, fake)
    bodies = fake.bodies
    assert run.returncode == 0, run.stderr
    assert len(bodies) >= 7
    seventh = bodies[6]

    # reminders from the 4th request on (after three identical calls), kept in every later request
    assert [len(reminders(b)) for b in bodies[:7]] == [0, 0, 0, 1, 1, 2, 2]
    first, second = reminders(seventh)
    assert first.startswith("[loopguard] You have made the same tool call several times in a row.")
    assert second.startswith("[loopguard] You are repeating the same tool call without making progress.")
    assert "- tool: Bash\n- consecutive_calls: 5\n" in second
    # the reminder is the last block of the user message carrying the step's results
    fourth = bodies[3]["messages"][-1]
    assert [b["type"] for b in fourth["content"]] == ["tool_result", "text"]
    # the 6th request ends with Claude Code's own nudge (a "system" message after the 5th step):
    # the reminder goes into the results' message before it, and it is a fresh one all the same
    results_message, nudge = bodies[5]["messages"][-2:]
    assert (results_message["role"], nudge["role"]) == ("user", "system")
    assert [b["type"] for b in results_message["content"]] == ["tool_result", "text"]
    assert results_message["content"][1]["text"] == second
    # a withheld result in the 7th: the newest result's content is the denial text, is_error kept
    *_, newest = results(seventh)
    assert isinstance(newest["content"], str) and newest["content"].startswith(
        "[loopguard] The result of this call is withheld:"
    ), newest
    assert "Bash" in newest["content"] and newest["is_error"] is False

    # none of it is in what Claude Code sent: the edits are loopguard's alone, and undoing them
    # gives what Claude Code sent (its system messages, cache_control and all)
    sent = [json.loads(body) for _, body in t.requests()]
    assert len(sent) == len(bodies)
    assert [undo_edits(b, s) for b, s in zip(bodies, sent, strict=True)] == sent
    assert not any(reminders(b) for b in sent)
    assert all(r["content"] == "hello app" for b in sent for r in results(b))
    # each action counted once, in the request it first appeared in (as for Codex)
    assert (stats["reminders_injected"], stats["results_withheld"], stats["stops"]) == (2, 1, 1)
    assert stats["per_rule"] == {"escalation": 1, "repeat_reminder": 2, "stop": 1}
    # Claude Code ran the command every time the model asked, withheld result or not
    assert runs(work) == len(bodies) - 1


@pytest.mark.parametrize("tool", ["Bash", "Read"])
async def test_looping_session_ends_with_loopguards_stop(
    claude: str, upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path, work: Path, tool: str
) -> None:
    """The response side for ``/messages``: the 7th request's answer (the same call again) becomes
    loopguard's stop text (one ``text`` block, ``end_turn``); Claude Code prints it as the result
    and exits 0 on its own, without running that call: 7 requests, 6 runs, 1 stop. The same for
    a ``Read`` of one file (its results are the same bytes every time too)."""
    fake = looping_fake(read_call(work) if tool == "Read" else bash(LOOP_CMD))
    run, _, stats = await proxied_session(claude, upstream, make_proxy, tmp_path, work, fake)
    assert run.returncode == 0, run.stderr
    result = run.result()
    want = f"[loopguard] Stopped: the model kept calling {tool}"
    assert result["result"].startswith(want), result["result"]
    assert (result["is_error"], result["stop_reason"]) == (False, "end_turn")
    assert (len(fake.bodies), stats["stops"]) == (7, 1)
    assert len(results(fake.bodies[-1])) == 6
    assert runs(work) == (6 if tool == "Bash" else 0)


# --- answers cut at the token limit -------------------------------------------------------------------

#: Claude Code's message after an answer that ended at ``max_tokens``: a new user message (a string).
TOKEN_LIMIT_NOTE = (
    "<system-reminder>\nOutput token limit hit. Resume directly \u2014 no apology, no recap of what you "
    "were doing. Pick up mid-thought if that is where the cut happened. Break remaining work into "
    "smaller pieces.\n</system-reminder>"
)
TOKEN_LIMIT_ERROR = (
    "API Error: Claude's response exceeded the 128000 output token maximum. To configure this "
    "behavior, set the CLAUDE_CODE_MAX_OUTPUT_TOKENS environment variable."
)
#: A text that ends in one span repeated (loopguard's degenerate-text rule: 10+ copies, 200+ chars).
DEGENERATE = "Reading the file now. " + "The app says hello. " * 40


def user_notes(body: dict[str, Any]) -> list[str]:
    """The texts of the user messages after the prompt (Claude Code's own notes)."""
    return [
        m["content"] if isinstance(m["content"], str) else m["content"][0]["text"]
        for m in body["messages"][2:]
        if m["role"] == "user" and not results({"messages": [m]})
    ]


async def test_claude_code_retries_an_answer_cut_at_max_tokens_three_times(
    claude: str, upstream: FakeUpstream, tmp_path: Path, work: Path
) -> None:
    """What Claude Code does with ``stop_reason: "max_tokens"`` (what loopguard's degenerate-text
    cut sends), straight to the server: it asks again with a user message of its own, three times,
    then gives up with an API error (exit 1)."""
    fake = FakeMessages(lambda n, body: [text("Partial answer")], stop_reason=lambda n: "max_tokens")
    run = await direct_session(claude, upstream, tmp_path, work, fake)
    assert run.returncode == 1, run.stderr
    result = run.result()
    assert (result["result"], result["is_error"]) == (TOKEN_LIMIT_ERROR, True)
    assert len(fake.bodies) == 4
    assert [len(user_notes(b)) for b in fake.bodies] == [0, 1, 2, 3]
    assert set(user_notes(fake.bodies[-1])) == {TOKEN_LIMIT_NOTE}
    assert roles(fake.bodies[-1]) == ["user", "system"] + ["assistant", "user"] * 3


async def test_degenerate_text_cut_reaches_claude_code_as_max_tokens(
    claude: str, upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path, work: Path
) -> None:
    """A model that streams degenerate text every time, through loopguard: each answer is cut
    (``max_tokens``), Claude Code asks again three times as it does for a real token limit, then
    exits 1 with its API error; every answer it got ends with ``message_stop``."""
    fake = FakeMessages(lambda n, body: [text(DEGENERATE)])
    run, t, stats = await proxied_session(claude, upstream, make_proxy, tmp_path, work, fake)
    assert run.returncode == 1, run.stderr
    assert (run.result()["result"], run.result()["is_error"]) == (TOKEN_LIMIT_ERROR, True)
    assert len(fake.bodies) == 4
    assert set(user_notes(fake.bodies[-1])) == {TOKEN_LIMIT_NOTE}
    answers = [body for _, body in t.responses()]
    assert len(answers) == 4
    assert all(a.endswith(b'event: message_stop\ndata: {"type":"message_stop"}\n\n') for a in answers), (
        answers
    )
    assert all(b'"stop_reason":"max_tokens"' in a for a in answers)
    assert (stats["responses_cut"], stats["per_rule"].get("degenerate_text")) == (4, 4)


# --- an answer with too many identical calls ----------------------------------------------------------


def runaway_fake() -> FakeMessages:
    """A model whose first answer calls the same Bash command 3 times at once, then says it is done."""

    def script(n: int, body: dict[str, Any]) -> list[Block]:
        if n == 0:
            return [tool_use("Bash", {"command": LOOP_CMD, "description": "Show app.txt"}) for _ in range(3)]
        return [text(FINAL)]

    return FakeMessages(script)


async def test_without_loopguard_claude_code_runs_every_identical_parallel_call(
    claude: str, upstream: FakeUpstream, tmp_path: Path, work: Path
) -> None:
    fake = runaway_fake()
    run = await direct_session(claude, upstream, tmp_path, work, fake)
    assert run.returncode == 0, run.stderr
    assert (run.result()["result"], runs(work), len(fake.bodies)) == (FINAL, 3, 2)
    assert len(results(fake.bodies[1])) == 3


async def test_runaway_answer_is_cut_to_two_identical_calls(
    claude: str, upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path, work: Path
) -> None:
    """The runaway cut (``max_identical_per_response``: 2): Claude Code gets the first two of the
    three identical calls (``stop_reason: "tool_use"``), runs those two and sends their results."""
    fake = runaway_fake()
    run, t, stats = await proxied_session(claude, upstream, make_proxy, tmp_path, work, fake)
    assert run.returncode == 0, run.stderr
    assert (run.result()["result"], runs(work), len(fake.bodies)) == (FINAL, 2, 2)
    calls = [b for b in fake.bodies[1]["messages"][-2]["content"] if b["type"] == "tool_use"]
    assert [c["id"] for c in calls] == [b["id"] for b in fake.step_blocks[0][:2]]
    assert sorted(r["tool_use_id"] for r in results(fake.bodies[1])) == sorted(c["id"] for c in calls)
    first_answer = t.responses()[0][1]
    assert b'"stop_reason":"tool_use"' in first_answer
    assert (stats["responses_cut"], stats["per_rule"].get("runaway")) == (1, 1)


async def test_identical_parallel_reads_are_not_cut(
    claude: str, upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path, work: Path
) -> None:
    """Four identical ``Read`` calls in one answer (as a redacted real session has them) change
    nothing: Claude Code gets and runs all four and sends four results; nothing is cut."""

    def script(n: int, body: dict[str, Any]) -> list[Block]:
        if n == 0:
            return [tool_use("Read", {"file_path": str(work / "app.txt")}) for _ in range(4)]
        return [text(FINAL)]

    fake = FakeMessages(script)
    run, t, stats = await proxied_session(claude, upstream, make_proxy, tmp_path, work, fake)
    assert run.returncode == 0, run.stderr
    assert (run.result()["result"], len(fake.bodies)) == (FINAL, 2)
    calls = [b for b in fake.bodies[1]["messages"][-2]["content"] if b["type"] == "tool_use"]
    assert [c["id"] for c in calls] == [b["id"] for b in fake.step_blocks[0]]
    assert len(results(fake.bodies[1])) == 4
    assert b'"stop_reason":"tool_use"' in t.responses()[0][1]
    assert (stats["responses_cut"], stats["per_rule"].get("runaway")) == (0, None)


async def test_twenty_identical_parallel_reads_are_cut_to_four(
    claude: str, upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path, work: Path
) -> None:
    """Twenty identical ``Read`` calls in one answer are a model repeating itself, not parallel
    work (``max_identical_reads_per_response``: 4): Claude Code gets the first four
    (``stop_reason: "tool_use"``), runs them and sends four results."""

    def script(n: int, body: dict[str, Any]) -> list[Block]:
        if n == 0:
            return [tool_use("Read", {"file_path": str(work / "app.txt")}) for _ in range(20)]
        return [text(FINAL)]

    fake = FakeMessages(script)
    run, t, stats = await proxied_session(claude, upstream, make_proxy, tmp_path, work, fake)
    assert run.returncode == 0, run.stderr
    assert (run.result()["result"], len(fake.bodies)) == (FINAL, 2)
    calls = [b for b in fake.bodies[1]["messages"][-2]["content"] if b["type"] == "tool_use"]
    assert [c["id"] for c in calls] == [b["id"] for b in fake.step_blocks[0][:4]]
    assert sorted(r["tool_use_id"] for r in results(fake.bodies[1])) == sorted(c["id"] for c in calls)
    assert b'"stop_reason":"tool_use"' in t.responses()[0][1]
    assert (stats["responses_cut"], stats["per_rule"].get("runaway")) == (1, 1)


async def test_deliver_error_makes_claude_p_exit_1_with_the_stop_text(
    claude: str, upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path, work: Path
) -> None:
    """``stop.deliver: error``: the 7th answer becomes an HTTP 400 (``invalid_request_error``,
    code ``loop_detected``). Claude Code sends a request that got a 400 three times, then the turn
    once more with a note added, three times (it does the same with any 400 straight from a
    server): 6 requests, each stopped the same way, one incident; it prints ``API Error: 400
    [loopguard] Stopped: …`` as an error result and exits 1. The stopped call never ran."""
    fake = looping_fake(bash(LOOP_CMD))
    run, _, stats = await proxied_session(
        claude, upstream, make_proxy, tmp_path, work, fake, config={"stop": {"deliver": "error"}}
    )
    assert run.returncode == 1, run.stderr
    result = run.result()
    want = "API Error: 400 [loopguard] Stopped: the model kept calling Bash after 2 reminders"
    assert result["result"].startswith(want), result["result"]
    assert (result["is_error"], result["api_error_status"]) == (True, 400)
    assert [len(b["messages"]) for b in fake.bodies[6:]] == [15, 15, 15, 16, 16, 16]
    assert (runs(work), stats["stops"]) == (6, 6)
    assert [i["kind"] for i in stats["incidents"]] == ["stop"]  # one, however often it is retried
