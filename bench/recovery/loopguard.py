"""The real ``loopguard serve`` (``python -m proxy serve``) as a child process, one per arm.

Its config is the arm's overrides written to a temporary YAML file (the rest are the shipped
defaults). Its log (JSON lines on stderr) goes to a file: one line per request, with the fresh
``actions`` taken on it (request side and response side), read by :meth:`Loopguard.request_lines`.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

#: Project root: loopguard runs from here (this checkout's ``proxy`` package).
ROOT = Path(__file__).resolve().parents[2]
#: Seconds to wait for ``GET /loop-guard`` to answer after the start.
STARTUP_TIMEOUT_S = 30.0


def _free_port() -> int:
    """A localhost TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Loopguard:
    """One loopguard process: :meth:`start`, then :attr:`url` (an OpenAI base URL), then :meth:`stop`.

    Args:
        upstream: the upstream base URL (the recording relay).
        overrides: config overrides (nested mapping, as in ``config/loopguard.yaml``).
        workdir: where the config and the log are written.
    """

    def __init__(self, upstream: str, overrides: dict[str, Any], workdir: Path) -> None:
        self.upstream = upstream
        self.overrides = overrides
        self.workdir = workdir
        self.port = 0
        self.url = ""
        self.log_path = workdir / "loopguard.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._read = 0

    def start(self) -> str:
        """Write the config, start the process and wait until it answers; returns :attr:`url`.

        Raises:
            RuntimeError: it exited or did not answer within :data:`STARTUP_TIMEOUT_S` seconds."""
        fd, cfg = tempfile.mkstemp(prefix="loopguard-arm-", suffix=".yaml", dir=self.workdir)
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(self.overrides or {}, f)
        self.port = _free_port()
        argv = [sys.executable, "-m", "proxy", "serve", "--upstream", self.upstream]
        argv += ["--port", str(self.port), "--config", cfg, "--log-format", "json"]
        with self.log_path.open("wb") as log:
            self._proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while self.status() is None:
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"loopguard did not start (log {self.log_path}):\n{tail}")
            time.sleep(0.2)
        self.url = f"http://127.0.0.1:{self.port}/v1"
        return self.url

    def stop(self) -> None:
        """SIGTERM the process, SIGKILL after 10 s."""
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=10)

    def status(self) -> dict[str, Any] | None:
        """``GET /loop-guard`` as JSON, or None when it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/loop-guard", timeout=2) as r:
                return json.loads(r.read())
        except (OSError, ValueError):
            return None

    async def request_lines(self, count: int, wait_s: float = 5.0) -> list[dict[str, Any]]:
        """The next ``count`` request log lines (those with ``actions``) not returned before, in
        order; fewer if they do not appear within ``wait_s`` seconds (a line is written when its
        answer has been relayed, which can be just after the agent has it)."""
        deadline = time.monotonic() + wait_s
        while True:
            lines = self._lines()
            if len(lines) - self._read >= count or time.monotonic() > deadline:
                out = lines[self._read : self._read + count]
                self._read += len(out)
                return out
            await asyncio.sleep(0.05)

    def _lines(self) -> list[dict[str, Any]]:
        """Every request log line so far."""
        out = []
        for raw in self.log_path.read_text(errors="replace").splitlines():
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            if isinstance(obj, dict) and "actions" in obj and "chat/completions" in str(obj.get("path")):
                out.append(obj)
        return out
