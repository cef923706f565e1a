"""Gemini API dialect, request side: parse_request (contents → Transcript over slots), pairing of
``functionResponse`` parts with calls (id, name, order), apply (actions → byte edits), the same
rules acting at the same call as in chat form, the prefix cache reading the same transcript,
path matching, the conversation key, and the real server guarding ``:generateContent`` /
``:streamGenerateContent`` with the API key in a header or in ``?key=`` (passed on, never
logged)."""

from __future__ import annotations

import json
import logging
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy.config import Config
from proxy.core.actions import Remind, Withhold
from proxy.core.effects import progress_rules
from proxy.core.transcript import Said, Step, ToolResult
from proxy.dialects import anthropic_messages, for_path, gemini, openai_chat, openai_responses
from proxy.dialects.gemini import Slot, apply, matches, parse_request, slots
from proxy.errors import DialectError
from proxy.guards import build_guards
from proxy.request.conversation import conversation_key
from proxy.request.prefix_cache import PrefixCache
from proxy.request.rewrite import NOT_CHAT, decide_request
from tests.conftest import ProxyFactory
from tests.helpers.fakes import FakeUpstream, repeated_call_messages
from tests.helpers.gemini_contents import answer_object, gemini_body

CFG = Config()
GUARDS = build_guards(CFG.guards, *progress_rules(CFG.progress))


def user(*parts: Any) -> dict[str, Any]:
    return {"role": "user", "parts": list(parts)}


def model(*parts: Any) -> dict[str, Any]:
    return {"role": "model", "parts": list(parts)}


def fcall(name: str = "read_file", args: Any = None, cid: str | None = None) -> dict[str, Any]:
    call: dict[str, Any] = {"name": name, "args": {"file_path": "a"} if args is None else args}
    if cid is not None:
        call["id"] = cid
    return {"functionCall": call}


def fresp(name: str = "read_file", response: Any = None, cid: str | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = {"name": name, "response": {"output": "ok"} if response is None else response}
    if cid is not None:
        answer["id"] = cid
    return {"functionResponse": answer}


# --- paths ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "dialect"),
    [
        ("/v1beta/models/gemini-2.5-pro:generateContent", gemini),
        ("/v1beta/models/gemini-2.5-pro:streamGenerateContent", gemini),
        ("/v1/models/gemini-2.5-flash:generateContent", gemini),
        ("/gemini/v1beta/models/gemini-2.5-pro:streamGenerateContent", gemini),  # LiteLLM passthrough
        ("/v1/projects/p/locations/us/publishers/google/models/gemini-2.5-pro:generateContent", gemini),
        ("/v1beta/tunedModels/my-model:generateContent", gemini),
        ("/v1beta/models/gemini-2.5-pro:countTokens", None),
        ("/v1beta/models/gemini-2.5-pro:embedContent", None),
        ("/v1beta/models/gemini-2.5-pro", None),
        ("/v1beta/models", None),
        ("/v1/chat/completions", openai_chat),
        ("/v1/responses", openai_responses),
        ("/v1/messages", anthropic_messages),
    ],
)
def test_path_selects_the_gemini_dialect_only_for_generation(path: str, dialect: Any) -> None:
    assert for_path(path) is dialect
    assert matches(path) is (dialect is gemini)


# --- parse ------------------------------------------------------------------------------------------


