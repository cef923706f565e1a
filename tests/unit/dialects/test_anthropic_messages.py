"""Anthropic Messages dialect, request side: parse_request (messages → Transcript over
slots), apply (actions → byte edits), the same rules acting at the same call as in chat form,
path matching, and the real server guarding ``POST /v1/messages``."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from proxy.config import Config, build
from proxy.core.actions import Remind, Withhold
from proxy.core.effects import progress_rules
from proxy.core.transcript import Said, Step, ToolResult
from proxy.dialects import anthropic_messages, for_path, openai_chat, openai_responses
from proxy.dialects.anthropic_messages import Slot, apply, parse_request, slots
from proxy.errors import DialectError
from proxy.guards import build_guards
from proxy.request.conversation import conversation_key
from proxy.request.rewrite import NOT_CHAT, decide_request
from tests.conftest import ProxyFactory
from tests.helpers.fakes import FakeUpstream, repeated_call_messages
from tests.helpers.messages_blocks import message_events, messages_body

CFG = Config()
GUARDS = build_guards(CFG.guards, *progress_rules(CFG.progress))


def text(t: str, **extra: Any) -> dict[str, Any]:
    return {"type": "text", "text": t, **extra}


def use(cid: str, name: str = "Read", inp: Any = None) -> dict[str, Any]:
    return {"type": "tool_use", "id": cid, "name": name, "input": {"file_path": "/a"} if inp is None else inp}


def result(cid: str | None, content: Any = "ok", **extra: Any) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result"}
    if cid is not None:
        block["tool_use_id"] = cid
    return {**block, "content": content, **extra}


THINKING = {"type": "thinking", "thinking": "Let me look.", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA"}


# --- paths ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "dialect"),
    [
        ("/v1/messages", anthropic_messages),
        ("/anthropic/v1/messages", anthropic_messages),
        ("/v1/messages/count_tokens", None),  # passthrough
        ("/v1/messages/batches", None),
        ("/v1/threads/thread_1/messages", None),  # OpenAI Assistants: not Anthropic Messages
        ("/v1/models", None),
        ("/v1/chat/completions", openai_chat),
        ("/v1/responses", openai_responses),
    ],
)
def test_path_selects_the_messages_dialect_only_for_v1_messages(path: str, dialect: Any) -> None:
    assert for_path(path) is dialect


# --- parse_request ------------------------------------------------------------------------------------


def test_string_content_and_system_are_not_history() -> None:
    t = parse_request(
        {"system": [text("You are Claude Code.")], "messages": [{"role": "user", "content": "hi"}]}
    )
    assert (t.calls, t.steps, t.user_positions, t.message_count, t.newest_step) == ((), (), (0,), 1, None)
    assert t.said == (Said(0, "user", "hi"),)


def test_blocks_become_calls_steps_and_results_one_slot_per_result() -> None:
    messages = [
        {"role": "user", "content": [text("Fix app.py", cache_control={"type": "ephemeral"})]},
        {
            "role": "assistant",
            "content": [THINKING, text("Reading both."), use("t1"), use("t2", "Grep", {"q": 1})],
        },
        {"role": "user", "content": [result("t2", [text("hit")]), result("t1", "boom", is_error=True)]},
    ]
    assert slots(messages) == [
        Slot(0, None, "user"),
        Slot(1, None, "assistant"),
        Slot(2, 0, "result"),
        Slot(2, 1, "result"),
    ]
    t = parse_request({"model": "m", "messages": messages})
    assert [(c.seq, c.call_id, c.name, c.arguments, c.position, c.turn) for c in t.calls] == [
        (0, "t1", "Read", {"file_path": "/a"}, 1, 1),
        (1, "t2", "Grep", {"q": 1}, 1, 1),
    ]
    assert [c.result for c in t.calls] == [ToolResult(3, "boom", True), ToolResult(2, "hit", None)]
    assert t.steps == (Step(0, 1, (0, 1), 3),)
    assert (t.user_positions, t.assistant_text_positions, t.message_count, t.newest_step) == (
        (0,),
        (1,),
        4,
        0,
    )
    assert t.said == (Said(0, "user", "Fix app.py"), Said(1, "assistant", "Reading both.", True))


@pytest.mark.parametrize(
    ("user_blocks", "kinds", "users", "newest"),
    [
        pytest.param([result("t1")], ["result"], (0,), 0, id="results_only_no_turn"),
        pytest.param(
            [result("t1"), text("[Request interrupted by user]")],
            ["result", "user"],
            (0, 3),
            None,
            id="results_then_text_is_results_then_a_turn_start",
        ),
        pytest.param(
            [result("t1"), {"type": "search_result", "source": "x", "title": "t", "content": []}],
            ["result"],
            (0,),
            0,
            id="unknown_block_beside_results_no_turn",
        ),
        pytest.param([{"type": "image", "source": {}}], ["user"], (0, 2), None, id="image_alone_is_a_turn"),
        pytest.param([], ["user"], (0, 2), None, id="empty_blocks_are_a_user_message"),
    ],
)
def test_what_starts_a_turn_in_a_user_message(
    user_blocks: list[Any], kinds: list[str], users: tuple[int, ...], newest: int | None
) -> None:
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [use("t1")]},
        {"role": "user", "content": user_blocks},
    ]
    assert [s.kind for s in slots(messages)][2:] == kinds
    t = parse_request({"messages": messages})
    assert (t.user_positions, t.newest_step) == (users, newest)


@pytest.mark.parametrize(
    ("tail", "newest"),
    [
        pytest.param([], 0, id="results_last"),
        pytest.param(
            [{"role": "system", "content": "The user hasn't heard from you."}],
            0,
            id="system_note_after_results",
        ),
        pytest.param([{"role": "user", "content": "stop"}], None, id="user_after_results"),
        pytest.param([{"role": "assistant", "content": "Done."}], None, id="assistant_after_results"),
    ],
)
def test_a_system_note_after_the_results_still_ends_with_that_step(
    tail: list[Any], newest: int | None
) -> None:
    """Claude Code puts ``"role": "system"`` notes between a step's results and the next answer."""
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [use("t1")]},
        {"role": "user", "content": [result("t1")]},
        *tail,
    ]
    t = parse_request({"messages": messages})
    assert (t.newest_step, t.message_count, t.user_positions[:1]) == (newest, 3 + len(tail), (0,))
    assert [s.kind for s in slots(messages)][3:] == [
        {"system": "other", "user": "user", "assistant": "assistant"}[m["role"]] for m in tail
    ]


