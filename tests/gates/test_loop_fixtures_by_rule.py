"""The loop rules (recurrence, cycles, repeated_failure, monologue, echo_loop; DESIGN §6.5) on the
loop fixtures (tests/fixtures/loops), request side, rule by rule: the first call each rule acts at,
pinned. Legit fixtures get nothing from these rules; the corpus gate (tests/gates/test_corpus_gate.py)
checks the whole proxy end to end."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from proxy.config import Config
from proxy.dialects import openai_chat
from proxy.guards import build_guards
from tests.helpers.rule_helpers import call_at

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "loops"
RULES = ("recurrence", "cycles", "repeated_failure", "monologue", "echo_loop")

#: fixture id -> {(rule, kind): first call acted at}
EXPECTED: dict[str, dict[tuple[str, str], int]] = {
    "F2": {},
    "F3": {},
    "F5": {},
    "F7": {},
    "T1": {("recurrence", "remind"): 4},
    "T3": {("echo_loop", "remind"): 5},
    "T4": {("repeated_failure", "remind"): 6},
    "T7": {("recurrence", "remind"): 6, ("cycles", "remind"): 7, ("cycles", "withhold"): 9},
    "T10": {
        ("recurrence", "remind"): 5,
        ("cycles", "remind"): 6,
        ("repeated_failure", "remind"): 6,
        ("cycles", "withhold"): 8,
    },
    "T12": {("repeated_failure", "remind"): 3},
    "T16": {},
    "T20": {},
    # call 2 got a different error than call 1 ("already used and failed"); call 3 repeats call 2
    "T22": {("repeated_failure", "remind"): 3},
    "T25": {("repeated_failure", "remind"): 4},
}


@pytest.mark.parametrize("fid", sorted(EXPECTED))
def test_first_action_per_rule(fid: str) -> None:
    fixture = orjson.loads((FIXTURES / f"{fid}.json").read_bytes())
    transcript = openai_chat.parse_request({"messages": fixture["messages"]})
    first: dict[tuple[str, str], int] = {}
    for guard in build_guards(Config().guards):
        if getattr(guard, "name", "") not in RULES:
            continue
        for action in guard(transcript, None):
            key = (action.rule, action.kind)
            first[key] = min(first.get(key, 10**9), call_at(transcript, action))
    assert first == EXPECTED[fid]
    if fixture["kind"] == "loop" and first:
        assert min(first.values()) <= fixture["expect"]["intervene_by_call"]
