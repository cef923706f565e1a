"""Real-runs gate (issue 10): recorded agent runs replayed through the real server.

The runs are third-party data read where they lie (``../shared/fixtures/realtraj`` from the project
root, or ``$LOOPGUARD_REALTRAJ``); without them the gate tests are skipped, saying where they were
looked for. Each run is replayed with the shipped default config, as JSON and as SSE
(:mod:`tests.realtraj`). Run with ``-s`` to see the table. Two gates, each its own test so that
each failure shows on its own: no ``resolved`` run is blocked (and the proxy never fails open),
and every reminder says only true things about the history before it (all runs).

The harness pieces that need no data are tested below: the table on hand-made replays, and each
reminder-fact checker on small hand-written histories (one true and one false case per text).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import orjson
import pytest

from tests.corpus import Observation, Reminder, Replay
from tests.realtraj import (
    ENV,
    OUTCOMES,
    fact_violations,
    gate_failures,
    load_runs,
    replay_runs,
    runs_dir,
    table,
)
from tests.reminder_facts import CHECKERS, check_reminder, checker_for

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


# --- hand-written histories ---------------------------------------------------------------------------


def _history(*calls: tuple[str, str, str], said: str | None = None) -> list[dict[str, Any]]:
    """A user message, then one assistant message per (tool, arguments JSON, result)."""
    out: list[dict[str, Any]] = [{"role": "user", "content": "fix it"}]
    for n, (name, args, result) in enumerate(calls, 1):
        call = {"id": f"c{n}", "type": "function", "function": {"name": name, "arguments": args}}
        out += [
            {"role": "assistant", "content": said, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": result},
        ]
    return out


LS = ("bash", '{"command": "ls", "reason": "look"}', "a.py\nb.py\nlisted at 2026-11-30T02:37:55Z")
LS_AT = ("bash", '{"command": "ls"}', "a.py\nb.py\nlisted at 2026-11-30T02:38:01Z")  # masked: the same
LS_NEW = ("bash", '{"command": "ls"}', "a.py\nb.py\nc.py")
PWD = ("bash", '{"command": "pwd"}', "/repo")

DETAILED = (
    "[loopguard] You are repeating the same tool call without making progress.\n"
    "- tool: bash\n"
    "- consecutive_calls: {n}\n"
    "- arguments: {args}\n"
    "Do not call this tool with these exact arguments again. Use the results you already have, "
    "try a different approach, or tell the user what is blocking you."
)
GENTLE = (
    "[loopguard] You have made the same tool call several times in a row. Before calling it "
    "again, re-read its last result: if it did not give you what you need, change your approach "
    "or your arguments instead of repeating the call."
)
RECURRENCE = (
    "[loopguard] You keep coming back to the same tool call: bash with the same arguments, "
    "{n} times in your last {m} calls, and it returned the same result each time.\n"
    "- tool: bash\n"
    '- arguments: {{"command":"ls"}}\n'
    "Calling it again will not tell you anything new. Use the result you already have, or do "
    "something different."
)
MONOLOGUE = (
    "[loopguard] Your last 3 messages said exactly the same thing:\n"
    '  "Let me run the tests."\n'
    "Repeating it does not move the task forward. Look at what happened since you first wrote "
    "it and do something different, or tell the user plainly where you are stuck."
)

#: (checker, history, reminder text, violations): a true and a false case per registered text.
CASES = [
    (
        "repeat_reminder_detailed",
        _history(PWD, LS, LS, LS_AT, LS, LS),
        DETAILED.format(n=5, args='{"command":"ls"}'),
        [],
    ),
    (
        "repeat_reminder_detailed",
        _history(LS, LS, LS_NEW, PWD),
        DETAILED.format(n=4, args='{"command":"ls"}'),
        [
            'arguments: the last 4 calls include other arguments: {"command":"pwd"}',
            "without making progress: the last 4 calls did not all return the same result",
        ],
    ),
    (
        "repeat_reminder_detailed",  # an argument preview stands for the arguments it starts
        _history(*[("bash", orjson.dumps({"command": "x" * 40}).decode(), "ok")] * 3),
        DETAILED.format(n=3, args='{"command":"xxxxx… (+37 more chars)'),
        [],
    ),
    (
        "repeat_reminder_detailed",
        _history(LS, LS),
        DETAILED.format(n=3, args='{"command":"ls"}'),
        ["consecutive_calls: 3: only 2 tool calls before it"],
    ),
    ("repeat_reminder_gentle", _history(PWD, LS, LS_AT, LS), GENTLE, []),
    (
        "repeat_reminder_gentle",
        _history(LS, LS_NEW, LS),
        GENTLE,
        ["re-read its last result: the last 3 calls did not all return the same result"],
    ),
    (
        "repeat_reminder_gentle",
        _history(LS, PWD, LS),
        GENTLE,
        ["the same tool call: the last 3 calls are not all the same call"],
    ),
    ("recurrence", _history(PWD, LS, PWD, LS_AT, PWD, LS), RECURRENCE.format(n=3, m=5), []),
    (
        "recurrence",
        _history(LS, PWD, LS_NEW, PWD, LS_NEW),
        RECURRENCE.format(n=3, m=5),
        ["the same result each time: those 3 calls did not all return the same result"],
    ),
    (
        "recurrence",
        _history(LS, PWD, PWD, LS),
        RECURRENCE.format(n=3, m=4),
        ["3 times: bash with these arguments is 2 of the last 4 calls"],
    ),
    (
        "monologue_same_text",
        _history(PWD, LS, PWD, said="Let me  run the tests.\n"),
        MONOLOGUE,
        [],
    ),
    (
        "monologue_same_text",
        [*_history(PWD, LS, said="Let me run the tests."), {"role": "assistant", "content": "Done?"}],
        MONOLOGUE,
        ["said exactly the same thing: message 3 of the last 3 says 'Done?'"],
    ),
]


@pytest.mark.parametrize(("checker", "history", "text", "violations"), CASES)
def test_reminder_facts(
    checker: str, history: list[dict[str, Any]], text: str, violations: list[str]
) -> None:
    fn = checker_for(text)
    assert fn is not None and fn.__name__ == checker
    assert check_reminder(history, text) == violations


def test_every_registered_text_has_a_true_and_a_false_case() -> None:
    true = {c for c, _, _, v in CASES if not v}
    false = {c for c, _, _, v in CASES if v}
    names = {fn.__name__ for fn in CHECKERS.values()}
    assert true == false == names


def test_an_unknown_reminder_text_is_a_violation() -> None:
    text = "[loopguard] You are going in circles: the same 2 steps have now repeated 3 times in a row"
    assert check_reminder(_history(LS), text) == [f"no checker for: {text[:60]}"]
    assert check_reminder(_history(LS), "Please stop.") == ["no checker for: Please stop."]


def test_a_reminder_text_that_cannot_be_read_is_a_violation() -> None:
    text = "[loopguard] You are repeating the same tool call without making progress.\n- tool: bash\n"
    assert check_reminder(_history(LS), text) == [
        "cannot read the tool, consecutive_calls and arguments lines: "
        "[loopguard] You are repeating the same tool call without mak…"
    ]


def test_the_checkers_read_the_texts_the_proxy_writes_today() -> None:
    """The guards' own templates, formatted: each is dispatched to its checker and read (a
    reworded text fails here first: change its entry in tests/reminder_facts.py with it)."""
    from proxy.guards import monologue, recurrence, repeat_reminder

    history = _history(LS, LS, LS, LS, LS, said="Let me run the tests.")
    texts = [
        repeat_reminder.GENTLE_TEXT,
        repeat_reminder.DETAILED_TEXT.format(tool="bash", count=5, arguments='{"command":"ls"}'),
        recurrence.TEXT.format(tool="bash", count=5, span=5, arguments='{"command":"ls"}'),
        monologue.SAME_TEXT.format(count=5, text="Let me run the tests."),
    ]
    assert [check_reminder(history, t) for t in texts] == [[], [], [], []]


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
