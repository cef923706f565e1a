"""The stop check asks only guards that can withhold; a guard marked ``withholds = False`` must
really never withhold (checked over every loop fixture, where the guards fire most)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.config import Config
from proxy.core.actions import Withhold
from proxy.dialects.openai_chat import parse_request
from proxy.guards import Context, build_guards
from proxy.response.decide import StopJudge

FIXTURES = sorted((Path(__file__).resolve().parents[2] / "fixtures" / "loops").glob("*.json"))
GUARDS = build_guards(Config().guards)


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_reminder_only_guards_never_withhold(path: Path) -> None:
    messages = json.loads(path.read_text())["messages"]
    transcript = parse_request({"messages": messages})
    for guard in GUARDS:
        if getattr(guard, "withholds", True):
            continue
        assert not [a for a in guard(transcript, Context()) if isinstance(a, Withhold)], guard.name


def test_stop_judge_asks_exactly_the_withholding_guards() -> None:
    transcript = parse_request({"messages": [{"role": "user", "content": "hi"}]})
    judge = StopJudge(transcript, (), GUARDS, Context(), Config())
    assert [g.name for g in judge._guards] == ["circuit_breaker", "cycles", "escalation"]
