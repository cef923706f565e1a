"""Configuration of the response side (``stop``, ``response``): defaults and validation naming the key."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.config import Config, build, to_plain
from proxy.errors import ConfigError


def test_defaults_match_the_issue() -> None:
    plain = to_plain(Config())
    assert plain["stop"] == {
        "after_ignored_denials": 2,
        "on_cap": True,
        "message": "",
        "deliver": "answer",
        "mode": "enforce",
    }
    assert plain["response"] == {
        "max_calls_per_response": 32,
        "max_identical_per_response": 2,
        "max_identical_reads_per_response": 4,
        "degenerate_text": {"enabled": True, "min_repeats": 10, "min_chars": 200, "max_period": 500},
        "repair_text_tool_calls": True,
        "mode": "enforce",
    }


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"stop": {"after_ignored_denials": -1}}, "stop.after_ignored_denials"),
        ({"stop": {"after_ignored_denials": 1.5}}, "stop.after_ignored_denials"),
        ({"stop": {"on_cap": "yes"}}, "stop.on_cap"),
        ({"response": {"repair_text_tool_calls": "no"}}, "response.repair_text_tool_calls"),
        ({"stop": {"message": "looped on {tool} {oops}"}}, "stop.message"),
        ({"stop": {"message": "unbalanced {"}}, "stop.message"),
        ({"stop": {"after": 2}}, "stop.after"),
        ({"response": {"max_calls_per_response": -1}}, "response.max_calls_per_response"),
        ({"response": {"max_identical_per_response": -2}}, "response.max_identical_per_response"),
        ({"response": {"max_identical_per_response": "4"}}, "response.max_identical_per_response"),
        ({"response": {"max_identical_reads_per_response": -1}}, "response.max_identical_reads_per_response"),
        ({"response": {"degenerate_text": {"min_repeats": 1}}}, "response.degenerate_text.min_repeats"),
        ({"response": {"degenerate_text": {"min_chars": 0}}}, "response.degenerate_text.min_chars"),
        ({"response": {"degenerate_text": {"max_period": 0}}}, "response.degenerate_text.max_period"),
        ({"response": {"degenerate_text": {"enable": True}}}, "response.degenerate_text.enable"),
        ({"response": {"degenerate_text": True}}, "response.degenerate_text"),
    ],
)
def test_bad_values_name_the_key(data: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        build(Config, data)
    assert exc.value.key == key


@pytest.mark.parametrize(
    "data",
    [
        {"stop": {"after_ignored_denials": 0, "on_cap": False}},
        {"stop": {"message": "Stopped {tool} ({kind}): {count} calls, {denials} ignored, limit {limit}."}},
        {
            "response": {
                "max_calls_per_response": 0,
                "max_identical_per_response": 0,
                "max_identical_reads_per_response": 0,
            }
        },
        {"response": {"degenerate_text": {"enabled": False}}},
    ],
)
def test_zero_disables_and_templates_accepted(data: dict[str, Any]) -> None:
    build(Config, data)
