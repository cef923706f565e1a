"""Running a real agent CLI headless (Codex CLI, Claude Code, Qwen Code, pi, Cline, Continue CLI,
opencode: :mod:`tests.helpers.codex_cli`, :mod:`tests.helpers.claude_code`, :mod:`tests.helpers.qwen_code`,
:mod:`tests.helpers.npm_agents`): one subprocess in its own process group, no stdin, output captured,
the whole group killed when the run ends or at the timeout (an agent's helpers die with it)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest


async def run_cli(
    argv: Sequence[str], cwd: Path, env: Mapping[str, str], timeout: float
) -> tuple[int | None, str, str, float]:
    """``argv`` run in ``cwd`` with exactly ``env``: (exit code, stdout, stderr, seconds); the
    exit code is None when the process group was killed at ``timeout`` seconds. The group is
    killed when the run ends too (also when the test is cancelled), so nothing it started
    outlives it."""
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=dict(env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
        code: int | None = proc.returncode
    except asyncio.TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = await proc.communicate()
        code = None
    finally:
        # whatever the agent left running in its group (a helper, a daemon) ends with the run
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    return code, out.decode(errors="replace"), err.decode(errors="replace"), time.monotonic() - started


@dataclass(frozen=True)
class CliRun:
    """One finished run of an agent CLI."""

    returncode: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    seconds: float


def version_of(argv: Sequence[str], pattern: str) -> str | None:
    """The version ``argv`` (a ``--version`` command) prints on stdout or stderr, group 1 of
    ``pattern`` matched against the whole stripped output; None when it does not run."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False)
    except OSError:
        return None
    m = re.fullmatch(pattern, (done.stdout + done.stderr).strip())
    return m.group(1) if done.returncode == 0 and m else None


def find_pinned(env_var: str, cached: Path, version: str, pattern: str, hint: str) -> str:
    """The agent binary: ``$env_var`` (must run ``--version`` and be ``version``: a failure
    otherwise) or ``cached`` (the test skips with ``hint`` when it is absent or another version)."""
    explicit = os.environ.get(env_var)
    if explicit:
        got = version_of([explicit, "--version"], pattern)
        assert got == version, f"{env_var}={explicit} is {got}, want {version}"
        return explicit
    if not cached.exists():
        pytest.skip(f"{cached.name} {version} not installed: {hint}")
    got = version_of([str(cached), "--version"], pattern)
    if got != version:
        pytest.skip(f"{cached} is {got}, the tests pin {version}: {hint}")
    return str(cached)
