"""Harness for running the real Claude Code (``@anthropic-ai/claude-code`` from npm) headless
against loopguard (Anthropic Messages guarded end to end).

Install: the version pinned in ``.ci/claude-code-version``, into its own cache outside the repo
(``${LOOPGUARD_NPM_CLAUDE_CACHE:-~/.cache/loopguard-npm-claude}``; not the Codex prefix: ``npm
install --no-save`` of a second package into a prefix prunes the first), done by ``.ci/run``::

    npm install --prefix ~/.cache/loopguard-npm-claude --no-save --ignore-scripts \\
        @anthropic-ai/claude-code@<version>

Since 2.1 the package has no ``cli.js``: ``bin/claude.exe`` is a 500-byte shell placeholder that
only prints "claude native binary not installed", and the postinstall script (``install.cjs``,
skipped by ``--ignore-scripts``) copies the native binary over it. The binary comes as an
optional dependency, ``@anthropic-ai/claude-code-linux-x64`` (one per platform, all on the npm
registry, ~400 MB; no download from any other host), so the harness runs
``node_modules/@anthropic-ai/claude-code-<platform>/claude`` itself. :func:`find_claude` takes
``$LOOPGUARD_CLAUDE`` (set by ``.ci/run``) or that binary in the cache.

Run: ``claude -p "<prompt>" --allowedTools Bash,Read --output-format json`` in a work directory,
with an environment holding only ``PATH``, ``HOME`` and ``CLAUDE_CONFIG_DIR`` (a temp dir),
``ANTHROPIC_BASE_URL`` (loopguard's root, *without* ``/v1``: Claude Code appends
``/v1/messages``; with ``…/v1`` it posts to ``/v1/v1/messages``), ``ANTHROPIC_AUTH_TOKEN`` (sent as
``Authorization: Bearer …``; ``ANTHROPIC_API_KEY`` instead is sent as ``x-api-key``) and
``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1``. With that, it opens one connection, to the base
URL's port on loopback, and nothing else (checked with strace: ``tests/agents/test_claude_code.py``);
without it, it also sends ``HEAD /api/hello`` to the base URL and looks up other hosts in DNS.
Each run is killed (its whole process group) at a hard timeout. ``--output-format json`` prints one
JSON object (``result``: the final text, ``num_turns``, ``is_error``, ``stop_reason``, ``usage``…).

What Claude Code 2.1.332 sends (measured against :mod:`tests.helpers.fake_messages`):

- every model request is ``POST /v1/messages?beta=true`` (the query always there), ``stream:
  true``, ``Content-Length`` (not chunked), the whole history every time. No side requests in a
  ``-p`` session: no titles, summaries or ``count_tokens`` (a 2-step session is exactly 3
  requests). ``claude -p /context`` sends only ``POST /v1/messages/count_tokens?beta=true``
  (25 of them, bodies ``{"model": …, "messages": [{"role": "user", "content": <a string>}],
  "tools": [...]}``, beta header with ``token-counting-2024-11-01``) and no ``/messages``.
- headers: ``anthropic-version: 2023-06-01``, ``anthropic-beta: claude-code-20250219,
  interleaved-thinking-2025-05-14,context-management-2025-06-27,per-turn-control-2026-07-01,
  mid-conversation-tool-changes-2026-07-01,thinking-token-count-2026-05-13,
  advanced-tool-use-2025-11-20,effort-2025-11-24``, ``anthropic-dangerous-direct-browser-access:
  true``, ``x-app: cli``, ``User-Agent: claude-cli/2.1.332 (external, sdk-cli)``,
  ``X-Claude-Code-Session-Id``, ``X-Stainless-*``, ``Accept-Encoding: gzip, deflate, br, zstd``.
- body keys in this order: ``model`` (``claude-opus-5-5`` unless ``--model``/``ANTHROPIC_MODEL``),
  ``messages``, ``system``, ``tools``, ``metadata`` (``user_id``: a JSON string with device,
  account and session ids), ``max_tokens`` (128000), ``thinking`` (``{"type": "adaptive",
  "display": "omitted"}``), ``context_management`` (``clear_thinking_20251015``),
  ``output_config`` (``{"effort": "medium"}``), ``stream``.
- ``system``: a list of three ``text`` blocks (a billing header line; "You are a Claude agent…"
  and the 7 KB prompt, both with ``cache_control: {"type": "ephemeral"}``), the same in every
  request. ``tools``: 12 (``Agent``, ``Bash``, ``Edit``, ``ListAgents``, ``Read``, …, ``Write``,
  one ``DeferredToolPlaceholder`` with ``defer_loading: true``), ``name``/``description``/
  ``input_schema``, no ``cache_control``. ``Bash`` input ``{"command", "description"?,
  "timeout"?, "run_in_background"?}``; ``Read`` ``{"file_path", "offset"?, "limit"?, …}``.
- ``messages`` do not only alternate user/assistant: ``[0]`` is a user message of two ``text``
  blocks (a ``<system-reminder>`` about commit attribution, then the prompt); ``[1]`` is a
  ``"role": "system"`` message (the environment, skills and agent lists) with a message-level
  ``output_config`` key. Then per step an assistant message with the ``tool_use`` blocks exactly
  as the server sent them (``type``, ``id``, ``name``, ``input``) and a user message of
  ``tool_result`` blocks only. After the 5th, 10th and 15th step without text Claude Code adds
  another ``system`` message ("The user hasn't heard from you in a while…") before the next
  assistant message; it stays in place in later requests. No user message mixes ``tool_result``
  and ``text`` blocks in these sessions.
- ``cache_control: {"type": "ephemeral"}`` sits on the last block of the last message only and
  moves every request; where it moves away from a one-block list, that list becomes a plain
  string (the ``system`` message ``[1]`` is a block list in the first request and a string after),
  so earlier messages do not keep their bytes from one request to the next.
- ``tool_result`` shapes (``content`` always a string here): Bash ``{"tool_use_id", "type",
  "content": <stdout, no trailing newline>, "is_error": false}``; a failing Bash ``{"type",
  "content": "Exit code 3\\n<stderr>", "is_error": true, "tool_use_id"}`` (another key order);
  Read ``{"tool_use_id", "type", "content": "1\\t<line>\\n2\\t"}`` (line-numbered, no
  ``is_error``); Read of a missing file ``is_error: true``, "File does not exist. …". The same call
  on an unchanged file gives byte-identical results every time. Parallel ``tool_use`` blocks get
  one user message whose results are in *completion* order, not call order.
  Other error results (all ``is_error: true``, key order ``type``, ``content``, ``is_error``,
  ``tool_use_id``): a tool not allowed ("Claude requested permissions to write to <path>, but you
  haven't granted it yet."), an unknown tool ("<tool_use_error>Error: No such tool available:
  NoSuchTool</tool_use_error>"), bad input ("<tool_use_error>InputValidationError: Read failed
  due to the following issues:\n…</tool_use_error>"); a command without output is
  "(Bash completed with no output)".
- an answer of ``thinking`` (with ``signature``), ``text`` and ``tool_use`` blocks comes back as one
  assistant message with exactly those blocks.
- what it does with an answer's ``stop_reason``: ``end_turn`` ends the session (exit 0, the text is
  the ``result``); ``max_tokens`` makes it send a new user message (a string: ``<system-reminder>
  Output token limit hit. Resume directly …``) and ask again, three times, then exit 1 with
  ``API Error: Claude's response exceeded the 128000 output token maximum …``; ``refusal`` ends it
  with exit 1.
- Claude Code has no loop breaker of its own: a model that repeats one Bash call 30 times gets
  30 runs, and three identical calls in one answer run three times (``tests/agents/test_claude_code.py``
  pins both).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.agent_cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
#: The Claude Code version the harness is tested with (``.ci/run`` installs it).
CLAUDE_VERSION = (ROOT / ".ci" / "claude-code-version").read_text().strip()
NPM_CACHE = Path(
    os.environ.get("LOOPGUARD_NPM_CLAUDE_CACHE") or Path.home() / ".cache" / "loopguard-npm-claude"
)
INSTALL_HINT = (
    f"npm install --prefix {NPM_CACHE} --no-save --ignore-scripts @anthropic-ai/claude-code@{CLAUDE_VERSION}"
    " (what .ci/run does), or set LOOPGUARD_CLAUDE to a claude binary"
)
FAKE_TOKEN = "sk-ant-loopguard-fake"
#: The tools a run allows without asking (``--allowedTools``).
ALLOWED_TOOLS = ("Bash", "Read")


def version_of(binary: str) -> str | None:
    """``claude --version``'s version (``2.1.332 (Claude Code)``), None when it does not run."""
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except OSError:
        return None
    m = re.fullmatch(r"(\S+) \(Claude Code\)\s*", done.stdout)
    return m.group(1) if done.returncode == 0 and m else None


