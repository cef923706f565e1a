"""Parallel calls cancelled by a sibling's error: one failure, not ten.

When one of the parallel calls of a Claude Code step fails, Claude Code answers every other call
of that step ``<tool_use_error>Sibling tool call errored</tool_use_error>`` (``is_error: true``;
the shape recorded in the native sessions, ``cc-cli-6d63c3a51594-0``: one ``Edit`` failing
"File has been modified since read", nine cancelled). A cancelled call never ran: it is neither a
failure nor a success (:class:`proxy.core.failures.FailureRule` gives None), it changed nothing
(:mod:`proxy.core.effects`), and same_target and escalation skip it. Pinned on the rule, on the guards
(the default config over a Messages transcript) and end to end through the real server in the
Messages dialect, JSON and SSE.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.config import Config, build
from proxy.core.effects import EffectRule, epochs, progress_rules
from proxy.core.failures import FailureRule, cancelled
from proxy.core.transcript import ToolResult
from proxy.dialects import anthropic_messages
from proxy.guards import Context, build_guards, evaluate
from tests.helpers.corpus import default_config
from tests.helpers.realtraj_native import replay_sessions

SIBLING = "<tool_use_error>Sibling tool call errored</tool_use_error>"
MODIFIED = (
    "<tool_use_error>File has been modified since read, either by the user or by a linter. Read it "
    "again before attempting to write it.</tool_use_error>"
)
FILE = "/work/app/cmd/rewind_test.go"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (SIBLING, True),
        (f"  {SIBLING}\n", True),
        ("Sibling tool call errored", True),
        (MODIFIED, False),
        (f"{SIBLING}\nmore output", False),
        ("grep: Sibling tool call errored appears in the log", False),
        ("", False),
    ],
)
def test_cancelled_is_the_whole_text(text: str, expected: bool) -> None:
    assert cancelled(ToolResult(0, text, is_error=True)) is expected


def test_a_pending_or_missing_result_is_not_cancelled() -> None:
    assert (cancelled(None), cancelled(ToolResult(0, SIBLING, pending=True))) == (False, False)


def test_a_cancelled_call_is_neither_a_failure_nor_a_success() -> None:
    rule = FailureRule()
    assert [
        rule(ToolResult(0, t, is_error=e)) for t, e in [(SIBLING, True), (MODIFIED, True), ("ok", False)]
    ] == [
        None,
        True,
        False,
    ]


# --- a Claude Code step of ten parallel edits, one failing, nine cancelled -------------------------


def _edit(k: int) -> dict[str, Any]:
    old, new = f"func Test{k}(t *testing.T) {{", f"func Test{k}(t *testing.T) {{\n\tt.Parallel()"
    return {
        "type": "tool_use",
        "id": f"toolu_edit{k}",
        "name": "Edit",
        "input": {"replace_all": False, "file_path": FILE, "old_string": old, "new_string": new},
    }


def cancelled_step(parallel: int = 10) -> list[dict[str, Any]]:
    """The Messages messages: a request, one answer of ``parallel`` Edits (the first fails, the
    others are cancelled), a Read of the file, then a text answer."""
    results = [{"type": "tool_result", "tool_use_id": "toolu_edit0", "content": MODIFIED, "is_error": True}]
    results += [
        {"type": "tool_result", "tool_use_id": f"toolu_edit{k}", "content": SIBLING, "is_error": True}
        for k in range(1, parallel)
    ]
    read = {"type": "tool_use", "id": "toolu_read", "name": "Read", "input": {"file_path": FILE}}
    return [
        {"role": "user", "content": "make every test parallel"},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Adding t.Parallel()."}, *map(_edit, range(parallel))],
        },
        {"role": "user", "content": results},
        {"role": "assistant", "content": [read]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_read", "content": "package cmd\n"}],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "The file changed; re-reading first."}]},
    ]


def test_nine_cancelled_edits_change_nothing() -> None:
    t = anthropic_messages.parse_request({"messages": cancelled_step()})
    e = epochs(t.calls, EffectRule(), FailureRule())
    assert (e.before, e.after) == ((0,) * 11, (0,) * 10 + (0,))


def _actions(messages: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
    cfg = build(Config, default_config())
    guards = build_guards(cfg.guards, *progress_rules(cfg.progress))
    t = anthropic_messages.parse_request({"messages": messages})
    return [(a.rule, a.kind, a.count) for a in evaluate(t, guards, Context())]


@pytest.mark.parametrize("upto", [3, 5])
def test_the_default_guards_see_one_failure_not_ten(upto: int) -> None:
    assert _actions(cancelled_step()[:upto]) == []


def test_a_real_run_of_failures_still_reminds() -> None:
    """Three Edits failing one after another (not cancelled) are still a failing run."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "make every test parallel"}]
    for k in range(3):
        messages.append({"role": "assistant", "content": [_edit(k)]})
        result = {
            "type": "tool_result",
            "tool_use_id": f"toolu_edit{k}",
            "content": MODIFIED,
            "is_error": True,
        }
        messages.append({"role": "user", "content": [result]})
    assert _actions(messages) == [("repeated_failure", "remind", 3), ("same_target", "remind", 3)]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_end_to_end_a_cancelled_step_is_left_alone(stream: bool) -> None:
    session = {
        "id": "cc-cancelled",
        "agent": "claude-code",
        "dialect": "anthropic_messages",
        "request_bodies_final": {
            "model": "claude-opus-4-6",
            "system": None,
            "tools": [{"name": "Edit", "input_schema": {}}, {"name": "Read", "input_schema": {}}],
            "messages": cancelled_step(),
        },
        "compaction_segments": [],
    }
    [done] = asyncio.run(replay_sessions([session], stream))
    [r] = done.replays
    assert (done.calls, r.requests, r.internal_errors) == (11, 3, 0)
    assert (r.observations, r.reminders) == ([], [])
