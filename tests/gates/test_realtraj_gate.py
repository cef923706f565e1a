"""Real-runs gate (DESIGN §2.2): recorded agent runs replayed through the real server.

The runs are third-party data read where they lie (``../shared/fixtures/realtraj`` from the project
root, or ``$LOOPGUARD_REALTRAJ``); without them the gate tests are skipped, saying where they were
looked for. Each run is replayed with the shipped default config, as JSON and as SSE
(:mod:`tests.helpers.realtraj`). Run with ``-s`` to see the table. Two gates, each its own test so that
each failure shows on its own: no ``resolved`` run is blocked (and the proxy never fails open),
and every reminder says only true things about the history before it (all runs).

The harness pieces that need no data are tested below: the table on hand-made replays (each
reminder-fact checker has its hand-written histories in ``tests/unit/core/test_reminder_facts.py``).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from tests.helpers.corpus import Observation, Reminder, Replay, compare
from tests.helpers.realtraj import (
    ENV,
    OUTCOMES,
    fact_violations,
    gate_failures,
    load_runs,
    replay_runs,
    runs_dir,
    table,
)
from tests.unit.core.test_reminder_facts import GENTLE, LS, RECURRENCE, _history

RUNS_DIR = runs_dir()
_REPLAYS: dict[bool, list[Replay]] = {}


@pytest.fixture(scope="module")
def runs() -> list[dict[str, Any]]:
    if not RUNS_DIR.is_dir():
        pytest.skip(f"no real runs: {RUNS_DIR} does not exist (set ${ENV} to the runs' directory)")
    found = load_runs(RUNS_DIR)
    if not found:
        pytest.skip(f"no real runs: no *.json in {RUNS_DIR} (set ${ENV} to the runs' directory)")
    return found


def _replays(runs: list[dict[str, Any]], stream: bool) -> list[Replay]:
    """The runs replayed once per mode (both gate tests read the same replays)."""
    if stream not in _REPLAYS:
        _REPLAYS[stream] = asyncio.run(replay_runs(runs, stream))
    return _REPLAYS[stream]


def test_runs_have_the_documented_fields(runs: list[dict[str, Any]]) -> None:
    for run in runs:
        assert run["outcome"] in OUTCOMES, run["id"]
        assert run["messages"] and isinstance(run.get("tools"), list), run["id"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_no_resolved_run_is_blocked(runs: list[dict[str, Any]], stream: bool) -> None:
    replays = _replays(runs, stream)
    print(f"\nreal-runs gate ({'sse' if stream else 'json'}), default config:\n{table(replays)}")
    failures = gate_failures(replays)
    assert not failures, "; ".join(failures)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_every_reminder_says_only_true_things(runs: list[dict[str, Any]], stream: bool) -> None:
    untrue = [v.describe() for r in _replays(runs, stream) for v in fact_violations(r)]
    assert not untrue, f"{len(untrue)} untrue reminder claims:\n" + "\n".join(untrue)


def test_the_runs_in_gemini_form_get_the_same_decisions_as_in_chat_form(runs: list[dict[str, Any]]) -> None:
    """Every run converted to Gemini contents (:class:`tests.helpers.corpus.GeminiWire`) and replayed on
    ``:generateContent``: the same actions at the same calls, by the same rules, with the same
    reminder texts, as in chat form (so the precision and facts gates hold in Gemini form too)."""
    chat = _replays(runs, False)
    got = asyncio.run(replay_runs(runs, False, "gemini"))
    differences = compare(chat, got)
    assert not differences, f"{len(differences)} of {len(runs)} runs differ:\n" + "\n".join(differences)
    texts = [[(m.call, m.upto, m.text) for m in r.reminders] for r in got]
    assert texts == [[(m.call, m.upto, m.text) for m in r.reminders] for r in chat]
    assert not gate_failures(got)


# --- the table ------------------------------------------------------------------------------------------


def _run(rid: str, outcome: str, calls: int) -> dict[str, Any]:
    return {"id": rid, "outcome": outcome, "messages": _history(*[LS] * calls)}


def test_table_on_hand_made_replays() -> None:
    ok = Replay(_run("mini-a", "resolved", 10), False)
    ok.observations.append(Observation("remind", 4, 9, "request", ("repeat_reminder",)))
    ok.reminders.append(Reminder(GENTLE, 4, 9, 9, ("repeat_reminder",)))
    blocked = Replay(_run("mini-b", "resolved", 10), False)
    blocked.observations += [
        Observation("withhold", 9, 17, "request", ("circuit_breaker",)),
        Observation("remind", 3, 5, "request", ("recurrence",)),
    ]
    blocked.reminders.append(Reminder(RECURRENCE.format(n=3, m=4), 3, 5, 6, ("recurrence",)))
    stuck = Replay(_run("coder-c", "exit_cost", 20), False)
    stuck.observations += [
        Observation("stop", 12, 23, "response", ("stop",)),
        Observation("cut", 15, 29, "response", ("runaway",)),
    ]
    stuck_too = Replay(_run("mini-d", "unresolved", 30), False, internal_errors=2)
    stuck_too.observations.append(Observation("withhold", 10, 19, "request", ("cycles",)))
    other = Replay(_run("coder-e", "instance_resolved", 5), False)
    other.observations.append(Observation("cut", 5, 9, "response", ("runaway",)))
    replays = [ok, blocked, stuck, stuck_too, other]
    lines = table(replays).splitlines()
    rows = [re.split(r"\s{2,}", line) for line in lines[:6]]
    assert rows == [
        ["id", "outcome", "calls", "reminders", "first reminder", "first block", "calls left", "verdict"],
        ["mini-a", "resolved", "10", "1", "call 4 repeat_reminder", "-", "-", "PASS"],
        [
            *("mini-b", "resolved", "10", "1", "call 3 recurrence", "call 9 circuit_breaker withhold", "1"),
            "FAIL (blocked: call 9 circuit_breaker withhold); 1 untrue reminder claim(s)",
        ],
        ["coder-c", "exit_cost", "20", "0", "-", "call 12 stop stop", "8", "not gated"],
        [
            *("mini-d", "unresolved", "30", "0", "-", "call 10 cycles withhold", "20"),
            "FAIL (the proxy failed open 2 times)",
        ],
        ["coder-e", "instance_resolved", "5", "0", "-", "call 5 runaway cut", "0", "not gated"],
    ]
    starts = {tuple(m.start() for m in re.finditer(r"(?:^|(?<=  ))\S", line)) for line in lines[:6]}
    assert len(starts) == 1, "columns are aligned"
    assert lines[6:] == [
        "",
        "resolved runs blocked: 1 of 2",
        "reminders per 100 calls on resolved runs: 10.0 (2 reminders, 20 calls)",
        "exit_cost/unresolved runs blocked: 2 of 2; median calls left after the first block: 14",
        "untrue reminder claims: 1 in 2 reminders",
    ]
    assert gate_failures(replays) == [
        "mini-b: blocked: call 9 circuit_breaker withhold",
        "mini-d: the proxy failed open 2 times",
    ]
    assert [v.describe() for r in replays for v in fact_violations(r)] == [
        "mini-b call 3 recurrence: in your last 4 calls: only 3 tool calls before it"
        " (reminder: '[loopguard] You keep coming back to the same tool call: bash')"
    ]
