"""Native-session gate: real Claude Code and Codex sessions replayed in their own wire format.

The sessions are third-party data read where they lie (``../shared/fixtures/realtraj-native``
from the project root, or ``$LOOPGUARD_REALTRAJ_NATIVE``); without them the gate tests are
skipped, saying where they were looked for. Each session is replayed with the shipped default
config, as JSON and as SSE (:mod:`tests.helpers.realtraj_native`). Run with ``-s`` to see the table. Three
gates, each its own test: no session has a result withheld, a turn stopped or an answer cut (and
the proxy never fails open); at most 2 reminders per 1,000 calls over the set; every reminder says
only true things about the history before it.

The harness itself is tested below without the data, strictly: the chat reading of each dialect,
the reading back of each kind of edit, and a tiny session in each dialect replayed through the
real server with its exact observations.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

from tests.helpers.corpus import Observation, Reminder, Replay, request_changes
from tests.helpers.native_wires import items_back, messages_back, trace_items, trace_messages
from tests.helpers.realtraj_native import (
    ENV,
    MAX_REMINDERS_PER_1000,
    SessionReplay,
    conversations,
    gate_failures,
    load_sessions,
    reminder_rate,
    replay_sessions,
    sessions_dir,
    table,
)

SESSIONS_DIR = sessions_dir()
_REPLAYS: dict[bool, list[SessionReplay]] = {}


@pytest.fixture(scope="module")
def sessions() -> list[dict[str, Any]]:
    if not SESSIONS_DIR.is_dir():
        pytest.skip(f"no native sessions: {SESSIONS_DIR} does not exist (set ${ENV} to their directory)")
    found = load_sessions(SESSIONS_DIR)
    if not found:
        pytest.skip(f"no native sessions: no *.json in {SESSIONS_DIR} (set ${ENV} to their directory)")
    return found


def _replays(sessions: list[dict[str, Any]], stream: bool) -> list[SessionReplay]:
    """The sessions replayed once per mode (the gate tests read the same replays)."""
    if stream not in _REPLAYS:
        _REPLAYS[stream] = asyncio.run(replay_sessions(sessions, stream))
    return _REPLAYS[stream]


def test_sessions_have_the_documented_fields(sessions: list[dict[str, Any]]) -> None:
    for s in sessions:
        assert s["dialect"] in ("anthropic_messages", "openai_responses"), s["id"]
        assert s["agent"] and s["request_bodies_final"], s["id"]
        member = "messages" if s["dialect"] == "anthropic_messages" else "input"
        for body in [*(s.get("compaction_segments") or []), s["request_bodies_final"]]:
            assert isinstance(body[member], list) and body[member], s["id"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_no_session_is_blocked(sessions: list[dict[str, Any]], stream: bool) -> None:
    done = _replays(sessions, stream)
    print(f"\nnative-session gate ({'sse' if stream else 'json'}), default config:\n{table(done)}")
    failures = gate_failures(done)
    assert not failures, f"{len(failures)} blocks:\n" + "\n".join(failures)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_reminders_are_rare(sessions: list[dict[str, Any]], stream: bool) -> None:
    done = _replays(sessions, stream)
    assert reminder_rate(done) <= MAX_REMINDERS_PER_1000, "\n".join(table(done).splitlines()[-3:])


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_every_reminder_says_only_true_things(sessions: list[dict[str, Any]], stream: bool) -> None:
    untrue = [v.describe() for s in _replays(sessions, stream) for v in s.violations()]
    assert not untrue, f"{len(untrue)} untrue reminder claims:\n" + "\n".join(untrue)


# --- tiny sessions, one per dialect ------------------------------------------------------------------


def claude_session(n: int, sid: str = "cc-mini") -> dict[str, Any]:
    """A Claude Code session: one user message, then ``n`` turns of (thinking, one ``Bash ls``)
    each answered ``a.txt\\nb.txt``, then a text answer."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "list the files"}]
    for k in range(n):
        use = {"type": "tool_use", "id": f"toolu_{k}", "name": "Bash", "input": {"command": "ls"}}
        messages.append(
            {
                "role": "assistant",
                "content": [{"type": "thinking", "thinking": "again", "signature": "sig"}, use],
            }
        )
        result = {"type": "tool_result", "tool_use_id": f"toolu_{k}", "content": "a.txt\nb.txt"}
        messages.append({"role": "user", "content": [result]})
    messages.append({"role": "assistant", "content": [{"type": "text", "text": "Done."}]})
    body = {"model": "claude-opus-4-6", "system": None, "tools": [{"name": "Bash", "input_schema": {}}]}
    return {
        "id": sid,
        "agent": "claude-code",
        "dialect": "anthropic_messages",
        "request_bodies_final": {**body, "messages": messages},
        "compaction_segments": [],
    }


