"""Trust at any length: synthetic long sessions replayed through the real server with the shipped
default config, in every wire format (chat completions, Responses, Anthropic Messages, Gemini),
JSON and SSE, with every action pinned (:func:`tests.helpers.corpus.replay`).

- Many requests, one routine command each: "commit and continue" forty times, each cycle running
  ``git status --short`` (the same output every time, nothing changed in between), reading three
  files and answering the same sentence. A real user prompt is a boundary: nothing is counted
  across it, so nothing acts (the seed's cross-turn counting lives in
  ``config/profiles/dsh-circuit-breaker.yaml``, pinned below too).
- One request, a long autonomous run: 330 diverse calls (reads, edits, test runs whose output
  moves on). A cap on volume would stop it at call 301; the waste cap leaves it alone.
- One request, a runaway whose arguments drift: a search asked 90 times with the query changing
  in small ways, the same answer every time. No exact-match rule sees it; the waste cap withholds
  the result of the call that makes 80 of the last 100 bring nothing new, and the turn is stopped
  at the next call.
- An exact runaway: the same search again and again, stopped by the same calls as before the
  waste cap existed (the exact-repeat rules act first).

The sessions are built here, not copied from recorded data.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import yaml

from tests.helpers.corpus import ROOT, Observation, replay
from tests.helpers.realtraj import quiet_logs

DIALECTS = ["chat", "responses", "messages", "gemini"]
TOOLS = [
    {"type": "function", "function": {"name": name, "description": name, "parameters": {"type": "object"}}}
    for name in ("bash", "read_file", "edit_file", "web_search")
]
PROFILE = ROOT / "config" / "profiles" / "dsh-circuit-breaker.yaml"


class Session:
    """A chat-form conversation built a step at a time: one call per assistant message."""

    def __init__(self, sid: str, prompt: str) -> None:
        self.sid = sid
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
        self.calls = 0

    def call(self, name: str, arguments: dict[str, Any], result: str) -> Session:
        self.calls += 1
        cid = f"call_{self.calls}"
        fn = {"name": name, "arguments": json.dumps(arguments)}
        self.messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": cid, "type": "function", "function": fn}],
            }
        )
        self.messages.append({"role": "tool", "tool_call_id": cid, "content": result})
        return self

    def say(self, text: str) -> Session:
        self.messages.append({"role": "assistant", "content": text})
        return self

    def user(self, text: str) -> Session:
        self.messages.append({"role": "user", "content": text})
        return self

    def fixture(self) -> dict[str, Any]:
        return {"id": self.sid, "messages": self.messages, "tools": TOOLS}


def commit_and_continue(cycles: int = 40) -> Session:
    s = Session("commit-and-continue", "Implement the parser module, step by step.")
    for k in range(cycles):
        if k:
            s.user("commit and continue")
        s.call("bash", {"command": "git status --short"}, " M src/parser.py")
        for f in range(3):
            path = f"src/parser/part{k}_{f}.py"
            s.call(
                "bash", {"command": f"sed -n 1,80p {path}"}, f"def part_{k}_{f}():\n    return {k * 3 + f}\n"
            )
        s.say("Nothing new to commit yet; the tree has the same change as before.")
    return s


def autonomous(steps: int = 110) -> Session:
    s = Session("autonomous", "Port the whole test suite to pytest and make it pass.")
    for k in range(steps):
        s.call(
            "read_file",
            {"path": f"tests/test_mod{k}.py"},
            f"import unittest\nclass T{k}(unittest.TestCase): ...\n",
        )
        s.call(
            "edit_file",
            {"path": f"tests/test_mod{k}.py", "old": "unittest", "new": "pytest"},
            f"Edited tests/test_mod{k}.py",
        )
        s.call("bash", {"command": "pytest -q"}, f"{k + 1} passed, {steps - k - 1} failed")
    s.say("All tests pass under pytest.")
    return s


QUERIES = [
    "weather in shanghai",
    "weather in Shanghai",
    "shanghai weather",
    "weather shanghai today",
    "weather in  shanghai",
]


def drifting_runaway(n: int = 90) -> Session:
    s = Session("drifting-runaway", "What is the weather in Shanghai?")
    for k in range(n):
        query = f"{QUERIES[k % len(QUERIES)]}{' ' * (k // len(QUERIES))}".rstrip() + ("?" * (k // 5 % 3))
        s.call("web_search", {"query": f"{query} #{k}"}, "Shanghai: 18 °C, cloudy. Source: weather.example")
    return s


def exact_runaway(n: int = 12) -> Session:
    s = Session("exact-runaway", "What is the weather in Shanghai?")
    for _ in range(n):
        s.call(
            "web_search", {"query": "weather in shanghai"}, "Shanghai: 18 °C, cloudy. Source: weather.example"
        )
    return s


def observed(
    session: Session, dialect: str, stream: bool, config: dict[str, Any] | None = None
) -> list[Observation]:
    with quiet_logs():
        done = asyncio.run(replay(session.fixture(), config, stream, dialect, final=False))
    assert done.internal_errors == 0
    return done.observations


# --- what the shipped default does -------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_routine_command_after_every_request_is_left_alone(dialect: str, stream: bool) -> None:
    session = commit_and_continue()
    assert (session.calls, sum(m["role"] == "user" for m in session.messages)) == (160, 40)
    assert observed(session, dialect, stream) == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_long_autonomous_run_on_one_request_is_left_alone(dialect: str, stream: bool) -> None:
    session = autonomous()
    assert session.calls == 330
    assert observed(session, dialect, stream) == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_runaway_with_drifting_arguments_is_stopped_by_the_waste_cap(dialect: str, stream: bool) -> None:
    """Call 1 brings the answer, calls 2-81 nothing new: call 81's result is withheld (80 of the
    last 100), the answer with call 82 is stopped; the recorded history going on, so is every
    later one."""
    session = drifting_runaway()
    assert (
        session.calls,
        len({m["tool_calls"][0]["function"]["arguments"] for m in session.messages[1::2]}),
    ) == (
        90,
        90,
    )
    expected: list[Observation] = []
    for k in range(9):
        expected.append(Observation("withhold", 81 + k, 163 + 2 * k, "request", ("circuit_breaker",)))
        expected.append(Observation("stop", 82 + k, 163 + 2 * k, "response", ("stop",)))
    assert observed(session, dialect, stream) == expected


#: An exact runaway, before and after the waste cap alike: the exact-repeat rules act first.
EXACT = [
    Observation("remind", 3, 7, "request", ("repeat_reminder",)),
    Observation("remind", 5, 11, "request", ("repeat_reminder",)),
    Observation("withhold", 6, 13, "request", ("escalation",)),
    Observation("stop", 7, 13, "response", ("stop",)),
    Observation("withhold", 7, 15, "request", ("circuit_breaker", "escalation")),
    Observation("stop", 8, 15, "response", ("stop",)),
    Observation("withhold", 8, 17, "request", ("circuit_breaker", "escalation")),
    Observation("remind", 8, 17, "request", ("repeat_reminder",)),
    Observation("stop", 9, 17, "response", ("stop",)),
    Observation("withhold", 9, 19, "request", ("circuit_breaker", "escalation")),
    Observation("stop", 10, 19, "response", ("stop",)),
    Observation("withhold", 10, 21, "request", ("circuit_breaker", "escalation")),
    Observation("stop", 11, 21, "response", ("stop",)),
    Observation("withhold", 11, 23, "request", ("circuit_breaker", "escalation")),
    Observation("stop", 12, 23, "response", ("stop",)),
]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_an_exact_runaway_is_stopped_by_the_same_calls_as_before(dialect: str, stream: bool) -> None:
    assert observed(exact_runaway(), dialect, stream) == EXACT


# --- the seed's profile keeps its cross-turn counting ------------------------------------------------


@pytest.mark.parametrize("dialect", ["chat", "messages"])
def test_the_seed_profile_counts_the_routine_command_across_requests(dialect: str) -> None:
    """dsh-circuit-breaker (scope: conversation): ``git status --short`` of cycle k is call
    4k + 1; its 7th run among the last 200 calls is withheld, and every later one."""
    config = yaml.safe_load(PROFILE.read_text(encoding="utf-8"))
    cycles = range(6, 40)
    expected = [
        Observation("withhold", 4 * k + 1, 10 * k + 3, "request", ("circuit_breaker",)) for k in cycles
    ]
    assert observed(commit_and_continue(), dialect, False, config) == expected
