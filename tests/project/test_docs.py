"""The README stays short and the reference in docs/ stays whole: every page mkdocs.yml lists
exists, every page is listed, every relative link (README's into docs/, and the pages' own) names
a file and a heading that exist, and no text points at a tracker number instead of a reason.

`.ci/run` also builds the site with `mkdocs build --strict` (mkdocs.yml's `validation:` makes a
missing page or anchor an error); this test pins the same without mkdocs installed.
"""

from __future__ import annotations

import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
MKDOCS = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

#: What a new user needs first fits on one screenful or two; the rest is the reference in docs/.
README_MAX_LINES = 250


def _nav_pages(nav: list) -> list[str]:
    pages: list[str] = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages.extend(_nav_pages(value) if isinstance(value, list) else [value])
    return pages


NAV = _nav_pages(MKDOCS["nav"])
PAGES = sorted(DOCS.rglob("*.md"))


def _slug(heading: str) -> str:
    """An anchor as Python-Markdown's toc extension (mkdocs) writes it for a heading."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)  # inline code keeps its text
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _outside_code(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _anchors(path: Path) -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", _outside_code(path.read_text()), re.M)}


def _links(path: Path) -> list[str]:
    text = re.sub(r"`[^`\n]*`", "", _outside_code(path.read_text()))  # code spans hold no links
    return [m.group(1) for m in re.finditer(r"\]\(([^)\s]+)\)", text)]


def test_the_readme_is_short() -> None:
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move reference text into docs/"


def test_mkdocs_is_strict_and_validates_links_and_anchors() -> None:
    assert MKDOCS["strict"] is True
    assert MKDOCS["theme"]["name"] == "material"
    assert {k: MKDOCS["validation"][k] for k in ("unrecognized_links", "anchors")} == {
        "unrecognized_links": "warn",
        "anchors": "warn",
    }


@pytest.mark.parametrize("page", NAV)
def test_every_page_in_the_nav_exists(page: str) -> None:
    assert (DOCS / page).is_file(), page


def test_every_page_is_in_the_nav() -> None:
    assert sorted(str(p.relative_to(DOCS)) for p in PAGES) == sorted(NAV)


@pytest.mark.parametrize("source", [README, *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_names_a_file_and_a_heading_that_exist(source: Path) -> None:
    broken = []
    for link in _links(source):
        if re.match(r"[a-z]+:", link):  # http(s), mailto: not ours to check
            continue
        target, _, anchor = link.partition("#")
        path = (source.parent / target).resolve() if target else source
        if not path.exists():
            broken.append(f"{link}: no file {target}")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{link}: no heading #{anchor} in {path.relative_to(ROOT)}")
    assert not broken, broken


def test_the_readme_points_into_docs_with_relative_links() -> None:
    links = _links(README)
    assert any(link.startswith("docs/") for link in links)
    assert not [link for link in links if link.startswith("/")], "absolute links break on GitHub"


@pytest.mark.parametrize("source", [README, *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_no_text_points_at_a_tracker_number(source: Path) -> None:
    """Say the reason itself: a reader cannot look up "issue 10"."""
    hits = re.findall(r"[^\n]{0,30}\bissues? #?\d+[^\n]{0,30}", source.read_text(), re.I)
    assert not hits, hits


def _readme_block(after: str) -> str:
    text = README.read_text()
    block = re.search(r"```sh\n(.*?)```", text[text.index(after) :], re.S)
    assert block is not None, after
    return block.group(1).strip()


def test_the_readme_install_and_run_command_is_one_the_cli_takes() -> None:
    """The quick start's first command installs the project and runs `loopguard serve`: the
    console script exists and `serve` takes the flag it passes."""
    command = _readme_block("install and run the proxy")
    install, serve = command.split(" && .venv/bin/loopguard ")
    assert install == "python3 -m venv .venv && .venv/bin/pip install -e ."
    scripts = (ROOT / "pyproject.toml").read_text().split("[project.scripts]")[1]
    assert re.match(r'\s*loopguard = "proxy\.cli\.main:main"', scripts)
    argv = serve.split()
    assert argv[:2] == ["serve", "--upstream"]
    shown = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "--upstream" in shown


def test_the_readme_demo_command_is_one_the_cli_takes() -> None:
    assert _readme_block("the demo") == ".venv/bin/loopguard demo"
    subprocess.run([sys.executable, "-m", "proxy", "demo", "--help"], capture_output=True, check=True)
