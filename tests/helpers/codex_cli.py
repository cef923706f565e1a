"""Harness for running the real Codex CLI (``@openai/codex`` from npm) headless against loopguard
(the Responses API guarded end to end).

Install: the version pinned in ``.ci/codex-version``, into a cache outside the repo
(``${LOOPGUARD_NPM_CACHE:-~/.cache/loopguard-npm}``), done by ``.ci/run``::

    npm install --prefix ~/.cache/loopguard-npm --no-save --ignore-scripts @openai/codex@<version>

The npm package is a small Node launcher (``bin/codex.js``); the native binary comes as an
optional dependency, ``@openai/codex-linux-x64`` = ``npm:@openai/codex@<version>-linux-x64``
(one per platform, each a version of the same registry package), so the install needs the npm
registry only (no install script, no download from GitHub). :func:`find_codex` takes
``$LOOPGUARD_CODEX`` (set by ``.ci/run``) or the launcher in that cache.

Run: ``codex exec --strict-config --skip-git-repo-check --color never "<prompt>"`` with
``CODEX_HOME`` (and ``HOME``) a temp dir holding :data:`CONFIG_TOML`: a ``model_providers`` entry
whose ``base_url`` is loopguard's ``/v1`` (Codex appends ``/responses``), ``wire_api =
"responses"``, the key in ``env_key``'s variable; ``approval_policy = "never"`` and ``sandbox_mode
= "danger-full-access"`` so commands run without asking; no update check, analytics, feedback,
OTel export or history; web search and plugins off (with plugins on, Codex 0.171 looks up
github.com, api.github.com and chatgpt.com at start; with them off it opens loopback connections
only, checked with strace). ``--strict-config`` makes an unknown key an error, so the config is
checked against the version under test.

What Codex 0.171.0 sends (``POST /v1/responses``, ``stream: true``, ``store: false``, the whole
history every time, ``include: ["reasoning.encrypted_content"]``, ``prompt_cache_key`` = the
session id, ``client_metadata`` with session/turn ids; no ``instructions``: its system prompt is the
first ``developer`` message item; no request compression to a custom provider):

- tools: ``exec_command`` (``{"cmd": …, "workdir"?, "yield_time_ms"?, "max_output_tokens"?,
  "tty"?, "shell"?, "login"?, …}``; the shell tool), ``write_stdin``, ``request_user_input``,
  ``view_image``, a ``multi_agent_v1`` namespace, ``get_goal`` / ``create_goal`` /
  ``update_goal``.
- input items: ``message`` items with ids (``developer`` prompt, skills list, a ``user``
  ``<environment_context>``, the ``user`` prompt), then per step the model's items echoed back:
  ``{"type": "function_call", "status": "completed", "id": <the server's id>, "name":
  "exec_command", "arguments": <the server's string, verbatim>, "call_id": …}`` (and
  ``reasoning`` items with their ``encrypted_content``), each followed by ``{"type":
  "function_call_output", "id": "fco_<uuid>", "call_id": …, "output": <string>}``.
- ``output`` of a finished command::

      Chunk ID: 3f9a0c
      Wall time: 0.0000 seconds
      Process exited with code 0
      Original token count: 2
      Output:
      <the command's stdout+stderr>

  The chunk id is 6 random hex digits, new on every call; the wall time changes with the run
  time (masked by the default duration pattern); the token count follows the output. So two runs
  of a command with the same result differ in the chunk id: the default masks
  (:data:`proxy.core.volatile.DEFAULT_MASK_PATTERNS`: hex ids need 7+ digits) do not cover it, every
  Codex result looks new, and no progress-aware rule ever fires. :data:`CHUNK_ID_MASK` is the
  pattern that makes them compare equal (``tests/agents/test_codex_cli.py`` pins both).
- other outputs seen: a failing command is the same wrapper (``Process exited with code 3``, its
  stderr in the output); one still running at ``yield_time_ms`` says ``Process running with
  session ID 50343`` (a random 5-digit id, new per call, not masked by default either) with what
  it printed so far; a long output is cut inside the wrapper (``Warning: truncated output
  (original token count: 27224)``, ``Total output lines: 20000``, ``…27174 tokens truncated…``,
  all the same for the same output); a tool error is plain text (``write_stdin failed: Unknown
  process id 1``).
- what loopguard writes into them (seen in the requests the model gets): a reminder is a user
  ``message`` item ``{"type": "message", "role": "user", "content": [{"type": "input_text",
  "text": "[loopguard] …"}]}`` after the step's output, put back in every later request (Codex
  never has it); a withheld result is the ``function_call_output``'s ``output`` replaced by the
  denial text. Codex runs every call it gets, withheld or not: only the response-side stop keeps
  a call from running.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.agent_cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
#: The Codex CLI version the harness is tested with (``.ci/run`` installs it).
CODEX_VERSION = (ROOT / ".ci" / "codex-version").read_text().strip()
NPM_CACHE = Path(os.environ.get("LOOPGUARD_NPM_CACHE") or Path.home() / ".cache" / "loopguard-npm")
INSTALL_HINT = (
    f"npm install --prefix {NPM_CACHE} --no-save --ignore-scripts @openai/codex@{CODEX_VERSION}"
    " (what .ci/run does), or set LOOPGUARD_CODEX to a codex binary"
)
#: The environment variable holding the fake API key (the provider's ``env_key``).
KEY_ENV = "LOOPGUARD_FAKE_KEY"
FAKE_KEY = "sk-loopguard-fake"

#: ``$CODEX_HOME/config.toml``; ``{base_url}`` is loopguard's ``…/v1``.
CONFIG_TOML = """\
model = "fake-model"
model_provider = "loopguard"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false
web_search = "disabled"

