"""Chat-completions messages → Responses ``input`` items, for tests that replay chat conversations
in the Responses dialect (the same rules must act at the same call in both forms)."""

from __future__ import annotations

import json
from dataclasses import dataclass
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


# --- a whole conversation, traced: for replaying chat fixtures in the Responses dialect -----------


def _parts(content: Any, text_type: str) -> Any:
    """A chat ``content`` as Responses content: a string as is, an array of parts part by part
    (text parts as ``text_type``, ``refusal`` parts kept, images as ``input_image``; other parts
    dropped), anything else ``""``."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    out: list[dict[str, Any]] = []
    for p in content:
        if not isinstance(p, dict):
            continue
        if isinstance(p.get("text"), str):
            out.append({"type": text_type, "text": p["text"]})
        elif p.get("type") == "refusal" and isinstance(p.get("refusal"), str):
            out.append({"type": "refusal", "refusal": p["refusal"]})
        elif p.get("type") == "image_url" and text_type == "input_text":
            url = p.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            out.append({"type": "input_image", "image_url": url, "detail": "auto"})
    return out


def _arguments(raw: Any) -> Any:
    """A chat call's ``arguments`` for a ``function_call`` item: a JSON string as is, an object
    (or array) encoded, anything else (null, missing) unchanged."""
    if isinstance(raw, (dict, list)):
        return json.dumps(raw, ensure_ascii=False)
    return raw


@dataclass(frozen=True)
class TracedItems:
    """A chat conversation as Responses items (:func:`trace_items`): ``instructions`` (and the
    index of the message it came from, ``instructions_from``), every ``items`` entry, and per item
    the index of the chat message it came from (``origin``, non-decreasing)."""

    instructions: str | None
    instructions_from: int | None
    items: list[dict[str, Any]]
    origin: list[int]

    def before(self, i: int) -> list[dict[str, Any]]:
        """The items of ``messages[:i]``."""
        return [item for item, k in zip(self.items, self.origin, strict=True) if k < i]

    def of(self, i: int) -> list[dict[str, Any]]:
        """The items of ``messages[i]``."""
        return [item for item, k in zip(self.items, self.origin, strict=True) if k == i]

    def body(self, i: int, **extra: Any) -> dict[str, Any]:
        """The Responses request holding ``messages[:i]`` (``instructions`` when the system
        message it came from is among them)."""
        body: dict[str, Any] = {"model": "m", **extra, "input": self.before(i)}
        if self.instructions_from is not None and self.instructions_from < i:
            body["instructions"] = self.instructions
        return body


def trace_items(messages: list[dict[str, Any]]) -> TracedItems:
    """Every message of a chat conversation as Responses items, faithfully (what
    :func:`to_items` leaves out included), each traced to its message:

    - the first system / developer message, when nothing precedes it, is ``instructions``; a later
      one a ``message`` item of its role;
    - user content a ``message`` with ``input_text`` parts (one per text part; images
      ``input_image``);
    - an assistant message: its text (if any, or when it has no calls at all) an assistant
      ``message`` item with ``output_text`` parts, then one ``function_call`` item per call
      (``tool_calls`` or the legacy ``function_call``), arguments given as an object encoded;
    - a call without an id gets ``lg_call_<n>`` (``n``: its number in the conversation, from 1), so
      that its result can name it; a ``tool`` message is a ``function_call_output`` of the call
      the chat dialect pairs it with (its ``tool_call_id``; without one, the oldest id-less call
      still waiting, else the oldest waiting call of the latest step; a legacy ``function``
      message likewise), its content kept as a string or as ``input_text`` parts; a result
      nothing pairs with keeps its id (or none) and stays an orphan.
    """
    instructions: str | None = None
    instructions_from: int | None = None
    items: list[dict[str, Any]] = []
    origin: list[int] = []
    # waiting calls, as the chat dialect pairs them: per chat id (None for id-less) the item ids
    pending: dict[str | None, list[str]] = {}
    latest: list[tuple[str | None, str]] = []  # the latest step: (chat id, item call_id)
    n = 0

    def add(k: int, item: dict[str, Any]) -> None:
        items.append(item)
        origin.append(k)

    for k, m in enumerate(messages):
        role = m.get("role")
        content = m.get("content")
        if role in ("system", "developer"):
            if instructions_from is None and not items:
                instructions, instructions_from = _text(content), k
            else:
                add(k, {"type": "message", "role": role, "content": _parts(content, "input_text")})
        elif role == "user":
            parts = _parts(content, "input_text")
            if isinstance(parts, str):
                parts = [{"type": "input_text", "text": parts}]
            add(k, {"type": "message", "role": "user", "content": parts})
        elif role == "assistant":
            calls = [tc for tc in m.get("tool_calls") or [] if isinstance(tc, dict)]
            entries = [(tc.get("id"), tc.get("function") or {}) for tc in calls]
            if not entries and isinstance(m.get("function_call"), dict):
                entries = [(None, m["function_call"])]
            text = _parts(content, "output_text")
            if isinstance(text, str):
                text = (
                    [{"type": "output_text", "text": text, "annotations": []}] if text or not entries else []
                )
            if text:
                add(k, {"type": "message", "role": "assistant", "content": text})
            if entries:
                latest = []
            for cid, fn in entries:
                n += 1
                chat_id = cid if isinstance(cid, str) else None
                call_id = chat_id if chat_id is not None else f"lg_call_{n}"
                fn = fn if isinstance(fn, dict) else {}
                add(
                    k,
                    {
                        "type": "function_call",
                        "call_id": call_id,
                        "name": fn.get("name"),
                        "arguments": _arguments(fn.get("arguments")),
                    },
                )
                pending.setdefault(chat_id, []).append(call_id)
                latest.append((chat_id, call_id))
        elif role in ("tool", "function"):
            cid = m.get("tool_call_id") if role == "tool" else None
            chat_id = cid if isinstance(cid, str) else None
            call_id: str | None = chat_id
            queue = pending.get(chat_id)
            if queue:
                call_id = queue.pop(0)
            elif chat_id is None:  # the oldest waiting call of the latest step
                for waiting_id, item_id in latest:
                    if item_id in pending.get(waiting_id, []):
                        pending[waiting_id].remove(item_id)
                        call_id = item_id
                        break
            output = _parts(content, "input_text") if isinstance(content, list) else _text(content)
            add(k, {"type": "function_call_output", "call_id": call_id, "output": output})
        else:  # a role neither dialect reads: a message item of that role
            add(k, {"type": "message", "role": role, "content": _parts(content, "input_text")})
    return TracedItems(instructions, instructions_from, items, origin)


def message_text(item: dict[str, Any]) -> str:
    """The text of an item's ``content`` (a message) or ``output`` (a result), as the Responses
    dialect reads it: text, ``output_text``, ``input_text`` and ``refusal`` parts joined by
    newlines."""
    value = (
        item.get("output")
        if item.get("type") in ("function_call_output", "custom_tool_call_output")
        else item.get("content")
    )
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        return ""
    texts = [
        p.get("refusal") if p.get("type") == "refusal" else p.get("text")
        for p in value
        if isinstance(p, dict) and p.get("type", "text") in ("input_text", "output_text", "text", "refusal")
    ]
    return "\n".join(t for t in texts if isinstance(t, str))


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Chat ``tools`` (``{"type": "function", "function": {...}}``) as Responses function tools
    (``{"type": "function", "name", "description", "parameters"}``)."""
    if not tools:
        return tools
    out = []
    for t in tools:
        fn = t.get("function") if isinstance(t, dict) else None
        out.append({"type": "function", **fn} if isinstance(fn, dict) else t)
    return out


