"""Harness for running the real Gemini CLI (``@google/gemini-cli`` from npm) headless against
loopguard (the Gemini API guarded end to end).

Install: the version pinned in ``.ci/gemini-cli-version``, into its own prefix in the npm cache
(``${LOOPGUARD_NPM_CACHE:-~/.cache/loopguard-npm}/gemini-cli``; a second package installed with
``--no-save`` into another prefix would prune the first), done by ``.ci/run``::

    npm install --prefix ~/.cache/loopguard-npm/gemini-cli --no-save --ignore-scripts \\
        @google/gemini-cli@<version>

One bundled JavaScript entry point (``bundle/gemini.js``) and its chunks; no install script
needed, Node >= 20. :func:`find_gemini` takes ``$LOOPGUARD_GEMINI`` (set by ``.ci/run``) or the
cached ``node_modules/.bin/gemini``.

Run: ``gemini -p "<prompt>" --yolo -m gemini-2.5-pro`` in a work directory, with an environment
holding only ``PATH``, ``HOME`` (a temp dir), ``GEMINI_API_KEY`` (any value: it is sent as
``x-goog-api-key``) and ``GOOGLE_GEMINI_BASE_URL`` (loopguard's root, *without* ``/v1beta``: the
SDK appends ``/v1beta/models/{model}:streamGenerateContent?alt=sse``). Headless quirks found with
0.61.0:

- **auth**: with ``GOOGLE_GEMINI_BASE_URL`` set, the CLI picks the auth type ``gateway`` from the
  environment, which its own check for a non-interactive run rejects ("Invalid auth method
  selected.", exit 41) whatever key is set. ``~/.gemini/settings.json`` with
  ``security.auth.selectedType: "gemini-api-key"`` makes it take ``GEMINI_API_KEY`` and still
  honour the base URL (:func:`settings`).
- **folder trust**: in a folder it does not trust, ``--yolo`` is overridden to the default
  approval mode ("Approval mode overridden to "default" because the current folder is not
  trusted."), where a headless run cannot approve any tool: ``security.folderTrust.enabled:
  false``.
- **model router**: without ``-m`` every prompt first goes to a classifier (a ``:generateContent``
  request without ``tools`` asking which model to use; a fake that does not answer it in JSON
  makes the CLI retry it for seconds). ``-m gemini-2.5-pro`` skips it.
- its own **loop detection** (on by default; ``model.disableLoopDetection``): the 5th identical
  call in a row (same name and arguments) ends the run at once, exit 0, nothing printed
  (``tests/agents/test_gemini_cli.py`` pins it).
- with usage statistics and telemetry off (:func:`settings`) and ``disableAutoUpdate``, a run
  opens connections to the base URL only.

What it prints: with the default text output, the model's text of the final answer on stdout
(its notices, "YOLO mode is enabled…", go to stderr).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.agent_cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
#: The Gemini CLI version the harness is tested with (``.ci/run`` installs it).
GEMINI_VERSION = (ROOT / ".ci" / "gemini-cli-version").read_text().strip()
NPM_PREFIX = (
    Path(os.environ.get("LOOPGUARD_NPM_CACHE") or Path.home() / ".cache" / "loopguard-npm") / "gemini-cli"
)
INSTALL_HINT = (
    f"npm install --prefix {NPM_PREFIX} --no-save --ignore-scripts @google/gemini-cli@{GEMINI_VERSION}"
    " (what .ci/run does), or set LOOPGUARD_GEMINI to a gemini binary"
)
FAKE_KEY = "gemini-loopguard-fake-key"
MODEL = "gemini-2.5-pro"


def version_of(binary: str) -> str | None:
    """``gemini --version`` (``0.61.0``), None when it does not run."""
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def find_gemini() -> str:
    """The Gemini CLI: ``$LOOPGUARD_GEMINI`` (must run and be the pinned version: a failure
    otherwise) or the one in :data:`NPM_PREFIX` (skips when absent or another version)."""
    explicit = os.environ.get("LOOPGUARD_GEMINI")
    if explicit:
        got = version_of(explicit)
        assert got == GEMINI_VERSION, f"LOOPGUARD_GEMINI={explicit} is {got}, want {GEMINI_VERSION}"
        return explicit
    cached = NPM_PREFIX / "node_modules" / ".bin" / "gemini"
    if not cached.exists():
        pytest.skip(f"Gemini CLI {GEMINI_VERSION} not installed: {INSTALL_HINT}")
    got = version_of(str(cached))
    if got != GEMINI_VERSION:
        pytest.skip(f"{cached} is Gemini CLI {got}, the tests pin {GEMINI_VERSION}: {INSTALL_HINT}")
    return str(cached)


def settings(loop_detection: bool = True) -> dict[str, Any]:
    """``~/.gemini/settings.json`` for a headless run (the module docstring's quirks);
    ``loop_detection`` False turns the CLI's own loop detection off."""
    out: dict[str, Any] = {
        "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
    }
    if not loop_detection:
        out["model"] = {"disableLoopDetection": True}
    return out


@dataclass
class GeminiRun:
    returncode: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    seconds: float


def environment(base_url: str, home: Path) -> dict[str, str]:
    """The whole environment of a run (``base_url``: loopguard's or the fake's root)."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "GEMINI_API_KEY": FAKE_KEY,
        "GOOGLE_GEMINI_BASE_URL": base_url,
        "NO_PROXY": "*",
        "LANG": "C.UTF-8",
    }


async def run_gemini(
    binary: str,
    base_url: str,
    prompt: str,
    workdir: Path,
    home: Path,
    loop_detection: bool = True,
    timeout: float = 180,
) -> GeminiRun:
    """``gemini -p <prompt> --yolo -m`` :data:`MODEL` in ``workdir`` against ``base_url`` with a
    fresh ``home`` (:func:`settings`). The whole process group is killed at ``timeout`` seconds
    (``returncode`` None then)."""
    (home / ".gemini").mkdir(parents=True, exist_ok=True)
    (home / ".gemini" / "settings.json").write_text(json.dumps(settings(loop_detection)))
    argv = [binary, "-p", prompt, "--yolo", "-m", MODEL]
    return GeminiRun(*await run_cli(argv, workdir, environment(base_url, home), timeout))
