"""Configuration of the loop rules beyond exact repeats (recurrence, cycles, repeated_failure,
monologue, echo_loop): defaults, validation naming the key, the registry, the
shipped default file and the seed profiles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proxy.config import (
    DEFAULT_REJECTION_PATTERNS,
    Config,
    CyclesConfig,
    EchoLoopConfig,
    MonologueConfig,
    RecurrenceConfig,
    RepeatedFailureConfig,
    build,
    load_config,
)
from proxy.errors import ConfigError
from proxy.guards import build_guards

ROOT = Path(__file__).resolve().parents[3]
RULES = ("recurrence", "cycles", "repeated_failure", "monologue", "echo_loop")


def test_defaults() -> None:
    g = Config().guards
    assert g.recurrence == RecurrenceConfig(
        True, 3, 20, True, ("description", "explanation", "reason", "thought", "purpose")
    )
    assert g.cycles == CyclesConfig(True, 2, 5, 3, 4, True)
    assert g.repeated_failure == RepeatedFailureConfig(
        True,
        3,
        True,
        DEFAULT_REJECTION_PATTERNS,
        200,
        ("description", "explanation", "reason", "thought", "purpose"),
    )
    assert g.monologue == MonologueConfig(True, 3, 4)
    assert g.echo_loop == EchoLoopConfig(True, 3, 2)


def test_every_rule_is_registered_on_by_default_with_its_own_name() -> None:
    names = [getattr(g, "name", "") for g in build_guards(Config().guards)]
    assert [n for n in names if n in RULES] == list(RULES)


@pytest.mark.parametrize("rule", RULES)
def test_each_rule_can_be_turned_off(rule: str) -> None:
    cfg = build(Config, {"guards": {rule: {"enabled": False}}})
    names = [getattr(g, "name", "") for g in build_guards(cfg.guards)]
    assert rule not in names
    assert [n for n in names if n in RULES] == [r for r in RULES if r != rule]


@pytest.mark.parametrize(
    ("rule", "settings", "key", "message"),
    [
        ("recurrence", {"occurrences": 1}, "occurrences", "must be an integer >= 2"),
        ("recurrence", {"window": 2}, "window", "must be >= occurrences (3), got 2"),
        ("recurrence", {"occurrences": "3"}, "occurrences", "must be an integer, got '3'"),
        ("recurrence", {"windows": 20}, "windows", "unknown key (did you mean 'window'?)"),
        ("cycles", {"min_period": 1}, "min_period", "must be an integer >= 2"),
        ("cycles", {"max_period": 1}, "max_period", "must be >= min_period (2)"),
        ("cycles", {"max_period": 21}, "max_period", "must be <= 20"),
        ("cycles", {"repetitions": 1}, "repetitions", "must be an integer >= 2"),
        ("cycles", {"withhold_at": 3}, "withhold_at", "must be 0 (off) or > repetitions (3)"),
        ("cycles", {"withhold_at": -1}, "withhold_at", "must be 0 (off) or > repetitions (3)"),
        ("cycles", {"progress_aware": "yes"}, "progress_aware", "must be a boolean, got 'yes'"),
        ("repeated_failure", {"failures": 1}, "failures", "must be 0 (off) or an integer >= 2"),
        ("repeated_failure", {"error_preview_chars": 0}, "error_preview_chars", "must be an integer >= 1"),
        (
            "repeated_failure",
            {"rejection_patterns": ["ok", "(unclosed"]},
            "rejection_patterns[1]",
            "is not a valid regular expression: missing ), unterminated subpattern at position 0",
        ),
        (
            "repeated_failure",
            {"rejection_patterns": [".*"]},
            "rejection_patterns[0]",
            "is rejected: it matches an empty result, so every result would be a failure",
        ),
        ("monologue", {"repeats": 1}, "repeats", "must be an integer >= 2"),
        ("monologue", {"stop_at": 3}, "stop_at", "must be 0 (off) or > repeats (3)"),
        ("monologue", {"stop_at": -4}, "stop_at", "must be 0 (off) or > repeats (3)"),
        ("echo_loop", {"repeats": 0}, "repeats", "must be an integer >= 2"),
        ("echo_loop", {"min_literal_chars": 0}, "min_literal_chars", "must be an integer >= 1"),
    ],
)
def test_invalid_settings_name_the_key(rule: str, settings: dict[str, Any], key: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        build(Config, {"guards": {rule: settings}})
    assert (e.value.key, e.value.message) == (f"guards.{rule}.{key}", message)


@pytest.mark.parametrize(
    ("rule", "settings"),
    [
        ("recurrence", {"occurrences": 2, "window": 2, "progress_aware": False, "ignore_args": []}),
        ("cycles", {"min_period": 3, "max_period": 3, "repetitions": 2, "withhold_at": 0}),
        ("repeated_failure", {"failures": 0, "reissue": False, "rejection_patterns": []}),
        ("monologue", {"repeats": 2, "stop_at": 0}),
        ("echo_loop", {"repeats": 5, "min_literal_chars": 1}),
    ],
)
def test_valid_settings_are_kept(rule: str, settings: dict[str, Any]) -> None:
    cfg = getattr(build(Config, {"guards": {rule: settings}}).guards, rule)
    assert {k: getattr(cfg, k) for k in settings} == {
        k: tuple(v) if isinstance(v, list) else v for k, v in settings.items()
    }


def test_shipped_default_file_documents_the_rules_with_the_defaults() -> None:
    shipped = load_config(ROOT / "config" / "loopguard.yaml").guards
    for rule in RULES:
        assert getattr(shipped, rule) == getattr(Config().guards, rule)
    text = (ROOT / "config" / "loopguard.yaml").read_text()
    for rule in RULES:
        assert f"\n  {rule}:\n    enabled: true\n" in text


@pytest.mark.parametrize(
    "profile", sorted((ROOT / "config" / "profiles").glob("dsh-*.yaml")), ids=lambda p: p.stem
)
def test_seed_profiles_turn_the_rules_off(profile: Path) -> None:
    guards = load_config(profile).guards
    assert [getattr(guards, r).enabled for r in RULES] == [False] * len(RULES)
    assert not {getattr(g, "name", "") for g in build_guards(guards)} & set(RULES)
