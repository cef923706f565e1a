"""Dialect-neutral view of a conversation: its tool calls, their results, steps and turns.

Positions are indexes into the request's message list (0-based). A *step* is one assistant message
with tool calls plus their results; a *turn* is the run of messages after a user message (turn 0 is
everything before the first user message). Built by a dialect (``proxy.dialects``), read by guards.
Plain frozen data: no I/O, no methods that mutate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The result of one tool call.

    ``position``: message index of the tool message. ``text``: its content as text (a string, the
    text parts of an array joined by newlines, ``""`` for null). ``is_error``: the protocol's error
    flag where the dialect has one, else None. ``pending``: a placeholder for a result that has not
    arrived (the response side's look-ahead, :func:`proxy.response.decide.with_pending_step`); progress-aware
    rules judge such a call by the previous pair (:mod:`proxy.core.progress`).
    """

    position: int
    text: str
    is_error: bool | None = None
    pending: bool = False
    #: a text call's result in a user message: the index of its ``<tool_response>`` block there
    part: int | None = None


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call, in conversation order.

    ``seq``: 0-based order among all calls of the conversation. ``step``: index into
    :attr:`Transcript.steps`. ``turn``: number of user messages before the call. ``position``:
    message index of the assistant message that made it. ``arguments_raw``: the wire value (usually a
    JSON string); ``arguments``: its decoded form or ``proxy.core.canonical.INVALID``.
    """

    seq: int
    step: int
    turn: int
    position: int
    call_id: str | None
    name: str
    arguments_raw: Any
    arguments: Any
    result: ToolResult | None = None


@dataclass(frozen=True, slots=True)
class Step:
    """One assistant message with tool calls and their results.

    ``calls``: the ``seq`` numbers of its calls, in listed order. ``end``: position of the last of its
    tool results (the place a reminder goes after), or None when no result has arrived yet.
    """

    index: int
    position: int
    calls: tuple[int, ...]
    end: int | None


@dataclass(frozen=True, slots=True)
class Said:
    """One user or assistant message, for rules that read what was said (monologue).

    ``position``: its message index. ``role``: ``"user"`` or ``"assistant"``. ``text``: its content
    as text. ``has_calls``: an assistant message that also made tool calls (its step follows).
    """

    position: int
    role: str
    text: str
    has_calls: bool = False


@dataclass(frozen=True, slots=True)
class Transcript:
    """Everything the guards read about one request.

    ``newest_step``: index of the step this request answers (the last step, when nothing but its
    tool results follows it), else None. Actions on that step are *fresh* (DESIGN §2).
    """

    calls: tuple[ToolCall, ...]
    steps: tuple[Step, ...]
    user_positions: tuple[int, ...]
    assistant_text_positions: tuple[int, ...]
    message_count: int
    newest_step: int | None
    #: user and assistant messages in order (text as said); empty when the dialect does not say
    said: tuple[Said, ...] = ()
    #: the tools the request offered, name -> parameters JSON schema (None: it offered none), for
    #: reading calls written as text (:mod:`proxy.dialects.text_calls`)
    tools: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)
    #: the request's ``tool_choice`` as sent (None: absent), for the repair of calls written as
    #: text in the answer (:mod:`proxy.response.repair`)
    tool_choice: Any = field(default=None, compare=False, hash=False)
    #: the result shapes of the fenced text actions the history shows a harness executing
    #: (:mod:`proxy.dialects.text_actions`; empty: none), for reading the answer's action
    action_shapes: frozenset[str] = field(default=frozenset(), compare=False, hash=False)

    def is_fresh(self, step: int) -> bool:
        """True when actions on ``step`` are new decisions rather than re-derived ones."""
        return self.newest_step is not None and step == self.newest_step


def build(
    calls: Sequence[ToolCall],
    steps: Sequence[Step],
    users: Sequence[int],
    texts: Sequence[int],
    message_count: int,
    newest_step: int | None,
    said: Sequence[Said],
    tools: Mapping[str, Any] | None = None,
    tool_choice: Any = None,
    action_shapes: frozenset[str] = frozenset(),
) -> Transcript:
    """A :class:`Transcript` from a dialect's parse state (:class:`proxy.dialects.fold.FoldState`):
    its built calls and steps, in order, shared rather than copied (they are frozen)."""
    return Transcript(
        calls=tuple(calls),
        steps=tuple(steps),
        user_positions=tuple(users),
        assistant_text_positions=tuple(texts),
        message_count=message_count,
        newest_step=newest_step,
        said=tuple(said),
        tools=tools,
        tool_choice=tool_choice,
        action_shapes=action_shapes,
    )
