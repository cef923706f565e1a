"""Anthropic Messages dialect, request side (``POST /v1/messages``, also ``?beta=true``).

Reads ``messages`` (each ``role`` user or assistant; ``content`` a string or blocks).
``system`` is top level and not part of the history (the conversation key reads it,
:mod:`proxy.request.conversation`). ``/v1/messages/count_tokens`` and every other path is
passthrough: :data:`PATH_SUFFIX` ends the path (the query string is not part of it).

Positions (*slots*, :func:`slots`): the transcript's positions index the messages as the chat
dialect would see them, so that the same conversation gets the same positions in both forms:

- an assistant message is one slot: its ``text`` blocks are what was said (joined by newlines;
  ``thinking`` / ``redacted_thinking`` are not text), its ``tool_use`` blocks (``id``, ``name``,
  ``input`` object: the arguments) the calls of one *step*; ``server_tool_use`` /
  ``web_search_tool_result`` and every other block pass through unread;
- a user message is one slot per ``tool_result`` block (``tool_use_id``, ``content`` a string or
  blocks whose ``text`` blocks are the text, ``is_error``), in order, then one slot for the user's
  own part when it has one: a string ``content``, a ``text`` / ``image`` / ``document`` block, or
  no ``tool_result`` block at all. That part starts a turn; a user message whose blocks are all
  ``tool_result`` (unknown blocks aside) is a step's results only. A message with results *and*
  text (Claude Code sends them: a hook's output, an interruption, a ``<system-reminder>``) is
  the results, then a turn start: the API requires the results first in it
  (https://docs.anthropic.com/en/docs/build-with-claude/tool-use, "tool_result blocks must come
  FIRST"), and text there is new input the model reads after them;
- a result pairs with the first call still waiting with its ``tool_use_id`` (without an id: the
  oldest waiting call of the latest step, as in chat). ``is_error: true`` is the failure flag
  (``ToolResult.is_error``); anything else leaves failures to the text (:mod:`proxy.core.failures`);
- a message of any other role is one slot the guards do not read, and, unlike a chat ``system``
  message, it does not end the step before it: the API has no such role, and Claude Code sends
  ``"role": "system"`` notes there ("The user hasn't heard from you in a while…" after every 5th
  step without text, measured with Claude Code 2.1.332), after a step's results, so the request
  still answers that step (:attr:`proxy.core.transcript.Transcript.newest_step`).

Writes (:func:`apply`, byte edits: :func:`proxy.dialects.edits.replace_member` and
:func:`proxy.dialects.edits.append_text`; only the edited spans change, so ``thinking`` blocks and
their ``signature``, ``cache_control`` and every other byte stay as they came):

- a withheld result's ``content`` becomes the denial text (blocks become that string; when one of
  those blocks carries ``cache_control``, one ``text`` block with the denial and that
  ``cache_control``, so the cache breakpoint stays where the agent put it); ``is_error`` and the
  block's own members are left as they were;
- a reminder after a result is a ``text`` block inserted right after the last ``tool_result``
  block of that user message (results stay first; a text already there comes after it); with
  ``tool_suffix`` delivery it is appended to the result's ``content`` (a string gets a blank line
  and the text, blocks one more ``text`` block). A reminder on the user's own part is appended to
  that message's content; after an assistant message, a new user message
  ``{"role": "user", "content": [{"type": "text", "text": …}]}`` follows it (the API joins
  consecutive user messages). Several reminders for one slot are merged as in
  :func:`proxy.dialects.edits.apply`.

Sources: https://docs.anthropic.com/en/api/messages (request shape, content blocks),
https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching (``cache_control`` on blocks),
https://docs.anthropic.com/en/docs/build-with-claude/extended-thinking (thinking blocks are passed
back unmodified).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core.actions import Action, Remind
from proxy.core.canonical import parse_arguments
from proxy.core.transcript import Said, ToolResult, Transcript
from proxy.dialects import edits, jsonbody, text_calls
from proxy.dialects.fold import FoldState, history
from proxy.errors import DialectError

#: Ends the request path: ``/v1/messages`` (behind any prefix), not ``/v1/messages/count_tokens``
#: nor an OpenAI Assistants ``/v1/threads/{id}/messages``.
PATH_SUFFIX = "/v1/messages"
#: The top-level member that holds the history (a list), for :mod:`proxy.request.prefix_cache`.
ITEMS = "messages"
#: User-message blocks that are the user's own input (they make the message a turn start).
USER_BLOCKS = frozenset(("text", "image", "document"))


@dataclass(frozen=True, slots=True)
class Slot:
    """One transcript position: ``message`` (index into ``messages``), ``block`` (index of the
    ``tool_result`` block in its ``content``, None for the message itself or the user's own
    part) and ``kind`` (``result``, ``user``, ``assistant`` or ``other``)."""

    message: int
    block: int | None
    kind: str

    @property
    def item(self) -> int:
        """The index of the message that holds it (:class:`proxy.dialects.edits.Slotted`)."""
        return self.message


def _blocks(content: Any) -> list[Any] | None:
    return content if isinstance(content, list) else None


def _is_result(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "tool_result"


def slots(messages: list[Any]) -> list[Slot]:
    """The transcript positions of ``messages`` (module docstring), in order. Raises
    :class:`DialectError` when a message is not an object."""
    out: list[Slot] = []
    for i, msg in enumerate(messages):
        out += message_slots(i, msg)
    return out


def message_slots(i: int, msg: Any) -> list[Slot]:
    """The transcript positions of message ``i`` (:func:`slots`). Raises :class:`DialectError`
    when it is not an object."""
    if not isinstance(msg, dict):
        raise DialectError(f"message {i} is not an object")
    role = msg.get("role")
    if role == "assistant":
        return [Slot(i, None, "assistant")]
    if role != "user":
        return [Slot(i, None, "other")]
    blocks = _blocks(msg.get("content"))
    if blocks is None:
        return [Slot(i, None, "user")]
    results = [j for j, b in enumerate(blocks) if _is_result(b)]
    out = [Slot(i, j, "result") for j in results]
    own = any(isinstance(b, dict) and b.get("type") in USER_BLOCKS for b in blocks)
    if own or not results:
        out.append(Slot(i, None, "user"))
    return out


def content_text(content: Any) -> str:
    """Text of a ``content`` value: a string as is, the ``text`` of each ``text`` block joined by
    newlines, ``""`` otherwise."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(
        b["text"]
        for b in content
        if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
    )


