"""Response-side decisions as pure functions (proxy.response.decide): stop, runaway, degenerate, JSON."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest

import proxy.response.decide
from proxy.config import Config, build
from proxy.core.actions import Cut, Stop
from proxy.dialects import openai_chat
from proxy.guards import Context, build_guards, evaluate
from proxy.guards.circuit_breaker import DUPLICATE_TEXT
from proxy.response.assemble import AssembledCall
from proxy.response.decide import (
    CAP_TEXT,
    DENIALS_TEXT,
    EPISODE_CAP_TEXT,
    StopJudge,
    decide_json,
    earlier_stops,
    effects_of,
    runaway_cut,
    with_pending_step,
)
from tests.helpers.fakes import completion, repeated_call_messages, tool_call

ARGS = '{"path": "app.py"}'


def judge_for(messages: list[dict[str, Any]], config: dict[str, Any] | None = None) -> StopJudge:
    """The stop judge for ``messages``; the escalation ladder is off unless ``config`` sets it
    (these tests pin the denials and cap stops; the ladder's stop: tests/unit/guards/test_escalation.py)."""
    config = dict(config or {})
    guards_cfg = dict(config.get("guards") or {})
    guards_cfg.setdefault("escalation", {"enabled": False})
    config["guards"] = guards_cfg
    cfg = build(Config, config)
    transcript = openai_chat.parse_request({"messages": messages})
    guards = build_guards(cfg.guards)
    ctx = Context(conversation="c")
    return StopJudge(transcript, evaluate(transcript, guards, ctx), guards, ctx, cfg)


def call(name: str = "read_file", args: Any = ARGS, cid: str = "call_x") -> AssembledCall:
    return AssembledCall(cid, name, args)


# --- stop ------------------------------------------------------------------------------------------


def test_stop_after_two_ignored_denials() -> None:
    judge = judge_for(repeated_call_messages(8))  # results 7 and 8 withheld in this turn
    assert judge.withheld == 2
    stop = judge([call()])
    assert stop == Stop(
        text=DENIALS_TEXT.format(tool="read_file", count=9, denials=2),
        rule="stop",
        tool="read_file",
        count=9,
        limit=2,
        reason="denials",
        evidence=(("withheld_in_turn", 2), ("after_ignored_denials", 2)),
    )
    assert stop.text == (
        "[loopguard] Stopped: the model kept calling read_file (9 times) and ignored 2 withheld results, "
        "so loopguard ended its turn here; that last call was not run. Send a message to continue."
    )


@pytest.mark.parametrize(
    ("messages", "config", "possible"),
    [
        pytest.param(repeated_call_messages(8), None, True, id="two_withheld_results"),
        pytest.param(repeated_call_messages(7), None, False, id="one_withheld_result"),
        pytest.param(repeated_call_messages(2), None, False, id="a_healthy_start"),
        pytest.param(
            repeated_call_messages(8), {"stop": {"after_ignored_denials": 0}}, False, id="denials_stop_off"
        ),
        pytest.param(
            repeated_call_messages(2),
            {"guards": {"circuit_breaker": {"max_calls_per_agent": 20}}},
            True,
            id="cap_within_one_answer",
        ),
    ],
)
def test_a_stop_is_possible_only_near_one(messages: list[Any], config: Any, possible: bool) -> None:
    """:attr:`StopJudge.possible` (what ``stop.deliver: error`` holds a stream for): no guard run,
    True only when some answer to this request could be stopped."""
    assert judge_for(messages, config).possible is possible


@pytest.mark.parametrize(
    ("messages", "calls", "config"),
    [
        pytest.param(repeated_call_messages(7), [call()], None, id="one_withheld_result_only"),
        pytest.param(
            repeated_call_messages(8), [call(args='{"path": "b.py"}')], None, id="a_call_not_denied"
        ),
        pytest.param(repeated_call_messages(8), [], None, id="no_calls"),
        pytest.param(repeated_call_messages(8), [call()], {"stop": {"after_ignored_denials": 0}}, id="off"),
        pytest.param(
            repeated_call_messages(8), [call()], {"stop": {"after_ignored_denials": 3}}, id="limit_3"
        ),
        pytest.param(
            [
                *repeated_call_messages(8),
                {"role": "assistant", "content": "[loopguard] Stopped: …"},
                {"role": "user", "content": "Go on, read it once more."},
            ],
            [call()],
            None,
            id="the_user_continued_a_new_turn",
        ),
    ],
)
def test_no_stop(messages: list[dict[str, Any]], calls: list[AssembledCall], config: Any) -> None:
    assert judge_for(messages, config)(calls) is None


def test_new_turn_is_guarded_afresh_and_stops_again_after_two_more_denials() -> None:
    messages = [*repeated_call_messages(8), {"role": "user", "content": "Go on."}]
    for i in range(9, 11):  # calls 9 and 10 in the new turn: both denied as duplicates
        messages.append(
            {"role": "assistant", "content": None, "tool_calls": [tool_call("read_file", ARGS, f"c{i}")]}
        )
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "print('hi')"})  # same result
    stop = judge_for(messages)([call()])
    assert stop is not None and (stop.reason, stop.count) == ("denials", 11)


