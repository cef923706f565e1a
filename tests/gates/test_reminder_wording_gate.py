"""recovery.reminders on the gates' data (DESIGN §2.2): plain and redirect change what the texts
say, never what the proxy does. The loop fixtures, the recorded real runs and the native agent
sessions replayed through the real server (JSON: the texts are request side) with each style give
the same observations (kind, call, message, side, rules) and as many distinct reminders as quote
(the shipped default); the plain texts never carry the quoting field lines, and their claims
(:mod:`tests.helpers.reminder_facts`) are as true as quote's. Without the data the
tests are skipped, saying where it was looked for. Run with ``-s`` to see the totals."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from tests.helpers.corpus import Replay, default_config, load_fixtures
from tests.helpers.realtraj import ENV, fact_violations, load_runs, replay_runs, runs_dir
from tests.helpers.realtraj_native import load_sessions, replay_sessions, sessions_dirs

STYLES = ("quote", "plain", "redirect")
#: The lines only quote writes (the looping call's tool and arguments).
QUOTING = ("- tool:", "- arguments:", "- last arguments:", "- template:")


def config(style: str) -> dict[str, Any]:
    return {**default_config(), "recovery": {"reminders": style}}


def corpus(name: str) -> list[dict[str, Any]]:
    """The fixtures of ``name`` (``loops``, ``realtraj``), skipped when missing."""
    if name == "loops":
        return load_fixtures()
    directory = runs_dir()
    if not directory.is_dir() or not load_runs(directory):
        pytest.skip(f"no real runs in {directory} (set ${ENV})")
    return load_runs(directory)


def sessions() -> list[dict[str, Any]]:
    found = [s for _, d in sessions_dirs() if d.is_dir() for s in load_sessions(d)]
    if not found:
        pytest.skip("no native sessions: " + ", ".join(f"{d} (${env})" for env, d in sessions_dirs()))
    return found


def replays(name: str, style: str) -> list[Replay]:
    if name == "native":
        done = asyncio.run(replay_sessions(sessions(), False, config(style)))
        return [r for s in done for r in s.replays]
    return asyncio.run(replay_runs(corpus(name), False, "chat", config(style)))


def summary(done: Sequence[Replay]) -> Counter[str]:
    out: Counter[str] = Counter(o.kind for r in done for o in r.observations)
    out["reminder texts"] = sum(len(r.reminders) for r in done)
    out["requests"] = sum(r.requests for r in done)
    out["failed open"] = sum(r.internal_errors for r in done)
    return out


def what(r: Replay) -> list[tuple[str, int, int, str, tuple[str, ...]]]:
    return [(o.kind, o.call, o.message, o.side, o.rules) for o in r.observations]


@pytest.mark.parametrize("name", ["loops", "realtraj", "native"])
def test_the_styles_change_the_texts_and_nothing_else(name: str) -> None:
    by_style = {style: replays(name, style) for style in STYLES}
    quote = by_style["quote"]
    for style in STYLES:
        print(f"\n{name} {style}: {dict(sorted(summary(by_style[style]).items()))}")
    for style in ("plain", "redirect"):
        done = by_style[style]
        assert [what(r) for r in done] == [what(r) for r in quote], style
        assert [len(r.reminders) for r in done] == [len(r.reminders) for r in quote], style
        assert summary(done) == summary(quote), style
        quoting = [m.text[:80] for r in done for m in r.reminders if any(f in m.text for f in QUOTING)]
        assert not quoting, quoting
        # every claim of the plain texts (and of redirect's untried tools) holds where quote's do
        untrue = [v.describe() for r in done for v in fact_violations(r)]
        assert len(untrue) == sum(len(fact_violations(r)) for r in quote), untrue
        print(f"{name} {style}: {len(untrue)} untrue reminder claims")