def parse_request(body: Any) -> Transcript:
    """Build the transcript of a decoded Messages request body (positions: :func:`slots`).

    Raises :class:`DialectError` when ``body`` is not an object, ``messages`` is not a list, or a
    message is not an object.
    """
    messages = history(body, ITEMS)  # raises for a body that is not an object
    return Fold(text_calls.offered_tools(body)).read(messages)


class Fold(FoldState):
    """The transcript of a message list read one message at a time: :func:`parse_request`
    is ``feed`` over every message then ``finish``. :meth:`copy` keeps the state after a prefix, so
    a request that repeats that prefix resumes there (:mod:`proxy.request.prefix_cache`).

    ``tools`` (here) and ``tool_choice`` (:meth:`finish`) are taken as every dialect's fold takes
    them (:class:`proxy.dialects.Dialect`); Messages calls are ``tool_use`` blocks, read the same
    whatever the request offers: the offered tools are only kept in the transcript (names, for the
    redirect texts of :mod:`proxy.guards.wording`)."""

    __slots__ = ("positions",)
    EXTRA = ("positions",)

    def __init__(self, tools: Any = None) -> None:
        super().__init__(tools)
        self.positions = 0  # slots read so far (:func:`slots`)

    def finish(self, message_count: int, tool_choice: Any = None) -> Transcript:
        """The transcript of the messages fed (``message_count`` of them; its positions are
        slots, so the count it keeps is theirs)."""
        return super().finish(self.positions)

    def feed(self, i: int, msg: Any) -> None:
        """Read message ``i``. Raises :class:`DialectError` when it is not an object."""
        for slot in message_slots(i, msg):
            pos = self.positions
            self.positions += 1
            self._slot(pos, slot, msg)

    def _slot(self, pos: int, slot: Slot, msg: dict[str, Any]) -> None:
        calls, steps = self.calls, self.steps
        content = msg.get("content")
        if slot.kind == "assistant":
            text = content_text(content)
            if text.strip():
                self.texts.append(pos)
            uses = [b for b in _blocks(content) or () if isinstance(b, dict) and b.get("type") == "tool_use"]
            self.said.append(Said(pos, "assistant", text, bool(uses)))
            if not uses:
                self.last_kind = "assistant"
                return
            self.new_step(pos)
            for use in uses:
                cid = use.get("id")
                cid = cid if isinstance(cid, str) else None
                name = use.get("name")
                name = name if isinstance(name, str) else ""
                self.new_call(cid, name, use.get("input"), parse_arguments(use.get("input")), pos)
            self.last_kind = "step"
        elif slot.kind == "result":
            assert slot.block is not None
            block = content[slot.block]
            cid = block.get("tool_use_id")
            cid = cid if isinstance(cid, str) else None
            seq = self.take(cid)
            if seq is None and steps and cid is None:  # no id: the oldest waiting call of the latest step
                for s in steps[-1]["calls"]:
                    if self.waiting(s):
                        seq = self.take(calls[s]["call_id"], s)
                        break
            if seq is not None:
                flag = True if block.get("is_error") is True else None
                self.settle(seq, ToolResult(pos, content_text(block.get("content")), flag))
            if self.last_kind != "step":
                self.last_kind = "other"
        elif slot.kind == "user":
            self.turn += 1
            self.users.append(pos)
            self.said.append(Said(pos, "user", content_text(content)))
            self.last_kind = "user"
        # any other role (Claude Code's "system" notes) is read as nothing: the end stays as it was


