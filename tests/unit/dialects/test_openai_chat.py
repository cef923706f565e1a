"""OpenAI chat dialect: parse_request (body → Transcript) and apply (actions → body), no sockets."""

from __future__ import annotations

import copy
import json
from typing import Any

import orjson
import pytest

from proxy.core.actions import Remind, Withhold
from proxy.core.canonical import INVALID
from proxy.core.transcript import Step, ToolResult
from proxy.dialects.openai_chat import apply as apply_bytes
from proxy.dialects.openai_chat import parse_request
from proxy.errors import DialectError

# --- message builders -------------------------------------------------------------------------------


def tc(cid: str | None, name: str = "read_file", args: Any = '{"path":"a.py"}') -> dict[str, Any]:
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": args}}
    if cid is not None:
        call["id"] = cid
    return call


def asst(*calls: dict[str, Any], content: Any = None) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = list(calls)
    return msg


def tool(cid: str | None, content: Any = "ok") -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "tool", "content": content}
    if cid is not None:
        msg["tool_call_id"] = cid
    return msg


def user(text: str = "go") -> dict[str, Any]:
    return {"role": "user", "content": text}


def system(text: str = "You are helpful.") -> dict[str, Any]:
    return {"role": "system", "content": text}


def parse(*messages: dict[str, Any]):
    return parse_request({"model": "m", "messages": list(messages)})


# --- parse_request: calls and arguments -------------------------------------------------------------


@pytest.mark.parametrize(
    ("wire", "parsed"),
    [
        pytest.param('{"path":"a.py"}', {"path": "a.py"}, id="string_arguments_decoded"),
        pytest.param({"path": "a.py"}, {"path": "a.py"}, id="object_arguments_kept"),
        pytest.param("", {}, id="empty_string_is_empty_object"),
        pytest.param(None, {}, id="null_is_empty_object"),
        pytest.param("{oops", INVALID, id="invalid_json_marked_invalid"),
    ],
)
def test_parse_call_arguments(wire: Any, parsed: Any) -> None:
    t = parse(user(), asst(tc("c1", "read_file", wire)), tool("c1"))
    (call,) = t.calls
    assert call.arguments_raw == wire
    if parsed is INVALID:
        assert call.arguments is INVALID
    else:
        assert call.arguments == parsed
    assert (call.seq, call.step, call.turn, call.position, call.call_id, call.name) == (
        0,
        0,
        1,
        1,
        "c1",
        "read_file",
    )
    assert call.result == ToolResult(2, "ok")


def test_parse_call_without_arguments_key_is_empty_object() -> None:
    t = parse(
        user(), {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "ls"}}]}, tool("c1")
    )
    assert (t.calls[0].arguments_raw, t.calls[0].arguments) == (None, {})


@pytest.mark.parametrize(
    ("content", "text"),
    [
        pytest.param("file body", "file body", id="string"),
        pytest.param(
            [{"type": "text", "text": "line 1"}, {"type": "text", "text": "line 2"}],
            "line 1\nline 2",
            id="array_of_text_parts_joined_by_newline",
        ),
        pytest.param(
            [{"type": "image_url", "image_url": {"url": "data:x"}}, {"type": "text", "text": "only"}],
            "only",
            id="array_non_text_parts_skipped",
        ),
        pytest.param([], "", id="empty_array"),
        pytest.param(None, "", id="null"),
        pytest.param("", "", id="empty_string"),
    ],
)
def test_parse_tool_result_content(content: Any, text: str) -> None:
    t = parse(user(), asst(tc("c1")), tool("c1", content))
    assert t.calls[0].result == ToolResult(position=2, text=text, is_error=None)


def test_parse_legacy_function_call_and_function_role() -> None:
    t = parse(
        user(),
        {
            "role": "assistant",
            "content": None,
            "function_call": {"name": "get_weather", "arguments": '{"c":"Oslo"}'},
        },
        {"role": "function", "name": "get_weather", "content": "rain"},
    )
    (call,) = t.calls
    assert (call.call_id, call.name, call.arguments, call.position) == (None, "get_weather", {"c": "Oslo"}, 1)
    assert call.result == ToolResult(2, "rain")
    assert t.steps == (Step(index=0, position=1, calls=(0,), end=2),)
    assert t.newest_step == 0


def test_parse_tool_calls_win_over_legacy_function_call_in_same_message() -> None:
    msg = asst(tc("c1", "new"))
    msg["function_call"] = {"name": "old", "arguments": "{}"}
    t = parse(user(), msg, tool("c1"))
    assert [c.name for c in t.calls] == ["new"]


