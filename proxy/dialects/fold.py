"""The parse state every dialect's ``Fold`` keeps: what :func:`proxy.core.transcript.build`
takes, gathered one history item at a time, and an independent copy of it for the prefix cache
(:mod:`proxy.request.prefix_cache`). A dialect subclasses :class:`FoldState`, adds its own
``feed`` (through :meth:`FoldState.new_step`, :meth:`~FoldState.new_call`,
:meth:`~FoldState.take` and :meth:`~FoldState.settle`) and lists its extra scalar fields in
``EXTRA`` (copied as they are).

What can no longer change is kept built and shared (copy-on-write): a call whose result has
arrived is a :class:`proxy.core.transcript.ToolCall`, a step that is not the latest and has all its
results a :class:`proxy.core.transcript.Step`, and said messages are :class:`proxy.core.transcript.Said`.
:meth:`FoldState.copy` copies only the open records (calls waiting for their result, their steps,
the latest step) and :meth:`FoldState.finish` builds only those, so a prefix-cache hit costs what
its new items cost, not what its history costs (a pointer copy of each list aside)."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from proxy.core.transcript import Said, Step, ToolCall, ToolResult, Transcript, build
from proxy.dialects import text_actions, text_calls
from proxy.errors import DialectError

_F = TypeVar("_F", bound="FoldState")


def history(body: Any, member: str) -> list[Any]:
    """The request's history list, ``body[member]``. Raises :class:`DialectError` when ``body``
    is not an object or that member is not a list."""
    if not isinstance(body, dict):
        raise DialectError("body is not a JSON object")
    items = body.get(member)
    if not isinstance(items, list):
        raise DialectError(f"{member} is not a list")
    return items


class FoldState:
    """``calls``: per seq, a built :class:`~proxy.core.transcript.ToolCall` once its result arrived,
    else a dict of its fields (open). ``steps``: per index, a built
    :class:`~proxy.core.transcript.Step` once it is not the latest and all its calls have results, else
    a dict with ``index``, ``position``, ``calls`` (a list), ``end`` and the dialect's own keys.
    ``users`` and ``texts`` (positions), ``said``, ``pending`` (call id → seqs of calls waiting
    for their result; no empty queues), ``turn``, ``last_kind`` (``"step"`` while the history ends
    with a step and its results); ``tools``: the request's offered tools. ``candidate``: the
    latest assistant message's fenced action (its position and the action) while no other message
    followed it; ``shapes``: the result shapes of the fenced actions read so far
    (:mod:`proxy.dialects.text_actions`); ``broken``: a message ending in a fenced block was
    answered by anything but a result in that shape (a person's follow-up to a code sample: no
    harness runs these, and no fenced block is read as an action any more)."""

    __slots__ = (
        "broken",
        "calls",
        "candidate",
        "last_kind",
        "pending",
        "said",
        "shapes",
        "steps",
        "texts",
        "tools",
        "turn",
        "users",
    )

    #: a subclass's own scalar fields, copied by :meth:`copy` as they are
    EXTRA: ClassVar[tuple[str, ...]] = ()

    def __init__(self, tools: Mapping[str, Any] | None = None) -> None:
        self.tools = tools
        self.calls: list[Any] = []
        self.steps: list[Any] = []
        self.users: list[int] = []
        self.texts: list[int] = []
        self.said: list[Said] = []
        self.pending: dict[str | None, deque[int]] = {}
        self.turn = 0
        self.last_kind = ""
        self.candidate: tuple[int, text_actions.TextAction] | None = None
        self.shapes: frozenset[str] = frozenset()
        self.broken = False

    # --- what a dialect's feed calls ---------------------------------------------------------

    def new_step(self, position: int, **extra: Any) -> dict[str, Any]:
        """Start a step at message ``position`` (``extra``: the dialect's own keys, such as
        ``text``); the step before it is built when all its calls have results."""
        steps = self.steps
        if steps:
            self._freeze_step(len(steps) - 1)
        step = {"index": len(steps), "position": position, "calls": [], "end": None, **extra}
        steps.append(step)
        return step

    def new_call(self, call_id: str | None, name: str, raw: Any, arguments: Any, position: int) -> int:
        """Add a call of the latest step (made at message ``position``), waiting for its result;
        returns its seq."""
        step = self.steps[-1]
        seq = len(self.calls)
        self.calls.append(
            {
                "seq": seq,
                "step": step["index"],
                "turn": self.turn,
                "position": position,
                "call_id": call_id,
                "name": name,
                "arguments_raw": raw,
                "arguments": arguments,
                "result": None,
            }
        )
        step["calls"].append(seq)
        self.pending.setdefault(call_id, deque()).append(seq)
        return seq

    def waiting(self, seq: int) -> bool:
        """True while call ``seq`` has no result."""
        return isinstance(self.calls[seq], dict)

    def take(self, call_id: str | None, seq: int | None = None) -> int | None:
        """Remove a call from the waiting ones: the first waiting with ``call_id`` (None: none
        waits), or ``seq`` itself when given (it must wait with that id)."""
        queue = self.pending.get(call_id)
        if not queue:
            return None
        if seq is None:
            seq = queue.popleft()
        else:
            queue.remove(seq)
        if not queue:
            del self.pending[call_id]
        return seq

    def user_text(self, pos: int, text: str) -> None:
        """Read a user message's ``text`` at ``pos`` (chat, Responses): right after a step of calls
        written as text, ``<tool_response>`` blocks are those calls' results (one per block, in
        order; not a user turn), and so is a smolagents ``Observation:`` after its ``Calling
        tools:`` step (all the step's calls); right after an assistant message ending in one
        fenced action, a message in a harness's result shape makes that message a step and is
        its result (:mod:`proxy.dialects.text_actions`); else it is a user turn."""
        candidate, self.candidate = self.candidate, None
        if (
            candidate is not None
            and self.last_kind == "assistant"
            and self._fenced_result(candidate, pos, text)
        ):
            return
        waiting = self._text_results_wanted() if self.last_kind == "step" else []
        smolagents = waiting and self.steps[-1].get("text") == text_actions.SMOLAGENTS
        if smolagents and text_actions.smolagents_result(text):
            for seq in waiting:
                self.take(self.calls[seq]["call_id"], seq)
                self.settle(seq, ToolResult(pos, text))
            return
        results = text_calls.tool_responses(text) if waiting and "<tool_response>" in text else None
        if results is not None:
            for part, (seq, result) in enumerate(zip(waiting, results, strict=False)):
                self.take(None, seq)
                self.settle(seq, ToolResult(pos, result, part=part))
            return
        self.turn += 1
        self.users.append(pos)
        self.said.append(Said(pos, "user", text))
        self.last_kind = "user"

    def text_action(self, pos: int, text: str) -> list[text_actions.TextAction] | None:
        """Read an assistant message without structured calls (chat): a smolagents ``Calling
        tools:`` message gives its calls (the caller makes them a step with ``text`` set to
        :data:`~proxy.dialects.text_actions.SMOLAGENTS`); one ending in a fenced action is kept
        as the :attr:`candidate` the next message may confirm (None returned)."""
        if text_actions.CALLING in text:
            found = text_actions.calling_tools(text)
            if found is not None:
                return found
        if not self.broken and ("```" in text or "~~~" in text):
            action = text_actions.fenced_action(text)
            if action is not None:
                self.candidate = (pos, action)
        return None

    def _fenced_result(self, candidate: tuple[int, text_actions.TextAction], pos: int, text: str) -> bool:
        """Make ``candidate`` (the assistant message just before) a step answered by the user
        message ``text`` at ``pos`` when it has a result shape; False (nothing changed) else."""
        shape = text_actions.action_result(text)
        at, action = candidate
        if shape is None or (self.shapes and shape not in self.shapes):
            self.broken = True
            return False
        if not self.said or self.said[-1].position != at:
            return False
        self.said[-1] = Said(at, "assistant", action.text, True)
        if not action.text and self.texts and self.texts[-1] == at:
            self.texts.pop()
        self.new_step(at, text=text_actions.FENCED)
        seq = self.new_call(None, action.name, action.arguments, action.arguments, at)
        self.take(None, seq)
        self.settle(seq, ToolResult(pos, text))
        self.shapes = self.shapes | {shape}
        self.last_kind = "step"
        return True

    def _text_results_wanted(self) -> list[int]:
        """The seqs of the latest step's calls still without a result, when it is a text step."""
        steps = self.steps
        if not steps or not steps[-1].get("text"):
            return []
        return [s for s in steps[-1]["calls"] if self.waiting(s)]

    def settle(self, seq: int, result: ToolResult) -> None:
        """Give call ``seq`` (taken from the waiting ones) its ``result``: the call is built, its
        step's ``end`` moves to the result, and the step is built when it is done."""
        call = self.calls[seq]
        call["result"] = result
        self.calls[seq] = ToolCall(**call)
        index = call["step"]
        step = self.steps[index]
        end = step["end"]
        step["end"] = result.position if end is None else max(end, result.position)
        if index != len(self.steps) - 1:
            self._freeze_step(index)

    def _freeze_step(self, index: int) -> None:
        step = self.steps[index]
        if isinstance(step, dict) and not any(self.waiting(s) for s in step["calls"]):
            self.steps[index] = Step(step["index"], step["position"], tuple(step["calls"]), step["end"])

    def _open(self) -> tuple[list[int], list[int]]:
        """The seqs of the open calls and the indexes of the open steps (the latest among them)."""
        seqs = [s for queue in self.pending.values() for s in queue]
        indexes = {self.calls[s]["step"] for s in seqs}
        if self.steps:
            indexes.add(len(self.steps) - 1)
        return seqs, [i for i in indexes if isinstance(self.steps[i], dict)]

    # --- copy and finish -----------------------------------------------------------------------

    def copy(self: _F) -> _F:
        """An independent copy (feeding either never changes the other): built records are
        shared, open ones copied."""
        out = type(self)(self.tools)
        seqs, indexes = self._open()
        out.calls = list(self.calls)
        for s in seqs:
            out.calls[s] = dict(self.calls[s])
        out.steps = list(self.steps)
        for i in indexes:
            step = self.steps[i]
            out.steps[i] = {**step, "calls": list(step["calls"])}
        out.users = list(self.users)
        out.texts = list(self.texts)
        out.said = list(self.said)
        out.pending = {k: deque(v) for k, v in self.pending.items()}
        out.turn = self.turn
        out.last_kind = self.last_kind
        out.candidate = self.candidate
        out.shapes = self.shapes
        out.broken = self.broken
        for name in self.EXTRA:
            setattr(out, name, getattr(self, name))
        return out

    def feed(self, pos: int, item: Any) -> None:
        """Read the history item at ``pos`` (each dialect's fold reads its own items)."""
        raise NotImplementedError

    def read(self, items: list[Any], tool_choice: Any = None) -> Transcript:
        """The transcript of a whole history: :meth:`feed` over every item of ``items``, then
        :meth:`finish`. Raises what ``feed`` raises."""
        for pos, item in enumerate(items):
            self.feed(pos, item)
        return self.finish(len(items), tool_choice)

    def finish(self, count: int, tool_choice: Any = None) -> Transcript:
        """The transcript of the ``count`` items fed; ``tool_choice``: the request's. Built
        records are used as they are; open ones are built for it (and stay open here)."""
        seqs, indexes = self._open()
        calls = list(self.calls)
        for s in seqs:
            calls[s] = ToolCall(**calls[s])
        steps = list(self.steps)
        for i in indexes:
            s = steps[i]
            steps[i] = Step(s["index"], s["position"], tuple(s["calls"]), s["end"])
        newest = len(steps) - 1 if steps and self.last_kind == "step" else None
        return build(
            calls,
            steps,
            self.users,
            self.texts,
            count,
            newest,
            self.said,
            self.tools,
            tool_choice,
            frozenset() if self.broken else self.shapes,
        )
