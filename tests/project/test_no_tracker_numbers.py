"""No text in the project points at a tracker number: code, tests, docs and config say the reason
itself or name a DESIGN.md section, since nobody outside the project's tracker can follow
"issue 14, item 6".

Checked: every tracked ``.py``, ``.md``, ``.yaml``/``.yml``, ``.toml``, ``.ini`` file and the CI
script; the pattern is ``issue``/``issues`` (any case) followed by a number, ``issue-<n>``, or
``defect <n>``.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRACKER = re.compile(r"\bissues? #?\d|\bissue-\d|\bdefect \d", re.IGNORECASE)
SUFFIXES = (".py", ".md", ".yaml", ".yml", ".toml", ".ini", ".cfg")
#: This file states the pattern it forbids; the docs test quotes an example of it.
SELF = {"tests/project/test_no_tracker_numbers.py", "tests/project/test_docs.py"}


def tracked_text_files() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    names = out.splitlines()
    return [f for f in names if f.endswith(SUFFIXES) or f.startswith(".ci/") or f == ".importlinter"]


def test_the_pattern_finds_what_it_forbids() -> None:
    hits = ["see issue 14", "(Issue 7, item 2)", "issues 4 and 10", "issue-7 rules", "defect 11"]
    assert [bool(TRACKER.search(s)) for s in hits] == [True] * 5
    assert not TRACKER.search("an issue with the stream; issued 3 calls; tissue 4")


def test_no_tracked_text_names_a_tracker_number() -> None:
    found = []
    for name in tracked_text_files():
        if name in SELF or not (ROOT / name).is_file():
            continue
        for n, line in enumerate((ROOT / name).read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if TRACKER.search(line):
                found.append(f"{name}:{n}: {line.strip()[:100]}")
    assert found == []
