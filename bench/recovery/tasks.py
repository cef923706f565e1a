"""The toy tasks: small repositories with one bug each and a ``test.py`` that fails until it is fixed.

Each task is a prompt and a set of files; :func:`make_repo` writes one into a fresh temporary
directory. The task is solved when ``python test.py`` exits 0 there (:func:`solved`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: Seconds ``python test.py`` may run before it is killed (a model-written endless loop).
RUN_TIMEOUT_S = 10.0

_TEST_HEAD = "import sys\n\n"
_TEST_TAIL = '\nprint("OK: all tests passed")\n'


@dataclass(frozen=True)
class Task:
    """One toy task: ``name``, the user ``prompt``, and ``files`` (relative path -> text)."""

    name: str
    prompt: str
    files: dict[str, str]


def _task(name: str, module: str, source: str, test: str) -> Task:
    """A task whose bug is in ``module``.py (``source``) and whose ``test.py`` body is ``test``."""
    return Task(
        name=name,
        prompt=f"The test in test.py fails. Find the bug in {module}.py and fix it so that "
        "`python test.py` passes.",
        files={
            f"{module}.py": source,
            "test.py": _TEST_HEAD + test + _TEST_TAIL,
            "README.md": f"# {name}\n\nRun `python test.py` to check {module}.py.\n",
        },
    )


TASKS: tuple[Task, ...] = (
    _task(
        "add",
        "calc",
        "def add(a, b):\n    return a - b\n",
        "from calc import add\n\nassert add(2, 3) == 5, add(2, 3)\n",
    ),
    _task(
        "greet",
        "greet",
        'def greet(name):\n    return "Hello " + name\n',
        'from greet import greet\n\nassert greet("Ada") == "Hello, Ada!", greet("Ada")\n',
    ),
    _task(
        "biggest",
        "listtools",
        "def biggest(xs):\n    return min(xs)\n",
        "from listtools import biggest\n\nassert biggest([3, 9, 4]) == 9, biggest([3, 9, 4])\n",
    ),
    _task(
        "words",
        "words",
        "def count_words(text):\n    return len(text)\n",
        'from words import count_words\n\nassert count_words("a b c") == 3, count_words("a b c")\n',
    ),
)


def make_repo(task: Task, parent: Path | None = None) -> Path:
    """Write ``task``'s files into a new temporary directory (under ``parent``) and return it."""
    root = Path(tempfile.mkdtemp(prefix=f"recovery-{task.name}-", dir=parent))
    for rel, text in task.files.items():
        (root / rel).write_text(text)
    return root


def run_python(root: Path, rel: str, timeout_s: float = RUN_TIMEOUT_S) -> tuple[int, str]:
    """Run ``python rel`` in ``root``: ``(exit code, stdout+stderr)`` with ``root`` left out of
    the paths in it; exit code 124 on timeout."""
    try:
        # -B: no bytecode cache (a rewrite of the same size within a second would import the
        # stale one).
        proc = subprocess.run(
            [sys.executable, "-E", "-s", "-B", rel],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout_s:g} s"
    # A traceback names the temporary directory: without it, the same call gets the same result
    # in every arm (the paired arms' requests stay byte-identical).
    here = str(root.resolve())
    return proc.returncode, (proc.stdout + proc.stderr).replace(here + os.sep, "").replace(here, ".")


def solved(task: Task, root: Path) -> bool:
    """True if ``test.py`` is still the task's own (a model may rewrite it) and ``python test.py``
    exits 0 in ``root``."""
    test = root / "test.py"
    return (
        test.is_file() and test.read_text() == task.files["test.py"] and run_python(root, "test.py")[0] == 0
    )