def test_calls_steps_and_results_one_slot_per_function_response() -> None:
    body = {
        "systemInstruction": {"parts": [{"text": "You are an agent."}]},
        "contents": [
            user({"text": "Fix a."}),
            model(
                {"text": "Two reads.", "thoughtSignature": "s1"},
                fcall(cid="c1"),
                fcall(args={"file_path": "b"}, cid="c2"),
            ),
            user(fresp(cid="c1"), fresp(response={"output": "bee"}, cid="c2")),
            model({"text": "thinking", "thought": True}, fcall("run_shell_command", {"command": "ls"})),
            user(fresp("run_shell_command", {"error": "boom"})),
        ],
    }
    t = parse_request(body)
    assert [(c.seq, c.step, c.turn, c.position, c.call_id, c.name, c.arguments) for c in t.calls] == [
        (0, 0, 1, 1, "c1", "read_file", {"file_path": "a"}),
        (1, 0, 1, 1, "c2", "read_file", {"file_path": "b"}),
        (2, 1, 1, 4, None, "run_shell_command", {"command": "ls"}),
    ]
    assert [c.result for c in t.calls] == [
        ToolResult(2, "ok"),
        ToolResult(3, "bee"),
        ToolResult(5, "boom", True),
    ]
    assert t.steps == (Step(0, 1, (0, 1), 3), Step(1, 4, (2,), 5))
    assert (t.user_positions, t.assistant_text_positions, t.message_count, t.newest_step) == (
        (0,),
        (1,),
        6,
        1,
    )
    assert t.said == (
        Said(0, "user", "Fix a."),
        Said(1, "assistant", "Two reads.", True),
        Said(4, "assistant", "", True),
    )
    assert slots(body["contents"]) == [
        Slot(0, None, "user"),
        Slot(1, None, "model"),
        Slot(2, 0, "result"),
        Slot(2, 1, "result"),
        Slot(3, None, "model"),
        Slot(4, 0, "result"),
    ]


@pytest.mark.parametrize(
    ("answers", "paired"),
    [
        # Gemini CLI: the same ids on both sides
        pytest.param([fresp("b", cid="2"), fresp("a", cid="1")], [("a", 3), ("b", 2)], id="by_id"),
        # the API without ids: by name, the first waiting call with it
        pytest.param([fresp("b"), fresp("a")], [("a", 3), ("b", 2)], id="by_name"),
        # ids the calls do not carry (a client's own): by name still
        pytest.param([fresp("b", cid="x"), fresp("a", cid="y")], [("a", 3), ("b", 2)], id="unknown_ids"),
        # no name that matches: the oldest waiting call of the latest step
        pytest.param([fresp("z"), fresp("z")], [("a", 2), ("b", 3)], id="by_order"),
    ],
)
def test_a_function_response_pairs_by_id_then_name_then_order(
    answers: list[dict[str, Any]], paired: list[tuple[str, int]]
) -> None:
    body = {
        "contents": [user({"text": "go"}), model(fcall("a", {}, "1"), fcall("b", {}, "2")), user(*answers)]
    }
    t = parse_request(body)
    assert [(c.name, c.result.position if c.result else None) for c in t.calls] == paired


@pytest.mark.parametrize(
    ("response", "text", "failed"),
    [
        ({"output": "hi"}, "hi", None),
        ({"error": "no such file"}, "no such file", True),
        ({"output": "partial", "error": "x"}, "partial", None),
        ({"result": "r"}, "r", None),
        ({"content": [1, 2]}, '{"content":[1,2]}', None),
        ("just text", '"just text"', None),
        (None, "", None),
    ],
)
def test_the_result_text_and_the_failure_flag(response: Any, text: str, failed: bool | None) -> None:
    assert gemini.result_text(response) == (text, failed)


@pytest.mark.parametrize(
    ("parts", "kinds"),
    [
        ([fresp()], ["result"]),
        ([fresp(), {"text": "and go on"}], ["result", "user"]),
        ([{"inlineData": {"mimeType": "image/png", "data": "AA=="}}], ["user"]),
        ([], ["user"]),
    ],
)
def test_what_starts_a_turn_in_a_user_content(parts: list[Any], kinds: list[str]) -> None:
    assert [s.kind for s in slots([user(*parts)])] == kinds


@pytest.mark.parametrize(
    "body",
    [
        pytest.param([], id="not_an_object"),
        pytest.param({"contents": {"role": "user"}}, id="contents_not_a_list"),
        pytest.param({"contents": ["hi"]}, id="a_content_not_an_object"),
    ],
)
def test_unreadable_shapes_raise_dialect_error(body: Any) -> None:
    with pytest.raises(DialectError):
        parse_request(body)


# --- apply --------------------------------------------------------------------------------------------

RAW = (
    b'{"contents": [{"role": "user", "parts": [{"text": "go"}]},\n'
    b' {"role": "model", "parts": [{"functionCall": {"name": "read_file", "args": {"file_path": "a"}, '
    b'"id": "c1"}, "thoughtSignature": "sig=="}]},\n'
    b' {"role": "user", "parts": [{"functionResponse": {"id": "c1", "name": "read_file", '
    b'"response": {"output": "1.50"}}}]}],\n "generationConfig": {"temperature": 1.0}}'
)
DENIAL = "[loopguard] withheld"
REMINDER = "[loopguard] remember"


