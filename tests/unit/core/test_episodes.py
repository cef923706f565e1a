"""Episodes: loops that span user messages. A compaction summary, a short
"continue" or a harness's format error is not a new request; the same calls with the same
results on both sides are one loop. What the user must be able to reset (the stop ladder) still
restarts at every user message."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from proxy.config import Config, build
from proxy.core.effects import progress_rules
from proxy.core.episodes import ContinuationRule, episodes
from proxy.dialects import openai_chat
from proxy.errors import ConfigError
from proxy.guards import Context, build_guards, evaluate
from proxy.response.assemble import AssembledCall
from proxy.response.decide import StopJudge
from tests.helpers.agent_steps import History
from tests.helpers.rule_helpers import call_at, transcript

COMPACTION = (
    "This session is being continued from a previous conversation that ran out of context. The "
    "conversation is summarized below:\nAnalysis: the user asked to fix the failing import in app.py."
)
SUMMARY = "Here is a summary of the conversation so far:\n1. The user asked to fix app.py."
CONTEXT = "[Context compacted]\nThe user asked to fix app.py; the tests pass."
HANDOFF = "Another language model started to solve this problem and produced a summary of its work:\n- a"
HARNESS_OPENING = "[ERROR] You did not use a tool in your previous response!"
HARNESS = (
    "Tool call error:\n\n<error>\nError parsing tool call arguments: Expecting ':' delimiter\n</error>\n\n"
    "Here is general guidance on how to submit correct toolcalls."
)


@pytest.mark.parametrize(
    ("text", "continuation"),
    [
        ("continue", True),
        ("Continue.", True),
        ("go on", True),
        ("No", True),
        ("ok, keep going", True),
        ("yes please", True),
        ("try again", True),
        (COMPACTION, True),
        (HARNESS, True),
        ("[ERROR] You did not use a tool in your previous response! Please retry with a tool use.", True),
        ("Fix the bug in app.py", False),
        ("No, use the other config file.", False),
        ("Now write the tests.", False),
        ("Run the tests again please", False),
        ("Please summarize what you did so far.", False),
        ("Conversation summary feature is broken, fix it", False),
        ("Summary of the conversation so far: you fixed the parser.", True),
        ("[Context compacted] The user asked to fix app.py.", True),
        # the whole text must match, not its start (re.fullmatch)
        ("Please use a tool to check config.yaml once more, I just fixed it.", False),
        ("Please use a tool.", True),
        ("Please call one of the tools.", True),
        ("continue with the tests in tests/api", False),
        ("No", True),
        ("Tool call error", True),
        ("Tool call error: the path in config.yaml is wrong, fix that first", False),
        ("Tool call error:\nNo tool calls found in the response.", True),
        ("[Context summary]\nThe user asked to fix app.py.\nFiles: app.py, config.yaml", True),
        ("Context summary:\n" + "- step\n" * 200, True),
        (COMPACTION + "\n" + "The user then asked for tests.\n" * 500, True),
        ("Another language model started to solve this problem and produced a summary:\n- a\n- b", True),
    ],
)
def test_which_user_messages_continue_the_work(text: str, continuation: bool) -> None:
    assert ContinuationRule()(text) is continuation


@pytest.mark.parametrize("pattern", ContinuationRule().patterns)
def test_a_default_pattern_matches_no_request_that_only_starts_like_it(pattern: str) -> None:
    """Every default pattern, as fullmatch reads it: what it is for matches whole, and the same
    opening followed by a request of the user's own does not (for the short replies and the bare
    harness requests), while a compaction summary's pattern takes the long summary after it."""
    rule = ContinuationRule((pattern,))
    matched = [t for t in CONTINUATIONS if rule(t)]
    assert matched, pattern  # each pattern is for something
    # the texts whose opening is a harness's or a summary's own: what follows it is theirs too
    openings = {COMPACTION, SUMMARY, CONTEXT, HANDOFF, HARNESS_OPENING}
    for text in matched:
        extended = text + " Then also rename config.yaml to settings.yaml and run the tests."
        assert rule(extended) is (text in openings), (pattern, text)


#: one text each default pattern is for
CONTINUATIONS = (
    "continue",
    "ok, keep going.",
    COMPACTION,
    SUMMARY,
    CONTEXT,
    HANDOFF,
    "Tool call error",
    HARNESS_OPENING,
    "Please use a tool.",
)


