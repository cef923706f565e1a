"""Native-session gate: real agent sessions replayed in their own wire format.

The sessions are third-party data read where they lie: two folders,
``../shared/fixtures/realtraj-native`` (Claude Code, Codex) and
``../shared/fixtures/realtraj-native-more`` (Codex, Gemini CLI, OpenCode) from the project root, or
``$LOOPGUARD_REALTRAJ_NATIVE`` and ``$LOOPGUARD_REALTRAJ_NATIVE_MORE``; without them the gate tests
are skipped, saying where they were looked for (a missing folder is its own skipped test). Each
session is replayed with the shipped default config in its own dialect (Anthropic Messages, OpenAI
Responses, the Gemini API, Chat Completions), as JSON and as SSE
(:mod:`tests.helpers.realtraj_native`). Run with ``-s`` to see the table. Three gates, each its
own test: no session has a result withheld, a turn stopped or an answer cut (and the proxy never
fails open); at most 2 reminders per 1,000 calls for each agent; every reminder says only true
things about the history before it.

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

from proxy.dialects import anthropic_messages, gemini, openai_chat, openai_responses
from tests.helpers.corpus import Observation, Reminder, Replay, request_changes
from tests.helpers.native_wires import (
    NATIVE_HISTORY,
    contents_back,
    items_back,
    messages_back,
    trace_contents,
    trace_items,
    trace_messages,
)
from tests.helpers.realtraj_native import (
    MAX_REMINDERS_PER_1000,
    SessionReplay,
    conversations,
    gate_failures,
    load_sessions,
    rate_failures,
    replay_sessions,
    sessions_dirs,
    table,
)

SESSIONS_DIRS = sessions_dirs()
_REPLAYS: dict[bool, list[SessionReplay]] = {}


@pytest.mark.parametrize(("env", "directory"), SESSIONS_DIRS, ids=[env for env, _ in SESSIONS_DIRS])
def test_each_folder_of_sessions_is_there(env: str, directory: Any) -> None:
    if not directory.is_dir():
        pytest.skip(f"no native sessions: {directory} does not exist (set ${env} to their directory)")
    assert load_sessions(directory), f"no *.json in {directory}"


@pytest.fixture(scope="module")
def sessions() -> list[dict[str, Any]]:
    found = [s for _, d in SESSIONS_DIRS if d.is_dir() for s in load_sessions(d)]
    if not found:
        where = ", ".join(f"{d} (${env})" for env, d in SESSIONS_DIRS)
        pytest.skip(f"no native sessions: none in {where}")
    return found


def _replays(sessions: list[dict[str, Any]], stream: bool) -> list[SessionReplay]:
    """The sessions replayed once per mode (the gate tests read the same replays)."""
    if stream not in _REPLAYS:
        _REPLAYS[stream] = asyncio.run(replay_sessions(sessions, stream))
    return _REPLAYS[stream]


def test_sessions_have_the_documented_fields(sessions: list[dict[str, Any]]) -> None:
    for s in sessions:
        assert s["dialect"] in NATIVE_HISTORY, s["id"]
        assert s["agent"] and s["request_bodies_final"], s["id"]
        member = NATIVE_HISTORY[s["dialect"]][0]
        for body in [*(s.get("compaction_segments") or []), s["request_bodies_final"]]:
            assert isinstance(body[member], list) and body[member], s["id"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_no_session_is_blocked(sessions: list[dict[str, Any]], stream: bool) -> None:
    done = _replays(sessions, stream)
    print(f"\nnative-session gate ({'sse' if stream else 'json'}), default config:\n{table(done)}")
    failures = gate_failures(done)
    assert not failures, f"{len(failures)} blocks:\n" + "\n".join(failures)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_reminders_are_rare_for_each_agent(sessions: list[dict[str, Any]], stream: bool) -> None:
    done = _replays(sessions, stream)
    failures = rate_failures(done)
    assert not failures, f"over {MAX_REMINDERS_PER_1000:g} per 1,000 calls:\n" + "\n".join(failures)


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


def gemini_session(n: int, sid: str = "gemini-mini") -> dict[str, Any]:
    """The same session as Gemini CLI sends it: ``n`` model turns of (a text saying which try it
    is, one ``run_shell_command ls`` with Gemini CLI's own call id), each answered by a
    ``functionResponse`` with that id."""
    contents: list[dict[str, Any]] = [{"role": "user", "parts": [{"text": "list the files"}]}]
    for k in range(n):
        cid = f"run_shell_command_17761806863{k:02d}_0"
        call = {"id": cid, "name": "run_shell_command", "args": {"command": "ls"}}
        text = {"text": f"Listing the files (try {k + 1})."}
        contents.append({"role": "model", "parts": [text, {"functionCall": call}]})
        answer = {"id": cid, "name": "run_shell_command", "response": {"output": "Output: a.txt\nb.txt"}}
        contents.append({"role": "user", "parts": [{"functionResponse": answer}]})
    contents.append({"role": "model", "parts": [{"text": "Done."}]})
    tools = [{"functionDeclarations": [{"name": "run_shell_command"}]}]
    return {
        "id": sid,
        "agent": "gemini-cli",
        "dialect": "gemini_generate_content",
        "request_bodies_final": {"model": "gemini-3-flash-preview", "contents": contents, "tools": tools},
        "compaction_segments": [],
    }


def opencode_session(n: int, sid: str = "opencode-mini") -> dict[str, Any]:
    """The same session as OpenCode sends it to an OpenAI-compatible provider: ``n`` assistant
    messages with one ``bash ls`` call each, answered by a ``tool`` message."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "list the files"}]
    for k in range(n):
        call = {
            "id": f"call_{k}",
            "type": "function",
            "function": {"name": "bash", "arguments": '{"command": "ls"}'},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{k}", "content": "a.txt\nb.txt"})
    messages.append({"role": "assistant", "content": "Done."})
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    return {
        "id": sid,
        "agent": "opencode",
        "dialect": "openai_chat",
        "request_bodies_final": {"model": "gpt-5.4", "messages": messages, "tools": tools},
        "compaction_segments": [],
    }


BUILDS = [claude_session, codex_session, gemini_session, opencode_session]
BUILD_IDS = ["messages", "responses", "gemini", "chat"]


#: What the default config does to seven identical ``ls`` calls, in every dialect and either mode.
MINI_OBSERVATIONS = [
    Observation("remind", 3, 7, "request", ("repeat_reminder",)),
    Observation("remind", 5, 11, "request", ("repeat_reminder",)),
    Observation("withhold", 6, 13, "request", ("escalation",)),
    Observation("stop", 7, 13, "response", ("stop",)),
    Observation("withhold", 7, 15, "request", ("circuit_breaker", "escalation")),
]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("build", BUILDS, ids=BUILD_IDS)
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


@pytest.mark.parametrize("build", BUILDS, ids=BUILD_IDS)
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
    with pytest.raises(KeyError, match="no wire for dialect 'bedrock_converse'"):
        conversations({**session, "dialect": "bedrock_converse"})


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


_FC1 = {"functionCall": {"id": "read_file_1_0", "name": "read_file", "args": {"file_path": "a"}}}
_FC2 = {"functionCall": {"name": "read_file", "args": {"file_path": "b"}}}  # no id: the API sends none
_FR1 = {"functionResponse": {"id": "read_file_1_0", "name": "read_file", "response": {"output": "A"}}}
_FR2 = {"functionResponse": {"id": "x-9", "name": "read_file", "response": {"error": "B"}}}
GEMINI_CONTENTS: list[dict[str, Any]] = [
    {"role": "user", "parts": [{"text": "fix it"}]},
    {"role": "model", "parts": [{"text": "hm", "thought": True}, {"text": "Reading."}, _FC1, _FC2]},
    {"role": "user", "parts": [_FR2, _FR1, {"text": "and hurry"}]},
    {"role": "model", "parts": [{"text": "Done."}]},
    {"role": "function", "parts": [{"text": "note"}]},
]
_GEMINI_CALLS = [
    {
        "id": "read_file_1_0",
        "type": "function",
        "function": {"name": "read_file", "arguments": '{"file_path": "a"}'},
    },
    {
        "id": "gemini-1-1",
        "type": "function",
        "function": {"name": "read_file", "arguments": '{"file_path": "b"}'},
    },
]


def test_contents_are_read_as_the_dialect_reads_them() -> None:
    traced = trace_contents(GEMINI_CONTENTS)
    assert traced.chat == [
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": "Reading.", "tool_calls": _GEMINI_CALLS},
        # paired as the dialect pairs them: by id, else with the first waiting call of that name
        # (so the first result takes the first call, and the second, whose id is taken, the other)
        {"role": "tool", "tool_call_id": "read_file_1_0", "content": "B", "is_error": True},
        {"role": "tool", "tool_call_id": "gemini-1-1", "content": "A"},
        {"role": "user", "content": "and hurry"},
        {"role": "assistant", "content": "Done."},
        {"role": "system", "content": "note"},
    ]
    assert (traced.units, traced.starts) == ([[0], [1], [2, 3, 4], [5], [6]], {1: 1, 5: 3})


_DIALECTS = {
    "gemini_generate_content": (gemini.parse_request, "contents"),
    "openai_chat": (openai_chat.parse_request, "messages"),
    "anthropic_messages": (anthropic_messages.parse_request, "messages"),
    "openai_responses": (openai_responses.parse_request, "input"),
}


def _reading(transcript: Any) -> list[tuple[Any, ...]]:
    """What the guards read of each call: name, arguments, result position and text (the chat
    dialect has no failure flag: that is the ``is_error`` member the harness keeps)."""
    return [
        (c.name, c.arguments, c.result.position if c.result else None, c.result.text if c.result else None)
        for c in transcript.calls
    ]


@pytest.mark.parametrize("build", BUILDS, ids=BUILD_IDS)
def test_the_chat_form_reads_as_the_native_body(build: Any) -> None:
    session = build(2)
    body = session["request_bodies_final"]
    parse, member = _DIALECTS[session["dialect"]]
    native = parse(body)
    chatted = openai_chat.parse_request(
        {"messages": NATIVE_HISTORY[session["dialect"]][1](body[member]).chat}
    )
    assert [r[:2] + r[3:] for r in _reading(native)] == [r[:2] + r[3:] for r in _reading(chatted)]
    assert [(c.name, c.result.text if c.result else None) for c in chatted.calls] == [
        (c.name, c.result.text if c.result else None) for c in native.calls
    ]
    assert len(chatted.calls) == 2 and all(c.result is not None for c in chatted.calls)
    assert len(native.user_positions) == len(chatted.user_positions) == 1


def test_the_gemini_chat_form_has_the_dialects_positions() -> None:
    native = gemini.parse_request({"contents": GEMINI_CONTENTS})
    chatted = openai_chat.parse_request({"messages": trace_contents(GEMINI_CONTENTS).chat})
    assert (
        _reading(native)
        == _reading(chatted)
        == [
            ("read_file", {"file_path": "a"}, 2, "B"),
            ("read_file", {"file_path": "b"}, 3, "A"),
        ]
    )
    assert [bool(c.result and c.result.is_error) for c in native.calls] == [True, False]
    assert [c.position for c in native.calls] == [c.position for c in chatted.calls] == [1, 1]
    assert native.user_positions == chatted.user_positions == (0, 4)


def test_each_contents_edit_is_read_back() -> None:
    traced = trace_contents(GEMINI_CONTENTS)
    denied = {"functionResponse": {**_FR2["functionResponse"], "response": {"error": "denied"}}}
    suffixed = {
        "functionResponse": {**_FR1["functionResponse"], "response": {"output": "A\n\n[loopguard] r1"}}
    }
    arrived = [
        {"role": "user", "parts": [{"text": "fix it"}, {"text": "[loopguard] r3"}]},  # a part appended
        GEMINI_CONTENTS[1],
        {"role": "user", "parts": [{"text": "[loopguard] r0"}]},  # a content inserted
        {"role": "user", "parts": [denied, suffixed, {"text": "and hurry"}]},
        {"role": "user", "parts": [{"text": "[loopguard] r2"}]},
    ]
    back = contents_back(traced, GEMINI_CONTENTS[:3], arrived)
    assert back == [
        {"role": "user", "content": "fix it\n[loopguard] r3"},
        traced.chat[1],
        {"role": "user", "content": "[loopguard] r0"},
        {**traced.chat[2], "content": "denied"},
        {**traced.chat[3], "content": "A\n\n[loopguard] r1"},
        traced.chat[4],
        {"role": "user", "content": "[loopguard] r2"},
    ]
    by_id, per_message = {"read_file_1_0": 1, "gemini-1-1": 2}, [[], [1, 2], [], [], [], [], []]
    assert [
        (c.kind, c.call, c.upto, c.text) for c in request_changes(traced.chat[:5], back, by_id, per_message)
    ] == [
        ("remind", 0, 1, "[loopguard] r3"),
        ("remind", 0, 2, "[loopguard] r0"),
        ("withhold", 1, 3, "denied"),
        ("remind", 2, 4, "[loopguard] r1"),
        ("remind", 2, 5, "[loopguard] r2"),
    ]
    assert contents_back(traced, GEMINI_CONTENTS[:3], GEMINI_CONTENTS[:3]) == traced.chat[:5]


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
    assert [re.split(r"\s{2,}", line) for line in lines[4:8]] == [
        [""],
        ["agent", "sessions", "blocked", "calls", "reminders", "withheld", "stops", "cuts", "per 1,000"],
        ["claude-code", "2", "1", "10", "2", "2", "0", "0", "200.0"],
        ["codex-cli", "1", "1", "10", "0", "0", "1", "0", "0.0"],
    ]
    assert lines[8:] == [
        "all          3         2        20     2          2         1      0     100.0",
        "gate: no block; at most 2 reminders per 1,000 calls per agent; "
        "untrue reminder claims: 2 in 2 reminders",
    ]
    assert rate_failures([calm, noisy, stopped]) == [
        "claude-code: 200.0 reminders per 1,000 calls (2 reminders, 10 calls; at most 2)"
    ]
    assert rate_failures([calm, stopped]) == []
    assert gate_failures([calm, noisy, stopped]) == [
        "cc-b#0: call 5 circuit_breaker+escalation withhold",
        "cc-b#0: call 6 escalation withhold",
        "codex-c#0: call 9 stop stop",
    ]
