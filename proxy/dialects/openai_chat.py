"""OpenAI Chat Completions dialect (``POST /v1/chat/completions``).

Reads: ``tool_calls`` on assistant messages (``arguments`` as a JSON string or as an object),
``tool`` messages matched to their call by ``tool_call_id`` (first pending call with that id, so an
id reused in a later step still pairs correctly; a tool message without an id answers the oldest
pending call of the latest step), content as a string or an array of text parts, and the legacy
``function_call`` / ``function`` role pair. Orphan tool messages are ignored.

Writes (:func:`apply`): withheld results get their content replaced by the denial text (an array of
parts becomes that string); reminders become one ``user`` message per step inserted right after the
step's last tool result, or are appended to that result (``tool_suffix``). Several reminders for
one step are merged into one message, texts joined by a blank line, in action order.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Sequence
from typing import Any

from proxy.actions import Action
from proxy.canonical import parse_arguments
from proxy.dialects import edits
from proxy.errors import DialectError
from proxy.transcript import Said, ToolResult, Transcript, build

PATH_SUFFIX = "/chat/completions"


def content_text(content: Any) -> str:
    """Text of a message ``content``: a string as is, the ``text`` of each part of an array joined
    by newlines, ``""`` for null or anything else."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def parse_request(body: Any) -> Transcript:
    """Build the transcript of a decoded request body.

    Raises :class:`DialectError` when ``body`` is not an object, ``messages`` is not a list, or a
    message is not an object.
    """
    if not isinstance(body, dict):
        raise DialectError("body is not a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise DialectError("messages is not a list")

    calls: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    users: list[int] = []
    texts: list[int] = []
    said: list[Said] = []
    pending: dict[str | None, deque[int]] = defaultdict(deque)
    turn = 0
    last_kind = ""

    for pos, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise DialectError(f"message {pos} is not an object")
        role = msg.get("role")
        if role == "user":
            turn += 1
            users.append(pos)
            said.append(Said(pos, "user", content_text(msg.get("content"))))
            last_kind = "user"
        elif role == "assistant":
            text = content_text(msg.get("content"))
            if text.strip():
                texts.append(pos)
            wire_calls = msg.get("tool_calls")
            entries: list[tuple[str | None, Any, Any]] = []
            if isinstance(wire_calls, list):
                for tc in wire_calls:
                    if not isinstance(tc, dict):
                        continue
                    fn = tc.get("function") if isinstance(tc.get("function"), dict) else {}
                    cid = tc.get("id")
                    entries.append(
                        (cid if isinstance(cid, str) else None, fn.get("name"), fn.get("arguments"))
                    )
            fc = msg.get("function_call")
            if not entries and isinstance(fc, dict):
                entries.append((None, fc.get("name"), fc.get("arguments")))
            said.append(Said(pos, "assistant", text, bool(entries)))
            if entries:
                step = {"index": len(steps), "position": pos, "calls": [], "end": None}
                steps.append(step)
                for cid, name, raw in entries:
                    seq = len(calls)
                    calls.append(
                        {
                            "seq": seq,
                            "step": step["index"],
                            "turn": turn,
                            "position": pos,
                            "call_id": cid,
                            "name": name if isinstance(name, str) else "",
                            "arguments_raw": raw,
                            "arguments": parse_arguments(raw),
                            "result": None,
                        }
                    )
                    step["calls"].append(seq)
                    pending[cid].append(seq)
                last_kind = "step"
            else:
                last_kind = "assistant"
        elif role in ("tool", "function"):
            cid = msg.get("tool_call_id") if role == "tool" else None
            queue = pending.get(cid if isinstance(cid, str) else None)
            seq = None
            if queue:
                seq = queue.popleft()
            elif steps and (cid is None or role == "function"):
                # No id: answer the oldest call of the latest step still waiting for a result.
                for s in steps[-1]["calls"]:
                    if calls[s]["result"] is None:
                        seq = s
                        pending[calls[s]["call_id"]].remove(s)
                        break
            if seq is not None:
                calls[seq]["result"] = ToolResult(pos, content_text(msg.get("content")))
                step = steps[calls[seq]["step"]]
                step["end"] = pos if step["end"] is None else max(step["end"], pos)
            if last_kind != "step":
                last_kind = "other"
        else:
            last_kind = "other"

    return build(calls, steps, users, texts, len(messages), last_kind == "step", said)


#: How chat requests carry results and take reminders (:mod:`proxy.dialects.edits`).
WIRE = edits.Wire(
    items="messages",
    result_member=lambda kind: "content",
    text_part=lambda kind, text: {"type": "text", "text": text},
    reminder=lambda text: {"role": "user", "content": text},
)


def apply(raw: bytes, actions: Sequence[Action], body: Any = None) -> bytes | None:
    """Apply request-side actions to the body ``raw`` (a request :func:`parse_request` read):
    withheld results get the denial text as their ``content``, reminders become ``user`` messages
    (or are appended to the content). Returns the new body, or None when no action applies.
    ``body``: ``raw`` decoded, when the caller has it. Rules: :func:`proxy.dialects.edits.apply`.
    """
    return edits.apply(raw, actions, body, WIRE)