def test_result_without_id_answers_the_oldest_waiting_call_of_the_latest_step() -> None:
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [use("t1"), use("t2")]},
        {"role": "user", "content": [result("t2", "second"), result(None, "first")]},
    ]
    t = parse_request({"messages": messages})
    assert [(c.call_id, c.result) for c in t.calls] == [
        ("t1", ToolResult(3, "first")),
        ("t2", ToolResult(2, "second")),
    ]


def test_server_tools_and_thinking_are_not_calls_or_text() -> None:
    messages = [
        {"role": "user", "content": "search"},
        {
            "role": "assistant",
            "content": [
                THINKING,
                {"type": "redacted_thinking", "data": "EmwKAhgBEgy"},
                {
                    "type": "server_tool_use",
                    "id": "srvtoolu_1",
                    "name": "web_search",
                    "input": {"query": "x"},
                },
                {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
                text("Found it."),
            ],
        },
    ]
    t = parse_request({"messages": messages})
    assert (t.calls, t.steps, t.assistant_text_positions) == ((), (), (1,))
    assert t.said[1] == Said(1, "assistant", "Found it.", False)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param([], id="not_an_object"),
        pytest.param({"messages": "hi"}, id="messages_not_a_list"),
        pytest.param({"messages": [3]}, id="message_not_an_object"),
        pytest.param({"prompt": "hi"}, id="no_messages"),
    ],
)
def test_unreadable_shapes_raise_dialect_error(body: Any) -> None:
    with pytest.raises(DialectError):
        parse_request(body)


# --- apply: exact bytes -------------------------------------------------------------------------------


