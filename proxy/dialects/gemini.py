"""Gemini API dialect, request side (``POST …/models/{model}:generateContent`` and
``:streamGenerateContent``, under ``/v1beta``, ``/v1`` or any prefix: LiteLLM's ``/gemini/v1beta``,
Vertex AI's ``…/publishers/google/models/{model}``). ``:countTokens`` and every other path is
passthrough (:func:`matches`; the query string, ``?alt=sse`` and ``?key=`` included, is not part
of the path).

Reads ``contents`` (each ``role`` ``user`` or ``model``; ``parts`` a list). ``systemInstruction``
and ``tools[].functionDeclarations`` are top level and not part of the history (the conversation
key reads ``systemInstruction``, :mod:`proxy.request.conversation`).

Positions (*slots*, :func:`slots`), so that the same conversation gets the same positions as in
chat form:

- a ``model`` content is one slot: its ``text`` parts are what was said (joined by newlines;
  ``thought: true`` parts are reasoning, not text), its ``functionCall`` parts (``name``, ``args``
  object: the arguments, and ``id`` in newer servers) the calls of one *step*;
- a ``user`` content is one slot per ``functionResponse`` part (``name``, ``response``, ``id``), in
  order, then one slot for the user's own part when it has one (a ``text``, ``inlineData`` or
  ``fileData`` part, or no ``functionResponse`` at all): that part starts a turn;
- a result pairs as the API pairs them: with the waiting call that has its ``id`` (both sides
  carry one), else with the first waiting call of the latest step with its ``name``, else with the
  oldest waiting call of the latest step. Gemini CLI numbers its calls itself
  (``{name}-{time}-{random}``) and sends that id in ``functionResponse`` only, so the name is what
  pairs there. The result's text is ``response.output`` (or ``response.error``, or
  ``response.result``) when it is a string, else the compact JSON of ``response``; a ``response``
  with an ``error`` member and no ``output`` is a failure (``ToolResult.is_error``), the form
  Gemini CLI sends for a tool that failed;
- a content of any other role (the API has none) is one slot the guards do not read; as a chat
  ``system`` message, it ends the step before it.

Writes (:func:`apply`, byte edits: only the edited spans change, so ``thoughtSignature`` and every
other byte stay as they came):

- a withheld result's ``response`` becomes ``{"error": <denial>}``: the API documents ``output`` for
  a function's output and ``error`` for its failure, and a withheld call's result is not its
  output (https://ai.google.dev/api/caching#FunctionResponse); ``name``, ``id`` and the part's
  other members are left as they were;
- a reminder after a result is a new content ``{"role": "user", "parts": [{"text": …}]}`` right
  after the content holding the results (consecutive ``user`` contents are accepted, and the
  function-response turn still follows its call turn, which Gemini 3's thought signatures
  require); with ``tool_suffix`` delivery it is appended to the result's ``response.output`` (or
  ``error``) string after a blank line (any other ``response`` gets the new content instead). A
  reminder on the user's own part is one more ``text`` part of that content; after a ``model``
  content, a new ``user`` content follows it. Several reminders for one slot are merged as in
  :func:`proxy.dialects.edits.apply`.

Sources: https://ai.google.dev/api/generate-content (request shape),
https://ai.google.dev/api/caching#Content (``Content``, ``Part``, ``FunctionCall``,
``FunctionResponse``), https://ai.google.dev/gemini-api/docs/function-calling (pairing by order
and name; ``id`` when the server sets one), https://ai.google.dev/gemini-api/docs/thought-signatures.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core.actions import Action, Remind
from proxy.core.canonical import parse_arguments
from proxy.core.transcript import Said, ToolResult, Transcript
from proxy.dialects import edits, jsonbody, text_calls
from proxy.dialects.fold import FoldState, history
from proxy.errors import DialectError

#: The name of this dialect's requests (the prefix cache's namespace, :mod:`proxy.request.prefix_cache`);
#: which paths are Gemini requests is :func:`matches`.
PATH_SUFFIX = ":generateContent"
#: The top-level member that holds the history (a list), for :mod:`proxy.request.prefix_cache`.
ITEMS = "contents"
#: ``…/models/{model}:generateContent`` or ``:streamGenerateContent`` (tuned models too).
_PATH = re.compile(r"/(?:tunedModels|models)/([^/:]+):(?:generateContent|streamGenerateContent)\Z")
#: User parts that are the user's own input (they make the content a turn start).
USER_PARTS = frozenset(("text", "inlineData", "fileData"))
#: ``response`` members whose string is a result's text, in order of preference.
_RESULT_TEXT = ("output", "error", "result")


def matches(path: str) -> bool:
    """True for a Gemini generation path (aiohttp's ``request.path``, without the query)."""
    return _PATH.search(path) is not None


def is_stream(path: str) -> bool:
    """True for ``:streamGenerateContent`` (its answer is SSE with ``?alt=sse``, else one JSON
    array of chunks)."""
    return path.endswith(":streamGenerateContent")


def log_fields(path: str) -> dict[str, Any]:
    """The request log line's ``model`` and ``stream`` (the path gives them, not the body)."""
    found = _PATH.search(path)
    return {"model": found.group(1) if found else None, "stream": is_stream(path)}


@dataclass(frozen=True, slots=True)
class Slot:
    """One transcript position: ``content`` (index into ``contents``), ``part`` (index of the
    ``functionResponse`` part in its ``parts``, None for the content itself or the user's own
    part) and ``kind`` (``result``, ``user``, ``model`` or ``other``)."""

    content: int
    part: int | None
    kind: str

    @property
    def item(self) -> int:
        """The index of the content that holds it (:class:`proxy.dialects.edits.Slotted`)."""
        return self.content


def _parts(content: Any) -> list[Any]:
    parts = content.get("parts") if isinstance(content, dict) else None
    return parts if isinstance(parts, list) else []


def _has(part: Any, key: str) -> bool:
    return isinstance(part, dict) and isinstance(part.get(key), dict)


def content_slots(i: int, content: Any) -> list[Slot]:
    """The transcript positions of content ``i`` (:func:`slots`). Raises :class:`DialectError`
    when it is not an object."""
    if not isinstance(content, dict):
        raise DialectError(f"content {i} is not an object")
    role = content.get("role")
    if role == "model":
        return [Slot(i, None, "model")]
    if role not in ("user", None):  # the API takes a missing role as user
        return [Slot(i, None, "other")]
    parts = _parts(content)
    results = [j for j, p in enumerate(parts) if _has(p, "functionResponse")]
    out = [Slot(i, j, "result") for j in results]
    own = any(isinstance(p, dict) and not USER_PARTS.isdisjoint(p) for p in parts)
    if own or not results:
        out.append(Slot(i, None, "user"))
    return out


def slots(contents: list[Any]) -> list[Slot]:
    """The transcript positions of ``contents`` (module docstring), in order. Raises
    :class:`DialectError` when a content is not an object."""
    out: list[Slot] = []
    for i, content in enumerate(contents):
        out += content_slots(i, content)
    return out


def parts_text(parts: list[Any]) -> str:
    """The ``text`` of the parts that are not thoughts, joined by newlines."""
    return "\n".join(
        p["text"]
        for p in parts
        if isinstance(p, dict) and isinstance(p.get("text"), str) and p.get("thought") is not True
    )


def result_text(response: Any) -> tuple[str, bool | None]:
    """A ``functionResponse.response``'s text and failure flag (module docstring)."""
    if not isinstance(response, dict):
        return ("" if response is None else jsonbody.dumps(response).decode()), None
    failed = True if "error" in response and "output" not in response else None
    for key in _RESULT_TEXT:
        value = response.get(key)
        if isinstance(value, str):
            return value, failed
    return jsonbody.dumps(response, default=str).decode(), failed


def parse_request(body: Any) -> Transcript:
    """Build the transcript of a decoded ``generateContent`` request body (positions:
    :func:`slots`).

    Raises :class:`DialectError` when ``body`` is not an object, ``contents`` is not a list, or a
    content is not an object.
    """
    contents = history(body, ITEMS)  # first: it checks that body is an object
    return Fold(text_calls.offered_tools(body)).read(contents)


class Fold(FoldState):
    """The transcript of a content list read one content at a time: :func:`parse_request` is
    ``feed`` over every content then ``finish``; :meth:`copy` keeps the state after a prefix
    (:mod:`proxy.request.prefix_cache`). ``tools``: the request's ``functionDeclarations``
    (:func:`proxy.dialects.text_calls.offered_tools`), kept in the transcript (which agent is
    talking) and not read otherwise: Gemini calls are ``functionCall`` parts; ``tool_choice`` is
    taken as every dialect's fold takes it and not read."""

    __slots__ = ("positions",)
    EXTRA = ("positions",)

    def __init__(self, tools: Any = None) -> None:
        super().__init__(tools)
        self.positions = 0  # slots read so far (:func:`slots`)

    def finish(self, count: int, tool_choice: Any = None) -> Transcript:
        """The transcript of the contents fed (its positions are slots, so the count it keeps
        is theirs)."""
        return super().finish(self.positions)

    def feed(self, i: int, content: Any) -> None:
        """Read content ``i``. Raises :class:`DialectError` when it is not an object."""
        for slot in content_slots(i, content):
            pos = self.positions
            self.positions += 1
            self._slot(pos, slot, content)

    def _slot(self, pos: int, slot: Slot, content: dict[str, Any]) -> None:
        parts = _parts(content)
        if slot.kind == "model":
            text = parts_text(parts)
            if text.strip():
                self.texts.append(pos)
            calls = [p["functionCall"] for p in parts if _has(p, "functionCall")]
            self.said.append(Said(pos, "assistant", text, bool(calls)))
            if not calls:
                self.last_kind = "assistant"
                return
            self.new_step(pos)
            for call in calls:
                cid, name, args = call.get("id"), call.get("name"), call.get("args")
                self.new_call(
                    cid if isinstance(cid, str) else None,
                    name if isinstance(name, str) else "",
                    args,
                    parse_arguments(args if args is not None else {}),
                    pos,
                )
            self.last_kind = "step"
        elif slot.kind == "result":
            assert slot.part is not None
            answer = parts[slot.part]["functionResponse"]
            seq = self._pair(answer.get("id"), answer.get("name"))
            if seq is not None:
                text, failed = result_text(answer.get("response"))
                self.settle(seq, ToolResult(pos, text, failed))
            if self.last_kind != "step":
                self.last_kind = "other"
        elif slot.kind == "user":
            self.turn += 1
            self.users.append(pos)
            self.said.append(Said(pos, "user", parts_text(parts)))
            self.last_kind = "user"
        else:  # a role the API does not have: nothing the guards read, and it ends the step
            self.last_kind = "other"

    def _pair(self, cid: Any, name: Any) -> int | None:
        """The waiting call a ``functionResponse`` answers (module docstring), taken."""
        if isinstance(cid, str):
            seq = self.take(cid)
            if seq is not None:
                return seq
        if not self.steps:
            return None
        waiting = [s for s in self.steps[-1]["calls"] if self.waiting(s)]
        named = [s for s in waiting if self.calls[s]["name"] == name]
        for s in named or waiting:
            return self.take(self.calls[s]["call_id"], s)
        return None


def _text_part(text: str) -> dict[str, Any]:
    return {"text": text}


def _reminder(text: str) -> dict[str, Any]:
    return {"role": "user", "parts": [_text_part(text)]}


def apply(
    raw: bytes, actions: Sequence[Action], body: Any = None, spans: Sequence[tuple[int, int]] | None = None
) -> bytes | None:
    """Apply request-side actions to the body ``raw`` (a request :func:`parse_request` read; rules
    in the module docstring). ``body``: ``raw`` decoded, when the caller has it; ``spans``: the
    contents' byte spans, when known (:mod:`proxy.request.prefix_cache`). Returns the new body, or
    None when no action applies (a position that is no slot, a withhold of anything but a result,
    is ignored; :func:`proxy.dialects.edits.apply_slots`)."""
    return edits.apply_slots(raw, actions, body, _WIRE, spans)


def _plan(
    raw: bytes,
    layout: Sequence[Slot],
    withheld: dict[int, str],
    grouped: dict[int, list[Remind]],
    contents: list[Any],
    spans: Sequence[tuple[int, int]],
) -> list[tuple[int, edits.Edit]]:
    """The edits :func:`apply` makes, each with the slot it belongs to (an edit of a slot lies
    inside its content or at its end)."""

    def fields_of(i: int) -> dict[str, tuple[int, int]]:
        return jsonbody.members(raw, spans[i][0], contents[i])

    def response_of(slot: Slot) -> tuple[int, dict[str, tuple[int, int]], Any]:
        """The ``functionResponse`` object's start, its members and its decoded value."""
        assert slot.part is not None
        parts = contents[slot.content]["parts"]
        ps = jsonbody.items(raw, fields_of(slot.content)["parts"][0], parts)[slot.part][0]
        fs = jsonbody.members(raw, ps, parts[slot.part])["functionResponse"][0]
        decoded = parts[slot.part]["functionResponse"]
        return fs, jsonbody.members(raw, fs, decoded), decoded

    def suffix_member(slot: Slot) -> str | None:
        """The ``response`` string member a ``tool_suffix`` reminder is appended to, or None."""
        response = contents[slot.content]["parts"][slot.part]["functionResponse"].get("response")
        if isinstance(response, dict):
            return next((k for k in ("output", "error") if isinstance(response.get(k), str)), None)
        return None

    texts = {p: "\n\n".join(r.text for r in g) for p, g in grouped.items()}
    suffix = {
        p
        for p, g in grouped.items()
        if g[0].delivery == "tool_suffix" and layout[p].kind == "result" and suffix_member(layout[p])
    }
    out: list[tuple[int, edits.Edit]] = []
    for pos in sorted(withheld):
        fs, fields, _ = response_of(layout[pos])
        text = "\n\n".join(t for t in (withheld[pos], texts[pos] if pos in suffix else "") if t)
        denial = jsonbody.dumps({"error": text})
        span = fields.get("response")
        if span is not None:
            out.append((pos, (span[0], span[1], denial)))
        else:
            out.append((pos, (fs + 1, fs + 1, b'"response":' + denial + (b"," if fields else b""))))
    for pos, text in sorted(texts.items()):
        slot = layout[pos]
        if pos in suffix:
            if pos in withheld:
                continue  # merged into the denial above
            fs, fields, decoded = response_of(slot)
            rs = fields["response"][0]
            member = suffix_member(slot)
            assert member is not None
            vs, ve = jsonbody.members(raw, rs, decoded["response"])[member]
            out.append((pos, edits.append_text(raw, {member: (vs, ve)}, rs, member, _text_part(text))))
        elif slot.kind == "user":
            start, part = spans[slot.content][0], _text_part(text)
            out.append((pos, edits.append_text(raw, fields_of(slot.content), start, "parts", part)))
        else:  # after a result's content, a model content or another one: a user content after it
            end = spans[slot.content][1]
            out.append((pos, (end, end, b"," + jsonbody.dumps(_reminder(text)))))
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
    :func:`proxy.dialects.edits.apply_slots_kept`). A body whose contents are not a list or do not
    match ``spans`` is a full :func:`apply` that keeps nothing."""
    return edits.apply_slots_kept(raw, actions, body, _WIRE, spans, kept, cut)
