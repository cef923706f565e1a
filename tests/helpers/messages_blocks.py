"""Chat messages in Anthropic Messages form, and back: the corpus gate's Messages replay
(:class:`tests.helpers.corpus.MessagesWire`) and the dialect's tests.

:func:`trace_blocks` converts a chat conversation so that every chat message is one transcript
position of :mod:`proxy.dialects.anthropic_messages` (its *slots*), in the same order:

- the first system / developer message, when nothing but other system messages comes before it,
  becomes the top-level ``system`` string; later ones stay messages of their role (no slot the
  guards read, as in chat);
- a user message stays one, its text parts as ``text`` blocks;
- an assistant message becomes one with ``text`` blocks for its text, then one ``tool_use`` block
  per call (``id``; an id-less call ``toolu_lg_<n>``, its number in the conversation; ``input``:
  the decoded arguments object, ``{}`` for none); the legacy ``function_call`` is a call too;
- a run of ``tool`` / ``function`` messages becomes one user message of ``tool_result`` blocks,
  each paired as the chat dialect pairs it (by id, else the oldest waiting call of the latest
  step), its content a string or ``text`` blocks; a result nothing pairs with keeps its id (or
  none).

:func:`back_to_messages` reads what reached the upstream back as chat messages: every unit (a
message, or a ``tool_result`` block) that arrived unchanged is the message it came from, a changed
one that message with the unit's new text as content, a block or message that was not sent (a
reminder) a user message with its text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from proxy.dialects.anthropic_messages import content_text


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _blocks(content: Any) -> Any:
    """Chat content as Messages content: a string as is, text parts as ``text`` blocks."""
    if isinstance(content, list):
        return [{"type": "text", "text": p.get("text", "")} if isinstance(p, dict) else p for p in content]
    return content if isinstance(content, str) else ""


def _input(arguments: Any) -> Any:
    """A chat call's arguments as a ``tool_use`` ``input``: the decoded object (a string that is
    not a JSON object stays the string: the fixture's own bytes, which the API would refuse)."""
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except ValueError:
            return arguments
        return value if isinstance(value, dict) else arguments
    return arguments


@dataclass
class TracedBlocks:
    """A chat conversation in Messages form. ``system``: the top-level system text (None without
    one) and ``system_from`` the chat index it came from. ``messages``: the Messages messages;
    ``units[j]``: per message ``j`` the chat indexes it holds (one per ``tool_result`` block of a
    results message, else one)."""

    system: str | None
    system_from: int | None
    messages: list[dict[str, Any]]
    units: list[list[int]]

    def before(self, i: int) -> list[dict[str, Any]]:
        """The Messages messages of chat ``messages[:i]`` (a results message cut to its blocks
        from those messages)."""
        out: list[dict[str, Any]] = []
        for m, units in zip(self.messages, self.units, strict=True):
            kept = [u for u in units if u < i]
            if not kept:
                break
            if len(kept) < len(units):
                out.append({**m, "content": m["content"][: len(kept)]})
                break
            out.append(m)
        return out

    def body(self, i: int, **extra: Any) -> dict[str, Any]:
        """The Messages request for chat ``messages[:i]``: ``model`` and ``max_tokens`` first,
        ``system`` when it was among them, then ``messages`` and ``extra``."""
        body: dict[str, Any] = {"model": extra.pop("model", "m"), "max_tokens": 1024}
        if self.system is not None and self.system_from is not None and self.system_from < i:
            body["system"] = self.system
        body["messages"] = self.before(i)
        body.update(extra)
        return body

    def of(self, k: int) -> dict[str, Any]:
        """The Messages message chat message ``k`` (an assistant message) became."""
        j = next(j for j, units in enumerate(self.units) if k in units)
        return self.messages[j]