def withhold(position: int, t: str = "DENIED") -> Withhold:
    return Withhold(position=position, call_id="t", text=t, rule="r", tool="x", count=7, limit=6, fresh=True)


def remind(after: int, t: str = "R", delivery: Any = "user") -> Remind:
    return Remind(after=after, text=t, rule="r", tool="x", count=3, limit=None, fresh=True, delivery=delivery)


# slots: 0 user "go", 1 assistant (thinking + 2 tool_use), 2 result t1 (string, cache_control on the
# block), 3 result t2 (blocks), 4 assistant text, 5 result t3 (blocks with cache_control inside),
# 6 result t4 (no content), 7 the user's text after them, 8 assistant text only
RAW = (
    b'{"model":"claude-x","max_tokens":1024,"system":[{"type":"text","text":"sys","cache_control":{"type":"ephemeral"}}],'
    b'"messages":[{"role":"user","content":"go"},'
    b'{"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"c2ln"},'
    b'{"type":"tool_use","id":"t1","name":"Read","input":{"n":1.0}},{"type":"tool_use","id":"t2","name":"Read","input":{}}]},'
    b'{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"r1","cache_control":{"type":"ephemeral"}},'
    b'{"type":"tool_result","tool_use_id":"t2","content":[{"type":"text","text":"r2"}],"is_error":true}]},'
    b'{"role":"assistant","content":[{"type":"text","text":"again"},{"type":"tool_use","id":"t3","name":"Read","input":{}},'
    b'{"type":"tool_use","id":"t4","name":"Read","input":{}}]},'
    b'{"role":"user","content":[{"type":"tool_result","tool_use_id":"t3","content":[{"type":"text","text":"r3","cache_control":{"type":"ephemeral"}}]},'
    b'{"type":"tool_result","tool_use_id":"t4"},{"type":"text","text":"hook says hi"}]},'
    b'{"role":"assistant","content":"ok"}],"seed":18446744073709551617}'
)
TEXT_R = b'{"type":"text","text":"R"}'


def test_raw_fixture_has_the_slots_the_table_below_uses() -> None:
    body = orjson.loads(RAW)
    assert [(s.message, s.block, s.kind) for s in slots(body["messages"])] == [
        (0, None, "user"),
        (1, None, "assistant"),
        (2, 0, "result"),
        (2, 1, "result"),
        (3, None, "assistant"),
        (4, 0, "result"),
        (4, 1, "result"),
        (4, None, "user"),
        (5, None, "assistant"),
    ]