@pytest.mark.parametrize(
    ("messages", "results", "end"),
    [
        pytest.param(
            [user(), asst(tc("c1")), tool("zzz", "stray")],
            [None],
            None,
            id="unknown_id_ignored_call_stays_unanswered",
        ),
        pytest.param(
            [user(), asst(tc("c1")), tool("c1", "ok"), tool("c1", "dup")],
            [ToolResult(2, "ok")],
            2,
            id="second_result_for_answered_id_ignored",
        ),
        pytest.param(
            [user(), asst(tc("c1")), tool("zzz", "stray"), tool("c1", "ok")],
            [ToolResult(3, "ok")],
            3,
            id="stray_before_real_result_ignored",
        ),
    ],
)
def test_parse_tool_message_without_matching_call_ignored(
    messages: list[dict[str, Any]], results: list[ToolResult | None], end: int | None
) -> None:
    t = parse(*messages)
    assert [c.result for c in t.calls] == results
    assert t.steps[0].end == end


def test_parse_orphan_tool_message_before_any_call_ignored() -> None:
    t = parse(user(), tool("c9", "orphan"))
    assert (t.calls, t.steps, t.newest_step) == ((), (), None)


def test_parse_call_without_result_has_no_result_and_no_step_end() -> None:
    t = parse(user(), asst(tc("c1")))
    assert t.calls[0].result is None
    assert t.steps == (Step(index=0, position=1, calls=(0,), end=None),)
    assert t.newest_step == 0


def test_parse_partially_answered_parallel_step_ends_at_last_result() -> None:
    t = parse(user(), asst(tc("c1"), tc("c2")), tool("c1"))
    assert [c.result for c in t.calls] == [ToolResult(2, "ok"), None]
    assert t.steps[0].end == 2


def test_parse_reused_call_id_pairs_each_result_with_its_own_step() -> None:
    t = parse(
        user(),
        asst(tc("call_0", "read_file", '{"path":"a.py"}')),
        tool("call_0", "A"),
        asst(tc("call_0", "read_file", '{"path":"b.py"}')),
        tool("call_0", "B"),
    )
    assert [(c.step, c.arguments["path"], c.result) for c in t.calls] == [
        (0, "a.py", ToolResult(2, "A")),
        (1, "b.py", ToolResult(4, "B")),
    ]
    assert [(s.position, s.end) for s in t.steps] == [(1, 2), (3, 4)]


def test_parse_duplicate_id_within_one_step_pairs_results_in_listed_order() -> None:
    t = parse(user(), asst(tc("dup", "a"), tc("dup", "b")), tool("dup", "ra"), tool("dup", "rb"))
    assert [(c.name, c.result) for c in t.calls] == [("a", ToolResult(2, "ra")), ("b", ToolResult(3, "rb"))]


def test_parse_parallel_calls_keep_listed_order_whatever_result_order() -> None:
    t = parse(
        user(),
        asst(tc("c1", "a"), tc("c2", "b"), tc("c3", "c")),
        tool("c3", "r3"),
        tool("c1", "r1"),
        tool("c2", "r2"),
    )
    assert [(c.seq, c.name, c.position, c.result) for c in t.calls] == [
        (0, "a", 1, ToolResult(3, "r1")),
        (1, "b", 1, ToolResult(4, "r2")),
        (2, "c", 1, ToolResult(2, "r3")),
    ]
    assert t.steps == (Step(index=0, position=1, calls=(0, 1, 2), end=4),)


def test_parse_tool_message_without_id_answers_oldest_pending_call_of_latest_step() -> None:
    t = parse(user(), asst(tc("c1", "a"), tc("c2", "b")), tool(None, "first"), tool(None, "second"))
    assert [c.result for c in t.calls] == [ToolResult(2, "first"), ToolResult(3, "second")]


def test_parse_turn_numbers_count_user_messages_before_the_call() -> None:
    t = parse(
        system(),
        asst(tc("c0")),
        tool("c0"),
        user("one"),
        asst(tc("c1")),
        tool("c1"),
        user("two"),
        asst(tc("c2")),
        tool("c2"),
        asst(tc("c3")),
        tool("c3"),
    )
    assert [c.turn for c in t.calls] == [0, 1, 2, 2]
    assert t.user_positions == (3, 6)
    assert [c.step for c in t.calls] == [0, 1, 2, 3]
    assert t.message_count == 11


