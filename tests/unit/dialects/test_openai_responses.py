"""OpenAI Responses dialect, request side: parse_request (input items → Transcript),
apply (actions → byte edits), the same rules acting at the same call as in chat form, and the
real server guarding ``POST /v1/responses``."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy.config import Config
from proxy.core.actions import Remind, Withhold
from proxy.core.effects import progress_rules
from proxy.core.transcript import Said, Step, ToolResult
from proxy.dialects import for_path, openai_chat, openai_responses
from proxy.dialects.openai_responses import apply, parse_request
from proxy.errors import DialectError
from proxy.guards import build_guards
from proxy.request.rewrite import NOT_CHAT, decide_request
from tests.conftest import ProxyFactory
from tests.helpers.fakes import FakeUpstream, repeated_call_messages
from tests.helpers.responses_items import responses_body

CFG = Config()
GUARDS = build_guards(CFG.guards, *progress_rules(CFG.progress))


def user(text: str = "Fix app.py") -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def call(cid: str, name: str = "exec_command", args: str = '{"cmd": "ls"}') -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{cid}", "call_id": cid, "name": name, "arguments": args}


def output(cid: str, out: Any = "ok") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": cid, "output": out}


REASONING = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"}


# --- parse_request -------------------------------------------------------------------------------------


def test_path_registry_maps_suffixes_to_dialects() -> None:
    assert for_path("/v1/responses") is openai_responses
    assert for_path("/openai/v1/chat/completions") is openai_chat
    assert for_path("/v1/messages/count_tokens") is None
    assert for_path("/v1/responses/resp_1/input_items") is None


def test_string_input_is_one_user_message_without_calls() -> None:
    t = parse_request({"model": "m", "input": "hello"})
    assert (t.calls, t.steps, t.user_positions, t.message_count, t.newest_step) == ((), (), (0,), 1, None)
    assert t.said == (Said(0, "user", "hello"),)


def test_items_become_calls_steps_and_results() -> None:
    items = [
        {"role": "developer", "content": "be brief"},  # typeless: a message
        user("task"),
        REASONING,
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
        call("c1"),
        REASONING,  # inside the run of calls: same step
        {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
        output("c2", [{"type": "input_text", "text": "patched"}, {"type": "input_image", "image_url": "x"}]),
        output("c1", "file.py"),
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        call("c3", args='{"cmd": "pytest"}'),
        {"type": "custom_tool_call_output", "call_id": "c3", "output": "1 passed"},
    ]
    t = parse_request({"input": items})
    assert [(c.seq, c.step, c.turn, c.position, c.call_id, c.name) for c in t.calls] == [
        (0, 0, 1, 4, "c1", "exec_command"),
        (1, 0, 1, 4, "c2", "apply_patch"),
        (2, 1, 1, 10, "c3", "exec_command"),
    ]
    assert t.calls[0].arguments == {"cmd": "ls"}
    assert t.calls[1].arguments_raw == "*** Begin Patch"
    assert [c.result for c in t.calls] == [
        ToolResult(8, "file.py"),
        ToolResult(7, "patched"),
        ToolResult(11, "1 passed"),
    ]
    assert t.steps == (Step(0, 4, (0, 1), 8), Step(1, 10, (2,), 11))
    assert (t.user_positions, t.assistant_text_positions, t.message_count, t.newest_step) == (
        (1,),
        (3,),
        12,
        1,
    )
    assert t.said == (Said(1, "user", "task"), Said(3, "assistant", "Looking.", True))


@pytest.mark.parametrize(
    ("items", "newest"),
    [
        pytest.param([user(), call("c1"), output("c1")], 0, id="ends_with_outputs"),
        pytest.param([user(), call("c1"), output("c1"), REASONING], 0, id="reasoning_after_outputs"),
        pytest.param([user(), call("c1"), output("c1"), user("more")], None, id="user_after_step"),
        pytest.param([user(), call("c1"), output("c1"), output("zz")], 0, id="orphan_output_ignored"),
    ],
)
def test_newest_step_is_the_last_one_when_only_its_outputs_follow(
    items: list[Any], newest: int | None
) -> None:
    assert parse_request({"input": items}).newest_step == newest


@pytest.mark.parametrize(
    "body",
    [
        pytest.param([], id="not_an_object"),
        pytest.param({"input": 3}, id="input_not_list_or_string"),
        pytest.param({"messages": []}, id="no_input"),
        pytest.param({"input": ["hi"]}, id="item_not_an_object"),
    ],
)
def test_unreadable_shapes_raise_dialect_error(body: Any) -> None:
    with pytest.raises(DialectError):
        parse_request(body)


# --- apply ----------------------------------------------------------------------------------------------


def remind(after: int, text: str, delivery: str = "user") -> Remind:
    return Remind(after=after, text=text, rule="t", tool="x", count=3, limit=3, fresh=True, delivery=delivery)


def withhold(position: int, text: str) -> Withhold:
    return Withhold(
        position=position, call_id="c", text=text, rule="t", tool="x", count=7, limit=6, fresh=True
    )


RAW = (
    b'{"model":"m","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"go"}]},'
    b'{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},'
    b'{"type":"function_call_output","call_id":"c1","output":"r1"},'
    b'{"type":"function_call_output","call_id":"c2","output":[{"type":"input_text","text":"r2"}]},'
    b'{"type":"message","role":"assistant","content":[{"type":"output_text","text":"a"}]}],"seed":18446744073709551617}'
)
REMINDER_ITEM = b'{"type":"message","role":"user","content":[{"type":"input_text","text":"R"}]}'


@pytest.mark.parametrize(
    ("actions", "old", "new"),
    [
        pytest.param(
            [withhold(2, "denied")], b'"output":"r1"', b'"output":"denied"', id="withhold_string_output"
        ),
        pytest.param(
            [withhold(3, "denied")],
            b'"output":[{"type":"input_text","text":"r2"}]',
            b'"output":"denied"',
            id="withhold_parts_output_becomes_string",
        ),
        pytest.param(
            [remind(2, "R")], b'"output":"r1"},', b'"output":"r1"},' + REMINDER_ITEM + b",", id="item"
        ),
        pytest.param(
            [remind(2, "R", "tool_suffix")],
            b'"output":"r1"',
            b'"output":"r1\\n\\nR"',
            id="suffix_string_output",
        ),
        pytest.param(
            [remind(3, "R", "tool_suffix")],
            b'"text":"r2"}]',
            b'"text":"r2"},{"type":"input_text","text":"R"}]',
            id="suffix_parts_output_input_text",
        ),
        pytest.param(
            [remind(4, "R", "tool_suffix")],
            b'"text":"a"}]',
            b'"text":"a"},{"type":"output_text","text":"R"}]',
            id="suffix_assistant_message_output_text",
        ),
    ],
)
def test_apply_changes_only_the_edited_bytes(actions: list[Any], old: bytes, new: bytes) -> None:
    assert RAW.count(old) == 1
    assert apply(RAW, actions) == RAW.replace(old, new)
    assert apply(RAW, actions, orjson.loads(RAW)) == RAW.replace(old, new)


def test_apply_never_acts_on_a_string_input() -> None:
    raw = b'{"model":"m","input":"hi"}'
    assert apply(raw, [remind(0, "R")]) is None


# --- the same rules act at the same call as in chat form ------------------------------------------------


def summary(actions: Any) -> list[tuple[str, str, bool, int, str]]:
    return [(a.rule, a.kind, a.fresh, a.count, a.tool) for a in actions]


@pytest.mark.parametrize("n", [2, 3, 5, 6, 7, 8])
def test_a_repeated_call_gets_the_same_actions_as_in_chat_form(n: int) -> None:
    messages = repeated_call_messages(n)
    chat = decide_request(json.dumps({"model": "m", "messages": messages}).encode(), {}, GUARDS, ())
    raw = json.dumps(responses_body(messages)).encode()
    resp = decide_request(raw, {}, GUARDS, (), dialect=openai_responses)
    assert summary(resp.actions) == summary(chat.actions)
    assert resp.unguarded is None
    assert resp.changed == chat.changed


def test_seventh_call_pinned_in_responses_form() -> None:
    raw = json.dumps(responses_body(repeated_call_messages(7))).encode()
    d = decide_request(raw, {}, GUARDS, (), dialect=openai_responses)
    assert [
        (a.rule, a.kind, getattr(a, "position", getattr(a, "after", -1)), a.fresh) for a in d.actions
    ] == [
        ("repeat_reminder", "remind", 6, False),
        ("repeat_reminder", "remind", 10, False),
        ("circuit_breaker", "withhold", 14, True),
        ("escalation", "withhold", 12, False),
        ("escalation", "withhold", 14, True),
    ]
    items = json.loads(d.body)["input"]
    assert [i["type"] for i in items[6:10]] == [
        "function_call_output",
        "message",
        "function_call",
        "function_call_output",
    ]
    assert items[7]["role"] == "user" and items[7]["content"][0]["type"] == "input_text"
    assert items[7]["content"][0]["text"].startswith("[loopguard]")
    assert items[-1]["output"] == next(a.text for a in d.actions if a.kind == "withhold" and a.fresh)


def test_non_responses_json_is_counted_not_chat() -> None:
    raw = b'{"model": "m", "input": 3}'
    d = decide_request(raw, {}, GUARDS, (), dialect=openai_responses)
    assert (d.body is raw, d.actions, d.unguarded) == (True, (), NOT_CHAT)


# --- through the real server ----------------------------------------------------------------------------

ANSWER = (
    b'{"id":"resp_1","object":"response","status":"completed","output":[{"type":"function_call",'
    b'"id":"fc_8","call_id":"call_8","name":"read_file","arguments":"{\\"path\\": \\"app.py\\"}",'
    b'"status":"completed"}],"usage":{"input_tokens":10,"output_tokens":5,"total_tokens":15}}'
)


async def test_server_guards_responses_requests(upstream: FakeUpstream, make_proxy: ProxyFactory) -> None:
    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.Response(body=ANSWER, content_type="application/json")

    upstream.handler = handler
    base = await make_proxy()
    looping = json.dumps(responses_body(repeated_call_messages(7))).encode()
    plain = json.dumps(responses_body(repeated_call_messages(1))).encode()
    async with aiohttp.ClientSession() as s:
        answers = []
        for raw in (looping, plain, b'"hi"'):
            async with s.post(
                f"{base}/v1/responses", data=raw, headers={"Content-Type": "application/json"}
            ) as r:
                answers.append((r.status, await r.read()))
        async with s.get(f"{base}/loop-guard") as r:
            stats = await r.json()
    got = [r.body for r in upstream.requests]
    assert got == [decide_request(looping, {}, GUARDS, (), dialect=openai_responses).body, plain, b'"hi"']
    assert got[0] != looping
    assert answers[1:] == [(200, ANSWER), (200, ANSWER)]  # nothing to decide: byte for byte
    stopped = json.loads(answers[0][1])  # the looping answer ends the turn (responses_answer)
    assert [(i["type"], i["role"]) for i in stopped["output"]] == [("message", "assistant")]
    text = stopped["output"][0]["content"][0]["text"]
    assert text.startswith("[loopguard] Stopped: the model kept calling read_file")
    assert stopped["usage"] == json.loads(ANSWER)["usage"]
    assert (
        stats["guarded_requests"],
        stats["rewritten_requests"],
        stats["results_withheld"],
        stats["stops"],
    ) == (
        2,  # the string input "hi" is not a Responses request: counted under unguarded
        1,
        1,  # one result, withheld by two guards
        1,
    )
    assert stats["unguarded"] == {NOT_CHAT: 1}
