"""circuit_breaker guard (DESIGN §6.2): pure tests over message lists, no sockets."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.config import CircuitBreakerConfig, Config, build
from proxy.core.actions import Remind, Withhold
from proxy.dialects.openai_chat import parse_request
from proxy.edge.observe import Stats, action_summary
from proxy.errors import ConfigError
from proxy.guards import build_guards
from proxy.guards.circuit_breaker import (
    CAP_TEXT,
    DUPLICATE_TEXT,
    EPISODE_CAP_TEXT,
    WASTE_TEXT,
    CircuitBreaker,
)
from proxy.request.rewrite import decide_request
from tests.helpers.fakes import only_guard
from tests.helpers.resume_check import assert_resumes

RESULT = "print('hi')"


def call(name: str, args: Any, cid: str) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def conversation(calls: list[tuple[str, Any] | str], result: Any = RESULT) -> list[dict[str, Any]]:
    """A user prompt, then one step per entry: ``(name, arguments)`` makes one call (ids
    ``c1``, ``c2``, …) answered with ``result``; the string ``"user"`` is a user message that
    continues the work ("keep going"), ``"prompt"`` a new request from the user."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the bug"}]
    n = 0
    for entry in calls:
        if entry in ("user", "prompt"):
            text = "keep going" if entry == "user" else "Now add a test for it"
            messages.append({"role": "user", "content": text})
            continue
        n += 1
        name, args = entry
        messages.append({"role": "assistant", "content": None, "tool_calls": [call(name, args, f"c{n}")]})
        messages.append({"role": "tool", "tool_call_id": f"c{n}", "content": result})
    return messages


def letters(spec: str) -> list[tuple[str, Any] | str]:
    """``"A A B"`` → read_file calls on paths A, A, B; ``u`` is a user message that continues the
    work, ``P`` a new request."""
    special = {"u": "user", "P": "prompt"}
    return [special.get(t) or ("read_file", f'{{"path": "{t}"}}') for t in spec.split()]


def breaker(**cfg: Any) -> CircuitBreaker:
    return CircuitBreaker(build(CircuitBreakerConfig, cfg, "guards.circuit_breaker"))


def run(messages: list[dict[str, Any]], **cfg: Any) -> list[Withhold]:
    actions = breaker(**cfg)(parse_request({"messages": messages}), None)
    assert all(isinstance(a, Withhold) for a in actions)
    return actions  # type: ignore[return-value]


def denied_calls(messages: list[dict[str, Any]], actions: list[Withhold]) -> list[int]:
    """1-based call numbers of the withheld results."""
    tool_positions = [i for i, m in enumerate(messages) if m["role"] == "tool"]
    return [tool_positions.index(a.position) + 1 for a in actions]


def decide(messages: list[dict[str, Any]], config: dict[str, Any] | None = None):
    cfg = build(Config, config or {})
    raw = orjson.dumps({"model": "m", "messages": messages})
    return decide_request(raw, {}, build_guards(cfg.guards), cfg.conversation_key.headers)


# --- each limit at its default number (DESIGN §6.2) -----------------------------------------------


def test_twenty_identical_calls_withhold_results_of_calls_7_to_20() -> None:
    messages = conversation([("read_file", '{"path": "app.py"}')] * 20)
    actions = run(messages)
    assert [a.position for a in actions] == list(range(14, 41, 2))
    assert [a.call_id for a in actions] == [f"c{k}" for k in range(7, 21)]
    assert [a.text for a in actions] == [
        DUPLICATE_TEXT.format(tool="read_file", count=k, limit=6, kind="duplicate") for k in range(7, 21)
    ]
    assert actions[0].text == (
        "[loopguard] The result of this call is withheld: you have now called read_file with these same "
        "arguments 7 times, and the limit is 6. Repeating it will not give you anything new. Stop making "
        "this call: use the results you already have, change your approach, or tell the user what is "
        "blocking you."
    )
    assert [(a.rule, a.reason, a.tool, a.count, a.limit) for a in actions[:2]] == [
        ("circuit_breaker", "duplicate", "read_file", 7, 6),
        ("circuit_breaker", "duplicate", "read_file", 8, 6),
    ]
    assert [a.fresh for a in actions] == [False] * 13 + [True]


