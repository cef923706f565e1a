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

    __slots__ = ("_by_id", "_by_index", "_tool_calls", "calls")

    def __init__(self) -> None:
        self._tool_calls = False  # the choice sent ``tool_calls``: a ``function_call`` mirrors them
        self.calls: list[AssembledCall] = []
        self._by_index: dict[int, int] = {}  # wire index -> position in calls of its newest call
        self._by_id: dict[str, int] = {}

    def add(self, delta: dict[str, Any]) -> int:
        """Apply one choice ``delta``'s ``tool_calls`` (or legacy ``function_call``, read only
        while the choice has sent no ``tool_calls``). Returns the number of calls it started."""
        started = 0
        tool_calls = delta.get("tool_calls")
        if isinstance(tool_calls, list) and tool_calls:
            self._tool_calls = True
            for tc in tool_calls:
                if isinstance(tc, dict):
                    started += self._add_one(tc)
        fc = delta.get("function_call")
        # llama-cpp-python mirrors each tool call as a legacy function_call in the same deltas: one
        # call, not two (as the JSON side reads a message: proxy.response.decide.message_calls)
        if isinstance(fc, dict) and not self._tool_calls:
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


#: Delta fields whose string fragments are concatenated (the rest: the last non-null value wins).
TEXT_FIELDS = ("content", "refusal", "reasoning_content", "reasoning")
#: Chunk fields that exist only in a stream and never go into the assembled answer (OpenAI's
#: ``obfuscation`` pads every chunk with random characters).
STREAM_ONLY = frozenset({"choices", "object", "usage", "obfuscation"})


def _join_logprobs(current: Any, new: Any) -> Any:
    """A choice's ``logprobs`` over its chunks: list members (``content``, ``refusal``) are
    concatenated, anything else keeps its first value."""
    if not isinstance(new, dict):
        return current
    if not isinstance(current, dict):
        return {k: list(v) if isinstance(v, list) else v for k, v in new.items()}
    for k, v in new.items():
        if isinstance(v, list) and isinstance(current.get(k), list):
            current[k] = current[k] + v
        elif current.get(k) is None:
            current[k] = list(v) if isinstance(v, list) else v
    return current


class _ChoiceParts:
    __slots__ = ("calls", "extra", "finish_reason", "function", "logprobs", "message", "role", "texts")

    def __init__(self) -> None:
        self.role: str | None = None
        self.texts: dict[str, list[str]] = {}
        self.message: dict[str, Any] = {}  # other delta fields, in first-seen order
        self.calls = CallAssembler()
        self.function = CallAssembler()  # the legacy function_call, apart from tool_calls
        self.finish_reason: Any = None
        self.logprobs: Any = None
        self.extra: dict[str, Any] = {}  # other choice fields (vLLM's stop_reason, …)

    def add(self, part: dict[str, Any]) -> None:
        delta = part.get("delta")
        if isinstance(delta, dict):
            for key, value in delta.items():
                if key == "role":
                    if isinstance(value, str) and value and self.role is None:
                        self.role = value
                elif key == "tool_calls":
                    self.calls.add({"tool_calls": value})
                elif key == "function_call":
                    self.function.add({"function_call": value})
                elif key in TEXT_FIELDS:
                    texts = self.texts.setdefault(key, [])
                    if isinstance(value, str):
                        texts.append(value)
                elif value is not None or key not in self.message:
                    self.message[key] = value
        for key, value in part.items():
            if key in ("index", "delta"):
                continue
            if key == "finish_reason":
                self.finish_reason = value if value is not None else self.finish_reason
            elif key == "logprobs":
                self.logprobs = _join_logprobs(self.logprobs, value)
            elif value is not None or key not in self.extra:
                self.extra[key] = value

    def result(self, index: int) -> dict[str, Any]:
        calls = [_wire_call(c) for c in self.calls.calls]
        legacy = self.function.calls[0] if self.function.calls else None
        message: dict[str, Any] = {"role": self.role or "assistant"}
        content = "".join(self.texts.get("content", ()))
        has_content = bool(self.texts.get("content"))
        # a call-only answer has ``content: null`` (as a non-streamed one), even if the stream
        # sent empty content deltas
        message["content"] = content if has_content and (content or not (calls or legacy)) else None
        for key in TEXT_FIELDS[1:]:
            if key in self.texts:
                message[key] = "".join(self.texts[key]) if self.texts[key] else None
        message.update(self.message)
        if calls:
            message["tool_calls"] = calls
        if legacy is not None:
            message["function_call"] = {"name": legacy.name, "arguments": legacy.arguments_json()}
        return {
            "index": index,
            "message": message,
            "logprobs": self.logprobs,
            "finish_reason": self.finish_reason,
            **self.extra,
        }


def _wire_call(call: AssembledCall) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if call.id is not None:
        out["id"] = call.id
    out["type"] = "function"
    out["function"] = {"name": call.name, "arguments": call.arguments_json()}
    return out


class CompletionAssembler:
    """A whole ``chat.completion`` object from the chunks of a streamed one (upstream
    ``stream_json_requests``): ``id``, ``created``, ``model`` from the first chunk, other top-level
    fields (``system_fingerprint``, ``service_tier``, llama.cpp's ``timings``, …) with their last
    non-null value, ``usage`` from the chunk that carried one (omitted when none did: a server
    that ignores ``stream_options.include_usage``), and per choice (by ``index``) the message:
    ``role``, ``content`` and the reasoning/refusal texts concatenated, ``tool_calls`` assembled
    (:class:`CallAssembler`, arguments as the wire's JSON string), the legacy ``function_call``,
    any other delta field with its last value; ``finish_reason`` the last one sent; ``logprobs``
    joined. Chunk-only fields (``obfuscation``) are left out."""

    __slots__ = ("_choices", "_top", "usage")

    def __init__(self) -> None:
        self._top: dict[str, Any] = {}
        self._choices: dict[int, _ChoiceParts] = {}
        self.usage: Any = None

    def add(self, chunk: dict[str, Any]) -> None:
        """One ``chat.completion.chunk`` object (its ``choices`` a list)."""
        for key, value in chunk.items():
            if key in STREAM_ONLY:
                continue
            if key in ("id", "created", "model"):
                self._top.setdefault(key, value)
            elif value is not None or key not in self._top:
                self._top[key] = value
        if chunk.get("usage") is not None:
            self.usage = chunk["usage"]
        for part in chunk.get("choices") or ():
            if not isinstance(part, dict):
                continue
            raw = part.get("index")
            index = raw if isinstance(raw, int) and not isinstance(raw, bool) else 0
            self._choices.setdefault(index, _ChoiceParts()).add(part)

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self._top.get("id"),
            "object": "chat.completion",
            "created": self._top.get("created"),
            "model": self._top.get("model"),
        }
        out.update((k, v) for k, v in self._top.items() if k not in out)
        out["choices"] = [self._choices[i].result(i) for i in sorted(self._choices)]
        if self.usage is not None:
            out["usage"] = self.usage
        return out