def test_parse_assistant_text_positions() -> None:
    t = parse(
        user(),
        asst(content="Let me look."),
        asst(tc("c1"), content="Reading it now"),
        tool("c1"),
        asst(content="   "),
        asst(content=[{"type": "text", "text": "Done"}]),
    )
    assert t.assistant_text_positions == (1, 2, 5)


@pytest.mark.parametrize(
    ("tail", "newest"),
    [
        pytest.param([], 1, id="ends_with_tool_results"),
        pytest.param([tool("zzz", "stray")], 1, id="stray_tool_message_keeps_newest"),
        pytest.param([user("thanks")], None, id="user_message_follows"),
        pytest.param([asst(content="All done.")], None, id="assistant_text_follows"),
        pytest.param([asst(content=None)], None, id="empty_assistant_follows"),
        pytest.param([system("note")], None, id="system_message_follows"),
        pytest.param([user("more"), asst(tc("c3")), tool("c3")], 2, id="new_step_after_user_is_newest"),
    ],
)
def test_parse_newest_step(tail: list[dict[str, Any]], newest: int | None) -> None:
    t = parse(user(), asst(tc("c1")), tool("c1"), asst(tc("c2")), tool("c2"), *tail)
    assert t.newest_step == newest
    assert [t.is_fresh(i) for i in range(len(t.steps))] == [i == newest for i in range(len(t.steps))]


def test_parse_no_steps_newest_none() -> None:
    t = parse(system(), user())
    assert (t.calls, t.steps, t.newest_step, t.user_positions) == ((), (), None, (1,))


@pytest.mark.parametrize(
    "body",
    [
        pytest.param([], id="body_is_array"),
        pytest.param("hello", id="body_is_string"),
        pytest.param(None, id="body_is_null"),
        pytest.param({"model": "m"}, id="messages_missing"),
        pytest.param({"messages": {"0": user()}}, id="messages_is_object"),
        pytest.param({"messages": "hi"}, id="messages_is_string"),
        pytest.param({"messages": [user(), "hi"]}, id="message_is_string"),
        pytest.param({"messages": [None]}, id="message_is_null"),
        pytest.param({"messages": [[user()]]}, id="message_is_array"),
    ],
)
def test_parse_unreadable_body_raises_dialect_error(body: Any) -> None:
    with pytest.raises(DialectError):
        parse_request(body)


# --- apply ---------------------------------------------------------------------------------------------


def apply(body: dict[str, Any], actions: list[Any]) -> bool:
    """``apply_bytes`` on ``body`` written with spaces (as json.dumps does), decoded back into
    ``body``; True when it changed the body."""
    out = apply_bytes(json.dumps(body).encode(), actions)
    if out is None:
        return False
    body.clear()
    body.update(json.loads(out))
    return True


def remind(after: int, text: str, delivery: str = "user") -> Remind:
    return Remind(
        after=after, text=text, rule="t", tool="read_file", count=3, limit=3, fresh=True, delivery=delivery
    )


def withhold(position: int, text: str) -> Withhold:
    return Withhold(
        position=position, call_id="c1", text=text, rule="t", tool="read_file", count=7, limit=6, fresh=True
    )


def base_body() -> dict[str, Any]:
    """0 system, 1 user, 2 assistant(c1,c2), 3 tool c1 (string), 4 tool c2 (array), 5 assistant(c3),
    6 tool c3 (string)."""
    return {
        "model": "m",
        "messages": [
            system(),
            user(),
            asst(tc("c1"), tc("c2")),
            tool("c1", "r1"),
            tool("c2", [{"type": "text", "text": "r2"}]),
            asst(tc("c3")),
            tool("c3", "r3"),
        ],
    }


S, U, A, T = "system", "user", "assistant", "tool"


