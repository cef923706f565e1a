"""The response side of the config (DESIGN §6.4): ``stop`` (ending the agent's turn) and
``response`` (runaway answers, degenerate text, calls written as text). The guards only change
what the model reads; these act on what the agent receives.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated, Literal

from proxy.config import checks
from proxy.config.fields import SECTION, Bool, Bound, Int, Mode, Str
from proxy.errors import ConfigError

#: The placeholders a ``stop.message`` template may use.
STOP_PLACEHOLDERS = ("tool", "count", "limit", "kind", "denials")


@dataclass(frozen=True)
class StopConfig:
    """End the agent's turn (:mod:`proxy.response.decide`): the model's answer is replaced by a
    final assistant message with no tool calls that tells the user which tool looped. A user
    message starts a new turn, so the user can always continue."""

    __pydantic_config__ = SECTION

    after_ignored_denials: Annotated[Int, Bound(ge=0, note="0 = off")] = 2
    """Stop when the answer has a call the guards would deny and the turn already has this many
    withheld results. 0 = off."""
    on_cap: Bool = True
    """Also stop when a call would pass guards.circuit_breaker.max_calls_per_agent (the volume cap)
    or its waste cap (waste_window, waste_limit)."""
    message: Str = ""
    """The text, a template with {tool}, {count}, {limit}, {kind} (denials | cap | waste | monologue |
    escalation), {denials}; "" = the built-in text for each kind."""
    deliver: Literal["answer", "error"] = "answer"
    """answer: the stop is the model's final answer (the agent ends its turn as when the model is
    done and exits 0). error: the stop is the upstream API's own error, HTTP 400 with the
    wire's invalid_request_error body and code loop_detected (Gemini: INVALID_ARGUMENT, reason
    LOOP_DETECTED), so an unattended agent exits non-zero; a stream that could be stopped is
    held until its answer is decided."""
    mode: Mode = "enforce"
    """enforce | observe: every stop (denials, cap, waste, monologue, escalation)."""

    def check(self, path: str) -> Iterator[ConfigError]:
        yield from checks.template(self.message, STOP_PLACEHOLDERS, f"{path}.message")


@dataclass(frozen=True)
class DegenerateTextConfig:
    """Streamed content or reasoning whose tail is one span repeated
    (:mod:`proxy.response.degenerate`): at least ``min_repeats`` copies of a span of
    1..``max_period`` characters covering at least ``min_chars`` characters; fenced or indented
    code and table rows are not looked at. The answer is cut there."""

    __pydantic_config__ = SECTION

    enabled: Bool = True
    """false = never cut degenerate text."""
    min_repeats: Annotated[Int, Bound(ge=2)] = 10
    """Copies of the span at least."""
    min_chars: Annotated[Int, Bound(ge=1)] = 200
    """Characters the copies cover at least."""
    max_period: Annotated[Int, Bound(ge=1)] = 500
    """Longest span, in characters."""


@dataclass(frozen=True)
class ResponseConfig:
    """Runaway answers and degenerate text, and tool calls written as text. 0 disables a limit.
    With ``repair_text_tool_calls``, a chat answer to a request that offered tools, with no
    structured calls, whose content holds complete call blocks naming offered tools
    (:mod:`proxy.dialects.text_calls`), is rewritten into structured tool_calls
    (:mod:`proxy.response.repair`)."""

    __pydantic_config__ = SECTION

    max_calls_per_response: Annotated[Int, Bound(ge=0, note="0 = no limit")] = 32
    """An answer with more tool calls is cut to the first ones and the upstream request closed."""
    max_identical_per_response: Annotated[Int, Bound(ge=0, note="0 = no limit")] = 2
    """An answer with more identical calls that may change state is cut before the first over it."""
    max_identical_reads_per_response: Annotated[Int, Bound(ge=0, note="0 = no limit")] = 4
    """An answer with more identical read-only calls is cut before the first over it."""
    degenerate_text: DegenerateTextConfig = field(default_factory=DegenerateTextConfig)
    """Cut an answer whose streamed text ends in one span repeated."""
    repair_text_tool_calls: Bool = True
    """Rewrite tool calls a server sent as text into structured tool_calls; false = answers pass
    as they came, byte for byte."""
    mode: Mode = "enforce"
    """enforce | observe: everything in this section."""
