"""The package's layering holds: each layer imports only the layers below it, and no package has a
cycle among its modules (the contracts in ``.importlinter``, checked by import-linter).

The layers, top to bottom: ``cli`` (entry points) → ``edge`` (aiohttp: the server, forwarding,
logs, metrics, incidents) → ``request`` | ``response`` (independent of each other) → ``guards``
→ ``dialects`` → ``core`` → ``config`` → ``errors``.
"""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: import-linter's ``lint-imports`` command, run by the venv's own Python from the project root
#: (so the ``proxy`` it reads is this checkout's).
LINT = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
LAYERS = [
    "proxy.cli",
    "proxy.edge",
    "proxy.request | proxy.response",
    "proxy.guards",
    "proxy.dialects",
    "proxy.core",
    "proxy.config",
    "proxy.errors",
]


def lint_imports() -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", LINT, "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_layer_contract_lists_every_layer_top_to_bottom() -> None:
    contracts = configparser.ConfigParser()
    contracts.read(ROOT / ".importlinter")
    layers = contracts["importlinter:contract:layers"]["layers"].split("\n")
    assert [line.strip() for line in layers if line.strip()] == LAYERS


def test_every_top_level_package_is_a_layer() -> None:
    packages = sorted(p.name for p in (ROOT / "proxy").iterdir() if (p / "__init__.py").is_file())
    modules = sorted(p.stem for p in (ROOT / "proxy").glob("*.py") if p.stem not in ("__init__", "__main__"))
    named = {name.split(".")[1] for layer in LAYERS for name in layer.split(" | ")}
    assert sorted(set(packages) | set(modules)) == sorted(named)


def test_no_import_runs_back_up_and_no_package_has_a_cycle() -> None:
    done = lint_imports()
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken." in done.stdout
