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

Tool calls written as text (:mod:`proxy.dialects.text_calls`): an assistant message
without structured calls whose content (a string, or its text parts joined) holds complete call
blocks is a step with those calls (no ids; their text is what comes before the first block). Only
the offered ``tools`` are calls when the request has ``tools``; without ``tools`` (agents that read
calls from text themselves) any well-formed name is. Their results come back

- as ``tool`` messages: matched in order (no ids to match by: the oldest call of the latest step
  still without a result; a ``tool_call_id`` the step does not know is matched the same way), or
- as one ``user`` message right after the step (or its tool messages) made only of
  ``<tool_response>…</tool_response>`` blocks, one per call in order (the Qwen templates' own form):
  that message is the step's results, not a user turn. A user message with anything else in it is
  what the user said, whatever tags it quotes.

A withheld result there has only its block's inner text replaced (the rest of the message, other
blocks included, is kept); a reminder after it is a ``user`` message after that message (with
``tool_suffix``, appended to its content: after the last ``</tool_response>``), so the template
still renders the results as results. A conversation mixing structured and text calls is one
sequence of steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.core.actions import Action, Withhold
from proxy.core.canonical import parse_arguments
from proxy.core.transcript import Said, ToolResult, Transcript
from proxy.dialects import edits, jsonbody, text_actions, text_calls
from proxy.dialects.fold import FoldState, history
from proxy.errors import DialectError

PATH_SUFFIX = "/chat/completions"
#: The top-level member that holds the history (a list), for :mod:`proxy.request.prefix_cache`.
ITEMS = "messages"


def content_text(content: Any) -> str:
    """Text of a message ``content``: a string as is, the ``text`` of each part of an array joined
    by newlines, ``""`` for null or anything else."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def parse_request(body: Any) -> Transcript:
    """Build the transcript of a decoded request body (:class:`Fold` over every message).

    Raises :class:`DialectError` when ``body`` is not an object, ``messages`` is not a list, or a
    message is not an object.
    """
    messages = history(body, ITEMS)  # first: it checks that body is an object
    return Fold(text_calls.offered_tools(body)).read(messages, body.get("tool_choice"))


class Fold(FoldState):
    """The transcript of a message list read one message at a time: :func:`parse_request`
    is ``feed`` over every message then ``finish``. :meth:`copy` keeps the state after a prefix, so
    a request that repeats that prefix resumes there (:mod:`proxy.request.prefix_cache`).

    ``tools``: the request's offered tools (:func:`proxy.dialects.text_calls.offered_tools`): calls
    written as text are read against them, so the state after a prefix holds only for a request
    offering the same tools."""

    __slots__ = ()

    def feed(self, pos: int, msg: Any) -> None:
        """Read message ``pos``. Raises :class:`DialectError` when it is not an object."""
        if not isinstance(msg, dict):
            raise DialectError(f"message {pos} is not an object")
        calls, steps = self.calls, self.steps
        role = msg.get("role")
        if role != "user":
            self.candidate = None
        if role == "user":
            self.user_text(pos, content_text(msg.get("content")))
        elif role == "assistant":
            text = content_text(msg.get("content"))
            if text.strip():
                self.texts.append(pos)
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
            written = None
            acted = None
            if not entries and ("<tool_call>" in text or "<function=" in text):
                written = text_calls.find_calls(text, self.tools)
            if written is not None:  # calls written as text
                entries = [(None, c.name, c.arguments) for c in written.calls]
                text = written.text
                if self.texts and self.texts[-1] == pos and not text.strip():
                    self.texts.pop()
            elif not entries:  # a harness's text actions (smolagents), or a fenced candidate
                acted = self.text_action(pos, text)
                if acted is not None:
                    entries = [(a.call_id, a.name, a.arguments) for a in acted]
                    text = acted[0].text
                    if self.texts and self.texts[-1] == pos and not text.strip():
                        self.texts.pop()
            self.said.append(Said(pos, "assistant", text, bool(entries)))
            if entries:
                mark: bool | str = text_actions.SMOLAGENTS if acted is not None else written is not None
                self.new_step(pos, text=mark)
                for cid, name, raw in entries:
                    self.new_call(cid, name if isinstance(name, str) else "", raw, parse_arguments(raw), pos)
                self.last_kind = "step"
            else:
                self.last_kind = "assistant"
        elif role in ("tool", "function"):
            cid = msg.get("tool_call_id") if role == "tool" else None
            seq = self.take(cid if isinstance(cid, str) else None)
            if seq is None and steps and (cid is None or role == "function" or steps[-1].get("text")):
                # No id: answer the oldest call of the latest step still waiting for a result.
                for s in steps[-1]["calls"]:
                    if self.waiting(s):
                        seq = self.take(calls[s]["call_id"], s)
                        break
            if seq is not None:
                self.settle(seq, ToolResult(pos, content_text(msg.get("content"))))
            if self.last_kind != "step":
                self.last_kind = "other"
        else:
            self.last_kind = "other"


#: How chat requests carry results and take reminders (:mod:`proxy.dialects.edits`).
WIRE = edits.Wire(
    items="messages",
    result_member=lambda kind: "content",
    text_part=lambda kind, text: {"type": "text", "text": text},
    reminder=lambda text: {"role": "user", "content": text},
)


def apply(
    raw: bytes, actions: Sequence[Action], body: Any = None, spans: Sequence[tuple[int, int]] | None = None
) -> bytes | None:
    """Apply request-side actions to the body ``raw`` (a request :func:`parse_request` read):
    withheld results get the denial text as their ``content``, reminders become ``user`` messages
    (or are appended to the content). Returns the new body, or None when no action applies.
    ``body``: ``raw`` decoded, when the caller has it; ``spans``: the messages' byte spans, when
    known. Rules: :func:`proxy.dialects.edits.apply`.
    """
    if any(isinstance(a, Withhold) and a.part is not None for a in actions):
        if body is None:
            body = jsonbody.decode(raw)
        messages = body.get("messages") if isinstance(body, dict) else None
        actions = edits.whole_results(actions, messages, lambda m: content_text(m.get("content")))
    return edits.apply(raw, actions, body, WIRE, spans)


#: :func:`apply` reusing the previous request's edits before its cut
#: (:func:`proxy.dialects.edits.kept_apply`)
apply_kept = edits.kept_apply(WIRE, apply)