def test_twenty_identical_calls_body_with_both_guards_default_config() -> None:
    """Default config without the escalation ladder (it would withhold call 6 too:
    tests/unit/guards/test_escalation.py): reminders at calls 3, 5, 8 are inserted (shifting indexes) and the
    results of calls 7–20 are replaced; calls 1–6 keep theirs."""
    messages = conversation([("read_file", '{"path": "app.py"}')] * 20)
    decision = decide(messages, {"guards": {"escalation": {"enabled": False}}})
    sent = orjson.loads(decision.body)["messages"]
    assert len(sent) == 41 + 3
    assert [i for i, m in enumerate(sent) if m["role"] == "user"] == [0, 7, 12, 19]
    tools = [(i, m["content"]) for i, m in enumerate(sent) if m["role"] == "tool"]
    assert [i for i, c in tools if c == RESULT] == [2, 4, 6, 9, 11, 14]
    withheld = [16, 18, 21, 23, 25, 27, 29, 31, 33, 35, 37, 39, 41, 43]
    assert [i for i, c in tools if c != RESULT] == withheld
    for k, i in zip(range(7, 21), withheld, strict=True):
        assert sent[i]["content"] == DUPLICATE_TEXT.format(
            tool="read_file", count=k, limit=6, kind="duplicate"
        )


def test_non_consecutive_repeats_count_a_x_a_y_a() -> None:
    spec = [
        ("read_file", '{"path": "a.py"}'),
        ("grep", '{"pattern": "x"}'),
        ("read_file", '{"path": "a.py"}'),
        ("list_dir", '{"path": "."}'),
        ("read_file", '{"path": "a.py"}'),
        ("grep", '{"pattern": "x"}'),
        ("read_file", '{"path": "a.py"}'),
        ("list_dir", '{"path": "."}'),
        ("read_file", '{"path": "a.py"}'),
    ]
    messages = conversation(spec)
    actions = run(messages, duplicate_limit=3)
    assert denied_calls(messages, actions) == [7, 9]
    assert [(a.tool, a.count, a.limit) for a in actions] == [("read_file", 4, 3), ("read_file", 5, 3)]
    untouched = decide(messages, {"guards": {"circuit_breaker": {"duplicate_limit": 3}}})
    sent = orjson.loads(untouched.body)["messages"]
    for cid in ("c2", "c4", "c6", "c8"):
        assert [m["content"] for m in sent if m.get("tool_call_id") == cid] == [RESULT]


@pytest.mark.parametrize(
    ("spec", "denied"),
    [
        ("A A A", [3]),
        ("A A B C A", []),  # the first A has left the window
        ("A A B A", [4]),
        ("A A A A", [3, 4]),
        ("A A B C A A", []),
        ("A A B C A A A", [7]),
        ("A B A B A B", []),  # alternating pairs never hold two of a kind in 3
        ("A A B B B", [5]),
        ("A B A A C A", [4]),  # the denied 4th never entered the window: the 6th runs
        ("A A A B C A", [3]),
    ],
)
def test_window_eviction_limit_2_window_3(spec: str, denied: list[int]) -> None:
    messages = conversation(letters(spec))
    assert denied_calls(messages, run(messages, duplicate_limit=2, window=3)) == denied


@pytest.mark.parametrize(
    ("spec", "cfg", "denied"),
    [
        ("A B C D E F", {"max_calls_per_agent": 5}, [(6, "cap", 6, 5)]),
        ("A B C u D E F G", {"max_calls_per_agent": 5}, [(6, "cap", 6, 5), (7, "cap", 7, 5)]),
        # denied calls do not count toward the cap
        (
            "A A B C D",
            {"max_calls_per_agent": 3, "duplicate_limit": 1},
            [(2, "duplicate", 2, 1), (5, "cap", 5, 3)],
        ),
        # a call both duplicate and over the cap is a cap denial
        ("A B A", {"max_calls_per_agent": 2, "duplicate_limit": 1}, [(3, "cap", 3, 2)]),
        ("A B C D E F", {"max_calls_per_agent": 0}, []),
    ],
)
def test_lifetime_cap(spec: str, cfg: dict[str, Any], denied: list[tuple[int, str, int, int]]) -> None:
    messages = conversation(letters(spec))
    actions = run(messages, **cfg)
    got = [
        (n, a.reason, a.count, a.limit) for n, a in zip(denied_calls(messages, actions), actions, strict=True)
    ]
    assert got == denied


