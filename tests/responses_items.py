"""Chat-completions messages → Responses ``input`` items, for tests that replay chat conversations
in the Responses dialect (issue 11: the same rules must act at the same call in both forms)."""

from __future__ import annotations

import json
from typing import Any


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def to_items(messages: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """(instructions, input items): the first system message becomes ``instructions``; user text
    ``input_text`` parts, assistant text an ``output_text`` message, each tool call a
    ``function_call`` item, each tool message a ``function_call_output`` item (string output)."""
    instructions: str | None = None
    items: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        text = _text(m.get("content"))
        if role in ("system", "developer"):
            if instructions is None and not items:
                instructions = text
            else:
                items.append({"type": "message", "role": role, "content": text})
        elif role == "user":
            items.append(
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
            )
        elif role == "assistant":
            if text:
                items.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": text, "annotations": []}],
                    }
                )
            for tc in m.get("tool_calls") or []:
                fn = tc.get("function", {})
                args = fn.get("arguments")
                items.append(
                    {
                        "type": "function_call",
                        "call_id": tc.get("id"),
                        "name": fn.get("name"),
                        "arguments": args if isinstance(args, str) else "",
                    }
                )
        elif role == "tool":
            items.append({"type": "function_call_output", "call_id": m.get("tool_call_id"), "output": text})
    return instructions, items


def responses_body(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """A Responses request body holding ``messages`` as items."""
    instructions, items = to_items(messages)
    body: dict[str, Any] = {"model": "m", **extra, "input": items}
    if instructions is not None:
        body["instructions"] = instructions
    return body


def _event(obj: dict[str, Any]) -> bytes:
    return f"event: {obj['type']}\ndata: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


def response_object(
    output: list[dict[str, Any]], status: str = "completed", rid: str = "resp_1"
) -> dict[str, Any]:
    """A ``response`` object as a Responses server returns it."""
    usage = (
        {"input_tokens": 100, "output_tokens": 20, "total_tokens": 120} if status != "in_progress" else None
    )
    return {
        "id": rid,
        "object": "response",
        "created_at": 1764547200,
        "status": status,
        "model": "m",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage,
    }


def function_call_item(call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {
        "id": f"fc_{call_id}",
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def message_item(text: str, mid: str = "msg_1", status: str = "completed") -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []
    return {"id": mid, "type": "message", "status": status, "role": "assistant", "content": content}


def response_events(
    calls: list[tuple[str, str, str]], text: str | None = None, rid: str = "resp_1"
) -> list[bytes]:
    """The SSE events of one Responses answer, as a real server streams them: ``text`` (an
    assistant message, two deltas) then each ``(call_id, name, arguments)`` as a function_call
    item (arguments in two deltas), then ``response.completed`` listing every item."""
    out: list[dict[str, Any]] = [
        {"type": "response.created", "response": response_object([], "in_progress", rid)},
        {"type": "response.in_progress", "response": response_object([], "in_progress", rid)},
    ]
    items: list[dict[str, Any]] = []
    if text is not None:
        oi, mid = len(items), "msg_1"
        part = {"type": "output_text", "text": "", "annotations": []}
        half = len(text) // 2
        out += [
            {
                "type": "response.output_item.added",
                "output_index": oi,
                "item": message_item("", mid, "in_progress"),
            },
            {
                "type": "response.content_part.added",
                "item_id": mid,
                "output_index": oi,
                "content_index": 0,
                "part": part,
            },
            *(
                {
                    "type": "response.output_text.delta",
                    "item_id": mid,
                    "output_index": oi,
                    "content_index": 0,
                    "delta": d,
                    "logprobs": [],
                }
                for d in (text[:half], text[half:])
            ),
            {
                "type": "response.output_text.done",
                "item_id": mid,
                "output_index": oi,
                "content_index": 0,
                "text": text,
                "logprobs": [],
            },
            {
                "type": "response.content_part.done",
                "item_id": mid,
                "output_index": oi,
                "content_index": 0,
                "part": {**part, "text": text},
            },
            {"type": "response.output_item.done", "output_index": oi, "item": message_item(text, mid)},
        ]
        items.append(message_item(text, mid))
    for call_id, name, arguments in calls:
        oi = len(items)
        item = function_call_item(call_id, name, arguments)
        half = len(arguments) // 2
        out += [
            {
                "type": "response.output_item.added",
                "output_index": oi,
                "item": {**item, "status": "in_progress", "arguments": ""},
            },
            *(
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": item["id"],
                    "output_index": oi,
                    "delta": d,
                }
                for d in (arguments[:half], arguments[half:])
            ),
            {
                "type": "response.function_call_arguments.done",
                "item_id": item["id"],
                "output_index": oi,
                "arguments": arguments,
            },
            {"type": "response.output_item.done", "output_index": oi, "item": item},
        ]
        items.append(item)
    out.append({"type": "response.completed", "response": response_object(items, rid=rid)})
    return [_event({"type": o["type"], "sequence_number": n, **o}) for n, o in enumerate(out)]