def cached_binary(cache: Path = NPM_CACHE) -> Path | None:
    """The native binary of the platform package npm installed into ``cache``, None if absent."""
    found = sorted((cache / "node_modules" / "@anthropic-ai").glob("claude-code-*/claude"))
    return found[0] if found else None


def find_claude() -> str:
    """The Claude Code binary: ``$LOOPGUARD_CLAUDE`` (must run and be the pinned version: a
    failure otherwise) or the one in :data:`NPM_CACHE` (skips when absent or another version)."""
    explicit = os.environ.get("LOOPGUARD_CLAUDE")
    if explicit:
        got = version_of(explicit)
        assert got == CLAUDE_VERSION, f"LOOPGUARD_CLAUDE={explicit} is {got}, want {CLAUDE_VERSION}"
        return explicit
    cached = cached_binary()
    if cached is None:
        pytest.skip(f"Claude Code {CLAUDE_VERSION} not installed: {INSTALL_HINT}")
    got = version_of(str(cached))
    if got != CLAUDE_VERSION:
        pytest.skip(f"{cached} is Claude Code {got}, the tests pin {CLAUDE_VERSION}: {INSTALL_HINT}")
    return str(cached)


@dataclass
class ClaudeRun:
    returncode: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    seconds: float

    def result(self) -> dict[str, Any]:
        """The ``--output-format json`` object Claude Code printed (``result``, ``num_turns``…)."""
        return json.loads(self.stdout)