def codex_session(n: int, sid: str = "codex-mini") -> dict[str, Any]:
    """The same session as Codex sends it: ``n`` turns of (reasoning, one ``exec_command ls``)."""
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list the files"}]}
    ]
    for k in range(n):
        items.append({"type": "reasoning", "summary": []})
        args = json.dumps({"cmd": "ls"})
        items.append(
            {"type": "function_call", "name": "exec_command", "arguments": args, "call_id": f"call_{k}"}
        )
        items.append({"type": "function_call_output", "call_id": f"call_{k}", "output": "a.txt\nb.txt"})
    items.append(
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]}
    )
    tools = [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}]
    return {
        "id": sid,
        "agent": "codex-cli",
        "dialect": "openai_responses",
        "request_bodies_final": {
            "model": "gpt-5.5",
            "instructions": "be brief",
            "tools": tools,
            "input": items,
        },
        "compaction_segments": [],
    }


#: What the default config does to seven identical ``ls`` calls, in either dialect and either mode.
MINI_OBSERVATIONS = [
    Observation("remind", 3, 7, "request", ("repeat_reminder",)),
    Observation("remind", 5, 11, "request", ("repeat_reminder",)),
    Observation("withhold", 6, 13, "request", ("escalation",)),
    Observation("stop", 7, 13, "response", ("stop",)),
    Observation("withhold", 7, 15, "request", ("circuit_breaker", "escalation")),
]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("build", [claude_session, codex_session], ids=["messages", "responses"])
def test_a_tiny_session_is_replayed_with_exact_observations(build: Any, stream: bool) -> None:
    [done] = asyncio.run(replay_sessions([build(7)], stream))
    [r] = done.replays
    assert (done.calls, r.requests, r.internal_errors) == (7, 8, 0)
    assert r.observations == MINI_OBSERVATIONS
    assert [(m.call, m.message, m.upto, m.rules, m.text.splitlines()[0]) for m in r.reminders] == [
        (
            3,
            7,
            7,
            ("repeat_reminder",),
            "[loopguard] You have made the same tool call several times in a row. Before calling it again,"
            " re-read its last result: if it did not give you what you need, change your approach or your"
            " arguments instead of repeating the call.",
        ),
        (
            5,
            11,
            11,
            ("repeat_reminder",),
            "[loopguard] You are repeating the same tool call without making progress.",
        ),
    ]
    assert [done.count(k) for k in ("remind", "withhold", "stop", "cut")] == [2, 2, 1, 0]
    assert done.violations() == []
    assert gate_failures([done]) == [
        f"{done.id}#0: call 6 escalation withhold",
        f"{done.id}#0: call 7 circuit_breaker+escalation withhold",
        f"{done.id}#0: call 7 stop stop",
    ]


@pytest.mark.parametrize("build", [claude_session, codex_session], ids=["messages", "responses"])
def test_a_session_without_repetition_is_left_alone(build: Any) -> None:
    session = build(2)
    [done] = asyncio.run(replay_sessions([session], True))
    assert (done.calls, done.replays[0].requests, done.replays[0].observations, done.reminders) == (
        2,
        3,
        [],
        0,
    )


def test_conversations_are_the_segments_then_the_final_body() -> None:
    session = claude_session(2)
    segment = claude_session(1)["request_bodies_final"]
    session["compaction_segments"] = [segment]
    got = conversations(session)
    assert [
        (c["id"], c["native"] is b)
        for c, b in zip(got, [segment, session["request_bodies_final"]], strict=True)
    ] == [
        ("cc-mini#0", True),
        ("cc-mini#1", True),
    ]
    assert [len(c["messages"]) for c in got] == [4, 6]
    with pytest.raises(KeyError, match="no wire for dialect 'openai_chat'"):
        conversations({**session, "dialect": "openai_chat"})


# --- reading each dialect as chat, and reading each edit back ------------------------------------