@pytest.mark.parametrize(
    ("actions", "old", "new"),
    [
        pytest.param(
            [withhold(2)],
            b'"content":"r1","cache_control"',
            b'"content":"DENIED","cache_control"',
            id="withhold_string_content_cache_control_kept",
        ),
        pytest.param(
            [withhold(3)],
            b'"content":[{"type":"text","text":"r2"}],"is_error":true',
            b'"content":"DENIED","is_error":true',
            id="withhold_blocks_become_string_is_error_kept",
        ),
        pytest.param(
            [withhold(5)],
            b'"content":[{"type":"text","text":"r3","cache_control":{"type":"ephemeral"}}]',
            b'"content":[{"type":"text","text":"DENIED","cache_control":{"type":"ephemeral"}}]',
            id="withhold_keeps_an_inner_cache_breakpoint",
        ),
        pytest.param(
            [withhold(6)],
            b'{"type":"tool_result","tool_use_id":"t4"}',
            b'{"content":"DENIED","type":"tool_result","tool_use_id":"t4"}',
            id="withhold_missing_content_added",
        ),
        pytest.param(
            [remind(3)],
            b'"is_error":true}]},',
            b'"is_error":true},' + TEXT_R + b"]},",
            id="remind_text_block_after_the_results",
        ),
        pytest.param(
            [remind(2)],
            b'"is_error":true}]},',
            b'"is_error":true},' + TEXT_R + b"]},",
            id="remind_after_a_parallel_result_goes_after_the_last_result",
        ),
        pytest.param(
            [remind(6)],
            b'"tool_use_id":"t4"},{"type":"text","text":"hook says hi"}',
            b'"tool_use_id":"t4"},' + TEXT_R + b',{"type":"text","text":"hook says hi"}',
            id="remind_between_results_and_user_text",
        ),
        pytest.param(
            [remind(2, delivery="tool_suffix")],
            b'"content":"r1"',
            b'"content":"r1\\n\\nR"',
            id="suffix_string_content",
        ),
        pytest.param(
            [remind(3, delivery="tool_suffix")],
            b'"text":"r2"}]',
            b'"text":"r2"},' + TEXT_R + b"]",
            id="suffix_blocks_content",
        ),
        pytest.param(
            [withhold(3), remind(3, delivery="tool_suffix")],
            b'"content":[{"type":"text","text":"r2"}]',
            b'"content":"DENIED\\n\\nR"',
            id="suffix_after_a_denial",
        ),
        pytest.param(
            [remind(3, "A"), remind(3, "B")],
            b'"is_error":true}]},',
            b'"is_error":true},{"type":"text","text":"A\\n\\nB"}]},',
            id="reminders_for_one_step_merged",
        ),
        pytest.param(
            [remind(0, delivery="tool_suffix")],
            b'"content":"go"',
            b'"content":"go\\n\\nR"',
            id="suffix_user_string",
        ),
        pytest.param(
            [remind(7, delivery="tool_suffix")],
            b'"text":"hook says hi"}]',
            b'"text":"hook says hi"},' + TEXT_R + b"]",
            id="suffix_user_blocks",
        ),
        pytest.param(
            [remind(8)],
            b'"content":"ok"}]',
            b'"content":"ok"},{"role":"user","content":[' + TEXT_R + b"]}]",
            id="remind_after_an_assistant_message_is_a_user_message",
        ),
    ],
)
def test_apply_changes_only_the_edited_bytes(actions: list[Any], old: bytes, new: bytes) -> None:
    assert RAW.count(old) == 1
    assert apply(RAW, actions) == RAW.replace(old, new)
    assert apply(RAW, actions, orjson.loads(RAW)) == RAW.replace(old, new)


@pytest.mark.parametrize(
    "actions",
    [
        pytest.param([withhold(1)], id="withhold_of_an_assistant_message"),
        pytest.param([withhold(0)], id="withhold_of_a_user_message"),
        pytest.param([withhold(9), remind(9)], id="no_such_slot"),
        pytest.param([], id="nothing"),
    ],
)
def test_apply_ignores_actions_that_fall_on_no_result(actions: list[Any]) -> None:
    assert apply(RAW, actions) is None


def test_apply_keeps_pretty_printed_bytes_and_thinking_signatures() -> None:
    body = orjson.loads(RAW)
    pretty = json.dumps(body, indent=2).encode()
    out = apply(pretty, [withhold(5), remind(6)], body)
    assert out is not None
    assert out.count(b'"signature": "c2ln"') == 1 and b'"thinking": "hm"' in out
    got = json.loads(out)["messages"]
    assert got[:4] == body["messages"][:4] and got[5] == body["messages"][5]
    assert got[4]["content"][0]["content"] == [text("DENIED", cache_control={"type": "ephemeral"})]
    assert got[4]["content"][2] == text("R")
    head = b'"tool_use_id": "t3",\n          "content": '
    assert out.startswith(pretty[: pretty.index(head) + len(head)])  # everything before: the same bytes
    hook = pretty.rindex(b"{", 0, pretty.index(b'"text": "hook says hi"'))
    assert out.endswith(pretty[pretty.rindex(b",", 0, hook) :])  # after the inserted block: the same bytes


# --- the same rules act at the same call as in chat form -----------------------------------------------


def summary(actions: Any) -> list[tuple[str, str, bool, int, str]]:
    return [(a.rule, a.kind, a.fresh, a.count, a.tool) for a in actions]


