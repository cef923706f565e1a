"""`loopguard demo` shows the loop being caught; the shipped config files load and mean what they say."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.cli import main
from proxy.config import Config, load_config
from proxy.demo import changes, run_demo

ROOT = Path(__file__).resolve().parent.parent


def _events(out: str) -> list[tuple[int, str]]:
    """(step, what) pairs: what the proxy did after each step, in printed order."""
    events: list[tuple[int, str]] = []
    step = 0
    for line in out.splitlines():
        if line.startswith("step "):
            step = int(line.split()[1])
        elif "loopguard injected" in line:
            events.append((step, "injected"))
        elif "loopguard withheld" in line:
            events.append((step, "withheld"))
    return events


async def test_demo_prints_reminders_at_3_5_8_and_denials_from_7(capsys: pytest.CaptureFixture[str]) -> None:
    assert await run_demo(Config(), steps=9) == 0
    out = capsys.readouterr().out
    assert _events(out) == [
        (3, "injected"),
        (5, "injected"),
        (7, "withheld"),
        (8, "withheld"),
        (8, "injected"),
        (9, "withheld"),
    ]
    assert "| - consecutive_calls: 5" in out
    assert "| - consecutive_calls: 8" in out
    assert out.count('assistant calls read_file {"path": "config.yaml"}') == 9
    assert "assistant: I read config.yaml several times" in out
    assert '"reminders_injected":3' in out
    assert '"results_withheld":3' in out


async def test_demo_with_reminder_only_profile_withholds_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = load_config(ROOT / "config/profiles/dsh-repeat-tool-guard.yaml")
    await run_demo(cfg, steps=9)
    assert _events(capsys.readouterr().out) == [(3, "injected"), (5, "injected"), (8, "injected")]


def test_demo_changes_finds_injected_and_withheld_messages() -> None:
    sent = [
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "tool", "tool_call_id": "a", "content": "result"},
    ]
    received = [sent[0], sent[1], {"role": "tool", "tool_call_id": "a", "content": "denied"}]
    received.append({"role": "user", "content": "reminder"})
    assert changes(sent, received) == [(2, "withheld", "denied"), (3, "injected", "reminder")]


def test_shipped_default_config_equals_builtin_defaults() -> None:
    assert load_config(ROOT / "config/loopguard.yaml") == Config()


@pytest.mark.parametrize(
    ("profile", "reminder_on", "breaker_on", "ignore_args"),
    [
        ("dsh-repeat-tool-guard.yaml", True, False, ()),
        ("dsh-circuit-breaker.yaml", False, True, None),
    ],
)
def test_seed_profiles_enable_exactly_their_guard(
    profile: str, reminder_on: bool, breaker_on: bool, ignore_args: tuple[str, ...] | None
) -> None:
    cfg = load_config(ROOT / "config/profiles" / profile)
    assert cfg.guards.repeat_reminder.enabled is reminder_on
    assert cfg.guards.circuit_breaker.enabled is breaker_on
    if ignore_args is not None:
        assert cfg.guards.repeat_reminder.ignore_args == ignore_args
    assert main(["check-config", str(ROOT / "config/profiles" / profile)]) == 0