@pytest.mark.parametrize(
    ("actions", "roles", "inserted"),
    [
        pytest.param([remind(4, "X")], [S, U, A, T, T, U, A, T], {5: "X"}, id="after_middle_step"),
        pytest.param([remind(6, "X")], [S, U, A, T, T, A, T, U], {7: "X"}, id="after_last_message"),
        pytest.param(
            [remind(4, "X"), remind(6, "Y")],
            [S, U, A, T, T, U, A, T, U],
            {5: "X", 8: "Y"},
            id="two_positions_earlier_stays_valid",
        ),
        pytest.param(
            [remind(6, "Y"), remind(4, "X")],
            [S, U, A, T, T, U, A, T, U],
            {5: "X", 8: "Y"},
            id="two_positions_action_order_irrelevant",
        ),
        pytest.param(
            [remind(3, "W"), remind(4, "X"), remind(6, "Y")],
            [S, U, A, T, U, T, U, A, T, U],
            {4: "W", 6: "X", 9: "Y"},
            id="three_positions",
        ),
        pytest.param(
            [remind(4, "X"), remind(4, "Y")], [S, U, A, T, T, U, A, T], {5: "X\n\nY"}, id="same_pos_merged"
        ),
        pytest.param(
            [remind(4, "Y"), remind(4, "X")],
            [S, U, A, T, T, U, A, T],
            {5: "Y\n\nX"},
            id="merged_in_action_order",
        ),
    ],
)
def test_apply_inserts_user_reminders_after_position(
    actions: list[Remind], roles: list[str], inserted: dict[int, str]
) -> None:
    body = base_body()
    assert apply(body, actions) is True
    msgs = body["messages"]
    assert [m["role"] for m in msgs] == roles
    for pos, text in inserted.items():
        assert msgs[pos] == {"role": "user", "content": text}
    original = [m for i, m in enumerate(msgs) if i not in inserted]
    assert original == base_body()["messages"]


@pytest.mark.parametrize(
    ("actions", "position", "content"),
    [
        pytest.param(
            [remind(6, "R", "tool_suffix")], 6, "r3\n\nR", id="string_content_gets_blank_line_and_text"
        ),
        pytest.param(
            [remind(4, "R", "tool_suffix")],
            4,
            [{"type": "text", "text": "r2"}, {"type": "text", "text": "R"}],
            id="array_content_gets_text_part",
        ),
        pytest.param(
            [remind(6, "A", "tool_suffix"), remind(6, "B", "tool_suffix")],
            6,
            "r3\n\nA\n\nB",
            id="two_suffixes_merged",
        ),
        pytest.param(
            [withhold(6, "denied"), remind(6, "R", "tool_suffix")],
            6,
            "denied\n\nR",
            id="suffix_after_withhold",
        ),
        pytest.param(
            [remind(6, "R", "tool_suffix"), withhold(6, "denied")],
            6,
            "denied\n\nR",
            id="withhold_applied_first_whatever_order",
        ),
    ],
)
def test_apply_tool_suffix_appends_to_tool_result(actions: list[Any], position: int, content: Any) -> None:
    body = base_body()
    assert apply(body, actions) is True
    msgs = body["messages"]
    assert [m["role"] for m in msgs] == [S, U, A, T, T, A, T]
    assert msgs[position]["content"] == content
    assert msgs[position]["tool_call_id"] == base_body()["messages"][position]["tool_call_id"]


@pytest.mark.parametrize(
    ("content", "expected"),
    [pytest.param(None, "R", id="null_content"), pytest.param("", "R", id="empty_string_content")],
)
def test_apply_tool_suffix_on_empty_content_is_just_the_text(content: Any, expected: str) -> None:
    body = {"messages": [user(), asst(tc("c1")), tool("c1", content)]}
    assert apply(body, [remind(2, "R", "tool_suffix")]) is True
    assert body["messages"][2]["content"] == expected


@pytest.mark.parametrize(
    ("position", "before"),
    [
        pytest.param(3, "r1", id="string_content"),
        pytest.param(4, [{"type": "text", "text": "r2"}], id="array_content_becomes_string"),
    ],
)
def test_apply_withhold_replaces_content_with_text(position: int, before: Any) -> None:
    body = base_body()
    assert body["messages"][position]["content"] == before
    assert apply(body, [withhold(position, "Denied: repeated call.")]) is True
    msgs = body["messages"]
    assert msgs[position] == {
        "role": "tool",
        "tool_call_id": msgs[position]["tool_call_id"],
        "content": "Denied: repeated call.",
    }
    assert len(msgs) == 7
    assert [m for i, m in enumerate(msgs) if i != position] == [
        m for i, m in enumerate(base_body()["messages"]) if i != position
    ]


def test_apply_withhold_and_user_reminder_together() -> None:
    body = base_body()
    assert apply(body, [withhold(6, "denied"), remind(6, "R")]) is True
    assert [(m["role"], m["content"]) for m in body["messages"][6:]] == [("tool", "denied"), ("user", "R")]


