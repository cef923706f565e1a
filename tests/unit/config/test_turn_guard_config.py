"""guards.turn_guard configuration (DESIGN §6.3): defaults, validation naming the key, the seed profile."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proxy.cli.main import main
from proxy.config import Config, TurnGuardConfig, build, load_config
from proxy.core.failures import DEFAULT_FAILURE_PATTERNS
from proxy.errors import ConfigError
from proxy.guards import build_guards

ROOT = Path(__file__).resolve().parents[3]


def turn(settings: dict[str, Any]) -> TurnGuardConfig:
    return build(Config, {"guards": {"turn_guard": settings}}).guards.turn_guard


def test_defaults() -> None:
    assert TurnGuardConfig() == TurnGuardConfig(
        enabled=False,
        max_same_target=6,
        max_same_call=3,
        max_failures=5,
        max_calls_per_turn=40,
        mute_after_trip=True,
        targets={},
        failure_patterns=DEFAULT_FAILURE_PATTERNS,
        narrate_after_ms=180_000,
        narrate_every_ms=240_000,
    )


def test_valid_settings_are_kept() -> None:
    cfg = turn(
        {
            "enabled": True,
            "max_same_target": 0,
            "max_same_call": 2,
            "max_failures": 1,
            "max_calls_per_turn": 0,
            "mute_after_trip": False,
            "targets": {"search": ["query", "q"], "mcp__*": []},
            "failure_patterns": ["(?i)^fail", r"exit \d+"],
            "narrate_after_ms": 0,
            "narrate_every_ms": 0,
        }
    )
    assert cfg.targets == {"search": ("query", "q"), "mcp__*": ()}
    assert cfg.failure_patterns == ("(?i)^fail", r"exit \d+")
    assert (cfg.max_same_target, cfg.max_same_call, cfg.max_calls_per_turn) == (0, 2, 0)


@pytest.mark.parametrize(
    ("settings", "key", "message"),
    [
        ({"max_same_target": 1}, "guards.turn_guard.max_same_target", "must be 0 (off) or an integer >= 2"),
        ({"max_same_target": -1}, "guards.turn_guard.max_same_target", "must be 0 (off) or an integer >= 2"),
        ({"max_same_call": 1}, "guards.turn_guard.max_same_call", "must be 0 (off) or an integer >= 2"),
        ({"max_failures": -1}, "guards.turn_guard.max_failures", "must be an integer >= 0 (0 = off)"),
        (
            {"max_calls_per_turn": -5},
            "guards.turn_guard.max_calls_per_turn",
            "must be an integer >= 0 (0 = off)",
        ),
        ({"narrate_after_ms": -1}, "guards.turn_guard.narrate_after_ms", "must be an integer >= 0 (0 = off)"),
        ({"narrate_every_ms": -1}, "guards.turn_guard.narrate_every_ms", "must be an integer >= 0 (0 = off)"),
        ({"max_failures": 2.5}, "guards.turn_guard.max_failures", "must be an integer, got 2.5"),
        ({"max_same_call": True}, "guards.turn_guard.max_same_call", "must be an integer, got True"),
        ({"mute_after_trip": "yes"}, "guards.turn_guard.mute_after_trip", "must be a boolean, got 'yes'"),
        ({"enabled": 1}, "guards.turn_guard.enabled", "must be a boolean, got 1"),
        ({"narrate_after_ms": "3m"}, "guards.turn_guard.narrate_after_ms", "must be an integer, got '3m'"),
        ({"targets": ["path"]}, "guards.turn_guard.targets", "must be a mapping, got list"),
        ({"targets": {"x": "path"}}, "guards.turn_guard.targets.x", "must be a list, got str"),
        ({"targets": {"x": ["path", 3]}}, "guards.turn_guard.targets.x[1]", "must be a string, got 3"),
        (
            {"targets": {"x": ["path", ""]}},
            "guards.turn_guard.targets.x[1]",
            "argument names must not be empty",
        ),
        ({"targets": {"": ["path"]}}, "guards.turn_guard.targets", "tool names must not be empty"),
        ({"failure_patterns": "Error"}, "guards.turn_guard.failure_patterns", "must be a list, got str"),
        ({"failure_patterns": ["ok", 7]}, "guards.turn_guard.failure_patterns[1]", "must be a string, got 7"),
        (
            {"failure_patterns": ["^Error", "(unclosed"]},
            "guards.turn_guard.failure_patterns[1]",
            "is not a valid regular expression: missing ), unterminated subpattern at position 0",
        ),
        (
            {"failure_patterns": ["x", "y", "fail|"]},
            "guards.turn_guard.failure_patterns[2]",
            "is rejected: it matches an empty result, so every result would be a failure",
        ),
        (
            {"max_same_targets": 6},
            "guards.turn_guard.max_same_targets",
            "unknown key (did you mean 'max_same_target'?)",
        ),
        (
            {"narrate_after_s": 180},
            "guards.turn_guard.narrate_after_s",
            "unknown key (did you mean 'narrate_after_ms'?)",
        ),
    ],
)
def test_invalid_settings_name_the_key(settings: dict[str, Any], key: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        turn(settings)
    assert (e.value.key, e.value.message) == (key, message)
    assert str(e.value) == f"{key}: {message}"


def test_seed_profile_enables_only_the_turn_guard_with_the_seed_numbers() -> None:
    path = ROOT / "config/profiles/dsh-loop-guard.yaml"
    cfg = load_config(path)
    assert cfg.guards.turn_guard == TurnGuardConfig(
        enabled=True,
        max_same_target=6,
        max_same_call=3,
        max_failures=5,
        max_calls_per_turn=40,
        mute_after_trip=True,
        narrate_after_ms=180_000,
        narrate_every_ms=240_000,
        progress_aware=False,  # the seed compares arguments only
    )
    assert (cfg.guards.repeat_reminder.enabled, cfg.guards.circuit_breaker.enabled) == (False, False)
    assert [g.name for g in build_guards(cfg.guards)] == ["turn_guard", "narration"]
    assert main(["check-config", str(path)]) == 0


def test_shipped_default_documents_every_turn_guard_key_and_keeps_it_off() -> None:
    text = (ROOT / "config/loopguard.yaml").read_text()
    block = text[text.index("  turn_guard:\n") :]
    for name in TurnGuardConfig.__dataclass_fields__:
        assert f"\n    {name}:" in block, name
    assert load_config(ROOT / "config/loopguard.yaml").guards.turn_guard == TurnGuardConfig()
    assert TurnGuardConfig().enabled is False
