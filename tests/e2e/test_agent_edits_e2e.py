"""Edits as Claude Code (Anthropic Messages) and Codex (OpenAI Responses) make them, through the
real server with the shipped defaults, JSON and SSE (DESIGN §2.2, :mod:`proxy.core.agents`):

- ten different successful edits of one file, each answered with the tool's constant success
  line, then a passing test run: every request reaches the upstream byte for byte, every answer
  reaches the agent byte for byte, no action at all;
- an edit whose old text is never found, retried with drifting old text (each error echoes it,
  so no two errors are equal): reminded after the 3rd and the 5th, the 6th result withheld, the
  7th answer stopped.

Codex's patches come two ways: its ``apply_patch`` custom tool, and ``exec_command {"cmd":
"apply_patch <<'EOF' … EOF"}``, which Codex intercepts and applies itself (the only way the pinned
Codex CLI edits for a custom model provider); both are one edit of the patch's file, so both get
the same actions at the same calls.

The agent here is a plain loop that posts the bytes itself (so that "byte for byte" is checked on
both sides) and runs each call as the real agent answers it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.guards.escalation import WITHHOLD_TEXT
from proxy.guards.same_target import FAILED_TEXT
from proxy.response.decide import ESCALATION_TEXT
from tests.conftest import ProxyFactory
from tests.helpers.fake_messages import FakeMessages, text, tool_use
from tests.helpers.fake_responses import FakeResponses, custom_call, function_call, message
from tests.helpers.fakes import FakeUpstream
from tests.helpers.sdk_agent import snapshot

FILE = "/repo/src/app.py"
CC_TOOLS = [
    {"name": n, "input_schema": {"type": "object"}}
    for n in ("Bash", "Edit", "Glob", "Grep", "Read", "TodoWrite", "Write")
]
CODEX_TOOLS = [
    {"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {"cmd": {}}}},
    {
        "type": "function",
        "name": "write_stdin",
        "parameters": {"type": "object", "properties": {"chars": {}}},
    },
    {"type": "custom", "name": "apply_patch"},
    {"type": "function", "name": "update_plan", "parameters": {"type": "object", "properties": {"plan": {}}}},
]
CC_EDITED = f"The file {FILE} has been updated successfully."
CODEX_PATCHED = (
    f"Exit code: 0\nWall time: 0 seconds\nOutput:\nSuccess. Updated the following files:\nM {FILE}\n"
)
TESTS_PASS = "10 passed in 0.12s"
#: What Codex 0.171 answers an exec_command that ran a patch: its exec wrapper around the patch
#: tool's answer (a failed patch is the patch tool's line alone).
CODEX_SHELL_PATCHED = f"Wall time: 0.0000 seconds\nOutput:\n{CODEX_PATCHED}"


def cc_not_found(old: str) -> str:
    return f"<tool_use_error>String to replace not found in file.\nString: {old}</tool_use_error>"


def codex_not_found(old: str) -> str:
    return f"apply_patch verification failed: Failed to find expected lines in {FILE}:\n{old}"


def patch(old: str, new: str) -> str:
    return f"*** Begin Patch\n*** Update File: {FILE}\n@@\n-{old}\n+{new}\n*** End Patch\n"


# --- reading what the agent got -------------------------------------------------------------------


def sse_data(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for frame in raw.decode().split("\n\n"):
        for line in frame.split("\n"):
            if line.startswith("data: "):
                out.append(orjson.loads(line[6:]))
    return out


def messages_content(raw: bytes, stream: bool) -> list[dict[str, Any]]:
    """The content blocks of a Messages answer (JSON, or SSE events put together)."""
    if not stream:
        return list(orjson.loads(raw)["content"])
    blocks: list[dict[str, Any]] = []
    partial: list[str] = []
    for event in sse_data(raw):
        if event["type"] == "content_block_start":
            blocks.append(dict(event["content_block"]))
            partial.append("")
        elif event["type"] == "content_block_delta":
            delta = event["delta"]
            if delta["type"] == "text_delta":
                blocks[-1]["text"] = blocks[-1].get("text", "") + delta["text"]
            elif delta["type"] == "input_json_delta":
                partial[-1] += delta["partial_json"]
    for block, args in zip(blocks, partial, strict=True):
        if block["type"] == "tool_use" and args:
            block["input"] = orjson.loads(args)
    return blocks


def responses_output(raw: bytes, stream: bool) -> list[dict[str, Any]]:
    """The output items of a Responses answer (JSON, or the ``response.completed`` event's)."""
    if not stream:
        return list(orjson.loads(raw)["output"])
    (done,) = [e for e in sse_data(raw) if e["type"] == "response.completed"]
    return list(done["response"]["output"])


# --- the two agents -------------------------------------------------------------------------------

Run = Callable[[dict[str, Any]], tuple[str, bool]]


async def claude_code(
    base: str, stream: bool, run: Run, max_steps: int = 14
) -> tuple[list[bytes], list[bytes], list[dict[str, Any]]]:
    """Claude Code's loop on ``/v1/messages``: (bodies sent, answers got, final history)."""
    history: list[dict[str, Any]] = [{"role": "user", "content": "Fix the handler in src/app.py."}]
    sent: list[bytes] = []
    got: list[bytes] = []
    async with aiohttp.ClientSession() as s:
        for _ in range(max_steps):
            body = orjson.dumps(
                {
                    "model": "claude-sonnet-4-6",
                    "max_tokens": 4096,
                    "stream": stream,
                    "tools": CC_TOOLS,
                    "messages": history,
                }
            )
            async with s.post(
                f"{base}/v1/messages", data=body, headers={"content-type": "application/json"}
            ) as r:
                raw = await r.read()
            sent.append(body)
            got.append(raw)
            blocks = messages_content(raw, stream)
            history.append({"role": "assistant", "content": blocks})
            calls = [b for b in blocks if b["type"] == "tool_use"]
            if not calls:
                break
            results = []
            for call in calls:
                output, failed = run(call)
                result: dict[str, Any] = {"type": "tool_result", "tool_use_id": call["id"], "content": output}
                if failed:
                    result["is_error"] = True
                results.append(result)
            history.append({"role": "user", "content": results})
    return sent, got, history


async def codex(
    base: str, stream: bool, run: Run, max_steps: int = 14
) -> tuple[list[bytes], list[bytes], list[dict[str, Any]]]:
    """Codex's loop on ``/v1/responses`` (``store: false``, the whole history in ``input``)."""
    history: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the handler."}]}
    ]
    sent: list[bytes] = []
    got: list[bytes] = []
    async with aiohttp.ClientSession() as s:
        for _ in range(max_steps):
            body = orjson.dumps(
                {
                    "model": "gpt-5.4",
                    "instructions": "You are Codex.",
                    "tools": CODEX_TOOLS,
                    "store": False,
                    "stream": stream,
                    "input": history,
                }
            )
            async with s.post(
                f"{base}/v1/responses", data=body, headers={"content-type": "application/json"}
            ) as r:
                raw = await r.read()
            sent.append(body)
            got.append(raw)
            output = responses_output(raw, stream)
            history.extend(output)
            calls = [i for i in output if i["type"] in ("function_call", "custom_tool_call")]
            if not calls:
                break
            for call in calls:
                out, _ = run(call)
                kind = (
                    "custom_tool_call_output"
                    if call["type"] == "custom_tool_call"
                    else "function_call_output"
                )
                history.append({"type": kind, "call_id": call["call_id"], "output": out})
    return sent, got, history