def test_cap_5_sixth_call_denied_across_user_message_with_cap_text() -> None:
    messages = conversation(letters("A B C u D E P F"))
    (a,) = run(messages, max_calls_per_agent=5, scope="conversation")
    assert a.position == messages.index(messages[-1])
    assert a.text == (
        "[loopguard] The result of this call is withheld: this conversation has reached its limit of 5 "
        "tool calls (this was call 6). Stop calling tools: tell the user what you have done and found "
        "so far, what is left, and what you need from them."
    )
    assert a.text == CAP_TEXT.format(limit=5, count=6)
    assert a.fresh is True


def test_the_cap_counts_the_calls_since_the_users_last_request_by_default() -> None:
    """ "keep going" continues the work (the cap goes on across it); a new request starts afresh."""
    messages = conversation(letters("A B C u D E F P G H I J K"))
    actions = run(messages, max_calls_per_agent=5)
    assert [(a.call_id, a.reason, a.count, a.limit) for a in actions] == [("c6", "cap", 6, 5)]
    assert actions[0].text == EPISODE_CAP_TEXT.format(limit=5, count=6)
    assert actions[0].text == (
        "[loopguard] The result of this call is withheld: you have reached the limit of 5 tool calls "
        "for the user's last request (this was call 6). Stop calling tools: tell the user what you have "
        "done and found so far, what is left, and what you need from them."
    )
    seed = run(messages, max_calls_per_agent=5, scope="conversation")
    assert [(a.call_id, a.count) for a in seed] == [(f"c{k}", k) for k in range(6, 12)]


@pytest.mark.parametrize(
    ("spec", "scope", "denied"),
    [
        ("A A P A A A", "episode", [5]),  # a new request: the window starts afresh
        ("A A P A A A", "conversation", [3, 4, 5]),  # the seed: nothing resets it
        ("A A u A A A", "episode", [3, 4, 5]),  # a continuation is no new request
        ("A B P A B P A B P A B", "episode", []),
        ("A B P A B P A B P A B", "conversation", [5, 6, 7, 8]),
    ],
)
def test_the_duplicate_window_scope(spec: str, scope: str, denied: list[int]) -> None:
    messages = conversation(letters(spec))
    assert denied_calls(messages, run(messages, duplicate_limit=2, scope=scope)) == denied


def routine_cycles(prompts: int, calls_per_prompt: int) -> list[tuple[str, Any] | str]:
    """``prompts`` cycles of a "commit and continue" session: each new request gets distinct
    reads, then the routine ``git status --short`` whose output never changes."""
    out: list[tuple[str, Any] | str] = []
    for p in range(prompts):
        if p:
            out.append("prompt")
        out += [("read_file", {"path": f"src/m{p}_{k}.py"}) for k in range(calls_per_prompt - 1)]
        out.append(("bash", {"command": "git status --short"}))
    return out


def test_a_routine_command_after_each_of_a_hundred_requests_is_never_withheld() -> None:
    messages = conversation(routine_cycles(100, 10), result=" M src/app.py")
    results = [m for m in messages if m["role"] == "tool"]
    assert len(results) == 1000
    for k, m in enumerate(results):
        if k % 10 != 9:
            m["content"] = f"contents of module {k}"
    assert run(messages) == []
    # the seed counts it across the requests: its 7th run among the last 200 calls is withheld,
    # and every call after the 300th run
    seed = run(messages, scope="conversation", max_calls_per_agent=300, progress_aware=False, waste_window=0)
    assert [(a.call_id, a.reason) for a in seed[:2]] == [("c70", "duplicate"), ("c80", "duplicate")]
    caps = [a for a in seed if a.reason == "cap"]
    assert (caps[0].call_id, caps[0].count, len(caps)) == ("c320", 320, 681)


# --- the waste cap ---------------------------------------------------------------------------------


def test_six_hundred_diverse_calls_on_one_request_are_untouched() -> None:
    spec: list[tuple[str, Any] | str] = []
    for k in range(200):
        spec += [
            ("read_file", {"path": f"src/f{k}.py"}),
            ("grep", {"pattern": f"def f{k}"}),
            ("bash", {"command": "pytest -q"}),
        ]
    messages = conversation(spec)
    for k, m in enumerate(m for m in messages if m["role"] == "tool"):
        m["content"] = f"output {k // 3}"  # every read new; each test run after it sees a new state
    assert run(messages) == []


def drifting(n: int, result: str = "No results found.") -> list[dict[str, Any]]:
    """``n`` searches, each with new arguments, each getting the same result."""
    return conversation(
        [("web_search", {"query": f"weather in shanghai today {k}"}) for k in range(n)], result
    )