def withhold(pos: int, text: str = DENIAL) -> Withhold:
    return Withhold(pos, None, text, "circuit_breaker", "read_file", 7, 6, True)


def remind(after: int, text: str = REMINDER, delivery: Any = "user") -> Remind:
    return Remind(after, text, "repeat_reminder", "read_file", 3, 3, True, delivery)


@pytest.mark.parametrize(
    ("actions", "old", "new"),
    [
        pytest.param(
            [withhold(2)],
            b'"response": {"output": "1.50"}',
            b'"response": {"error":"[loopguard] withheld"}',
            id="withhold",
        ),
        pytest.param(
            [remind(2)],
            b'"response": {"output": "1.50"}}}]}]',
            b'"response": {"output": "1.50"}}}]},{"role":"user","parts":[{"text":"[loopguard] remember"}]}]',
            id="reminder_after_results",
        ),
        pytest.param(
            [remind(2, delivery="tool_suffix")],
            b'{"output": "1.50"}',
            b'{"output": "1.50\\n\\n[loopguard] remember"}',
            id="tool_suffix",
        ),
        pytest.param(
            [withhold(2), remind(2, delivery="tool_suffix")],
            b'{"output": "1.50"}',
            b'{"error":"[loopguard] withheld\\n\\n[loopguard] remember"}',
            id="withhold_and_suffix",
        ),
        pytest.param(
            [remind(0), remind(0, "second")],
            b'[{"text": "go"}]',
            b'[{"text": "go"},{"text":"[loopguard] remember\\n\\nsecond"}]',
            id="reminders_on_the_users_part_merged",
        ),
    ],
)
def test_apply_changes_only_the_edited_bytes(actions: list[Any], old: bytes, new: bytes) -> None:
    assert RAW.count(old) == 1
    assert apply(RAW, actions) == RAW.replace(old, new)


@pytest.mark.parametrize(
    "actions",
    [[withhold(0)], [withhold(1)], [withhold(3)], [remind(9)], []],
    ids=["user_part", "model_content", "past_the_end", "remind_past_the_end", "none"],
)
def test_apply_ignores_actions_that_fall_on_no_result(actions: list[Any]) -> None:
    assert apply(RAW, actions) is None


def test_a_withheld_response_without_a_response_member_gets_one() -> None:
    raw = b'{"contents":[{"role":"user","parts":[{"functionResponse":{"name":"f"}}]}]}'
    assert apply(raw, [withhold(0)]) == (
        b'{"contents":[{"role":"user","parts":[{"functionResponse":'
        b'{"response":{"error":"[loopguard] withheld"},"name":"f"}}]}]}'
    )


# --- the same rules act at the same call as in chat form ------------------------------------------------


def summary(actions: Any) -> list[tuple[str, str, bool, int, str]]:
    return [(a.rule, a.kind, a.fresh, a.count, a.tool) for a in actions]


@pytest.mark.parametrize("n", [2, 3, 5, 6, 7, 8])
def test_a_repeated_call_gets_the_same_actions_as_in_chat_form(n: int) -> None:
    messages = repeated_call_messages(n)
    chat = decide_request(json.dumps({"model": "m", "messages": messages}).encode(), {}, GUARDS, ())
    raw = json.dumps(gemini_body(messages)).encode()
    got = decide_request(raw, {}, GUARDS, (), dialect=gemini)
    assert summary(got.actions) == summary(chat.actions)
    assert (got.unguarded, got.changed) == (None, chat.changed)


