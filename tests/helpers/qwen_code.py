"""Harness for running the real Qwen Code CLI (``@qwen-code/qwen-code`` from npm) headless against
loopguard (local Qwen whose tool calls arrive as text).

Install: the version pinned in ``.ci/qwen-code-version``, into its own prefix in the npm cache
outside the repo (``${LOOPGUARD_NPM_CACHE:-~/.cache/loopguard-npm}/qwen-code``), done by
``.ci/run``::

    npm install --prefix ~/.cache/loopguard-npm/qwen-code --no-save --ignore-scripts \\
        @qwen-code/qwen-code@<version>

The package is one bundled Node program (``cli-entry.js`` → ``cli.js`` + ``chunks/``) with no
dependencies and optional prebuilt platform packages (node-pty, clipboard, sharp), all from the
npm registry; it has no install script. Its own prefix, not the Codex one: a second ``npm install
--no-save`` into a prefix prunes what the first installed. 0.24.4 declares ``engines.node >=22``
(every release since 0.21 does; 0.15 was the last saying >=20), yet ``--version`` and every run
here work on the machine's Node 20.20.2, so the newest is pinned. The bundled ripgrep comes
without its execute bit (no install script sets it): Qwen Code says "Ripgrep not available …
Falling back to built-in grep." on stderr and goes on. :func:`find_qwen` takes
``$LOOPGUARD_QWEN`` (set by ``.ci/run``) or the launcher in that cache.

Run: ``qwen -p "<prompt>" --yolo --auth-type openai`` (headless; ``--yolo`` runs every tool
without asking) in a work dir, with ``OPENAI_BASE_URL`` = loopguard's ``…/v1`` (Qwen Code appends
``/chat/completions``), ``OPENAI_API_KEY``, ``OPENAI_MODEL``, and ``HOME`` a temp dir holding
``.qwen/settings.json`` = :data:`SETTINGS`: no auto-update, usage statistics, telemetry or chat
recording, and none of the background model calls (managed auto-memory, which otherwise sends a
second request, a memory-extraction subagent, after the answer; auto-dream; auto-skill review;
follow-up suggestions). With these, strace shows loopback connections only (without them it does
DNS lookups at start). The environment holds only what it needs.

What Qwen Code 0.24.4 sends (``POST /v1/chat/completions``, always ``stream: true`` with
``stream_options: {"include_usage": true}``, ``max_tokens: 32000``; body keys exactly ``model,
messages, max_tokens, stream, stream_options, tools``, no ``tool_choice``; user agent
``QwenCode/0.24.4 (linux; x64)`` via the openai Node SDK; the whole history every time):

- tools (14): ``agent``, ``edit``, ``get_goal``, ``glob``, ``grep_search``, ``list_agents``,
  ``notebook_edit``, ``read_file``, ``run_shell_command``, ``skill``, ``tool_call``,
  ``tool_search``, ``update_goal``, ``write_file``. ``read_file`` takes ``{"file_path": <absolute
  path>, "offset"?: int|null, "limit"?: int|null, "pages"?: str|null}``. Note the tool named
  ``tool_call`` (it invokes a deferred tool: ``{"name": …, "arguments": {…}}``): the tag
  ``<tool_call>`` and a call *to* ``tool_call`` are different things.
- messages: a ``system`` prompt (~27 KB), one ``user`` message whose content is a list of five
  text parts (four ``<system-reminder>`` blocks: skills, working directory and its listing,
  deferred tools, the date; then the prompt).
- per step: the model's call echoed back as ``{"role": "assistant", "content": null,
  "tool_calls": [{"id": <the server's id>, "type": "function", "function": {"name": "read_file",
  "arguments": "{\\"file_path\\":\\"…\\"}"}}]}`` (arguments re-serialized compact), then the result
  as ``{"role": "tool", "tool_call_id": …, "content": [{"type": "text", "text": …}]}`` (a list of
  text parts, not a string). ``read_file`` of a small text file gives its text; a read of a file
  it has already read and that has not changed gives, from the second time on, ``[File a.txt
  unchanged since last read in this session — the full content was provided earlier in this
  conversation. …]`` (the same text every time).
- a text answer holding call markup (``<tool_call>…</tool_call>`` in ``content``,
  ``finish_reason: "stop"``): Qwen Code does not parse it; it is the final answer, printed as is
  on stdout, and the run ends (exit 0) after that one request. The call never runs, and there is
  no second request ("you did not call a tool") either.
- its own loop guard (always on, not configurable): the 5th consecutive identical call (same
  name and canonical arguments) in one prompt's turn is not run; the run ends with exit code 1
  and ``Loop detection halted the run (consecutive_identical_tool_calls: …)`` on stderr
  (:data:`OWN_LOOP_HALT`). Its other detectors (alternating calls, global duplicates, file-read
  loops, content loops) are skipped by default (``model.skipLoopDetection`` defaults to true), so
  a cycle such as read a, read b, read a, … runs on (``tests/agents/test_qwen_code.py``: 30 calls, to
  the fake's limit, without loopguard).
- what loopguard writes into them: a reminder is a ``user`` message ``[loopguard] …`` after the
  step's tool message; a withheld result is the tool message's content replaced by the denial
  text; loopguard's stop is a text answer, which Qwen Code prints and exits 0 on.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.agent_cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
#: The Qwen Code version the harness is tested with (``.ci/run`` installs it).
QWEN_VERSION = (ROOT / ".ci" / "qwen-code-version").read_text().strip()
NPM_CACHE = Path(os.environ.get("LOOPGUARD_NPM_CACHE") or Path.home() / ".cache" / "loopguard-npm")
QWEN_PREFIX = NPM_CACHE / "qwen-code"
INSTALL_HINT = (
    f"npm install --prefix {QWEN_PREFIX} --no-save --ignore-scripts @qwen-code/qwen-code@{QWEN_VERSION}"
    " (what .ci/run does), or set LOOPGUARD_QWEN to a qwen launcher"
)
FAKE_KEY = "sk-loopguard-fake"
MODEL = "fake-model"

#: ``$HOME/.qwen/settings.json``: nothing but the run itself talks to the network or the model.
SETTINGS: dict[str, Any] = {
    "general": {"enableAutoUpdate": False, "chatRecording": False},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "memory": {"enableManagedAutoMemory": False, "enableManagedAutoDream": False, "enableAutoSkill": False},
    "ui": {"enableFollowupSuggestions": False},
}

#: What Qwen Code prints on stderr when its own loop guard ends a run.
OWN_LOOP_HALT = "Loop detection halted the run (consecutive_identical_tool_calls"


def version_of(binary: str) -> str | None:
    """``qwen --version``'s version, None when it does not run."""
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except OSError:
        return None
    m = re.fullmatch(r"(\d+\.\d+\.\d+\S*)\s*", done.stdout)
    return m.group(1) if done.returncode == 0 and m else None