def test_drifting_searches_that_bring_nothing_new_are_withheld_from_the_80th_waste_on() -> None:
    messages = drifting(120)
    actions = run(messages)
    # call 1 brings its result; calls 2-81 bring nothing new: at call 81 that is 80 of the last 100
    assert [a.call_id for a in actions] == [f"c{k}" for k in range(81, 121)]
    assert [a.count for a in actions] == [*range(80, 100), *[100] * 20]
    assert {(a.reason, a.limit, a.tool) for a in actions} == {("waste", 100, "web_search")}
    assert (
        actions[0].text
        == WASTE_TEXT.format(count=80, limit=100)
        == (
            "[loopguard] The result of this call is withheld: it gave you nothing you did not already have, "
            "and neither did 80 of your last 100 tool calls (the same results again, with nothing "
            "changed in between). You are going round in circles. Stop calling tools: tell the user what you "
            "have found, what is blocking you, and what you need from them."
        )
    )
    assert run(messages, waste_window=0) == []
    assert [a.call_id for a in run(messages, waste_window=10, waste_limit=9)] == [
        f"c{k}" for k in range(10, 121)
    ]


def test_a_new_request_empties_the_waste_window() -> None:
    spec: list[tuple[str, Any] | str] = [("web_search", {"query": f"q{k}"}) for k in range(75)]
    spec += ["prompt", *[("web_search", {"query": f"r{k}"}) for k in range(75)]]
    assert run(conversation(spec)) == []
    spec[75] = "user"  # "keep going": the same episode, 150 calls
    assert [a.call_id for a in run(conversation(spec))][:1] == ["c81"]


def test_exact_repeats_are_withheld_by_the_duplicate_rule_first() -> None:
    messages = conversation([("web_search", {"query": "weather in shanghai"})] * 1000)
    actions = run(messages)
    assert [(a.call_id, a.reason) for a in actions[:2]] == [("c7", "duplicate"), ("c8", "duplicate")]
    assert {a.reason for a in actions} == {"duplicate"}
    assert len(actions) == 994


def test_a_changed_situation_or_a_new_result_is_not_waste() -> None:
    # a test run after each edit gets the same failure: the edits are new, so nothing is waste
    spec: list[tuple[str, Any] | str] = []
    for k in range(150):
        spec += [("edit_file", {"path": "a.py", "new": f"v{k}"}), ("run_tests", {"path": "tests"})]
    messages = conversation(spec)
    for k, m in enumerate(m for m in messages if m["role"] == "tool"):
        m["content"] = f"edited {k}" if k % 2 == 0 else "FAILED test_a - AssertionError"
    assert run(messages) == []


def test_the_waste_cap_denies_a_call_without_its_result_only_past_the_limit() -> None:
    messages = drifting(81)
    messages.pop()  # call 81 has no result yet: no action, but it is denied (it counts nothing)
    assert run(messages) == []
    messages = drifting(82)
    del messages[-3]  # call 81's result is gone; call 82 is the 80th waste in the window
    assert [a.call_id for a in run(messages)] == ["c82"]


def test_changing_description_still_trips() -> None:
    spec = [("bash", {"command": "pytest -x", "description": f"attempt {i}"}) for i in range(7)]
    messages = conversation(spec)
    assert denied_calls(messages, run(messages)) == [7]
    assert denied_calls(messages, run(messages, ignore_args=[])) == []


def test_only_bash_leaves_read_file_alone() -> None:
    spec = [("bash", '{"command": "ls"}'), ("read_file", '{"path": "a"}')] * 8
    messages = conversation(spec)
    actions = run(messages, only=["bash"])
    assert denied_calls(messages, actions) == [13, 15]
    assert {a.tool for a in actions} == {"bash"}
    assert denied_calls(messages, run(messages)) == [13, 14, 15, 16]


def test_only_overrides_exempt() -> None:
    messages = conversation([("todo_write", '{"todos": []}')] * 7)
    assert denied_calls(messages, run(messages)) == []
    assert denied_calls(messages, run(messages, only=["todo_*"])) == [7]


