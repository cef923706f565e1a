"""`loopguard demo` shows the loop being caught; the shipped config files load and mean what they say."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.cli.demo import changes, invoked_as, run_demo
from proxy.cli.main import main
from proxy.config import Config, build, load_config

ROOT = Path(__file__).resolve().parents[2]


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
        elif "loopguard ended the turn" in line:
            events.append((step, "stopped"))
    return events


async def test_demo_prints_reminders_at_3_5_the_ladder_withholds_6_and_stops_7(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The scripted model would loop 20 times; with the defaults the escalation ladder withholds
    the 6th result (2 reminders ignored, the same result again) and ends the agent's loop at its
    7th call."""
    assert await run_demo(Config()) == 0
    out = capsys.readouterr().out
    assert _events(out) == [(3, "injected"), (5, "injected"), (6, "withheld"), (7, "stopped")]
    assert "| - consecutive_calls: 5" in out
    assert out.count('assistant calls read_file {"path": "config.yaml"}') == 6
    assert 'step 7  the model called read_file {"path": "config.yaml"} again' in out
    assert "| [loopguard] The result of this call is withheld: you were reminded 2 times that your" in out
    assert "| [loopguard] Stopped: the model kept calling read_file after 2 reminders and a withheld" in out
    assert "assistant: I read config.yaml several times" not in out
    assert '"reminders_injected":2' in out
    assert '"results_withheld":1' in out
    assert '"stops":1' in out
    assert '"per_rule":{"escalation":1,"repeat_reminder":2,"stop":1}' in out


@pytest.mark.parametrize(
    ("argv0", "command"),
    [
        (".venv/bin/loopguard", ".venv/bin/loopguard"),
        ("/home/u/loopguard/.venv/bin/loopguard", "/home/u/loopguard/.venv/bin/loopguard"),
        ("loopguard", "loopguard"),  # an activated venv
        ("/home/u/loopguard/proxy/__main__.py", ".venv/bin/loopguard"),  # python -m proxy
    ],
)
def test_the_demos_next_line_names_loopguard_as_it_was_run(argv0: str, command: str) -> None:
    assert invoked_as(argv0) == command


async def test_demo_without_the_ladder_reminds_at_3_5_8_denies_from_7_and_stops_at_9(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With the escalation ladder off, the circuit breaker's denials and the stop after 2 ignored
    denials end the loop at the 9th call."""
    assert await run_demo(build(Config, {"guards": {"escalation": {"enabled": False}}})) == 0
    out = capsys.readouterr().out
    assert _events(out) == [
        (3, "injected"),
        (5, "injected"),
        (7, "withheld"),
        (8, "withheld"),
        (8, "injected"),
        (9, "stopped"),
    ]
    assert "| [loopguard] Stopped: the model kept calling read_file (9 times) and ignored 2" in out
    assert '"per_rule":{"circuit_breaker":2,"repeat_reminder":3,"stop":1}' in out


async def test_demo_without_the_stop_runs_until_the_model_gives_up(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cfg = build(Config, {"stop": {"after_ignored_denials": 0}, "guards": {"escalation": {"stop": False}}})
    await run_demo(cfg, steps=9)
    out = capsys.readouterr().out
    assert _events(out)[-1] == (9, "withheld")
    assert out.count('assistant calls read_file {"path": "config.yaml"}') == 9
    assert "assistant: I read config.yaml several times" in out
    assert '"stops":0' in out


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


@pytest.mark.parametrize("profile", sorted(p.name for p in (ROOT / "config/profiles").glob("dsh-*.yaml")))
def test_seed_profiles_have_no_response_side(profile: str) -> None:
    """The seeds only rewrote requests: no stop, no runaway or degenerate-text cut."""
    cfg = load_config(ROOT / "config/profiles" / profile)
    assert (cfg.stop.after_ignored_denials, cfg.stop.on_cap) == (0, False)
    r = cfg.response
    assert (r.max_calls_per_response, r.max_identical_per_response, r.max_identical_reads_per_response) == (
        0,
        0,
        0,
    )
    assert cfg.response.degenerate_text.enabled is False
