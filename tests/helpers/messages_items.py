"""Anthropic Messages answers for tests: a ``message`` object and its SSE events, as the
Messages API streams them (``event:`` lines, ``ping`` between blocks, the first ``input_json_delta``
empty, ``message_delta`` with ``usage.output_tokens``)."""

from __future__ import annotations

import json
from typing import Any

#: (id, name, input JSON) of a ``tool_use`` block
Call = tuple[str, str, str]


def event(obj: dict[str, Any]) -> bytes:
    """One SSE frame: ``event: <type>`` and the compact JSON ``data``."""
    return f"event: {obj['type']}\ndata: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


def message(
    content: list[dict[str, Any]], stop_reason: str = "tool_use", mid: str = "msg_01"
) -> dict[str, Any]:
    """A ``message`` object as a Messages server returns it."""
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 120, "output_tokens": 87},
    }


def _pieces(s: str) -> list[str]:
    half = len(s) // 2
    return ["", s[:half], s[half:]] if s else [""]


def tool_use_events(index: int, call: Call) -> list[bytes]:
    """One ``tool_use`` block at ``index``: its start (``input: {}``), ``partial_json`` ``""`` then
    the input in two halves, its stop."""
    cid, name, args = call
    block = {"type": "tool_use", "id": cid, "name": name, "input": {}}
    out = [event({"type": "content_block_start", "index": index, "content_block": block})]
    for piece in _pieces(args):
        delta = {"type": "input_json_delta", "partial_json": piece}
        out.append(event({"type": "content_block_delta", "index": index, "delta": delta}))
    out.append(event({"type": "content_block_stop", "index": index}))
    return out


def message_events(
    calls: list[Call],
    text: str | None = None,
    thinking: str | None = None,
    pings: bool = True,
    stop_reason: str | None = None,
) -> list[bytes]:
    """The events of one streamed answer: ``message_start``, a ``thinking`` block (two
    ``thinking_delta`` and a ``signature_delta``) when ``thinking``, a ``ping``, a ``text`` block
    (two ``text_delta``) when ``text``, one ``tool_use`` block per call (``partial_json``: ``""``
    then the input in two halves; a ``ping`` after each), ``message_delta``, ``message_stop``."""
    start = message([], stop_reason="")
    start["stop_reason"] = None
    start["usage"] = {"input_tokens": 120, "output_tokens": 1}
    out = [event({"type": "message_start", "message": start})]
    index = 0
    if thinking is not None:
        out.append(
            event(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "thinking", "thinking": "", "signature": ""},
                }
            )
        )
        half = len(thinking) // 2
        for piece in (thinking[:half], thinking[half:]):
            delta = {"type": "thinking_delta", "thinking": piece}
            out.append(event({"type": "content_block_delta", "index": index, "delta": delta}))
        delta = {"type": "signature_delta", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl"}
        out.append(event({"type": "content_block_delta", "index": index, "delta": delta}))
        out.append(event({"type": "content_block_stop", "index": index}))
        index += 1
    if pings:
        out.append(event({"type": "ping"}))
    if text is not None:
        block = {"type": "text", "text": ""}
        out.append(event({"type": "content_block_start", "index": index, "content_block": block}))
        half = len(text) // 2
        for piece in (text[:half], text[half:]):
            delta = {"type": "text_delta", "text": piece}
            out.append(event({"type": "content_block_delta", "index": index, "delta": delta}))
        out.append(event({"type": "content_block_stop", "index": index}))
        index += 1
    for call in calls:
        out += tool_use_events(index, call)
        if pings:
            out.append(event({"type": "ping"}))
        index += 1
    reason = stop_reason or ("tool_use" if calls else "end_turn")
    out.append(
        event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": None},
                "usage": {"output_tokens": 87},
            }
        )
    )
    out.append(event({"type": "message_stop"}))
    return out