@pytest.mark.parametrize(
    "actions",
    [
        pytest.param([], id="no_actions"),
        pytest.param([remind(7, "X")], id="remind_past_end"),
        pytest.param([remind(-1, "X")], id="remind_negative"),
        pytest.param([withhold(99, "X")], id="withhold_past_end"),
    ],
)
def test_apply_nothing_applicable_returns_false_and_leaves_body(actions: list[Any]) -> None:
    body = base_body()
    before = copy.deepcopy(body)
    assert apply(body, actions) is False
    assert body == before


# --- apply: bytes the guards did not touch leave as they came ------------------------------------------

RAW = (
    b'{ "model" : "m", "seed": 18446744073709551617, "temperature": 1.0, "top_p": 1E0,\n'
    b' "messages": [ {"role": "user", "content": "hi \\udcff"},\n'
    b'  {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",'
    b' "function": {"name": "f", "arguments": {"n": 123456789012345678901234567890}}}]},\n'
    b'  {"role": "tool", "tool_call_id": "c1", "content": "r1 \\u00e9"} ,\n'
    b'  {"role": "tool", "tool_call_id": "c2", "content": [ ]},\n'
    b'  {"role": "tool", "tool_call_id": "c3"},\n'
    b"  {}\n"
    b" ] }"
)
TAIL = b'  {"role": "tool", "tool_call_id": "c2", "content": [ ]},\n'


@pytest.mark.parametrize(
    ("actions", "old", "new"),
    [
        pytest.param(
            [withhold(2, "denied")],
            b'"content": "r1 \\u00e9"}',
            b'"content": "denied"}',
            id="withhold_string",
        ),
        pytest.param(
            [remind(2, "R\u00e9", "tool_suffix")],
            b'"r1 \\u00e9"}',
            '"r1 \\u00e9\\n\\nR\u00e9"}'.encode(),
            id="suffix_inside_the_quotes",
        ),
        pytest.param(
            [remind(3, "R", "tool_suffix")],
            b'"content": [ ]}',
            b'"content": [ {"type":"text","text":"R"}]}',
            id="suffix_to_empty_parts",
        ),
        pytest.param(
            [withhold(4, "denied")],
            b'{"role": "tool", "tool_call_id": "c3"}',
            b'{"content":"denied","role": "tool", "tool_call_id": "c3"}',
            id="withhold_without_content_member",
        ),
        pytest.param(
            [remind(5, "R", "tool_suffix")], b"  {}\n", b'  {"content":"R"}\n', id="suffix_to_empty_object"
        ),
        pytest.param(
            [remind(2, "R")],
            b'"r1 \\u00e9"} ,',
            b'"r1 \\u00e9"},{"role":"user","content":"R"} ,',
            id="reminder_message_inserted",
        ),
    ],
)
def test_apply_changes_only_the_edited_bytes(actions: list[Any], old: bytes, new: bytes) -> None:
    assert RAW.count(old) == 1
    assert apply_bytes(RAW, actions) == RAW.replace(old, new)


def test_apply_output_decodes_with_big_integers_exact() -> None:
    out = apply_bytes(RAW, [withhold(2, "denied"), remind(2, "R")])
    assert out is not None
    body = json.loads(out)
    assert body["seed"] == 18446744073709551617
    assert body["messages"][1]["tool_calls"][0]["function"]["arguments"] == {
        "n": 123456789012345678901234567890
    }
    assert body["messages"][0]["content"] == "hi \udcff"
    assert [m.get("role") for m in body["messages"]] == [
        "user",
        "assistant",
        "tool",
        "user",
        "tool",
        "tool",
        None,
    ]


@pytest.mark.parametrize(
    "dumps",
    [
        pytest.param(orjson.dumps, id="compact_hints_match"),
        pytest.param(lambda b: json.dumps(b, indent=1).encode(), id="indented_hints_miss"),
        pytest.param(lambda b: json.dumps(b, ensure_ascii=True).encode(), id="ascii_escapes_hints_miss"),
    ],
)
def test_apply_finds_the_same_spans_with_and_without_the_decoded_body(dumps: Any) -> None:
    body = base_body()
    body["messages"][3]["content"] = 'r1 \u00e9 \U0001f600 "q" \\ \n'
    raw = dumps(body)
    actions = [withhold(3, "denied"), remind(4, "R", "tool_suffix"), remind(6, "X")]
    out = apply_bytes(raw, actions, orjson.loads(raw))
    assert out == apply_bytes(raw, actions)
    assert [m.get("content") for m in json.loads(out)["messages"][3:]] == [
        "denied",
        [{"type": "text", "text": "r2"}, {"type": "text", "text": "R"}],
        None,
        "r3",
        "X",
    ]
