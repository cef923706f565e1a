"""The escalation ladder and same_target (DESIGN §2.2): reminders the model
ignores lead to a withheld result, then to the end of the turn — including loops whose arguments
drift, which no exact-match rule sees."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.config import Config, EscalationConfig, build
from proxy.core.actions import Remind, Stop, Withhold
from proxy.core.effects import effect_rule
from proxy.core.volatile import compile_masks
from proxy.dialects import openai_chat
from proxy.errors import ConfigError
from proxy.guards import Context, build_guards, evaluate
from proxy.guards.escalation import WITHHOLD_TEXT, Escalation
from proxy.response.assemble import AssembledCall
from proxy.response.decide import ESCALATION_TEXT, StopJudge
from tests.helpers.agent_steps import History
from tests.helpers.fakes import FakeUpstream, scripted_model, tool_call
from tests.helpers.resume_check import assert_resumes
from tests.helpers.rule_helpers import call_at, transcript
from tests.helpers.sdk_agent import agent_loop, snapshot

CONFIG = "same-content"
READ = ("read_file", {"path": "config.yaml"}, CONFIG)


def drift(i: int) -> dict[str, Any]:
    """The arguments of a small model's i-th read of config.yaml: the same path, noise that
    changes every call (HTML escaping, reminder text echoed into an argument)."""
    noise = ["", "&quot;", "&amp;quot;", "[loopguard] You", "&lt;b&gt;", "  ", "again", "&#39;"][i % 8]
    return {"path": "config.yaml", "note": f"read it{noise}"}


def actions(h: History, config: dict[str, Any] | None = None) -> list[Any]:
    cfg = build(Config, config or {})
    t = transcript(h)
    return evaluate(
        t, build_guards(cfg.guards, compile_masks(cfg.progress.masks), effect_rule(cfg.progress)), Context()
    )


def described(h: History, config: dict[str, Any] | None = None) -> list[tuple[int, str, str]]:
    """(call, kind, rule) of every action, by call number."""
    t = transcript(h)
    return sorted((call_at(t, a), a.kind, a.rule) for a in actions(h, config))


def stop_of(h: History, answer: AssembledCall, config: dict[str, Any] | None = None) -> Stop | None:
    cfg = build(Config, config or {})
    t = transcript(h)
    guards = build_guards(cfg.guards, compile_masks(cfg.progress.masks), effect_rule(cfg.progress))
    ctx = Context()
    return StopJudge(t, evaluate(t, guards, ctx), guards, ctx, cfg)([answer])


# --- the ladder on exact repeats ---------------------------------------------------------------


def test_identical_loop_reminded_twice_then_the_sixth_result_is_withheld() -> None:
    got = described(History().steps([READ] * 6))
    assert got == [
        (3, "remind", "repeat_reminder"),
        (5, "remind", "repeat_reminder"),
        (6, "withhold", "escalation"),
    ]


def test_withhold_text_and_evidence() -> None:
    h = History().steps([READ] * 6)
    (w,) = [a for a in actions(h) if isinstance(a, Withhold)]
    assert w == Withhold(
        position=h.result_position(6),
        call_id="c6",
        text=(
            "[loopguard] The result of this call is withheld: you were reminded 2 times that your calls "
            "to read_file on config.yaml were not getting anywhere, and this call got the same result "
            "as an earlier one. Stop calling read_file for this: use the results you already have, try "
            "a different approach, or tell the user what is blocking you."
        ),
        rule="escalation",
        tool="read_file",
        count=2,
        limit=2,
        fresh=True,
        reason="reminders",
    )
    assert w.text == WITHHOLD_TEXT.format(count=2, subject="read_file on config.yaml", tool="read_file")


def test_the_next_identical_call_ends_the_turn_with_the_ladder_text() -> None:
    h = History().steps([READ] * 6)
    stop = stop_of(h, AssembledCall("c7", "read_file", '{"path": "config.yaml"}'))
    assert stop == Stop(
        text=ESCALATION_TEXT.format(tool="read_file", limit=2),
        rule="stop",
        tool="read_file",
        count=2,
        limit=2,
        reason="escalation",
        evidence=(("ignored_reminders", 2), ("after_reminders", 2), ("withheld_in_turn", 1)),
    )
    assert stop.text == (
        "[loopguard] Stopped: the model kept calling read_file after 2 reminders and a withheld result "
        "that said it was not getting anywhere, so loopguard ended its turn here; that last call was "
        "not run. Send a message to continue."
    )


def test_a_new_result_after_the_reminders_is_progress_and_passes() -> None:
    h = History().steps([READ] * 5 + [("read_file", {"path": "config.yaml"}, "fixed content")])
    assert [a for a in actions(h) if isinstance(a, Withhold)] == []


def poll(step: int) -> tuple[str, dict[str, Any], str]:
    return ("bash", {"command": "sleep 1; tail -n1 build.log"}, f"step {step} of 30")


def test_a_job_polled_with_one_command_whose_output_moves_on_is_never_withheld() -> None:
    """A build that advances every 3 polls (0,0,0,3,3,3,6,…): each run of equal results gets its
    reminder, but a new result sets the ladder back, so nothing is withheld and no stop comes
    (a new user's tryout with Claude Code: the 8th poll was withheld, the 9th stopped)."""
    h = History().steps([poll(3 * (i // 3)) for i in range(15)])
    got = described(h)
    assert [g for g in got if g[1] != "remind"] == []
    assert stop_of(h, AssembledCall("c", "bash", json.dumps(poll(0)[1]), 0)) is None


def test_after_the_output_stops_moving_the_ladder_counts_again() -> None:
    """The same job once it hangs at step 6: the ladder counts only the reminders after the last
    new result, so it acts two reminders after the job stopped moving."""
    h = History().steps([poll(min(3 * (i // 3), 6)) for i in range(16)])
    got = described(h)
    # reminders at 3, 6 (moving), 9 and 11 (stuck from the 7th poll); the ladder withholds the
    # 12th, two reminders after the output stopped; the breaker counts from the last new result
    # (the 7th poll: 6 duplicates after it, the 14th is the 7th)
    assert [n for n, k, _ in got if k == "remind"] == [3, 6, 9, 11, 14]
    assert [(n, r) for n, k, r in got if k == "withhold"][:3] == [
        (12, "escalation"),
        (13, "escalation"),
        (14, "circuit_breaker"),
    ]


def test_a_rewritten_call_after_the_withhold_is_not_stopped() -> None:
    """The ladder stops a drifting repeat, not a new approach on the same target (seen in the
    real run coder-django__django-12915-3-programmer, call 15: a rewritten edit after a withheld
    identical one, and the session then succeeded)."""
    h = History().steps([READ] * 6)
    answer = AssembledCall(
        "c7", "read_file", '{"path": "config.yaml", "offset": 200, "limit": 400, "why": "the rest"}'
    )
    assert stop_of(h, answer) is None


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        pytest.param({"guards": {"escalation": {"after_reminders": 3}}}, [], id="three_reminders_needed"),
        pytest.param({"guards": {"escalation": {"enabled": False}}}, [], id="off"),
    ],
)
def test_configured_ladder(config: dict[str, Any], expected: list[int]) -> None:
    h = History().steps([READ] * 6)
    got = [call_at(transcript(h), a) for a in actions(h, config) if isinstance(a, Withhold)]
    assert got == expected


def test_stop_off_keeps_withholding_instead() -> None:
    h = History().steps([READ] * 6)
    answer = AssembledCall("c7", "read_file", '{"path": "config.yaml"}')
    config = {"guards": {"escalation": {"stop": False}, "circuit_breaker": {"enabled": False}}}
    assert stop_of(h, answer, config) is None


def test_a_user_message_starts_the_ladder_again() -> None:
    h = History().steps([READ] * 6).user("Try once more, I fixed the file.").steps([READ] * 2)
    t = transcript(h)
    ladder = [call_at(t, a) for a in actions(h) if isinstance(a, Withhold) and a.rule == "escalation"]
    assert ladder == [6]  # (the circuit breaker's window spans the user message: it denies 7 and 8)


def test_only_reminders_the_model_had_read_count() -> None:
    """Reminders about other targets, and text reminders, do not count for config.yaml."""
    other = ("read_file", {"path": "other.yaml"}, "x")
    h = History().steps([other] * 5 + [READ, READ])
    assert [a for a in actions(h) if isinstance(a, Withhold)] == []


@pytest.mark.parametrize(("value", "message"), [(0, "must be an integer >= 1"), ("2", "must be an integer")])
def test_bad_after_reminders_fails_at_start_naming_the_key(value: Any, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        build(Config, {"guards": {"escalation": {"after_reminders": value}}})
    assert "guards.escalation.after_reminders" in str(e.value)
    assert message in str(e.value)


# --- drifting arguments: same_target reminds, the ladder acts -----------------------------------


def test_drifting_arguments_reminded_at_3_and_5_withheld_at_6() -> None:
    h = History().steps([("read_file", drift(i), CONFIG) for i in range(6)])
    assert described(h) == [
        (3, "remind", "same_target"),
        (5, "remind", "same_target"),
        (6, "withhold", "escalation"),
    ]
    (first, _) = [a for a in actions(h) if isinstance(a, Remind)]
    assert first.text == (
        "[loopguard] You called read_file on config.yaml 3 times in a row, with different arguments "
        "each time, and it returned the same result each time.\n"
        "- tool: read_file\n"
        '- last arguments: {"note":"read it&amp;quot;","path":"config.yaml"}\n'
        "Changing the arguments this way does not change the result. Use the result you already "
        "have, do something different, or tell the user what is blocking you."
    )


def test_calls_that_differ_only_in_a_description_get_one_kind_of_reminder() -> None:
    """Claude Code's Bash calls carry a ``description`` that may change every time: to
    repeat_reminder (which ignores it) they are one call; same_target compares them the same way,
    so the model never reads "the same call" and "different arguments each time" together."""
    h = History().steps(
        [
            ("bash", {"command": "cat notes.txt", "description": f"Read the notes ({i})"}, "n")
            for i in range(6)
        ]
    )
    assert described(h) == [
        (3, "remind", "repeat_reminder"),
        (5, "remind", "repeat_reminder"),
        (6, "withhold", "escalation"),
    ]


def test_drifting_repeat_after_the_withhold_ends_the_turn() -> None:
    h = History().steps([("read_file", drift(i), CONFIG) for i in range(6)])
    answer = AssembledCall("c7", "read_file", orjson.dumps(drift(6)).decode())
    stop = stop_of(h, answer)
    assert stop is not None and stop.reason == "escalation"


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param(
            [("read_file", {"path": "config.yaml", "n": i}, f"page {i}") for i in range(6)],
            [],
            id="new_results_are_progress",
        ),
        pytest.param([READ] * 3, [(3, "remind", "repeat_reminder")], id="identical_left_to_repeat_reminder"),
        pytest.param(
            [("read_file", drift(0), CONFIG), ("edit_file", {"path": "config.yaml", "new": "x"}, "ok")]
            + [("read_file", drift(i), CONFIG) for i in (1, 2)],
            [],
            id="a_change_in_between_ends_the_run",
        ),
        pytest.param(
            [("read_file", {"path": f"f{i}.yaml"}, CONFIG) for i in range(4)], [], id="different_targets"
        ),
    ],
)
def test_same_target_runs(steps: list[Any], expected: list[tuple[int, str, str]]) -> None:
    assert described(History().steps(steps)) == expected


# --- end to end: the official SDK as the agent, the real server ---------------------------------


#: A model that reads config.yaml forever, its arguments drifting every call.
drifting_model = scripted_model(
    lambda n: [tool_call("read_file", orjson.dumps(drift(n)).decode(), f"call_{n + 1}")]
)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_sdk_drifting_loop_is_withheld_at_6_and_stopped_at_7(
    upstream: FakeUpstream, sdk, stream: bool
) -> None:
    upstream.handler = drifting_model
    client = await sdk()
    messages, steps, finish = await agent_loop(client, stream, max_steps=30, result=CONFIG)
    assert (steps, finish) == (7, "stop")
    assert messages[-1] == {"role": "assistant", "content": ESCALATION_TEXT.format(tool="read_file", limit=2)}
    assert sum(1 for m in messages if m["role"] == "tool") == 6  # the 7th call was never run
    sixth = upstream.requests[6].json()["messages"]
    results = [m["content"] for m in sixth if m.get("role") == "tool"]
    assert results[:5] == [CONFIG] * 5
    assert results[5].startswith("[loopguard] The result of this call is withheld: you were reminded 2 times")
    reminders = [m["content"].split(",")[0] for m in sixth if m["role"] == "user"][1:]
    assert reminders == [
        "[loopguard] You called read_file on config.yaml 3 times in a row",
        "[loopguard] You called read_file on config.yaml 5 times in a row",
    ]
    snap = await snapshot(client.base)
    assert snap["per_rule"] == {"same_target": 2, "escalation": 1, "stop": 1}
    assert (snap["stops"], snap["results_withheld"]) == (1, 1)
    # the user types "continue" and the model drifts on: one more call runs (its result withheld
    # from the model), the next answer is stopped again
    messages.append({"role": "user", "content": "continue"})
    messages, steps, finish = await agent_loop(client, stream, max_steps=30, messages=messages, result=CONFIG)
    assert (steps, finish) == (2, "stop")
    assert messages[-1]["content"] == ESCALATION_TEXT.format(tool="read_file", limit=2)
    snap = await snapshot(client.base)
    assert (snap["stops"], snap["results_withheld"]) == (2, 2)


# --- a real run: the identical rejected edit retried (coder-pallets__flask-4992-3-programmer) ---


def _realtraj() -> Path:
    env = os.environ.get("LOOPGUARD_REALTRAJ")
    return Path(env) if env else Path(__file__).resolve().parents[4] / "shared" / "fixtures" / "realtraj"


def test_real_run_rejected_edit_retried_is_withheld_at_6() -> None:
    """SWE-agent retries one rejected edit 36 times (calls 3-39): reminders at 4 (the same
    failure again) and 5 (3 identical calls), the 6th result withheld, the 7th call stopped."""
    path = _realtraj() / "coder-pallets__flask-4992-3-programmer.json"
    if not path.exists():
        pytest.skip(f"real runs not found at {path} (set LOOPGUARD_REALTRAJ)")
    run = json.loads(path.read_text())
    messages = run["messages"]
    # the history up to the 6th call's result
    upto = next(i for i, m in enumerate(messages) if m.get("tool_call_id") and _nth_call(messages, i) == 6)
    h = History()
    h.messages = messages[: upto + 1]
    got = described(h)
    assert (6, "withhold", "escalation") in got
    assert [x for x in got if x[1] == "withhold"] == [(6, "withhold", "escalation")]
    assert [x for x in got if x[1] == "remind"][:2] == [
        (4, "remind", "repeated_failure"),
        (5, "remind", "repeat_reminder"),
    ]
    nxt = messages[upto + 1]["tool_calls"][0]
    answer = AssembledCall(nxt["id"], nxt["function"]["name"], nxt["function"]["arguments"])
    stop = stop_of(h, answer)
    assert stop is not None and (stop.reason, stop.tool) == ("escalation", "edit")


def _nth_call(messages: list[dict[str, Any]], i: int) -> int:
    ids = [tc["id"] for m in messages[:i] for tc in m.get("tool_calls") or []]
    return ids.index(messages[i]["tool_call_id"]) + 1


def test_parse_keeps_reminder_calls() -> None:
    """Reminders after a step name the call that brought them (what the ladder reads)."""
    h = History().steps([READ] * 3)
    (r,) = [a for a in actions(h) if isinstance(a, Remind)]
    assert (r.rule, r.call) == ("repeat_reminder", 2)
    assert openai_chat.parse_request({"messages": h.messages}).calls[2].seq == 2


def test_continue_after_a_stop_while_the_drift_goes_on_is_withheld_then_stopped_again() -> None:
    """The user types "continue" after the stop; the model keeps drifting: the loop rules count
    across a continuation, so the ladder withholds the next stale call at once and the one after
    is stopped again (a fresh start only for the stop itself: the first answer after "continue"
    is never stopped)."""
    h = History().steps([("read_file", drift(i), CONFIG) for i in range(6)]).user("continue")
    first = AssembledCall("c7", "read_file", orjson.dumps(drift(6)).decode())
    assert stop_of(h, first) is None
    h.steps([("read_file", drift(6), CONFIG)])
    t = transcript(h)
    ladder = [call_at(t, a) for a in actions(h) if isinstance(a, Withhold) and a.rule == "escalation"]
    assert ladder == [6, 7]
    stop = stop_of(h, AssembledCall("c8", "read_file", orjson.dumps(drift(7)).decode()))
    assert stop is not None and stop.reason == "escalation"


def test_a_new_request_starts_the_ladder_from_the_bottom() -> None:
    h = History().steps([("read_file", drift(i), CONFIG) for i in range(6)]).user("Now check the logs.")
    h.steps([("read_file", drift(6), CONFIG)])
    t = transcript(h)
    assert [call_at(t, a) for a in actions(h) if isinstance(a, Withhold) and a.rule == "escalation"] == [6]


# --- resuming from a kept state -----------------------------------------------------------------


def test_a_target_first_reminded_after_the_cut_is_judged_from_its_first_call() -> None:
    # results v1, v2 (new), then v2 again and again; reminders about calls 3 and 4 only: the
    # calls before the cut were read before any reminder on the target, and the last new
    # result (call 2) still sets the count back
    results = ["v1", "v2", "v1", "v2", "v2", "v2"]
    h = History().steps([("read_file", {"path": "config.yaml"}, r) for r in results])
    t = transcript(h)
    prior = tuple(
        Remind(
            after=t.steps[n - 1].end,
            text="r",
            rule="same_target",
            tool="read_file",
            count=n,
            limit=n,
            fresh=False,
            call=n - 1,
        )
        for n in (3, 4)
    )
    ctx = Context(prior=prior)
    # cut at every step's assistant message
    whole = assert_resumes(Escalation(EscalationConfig()), t, ctx, cuts=[step.position for step in t.steps])
    assert [(a.position, a.count) for a in whole] == [(h.result_position(5), 2), (h.result_position(6), 2)]


def test_a_new_result_before_the_reminders_sets_the_count_back_when_resumed() -> None:
    # a reminder after call 2, a new result at call 3, a reminder after call 4: call 5 has read
    # one reminder since the last new result, call 6 two
    results = ["v1", "v1", "v2", "v2", "v2", "v2"]
    h = History().steps([("read_file", {"path": "config.yaml"}, r) for r in results])
    t = transcript(h)
    prior = tuple(
        Remind(
            after=t.steps[n - 1].end,
            text="r",
            rule="repeat_reminder",
            tool="read_file",
            count=n,
            limit=n,
            fresh=False,
            call=n - 1,
        )
        for n in (2, 4, 5)
    )
    ctx = Context(prior=prior)
    whole = assert_resumes(Escalation(EscalationConfig()), t, ctx, cuts=[step.position for step in t.steps])
    assert [(a.position, a.count) for a in whole] == [(h.result_position(6), 2)]


# --- agents' edits (proxy.core.agents): successful edits are progress, one failure is one failure ---

APP = "/r/app.py"


def cc_edit(old: str, new: str) -> tuple[str, dict[str, Any], str]:
    """Claude Code's Edit, answered with its constant success line."""
    return (
        "Edit",
        {"file_path": APP, "old_string": old, "new_string": new},
        f"The file {APP} has been updated successfully.",
    )


def cc_missing(old: str) -> tuple[str, dict[str, Any], str]:
    error = f"<tool_use_error>String to replace not found in file.\nString: {old}</tool_use_error>"
    return ("Edit", {"file_path": APP, "old_string": old, "new_string": "y"}, error)


def codex_patch(old: str, result: str) -> tuple[str, str, str]:
    """Codex's apply_patch (a custom tool: the raw patch is its input)."""
    return (
        "apply_patch",
        f"*** Begin Patch\n*** Update File: {APP}\n@@\n-{old}\n+y\n*** End Patch\n",
        result,
    )


def codex_missing(old: str) -> tuple[str, str, str]:
    return codex_patch(
        old, f"apply_patch verification failed: Failed to find expected lines in {APP}:\n{old}"
    )


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param([cc_edit(f"v{k}", f"v{k + 1}") for k in range(10)], [], id="ten_new_edits_are_progress"),
        pytest.param(
            [
                codex_patch(
                    f"v{k}",
                    "Exit code: 0\nWall time: 0 seconds\nOutput:\nSuccess. Updated the following "
                    f"files:\nM {APP}\n",
                )
                for k in range(10)
            ],
            [],
            id="ten_new_patches_are_progress",
        ),
        pytest.param(
            [cc_edit("A", "B"), cc_edit("B", "A")] * 3,
            [
                (3, "remind", "same_target"),
                (5, "remind", "same_target"),
                (6, "remind", "recurrence"),
                (6, "withhold", "escalation"),
            ],
            id="edits_back_and_forth_are_withheld",
        ),
        pytest.param(
            [cc_missing(f"def f{k}():") for k in range(6)],
            [
                (3, "remind", "repeated_failure"),
                (3, "remind", "same_target"),
                (5, "remind", "same_target"),
                (6, "withhold", "escalation"),
            ],
            id="claude_code_missing_text_drifting",
        ),
        pytest.param(
            [codex_missing(f"def f{k}():") for k in range(6)],
            [
                (3, "remind", "repeated_failure"),
                (3, "remind", "same_target"),
                (5, "remind", "same_target"),
                (6, "withhold", "escalation"),
            ],
            id="codex_missing_lines_drifting",
        ),
    ],
)
def test_agents_edits(steps: list[Any], expected: list[tuple[int, str, str]]) -> None:
    assert described(History().steps(steps)) == expected


@pytest.mark.parametrize(
    ("steps", "answer"),
    [
        pytest.param(
            [cc_missing(f"def f{k}():") for k in range(6)],
            AssembledCall(
                "c7", "Edit", json.dumps({"file_path": APP, "old_string": "def f6():", "new_string": "y"})
            ),
            id="claude_code",
        ),
        pytest.param(
            [codex_missing(f"def f{k}():") for k in range(6)],
            AssembledCall("c7", "apply_patch", codex_missing("def f6():")[1]),
            id="codex",
        ),
    ],
)
def test_the_next_drifting_failing_edit_after_the_withhold_is_stopped(
    steps: list[Any], answer: AssembledCall
) -> None:
    stop = stop_of(History().steps(steps), answer)
    assert stop is not None and (stop.reason, stop.tool) == ("escalation", answer.name)


def test_a_successful_new_edit_after_failing_ones_is_not_stopped() -> None:
    h = History().steps([cc_missing(f"def f{k}():") for k in range(5)] + [cc_edit("def f():", "def g():")])
    assert [a for a in actions(h) if isinstance(a, Withhold)] == []