def trace_blocks(messages: list[dict[str, Any]]) -> TracedBlocks:
    """Convert chat ``messages`` to Messages form (module docstring)."""
    system: str | None = None
    system_from: int | None = None
    out: list[dict[str, Any]] = []
    units: list[list[int]] = []
    pending: dict[str | None, list[str]] = {}
    latest: list[tuple[str | None, str]] = []
    n = 0
    for k, m in enumerate(messages):
        role = m.get("role")
        content = m.get("content")
        if role in ("system", "developer") and system_from is None and not out:
            system, system_from = _text(content), k
        elif role == "user":
            out.append({"role": "user", "content": _blocks(content)})
            units.append([k])
        elif role == "assistant":
            calls = [tc for tc in m.get("tool_calls") or [] if isinstance(tc, dict)]
            entries = [(tc.get("id"), tc.get("function") or {}) for tc in calls]
            if not entries and isinstance(m.get("function_call"), dict):
                entries = [(None, m["function_call"])]
            blocks: list[dict[str, Any]] = []
            text = _blocks(content)
            if isinstance(text, str):
                blocks = [{"type": "text", "text": text}] if text else []
            else:
                blocks = list(text)
            if entries:
                latest = []
            for cid, fn in entries:
                n += 1
                chat_id = cid if isinstance(cid, str) else None
                use_id = chat_id if chat_id is not None else f"toolu_lg_{n}"
                fn = fn if isinstance(fn, dict) else {}
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": use_id,
                        "name": fn.get("name"),
                        "input": _input(fn.get("arguments")),
                    }
                )
                pending.setdefault(chat_id, []).append(use_id)
                latest.append((chat_id, use_id))
            out.append(
                {"role": "assistant", "content": blocks if entries or not isinstance(text, str) else text}
            )
            units.append([k])
        elif role in ("tool", "function"):
            cid = m.get("tool_call_id") if role == "tool" else None
            chat_id = cid if isinstance(cid, str) else None
            use_id: str | None = chat_id
            queue = pending.get(chat_id)
            if queue:
                use_id = queue.pop(0)
            elif chat_id is None:
                for waiting_id, item_id in latest:
                    if item_id in pending.get(waiting_id, []):
                        pending[waiting_id].remove(item_id)
                        use_id = item_id
                        break
            block: dict[str, Any] = {"type": "tool_result"}
            if use_id is not None:
                block["tool_use_id"] = use_id
            block["content"] = _blocks(content) if isinstance(content, list) else _text(content)
            prev = messages[k - 1].get("role") if k else None
            if prev in ("tool", "function") and out and units[-1][-1] == k - 1:
                out[-1]["content"].append(block)
                units[-1].append(k)
            else:
                out.append({"role": "user", "content": [block]})
                units.append([k])
        else:  # a role neither dialect reads: a message of that role
            out.append({"role": role, "content": _blocks(content)})
            units.append([k])
    return TracedBlocks(system, system_from, out, units)