@pytest.mark.parametrize("n", [2, 3, 5, 6, 7, 8])
def test_a_repeated_call_gets_the_same_actions_as_in_chat_form(n: int) -> None:
    messages = repeated_call_messages(n)
    chat = decide_request(json.dumps({"model": "m", "messages": messages}).encode(), {}, GUARDS, ())
    raw = json.dumps(messages_body(messages)).encode()
    got = decide_request(raw, {}, GUARDS, (), dialect=anthropic_messages)
    assert summary(got.actions) == summary(chat.actions)
    assert got.unguarded is None
    assert got.changed == chat.changed


def test_seventh_call_pinned_in_messages_form() -> None:
    raw = json.dumps(messages_body(repeated_call_messages(7))).encode()
    d = decide_request(raw, {}, GUARDS, (), dialect=anthropic_messages)
    assert [
        (a.rule, a.kind, getattr(a, "position", getattr(a, "after", -1)), a.fresh) for a in d.actions
    ] == [
        ("repeat_reminder", "remind", 6, False),
        ("repeat_reminder", "remind", 10, False),
        ("circuit_breaker", "withhold", 14, True),
        ("escalation", "withhold", 12, False),
        ("escalation", "withhold", 14, True),
    ]
    sent = json.loads(raw)["messages"]
    got = json.loads(d.body)["messages"]
    assert len(got) == len(sent) == 15  # no message inserted: reminders are text blocks
    assert [b["type"] for b in got[6]["content"]] == ["tool_result", "text"]  # after call 3's result
    assert got[6]["content"][1]["text"].startswith("[loopguard]")
    assert [b["type"] for b in got[10]["content"]] == ["tool_result", "text"]  # after call 5's
    denial = next(a.text for a in d.actions if a.kind == "withhold" and a.fresh)
    assert got[14]["content"] == [{**sent[14]["content"][0], "content": denial}]  # call 7's result
    assert got[12]["content"][0]["content"].startswith("[loopguard]")  # call 6's, re-derived
    untouched = [i for i in range(15) if i not in (6, 10, 12, 14)]
    assert [got[i] for i in untouched] == [sent[i] for i in untouched]


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        pytest.param(b'{"model": "m", "messages": 3}', NOT_CHAT, id="not_messages"),
        pytest.param(b'"hi"', NOT_CHAT, id="not_an_object"),
        pytest.param(b'{"model": "m", "messages": [', "not_json", id="not_json"),
    ],
)
def test_unreadable_bodies_come_back_unchanged_with_the_reason(raw: bytes, reason: str) -> None:
    d = decide_request(raw, {}, GUARDS, (), dialect=anthropic_messages)
    assert (d.body is raw, d.actions, d.unguarded) == (True, (), reason)


def test_conversation_key_reads_system_first_user_message_and_first_tool_use() -> None:
    def key(body: dict[str, Any]) -> str:
        return conversation_key({}, body, ())

    first = [{"role": "user", "content": "fix"}, {"role": "assistant", "content": [use("toolu_1")]}]
    base = {"system": [text("You are Claude Code.", cache_control={"type": "ephemeral"})], "messages": first}
    longer = {**base, "messages": [*first, {"role": "user", "content": [result("toolu_1")]}]}
    moved = {**longer, "system": [text("You are Claude Code.")]}  # the breakpoint moved: same key
    assert key(base) == key(longer) == key(moved)
    assert key({**base, "system": "Another agent."}) != key(base)
    other_call = {**base, "messages": [first[0], {"role": "assistant", "content": [use("toolu_2")]}]}
    assert key(other_call) != key(base)
    assert key(base).startswith("fp-")


# --- through the real server ----------------------------------------------------------------------------

ANSWER = (
    b'{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[{"type":"tool_use",'
    b'"id":"toolu_8","name":"read_file","input":{"path":"app.py"}}],"stop_reason":"tool_use",'
    b'"stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":5}}'
)


