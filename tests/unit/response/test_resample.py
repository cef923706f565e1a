"""Re-sample and fallback, the pure half (proxy.response.resample): the trigger, the answer's
calls in every wire, the seed, and the bodies the upstreams get (exact bytes)."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import orjson
import pytest

from proxy.config import Config, build
from proxy.core.actions import Withhold
from proxy.dialects import openai_chat
from proxy.guards import Context, build_guards, evaluate
from proxy.response.assemble import AssembledCall
from proxy.response.resample import (
    answer_calls,
    fallback_body,
    fallback_path,
    has_seed,
    repeated,
    resample_body,
    seed_for,
    withheld_keys,
)
from tests.helpers.fakes import completion, repeated_call_messages, sse_events, tool_call
from tests.helpers.gemini_contents import answer_events as gemini_events
from tests.helpers.gemini_contents import answer_object as gemini_object
from tests.helpers.messages_blocks import message_events, message_object
from tests.helpers.responses_items import function_call_item, response_events, response_object

ARGS = '{"path": "app.py"}'
READ = ("read_file", '{"path":"app.py"}')
CFG = build(Config, {"guards": {"escalation": {"enabled": False}}})  # the breaker withholds alone


def actions_for(messages: list[dict[str, Any]]) -> tuple[Any, tuple[Any, ...]]:
    transcript = openai_chat.parse_request({"messages": messages})
    guards = build_guards(CFG.guards)
    return transcript, tuple(evaluate(transcript, guards, Context(conversation="c")))


# --- the trigger ------------------------------------------------------------------------------------


def test_withheld_keys_are_the_calls_whose_results_this_turn_withheld() -> None:
    transcript, actions = actions_for(repeated_call_messages(8))  # results 7 and 8 withheld
    assert {a.position for a in actions if isinstance(a, Withhold)} == {14, 16}  # the 7th and 8th results
    assert withheld_keys(transcript, actions) == {READ}


def test_withheld_keys_are_empty_before_any_withhold_and_after_a_new_user_message() -> None:
    assert withheld_keys(*actions_for(repeated_call_messages(6))) == frozenset()
    later = [*repeated_call_messages(8), {"role": "user", "content": "try something else"}]
    assert withheld_keys(*actions_for(later)) == frozenset()


def test_an_observed_withhold_is_not_a_withheld_result() -> None:
    transcript, actions = actions_for(repeated_call_messages(8))
    observed = tuple(dataclasses.replace(a, observed=True) if isinstance(a, Withhold) else a for a in actions)
    assert withheld_keys(transcript, observed) == frozenset()


@pytest.mark.parametrize(
    ("calls", "repeats"),
    [
        ([AssembledCall("c", "read_file", ARGS)], "read_file"),
        ([AssembledCall("c", "read_file", '{ "path" : "app.py" }')], "read_file"),  # canonical key
        ([AssembledCall("a", "list_dir", "{}"), AssembledCall("b", "read_file", ARGS)], "read_file"),
        ([AssembledCall("c", "read_file", '{"path": "main.py"}')], None),
        ([AssembledCall("c", "cat_file", ARGS)], None),
        ([], None),  # a text answer never repeats
    ],
    ids=["same", "same_canonical", "second_call", "other_args", "other_tool", "text_only"],
)
def test_repeated_finds_the_first_call_whose_key_was_withheld(
    calls: list[AssembledCall], repeats: str | None
) -> None:
    found = repeated(calls, frozenset({READ}))
    assert (found.name if found is not None else None) == repeats


# --- the answer's calls, every wire ---------------------------------------------------------------

CHAT = {
    "role": "assistant",
    "content": "Let me look.",
    "tool_calls": [tool_call("read_file", ARGS, "call_9")],
}
MESSAGE = {
    "role": "assistant",
    "content": [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_9", "name": "read_file", "input": {"path": "app.py"}},
    ],
}
ANSWERS = {
    ("chat", False): orjson.dumps(completion([tool_call("read_file", ARGS, "call_9")])),
    ("chat", True): b"".join(sse_events([tool_call("read_file", ARGS, "call_9")])),
    ("responses", False): orjson.dumps(response_object([function_call_item("call_9", "read_file", ARGS)])),
    ("responses", True): b"".join(response_events([("call_9", "read_file", ARGS)])),
    ("messages", False): orjson.dumps(message_object(MESSAGE)),
    ("messages", True): b"".join(message_events(MESSAGE)),
    ("gemini", False): orjson.dumps(gemini_object(CHAT)),
    ("gemini", True): b"".join(gemini_events(CHAT)),
}


@pytest.mark.parametrize(
    ("wire", "sse"), list(ANSWERS), ids=[f"{w}-{'sse' if s else 'json'}" for w, s in ANSWERS]
)
def test_answer_calls_reads_the_call_in_every_wire(wire: str, sse: bool) -> None:
    calls = answer_calls(wire, sse, ANSWERS[(wire, sse)], CFG)
    assert calls is not None
    assert [(c.name, orjson.loads(c.arguments)) for c in calls] == [("read_file", {"path": "app.py"})]
    assert repeated(calls, frozenset({READ})) is not None


def test_answer_calls_of_a_text_answer_are_none_to_repeat() -> None:
    assert answer_calls("chat", False, orjson.dumps(completion(content="Done.")), CFG) == []
    assert answer_calls("chat", True, b"".join(sse_events(content="Done.")), CFG) == []


@pytest.mark.parametrize(
    ("wire", "sse", "raw"),
    [
        ("chat", False, b"not json"),
        ("chat", False, b'{"error": {"message": "busy"}}'),
        ("responses", False, b"[]"),
        ("messages", False, b'{"type": "error"}'),
        ("gemini", False, b'{"error": {}}'),
        ("chat", True, b"".join(sse_events([tool_call("read_file", ARGS)])[:2])),  # ended short
    ],
    ids=["not_json", "chat_error", "array", "messages_error", "gemini_error", "stream_cut_short"],
)
def test_an_answer_that_cannot_be_read_has_no_calls(wire: str, sse: bool, raw: bytes) -> None:
    assert answer_calls(wire, sse, raw, CFG) is None


# --- the seed -------------------------------------------------------------------------------------


def test_the_seed_is_the_first_31_bits_of_sha256_of_the_attempt_and_the_body() -> None:
    assert seed_for(b"{}", 1) == 141416863
    assert seed_for(b"{}", 2) == 1417473730
    body = b'{"model":"m"}'
    digest = hashlib.sha256(b"loopguard-resample:3:" + body).digest()
    assert seed_for(body, 3) == int.from_bytes(digest[:4], "big") >> 1
    assert all(0 <= seed_for(body, n) < 2**31 for n in range(1, 6))
    assert len({seed_for(body, n) for n in range(1, 6)}) == 5


def test_only_chat_and_gemini_have_a_seed() -> None:
    assert [w for w in ("chat", "responses", "messages", "gemini", "gemini_array") if has_seed(w)] == [
        "chat",
        "gemini",
        "gemini_array",
    ]


# --- the bodies -----------------------------------------------------------------------------------

PARAMS = {"temperature": 1.0, "repeat_penalty": 1.1}


@pytest.mark.parametrize(
    ("wire", "body", "seed", "expected"),
    [
        (
            "chat",
            b'{"model":"m","temperature":0.2,"messages":[]}',
            7,
            b'{"model":"m","temperature":1.0,"messages":[],"repeat_penalty":1.1,"seed":7}',
        ),
        (
            "chat",
            b'{"model":"m","seed":3}',
            None,
            b'{"model":"m","seed":3,"temperature":1.0,"repeat_penalty":1.1}',
        ),
        (
            "responses",
            b'{"model":"m","input":[]}',
            7,
            b'{"model":"m","input":[],"temperature":1.0,"repeat_penalty":1.1}',
        ),
        (
            "messages",
            b'{"model":"m","max_tokens":9}',
            7,
            b'{"model":"m","max_tokens":9,"temperature":1.0,"repeat_penalty":1.1}',
        ),
        (
            "gemini",
            b'{"contents":[]}',
            7,
            b'{"contents":[],"generationConfig":{"temperature":1.0,"repeat_penalty":1.1,"seed":7}}',
        ),
        (
            "gemini_array",
            b'{"generationConfig":{"topK":3,"temperature":0.1},"contents":[]}',
            8,
            b'{"generationConfig":{"topK":3,"temperature":1.0,"repeat_penalty":1.1,"seed":8},"contents":[]}',
        ),
    ],
    ids=[
        "chat",
        "chat_no_new_seed",
        "responses_no_seed",
        "messages_no_seed",
        "gemini_new_config",
        "gemini_merged",
    ],
)
def test_resample_body_sets_params_and_the_seed_where_the_wire_has_one(
    wire: str, body: bytes, seed: int | None, expected: bytes
) -> None:
    assert resample_body(wire, body, PARAMS, seed) == expected


def test_the_new_seed_replaces_a_seed_in_params() -> None:
    assert resample_body("chat", b"{}", {"seed": 1}, 2) == b'{"seed":2}'


@pytest.mark.parametrize(
    ("wire", "body"), [("chat", b"not json"), ("chat", b"[]"), ("gemini", b'{"generationConfig":[]}')]
)
def test_resample_body_of_a_body_it_cannot_read_is_none(wire: str, body: bytes) -> None:
    assert resample_body(wire, body, PARAMS, 1) is None


def test_fallback_body_replaces_the_model_except_for_gemini() -> None:
    assert fallback_body("chat", b'{"model":"m","messages":[]}', "big") == b'{"model":"big","messages":[]}'
    assert fallback_body("messages", b'{"max_tokens":9}', "big") == b'{"max_tokens":9,"model":"big"}'
    assert fallback_body("chat", b'{"model": "m"}', "") == b'{"model": "m"}'  # as it is
    assert fallback_body("gemini", b'{"contents": []}', "big") == b'{"contents": []}'
    assert fallback_body("chat", b"nope", "big") is None


def test_fallback_path_replaces_geminis_model_only() -> None:
    assert (
        fallback_path("gemini", "/v1beta/models/m:generateContent", "big")
        == "/v1beta/models/big:generateContent"
    )
    assert (
        fallback_path("gemini_array", "/v1beta/models/gemini-2.5-flash:streamGenerateContent?x=1", "big")
        == "/v1beta/models/big:streamGenerateContent?x=1"
    )
    assert (
        fallback_path("gemini", "/v1beta/models/m:generateContent", "") == "/v1beta/models/m:generateContent"
    )
    assert fallback_path("chat", "/v1/chat/completions", "big") == "/v1/chat/completions"
