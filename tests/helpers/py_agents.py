"""Python agents from PyPI run headless against loopguard: mini-swe-agent and smolagents.

Install: each into its own venv (never the project's: their dependency trees are large and pin
what the project does not), the version pinned in ``.ci/<name>-version``, under
``${LOOPGUARD_PY_AGENTS:-~/.cache/loopguard-py-agents}/<name>``; ``.ci/run`` does it and exports
``LOOPGUARD_MINI`` / ``LOOPGUARD_SMOLAGENT`` (the console scripts). Without them a test skips
with the command to run. The install needs PyPI only; at run time nothing leaves the machine:
litellm (mini's model layer) reads its bundled cost map (``LITELLM_LOCAL_MODEL_COST_MAP``), and
the environment holds no proxy and no real key.

:func:`run_agent` runs one console script in its own process group with exactly the given
environment (:func:`tests.helpers.agent_cli.run_cli`), so every process it starts is killed at the
timeout.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.agent_cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("LOOPGUARD_PY_AGENTS") or Path.home() / ".cache" / "loopguard-py-agents")


@dataclass(frozen=True)
class PyAgent:
    """``name``: the venv's folder and ``.ci/<name>-version``; ``package``: the PyPI requirement
    without its version; ``script``: the console script; ``env``: the variable ``.ci/run`` sets."""

    name: str
    package: str
    script: str
    env: str

    @property
    def version(self) -> str:
        return (ROOT / ".ci" / f"{self.name}-version").read_text().strip()

    def hint(self) -> str:
        return (
            f"python3 -m venv {CACHE / self.name} && {CACHE / self.name}/bin/pip install "
            f"'{self.package}=={self.version}' (what .ci/run does), or set {self.env}"
        )

    def installed(self, script: Path) -> str | None:
        """The version of ``package`` in the venv of ``script``, None when it does not run."""
        python = script.parent / "python"
        dist = self.package.split("[")[0]
        try:
            done = subprocess.run(
                [str(python), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        except OSError:
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    def find(self) -> str:
        """The console script: ``$<env>`` (must be the pinned version: a failure otherwise) or the
        one in the cache (skips when absent or another version)."""
        explicit = os.environ.get(self.env)
        if explicit:
            got = self.installed(Path(explicit))
            assert got == self.version, f"{self.env}={explicit} is {got}, want {self.version}"
            return explicit
        cached = CACHE / self.name / "bin" / self.script
        if not cached.exists():
            pytest.skip(f"{self.package} {self.version} not installed: {self.hint()}")
        got = self.installed(cached)
        if got != self.version:
            pytest.skip(f"{cached} is {self.package} {got}, the tests pin {self.version}: {self.hint()}")
        return str(cached)


MINI = PyAgent("mini-swe-agent", "mini-swe-agent", "mini", "LOOPGUARD_MINI")
SMOLAGENTS = PyAgent("smolagents", "smolagents[openai]", "smolagent", "LOOPGUARD_SMOLAGENT")

FAKE_KEY = "sk-loopguard-fake"


@dataclass
class AgentRun:
    returncode: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    seconds: float


def base_env(home: Path) -> dict[str, str]:
    """What every run gets: a fresh ``HOME``, no proxy, no real key, offline litellm."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "NO_PROXY": "*",
        "OPENAI_API_KEY": FAKE_KEY,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "HF_HUB_OFFLINE": "1",
        "TERM": "dumb",
        "COLUMNS": "200",
    }


async def run_agent(argv: list[str], workdir: Path, env: dict[str, str], timeout: float = 120) -> AgentRun:
    """``argv`` in ``workdir`` with exactly ``env``; the process group is killed at ``timeout``."""
    home = Path(env["HOME"])
    home.mkdir(parents=True, exist_ok=True)
    return AgentRun(*await run_cli(argv, workdir, env, timeout))