async def test_server_guards_messages_requests_and_passes_the_rest(
    upstream: FakeUpstream, make_proxy: ProxyFactory
) -> None:
    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.Response(body=ANSWER, content_type="application/json")

    upstream.handler = handler
    base = await make_proxy()
    looping = json.dumps(messages_body(repeated_call_messages(7))).encode()
    plain = json.dumps(messages_body(repeated_call_messages(1))).encode()
    sent = [
        ("/v1/messages?beta=true", looping),
        ("/v1/messages", plain),
        ("/v1/messages/count_tokens", looping),  # passthrough: the same bytes arrive
        ("/v1/messages", b'"hi"'),  # not a Messages request: counted
        ("/v1/messages", b"{not json"),
    ]
    async with aiohttp.ClientSession() as s:
        answers = []
        for path, raw in sent:
            async with s.post(f"{base}{path}", data=raw, headers={"Content-Type": "application/json"}) as r:
                answers.append((r.status, await r.read()))
        async with s.get(f"{base}/loop-guard") as r:
            stats = await r.json()
    guarded = decide_request(looping, {}, GUARDS, (), dialect=anthropic_messages).body
    assert [(r.path_qs, r.body) for r in upstream.requests] == [
        ("/v1/messages?beta=true", guarded),
        ("/v1/messages", plain),
        ("/v1/messages/count_tokens", looping),
        ("/v1/messages", b'"hi"'),
        ("/v1/messages", b"{not json"),
    ]
    assert guarded != looping
    # The looping request's answer is stopped (the answer side: proxy.response.messages_stream);
    # every other answer is relayed as it came.
    stopped = orjson.loads(answers[0][1])
    assert (stopped["stop_reason"], [b["type"] for b in stopped["content"]]) == ("end_turn", ["text"])
    assert stopped["content"][0]["text"].startswith("[loopguard] Stopped: the model kept calling read_file")
    assert answers[1:] == [(200, ANSWER)] * 4
    assert (stats["guarded_requests"], stats["rewritten_requests"], stats["results_withheld"]) == (2, 1, 1)
    assert stats["unguarded"] == {NOT_CHAT: 1, "not_json": 1}


async def test_a_messages_stream_cut_midway_ends_with_an_anthropic_error_event(
    upstream: FakeUpstream, make_proxy: ProxyFactory
) -> None:
    """The upstream dies after ``message_start``: the agent gets what came, then an Anthropic
    ``error`` event (``{"type": "error", "error": {"type", "message"}}``, what the SDKs raise from),
    and a broken transfer, never a clean end."""
    start = message_events({"content": "hello"}, "msg_cut")[0]
    assert start.startswith(b"event: message_start\n")

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(start)
        assert request.transport is not None
        request.transport.close()
        return resp

    upstream.handler = handler
    base = await make_proxy()
    raw = json.dumps({**messages_body(repeated_call_messages(1)), "stream": True}).encode()
    got = b""
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{base}/v1/messages?beta=true", data=raw) as r:
            assert r.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                async for chunk in r.content.iter_any():
                    got += chunk
        async with s.get(f"{base}/loop-guard") as r:
            stats = await r.json()
    assert got.startswith(start)
    event, data = got[len(start) :].split(b"\n", 1)
    assert event == b"event: error"
    assert orjson.loads(data.removeprefix(b"data: ")) == {
        "type": "error",
        "error": {
            "type": "upstream_disconnected",
            "message": "loopguard: upstream closed the stream before it finished",
        },
    }
    assert (stats["upstream_errors"], stats["internal_errors"]) == (1, 0)


# --- random bodies -------------------------------------------------------------------------------------

