"""OpenAI Responses dialect, request side (``POST /v1/responses``; issue 11).

Reads ``input``: a string (one user message: nothing to guard) or a list of items. Positions are
indexes into that list.

- ``message`` items (``type`` may be absent when ``role`` is given): ``role`` user starts a turn;
  assistant text is what was said; system / developer are neither. ``content``: a string or parts
  (``input_text`` / ``output_text`` / ``refusal`` text; ``input_image`` / ``input_file`` are not
  text).
- ``function_call`` (``call_id``, ``name``, ``arguments`` JSON string) and ``custom_tool_call``
  (``call_id``, ``name``, raw ``input`` text: the arguments are that text) are calls; a *step* is
  the run of call items between other items (``reasoning`` items inside the run do not split it).
- ``function_call_output`` / ``custom_tool_call_output`` (``call_id``, ``output`` a string or
  parts) are results, matched by ``call_id`` (the first call still waiting with that id).
- ``reasoning`` and every other item type (``web_search_call``, ``local_shell_call``, …) pass
  through unread. ``instructions`` is not part of the history.

Writes (:data:`WIRE`, :func:`proxy.dialects.edits.apply`): a withheld result's ``output`` becomes
the denial text (a parts array becomes that string); a reminder is a ``message`` item
``{"type": "message", "role": "user", "content": [{"type": "input_text", "text": …}]}`` inserted
after the step's last output item, or appended to that output (``tool_suffix``: an
``input_text`` part for a parts array).
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

PATH_SUFFIX = "/responses"
CALL_TYPES = frozenset(("function_call", "custom_tool_call"))
OUTPUT_TYPES = frozenset(("function_call_output", "custom_tool_call_output"))
#: Content part types whose ``text`` is text (images and files are not).
TEXT_PARTS = frozenset(("input_text", "output_text", "text", "refusal"))


def content_text(content: Any) -> str:
    """Text of a ``content`` or ``output`` value: a string as is, the text of each text part of an
    array joined by newlines (``refusal`` parts by their ``refusal``), ``""`` otherwise."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts: list[str] = []
    for part in content:
        if not isinstance(part, dict) or part.get("type", "text") not in TEXT_PARTS:
            continue
        text = part.get("refusal") if part.get("type") == "refusal" else part.get("text")
        if isinstance(text, str):
            texts.append(text)
    return "\n".join(texts)


def item_type(item: dict[str, Any]) -> str:
    """An item's ``type``; ``message`` for a typeless item with a ``role`` (the SDK's easy form)."""
    kind = item.get("type")
    if isinstance(kind, str):
        return kind
    return "message" if "role" in item else ""


def parse_request(body: Any) -> Transcript:
    """Build the transcript of a decoded Responses request body.

    Raises :class:`DialectError` when ``body`` is not an object, ``input`` is neither a string nor
    a list, or an item is not an object.
    """
    if not isinstance(body, dict):
        raise DialectError("body is not a JSON object")
    items = body.get("input")
    if isinstance(items, str):
        return Transcript((), (), (0,), (), 1, None, (Said(0, "user", items),))
    if not isinstance(items, list):
        raise DialectError("input is neither a string nor a list")

    calls: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    users: list[int] = []
    texts: list[int] = []
    said: list[Said] = []
    pending: dict[str | None, deque[int]] = defaultdict(deque)
    turn = 0
    last_kind = ""  # "step" while the history ends with a step and its outputs
    in_step = False  # the previous item (reasoning aside) was a call of the current step
    previous = -1  # position of the previous item, reasoning aside

    for pos, item in enumerate(items):
        if not isinstance(item, dict):
            raise DialectError(f"input item {pos} is not an object")
        kind = item_type(item)
        if kind in CALL_TYPES:
            if not in_step:
                steps.append({"index": len(steps), "position": pos, "calls": [], "end": None})
                if said and said[-1].role == "assistant" and said[-1].position == previous:
                    last = said[-1]
                    said[-1] = Said(last.position, last.role, last.text, True)
                in_step = True
            step = steps[-1]
            cid = item.get("call_id")
            cid = cid if isinstance(cid, str) else None
            name = item.get("name")
            raw = item.get("arguments") if kind == "function_call" else item.get("input")
            seq = len(calls)
            calls.append(
                {
                    "seq": seq,
                    "step": step["index"],
                    "turn": turn,
                    "position": step["position"],
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
            previous = pos
            continue
        if kind == "reasoning":
            continue  # neither splits a step nor ends one
        in_step = False
        previous = pos
        if kind in OUTPUT_TYPES:
            cid = item.get("call_id")
            queue = pending.get(cid if isinstance(cid, str) else None)
            if queue:
                seq = queue.popleft()
                calls[seq]["result"] = ToolResult(pos, content_text(item.get("output")))
                step = steps[calls[seq]["step"]]
                step["end"] = pos if step["end"] is None else max(step["end"], pos)
            if last_kind != "step":
                last_kind = "other"
            continue
        if kind == "message" and item.get("role") == "user":
            turn += 1
            users.append(pos)
            said.append(Said(pos, "user", content_text(item.get("content"))))
            last_kind = "user"
        elif kind == "message" and item.get("role") == "assistant":
            text = content_text(item.get("content"))
            if text.strip():
                texts.append(pos)
            said.append(Said(pos, "assistant", text))
            last_kind = "assistant"
        else:
            last_kind = "other"

    return build(calls, steps, users, texts, len(items), last_kind == "step", said)


def _result_member(kind: edits.Kind) -> str:
    return "output" if kind.get("type") in OUTPUT_TYPES else "content"


def _text_part(kind: edits.Kind, text: str) -> dict[str, Any]:
    part = "output_text" if kind.get("role") == "assistant" else "input_text"
    return {"type": part, "text": text}


#: How Responses requests carry results and take reminders (:mod:`proxy.dialects.edits`).
WIRE = edits.Wire(
    items="input",
    result_member=_result_member,
    text_part=_text_part,
    reminder=lambda text: {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": text}],
    },
)


def apply(raw: bytes, actions: Sequence[Action], body: Any = None) -> bytes | None:
    """Apply request-side actions to the body ``raw`` (module docstring; rules in
    :func:`proxy.dialects.edits.apply`). Returns the new body, or None when no action applies (a
    string ``input`` never has one)."""
    return edits.apply(raw, actions, body, WIRE)