def _text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _denial(raw: bytes, fields: dict[str, tuple[int, int]], text: str) -> bytes | None:
    """The denial as a one-block array keeping the ``cache_control`` of the result's content
    blocks (the last one that has it), or None when none has one (the denial is a string)."""
    span = fields.get("content")
    if span is None or raw[span[0] : span[0] + 1] != b"[":
        return None
    cache: bytes | None = None
    for bs, _ in jsonbody.items(raw, span[0]):
        if raw[bs : bs + 1] == b"{":
            cc = jsonbody.members(raw, bs).get("cache_control")
            if cc is not None:
                cache = raw[cc[0] : cc[1]]
    if cache is None:
        return None
    return b"[" + jsonbody.dumps(_text_block(text))[:-1] + b',"cache_control":' + cache + b"}]"


def apply(
    raw: bytes, actions: Sequence[Action], body: Any = None, spans: Sequence[tuple[int, int]] | None = None
) -> bytes | None:
    """Apply request-side actions to the body ``raw`` (a request :func:`parse_request` read; rules
    in the module docstring). ``body``: ``raw`` decoded, when the caller has it; ``spans``: the
    messages' byte spans, when known (:mod:`proxy.request.prefix_cache`). Returns the new body,
    or None when no action applies (a position that is no slot, a withhold of anything but a
    result, is ignored; :func:`proxy.dialects.edits.apply_slots`)."""
    return edits.apply_slots(raw, actions, body, _WIRE, spans)


def _plan(
    raw: bytes,
    layout: Sequence[Slot],
    withheld: dict[int, str],
    grouped: dict[int, list[Remind]],
    messages: list[Any],
    spans: Sequence[tuple[int, int]],
) -> list[tuple[int, edits.Edit]]:
    """The edits :func:`apply` makes for ``withheld`` and ``grouped``
    (:func:`proxy.dialects.edits.targets`), each with the slot it belongs to (an edit of a slot
    lies inside its message or at its end)."""
    message_fields: dict[int, dict[str, tuple[int, int]]] = {}
    block_spans: dict[int, list[tuple[int, int]]] = {}

    def fields_of(i: int) -> dict[str, tuple[int, int]]:
        if i not in message_fields:
            message_fields[i] = jsonbody.members(raw, spans[i][0], messages[i])
        return message_fields[i]

    def blocks_of(i: int) -> list[tuple[int, int]]:
        if i not in block_spans:
            vs = fields_of(i)["content"][0]
            block_spans[i] = jsonbody.items(raw, vs, messages[i]["content"])
        return block_spans[i]

    def block_fields(slot: Slot) -> tuple[int, dict[str, tuple[int, int]]]:
        assert slot.block is not None
        bs = blocks_of(slot.message)[slot.block][0]
        return bs, jsonbody.members(raw, bs, messages[slot.message]["content"][slot.block])

    suffix = {p: "\n\n".join(r.text for r in g) for p, g in grouped.items() if g[0].delivery == "tool_suffix"}
    out: list[tuple[int, edits.Edit]] = []
    for pos in sorted(withheld):
        bs, fields = block_fields(layout[pos])
        text = "\n\n".join(t for t in (withheld[pos], suffix.pop(pos, "")) if t)
        kept = _denial(raw, fields, text)
        if kept is not None:
            vs, ve = fields["content"]
            out.append((pos, (vs, ve, kept)))
        else:
            out.append((pos, edits.replace_member(fields, bs, "content", text)))
    for pos, group in sorted(grouped.items()):
        slot = layout[pos]
        if pos in withheld and pos not in suffix and group[0].delivery == "tool_suffix":
            continue  # merged into the denial above
        text = "\n\n".join(r.text for r in group)
        if slot.kind == "result" and pos in suffix:
            bs, fields = block_fields(slot)
            out.append((pos, edits.append_text(raw, fields, bs, "content", _text_block(text))))
        elif slot.kind == "result":
            results = [j for j, b in enumerate(messages[slot.message]["content"]) if _is_result(b)]
            end = blocks_of(slot.message)[results[-1]][1]
            out.append((pos, (end, end, b"," + jsonbody.dumps(_text_block(text)))))
        elif slot.kind == "user" or pos in suffix:
            i = slot.message
            out.append((pos, edits.append_text(raw, fields_of(i), spans[i][0], "content", _text_block(text))))
        else:
            end = spans[slot.message][1]
            reminder = {"role": "user", "content": [_text_block(text)]}
            out.append((pos, (end, end, b"," + jsonbody.dumps(reminder))))
    return out


#: How :func:`apply` finds the slots it edits and plans their edits.
_WIRE = edits.SlotWire(ITEMS, slots, _plan)


def apply_kept(
    raw: bytes,
    actions: Sequence[Action],
    body: Any,
    spans: Sequence[tuple[int, int]],
    kept: edits.Kept | None,
    cut: int | None,
) -> edits.Applied:
    """:func:`apply` reusing the previous request's edits before its cut (a slot position;
    :func:`proxy.dialects.edits.apply_slots_kept`, whose promise on ``kept`` holds here). A body
    whose messages are not a list or do not match ``spans`` is a full :func:`apply` that keeps
    nothing."""
    return edits.apply_slots_kept(raw, actions, body, _WIRE, spans, kept, cut)