CAP_CONFIG = {"guards": {"circuit_breaker": {"max_calls_per_agent": 5}}}
SEED_CAP_CONFIG = {"guards": {"circuit_breaker": {"max_calls_per_agent": 5, "scope": "conversation"}}}


def distinct_calls(n: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for i in range(n):
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [tool_call("grep", f'{{"q": "{i}"}}', f"c{i}")],
            }
        )
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "x"})
    return messages


def test_stop_at_the_lifetime_cap_at_once_and_after_a_user_message() -> None:
    """The seed's cap: over the whole conversation (scope: conversation)."""
    assert judge_for(distinct_calls(4), SEED_CAP_CONFIG)([call()]) is None  # call 5: under the cap
    stop = judge_for(distinct_calls(5), SEED_CAP_CONFIG)([call()])
    assert stop is not None
    assert (stop.reason, stop.tool, stop.count, stop.limit) == ("cap", "read_file", 6, 5)
    assert stop.text == CAP_TEXT.format(limit=5, tool="read_file")
    assert stop.evidence == (("calls_in_conversation", 6), ("max_calls_per_agent", 5))
    later = [
        *distinct_calls(5),
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "Now the other module"},
    ]
    stop = judge_for(later, SEED_CAP_CONFIG)([call()])
    assert stop is not None and stop.reason == "cap"  # the cap is never reset


def test_the_cap_counts_per_request_by_default() -> None:
    stop = judge_for(distinct_calls(5), CAP_CONFIG)([call()])
    assert stop is not None
    assert (stop.reason, stop.tool, stop.count, stop.limit) == ("cap", "read_file", 6, 5)
    assert stop.evidence == (("calls_in_request", 6), ("max_calls_per_agent", 5))
    assert (
        stop.text
        == EPISODE_CAP_TEXT.format(limit=5, tool="read_file")
        == (
            "[loopguard] Stopped: the model reached loopguard's limit of 5 tool calls for this request "
            "(it wanted to call read_file again), so loopguard ended its turn here; that call was not run. "
            "Send a message to continue."
        )
    )
    done = [*distinct_calls(5), {"role": "assistant", "content": "done"}]
    # a new request starts the count afresh; "continue" is none
    assert (
        judge_for([*done, {"role": "user", "content": "Now the other module"}], CAP_CONFIG)([call()]) is None
    )
    stop = judge_for([*done, {"role": "user", "content": "continue"}], CAP_CONFIG)([call()])
    assert stop is not None and (stop.reason, stop.count) == ("cap", 6)


@pytest.mark.parametrize(("calls", "possible"), [(48, False), (49, True)])
def test_a_waste_stop_is_possible_once_one_answer_could_reach_the_limit(calls: int, possible: bool) -> None:
    """80 calls bringing nothing new can be reached by an answer of up to 32 calls after 49."""
    assert judge_for(distinct_calls(calls), {"stop": {"after_ignored_denials": 0}}).possible is possible