# --- ten successful edits, then the tests pass: untouched ----------------------------------------


def cc_edits_then_tests(n: int, body: dict[str, Any]) -> list[dict[str, Any]]:
    if n < 10:
        return [
            tool_use(
                "Edit",
                {
                    "file_path": FILE,
                    "old_string": f"value = {n}",
                    "new_string": f"value = {n + 1}",
                    "replace_all": False,
                },
            )
        ]
    if n == 10:
        return [tool_use("Bash", {"command": "pytest -q", "description": "Run the tests"})]
    return [text("All 10 tests pass.")]


def cc_run(call: dict[str, Any]) -> tuple[str, bool]:
    if call["name"] == "Edit":
        old = call["input"]["old_string"]
        return (CC_EDITED, False) if old.startswith("value = ") else (cc_not_found(old), True)
    return TESTS_PASS, False


def codex_patch_call(old: str, new: str, via: str) -> dict[str, Any]:
    """Codex's call of a patch, by its ``apply_patch`` tool (``via="tool"``) or its shell."""
    if via == "tool":
        return custom_call("apply_patch", patch(old, new))
    cmd = f"apply_patch <<'EOF'\n{patch(old, new)}EOF\n"
    return function_call("exec_command", orjson.dumps({"cmd": cmd}).decode())