def _same_item(a: dict[str, Any], s: dict[str, Any]) -> bool:
    """``a`` is the sent item ``s`` with another text: the same result (``output`` replaced or
    appended to), or the same message with a text appended (never an inserted item)."""
    member = "output" if s.get("type") in ("function_call_output", "custom_tool_call_output") else "content"
    if a.get("type") != s.get("type") or a.get("role") != s.get("role"):
        return False
    if {k: v for k, v in a.items() if k != member} != {k: v for k, v in s.items() if k != member}:
        return False
    if member == "output":
        return True
    before = message_text(s)
    return bool(before) and message_text(a).startswith(before)


def back_to_messages(
    messages: list[dict[str, Any]], traced: TracedItems, i: int, arrived: dict[str, Any]
) -> list[dict[str, Any]]:
    """What reached the upstream (``arrived``, the Responses request built by
    :meth:`TracedItems.body` for ``messages[:i]``, after the proxy) read back as chat messages:
    every message whose items arrived unchanged is itself, a changed item (a result, a message
    with a text appended) its message with the item's new text as content, an item that was not
    sent (a reminder) a message of its role (user when it has none) with its text. The
    instructions give back their system message."""
    sent = traced.before(i)
    out: list[dict[str, Any]] = []
    done: set[int] = set()
    given = traced.instructions_from
    if given is not None and given < i and arrived.get("instructions") == traced.instructions:
        out.append(messages[given])
        done.add(given)
    j = 0
    for a in arrived.get("input") or []:
        if not isinstance(a, dict):
            continue
        if j < len(sent) and (a == sent[j] or _same_item(a, sent[j])):
            k = traced.origin[j]
            if a != sent[j]:
                out.append({**messages[k], "content": message_text(a)})
            elif k not in done:
                out.append(messages[k])
            done.add(k)
            j += 1
        else:
            out.append({"role": a.get("role") or "user", "content": message_text(a)})
    return out