def test_exempt_default_tools_are_invisible() -> None:
    """Exempt calls never count, never fill the window, never reach the cap."""
    spec = ["todo_write", "ask_user_question", "exit_plan_mode"] * 4
    messages = conversation([(n, "{}") for n in spec])
    assert run(messages, duplicate_limit=1, max_calls_per_agent=1) == []
    mixed = conversation(letters("A") + [("todo_write", "{}")] * 5 + letters("B"))
    assert denied_calls(mixed, run(mixed, max_calls_per_agent=2)) == []
    assert denied_calls(mixed, run(mixed, max_calls_per_agent=1)) == [7]


def test_exempt_patterns_use_wildcards() -> None:
    messages = conversation([("mcp__github__list", "{}")] * 3 + [("mcp.x", "{}")] * 3)
    assert denied_calls(messages, run(messages, duplicate_limit=1, exempt=["mcp__*"])) == [5, 6]


def test_parallel_calls_counted_in_listed_order() -> None:
    calls = [call("grep", '{"pattern": "TODO"}', f"p{i}") for i in range(1, 9)]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "find TODOs"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        *({"role": "tool", "tool_call_id": f"p{i}", "content": "x"} for i in range(1, 9)),
    ]
    actions = run(messages)
    assert [(a.position, a.call_id, a.count, a.fresh) for a in actions] == [
        (8, "p7", 7, True),
        (9, "p8", 8, True),
    ]


def test_a_call_without_result_counts_as_executed_but_gets_no_action() -> None:
    messages = conversation([("read_file", '{"path": "a"}')] * 8)
    del messages[6]  # the result of call 3 never arrived
    assert [a.call_id for a in run(messages)] == ["c7", "c8"]
    waiting = conversation([("read_file", '{"path": "a"}')] * 7)[:-1]  # call 7 awaits its result
    assert run(waiting) == []
    answered = conversation([("read_file", '{"path": "a"}')] * 8)
    del answered[14]  # the denied call 7 has no result: call 8 is still denied, as before
    assert [(a.call_id, a.count) for a in run(answered)] == [("c8", 8)]
    capped = conversation(letters("A B C D"))
    del capped[4]  # the result of call 2 never arrived: it still counts toward the cap
    assert [(a.call_id, a.reason) for a in run(capped, max_calls_per_agent=3)] == [("c4", "cap")]


# --- bad input --------------------------------------------------------------------------------------


def test_null_and_array_tool_contents_become_the_denial_string() -> None:
    """Results 1–5 are null, 6 and 8 arrays of parts, 7 null: kept ones stay as they were, the
    withheld 7 and 8 become plain denial strings (results not compared: ``progress_aware`` off)."""
    parts = [{"type": "text", "text": "part"}]
    messages = conversation([("read_file", '{"path": "a"}')] * 8, result=None)
    messages[12]["content"] = parts
    messages[16]["content"] = parts
    sent = orjson.loads(decide(messages, {"guards": {"circuit_breaker": {"progress_aware": False}}}).body)[
        "messages"
    ]
    assert [m["content"] for m in sent if m["role"] == "tool"] == [
        *[None] * 5,
        parts,
        DUPLICATE_TEXT.format(tool="read_file", count=7, limit=6),
        DUPLICATE_TEXT.format(tool="read_file", count=8, limit=6),
    ]


def test_tool_call_ids_that_repeat() -> None:
    """Agents/servers that reuse ids (every step ``call_0``; two parallel calls with one id)."""
    messages = conversation([("read_file", '{"path": "a"}')] * 7)
    for m in messages:
        if m["role"] == "assistant":
            m["tool_calls"][0]["id"] = "call_0"
        elif m["role"] == "tool":
            m["tool_call_id"] = "call_0"
    assert [(a.position, a.call_id) for a in run(messages)] == [(14, "call_0")]
    twins = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call("ls", "{}", "dup"), call("ls", "{}", "dup")],
        },
        {"role": "tool", "tool_call_id": "dup", "content": "one"},
        {"role": "tool", "tool_call_id": "dup", "content": "two"},
    ]
    assert [(a.position, a.count) for a in run(twins, duplicate_limit=1, progress_aware=False)] == [(3, 2)]


def test_tool_call_with_name_but_no_arguments() -> None:
    messages = conversation([("list_dir", "{}")] * 7)
    del messages[3]["tool_calls"][0]["function"]["arguments"]  # call 2: no arguments key at all
    messages[5]["tool_calls"][0]["function"]["arguments"] = ""  # call 3: empty string
    messages[7]["tool_calls"][0]["function"]["arguments"] = None  # call 4: null
    actions = run(messages)
    assert [(a.position, a.tool, a.count) for a in actions] == [(14, "list_dir", 7)]