FUZZ_GUARDS = (
    GUARDS,
    build_guards(
        build(Config, {"guards": {"repeat_reminder": {"inject_as": "tool_suffix"}}}).guards,
        *progress_rules(CFG.progress),
    ),
)
_ids = st.sampled_from(["t1", "t2", "t3", None])
_text_block = st.builds(
    lambda t, cc: text(t, **cc),
    st.text(max_size=8),
    st.sampled_from([{}, {"cache_control": {"type": "ephemeral"}}]),
)
_content = st.one_of(st.text(max_size=8), st.lists(_text_block, max_size=2), st.none())
_result = st.builds(
    lambda cid, content, err, missing: {
        k: v
        for k, v in {"type": "tool_result", "tool_use_id": cid, "content": content, "is_error": err}.items()
        if v is not None or k == "type" or (k == "content" and not missing)
    },
    _ids,
    _content,
    st.sampled_from([None, True, False]),
    st.booleans(),
)
_use = st.builds(
    lambda cid, path: {**use(cid or "t1"), "input": {"path": path}}, _ids, st.sampled_from(["a", "b"])
)
_other_block = st.sampled_from(
    [
        THINKING,
        {"type": "redacted_thinking", "data": "x"},
        {"type": "image", "source": {}},
        {"type": "mystery", "x": [1, {"y": None}]},
    ]
)
_message = st.one_of(
    st.builds(
        lambda c: {"role": "user", "content": c},
        st.one_of(st.text(max_size=8), st.lists(st.one_of(_result, _text_block, _other_block), max_size=3)),
    ),
    st.builds(
        lambda c: {"role": "assistant", "content": c},
        st.one_of(st.text(max_size=8), st.lists(st.one_of(_use, _text_block, _other_block), max_size=3)),
    ),
    st.just({"role": "system", "content": "note"}),
)
#: The looping tail: the same call and result again and again, so the guards act.
_LOOP = [
    m
    for n in range(8)
    for m in (
        {"role": "assistant", "content": [use(f"L{n}", "Read", {"path": "x"})]},
        {"role": "user", "content": [result(f"L{n}", "same", cache_control={"type": "ephemeral"})]},
    )
]


def _without_text_blocks_added(before: list[Any], after: list[Any]) -> bool:
    """``after`` is ``before`` with ``text`` blocks inserted (none removed, the rest in order)."""
    i = 0
    for b in after:
        if i < len(before) and b == before[i]:
            i += 1
        elif not (isinstance(b, dict) and b.get("type") == "text"):
            return False
    return i == len(before)


@settings(derandomize=True, deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(_message, max_size=6),
    st.booleans(),
    st.sampled_from([None, 2]),
    st.sampled_from(FUZZ_GUARDS),
)
def test_random_bodies_change_only_results_and_add_only_text(
    head: list[dict[str, Any]], loop: bool, indent: int | None, guards: Any
) -> None:
    """Random Messages bodies: :func:`decide_request` never raises; no change is the very ``raw``
    object; a change keeps every assistant message, every block but a result's ``content``, and
    every other member of a result, and adds only ``text`` blocks (or a user message of them)."""
    messages = [{"role": "user", "content": "go"}, *head, *(_LOOP if loop else [])]
    body = {"model": "m", "max_tokens": 5, "messages": messages, "seed": 18446744073709551617}
    raw = json.dumps(body, indent=indent).encode()
    d = decide_request(raw, {}, guards, (), dialect=anthropic_messages)
    assert d.unguarded is None
    event("changed" if d.changed else "unchanged")
    if not d.changed:
        assert d.body is raw
        return
    got = json.loads(d.body)
    assert {k: v for k, v in got.items() if k != "messages"} == {
        k: v for k, v in body.items() if k != "messages"
    }
    out = iter(got["messages"])
    for m in messages:
        a = next(out)
        while (
            a != m
            and a["role"] == "user"
            and m["role"] != "user"
            and all(b["type"] == "text" for b in a["content"])
        ):
            a = next(out)  # a reminder after an assistant message
        if m["role"] != "user" or not isinstance(m["content"], list):
            assert a == m or (
                m["role"] == "user"
                and a["content"].startswith(m["content"])
                and "[loopguard]" in a["content"]
            )
            continue
        results = [b for b in a["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]
        sent = [b for b in m["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]
        assert [{k: v for k, v in b.items() if k != "content"} for b in results] == [
            {k: v for k, v in b.items() if k != "content"} for b in sent
        ]
        others = [b for b in a["content"] if b not in results]
        assert _without_text_blocks_added([b for b in m["content"] if b not in sent], others)
    assert [
        m for m in out if not (m["role"] == "user" and all(b["type"] == "text" for b in m["content"]))
    ] == []
    assert d.body.startswith(raw[: raw.index(b'"messages"')])  # the bytes before: the same