#: The two ways to give Claude Code a key (:func:`environment`'s ``auth``).
AUTH_TOKEN = "ANTHROPIC_AUTH_TOKEN"  # sent as ``Authorization: Bearer <key>``
API_KEY = "ANTHROPIC_API_KEY"  # sent as ``x-api-key: <key>``


def environment(base_url: str, home: Path, auth: str = AUTH_TOKEN) -> dict[str, str]:
    """The whole environment of a run: ``base_url`` is loopguard's (or the fake's) root, no
    ``/v1``; ``home`` a fresh directory for ``HOME`` and the config; ``auth`` the variable that
    holds :data:`FAKE_TOKEN` (:data:`AUTH_TOKEN` or :data:`API_KEY`)."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "ANTHROPIC_BASE_URL": base_url,
        auth: FAKE_TOKEN,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "NO_PROXY": "*",
        "LANG": "C.UTF-8",
    }


async def run_claude(
    binary: str,
    base_url: str,
    prompt: str,
    workdir: Path,
    home: Path,
    allowed_tools: Sequence[str] = ALLOWED_TOOLS,
    timeout: float = 120,
    prefix: Sequence[str] = (),
    auth: str = AUTH_TOKEN,
) -> ClaudeRun:
    """``claude -p`` in ``workdir`` against ``base_url`` (see :func:`environment`, also for
    ``auth``), printing JSON; ``prefix`` wraps the command (e.g. ``strace …``). The whole process
    group is killed at ``timeout`` seconds (``returncode`` None then)."""
    home.mkdir(parents=True, exist_ok=True)
    argv = [
        *prefix,
        binary,
        "-p",
        prompt,
        "--allowedTools",
        ",".join(allowed_tools),
        "--output-format",
        "json",
    ]
    return ClaudeRun(*await run_cli(argv, workdir, environment(base_url, home, auth), timeout))