def find_qwen() -> str:
    """The Qwen Code launcher: ``$LOOPGUARD_QWEN`` (must run and be the pinned version: a failure
    otherwise) or the one in :data:`QWEN_PREFIX` (skips when absent or another version)."""
    explicit = os.environ.get("LOOPGUARD_QWEN")
    if explicit:
        got = version_of(explicit)
        assert got == QWEN_VERSION, f"LOOPGUARD_QWEN={explicit} is {got}, want {QWEN_VERSION}"
        return explicit
    cached = QWEN_PREFIX / "node_modules" / ".bin" / "qwen"
    if not cached.exists():
        pytest.skip(f"Qwen Code {QWEN_VERSION} not installed: {INSTALL_HINT}")
    got = version_of(str(cached))
    if got != QWEN_VERSION:
        pytest.skip(f"{cached} is Qwen Code {got}, the tests pin {QWEN_VERSION}: {INSTALL_HINT}")
    return str(cached)


@dataclass
class QwenRun:
    returncode: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    seconds: float


def write_home(home: Path) -> None:
    """A ``HOME`` at ``home`` holding ``.qwen/settings.json`` = :data:`SETTINGS`."""
    (home / ".qwen").mkdir(parents=True, exist_ok=True)
    (home / ".qwen" / "settings.json").write_text(json.dumps(SETTINGS, indent=2))


async def run_qwen(
    binary: str, base_url: str, prompt: str, workdir: Path, home: Path, timeout: float = 120
) -> QwenRun:
    """``qwen -p prompt --yolo --auth-type openai`` in ``workdir`` against ``base_url``
    (``…/v1``), with a fresh ``home`` and an environment holding only what it needs; the whole
    process group is killed at ``timeout`` seconds."""
    write_home(home)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "OPENAI_BASE_URL": base_url,
        "OPENAI_API_KEY": FAKE_KEY,
        "OPENAI_MODEL": MODEL,
        "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
        "NO_PROXY": "*",
        "LANG": "C.UTF-8",
    }
    argv = [
        binary,
        "-p",
        prompt,
        "--yolo",
        "--auth-type",
        "openai",
    ]
    return QwenRun(*await run_cli(argv, workdir, env, timeout))