def test_seventh_call_pinned_in_gemini_form() -> None:
    raw = json.dumps(gemini_body(repeated_call_messages(7))).encode()
    d = decide_request(raw, {}, GUARDS, (), dialect=gemini)
    assert [
        (a.rule, a.kind, getattr(a, "position", getattr(a, "after", -1)), a.fresh) for a in d.actions
    ] == [
        ("repeat_reminder", "remind", 6, False),
        ("repeat_reminder", "remind", 10, False),
        ("circuit_breaker", "withhold", 14, True),
        ("escalation", "withhold", 12, False),
        ("escalation", "withhold", 14, True),
    ]
    sent = json.loads(raw)["contents"]
    got = json.loads(d.body)["contents"]
    reminder = [p for p in got[7]["parts"]]
    assert len(got) == len(sent) + 2  # the reminders are user contents of their own
    assert (got[7]["role"], len(reminder), reminder[0]["text"][:11]) == ("user", 1, "[loopguard]")
    assert got[12]["parts"][0]["text"].startswith("[loopguard]")  # after call 5's result
    denial = next(a.text for a in d.actions if a.kind == "withhold" and a.fresh)
    answer = got[16]["parts"][0]["functionResponse"]
    assert answer == {**sent[14]["parts"][0]["functionResponse"], "response": {"error": denial}}
    assert got[14]["parts"][0]["functionResponse"]["response"]["error"].startswith("[loopguard]")  # call 6's
    untouched = [i for i in range(len(sent)) if i not in (12, 14)]
    assert [got[i + (i > 6) + (i > 10)] for i in untouched] == [sent[i] for i in untouched]


@pytest.mark.parametrize("n", [3, 7, 9])
def test_the_prefix_cache_reads_the_same_transcript_and_body(n: int) -> None:
    """Each request of a growing conversation, read with the prefix cache kept between them, gets
    the decision and the bytes a full read gives."""
    cache = PrefixCache(32 * 1024 * 1024)
    for k in range(1, n + 1):
        raw = json.dumps(gemini_body(repeated_call_messages(k))).encode()
        full = decide_request(raw, {}, GUARDS, (), dialect=gemini)
        cached = decide_request(raw, {}, GUARDS, (), dialect=gemini, prefixes=cache)
        assert (summary(cached.actions), cached.body) == (summary(full.actions), full.body)
        assert cached.transcript == full.transcript
    assert cache.stats.hits == n - 1


def test_the_fast_path_resumes_a_big_history_with_the_same_decisions() -> None:
    """Requests past the fast path's size (64 KiB): each after the first resumes the kept prefix
    without decoding the history whole (``fast_hits``), with the decision and bytes of a full
    read, withheld results and reminders included."""
    cache = PrefixCache(32 * 1024 * 1024)
    big = "x = 1\n" * 3000  # ~18 KB a result
    for k in range(4, 10):
        raw = json.dumps(gemini_body(repeated_call_messages(k, result=big))).encode()
        assert len(raw) > 64 * 1024
        full = decide_request(raw, {}, GUARDS, (), dialect=gemini)
        cached = decide_request(raw, {}, GUARDS, (), dialect=gemini, prefixes=cache)
        assert (summary(cached.actions), cached.body) == (summary(full.actions), full.body)
    assert (cache.stats.hits, cache.stats.fast_hits) == (5, 5)
    assert full.changed


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        pytest.param(b'{"contents": 3}', NOT_CHAT, id="contents_not_a_list"),
        pytest.param(b'"hi"', NOT_CHAT, id="not_an_object"),
        pytest.param(b'{"contents": [', "not_json", id="not_json"),
    ],
)
def test_unreadable_bodies_come_back_unchanged_with_the_reason(raw: bytes, reason: str) -> None:
    d = decide_request(raw, {}, GUARDS, (), dialect=gemini)
    assert (d.body is raw, d.actions, d.unguarded) == (True, (), reason)


def test_conversation_key_reads_the_system_instruction_first_user_content_and_first_call() -> None:
    def key(body: dict[str, Any]) -> str:
        return conversation_key({}, body, ())

    first = [user({"text": "fix"}), model(fcall(cid="read_file_1_0"))]
    base = {"systemInstruction": {"parts": [{"text": "You are Gemini CLI."}]}, "contents": first}
    longer = {**base, "contents": [*first, user(fresp(cid="read_file_1_0"))]}
    assert key(base) == key(longer)
    assert key({**base, "systemInstruction": {"parts": [{"text": "Another agent."}]}}) != key(base)
    assert key({**base, "contents": [first[0], model(fcall(cid="read_file_2_0"))]}) != key(base)
    no_ids = {**base, "contents": [first[0], model(fcall())]}
    assert key(no_ids) != key({**base, "contents": [first[0], model(fcall(args={"file_path": "b"}))]})
    assert key(base).startswith("fp-")


