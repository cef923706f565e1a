"""Running a real agent CLI headless (Codex CLI, Claude Code, Qwen Code: :mod:`tests.codex_cli`,
:mod:`tests.claude_code`, :mod:`tests.qwen_code`): one subprocess in its own process group, no
stdin, output captured, the whole group killed at the timeout."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


async def run_cli(
    argv: Sequence[str], cwd: Path, env: Mapping[str, str], timeout: float
) -> tuple[int | None, str, str, float]:
    """``argv`` run in ``cwd`` with exactly ``env``: (exit code, stdout, stderr, seconds); the
    exit code is None when the process group was killed at ``timeout`` seconds."""
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
    return code, out.decode(errors="replace"), err.decode(errors="replace"), time.monotonic() - started
