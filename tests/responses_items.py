"""Chat-completions messages → Responses ``input`` items, for tests that replay chat conversations
in the Responses dialect (issue 11: the same rules must act at the same call in both forms)."""

from __future__ import annotations

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