def test_stop_when_the_calls_stopped_bringing_anything_new() -> None:
    """Drifting searches, each getting the result the episode already had (the waste cap)."""
    assert judge_for(distinct_calls(80))([call()]) is None  # 79 wasted of the last 80
    stop = judge_for(distinct_calls(81))([call()])
    assert stop is not None
    assert (stop.reason, stop.tool, stop.count, stop.limit) == ("waste", "read_file", 80, 100)
    assert stop.evidence == (("calls_bringing_nothing_new", 80), ("waste_window", 100))
    assert stop.text == (
        "[loopguard] Stopped: the model's tool calls stopped bringing anything new (80 of its last 100 "
        "got results it already had, with nothing changed in between), so loopguard ended its turn here; "
        "that last call was not run. Send a message to continue."
    )
    assert judge_for(distinct_calls(81), {"stop": {"on_cap": False}})([call()]) is None
    assert (
        judge_for(distinct_calls(81), {"guards": {"circuit_breaker": {"waste_window": 0}}})([call()]) is None
    )


def test_cap_stop_can_be_turned_off() -> None:
    config = {**CAP_CONFIG, "stop": {"on_cap": False}}
    assert judge_for(distinct_calls(5), config)([call()]) is None


def test_custom_message_template() -> None:
    config = {
        "stop": {"message": "Loop on {tool} ({kind}, {count} calls, {denials} ignored, limit {limit})."}
    }
    stop = judge_for(repeated_call_messages(8), config)([call()])
    assert stop is not None and stop.text == "Loop on read_file (denials, 9 calls, 2 ignored, limit 2)."


def test_guards_are_not_run_when_no_stop_can_fire(monkeypatch: pytest.MonkeyPatch) -> None:
    judge = judge_for(repeated_call_messages(7))

    def boom(*a: Any, **k: Any) -> Any:
        raise AssertionError("guards evaluated")

    monkeypatch.setattr(proxy.response.decide, "evaluate_from", boom)
    assert judge([call()]) is None


def test_pending_step_extends_the_transcript() -> None:
    t = openai_chat.parse_request({"messages": repeated_call_messages(2)})
    ext, positions = with_pending_step(t, [call(cid="a"), call("grep", "", "b")])
    again = openai_chat.parse_request(
        {
            "messages": [
                *repeated_call_messages(2),
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [tool_call("read_file", ARGS, "a"), tool_call("grep", "", "b")],
                },
                {"role": "tool", "tool_call_id": "a", "content": ""},
                {"role": "tool", "tool_call_id": "b", "content": ""},
            ]
        }
    )
    assert positions == {6, 7}
    assert ext.steps == again.steps
    assert ext.newest_step == again.newest_step == 2
    assert ext.message_count == again.message_count
    assert [(c.seq, c.step, c.turn, c.position, c.call_id, c.name, c.result) for c in ext.calls[:2]] == [
        (c.seq, c.step, c.turn, c.position, c.call_id, c.name, c.result) for c in again.calls[:2]
    ]
    # the placeholders are the parsed empty results, marked pending (a pending result is never compared)
    assert [dataclasses.replace(c.result, pending=False) for c in ext.calls[2:] if c.result] == [
        c.result for c in again.calls[2:]
    ]
    assert [c.result.pending for c in ext.calls if c.result] == [False, False, True, True]


# --- runaway ---------------------------------------------------------------------------------------

RCFG = Config().response
#: a call that may change state: the identical-call limit counts it
WRITE = '{"path": "a.py", "content": "x"}'


def write(args: Any = WRITE) -> AssembledCall:
    return call("write_file", args)


@pytest.mark.parametrize(
    ("calls", "expected"),
    [
        pytest.param([write()] * 2, None, id="2_identical_writes_ok"),
        pytest.param([write()] * 3, ("identical", 2, 2), id="the_3rd_identical_write_is_cut"),
        pytest.param([write()] * 300, ("identical", 2, 2), id="300_identical_writes_cut_to_2"),
        pytest.param(
            [write(), call("grep"), write(), call("ls"), write()],
            ("identical", 4, 2),
            id="identical_need_not_be_consecutive",
        ),
        pytest.param(
            [call(args=f'{{"path": "{i}"}}') for i in range(40)],
            ("calls", 32, 32),
            id="40_distinct_cut_to_32",
        ),
        pytest.param([call(args=f'{{"path": "{i}"}}') for i in range(32)], None, id="32_distinct_ok"),
        pytest.param(
            [
                write('{"path": "app.py", "content": "x"}'),
                write('{ "content" : "x", "path" : "app.py" }'),
                write({"path": "app.py", "content": "x"}),
            ],
            ("identical", 2, 2),
            id="canonical_arguments_compared",
        ),
    ],
)
def test_runaway_cut(calls: list[AssembledCall], expected: tuple[str, int, int] | None) -> None:
    cut = runaway_cut(calls, RCFG)
    assert (None if cut is None else (cut.reason, cut.count, cut.limit)) == expected


