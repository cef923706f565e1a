"""The parse state every dialect's ``Fold`` keeps (issue 15): what :func:`proxy.transcript.build`
takes, gathered one history item at a time, and an independent copy of it for the prefix cache
(:mod:`proxy.request.prefix_cache`). A dialect subclasses :class:`FoldState`, adds its own
``feed`` and lists its extra scalar fields in ``EXTRA`` (copied as they are)."""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from proxy.transcript import Said, Transcript, build

_F = TypeVar("_F", bound="FoldState")


class FoldState:
    """``calls`` (:class:`proxy.transcript.ToolCall` fields), ``steps`` (dicts with ``index``,
    ``position``, ``calls``, ``end``), ``users`` and ``texts`` (positions), ``said``, ``pending``
    (call id → seqs of calls waiting for their result), ``turn``, ``last_kind`` (``"step"`` while
    the history ends with a step and its results); ``tools``: the request's offered tools."""

    __slots__ = ("calls", "last_kind", "pending", "said", "steps", "texts", "tools", "turn", "users")

    #: a subclass's own scalar fields, copied by :meth:`copy` as they are
    EXTRA: ClassVar[tuple[str, ...]] = ()

    def __init__(self, tools: Mapping[str, Any] | None = None) -> None:
        self.tools = tools
        self.calls: list[dict[str, Any]] = []
        self.steps: list[dict[str, Any]] = []
        self.users: list[int] = []
        self.texts: list[int] = []
        self.said: list[Said] = []
        self.pending: dict[str | None, deque[int]] = defaultdict(deque)
        self.turn = 0
        self.last_kind = ""

    def copy(self: _F) -> _F:
        """An independent copy (feeding either never changes the other)."""
        out = type(self)(self.tools)
        out.calls = [dict(c) for c in self.calls]
        out.steps = [{**s, "calls": list(s["calls"])} for s in self.steps]
        out.users = list(self.users)
        out.texts = list(self.texts)
        out.said = list(self.said)
        out.pending = defaultdict(deque, {k: deque(v) for k, v in self.pending.items()})
        out.turn = self.turn
        out.last_kind = self.last_kind
        for name in self.EXTRA:
            setattr(out, name, getattr(self, name))
        return out

    def finish(self, count: int, tool_choice: Any = None) -> Transcript:
        """The transcript of the ``count`` items fed; ``tool_choice``: the request's."""
        return build(
            self.calls,
            self.steps,
            self.users,
            self.texts,
            count,
            self.last_kind == "step",
            self.said,
            self.tools,
            tool_choice,
        )
