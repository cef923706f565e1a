"""A config file written to hurt (DESIGN §8): a YAML alias bomb is refused before it is expanded,
at start and on reload alike (:func:`proxy.config.load.read`), and a regular expression with
nested quantifiers, which backtracks exponentially on text that almost matches, is refused
naming its key (:func:`proxy.config.checks.nested_quantifier`) in every list of patterns the
guards search with: ``progress.masks``, ``progress.continuation_patterns``,
``guards.turn_guard.failure_patterns``, ``guards.repeated_failure.rejection_patterns``.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest

from proxy.cli.main import main
from proxy.config import Config, build, load_config
from proxy.config.checks import NESTED_QUANTIFIERS, nested_quantifier
from proxy.config.load import MAX_ALIASES, MAX_NODES, read
from proxy.errors import ConfigError


def bomb(levels: int = 8, width: int = 10) -> str:
    """The "billion laughs" document: ``width ** levels`` strings in about 300 bytes."""
    names = "abcdefghij"[:levels]
    lines = [f"a: &a [{','.join(['lol'] * width)}]"]
    lines += [f"{n}: &{n} [{','.join([f'*{p}'] * width)}]" for p, n in itertools.pairwise(names)]
    lines.append(f"listen: *{names[-1]}")
    return "\n".join(lines) + "\n"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "loopguard.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_an_alias_bomb_is_refused_before_it_is_expanded(tmp_path: Path) -> None:
    path = write(tmp_path, bomb())
    assert len(path.read_bytes()) < 330
    started = time.perf_counter()
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert time.perf_counter() - started < 1.0  # expanding it took 70 s and 1.2 GB
    assert exc.value.key == "<file>"
    assert str(exc.value) == (
        f"<file>: {path} expands to more than {MAX_NODES} YAML nodes through its aliases "
        "(an alias bomb?); refused unread"
    )


def test_more_aliases_than_the_budget_are_refused_naming_the_count(tmp_path: Path) -> None:
    many = MAX_ALIASES + 1
    path = write(tmp_path, "x: &x 1\nprogress:\n  masks: [" + ", ".join(["*x"] * many) + "]\n")
    with pytest.raises(ConfigError) as exc:
        read(path)
    assert (
        str(exc.value) == f"<file>: {path} uses {many} YAML aliases (at most {MAX_ALIASES}); refused unread"
    )


def test_a_document_just_under_the_node_budget_and_a_few_aliases_are_read(tmp_path: Path) -> None:
    # a shared list used twice: aliases are fine in moderation
    text = "guards:\n  repeat_reminder:\n    exclude: &quiet [todo_write, think]\n"
    text += "  circuit_breaker:\n    exempt: *quiet\n"
    cfg = load_config(write(tmp_path, text))
    assert cfg.guards.repeat_reminder.exclude == cfg.guards.circuit_breaker.exempt == ("todo_write", "think")
    # 10 * 10 * 10 * 10 strings (11,111 nodes with the lists) under the budget: read
    assert isinstance(read(write(tmp_path, bomb(levels=4))), dict)


def test_the_shipped_config_is_far_under_the_budget() -> None:
    root = Path(__file__).resolve().parents[3]
    for path in [root / "config" / "loopguard.yaml", *sorted((root / "config" / "profiles").glob("*.yaml"))]:
        load_config(path)


# --- nested quantifiers ---------------------------------------------------------------------------

NESTED = [
    pytest.param(r"(a+)+$", id="plus-plus"),
    pytest.param(r"(\w+\s?)+$", id="word-optional-space"),
    pytest.param(r"(?:x*y?){2,}", id="bounded-outer"),
    pytest.param(r"(.*a){20}", id="dot-star-counted"),
    pytest.param(r"((ab)*)+", id="group-star-plus"),
    pytest.param(r"(?i)(?:[A-Z]+o)+", id="separator-matched-ignoring-case"),
    pytest.param(r"(?:(?:ok|\s)[,.!]*\s*)*", id="branch-without-separator"),
    pytest.param(r"x(?=(\d+)+y)", id="in-a-lookahead"),
]
SAFE = [
    pytest.param(r"(\d+\.)+\d+", id="separated-by-a-literal"),
    pytest.param(r"(?:\s*,\s*\w+)*", id="separated-by-a-comma"),
    pytest.param(r"(?:(?:ok|yes)[,.!]*\s*)*", id="separated-by-words"),
    pytest.param(r"(?:[.,]\d+)?", id="optional-not-repeated"),
    pytest.param(r"(?:a+)?", id="optional-plus"),
    pytest.param(r"x+y+", id="no-nesting"),
    pytest.param(r"(?:ab){3}", id="fixed-inner"),
]


@pytest.mark.parametrize("pattern", NESTED)
def test_nested_quantifiers_are_found(pattern: str) -> None:
    assert nested_quantifier(pattern)


@pytest.mark.parametrize("pattern", SAFE)
def test_a_repeat_whose_iterations_are_separated_is_not_nested(pattern: str) -> None:
    assert not nested_quantifier(pattern)


def test_no_default_pattern_has_nested_quantifiers() -> None:
    cfg = Config()
    for patterns in (
        cfg.progress.masks,
        cfg.progress.continuation_patterns,
        cfg.guards.turn_guard.failure_patterns,
        cfg.guards.repeated_failure.rejection_patterns,
    ):
        assert [p for p in patterns if nested_quantifier(p)] == []


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"progress": {"masks": [r"\d+", r"(\w+\s?)+$"]}}, "progress.masks[1]"),
        ({"progress": {"continuation_patterns": [r"(a+)+"]}}, "progress.continuation_patterns[0]"),
        (
            {"guards": {"turn_guard": {"failure_patterns": [r"^(E\w*:?)+x"]}}},
            "guards.turn_guard.failure_patterns[0]",
        ),
        (
            {"guards": {"repeated_failure": {"rejection_patterns": [r"ok", r"x((ab)*)+"]}}},
            "guards.repeated_failure.rejection_patterns[1]",
        ),
    ],
    ids=["masks", "continuation_patterns", "failure_patterns", "rejection_patterns"],
)
def test_a_pattern_with_nested_quantifiers_is_refused_naming_its_key(data: dict, key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        build(Config, data)
    assert str(exc.value) == f"{key}: {NESTED_QUANTIFIERS}"


def test_check_config_names_the_mask_and_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, 'progress:\n  masks: ["\\\\d+ ms", "(\\\\w+\\\\s?)+$"]\n')
    assert main(["check-config", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"loopguard: invalid configuration: progress.masks[1]: {NESTED_QUANTIFIERS}\n"


def test_check_config_refuses_an_alias_bomb(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, bomb())
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"loopguard: invalid configuration: <file>: {path} expands to more than {MAX_NODES} YAML "
        "nodes through its aliases (an alias bomb?); refused unread\n"
    )