def test_invalid_json_arguments_compare_as_raw_strings() -> None:
    messages = conversation([("bash", '{"command": "ls"')] * 3 + [("bash", '{"command":  "ls"')])
    assert denied_calls(messages, run(messages, duplicate_limit=2)) == [3]


# --- together with repeat_reminder, stats, logging ----------------------------------------------------


def test_a_call_can_get_a_reminder_and_be_denied() -> None:
    messages = conversation([("grep", '{"pattern": "x"}')] * 3)
    decision = decide(messages, {"guards": {"circuit_breaker": {"duplicate_limit": 2}}})
    assert [type(a) for a in decision.actions] == [Remind, Withhold]
    sent = orjson.loads(decision.body)["messages"]
    assert sent[6]["content"] == DUPLICATE_TEXT.format(tool="grep", count=3, limit=2)
    assert sent[7]["role"] == "user"
    assert sent[7]["content"].startswith("[loopguard] You have made the same tool call several times")
    assert len(sent) == 8


def test_disabled_breaker_changes_nothing() -> None:
    messages = conversation([("read_file", '{"path": "a"}')] * 7)
    cfg = only_guard("circuit_breaker", enabled=False)  # and every other guard off too
    raw = orjson.dumps({"model": "m", "messages": messages})
    c = build(Config, cfg)
    decision = decide_request(raw, {}, build_guards(c.guards), ())
    assert decision.body is raw
    assert decision.actions == ()


def test_custom_deny_message_renders_all_placeholders() -> None:
    messages = conversation([("read_file", '{"path": "a"}')] * 3)
    (a,) = run(messages, duplicate_limit=2, deny_message="{kind}: {tool} x{count} (max {limit}) {{ok}}")
    assert a.text == "duplicate: read_file x3 (max 2) {ok}"


def test_stats_count_fresh_withholds_per_kind_and_log_reason() -> None:
    stats = Stats()
    messages = conversation([("read_file", '{"path": "a"}')] * 8)
    actions = run(messages)
    stats.record_actions(actions)
    assert stats.results_withheld == 1
    snap = stats.snapshot()
    assert snap["withhold_kinds"] == {"duplicate": 1}
    assert snap["per_rule"] == {"circuit_breaker": 1}
    assert snap["incidents"] == []
    assert action_summary(actions[-1]) == {
        "rule": "circuit_breaker",
        "kind": "withhold",
        "tool": "read_file",
        "count": 8,
        "limit": 6,
        "reason": "duplicate",
    }


# --- configuration --------------------------------------------------------------------------------------


def test_defaults() -> None:
    cfg = Config().guards.circuit_breaker
    assert (cfg.enabled, cfg.duplicate_limit, cfg.window, cfg.max_calls_per_agent) == (True, 6, 200, 0)
    assert (cfg.scope, cfg.waste_window, cfg.waste_limit) == ("episode", 100, 80)
    assert cfg.exempt == ("todo_write", "ask_user_question", "exit_plan_mode")
    assert cfg.only == ()
    assert cfg.ignore_args == ("description", "explanation", "reason", "thought", "purpose")
    assert (cfg.deny_message, cfg.incident_log) == ("", "")
    assert [type(g).__name__ for g in build_guards(Config().guards)] == [
        "RepeatReminder",
        "CircuitBreaker",
        *("Recurrence", "Cycles", "RepeatedFailure", "Monologue", "EchoLoop"),  # loop rules, §6.5
        *("SameTarget", "Waiting", "Escalation"),  # progress-aware rules; a long wait's reminder
    ]


