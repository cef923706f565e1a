"""Conversation key (DESIGN §4): header, else prompt_cache_key, else a fingerprint of the opening."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import pytest
from multidict import CIMultiDict

from proxy.config import Config
from proxy.dialects import jsonbody
from proxy.request.conversation import conversation_key, conversation_keys, key_digest

NAMES = Config().conversation_key.headers  # x-session-id, session_id, conversation_id


def history(
    first_user: str = "Fix the failing test", system: str | None = "You are a coding agent.", steps: int = 0
):
    msgs: list[dict[str, Any]] = []
    if system is not None:
        msgs.append({"role": "system", "content": system})
    msgs.append({"role": "user", "content": first_user})
    for i in range(steps):
        msgs.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": f"call_{i}", "type": "function", "function": {"name": "read", "arguments": "{}"}}
                ],
            }
        )
        msgs.append({"role": "tool", "tool_call_id": f"call_{i}", "content": f"out {i}"})
    return msgs


def body(messages: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": history(steps=1) if messages is None else messages, **extra}


def fp(b: Any) -> str:
    return conversation_key(CIMultiDict(), b, NAMES)


# --- precedence ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "extra", "expected"),
    [
        pytest.param(
            {"x-session-id": "hdr-1"}, {"prompt_cache_key": "pck-1"}, "hdr-1", id="header_beats_pck"
        ),
        pytest.param({}, {"prompt_cache_key": "pck-1"}, "pck-1", id="pck_beats_fingerprint"),
        pytest.param({"X-Session-Id": "hdr-2"}, {}, "hdr-2", id="header_lookup_case_insensitive"),
        pytest.param({"SESSION_ID": "hdr-3"}, {}, "hdr-3", id="second_candidate_case_insensitive"),
        pytest.param(
            {"conversation_id": "c", "session_id": "s"}, {}, "s", id="candidates_tried_in_configured_order"
        ),
        pytest.param(
            {"x-session-id": "", "session_id": "s"}, {}, "s", id="empty_header_falls_through_to_next"
        ),
        pytest.param(
            {"x-session-id": ""}, {"prompt_cache_key": "pck"}, "pck", id="empty_header_falls_to_pck"
        ),
        pytest.param(
            {"x-request-id": "nope"}, {"prompt_cache_key": "pck"}, "pck", id="unlisted_header_ignored"
        ),
    ],
)
def test_conversation_key_precedence(headers: dict[str, str], extra: dict[str, Any], expected: str) -> None:
    assert conversation_key(CIMultiDict(headers), body(**extra), NAMES) == key_digest(expected)


@pytest.mark.parametrize(
    "pck",
    [pytest.param("", id="empty_string"), pytest.param(5, id="not_a_string"), pytest.param(None, id="null")],
)
def test_unusable_prompt_cache_key_falls_back_to_fingerprint(pck: Any) -> None:
    key = fp(body(prompt_cache_key=pck))
    assert key == fp(body())
    assert re.fullmatch(r"fp-[0-9a-f]{16}", key)


def test_custom_header_names_used() -> None:
    headers = CIMultiDict({"X-Agent-Run": "run-7", "x-session-id": "ignored"})
    assert conversation_key(headers, body(), ("x-agent-run",)) == key_digest("run-7")


def test_no_header_names_configured_goes_to_body() -> None:
    assert conversation_key(CIMultiDict({"x-session-id": "h"}), body(prompt_cache_key="p"), ()) == key_digest(
        "p"
    )


# --- fingerprint -----------------------------------------------------------------------------------------


def test_fingerprint_format() -> None:
    assert re.fullmatch(r"fp-[0-9a-f]{16}", fp(body()))


def test_fingerprint_stable_as_conversation_grows_after_first_tool_call() -> None:
    keys = {fp(body(history(steps=n))) for n in range(1, 8)}
    grown = [
        *history(steps=3),
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "now something else"},
        {"role": "system", "content": "late system note"},
    ]
    keys.add(fp(body(grown)))
    assert len(keys) == 1


def test_every_request_after_the_first_call_names_the_key_of_the_opening_as_opened_as() -> None:
    opening = conversation_keys(CIMultiDict(), body(history(steps=0)), NAMES)
    assert opening == (fp(body(history(steps=0))), None)
    later = {conversation_keys(CIMultiDict(), body(history(steps=n)), NAMES) for n in range(1, 5)}
    assert later == {(fp(body(history(steps=1))), opening[0])}
    assert opening[0] != fp(body(history(steps=1)))  # two runs of one task part at their first call
    given = conversation_keys(CIMultiDict({"x-session-id": "s"}), body(history(steps=2)), NAMES)
    assert given == (key_digest("s"), None)  # a given key is the same from the first request


@pytest.mark.parametrize(
    ("system", "user", "call_id"),
    [
        pytest.param("x" * 60_000, "y" * 4_000, "call_1", id="a_long_opening"),
        pytest.param("s", "a lone \ud800 surrogate", "c", id="ascii_escaped_list"),
        pytest.param(None, "u", "call_é✓", id="no_system_non_ascii_id"),
    ],
)
def test_both_keys_are_the_sha256_of_the_compact_json_of_their_parts(
    system: str | None, user: str, call_id: str
) -> None:
    """One serialization and one hash pass give what hashing each list whole gives (DESIGN §4)."""
    msgs = history(user, system, steps=0)
    msgs.append({"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "type": "function"}]})

    def digest(parts: list[Any]) -> str:
        return f"fp-{hashlib.sha256(jsonbody.dumps(parts, default=str)).hexdigest()[:16]}"

    assert conversation_keys(CIMultiDict(), body(msgs), NAMES) == (
        digest([system, user, call_id]),
        digest([system, user, None]),
    )


def test_fingerprint_same_for_identical_body_ignoring_other_fields() -> None:
    a = body(history(steps=2), temperature=0.2, stream=True)
    b = body(history(steps=2), model="other")
    assert fp(a) == fp(b)


@pytest.mark.parametrize(
    ("left", "right"),
    [
        pytest.param(
            history("Fix bug A", steps=1), history("Fix bug B", steps=1), id="different_first_user_message"
        ),
        pytest.param(
            history(system="You are A.", steps=1),
            history(system="You are B.", steps=1),
            id="different_system_message",
        ),
        pytest.param(history(system=None, steps=1), history(steps=1), id="missing_vs_present_system"),
        pytest.param(history(steps=0), history(steps=1), id="before_vs_after_first_tool_call"),
    ],
)
def test_fingerprint_differs(left: list[dict[str, Any]], right: list[dict[str, Any]]) -> None:
    assert fp(body(left)) != fp(body(right))


def test_fingerprint_uses_first_tool_call_id() -> None:
    a = history(steps=1)
    b = history(steps=1)
    b[2]["tool_calls"][0]["id"] = "call_other"
    assert fp(body(a)) != fp(body(b))


def test_fingerprint_developer_role_counts_as_system() -> None:
    dev = history(system=None, steps=1)
    dev.insert(0, {"role": "developer", "content": "You are a coding agent."})
    assert fp(body(dev)) == fp(body(history(steps=1)))


@pytest.mark.parametrize(
    "b",
    [
        pytest.param([], id="body_array"),
        pytest.param("text", id="body_string"),
        pytest.param(None, id="body_null"),
        pytest.param({"model": "m"}, id="no_messages"),
        pytest.param({"messages": "hi"}, id="messages_not_list"),
    ],
)
def test_unreadable_body_without_header_is_unknown(b: Any) -> None:
    assert fp(b) == "unknown"


def test_header_wins_even_for_unreadable_body() -> None:
    assert conversation_key(CIMultiDict({"Session_Id": "s"}), None, NAMES) == key_digest("s")


# --- a key the agent gives is held and logged as its fixed-size digest -------------------------------


@pytest.mark.parametrize(
    ("value", "digest"),
    [
        pytest.param("sess-1", "id-abe633f3a47a2758", id="short"),
        pytest.param("k" * (1 << 20), "id-17b08269fd437b65", id="one_mebibyte"),
        pytest.param("Ünïcode-☃", "id-8d2698d6951b53de", id="utf8_bytes"),
        pytest.param("id-abe633f3a47a2758", "id-abe633f3a47a2758", id="a_digest_is_itself"),
        pytest.param("fp-0123456789abcdef", "fp-0123456789abcdef", id="a_fingerprint_is_itself"),
        pytest.param("id-0123456789ABCDEF", "id-799f3fc71d2b343b", id="not_a_digest_upper_hex"),
    ],
)
def test_a_given_key_is_its_fixed_size_digest(value: str, digest: str) -> None:
    for headers, extra in (({"x-session-id": value}, {}), ({}, {"prompt_cache_key": value})):
        key = conversation_key(CIMultiDict(headers), body(**extra), NAMES)
        assert (key, len(key)) == (digest, 19)