def codex_edits_then_tests(n: int, body: dict[str, Any], via: str = "tool") -> list[dict[str, Any]]:
    if n < 10:
        return [codex_patch_call(f"value = {n}", f"value = {n + 1}", via)]
    if n == 10:
        return [
            function_call("exec_command", orjson.dumps({"cmd": "pytest -q", "yield_time_ms": 10000}).decode())
        ]
    return [message("All 10 tests pass.")]


def codex_run(call: dict[str, Any]) -> tuple[str, bool]:
    text = call["input"] if call["name"] == "apply_patch" else orjson.loads(call["arguments"])["cmd"]
    if text.startswith(("*** Begin Patch", "apply_patch <<")):
        old = text.split("\n-", 1)[1].split("\n", 1)[0]
        if not old.startswith("value = "):
            return codex_not_found(old), True
        return (CODEX_PATCHED if call["name"] == "apply_patch" else CODEX_SHELL_PATCHED), False
    return f"Chunk ID: 4f2a\nWall time: 0.5 seconds\nProcess exited with code 0\nOutput:\n{TESTS_PASS}", False


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_claude_code_ten_successful_edits_of_one_file_then_tests_pass_untouched(
    upstream: FakeUpstream, make_proxy: ProxyFactory, stream: bool
) -> None:
    fake = FakeMessages(cc_edits_then_tests)
    upstream.handler = fake.handle
    base = await make_proxy()  # the shipped defaults
    sent, got, history = await claude_code(base, stream, cc_run)
    assert len(sent) == 12
    assert [r.body for r in upstream.requests] == sent
    assert got == fake.answers
    assert history[-1] == {"role": "assistant", "content": [{"type": "text", "text": "All 10 tests pass."}]}
    snap = await snapshot(base)
    assert (snap["per_rule"], snap["results_withheld"], snap["stops"]) == ({}, 0, 0)


