"""OpenAI Responses dialect, request side (``POST /v1/responses``).

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
- Tool calls written as text (:mod:`proxy.dialects.text_calls`) in an assistant
  ``message`` item's text are a step of their own at that item, read as the chat dialect reads
  them (:mod:`proxy.dialects.openai_chat`): results in a user ``message`` item made only of
  ``<tool_response>`` blocks (no turn), a withhold replacing the text inside its block (the item's
  ``content`` then becomes that string). The answers' side is not repaired in this dialect.
- ``reasoning`` and every other item type (``web_search_call``, ``local_shell_call``, …) pass
  through unread. ``instructions`` is not part of the history.

Writes (:data:`WIRE`, :func:`proxy.dialects.edits.apply`): a withheld result's ``output`` becomes
the denial text (a parts array becomes that string); a reminder is a ``message`` item
``{"type": "message", "role": "user", "content": [{"type": "input_text", "text": …}]}`` inserted
after the step's last output item, or appended to that output (``tool_suffix``: an
``input_text`` part for a parts array).

``previous_response_id`` chains (:mod:`proxy.request.response_store`): :func:`input_items` gives the new
items (a string ``input`` as one user message), the guards read the kept chain followed by them,
and :func:`apply_chained` writes only the actions that fall on the new items, shifted to the
request's ``input`` list, then puts the kept response's repair items (the outputs of calls
loopguard dropped from that answer, its stop message) first in ``input``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core.actions import Action, Remind, Withhold
from proxy.core.canonical import parse_arguments
from proxy.core.transcript import Said, ToolResult, Transcript
from proxy.dialects import edits, jsonbody, text_calls
from proxy.dialects.fold import FoldState
from proxy.errors import DialectError

PATH_SUFFIX = "/responses"
#: The top-level member that holds the history (a list), for :mod:`proxy.request.prefix_cache`.
ITEMS = "input"
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

    return Fold(text_calls.offered_tools(body)).read(items, body.get("tool_choice"))


class Fold(FoldState):
    """The transcript of an item list read one item at a time: :func:`parse_request`
    is ``feed`` over every item then ``finish``. :meth:`copy` keeps the state after a prefix, so a
    request that repeats that prefix resumes there (:mod:`proxy.request.prefix_cache`).

    ``tools``: the request's offered tools (:func:`proxy.dialects.text_calls.offered_tools`): calls
    written as text are read against them, so the state after a prefix holds only for a request
    offering the same tools."""

    __slots__ = ("in_step", "previous")
    EXTRA = ("in_step", "previous")

    def __init__(self, tools: Mapping[str, Any] | None = None) -> None:
        super().__init__(tools)
        self.in_step = False  # the previous item (reasoning aside) was a call of the current step
        self.previous = -1  # position of the previous item, reasoning aside

    def feed(self, pos: int, item: Any) -> None:
        """Read item ``pos``. Raises :class:`DialectError` when it is not an object."""
        steps, said = self.steps, self.said
        if not isinstance(item, dict):
            raise DialectError(f"input item {pos} is not an object")
        kind = item_type(item)
        if kind in CALL_TYPES:
            if not self.in_step:
                self.new_step(pos)
                if said and said[-1].role == "assistant" and said[-1].position == self.previous:
                    last = said[-1]
                    said[-1] = Said(last.position, last.role, last.text, True)
                self.in_step = True
            cid = item.get("call_id")
            cid = cid if isinstance(cid, str) else None
            name = item.get("name")
            raw = item.get("arguments") if kind == "function_call" else item.get("input")
            name = name if isinstance(name, str) else ""
            self.new_call(cid, name, raw, parse_arguments(raw), steps[-1]["position"])
            self.last_kind = "step"
            self.previous = pos
            return
        if kind == "reasoning":
            return  # neither splits a step nor ends one
        self.in_step = False
        self.previous = pos
        if kind in OUTPUT_TYPES:
            cid = item.get("call_id")
            seq = self.take(cid if isinstance(cid, str) else None)
            if seq is not None:
                self.settle(seq, ToolResult(pos, content_text(item.get("output"))))
            if self.last_kind != "step":
                self.last_kind = "other"
            return
        if kind == "message" and item.get("role") == "user":
            self.user_text(pos, content_text(item.get("content")))
        elif kind == "message" and item.get("role") == "assistant":
            text = content_text(item.get("content"))
            written = None
            if "<tool_call>" in text or "<function=" in text:
                written = text_calls.find_calls(text, self.tools)
            if written is not None:  # calls written as text: a step of their own
                text = written.text
                self.new_step(pos, text=True)
                for c in written.calls:
                    self.new_call(None, c.name, c.arguments, c.arguments, pos)
            if text.strip():
                self.texts.append(pos)
            said.append(Said(pos, "assistant", text, written is not None))
            self.last_kind = "step" if written is not None else "assistant"
        else:
            self.last_kind = "other"


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


def apply(
    raw: bytes, actions: Sequence[Action], body: Any = None, spans: Sequence[tuple[int, int]] | None = None
) -> bytes | None:
    """Apply request-side actions to the body ``raw`` (module docstring; rules in
    :func:`proxy.dialects.edits.apply`; ``spans``: the items' byte spans, when known). Returns the
    new body, or None when no action applies (a string ``input`` never has one)."""
    return edits.apply(raw, _whole(raw, actions, body), body, WIRE, spans)


#: :func:`apply` reusing the previous request's edits before its cut
#: (:func:`proxy.dialects.edits.kept_apply`)
apply_kept = edits.kept_apply(WIRE, apply)


def _whole(raw: bytes, actions: Sequence[Action], body: Any) -> Sequence[Action]:
    """Withholds of ``<tool_response>`` blocks as withholds of their item (:func:`edits.whole_results`)."""
    if not any(isinstance(a, Withhold) and a.part is not None for a in actions):
        return actions
    if body is None:
        body = jsonbody.decode(raw)
    items = body.get("input") if isinstance(body, dict) else None
    return edits.whole_results(actions, items, lambda item: content_text(item.get("content")))


# --- previous_response_id chains (proxy.request.response_store) ------------------------------


def previous_id(body: Any) -> str | None:
    """The request's ``previous_response_id`` (a non-empty string), else None."""
    prev = body.get("previous_response_id") if isinstance(body, dict) else None
    return prev if isinstance(prev, str) and prev else None


def input_items(body: dict[str, Any]) -> list[Any]:
    """The request's ``input`` as a list of items (a string is one user message; no input, none).
    Raises :class:`DialectError` for anything else."""
    items = body.get("input")
    if items is None:
        return []
    if isinstance(items, str):
        return [{"type": "message", "role": "user", "content": items}]
    if not isinstance(items, list):
        raise DialectError("input is neither a string nor a list")
    return items


def _shifted(action: Action, count: int) -> Action | None:
    if isinstance(action, Withhold):
        pos = action.position - count
        return dataclasses.replace(action, position=pos) if pos >= 0 else None
    if isinstance(action, Remind):
        after = action.after - count
        return dataclasses.replace(action, after=after) if after >= 0 else None
    return None


def _prepend(raw: bytes, repair: bytes, body: Any) -> bytes:
    """``raw`` with the items of the JSON array ``repair`` first in its ``input`` (a string input
    becomes a list: the repair items, then the string as a user message; no input, just them)."""
    inner = repair[1:-1]
    hints = body if isinstance(body, dict) else None
    root = jsonbody.root(raw)
    start = jsonbody.member_start(raw, root, "input", hints)
    if start is None:
        fields = jsonbody.members(raw, root, hints)
        tail = b"," if fields else b""
        return jsonbody.splice(raw, [(root + 1, root + 1, b'"input":[' + inner + b"]" + tail)])
    first = raw[start : start + 1]
    if first == b"[":
        empty = not jsonbody.items(raw, start, count=1)
        return jsonbody.splice(raw, [(start + 1, start + 1, inner if empty else inner + b",")])
    end = jsonbody.value_end(raw, start, hints["input"]) if hints else jsonbody.value_end(raw, start)
    if first == b'"':
        user = b'{"type":"message","role":"user","content":' + raw[start:end] + b"}"
        return jsonbody.splice(raw, [(start, end, b"[" + inner + b"," + user + b"]")])
    return jsonbody.splice(raw, [(start, end, b"[" + inner + b"]")])  # null


def apply_chained(
    raw: bytes, actions: Sequence[Action], body: Any, count: int, repair: bytes = b""
) -> bytes | None:
    """Apply actions derived over a chain whose first ``count`` items the upstream already holds
    (:mod:`proxy.request.response_store`): those at positions inside them are not applied, the others
    with their positions shifted to this request's ``input``; then the ``repair`` items (a JSON
    array, ``b""`` for none) are put first in ``input``. Returns the new body, or None when
    nothing changes."""
    shifted = [s for s in (_shifted(a, count) for a in actions) if s is not None]
    out = edits.apply(raw, _whole(raw, shifted, body), body, WIRE) if shifted else None
    if repair:
        out = _prepend(out, repair, None) if out is not None else _prepend(raw, repair, body)
    return out


#: Answer statuses whose response a server keeps and a later request may continue.
KEPT_STATUSES = frozenset(("completed", "incomplete"))


@dataclass(frozen=True, slots=True)
class Answer:
    """The upstream's answer as far as the store cares. ``output``: the items the agent received.
    ``upstream``: the upstream's own output items when loopguard changed them (None: unchanged,
    or unknown because loopguard closed the stream)."""

    response_id: str
    status: str
    output: tuple[Any, ...]
    upstream: tuple[Any, ...] | None = None


def answer_of(response: Any, upstream: Any = None) -> Answer | None:
    """The :class:`Answer` of a decoded ``response`` object (what the agent got), or None when it
    has no string ``id``, no ``output`` list, or a status that is not kept. ``upstream``: the
    upstream's ``output`` list when it differs."""
    if not isinstance(response, dict):
        return None
    rid, status, output = response.get("id"), response.get("status"), response.get("output")
    if not isinstance(rid, str) or not rid or status not in KEPT_STATUSES or not isinstance(output, list):
        return None
    return Answer(rid, status, tuple(output), tuple(upstream) if isinstance(upstream, list) else None)
