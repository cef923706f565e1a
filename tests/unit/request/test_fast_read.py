"""The prefix cache's fast path (:func:`proxy.request.locate.locate` found by bytes): a body of
64 KiB or more resumes its kept prefix without being decoded whole, and decides exactly as it
would be decided without the cache."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.config import Config, build
from proxy.core.effects import progress_rules
from proxy.dialects import anthropic_messages, openai_chat, openai_responses
from proxy.guards import Guard, build_guards
from proxy.request import prefix_cache
from proxy.request.conversation import key_digest
from proxy.request.prefix_cache import PrefixCache
from proxy.request.rewrite import RequestDecision, decide_request
from tests.helpers.corpus import default_config

CFG: Config = build(Config, default_config())
GUARDS: tuple[Guard, ...] = build_guards(CFG.guards, *progress_rules(CFG.progress))
SYSTEM = "You are an agent. " * (prefix_cache.FAST_MIN // 16)


def _messages(steps: int, system: str = SYSTEM, task: str = "find the bug") -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": task}]
    for i in range(steps):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "ls", "arguments": '{"path":"."}'}}
        out += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": "a b c"},
        ]
    return out


def _body(messages: list[dict[str, Any]], **extra: Any) -> bytes:
    return orjson.dumps({"model": "m", "messages": messages, **extra})


def _decide(raw: bytes, cache: PrefixCache | None, headers: dict[str, str] | None = None) -> RequestDecision:
    return decide_request(raw, headers or {}, GUARDS, ("x-session-id",), prefixes=cache)


def _same(a: RequestDecision, b: RequestDecision) -> None:
    assert (a.body, a.actions, a.transcript, a.changed, a.conversation, a.unguarded, a.model) == (
        b.body,
        b.actions,
        b.transcript,
        b.changed,
        b.conversation,
        b.unguarded,
        b.model,
    )


def test_a_growing_looping_conversation_takes_the_fast_path_and_decides_the_same() -> None:
    cache = PrefixCache(1 << 30)
    for steps in range(1, 9):
        raw = _body(_messages(steps))
        _same(_decide(raw, cache), _decide(raw, None))
    assert (cache.stats.hits, cache.stats.fast_hits, cache.stats.misses) == (7, 7, 1)
    assert _decide(_body(_messages(8)), None).changed  # the loop was acted on (old items edited)


def test_a_changed_head_takes_the_full_path_with_the_same_decision() -> None:
    cache = PrefixCache(1 << 30)
    _decide(_body(_messages(3)), cache)
    raw = orjson.dumps({"model": "other", "messages": _messages(4)})
    _same(_decide(raw, cache), _decide(raw, None))
    assert cache.stats.fast_hits == 0


@pytest.mark.parametrize(
    "tail",
    [
        b',"messages":[{"role":"user","content":"again"}]}',  # the history given twice after
        b',"messages":[0]}',  # ... even as a list that starts with the sentinel
        b',"x":',  # truncated
        b',"x":nope}',  # not JSON
    ],
)
def test_a_body_the_fast_path_cannot_read_decides_as_in_full(tail: bytes) -> None:
    cache = PrefixCache(1 << 30)
    _decide(_body(_messages(3)), cache)
    raw = _body(_messages(4))[:-1] + tail
    _same(_decide(raw, cache), _decide(raw, None))
    assert cache.stats.fast_hits == 0


def test_the_key_from_a_header_or_the_fingerprint_is_the_same_both_ways() -> None:
    for headers in ({}, {"x-session-id": "s9"}):
        cache = PrefixCache(1 << 30)
        _decide(_body(_messages(3)), cache, headers)
        raw = _body(_messages(4))
        fast = _decide(raw, cache, headers)
        assert fast.conversation == _decide(raw, None, headers).conversation
        assert fast.conversation == (key_digest("s9") if headers else _decide(raw, None).conversation)
        assert fast.conversation.startswith("id-" if headers else "fp-")
        assert cache.stats.fast_hits == 1
    # resumed under another header: still the same decision, kept under this request's key
    cache = PrefixCache(1 << 30)
    _decide(_body(_messages(3)), cache, {"x-session-id": "a"})
    raw = _body(_messages(4))
    _same(_decide(raw, cache, {"x-session-id": "b"}), _decide(raw, None, {"x-session-id": "b"}))
    assert cache.stats.fast_hits == 1
    assert cache.get(openai_chat.PATH_SUFFIX, key_digest("b")) is not None


def test_two_conversations_sharing_their_first_4_kb_each_resume_their_own() -> None:
    cache = PrefixCache(1 << 30)
    one, two = _messages(0, task="task one"), _messages(0, task="task two")
    for steps in range(1, 5):
        for base in (one, two):
            raw = _body(base + _messages(steps)[2:])
            assert raw[: prefix_cache.HEAD_BYTES] == _body(one)[: prefix_cache.HEAD_BYTES]
            _same(_decide(raw, cache), _decide(raw, None))
    assert (cache.stats.fast_hits, cache.stats.misses, cache.stats.entries) == (6, 2, 2)


def _input(steps: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "input_text", "text": SYSTEM}]}]
    for i in range(steps):
        out += [
            {"type": "function_call", "call_id": f"c{i}", "name": "ls", "arguments": '{"path":"."}'},
            {"type": "function_call_output", "call_id": f"c{i}", "output": "a b c"},
        ]
    return out


@pytest.mark.parametrize(("store", "fast"), [(False, 7), (True, 0), (None, 0)])
def test_a_responses_request_the_store_keeps_is_read_in_full_and_one_sent_with_store_false_is_not(
    store: bool | None, fast: int
) -> None:
    store_extra = {} if store is None else {"store": store}
    cache = PrefixCache(1 << 30)

    def decide(raw: bytes, prefixes: PrefixCache | None) -> RequestDecision:
        return decide_request(
            raw, {}, GUARDS, (), dialect=openai_responses, previous=lambda _: None, prefixes=prefixes
        )

    for steps in range(1, 9):
        raw = orjson.dumps({"model": "m", "input": _input(steps), **store_extra})
        got, want = decide(raw, cache), decide(raw, None)
        _same(got, want)
        assert got.chain == want.chain  # the kept chain holds every input item either way
    assert (cache.stats.hits, cache.stats.fast_hits) == (7, fast)


def _claude_code_bodies(steps: int, system: str) -> list[bytes]:
    """Messages requests as Claude Code sends them: the ``cache_control`` marker on the last
    block of the newest message only (moved off the previous one on every request)."""
    out = []
    for k in range(1, steps + 1):
        messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "fix it"}]}]
        for i in range(k):
            use = {"type": "tool_use", "id": f"t{i}", "name": "Bash", "input": {"command": "ls"}}
            messages.append({"role": "assistant", "content": [use]})
            result = {"type": "tool_result", "tool_use_id": f"t{i}", "content": "a b c", "is_error": False}
            messages.append({"role": "user", "content": [result]})
        messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
        out.append(orjson.dumps({"model": "m", "system": system, "messages": messages}))
    return out


@pytest.mark.parametrize(("system", "fast"), [("short", 0), (SYSTEM, 8)])
def test_a_history_whose_last_message_changes_resumes_one_message_earlier(system: str, fast: int) -> None:
    cache = PrefixCache(1 << 30)
    bodies = _claude_code_bodies(9, system)
    for raw in bodies:
        got = decide_request(raw, {}, GUARDS, (), dialect=anthropic_messages, prefixes=cache)
        want = decide_request(raw, {}, GUARDS, (), dialect=anthropic_messages)
        _same(got, want)
    assert (cache.stats.hits, cache.stats.misses, cache.stats.fast_hits) == (8, 1, fast)
    assert want.changed  # the loop was acted on