_T1 = {"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "a"}}
_T2 = {"type": "tool_use", "id": "t2", "name": "Read", "input": {"file_path": "b"}}
CLAUDE_MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "fix it"},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "hm", "signature": "s"},
            {"type": "text", "text": "Reading."},
            _T1,
            _T2,
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "A"},
            {
                "type": "tool_result",
                "tool_use_id": "t2",
                "content": [{"type": "text", "text": "B"}],
                "is_error": True,
            },
            {"type": "text", "text": "<system-reminder>x"},
        ],
    },
    {"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
    {"role": "system", "content": "note"},
]
_CALLS = [
    {"id": "t1", "type": "function", "function": {"name": "Read", "arguments": '{"file_path": "a"}'}},
    {"id": "t2", "type": "function", "function": {"name": "Read", "arguments": '{"file_path": "b"}'}},
]


def _text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def test_messages_are_read_as_the_dialect_reads_them() -> None:
    traced = trace_messages(CLAUDE_MESSAGES)
    assert traced.chat == [
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": "Reading.", "tool_calls": _CALLS},
        {"role": "tool", "tool_call_id": "t1", "content": "A"},
        {"role": "tool", "tool_call_id": "t2", "content": "B", "is_error": True},
        {"role": "user", "content": "<system-reminder>x"},
        {"role": "assistant", "content": "Done."},
        {"role": "system", "content": "note"},
    ]
    assert (traced.units, traced.starts) == ([[0], [1], [2, 3, 4], [5], [6]], {1: 1, 5: 3})


def test_each_messages_edit_is_read_back() -> None:
    traced = trace_messages(CLAUDE_MESSAGES)
    results = CLAUDE_MESSAGES[2]["content"]
    arrived = [
        {"role": "user", "content": "fix it\n\n[loopguard] r3"},  # appended to the user's text
        CLAUDE_MESSAGES[1],
        {"role": "user", "content": [_text("[loopguard] r0")]},  # a message inserted
        {
            "role": "user",
            "content": [
                {**results[0], "content": "denied"},  # withheld
                {**results[1], "content": [_text("B"), _text("[loopguard] r1")]},  # tool_suffix
                _text("[loopguard] r2"),  # a block inserted after the results
                results[2],
            ],
        },
    ]
    back = messages_back(traced, CLAUDE_MESSAGES[:3], arrived)
    assert back == [
        {"role": "user", "content": "fix it\n\n[loopguard] r3"},
        traced.chat[1],
        {"role": "user", "content": "[loopguard] r0"},
        {"role": "tool", "tool_call_id": "t1", "content": "denied"},
        {"role": "tool", "tool_call_id": "t2", "content": "B\n[loopguard] r1", "is_error": True},
        {"role": "user", "content": "[loopguard] r2"},
        traced.chat[4],
    ]
    by_id, per_message = {"t1": 1, "t2": 2}, [[], [1, 2], [], [], [], [], []]
    assert [
        (c.kind, c.call, c.upto, c.text) for c in request_changes(traced.chat[:5], back, by_id, per_message)
    ] == [
        ("remind", 0, 1, "[loopguard] r3"),
        ("remind", 0, 2, "[loopguard] r0"),
        ("withhold", 1, 3, "denied"),
        ("remind", 2, 4, "[loopguard] r1"),
        ("remind", 2, 4, "[loopguard] r2"),
    ]
    assert messages_back(traced, CLAUDE_MESSAGES[:3], CLAUDE_MESSAGES[:3]) == traced.chat[:5]


def _input_text(role: str, value: str, kind: str = "input_text") -> dict[str, Any]:
    return {"type": "message", "role": role, "content": [{"type": kind, "text": value}]}


CODEX_ITEMS: list[dict[str, Any]] = [
    _input_text("developer", "rules"),
    _input_text("user", "fix it"),
    {"type": "reasoning", "summary": []},
    _input_text("assistant", "Reading.", "output_text"),
    {"type": "function_call", "name": "exec_command", "arguments": '{"cmd":"ls"}', "call_id": "c1"},
    {"type": "custom_tool_call", "name": "apply_patch", "input": "*** Begin Patch", "call_id": "c2"},
    {"type": "function_call_output", "call_id": "c1", "output": "a"},
    {"type": "custom_tool_call_output", "call_id": "c2", "output": "Done!"},
    {"type": "web_search_call", "status": "completed"},
    {"type": "reasoning", "summary": []},
    _input_text("assistant", "Finished.", "output_text"),
]