def messages_body(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """The Messages request body of a whole chat conversation."""
    return trace_blocks(messages).body(len(messages), **extra)


def _results(m: dict[str, Any]) -> bool:
    content = m.get("content")
    return (
        m.get("role") == "user"
        and isinstance(content, list)
        and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
    )


def _appended(s: dict[str, Any], a: dict[str, Any]) -> bool:
    """``a`` is the sent message ``s`` (not a results message) with a text appended."""
    if a.get("role") != s.get("role") or _results(a) or _results(s):
        return False
    before = content_text(s.get("content"))
    return bool(before) and content_text(a.get("content")).startswith(before)


def back_to_messages(
    messages: list[dict[str, Any]], traced: TracedBlocks, i: int, arrived: dict[str, Any]
) -> list[dict[str, Any]]:
    """What reached the upstream (``arrived``, the request :meth:`TracedBlocks.body` built for
    ``messages[:i]``, after the proxy) read back as chat messages (module docstring)."""
    sent = traced.before(i)
    units = [[u for u in us if u < i] for us in traced.units[: len(sent)]]
    out: list[dict[str, Any]] = []
    given = traced.system_from
    if given is not None and given < i and arrived.get("system") == traced.system:
        out.append(messages[given])
    j = 0
    for a in arrived.get("messages") or []:
        if not isinstance(a, dict):
            continue
        s = sent[j] if j < len(sent) else None
        if s is not None and a == s:
            out += [messages[k] for k in units[j]]
            j += 1
        elif s is not None and _results(s) and _results(a):
            sent_blocks = s["content"]
            b = 0
            for block in a["content"]:
                if b < len(sent_blocks) and isinstance(block, dict) and block.get("type") == "tool_result":
                    k = units[j][b]
                    orig = sent_blocks[b]
                    same = block == orig
                    out.append(
                        messages[k]
                        if same
                        else {**messages[k], "content": content_text(block.get("content"))}
                    )
                    b += 1
                else:  # an inserted block: a reminder
                    out.append({"role": "user", "content": content_text([block])})
            j += 1
        elif s is not None and _appended(s, a):
            k = units[j][0]
            out.append({**messages[k], "content": content_text(a.get("content"))})
            j += 1
        else:  # a message that was not sent: a reminder
            out.append({"role": a.get("role") or "user", "content": content_text(a.get("content"))})
    return out


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Chat ``tools`` (``{"type": "function", "function": {...}}``) as Messages tools
    (``{"name", "description", "input_schema"}``)."""
    if not tools:
        return tools
    out = []
    for t in tools:
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict):
            tool = {"name": fn.get("name"), "input_schema": fn.get("parameters") or {"type": "object"}}
            if "description" in fn:
                tool["description"] = fn["description"]
            out.append(tool)
        else:
            out.append(t)
    return out


# --- answers ------------------------------------------------------------------------------------


def message_object(message: dict[str, Any], msg_id: str = "msg_corpus") -> dict[str, Any]:
    """The Messages answer (JSON) whose ``content`` is ``message``'s (a Messages assistant
    message, or a chat one converted)."""
    content = message.get("content")
    if isinstance(content, str):
        content = [{"type": "text", "text": content}] if content else []
    uses = any(isinstance(b, dict) and b.get("type") == "tool_use" for b in content or [])
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": "corpus-model",
        "content": content or [],
        "stop_reason": "tool_use" if uses else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: ".encode() + json.dumps({"type": kind, **data}).encode() + b"\n\n"


def message_events(message: dict[str, Any], msg_id: str = "msg_corpus") -> list[bytes]:
    """The same answer as Messages SSE events: ``message_start``, per block its start, deltas
    (``text_delta`` in 16-character pieces, ``input_json_delta`` in two halves after an empty
    one) and stop, ``message_delta`` (``stop_reason``), ``message_stop``."""
    obj = message_object(message, msg_id)
    start = {**obj, "content": [], "stop_reason": None, "usage": {"input_tokens": 10, "output_tokens": 1}}
    out = [_event("message_start", {"message": start})]
    for idx, block in enumerate(obj["content"]):
        if block.get("type") == "tool_use":
            head = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            out.append(_event("content_block_start", {"index": idx, "content_block": head}))
            raw = block["input"] if isinstance(block["input"], str) else json.dumps(block["input"])
            half = len(raw) // 2
            for part in ("", raw[:half], raw[half:]):
                delta = {"type": "input_json_delta", "partial_json": part}
                out.append(_event("content_block_delta", {"index": idx, "delta": delta}))
        else:
            text = block.get("text", "")
            out.append(
                _event("content_block_start", {"index": idx, "content_block": {"type": "text", "text": ""}})
            )
            for p in range(0, len(text), 16):
                delta = {"type": "text_delta", "text": text[p : p + 16]}
                out.append(_event("content_block_delta", {"index": idx, "delta": delta}))
        out.append(_event("content_block_stop", {"index": idx}))
    out.append(
        _event(
            "message_delta",
            {
                "delta": {"stop_reason": obj["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": 5},
            },
        )
    )
    out.append(_event("message_stop", {}))
    return out


def received_content(raw: bytes, stream: bool) -> tuple[list[str | None], str]:
    """The ``tool_use`` ids (in order) and the text the agent received in one Messages answer
    (JSON: its ``content``; SSE: the ``content_block_start`` tool_use blocks and ``text_delta``s)."""
    if not stream:
        content = json.loads(raw).get("content") or []
        ids = [b.get("id") for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
        return ids, content_text(content)
    ids: list[str | None] = []
    text: list[str] = []
    for frame in raw.split(b"\n\n"):
        data = [line[5:].strip() for line in frame.split(b"\n") if line.startswith(b"data:")]
        if not data:
            continue
        try:
            ev = json.loads(b"\n".join(data))
        except ValueError:
            continue
        if (
            ev.get("type") == "content_block_start"
            and (ev.get("content_block") or {}).get("type") == "tool_use"
        ):
            ids.append(ev["content_block"].get("id"))
        elif ev.get("type") == "content_block_delta" and (ev.get("delta") or {}).get("type") == "text_delta":
            text.append(ev["delta"].get("text", ""))
    return ids, "".join(text)
