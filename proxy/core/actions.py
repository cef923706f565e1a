"""What guards decide (DESIGN §2): plain frozen records with the rule that fired and its evidence.

- :class:`Remind` inserts a reminder after the tool results of a step (``after`` = message index
  of the step's last tool result); ``delivery`` is ``"user"`` (a new user message) or
  ``"tool_suffix"`` (appended to that tool result); ``call`` is the ``seq`` of the call it is
  about (None for reminders about text or time), read by the escalation ladder.
- :class:`Withhold` replaces the content of the tool result at message index ``position`` (only
  the text inside its ``part``-th ``<tool_response>`` block when ``part`` is set);
  ``reason`` names the kind of denial where a rule has several (circuit_breaker: ``"duplicate"``,
  ``"waste"`` or ``"cap"``), for stats and the incident log.
- :class:`Stop` (response side) ends the agent's turn; ``reason`` is ``"denials"`` (a call the
  guards would deny after ignored denials), ``"cap"`` (the volume cap), ``"waste"`` (the waste
  cap), ``"monologue"`` or ``"escalation"`` (a call the escalation ladder withholds again).
- :class:`Cut` (response side) shortens a response: ``rule`` ``"runaway"`` (``reason`` ``"calls"``
  or ``"identical"``) or ``"degenerate_text"`` (``reason`` ``"content"`` or ``"reasoning"``);
  ``applied`` is False when it was only reported (degenerate text in a non-streaming response).

- :class:`Fold` (request side, ``recovery.collapse``) removes the steps of a run of identical
  call/result pairs but its first from the body the upstream sees (positions ``start`` through
  ``stop``) and puts a note after the first (``after``, delivered like a reminder); rule
  ``"collapse"``, ``count`` the steps of the run, ``limit`` ``min_repeats``
  (:mod:`proxy.core.collapse`).

- :class:`Repair` (response side) rewrote tool calls the model wrote as text into structured
  calls (``response.repair_text_tool_calls``).
- :class:`Recover` (edge) asked the upstream again, or a second upstream, for an answer that
  repeated a withheld call (``recovery.resample``, ``recovery.fallback``).

``fresh`` is True when the action concerns the newest step of the request; only fresh actions are
logged, counted and written to the incident log (older ones are re-derived re-injections).

``observed`` is True for an action of a rule in observe mode
(:meth:`proxy.config.Config.observed_rules`): decided, logged, counted and recorded like any
other, but not applied (:func:`mark_observed`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import ClassVar, Literal

Delivery = Literal["user", "tool_suffix"]


@dataclass(frozen=True, slots=True)
class Remind:
    after: int
    text: str
    rule: str
    tool: str
    count: int
    limit: int | None
    fresh: bool
    delivery: Delivery = "user"
    call: int | None = None
    observed: bool = False
    kind: ClassVar[str] = "remind"


@dataclass(frozen=True, slots=True)
class Withhold:
    position: int
    call_id: str | None
    text: str
    rule: str
    tool: str
    count: int
    limit: int | None
    fresh: bool
    reason: str = ""
    #: the result is the ``part``-th ``<tool_response>`` block of that (user) message, a text
    #: call's result (:mod:`proxy.dialects.text_calls`); None: the whole message content
    part: int | None = None
    observed: bool = False
    kind: ClassVar[str] = "withhold"


@dataclass(frozen=True, slots=True)
class Stop:
    """``count``/``limit`` are the evidence of the stop's ``reason`` (for ``denials`` the denied
    call's own count and ``stop.after_ignored_denials``); ``evidence`` names each figure it rests
    on (``withheld_in_turn``, ``ignored_reminders``, ``same_replies_in_a_row``…), so a log line
    says what was counted."""

    text: str
    rule: str
    tool: str
    count: int
    limit: int | None
    fresh: bool = True
    reason: str = ""
    observed: bool = False
    evidence: tuple[tuple[str, int | None], ...] = ()
    kind: ClassVar[str] = "stop"


@dataclass(frozen=True, slots=True)
class Repair:
    """A chat answer's tool calls written as text, rewritten into structured calls.
    ``tool``: the first call's name; ``count``: how many calls; ``reason``: the markup's form
    (``hermes``, ``xml``; ``mixed`` when both)."""

    rule: str
    tool: str
    count: int
    reason: str = ""
    limit: int | None = None
    fresh: bool = True
    observed: bool = False
    kind: ClassVar[str] = "repair"


@dataclass(frozen=True, slots=True)
class Cut:
    rule: str
    tool: str
    count: int
    limit: int | None
    reason: str = ""
    applied: bool = True
    fresh: bool = True
    observed: bool = False
    kind: ClassVar[str] = "cut"


@dataclass(frozen=True, slots=True)
class Fold:
    """A run of ``count`` identical steps folded into its first: the positions ``start`` through
    ``stop`` (the second step's first through the last step's last result) are left out of the
    upstream's body, and ``text`` (the note) goes after ``after`` (the first step's result) as a
    reminder would (``delivery``). ``steps``: the indexes of the run's first step (the one kept) and
    its last, counted from 0 over the request's steps."""

    after: int
    start: int
    stop: int
    text: str
    rule: str
    tool: str
    count: int
    limit: int | None
    fresh: bool
    delivery: Delivery = "user"
    steps: tuple[int, int] = (0, 0)
    observed: bool = False
    kind: ClassVar[str] = "fold"


@dataclass(frozen=True, slots=True)
class Recover:
    """The upstream was asked again for an answer that repeated a withheld call (edge,
    ``recovery.*``): ``rule`` ``"resample"`` or ``"fallback"``; ``tool``: the repeated call's;
    ``count``: the extra upstream calls made; ``limit``: those allowed (``resample.attempts``, 1
    for the fallback); ``reason``: the outcome, ``recovered``, ``repeated`` or ``error``."""

    rule: str
    tool: str
    count: int
    limit: int | None
    reason: str = ""
    fresh: bool = True
    observed: bool = False
    kind: ClassVar[str] = "recover"


Action = Remind | Withhold | Stop | Cut | Repair | Fold | Recover


def mark_observed(actions: Iterable[Action], observed: AbstractSet[str]) -> tuple[Action, ...]:
    """``actions`` with ``observed=True`` on each whose ``rule`` is in ``observed`` (the rules in
    observe mode), in the same order; the others unchanged (the same objects)."""
    if not observed:
        return tuple(actions)
    return tuple(dataclasses.replace(a, observed=True) if a.rule in observed else a for a in actions)


def applied(actions: Iterable[Action], observed: AbstractSet[str] | None = None) -> tuple[Action, ...]:
    """The actions that are applied: those not ``observed``. ``observed``: the observed rules
    they were decided under (:func:`mark_observed`), when known: with none, none is marked, and
    the actions are returned without a pass over them (a long history re-derives thousands)."""
    if observed is not None and not observed:
        return tuple(actions)
    return tuple(a for a in actions if not a.observed)