@pytest.mark.parametrize("via", ["tool", "exec_command"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_codex_ten_successful_patches_of_one_file_then_tests_pass_untouched(
    upstream: FakeUpstream, make_proxy: ProxyFactory, stream: bool, via: str
) -> None:
    fake = FakeResponses(lambda n, body: codex_edits_then_tests(n, body, via))
    upstream.handler = fake.handle
    base = await make_proxy()
    sent, got, history = await codex(base, stream, codex_run)
    assert len(sent) == 12
    assert [r.body for r in upstream.requests] == sent
    assert got == fake.answers
    assert history[-1]["type"] == "message"
    snap = await snapshot(base)
    assert (snap["per_rule"], snap["results_withheld"], snap["stops"]) == ({}, 0, 0)


# --- an edit whose old text is never found, drifting: reminded, withheld, stopped -----------------


def cc_missing_text(n: int, body: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        tool_use(
            "Edit",
            {
                "file_path": FILE,
                "old_string": f"def handler{n}(request):",
                "new_string": "def handler(request):",
                "replace_all": False,
            },
        )
    ]


def codex_missing_text(n: int, body: dict[str, Any]) -> list[dict[str, Any]]:
    return [codex_patch_call(f"def handler{n}(request):", "def handler(request):", "tool")]


def codex_shell_missing_text(n: int, body: dict[str, Any]) -> list[dict[str, Any]]:
    return [codex_patch_call(f"def handler{n}(request):", "def handler(request):", "exec_command")]


def reminders_and_results(body: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The reminder texts and the tool results the upstream got, in order (either wire)."""
    reminders: list[str] = []
    results: list[str] = []
    if "messages" in body:
        for m in body["messages"]:
            if m["role"] == "user" and isinstance(m["content"], list):
                for b in m["content"]:
                    if b["type"] == "tool_result":
                        results.append(b["content"])
                    elif b["type"] == "text" and b["text"].startswith("[loopguard]"):
                        reminders.append(b["text"])
        return reminders, results
    for item in body["input"]:
        if item.get("type") in ("custom_tool_call_output", "function_call_output"):
            results.append(item["output"])
        elif item.get("role") == "user" and item["content"][0]["text"].startswith("[loopguard]"):
            reminders.append(item["content"][0]["text"])
    return reminders, results


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(
    ("agent", "script", "run", "fake_of", "tool", "called", "echo"),
    [
        pytest.param(
            claude_code, cc_missing_text, cc_run, FakeMessages, "Edit", "Edit", cc_not_found, id="claude_code"
        ),
        pytest.param(
            codex,
            codex_missing_text,
            codex_run,
            FakeResponses,
            "apply_patch",
            "apply_patch",
            codex_not_found,
            id="codex",
        ),
        pytest.param(
            codex,
            codex_shell_missing_text,
            codex_run,
            FakeResponses,
            "apply_patch",
            "exec_command",
            codex_not_found,
            id="codex_exec_command",
        ),
    ],
)
async def test_an_edit_whose_old_text_is_never_found_is_reminded_withheld_then_stopped(
    upstream: FakeUpstream,
    make_proxy: ProxyFactory,
    stream: bool,
    agent: Any,
    script: Any,
    run: Run,
    fake_of: Any,
    tool: str,
    called: str,
    echo: Callable[[str], str],
) -> None:
    """``tool`` is what the reminders say the calls were on, ``called`` the tool the model called
    (Codex's shell, for a patch run through it)."""
    fake = fake_of(script)
    upstream.handler = fake.handle
    base = await make_proxy()
    sent, _, history = await agent(base, stream, run)
    assert len(sent) == 7  # the 7th answer is the stop: its call never ran
    last = fake.bodies[6]
    reminders, results = reminders_and_results(last)
    assert [r.split(" times in a row")[0] for r in reminders] == [
        f"[loopguard] {tool} on {FILE} has now failed 3",
        f"[loopguard] You called {tool} on {FILE} 5",
    ]
    assert reminders[1].startswith(
        FAILED_TEXT.split("{subject}")[0]
        + f"{tool} on {FILE} 5 times in a row, with different arguments each "
        "time, and it failed the same way each time:\n"
    )
    assert results[:5] == [echo(f"def handler{n}(request):") for n in range(5)]
    assert results[5] == WITHHOLD_TEXT.format(count=2, subject=f"{tool} on {FILE}", tool=called)
    stop = ESCALATION_TEXT.format(tool=called, limit=2)
    if agent is claude_code:
        assert history[-1] == {"role": "assistant", "content": [{"type": "text", "text": stop}]}
    else:
        assert history[-1]["content"][0]["text"] == stop
    snap = await snapshot(base)
    assert (snap["results_withheld"], snap["stops"]) == (1, 1)
    assert snap["per_rule"] == {"repeated_failure": 1, "same_target": 2, "escalation": 1, "stop": 1}