# --- through the real server ----------------------------------------------------------------------------

CALL_ANSWER = orjson.dumps(
    answer_object({"role": "model", "parts": [fcall("read_file", {"path": "app.py"})]})
)


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        pytest.param(
            "/v1beta/models/gemini-2.5-pro:generateContent?key=AIzaSECRETQUERYKEY", {}, id="query_key"
        ),
        pytest.param(
            "/v1beta/models/gemini-2.5-pro:generateContent",
            {"x-goog-api-key": "AIzaSECRETHEADERKEY"},
            id="header_key",
        ),
    ],
)
async def test_server_guards_gemini_requests_passes_the_key_and_never_logs_it(
    upstream: FakeUpstream,
    make_proxy: ProxyFactory,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    path: str,
    headers: dict[str, str],
) -> None:
    """A looping request has its result withheld and its answer stopped; the key, in ``?key=``
    or ``x-goog-api-key``, reaches the upstream as sent and appears in no log line; the upstream
    URL without ``/v1`` keeps the ``/v1beta`` path."""

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.Response(body=CALL_ANSWER, content_type="application/json")

    upstream.handler = handler
    base = await make_proxy(None, upstream.url.removesuffix("/v1"))
    looping = json.dumps(gemini_body(repeated_call_messages(7))).encode()
    caplog.set_level(logging.DEBUG)
    async with aiohttp.ClientSession() as s:
        async with s.post(
            f"{base}{path}", data=looping, headers={"Content-Type": "application/json", **headers}
        ) as r:
            status, answer = r.status, await r.read()
        async with s.get(f"{base}/loop-guard") as r:
            stats = await r.json()
    got = upstream.requests[0]
    assert (got.method, got.path_qs) == ("POST", path)
    for name, value in headers.items():
        assert got.headers[name] == value
    assert got.body == decide_request(looping, {}, GUARDS, (), dialect=gemini).body != looping
    stopped = orjson.loads(answer)["candidates"][0]
    assert (status, stopped["finishReason"], list(stopped["content"]["parts"][0])) == (200, "STOP", ["text"])
    assert stopped["content"]["parts"][0]["text"].startswith(
        "[loopguard] Stopped: the model kept calling read_file"
    )
    assert (stats["guarded_requests"], stats["rewritten_requests"], stats["stops"]) == (1, 1, 1)
    # the fake upstream's own access log line is the only one with the path's query (loopguard
    # writes none: access_log=None)
    access = [r for r in caplog.records if r.name == "aiohttp.access"]
    assert len(access) == 1 and "127.0.0.1" in access[0].getMessage()
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name != "aiohttp.access")
    logged += capsys.readouterr().out
    assert "request" in logged and "generateContent" in logged
    assert "SECRET" not in logged


@pytest.mark.parametrize(
    ("path", "fields"),
    [
        ("/v1beta/models/gemini-2.5-pro:streamGenerateContent", {"model": "gemini-2.5-pro", "stream": True}),
        ("/v1/models/gemini-2.5-flash:generateContent", {"model": "gemini-2.5-flash", "stream": False}),
    ],
)
def test_the_log_line_takes_the_model_and_stream_from_the_path(path: str, fields: dict[str, Any]) -> None:
    assert gemini.log_fields(path) == fields


def test_the_offered_function_declarations_are_the_transcripts_tools() -> None:
    """Gemini CLI's one tool of ``functionDeclarations`` (``parametersJsonSchema``) is read as
    name → schema, as chat tools are (which agent is talking)."""
    schema = {"type": "object", "properties": {"file_path": {"type": "string"}}}
    body = {
        "contents": [user({"text": "go"})],
        "tools": [
            {
                "functionDeclarations": [
                    {"name": "read_file", "parametersJsonSchema": schema},
                    {"name": "glob"},
                ]
            },
            {"googleSearch": {}},
        ],
    }
    assert parse_request(body).tools == {"read_file": schema, "glob": {}}
    assert parse_request({"contents": []}).tools is None
