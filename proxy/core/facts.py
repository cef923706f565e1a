"""Derived facts of each tool call (DESIGN §6.5): its target and whether its result failed.

:class:`~proxy.core.transcript.ToolCall` stays the dialect's plain record; rules that compare calls by
target or count failures derive these facts with :func:`annotate`, using the configured
:class:`~proxy.core.targets.TargetRule` and :class:`~proxy.core.failures.FailureRule`. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from proxy.core.failures import FailureRule
from proxy.core.targets import Target, TargetRule
from proxy.core.transcript import ToolCall


@dataclass(frozen=True, slots=True)
class CallFacts:
    """``call`` with its ``target`` (None: the call has none) and ``failed`` (True/False, or None
    when its result has not arrived or failures were not asked for)."""

    call: ToolCall
    target: Target | None
    failed: bool | None


def annotate(
    calls: Iterable[ToolCall], targets: TargetRule, failures: FailureRule | None = None
) -> list[CallFacts]:
    """The facts of ``calls``, in order. With ``failures=None`` no result is classified (cheaper
    for rules that only need targets)."""
    return [
        CallFacts(
            call,
            targets(call.name, call.arguments),
            failures(call.result) if failures is not None else None,
        )
        for call in calls
    ]