@pytest.mark.parametrize(
    ("calls", "expected"),
    [
        pytest.param([call()] * 3, None, id="3_identical_read_file_not_cut"),
        pytest.param([call("Read", '{"file_path": "REDACTED.ts"}')] * 4, None, id="4_identical_Read_not_cut"),
        pytest.param([call("grep", '{"pattern": "x"}')] * 3, None, id="3_identical_grep_not_cut"),
        pytest.param([call("bash", '{"command": "cat a.py"}')] * 3, None, id="3_identical_cat_not_cut"),
        pytest.param([call()] * 4, None, id="4_identical_read_file_not_cut"),
        pytest.param([call()] * 5, ("identical", 4, 4, "read_file"), id="the_5th_identical_read_file_is_cut"),
        pytest.param(
            [call("get_weather", '{"city": "Shanghai"}')] * 21,
            ("identical", 4, 4, "get_weather"),
            id="21_identical_get_weather_cut_at_4",
        ),
        pytest.param([call()] * 300, ("identical", 4, 4, "read_file"), id="300_identical_read_file_cut_at_4"),
        pytest.param(
            [call(args=f'{{"path": "{i % 8}"}}') for i in range(32)],
            None,
            id="32_reads_of_8_files_4_each_not_cut",
        ),
        pytest.param([write()] * 3, ("identical", 2, 2, "write_file"), id="3_identical_write_file_cut_at_2"),
        pytest.param(
            [call("bash", '{"command": "echo x >> a.py"}')] * 3,
            ("identical", 2, 2, "bash"),
            id="3_identical_writing_commands_cut_at_2",
        ),
        pytest.param(
            [call(), call(), call(), write(), call(), write(), write()],
            ("identical", 6, 2, "write_file"),
            id="mixed_reads_pass_the_3rd_write_is_cut",
        ),
        pytest.param(
            [call(), call(), call(), write(), call(), write()],
            None,
            id="mixed_reads_and_2_writes_not_cut",
        ),
    ],
)
def test_runaway_counts_identical_writes_past_2_and_identical_reads_past_4(
    calls: list[AssembledCall], expected: tuple[str, int, int, str] | None
) -> None:
    cut = runaway_cut(calls, RCFG)
    assert (None if cut is None else (cut.reason, cut.count, cut.limit, cut.tool)) == expected


def test_runaway_reads_the_configs_effects() -> None:
    """A tool the config marks state-changing counts even though its name reads."""
    cfg = build(Config, {"progress": {"state_changing_tools": ["read_file"]}})
    cut = runaway_cut([call()] * 3, cfg.response, effects=effects_of(cfg.progress))
    assert cut == Cut("runaway", "read_file", 2, 2, "identical")
    assert runaway_cut([call()] * 3, cfg.response) is None  # the default reading


def test_runaway_limits_can_be_turned_off() -> None:
    off = {
        "max_calls_per_response": 0,
        "max_identical_per_response": 0,
        "max_identical_reads_per_response": 0,
    }
    cfg = build(Config, {"response": off}).response
    assert runaway_cut([write()] * 300, cfg) is None
    assert runaway_cut([call()] * 300, cfg) is None
    reads_only = build(Config, {"response": {"max_identical_reads_per_response": 0}}).response
    assert runaway_cut([call()] * 300, reads_only) == Cut("runaway", "read_file", 32, 32, "calls")
    assert runaway_cut([write()] * 3, reads_only) == Cut("runaway", "write_file", 2, 2, "identical")


def test_streaming_counts_only_complete_calls_as_identical() -> None:
    calls = [write()] * 3
    assert runaway_cut(calls, RCFG, complete=2) is None  # the 3rd may still be growing
    cut = runaway_cut(calls, RCFG, complete=3)
    assert cut is not None and cut.count == 2


# --- JSON bodies ------------------------------------------------------------------------------------