[features]
plugins = false

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"

[history]
persistence = "none"

[model_providers.loopguard]
name = "loopguard"
base_url = "{base_url}"
env_key = "{key_env}"
wire_api = "responses"
"""

#: Masks the chunk id of Codex's ``exec_command`` output wrapper (``Chunk ID: 3f9a0c``).
CHUNK_ID_MASK = r"(?<=Chunk ID: )[0-9a-f]+\b"

#: The wrapper around a finished command's output (group ``output``).
OUTPUT_WRAPPER = re.compile(
    r"Chunk ID: [0-9a-f]{6}\nWall time: \d+\.\d{4} seconds\nProcess exited with code (?P<code>\d+)\n"
    r"Original token count: \d+\nOutput:\n(?P<output>.*)",
    re.DOTALL,
)


def version_of(binary: str) -> str | None:
    """``codex --version``'s version, None when it does not run."""
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except OSError:
        return None
    m = re.fullmatch(r"codex-cli (\S+)\s*", done.stdout)
    return m.group(1) if done.returncode == 0 and m else None


def find_codex() -> str:
    """The Codex launcher: ``$LOOPGUARD_CODEX`` (must run and be the pinned version: a failure
    otherwise) or the one in :data:`NPM_CACHE` (skips when absent or another version)."""
    explicit = os.environ.get("LOOPGUARD_CODEX")
    if explicit:
        got = version_of(explicit)
        assert got == CODEX_VERSION, f"LOOPGUARD_CODEX={explicit} is {got}, want {CODEX_VERSION}"
        return explicit
    cached = NPM_CACHE / "node_modules" / ".bin" / "codex"
    if not cached.exists():
        pytest.skip(f"Codex CLI {CODEX_VERSION} not installed: {INSTALL_HINT}")
    got = version_of(str(cached))
    if got != CODEX_VERSION:
        pytest.skip(f"{cached} is Codex {got}, the tests pin {CODEX_VERSION}: {INSTALL_HINT}")
    return str(cached)


@dataclass
class CodexRun:
    returncode: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    seconds: float


def write_home(home: Path, base_url: str) -> None:
    """A ``CODEX_HOME`` at ``home`` whose provider is ``base_url``."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(CONFIG_TOML.format(base_url=base_url, key_env=KEY_ENV))


async def run_codex(
    binary: str, base_url: str, prompt: str, workdir: Path, home: Path, timeout: float = 120
) -> CodexRun:
    """``codex exec`` in ``workdir`` against ``base_url`` (``…/v1``), with a fresh ``home`` and an
    environment holding only what it needs; the whole process group is killed at ``timeout``."""
    write_home(home, base_url)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "CODEX_HOME": str(home),
        KEY_ENV: FAKE_KEY,
        "NO_PROXY": "*",
        "LANG": "C.UTF-8",
    }
    argv = [
        binary,
        "exec",
        "--strict-config",
        "--skip-git-repo-check",
        "--color",
        "never",
        prompt,
    ]
    return CodexRun(*await run_cli(argv, workdir, env, timeout))
