"""repeat_reminder (DESIGN §6.1) over transcripts built by the openai_chat dialect, plus the pure
request pipeline ``rewrite.decide_request`` (determinism, prefix stability, identity when idle)."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from proxy.config import Config, GuardsConfig, RepeatReminderConfig, build
from proxy.core.actions import Remind
from proxy.dialects.openai_chat import parse_request
from proxy.guards import Context, build_guards
from proxy.guards.repeat_reminder import DETAILED_TEXT, GENTLE_TEXT, RepeatReminder, preview
from proxy.request.conversation import key_digest
from proxy.request.rewrite import decide_request

RR = "guards.repeat_reminder"
HEADERS = Config().conversation_key.headers

# --- conversation builder -----------------------------------------------------------------------------
# A spec item is:  "text"            → a user message
#                  ("tool", args)    → one step: an assistant message with that call + its tool result
#                  [(..), (..)]      → one step with parallel calls + their results
#                  Pending([(..)])   → one step whose results have not arrived


class Pending(list):
    """A step (a list of calls) whose tool results have not arrived yet."""


def _args(args: Any) -> Any:
    return json.dumps(args, separators=(",", ":"), ensure_ascii=False) if isinstance(args, dict) else args


def messages(*spec: Any) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    n = 0
    for item in spec:
        if isinstance(item, str):
            msgs.append({"role": "user", "content": item})
            continue
        calls = list(item) if isinstance(item, list) else [item]
        ids = []
        wire = []
        for name, args in calls:
            ids.append(f"call_{n}")
            wire.append(
                {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": _args(args)}}
            )
            n += 1
        msgs.append({"role": "assistant", "content": None, "tool_calls": wire})
        if not isinstance(item, Pending):
            # the same call gets the same result (a repeat, not progress)
            for cid, (name, _) in zip(ids, calls, strict=True):
                msgs.append({"role": "tool", "tool_call_id": cid, "content": f"result of {name}"})
    return msgs


def reminders(spec: list[Any], cfg: dict[str, Any] | None = None) -> list[Remind]:
    guard = RepeatReminder(build(RepeatReminderConfig, cfg or {}, RR))
    return guard(parse_request({"model": "m", "messages": messages(*spec)}), Context())


def summary(actions: list[Remind]) -> list[tuple[int, int, str]]:
    """(after, count, tool) of each action."""
    return [(a.after, a.count, a.tool) for a in actions]


READ_A = ("read_file", {"path": "a.py"})
Q1 = ("search", {"q": "one"})
GREP_X = ("grep", {"pattern": "X"})
TODO = ("todo_write", {"todos": []})

# Layout: position 0 system, 1 the user prompt, then 2 messages per single-call step: step i (0-based)
# has its assistant message at 2+2i and its tool result at 3+2i.


def tool_pos(step: int) -> int:
    return 3 + 2 * step


# --- chains and thresholds ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "cfg", "expected"),
    [
        pytest.param(["go", READ_A, READ_A], {}, [], id="two_same_silent"),
        pytest.param(["go"] + [READ_A] * 3, {}, [(tool_pos(2), 3, "read_file")], id="three_same_gentle_at_3"),
        pytest.param(
            ["go"] + [READ_A] * 5,
            {},
            [(tool_pos(2), 3, "read_file"), (tool_pos(4), 5, "read_file")],
            id="five_same_3_and_5",
        ),
        pytest.param(
            ["go"] + [READ_A] * 8,
            {},
            [(tool_pos(2), 3, "read_file"), (tool_pos(4), 5, "read_file"), (tool_pos(7), 8, "read_file")],
            id="eight_same_3_5_8",
        ),
        pytest.param(
            ["go"] + [READ_A] * 12,
            {},
            [(tool_pos(2), 3, "read_file"), (tool_pos(4), 5, "read_file"), (tool_pos(7), 8, "read_file")],
            id="nine_to_twelve_silent_after_highest",
        ),
        pytest.param(
            ["go"] + [READ_A] * 5,
            {"thresholds": [4, 2]},
            [(tool_pos(1), 2, "read_file"), (tool_pos(3), 4, "read_file")],
            id="unsorted_thresholds_fire_at_2_and_4",
        ),
        pytest.param(
            ["go", Q1, Q1, ("other", {}), Q1, Q1, Q1],
            {},
            [(tool_pos(5), 3, "search")],
            id="different_call_restarts",
        ),
        pytest.param(
            ["go", READ_A, READ_A, ("read_file", {"path": "b.py"}), READ_A],
            {},
            [],
            id="different_args_restart",
        ),
        pytest.param(
            ["go", GREP_X, TODO, GREP_X, TODO, GREP_X],
            {"exclude": ["todo_write"]},
            [(tool_pos(4), 3, "grep")],
            id="excluded_calls_transparent",
        ),
        pytest.param(
            ["go", GREP_X, TODO, GREP_X, TODO, GREP_X], {}, [], id="tracked_interleaving_breaks_chain"
        ),
        pytest.param(
            ["go"] + [("process_data", {"x": 1})] * 3,
            {"include": ["pro*"]},
            [(tool_pos(2), 3, "process_data")],
            id="include_wildcard_tracks_match",
        ),
        pytest.param(
            ["go"] + [("read", {"x": 1})] * 3, {"include": ["pro*"]}, [], id="include_skips_non_match"
        ),
        pytest.param(
            [
                "go",
                ("process_data", {}),
                ("read", {}),
                ("process_data", {}),
                ("read", {}),
                ("process_data", {}),
            ],
            {"include": ["pro*"]},
            [(tool_pos(4), 3, "process_data")],
            id="non_included_calls_transparent",
        ),
        pytest.param(["go"] + [READ_A] * 3, {"include": ["read.file"]}, [], id="dot_in_include_literal"),
        pytest.param(
            ["go"] + [READ_A] * 3,
            {"exclude": ["read.file"]},
            [(tool_pos(2), 3, "read_file")],
            id="dot_in_exclude_literal",
        ),
        pytest.param(["go"] + [READ_A] * 3, {"include": ["Read_file"]}, [], id="include_case_sensitive"),
        pytest.param(["go"] + [READ_A] * 3, {"exclude": ["read_*"]}, [], id="exclude_wildcard"),
        pytest.param(
            ["go", READ_A, READ_A, "Now look at the tests instead.", READ_A, READ_A],
            {},
            [],
            id="user_prompt_resets_chain",
        ),
        pytest.param(
            ["go", READ_A, READ_A, "keep going", READ_A, READ_A],
            {},
            [(tool_pos(2) + 1, 3, "read_file")],
            id="continue_is_no_new_request_the_chain_goes_on",
        ),
        pytest.param(
            ["go", READ_A, READ_A, "keep going", READ_A, READ_A],
            {"progress_aware": False},
            [],
            id="seed_counting_any_user_message_resets",
        ),
        pytest.param(
            ["go", READ_A, READ_A, "Check the imports in it as well.", READ_A, READ_A, READ_A],
            {},
            [(tool_pos(4) + 1, 3, "read_file")],
            id="count_restarts_at_1_after_user_prompt",
        ),
        pytest.param(["go", READ_A, READ_A, Pending([READ_A])], {}, [], id="step_without_results_gets_none"),
        pytest.param(
            ["go", [READ_A, READ_A, READ_A]],
            {},
            [(5, 3, "read_file")],
            id="three_parallel_identical_one_reminder_after_step",
        ),
        pytest.param(
            ["go", READ_A, [READ_A, READ_A]],
            {},
            [(tool_pos(1) + 1, 3, "read_file")],
            id="parallel_calls_continue_previous_chain",
        ),
        pytest.param(
            ["go"] + [("bad", "{oops")] * 3, {}, [(tool_pos(2), 3, "bad")], id="invalid_json_raw_equal"
        ),
        pytest.param(
            ["go", ("bad", "{oops"), ("bad", "{oops "), ("bad", "{oops")],
            {},
            [],
            id="invalid_json_raw_differ",
        ),
        pytest.param(
            ["go", ("f", '{"a":1,"b":2}'), ("f", '{"b": 2, "a": 1.0}'), ("f", {"a": 1, "b": 2})],
            {},
            [(tool_pos(2), 3, "f")],
            id="canonical_equal_arguments_count",
        ),
    ],
)
def test_repeat_reminder_fires_at_thresholds(
    spec: list[Any], cfg: dict[str, Any], expected: list[tuple[int, int, str]]
) -> None:
    assert summary(reminders(spec, cfg)) == expected


def test_reminder_texts_gentle_then_detailed_lines() -> None:
    gentle, detailed = reminders(["go"] + [READ_A] * 5)
    assert gentle.text == GENTLE_TEXT
    assert "- tool:" not in gentle.text
    lines = detailed.text.splitlines()
    assert "- tool: read_file" in lines
    assert "- consecutive_calls: 5" in lines
    assert '- arguments: {"path":"a.py"}' in lines
    assert detailed.text == DETAILED_TEXT.format(tool="read_file", count=5, arguments='{"path":"a.py"}')
    assert (gentle.rule, gentle.delivery, gentle.limit) == ("repeat_reminder", "user", 3)
    assert (detailed.rule, detailed.delivery, detailed.limit) == ("repeat_reminder", "user", 5)


def test_third_reminder_at_8_is_detailed_with_count_8() -> None:
    actions = reminders(["go"] + [READ_A] * 12)
    assert [a.count for a in actions] == [3, 5, 8]
    assert "- consecutive_calls: 8" in actions[2].text.splitlines()
    assert actions[2].text != actions[1].text


def test_thresholds_4_2_gentle_at_2_detailed_at_4() -> None:
    gentle, detailed = reminders(["go"] + [READ_A] * 5, {"thresholds": [4, 2]})
    assert (gentle.count, gentle.text) == (2, GENTLE_TEXT)
    assert detailed.count == 4
    assert "- consecutive_calls: 4" in detailed.text.splitlines()


def test_arguments_preview_truncated_with_omitted_count() -> None:
    long_args = {"path": "x" * 400}
    canonical = '{"path":"' + "x" * 400 + '"}'
    assert len(canonical) == 411
    actions = reminders(["go"] + [("write", long_args)] * 5, {"arguments_preview_chars": 24})
    arg_lines = [ln for ln in actions[1].text.splitlines() if ln.startswith("- arguments: ")]
    assert arg_lines == ["- arguments: " + canonical[:24] + "… (+387 more chars)"]
    assert canonical[:24] == '{"path":"' + "x" * 15


def test_arguments_preview_full_when_exactly_at_limit() -> None:
    actions = reminders(["go"] + [READ_A] * 5, {"arguments_preview_chars": len('{"path":"a.py"}')})
    assert '- arguments: {"path":"a.py"}' in actions[1].text.splitlines()


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        pytest.param("abcdef", 6, "abcdef", id="at_limit_unchanged"),
        pytest.param("abcdef", 10, "abcdef", id="below_limit_unchanged"),
        pytest.param("abcdef", 4, "abcd… (+2 more chars)", id="cut_with_count"),
        pytest.param("abcdef", 1, "a… (+5 more chars)", id="one_char"),
    ],
)
def test_preview(text: str, limit: int, expected: str) -> None:
    assert preview(text, limit) == expected


def test_detection_uses_full_key_beyond_preview() -> None:
    a = ("write", {"path": "x" * 100 + "A"})
    b = ("write", {"path": "x" * 100 + "B"})
    assert reminders(["go", a, a, b], {"arguments_preview_chars": 10}) == []


@pytest.mark.parametrize(
    ("ignore_args", "expected_counts"),
    [
        pytest.param(None, [3], id="default_ignore_args_description_ignored"),
        pytest.param([], [], id="empty_ignore_args_description_counts"),
        pytest.param(["reason"], [], id="other_ignore_list_description_counts"),
    ],
)
def test_description_argument_and_ignore_args(
    ignore_args: list[str] | None, expected_counts: list[int]
) -> None:
    spec = ["go"] + [("bash", {"command": "ls", "description": f"attempt {i}"}) for i in range(3)]
    cfg = {} if ignore_args is None else {"ignore_args": ignore_args}
    assert [a.count for a in reminders(spec, cfg)] == expected_counts


def test_default_ignore_args_detailed_preview_omits_description() -> None:
    spec = ["go"] + [("bash", {"command": "ls", "description": f"attempt {i}"}) for i in range(5)]
    assert '- arguments: {"command":"ls"}' in reminders(spec)[1].text.splitlines()


def test_inject_as_tool_suffix_carried_on_action() -> None:
    (action,) = reminders(["go"] + [READ_A] * 3, {"inject_as": "tool_suffix"})
    assert (action.after, action.delivery) == (tool_pos(2), "tool_suffix")


@pytest.mark.parametrize(
    ("spec", "fresh"),
    [
        pytest.param(["go"] + [READ_A] * 5, [False, True], id="newest_step_fresh_older_not"),
        pytest.param(["go"] + [READ_A] * 6, [False, False], id="neither_is_newest"),
        pytest.param(["go"] + [READ_A] * 3 + ["thanks"], [False], id="user_message_after_step_not_fresh"),
        pytest.param(["go", [READ_A] * 5], [True, True], id="both_on_newest_parallel_step"),
    ],
)
def test_fresh_only_for_newest_step(spec: list[Any], fresh: list[bool]) -> None:
    assert [a.fresh for a in reminders(spec)] == fresh


def test_five_parallel_identical_calls_give_two_reminders_after_same_step() -> None:
    actions = reminders(["go", [READ_A] * 5])
    assert summary(actions) == [(7, 3, "read_file"), (7, 5, "read_file")]


# --- rewrite.decide_request ----------------------------------------------------------------------------


# Only this guard: other guards (circuit_breaker, …) have their own tests.
GUARDS = (RepeatReminder(RepeatReminderConfig()),)


def request_bytes(*spec: Any, **extra: Any) -> bytes:
    return orjson.dumps({"model": "m", "messages": messages(*spec), **extra})


def decide(raw: bytes, guards: Any = GUARDS):
    return decide_request(raw, {}, guards, HEADERS)


def test_decide_five_parallel_calls_one_merged_user_message() -> None:
    d = decide(request_bytes("go", [READ_A] * 5))
    assert d.changed is True
    msgs = orjson.loads(d.body)["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant"] + ["tool"] * 5 + ["user"]
    detailed = DETAILED_TEXT.format(tool="read_file", count=5, arguments='{"path":"a.py"}')
    assert msgs[-1] == {"role": "user", "content": GENTLE_TEXT + "\n\n" + detailed}


def test_decide_three_parallel_calls_one_reminder_after_last_result() -> None:
    msgs = orjson.loads(decide(request_bytes("go", [READ_A] * 3)).body)["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "tool", "tool", "user"]
    assert msgs[6]["content"] == GENTLE_TEXT


def test_decide_tool_suffix_appends_to_last_tool_result() -> None:
    guards = (RepeatReminder(build(RepeatReminderConfig, {"inject_as": "tool_suffix"}, RR)),)
    msgs = orjson.loads(decide(request_bytes("go", *[READ_A] * 3), guards).body)["messages"]
    assert [m["role"] for m in msgs] == ["system", "user"] + ["assistant", "tool"] * 3
    assert msgs[7]["content"] == "result of read_file\n\n" + GENTLE_TEXT


def test_decide_same_bytes_twice_identical_output() -> None:
    raw = request_bytes("go", *[READ_A] * 8)
    first, second = decide(raw), decide(bytes(raw))
    assert first.changed and second.changed
    assert first.body == second.body
    assert first.actions == second.actions


def _history(n: int) -> list[Any]:
    return ["go"] + [READ_A] * n


def test_decide_earlier_reminders_reinjected_at_same_positions_prefix_preserved() -> None:
    outputs = [orjson.loads(decide(request_bytes(*_history(n))).body)["messages"] for n in range(1, 13)]
    for i in range(len(outputs) - 1):
        shorter, longer = outputs[i], outputs[i + 1]
        assert longer[: len(shorter)] == shorter, f"request {i + 1} is not a prefix of request {i + 2}"
    final = outputs[-1]
    assert [i for i, m in enumerate(final) if m["role"] == "user"] == [1, 8, 13, 20]
    assert final[8]["content"] == GENTLE_TEXT
    assert final[13]["content"] == DETAILED_TEXT.format(
        tool="read_file", count=5, arguments='{"path":"a.py"}'
    )
    assert final[20]["content"] == DETAILED_TEXT.format(
        tool="read_file", count=8, arguments='{"path":"a.py"}'
    )
    assert len(final) == 2 + 2 * 12 + 3


@pytest.mark.parametrize(
    ("n", "fresh_counts"),
    [
        pytest.param(2, [], id="before_first_threshold"),
        pytest.param(3, [3], id="threshold_3_fresh"),
        pytest.param(4, [], id="between_thresholds_nothing_fresh"),
        pytest.param(5, [5], id="threshold_5_fresh"),
        pytest.param(8, [8], id="threshold_8_fresh"),
        pytest.param(9, [], id="after_highest_nothing_fresh"),
    ],
)
def test_decide_only_newest_threshold_is_fresh(n: int, fresh_counts: list[int]) -> None:
    d = decide(request_bytes(*_history(n)))
    assert [a.count for a in d.actions if a.fresh] == fresh_counts


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(request_bytes("go", READ_A, READ_A), id="chain_below_threshold"),
        pytest.param(request_bytes("go", GREP_X, READ_A, GREP_X), id="no_repeat"),
        pytest.param(
            b'{"model": "m",   "messages": [{"role":"user","content":"hi"}]}', id="odd_spacing_kept"
        ),
        pytest.param(request_bytes("go", READ_A, READ_A, Pending([READ_A])), id="third_call_without_result"),
    ],
)
def test_decide_returns_identical_raw_object_when_nothing_fires(raw: bytes) -> None:
    d = decide(raw)
    assert d.body is raw
    assert (d.actions, d.changed) == ((), False)


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"not json at all", id="not_json"),
        pytest.param(b"", id="empty_body"),
        pytest.param(b"\xff\xfe{", id="invalid_utf8"),
        pytest.param(b"[1, 2, 3]", id="json_array"),
        pytest.param(b'{"model":"m","messages":{"role":"user"}}', id="messages_not_a_list"),
        pytest.param(b'{"model":"m","messages":"hello"}', id="messages_string"),
        pytest.param(b'{"model":"m","messages":[1, 2]}', id="message_not_object"),
        pytest.param(b'{"model":"m","prompt":"legacy completions"}', id="no_messages"),
    ],
)
def test_decide_unreadable_body_unchanged(raw: bytes) -> None:
    d = decide(raw)
    assert d.body is raw
    assert (d.actions, d.changed) == ((), False)


def test_decide_reports_model_stream_and_conversation() -> None:
    raw = request_bytes("go", READ_A, stream=True, prompt_cache_key="conv-1")
    d = decide(raw)
    assert (d.model, d.stream, d.conversation) == ("m", True, key_digest("conv-1"))


def test_decide_with_no_guards_changes_nothing() -> None:
    raw = request_bytes("go", *[READ_A] * 5)
    assert decide(raw, ()).body is raw


@pytest.mark.parametrize(("enabled", "present"), [(True, True), (False, False)], ids=["enabled", "disabled"])
def test_build_guards_respects_enabled(enabled: bool, present: bool) -> None:
    guards = build_guards(build(GuardsConfig, {"repeat_reminder": {"enabled": enabled}}, "guards"))
    assert any(isinstance(g, RepeatReminder) for g in guards) is present