def answer_output(items: list[dict[str, Any]]) -> tuple[list[tuple[str, str, str]], str | None]:
    """The answer an upstream gives for one assistant message's items (from :func:`trace_items`):
    its calls ``(call_id, name, arguments)`` and its text (None without a message item), as
    :func:`response_events` takes them."""
    calls: list[tuple[str, str, str]] = []
    text: str | None = None
    for item in items:
        if item.get("type") == "function_call":
            args = item.get("arguments")
            calls.append(
                (str(item.get("call_id")), str(item.get("name") or ""), args if isinstance(args, str) else "")
            )
        elif item.get("type") == "message":
            text = message_text(item) if text is None else f"{text}\n{message_text(item)}"
    return calls, text


def answer_object(items: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``response`` object (JSON) an upstream gives for one assistant message's items."""
    calls, text = answer_output(items)
    output = [message_item(text)] if text is not None else []
    output += [function_call_item(*c) for c in calls]
    return response_object(output)


def received_output(raw: bytes, stream: bool) -> tuple[list[str | None], str]:
    """The call ids (in order) and the text the agent received in one Responses answer: JSON, the
    ``output``'s function_call items and its ``output_text``; SSE, the function_call items of the
    ``response.output_item.done`` events (what an agent runs) and the ``output_text`` deltas.
    Raises ``AssertionError`` when an SSE answer's ``response.completed`` lists other calls than
    the events gave."""
    if not stream:
        output = json.loads(raw).get("output") or []
        ids = [o.get("call_id") for o in output if isinstance(o, dict) and o.get("type") == "function_call"]
        texts = [message_text(o) for o in output if isinstance(o, dict) and o.get("type") == "message"]
        return ids, "".join(texts)
    ids = []
    text: list[str] = []
    listed: list[str | None] | None = None
    for frame in raw.split(b"\n\n"):
        data = [line[5:].strip() for line in frame.split(b"\n") if line.startswith(b"data:")]
        if not data:
            continue
        try:
            ev = json.loads(b"\n".join(data))
        except ValueError:
            continue
        kind = ev.get("type")
        if kind == "response.output_text.delta" and isinstance(ev.get("delta"), str):
            text.append(ev["delta"])
        elif kind == "response.output_item.done" and (ev.get("item") or {}).get("type") == "function_call":
            ids.append(ev["item"].get("call_id"))
        elif kind == "response.completed":
            output = (ev.get("response") or {}).get("output") or []
            listed = [
                o.get("call_id") for o in output if isinstance(o, dict) and o.get("type") == "function_call"
            ]
    assert listed is None or listed == ids, f"response.completed lists calls {listed}, the events gave {ids}"
    return ids, "".join(text)