@pytest.mark.parametrize(
    ("data", "key", "fragment"),
    [
        ({"duplicate_limit": 0}, "duplicate_limit", "must be an integer >= 1"),
        ({"duplicate_limit": -3}, "duplicate_limit", "must be an integer >= 1"),
        ({"duplicate_limit": 2.5}, "duplicate_limit", "must be an integer"),
        ({"duplicate_limit": True}, "duplicate_limit", "must be an integer"),
        ({"window": 0}, "window", "must be an integer >= 1"),
        ({"window": "200"}, "window", "must be an integer"),
        ({"window": 5}, "window", "must be >= duplicate_limit (6), got 5"),
        ({"duplicate_limit": 10, "window": 9}, "window", "must be >= duplicate_limit (10), got 9"),
        ({"max_calls_per_agent": -1}, "max_calls_per_agent", "must be an integer >= 0"),
        ({"max_calls_per_agent": None}, "max_calls_per_agent", "must be an integer"),
        ({"deny_message": "{x} was repeated"}, "deny_message", "unknown placeholder {x}"),
        ({"deny_message": "{tool} {toll}"}, "deny_message", "unknown placeholder {toll}"),
        ({"deny_message": "call {}"}, "deny_message", "unknown placeholder {}"),
        ({"deny_message": "{0}"}, "deny_message", "unknown placeholder {0}"),
        ({"deny_message": "{tool.upper}"}, "deny_message", "unknown placeholder {tool.upper}"),
        ({"deny_message": "{count:{width}}"}, "deny_message", "unknown placeholder {width}"),
        ({"deny_message": "{tool"}, "deny_message", "is not a valid template"),
        ({"deny_message": "tool}"}, "deny_message", "is not a valid template"),
        ({"deny_message": "{tool:d}"}, "deny_message", "cannot be rendered"),
        ({"deny_message": 5}, "deny_message", "must be a string"),
        ({"exempt": "todo_write"}, "exempt", "must be a list"),
        ({"only": [1]}, "only[0]", "must be a string"),
        ({"incident_log": None}, "incident_log", "must be a string"),
        ({"duplicate_limt": 3}, "duplicate_limt", "unknown key"),
        ({"scope": "turn"}, "scope", "must be one of"),
        ({"scope": None}, "scope", "must be one of"),
        ({"waste_window": 1}, "waste_window", "must be 0 (off) or an integer >= 2"),
        ({"waste_window": -1}, "waste_window", "must be 0 (off) or an integer >= 2"),
        ({"waste_limit": 0}, "waste_limit", "must be an integer >= 1"),
        ({"waste_limit": 101}, "waste_limit", "must be <= waste_window (100), got 101"),
        ({"waste_window": 50, "waste_limit": 60}, "waste_limit", "must be <= waste_window (50), got 60"),
    ],
)
def test_config_validation(data: dict[str, Any], key: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        build(Config, {"guards": {"circuit_breaker": data}})
    assert err.value.key == f"guards.circuit_breaker.{key}"
    assert fragment in err.value.message


@pytest.mark.parametrize(
    "data",
    [
        {"duplicate_limit": 1, "window": 1, "max_calls_per_agent": 0},
        {"duplicate_limit": 6, "window": 6},
        {"scope": "conversation", "waste_window": 0, "waste_limit": 500},
        {"scope": "episode", "waste_window": 2, "waste_limit": 2},
        {"deny_message": "{tool} {count} {limit} {kind} {{literal}} {count:>3} {kind!r}"},
        {"deny_message": "no placeholders at all"},
        {"exempt": [], "only": ["bash", "mcp__*"], "ignore_args": [], "incident_log": "/tmp/x.jsonl"},
    ],
)
def test_config_accepts(data: dict[str, Any]) -> None:
    cfg = build(Config, {"guards": {"circuit_breaker": data}}).guards.circuit_breaker
    for k, v in data.items():
        assert getattr(cfg, k) == (tuple(v) if isinstance(v, list) else v)


# --- resuming from a kept state -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "cfg", "denied"),
    [
        (" ".join(["A"] * 9), {"duplicate_limit": 6}, [7, 8, 9]),
        ("A A B A A u A", {"duplicate_limit": 2, "window": 3}, [4, 5, 6]),
        ("A B C D E F", {"max_calls_per_agent": 3}, [4, 5, 6]),
        ("A B P C D E u F G", {"max_calls_per_agent": 2}, [5, 6, 7]),
        ("A A P A A A P A", {"duplicate_limit": 2}, [5]),
        ("A B C D E F G H", {"waste_window": 4, "waste_limit": 3}, [4, 5, 6, 7, 8]),
    ],
    ids=["duplicates", "window", "cap", "episode-cap", "episode-window", "waste"],
)
def test_a_state_advanced_in_two_parts_withholds_what_the_whole_run_does(
    spec: str, cfg: dict[str, Any], denied: list[int]
) -> None:
    messages = conversation(letters(spec))
    t = parse_request({"messages": messages})
    # cut at every step's assistant message
    whole = assert_resumes(breaker(**cfg), t, cuts=[step.position for step in t.steps])
    assert denied_calls(messages, whole) == denied  # type: ignore[arg-type]
