"""Nothing to guard (proxy.request.plain): a body with no tool call, tool result or offered tool,
told from its bytes, skips the guards with the same decision a full read makes; every body that
has one, in every dialect and the text-call forms, is guarded as before."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from proxy.dialects import Dialect, anthropic_messages, gemini, openai_chat, openai_responses
from proxy.guards import Context
from proxy.request.plain import nothing_to_guard
from proxy.request.prefix_cache import PrefixCache
from proxy.request.rewrite import RequestDecision, decide_plain, decide_request
from proxy.response.decide import LazyJudge, StopJudge, deciders
from tests.e2e.test_response_e2e import text_handler
from tests.helpers import realtraj, realtraj_native
from tests.helpers.corpus import load_fixtures
from tests.helpers.fakes import FakeUpstream
from tests.helpers.sdk_agent import snapshot, turn
from tests.unit.request.test_prefix_cache import (
    CFG,
    GUARDS,
    HEADERS,
    NAMES,
    chat_requests,
    messages_requests,
    responses_requests,
    text_requests,
)

SYSTEM = {"role": "system", "content": "You are helpful."}
USER = {"role": "user", "content": "Write a haiku about autumn."}


def _dump(obj: Any) -> bytes:
    return orjson.dumps(obj)


@pytest.mark.parametrize(
    ("body", "plain"),
    [
        ({"model": "m", "messages": [SYSTEM, USER]}, True),
        ({"model": "m", "messages": [USER, {"role": "assistant", "content": "Leaves fall."}, USER]}, True),
        ({"model": "m", "input": "Write a haiku."}, True),
        (
            {
                "model": "m",
                "max_tokens": 64,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            },
            True,
        ),
        # chat: offered tools, legacy functions, calls, results, roles
        ({"model": "m", "messages": [USER], "tools": []}, False),
        ({"model": "m", "messages": [USER], "functions": []}, False),
        ({"model": "m", "messages": [{"role": "assistant", "tool_calls": []}]}, False),
        ({"model": "m", "messages": [{"role": "assistant", "function_call": {"name": "f"}}]}, False),
        ({"model": "m", "messages": [{"role": "tool", "content": "x"}]}, False),
        ({"model": "m", "messages": [{"role": "function", "name": "f", "content": "x"}]}, False),
        # Responses items
        ({"model": "m", "input": [{"type": "function_call", "name": "f"}]}, False),
        ({"model": "m", "input": [{"type": "function_call_output", "output": "x"}]}, False),
        ({"model": "m", "input": [{"type": "custom_tool_call", "name": "f"}]}, False),
        # not a call the Responses dialect reads (CALL_TYPES): the full read finds none either
        ({"model": "m", "input": [{"type": "local_shell_call"}]}, True),
        ({"model": "m", "input": [{"type": "item_reference", "id": "x"}]}, False),
        ({"model": "m", "input": "hi", "previous_response_id": "resp_1"}, False),
        # Messages blocks
        ({"model": "m", "messages": [{"role": "assistant", "content": [{"type": "tool_use"}]}]}, False),
        ({"model": "m", "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, False),
        # calls written as text, and results in the Qwen templates' own form
        ({"model": "m", "messages": [{"role": "assistant", "content": '<tool_call>{"name": "r"}'}]}, False),
        ({"model": "m", "messages": [{"role": "assistant", "content": "<function=read>"}]}, False),
        ({"model": "m", "messages": [{"role": "user", "content": "<tool_response>ok"}]}, False),
        # a fence: a harness's fenced action (text_actions); a code sample in a chat too
        (
            {
                "model": "m",
                "messages": [
                    {"role": "assistant", "content": "Let me look.\n```bash\nls\n```"},
                    {"role": "user", "content": "<returncode>0</returncode>\nREADME.md"},
                ],
            },
            False,
        ),
        ({"model": "m", "messages": [{"role": "assistant", "content": "~~~\nls\n~~~"}]}, False),
        # a word in the text is enough (conservative), and so is any JSON escape
        ({"model": "m", "messages": [{"role": "user", "content": "What is a pure function?"}]}, False),
        ({"model": "m", "messages": [{"role": "user", "content": "caf\u00e9"}]}, True),
    ],
)
def test_nothing_to_guard_says_guard_for_every_spelling_of_a_call(body: dict[str, Any], plain: bool) -> None:
    assert nothing_to_guard(_dump(body)) is plain


@pytest.mark.parametrize(
    ("raw", "plain"),
    [
        (rb'{"messages":[{"role":"user","content":"\u0074ool"}]}', False),  # an escape spells it
        (rb'{"messages":[{"role":"user","content":"hi"}],"\u0074ools":[]}', False),
        (b'{"messages":[{"role":"user","content":"hi"}]}', True),
        (b"not json", True),  # the read then says why it is unguarded (test below)
    ],
)
def test_nothing_to_guard_reads_bytes_not_decoded_text(raw: bytes, plain: bool) -> None:
    assert nothing_to_guard(raw) is plain


def _same(a: RequestDecision, b: RequestDecision) -> None:
    assert a.body is b.body  # the original object: forwarded byte for byte
    assert (a.actions, a.changed, a.conversation, a.model, a.stream, a.unguarded) == (
        b.actions,
        b.changed,
        b.conversation,
        b.model,
        b.stream,
        b.unguarded,
    )
    assert a.transcript == b.transcript


PLAIN_BODIES: list[tuple[bytes, Dialect]] = [
    (_dump({"model": "m", "messages": [SYSTEM, USER]}), openai_chat),  # type: ignore[list-item]
    (_dump({"model": "m", "stream": True, "messages": [SYSTEM, USER]}), openai_chat),  # type: ignore[list-item]
    # the same reply four times and a user typing "continue": plain chat is never a loop
    (
        _dump(
            {
                "model": "m",
                "messages": [
                    SYSTEM,
                    *[{"role": "user", "content": "continue"}, {"role": "assistant", "content": "More."}] * 4,
                ],
            }
        ),
        openai_chat,  # type: ignore[list-item]
    ),
    (_dump({"model": "m", "input": "Write a haiku."}), openai_responses),  # type: ignore[list-item]
    (_dump({"model": "m", "input": [{"role": "user", "content": "hi"}]}), openai_responses),  # type: ignore[list-item]
    (
        _dump(
            {"model": "m", "max_tokens": 9, "messages": [USER, {"role": "assistant", "content": "x"}, USER]}
        ),
        anthropic_messages,
    ),  # type: ignore[list-item]
    (_dump({"model": "m", "input": [{"type": "local_shell_call", "call_id": "c1"}]}), openai_responses),  # type: ignore[list-item]
    (b"not json", openai_chat),  # type: ignore[list-item]
    (b"[1, 2]", openai_chat),  # type: ignore[list-item]
    (_dump({"model": "m", "messages": "hi"}), openai_chat),  # type: ignore[list-item]
    (_dump({"model": 3, "messages": [USER]}), anthropic_messages),  # type: ignore[list-item]
]


@pytest.mark.parametrize(("raw", "dialect"), PLAIN_BODIES)
def test_decide_plain_is_the_full_reads_decision(raw: bytes, dialect: Dialect) -> None:
    assert nothing_to_guard(raw)
    full = decide_request(raw, HEADERS, GUARDS, NAMES, dialect=dialect, prefixes=PrefixCache(1 << 20))
    plain = decide_plain(raw, HEADERS, NAMES, dialect)
    _same(plain, full)
    assert plain.plain is (plain.unguarded is None)
    assert full.actions == ()


def _fixture_bodies() -> list[tuple[str, bytes, Dialect]]:
    out: list[tuple[str, bytes, Dialect]] = []
    convs = [(f"loops/{f['id']}", f["messages"], f.get("tools")) for f in load_fixtures()]
    convs += [(f"realtraj/{r['id']}", r["messages"], r.get("tools")) for r in realtraj.load_runs()]
    for name, messages, tools in convs:
        out += [(name, b, openai_chat) for b in chat_requests(messages, tools, 8)]  # type: ignore[misc]
        out += [(name, b, openai_chat) for b in chat_requests(messages, None, 8)]  # type: ignore[misc]
        for wire in ("hermes", "xml", "xml_user"):
            out += [(f"{name}/{wire}", b, openai_chat) for b in text_requests(messages, None, 4, wire)]  # type: ignore[misc]
        out += [(name, b, openai_responses) for b in responses_requests(messages, 4)]  # type: ignore[misc]
        out += [(name, b, anthropic_messages) for b in messages_requests(messages, 4)]  # type: ignore[misc]
    native = {
        "anthropic_messages": anthropic_messages,
        "openai_responses": openai_responses,
        "gemini_generate_content": gemini,
        "openai_chat": openai_chat,
    }
    for _, where in realtraj_native.sessions_dirs():
        for session in realtraj_native.load_sessions(where):
            dialect = native[session["dialect"]]
            out.append((f"native/{session['id']}", _dump(session["request_bodies_final"]), dialect))  # type: ignore[arg-type]
    return out


def test_no_fixture_body_with_a_call_or_tools_is_said_to_have_nothing_to_guard() -> None:
    """Every request body made of the loop fixtures and the recorded runs (chat with and without
    ``tools``, the three text-call forms, Responses, Messages, the native sessions): a body whose
    read has a call or offered tools is always guarded; the few that are plain read the same both
    ways (and have neither)."""
    for where in (realtraj.runs_dir(), *(d for _, d in realtraj_native.sessions_dirs())):
        if not where.is_dir():
            pytest.skip(f"recorded runs not found at {where} (the counts below are over them)")
    bodies = _fixture_bodies()
    guarded = plain = 0
    for name, raw, dialect in bodies:
        if not nothing_to_guard(raw):
            guarded += 1
            continue
        plain += 1
        full = decide_request(raw, HEADERS, GUARDS, NAMES, dialect=dialect)
        assert full.transcript is not None and not full.transcript.calls and not full.transcript.tools, name
        _same(decide_plain(raw, HEADERS, NAMES, dialect), full)
    # 36 plain: the first request (system + user, no ``tools``) of loop fixtures read without
    # their tools; every other body is guarded (the 29 native sessions of both folders, in their four
    # dialects, included), and each of them has a call or tools
    assert (len(bodies), guarded, plain) == (1619, 1583, 36)


def test_plain_request_gets_a_judge_only_when_an_answer_has_calls() -> None:
    raw = _dump({"model": "m", "messages": [SYSTEM, USER]})
    decision = decide_plain(raw, HEADERS, NAMES, openai_chat)  # type: ignore[arg-type]
    reads: list[int] = []

    def lazy() -> Any:
        reads.append(1)
        return decision.transcript

    d = deciders(None, (), GUARDS, Context(conversation=""), CFG, None, lazy)
    assert isinstance(d.judge, LazyJudge) and d.judge.on_text_only is False
    assert d.judge.action_shapes == decision.transcript.action_shapes == frozenset()  # type: ignore[union-attr]
    assert d.judge([], "Leaves fall.") is None and reads == [1]
    assert d.judge._make is not None  # a text-only answer: no StopJudge built
    full = StopJudge(decision.transcript, (), GUARDS, Context(conversation=""), CFG)  # type: ignore[arg-type]
    assert full.on_text_only is False and full([], "Leaves fall.") is None


async def test_plain_chat_through_the_server_skips_the_guards_and_its_stream_is_still_cut(
    upstream: FakeUpstream, sdk
) -> None:
    """A plain chat (no tools, no calls) goes the nothing-to-guard way, counted, and its answer
    still gets the checks that apply to any answer: a degenerate stream is cut."""
    progress: dict[str, Any] = {"written": 0, "closed": asyncio.Event()}
    sentence = "I need to check the configuration file again. "
    upstream.handler = text_handler(["Let me think. "] + [sentence] * 5000, progress)
    client = await sdk()
    msg, finish = await turn(client, [{"role": "user", "content": "why?"}], stream=True)
    assert len(msg["content"]) < len(sentence) * 40
    assert finish == "length"
    await asyncio.wait_for(progress["closed"].wait(), 2)
    snap = await snapshot(client.base)
    assert (snap["guarded_requests"], snap["nothing_to_guard"], snap["rewritten_requests"]) == (1, 1, 0)
    assert (snap["responses_cut"], snap["per_rule"]) == (1, {"degenerate_text": 1})
    assert orjson.loads(upstream.requests[0].body)["messages"] == [{"role": "user", "content": "why?"}]
