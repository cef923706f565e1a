"""The README's test command is the one CI runs, and it provides everything a test skips
without: the three agent CLIs the harness tests drive, and the system tools some tests need."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CI = (ROOT / ".ci" / "run").read_text()
README = (ROOT / "README.md").read_text()


def test_the_readme_names_the_ci_script_as_its_test_command() -> None:
    start = README.index("Install everything the tests need and run them all")
    block = re.search(r"```sh\n(.*?)```", README[start:], re.S)
    assert block is not None and block.group(1) == "bash .ci/run\n"
    assert '.venv/bin/python -m pytest "$@"' in CI  # its arguments go to pytest


@pytest.mark.parametrize(
    "variable",
    [
        "LOOPGUARD_CODEX",
        "LOOPGUARD_CLAUDE",
        "LOOPGUARD_QWEN",
        "LOOPGUARD_REALTRAJ",
        "LOOPGUARD_REALTRAJ_NATIVE",
    ],
)
def test_the_ci_script_sets_what_the_harness_tests_find_their_cli_or_data_by(variable: str) -> None:
    assert re.search(rf"^\s*export {variable}=", CI, re.M), variable


#: Tools on PATH that a test looks for and the CI script does not install: the venv's own
#: (ruff) and util-linux's (unshare, part of every Debian system).
NOT_INSTALLED = {"ruff", "unshare"}


def test_every_tool_a_test_skips_without_is_installed_by_the_ci_script() -> None:
    wanted = set()
    for path in (ROOT / "tests").rglob("*.py"):  # every test folder and tests/helpers
        wanted |= set(re.findall(r'shutil\.which\("([\w.-]+)"\)', path.read_text()))
    installed = set(re.findall(r"\|\| missing\+=\(([\w.-]+)\)", CI))
    assert wanted - NOT_INSTALLED == installed == {"redis-server", "strace", "valgrind"}