def test_items_are_read_as_the_dialect_reads_them() -> None:
    traced = trace_items(CODEX_ITEMS)
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "exec_command", "arguments": '{"cmd":"ls"}'}},
        {"id": "c2", "type": "function", "function": {"name": "apply_patch", "arguments": "*** Begin Patch"}},
    ]
    assert traced.chat == [
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": "Reading.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "a"},
        {"role": "tool", "tool_call_id": "c2", "content": "Done!"},
        {"role": "assistant", "content": "Finished."},
    ]
    assert traced.units == [[0], [1], [2], [], [], [], [3], [4], [], [5], []]
    assert traced.starts == {2: 2, 5: 9}


def test_each_responses_edit_is_read_back() -> None:
    traced = trace_items(CODEX_ITEMS)
    arrived = [
        *CODEX_ITEMS[:6],
        {**CODEX_ITEMS[6], "output": "denied"},
        {**CODEX_ITEMS[7], "output": "Done!\n\n[loopguard] r1"},
        _input_text("user", "[loopguard] r2"),
        CODEX_ITEMS[8],
    ]
    back = items_back(traced, CODEX_ITEMS[:9], arrived)
    assert back == [
        *traced.chat[:3],
        {"role": "tool", "tool_call_id": "c1", "content": "denied"},
        {"role": "tool", "tool_call_id": "c2", "content": "Done!\n\n[loopguard] r1"},
        {"role": "user", "content": "[loopguard] r2"},
    ]
    by_id, per_message = {"c1": 1, "c2": 2}, [[], [], [1, 2], [], [], []]
    assert [
        (c.kind, c.call, c.upto, c.text) for c in request_changes(traced.chat[:5], back, by_id, per_message)
    ] == [
        ("withhold", 1, 4, "denied"),
        ("remind", 2, 5, "[loopguard] r1"),
        ("remind", 2, 5, "[loopguard] r2"),
    ]
    assert items_back(traced, CODEX_ITEMS[:9], CODEX_ITEMS[:9]) == traced.chat[:5]


# --- the table ---------------------------------------------------------------------------------------


def _session_replay(session: dict[str, Any], *observations: Observation, reminders: int = 0) -> SessionReplay:
    [fixture] = conversations(session)
    r = Replay(fixture, False)
    r.observations += observations
    r.reminders += [Reminder(f"[loopguard] r{k}", 3, 7, 7, ("repeat_reminder",)) for k in range(reminders)]
    return SessionReplay(session, (r,))


def test_table_on_hand_made_replays() -> None:
    calm = _session_replay(claude_session(4, "cc-a"))
    noisy = _session_replay(
        claude_session(6, "cc-b"),
        Observation("remind", 3, 7, "request", ("repeat_reminder",)),
        Observation("withhold", 5, 11, "request", ("circuit_breaker", "escalation")),
        Observation("withhold", 6, 13, "request", ("escalation",)),
        reminders=2,
    )
    stopped = _session_replay(codex_session(10, "codex-c"), Observation("stop", 9, 19, "response", ("stop",)))
    lines = table([calm, noisy, stopped]).splitlines()
    rows = [re.split(r"\s{2,}", line) for line in lines[:4]]
    assert rows == [
        ["session", "agent", "calls", "reminders", "withheld", "stops", "cuts", "rules"],
        ["cc-a", "claude-code", "4", "0", "0", "0", "0", "-"],
        [
            *("cc-b", "claude-code", "6", "2", "2", "0", "0"),
            "remind repeat_reminder x2; withhold circuit_breaker+escalation x1; withhold escalation x1",
        ],
        ["codex-c", "codex-cli", "10", "0", "0", "1", "0", "stop stop x1"],
    ]
    assert lines[4:] == [
        "",
        "claude-code: sessions blocked 1 of 2; reminders per 1,000 calls 200.0 (2 reminders, 10 calls)",
        "codex-cli: sessions blocked 1 of 1; reminders per 1,000 calls 0.0 (0 reminders, 10 calls)",
        "all: sessions blocked 2 of 3; reminders per 1,000 calls 100.0 (gate: at most 2); "
        "untrue reminder claims: 2 in 2 reminders",
    ]
    assert gate_failures([calm, noisy, stopped]) == [
        "cc-b#0: call 5 circuit_breaker+escalation withhold",
        "cc-b#0: call 6 escalation withhold",
        "codex-c#0: call 9 stop stop",
    ]
