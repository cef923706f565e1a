"""Assemble streamed tool-call deltas into calls, one :class:`CallAssembler` per choice.

OpenAI streams a call as ``{"index": i, "id": …, "type": "function", "function": {"name": …,
"arguments": ""}}`` followed by ``{"index": i, "function": {"arguments": "<fragment>"}}`` deltas.
Real servers differ; every variant below assembles into the same calls:

- ``id``/``name`` only in the first delta (OpenAI, vLLM), or the whole call in one delta
  (llama.cpp, Ollama).
- ``index`` missing: a delta with a new ``id`` starts a call, one with a known ``id`` continues it,
  one without ``id`` continues the newest call.
- Every parallel call with ``index 0`` but its own ``id`` (Ollama): a different ``id`` at an index
  that already has a call starts a new call; the ``id`` repeated on every fragment (old SGLang)
  continues the same one.
- The name repeated in every delta (old llama.cpp): a repeat of the name so far is ignored (never
  ``readreadread``); a name that extends the one so far replaces it; any other non-empty name is a
  fragment and is appended. ``name: ""`` in later fragments (LM Studio) is ignored.
- ``arguments`` as a JSON object instead of a string: kept as the object (a later object replaces
  it). Absent or ``""`` arguments (no-parameter tools) stay ``""`` (canonically ``{}``).
- The legacy ``function_call`` delta (``{"name", "arguments"}``) is one call without an id.

Plain data in, plain data out; no I/O. Servers are assumed to stream calls one after another
(none is known to interleave fragments of parallel calls), so a call is complete when the next
one starts or the choice finishes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(slots=True)
class AssembledCall:
    """One call as assembled so far. ``arguments``: the concatenated string fragments, or the
    object when the server sent one."""

    id: str | None = None
    name: str = ""
    arguments: Any = ""
    index: int | None = None

    def arguments_json(self) -> str:
        """``arguments`` as the wire's JSON string (an object is serialized compactly)."""
        if isinstance(self.arguments, str):
            return self.arguments
        return orjson.dumps(self.arguments).decode()


def _merge_name(current: str, new: Any) -> str:
    if not isinstance(new, str) or not new or new == current:
        return current
    if not current or new.startswith(current):
        return new
    return current + new


def _merge_arguments(current: Any, new: Any) -> Any:
    if new is None:
        return current
    if isinstance(new, str):
        if not isinstance(current, str):
            return new or current  # an object already came: keep it unless replaced
        return current + new
    return new  # an object (or another JSON value) sent whole


class CallAssembler:
    """The tool calls of one choice, from its deltas in stream order."""

    __slots__ = ("_by_id", "_by_index", "calls")

    def __init__(self) -> None:
        self.calls: list[AssembledCall] = []
        self._by_index: dict[int, int] = {}  # wire index -> position in calls of its newest call
        self._by_id: dict[str, int] = {}

    def add(self, delta: dict[str, Any]) -> int:
        """Apply one choice ``delta``'s ``tool_calls`` (or legacy ``function_call``). Returns the
        number of calls it started."""
        started = 0
        tool_calls = delta.get("tool_calls")
        if isinstance(tool_calls, list):
            for tc in tool_calls:
                if isinstance(tc, dict):
                    started += self._add_one(tc)
        fc = delta.get("function_call")
        if isinstance(fc, dict):
            started += self._add_one({"index": -1, "function": fc})
        return started

    def _add_one(self, tc: dict[str, Any]) -> int:
        raw_index = tc.get("index")
        index = raw_index if isinstance(raw_index, int) and not isinstance(raw_index, bool) else None
        raw_id = tc.get("id")
        cid = raw_id if isinstance(raw_id, str) and raw_id else None
        pos: int | None
        if index is None and cid is not None:
            pos = self._by_id.get(cid)
        elif index is None:
            pos = len(self.calls) - 1 if self.calls else None
        else:
            pos = self._by_index.get(index)
            if pos is not None and cid is not None:
                known = self.calls[pos].id
                if known is not None and known != cid:
                    pos = self._by_id.get(cid)  # Ollama: index 0 again, a new id
        started = 0
        if pos is None:
            pos = len(self.calls)
            self.calls.append(AssembledCall(id=cid, index=index))
            started = 1
        call = self.calls[pos]
        if index is not None:
            self._by_index[index] = pos
        if cid is not None:
            if call.id is None:
                call.id = cid
            self._by_id.setdefault(cid, pos)
        fn = tc.get("function")
        if isinstance(fn, dict):
            call.name = _merge_name(call.name, fn.get("name"))
            call.arguments = _merge_arguments(call.arguments, fn.get("arguments"))
        return started