def test_json_stop_rewrites_into_a_final_message() -> None:
    body = completion([tool_call("read_file", ARGS, "call_9")])
    body["choices"][0]["message"]["content"] = "Let me read it again."
    new, actions = decide_json(orjson.dumps(body), judge_for(repeated_call_messages(8)), Config())
    assert new is not None
    got = orjson.loads(new)
    (stop,) = actions
    assert isinstance(stop, Stop)
    expected = dict(body)
    expected["choices"] = [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Let me read it again.\n\n" + stop.text},
            "finish_reason": "stop",
        }
    ]
    assert got == expected


def test_json_unchanged_gives_none() -> None:
    raw = orjson.dumps(completion([tool_call("read_file", ARGS)]))
    assert decide_json(raw, judge_for(repeated_call_messages(7)), Config()) == (None, [])
    assert decide_json(b'{"object": "list", "data": []}', None, Config()) == (None, [])
    assert decide_json(b"not json", None, Config()) == (None, [])


def test_json_runaway_keeps_the_first_two_identical_calls() -> None:
    body = completion([tool_call("write_file", WRITE, f"c{i}") for i in range(300)])
    new, actions = decide_json(orjson.dumps(body), None, Config())
    assert new is not None
    calls = orjson.loads(new)["choices"][0]["message"]["tool_calls"]
    assert [c["id"] for c in calls] == ["c0", "c1"]
    assert actions == [Cut("runaway", "write_file", 2, 2, "identical")]


def test_json_identical_reads_are_kept_up_to_four() -> None:
    body = completion([tool_call("read_file", ARGS, f"c{i}") for i in range(300)])
    new, actions = decide_json(orjson.dumps(body), None, Config())
    assert new is not None
    calls = orjson.loads(new)["choices"][0]["message"]["tool_calls"]
    assert [c["id"] for c in calls] == [f"c{i}" for i in range(4)]
    assert actions == [Cut("runaway", "read_file", 4, 4, "identical")]
    four = completion([tool_call("read_file", ARGS, f"c{i}") for i in range(4)])
    assert decide_json(orjson.dumps(four), None, Config()) == (None, [])


def test_json_degenerate_text_is_reported_only() -> None:
    body = orjson.dumps(completion(content="I will check the file again. " * 20))
    new, actions = decide_json(body, None, Config())
    assert new is None
    assert actions == [Cut("degenerate_text", "", 20, 10, "content", applied=False)]


def test_json_degenerate_reasoning_is_reported() -> None:
    body = completion(content="Answer.")
    body["choices"][0]["message"]["reasoning_content"] = "Wait, " * 100
    _, actions = decide_json(orjson.dumps(body), None, Config())
    assert actions == [Cut("degenerate_text", "", 100, 10, "reasoning", applied=False)]


# --- earlier stops ---------------------------------------------------------------------------------


def test_earlier_stops_found_in_history() -> None:
    text = DENIALS_TEXT.format(tool="read_file", count=9, denials=2)
    messages = [
        *repeated_call_messages(8),
        {"role": "assistant", "content": "Hm.\n\n" + text},
        {"role": "user", "content": DENIALS_TEXT},  # a user quoting it does not count
        {"role": "assistant", "content": "A normal answer."},
    ]
    found = earlier_stops(orjson.dumps({"messages": messages}), Config().stop)
    assert [(s.fresh, s.text) for s in found] == [(False, "Hm.\n\n" + text)]
    assert earlier_stops(orjson.dumps({"messages": messages[:-3]}), Config().stop) == []
    custom = build(Config, {"stop": {"message": "STOPPED {tool}"}}).stop
    assert (
        len(
            earlier_stops(orjson.dumps({"messages": [{"role": "assistant", "content": "STOPPED x"}]}), custom)
        )
        == 1
    )


def test_withheld_duplicates_are_what_the_stop_counts() -> None:
    t = openai_chat.parse_request({"messages": repeated_call_messages(8)})
    no_ladder = build(Config, {"guards": {"escalation": {"enabled": False}}})
    actions = evaluate(t, build_guards(no_ladder.guards), Context())
    texts = [a.text for a in actions if getattr(a, "position", -1) in (14, 16)]
    assert texts == [DUPLICATE_TEXT.format(tool="read_file", count=k, limit=6) for k in (7, 8)]