def test_episode_numbers_skip_continuations() -> None:
    step = ("read_file", {"path": "a.py"}, "x")
    h = (
        History()
        .step(step)
        .user("continue")
        .step(step)
        .user("Now b.py")
        .step(step)
        .user(COMPACTION)
        .step(step)
    )
    t = transcript(h)
    assert [c.turn for c in t.calls] == [1, 2, 3, 4]
    assert episodes(t, ContinuationRule()) == (1, 1, 2, 2)
    assert episodes(t, ContinuationRule(())) == (1, 2, 3, 4)


def described(h: History, config: dict[str, Any] | None = None) -> list[tuple[int, str, str]]:
    cfg = build(Config, config or {})
    t = transcript(h)
    guards = build_guards(cfg.guards, *progress_rules(cfg.progress))
    return sorted((call_at(t, a), a.kind, a.rule) for a in evaluate(t, guards, Context()))


RUN = (
    "bash",
    {"command": "python app.py"},
    "Traceback (most recent call last):\nImportError: cannot import name 'x'",
)
GREP_A = ("bash", {"command": 'grep -rn "def x" .'}, "(no output)")
GREP_B = ("bash", {"command": 'grep -rn "x =" src'}, "(no output)")


def test_a_cycle_goes_on_across_a_compaction_summary() -> None:
    h = History().steps([GREP_A, GREP_B] * 2).user(COMPACTION).steps([GREP_A, GREP_B])
    assert (6, "remind", "cycles") in described(h)
    fresh = (
        History()
        .steps([GREP_A, GREP_B] * 2)
        .user("Look in the tests directory instead.")
        .steps([GREP_A, GREP_B])
    )
    assert [x for x in described(fresh) if x[2] == "cycles"] == []


def test_a_failing_run_goes_on_across_a_harness_error_message() -> None:
    edits = [
        ("apply_diff", {"path": "app.py", "diff": f"v{i}"}, "ERROR: the SEARCH block was not found")
        for i in range(3)
    ]
    h = History().steps(edits[:2]).user(HARNESS).steps(edits[2:])
    assert (3, "remind", "repeated_failure") in described(h)


def test_the_same_call_with_a_new_result_after_continue_is_still_progress() -> None:
    h = History().steps([RUN, RUN]).user("continue").steps([("bash", {"command": "python app.py"}, "ok")])
    assert [x for x in described(h) if x[1] == "remind" and x[2] == "repeat_reminder"] == []


def test_continue_after_a_stop_is_a_fresh_start_for_the_stop_ladder() -> None:
    """After a stop the user types "continue": the stop ladder (withheld results in the turn, the
    escalation ladder) restarts, so the very next call is not stopped again."""
    read = ("read_file", {"path": "config.yaml"}, "same")
    h = History().steps([read] * 8).user("continue")
    cfg = Config()
    t = transcript(h)
    guards = build_guards(cfg.guards, *progress_rules(cfg.progress))
    ctx = Context()
    judge = StopJudge(t, evaluate(t, guards, ctx), guards, ctx, cfg)
    assert judge.withheld == 0
    assert judge([AssembledCall("c9", "read_file", '{"path": "config.yaml"}')]) is None


def test_bad_continuation_pattern_fails_at_start_naming_the_key() -> None:
    with pytest.raises(ConfigError) as e:
        build(Config, {"progress": {"continuation_patterns": ["continue", "("]}})
    assert "progress.continuation_patterns[1]" in str(e.value)
    with pytest.raises(ConfigError) as e:
        build(Config, {"progress": {"continuation_patterns": [" "]}})
    assert "progress.continuation_patterns[0]: must not be empty" in str(e.value)


def test_real_run_harness_error_is_no_new_request() -> None:
    """mini-swe-agent answers a malformed tool call with a "Tool call error" user message
    (mini-bench1-django__django-13964, after call 132): calls 132 and 133 are one episode."""
    env = os.environ.get("LOOPGUARD_REALTRAJ")
    path = Path(env) if env else Path(__file__).resolve().parents[4] / "shared" / "fixtures" / "realtraj"
    path = path / "mini-bench1-django__django-13964.json"
    if not path.exists():
        pytest.skip(f"real runs not found at {path} (set LOOPGUARD_REALTRAJ)")
    t = openai_chat.parse_request({"messages": json.loads(path.read_text())["messages"]})
    ep = episodes(t, ContinuationRule())
    assert (t.calls[131].turn, t.calls[132].turn) == (1, 2)
    assert ep[131] == ep[132] == 1
