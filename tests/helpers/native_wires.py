"""Native sessions on their own wire: a recorded Anthropic Messages, OpenAI Responses, Gemini API
or Chat Completions body replayed turn by turn, and read back as chat messages for the corpus
reading.

The sessions (``../shared/fixtures/realtraj-native`` and ``realtraj-native-more``, see their
READMEs) hold bodies as Claude Code, Codex, Gemini CLI and OpenCode send them.
:data:`NATIVE_HISTORY` gives, per dialect, the body member holding the conversation and the
function that reads it as chat messages (the form :func:`tests.helpers.corpus.request_changes` and
:mod:`tests.helpers.reminder_facts` read), mirroring how the proxy's dialects read it:

- Messages (:mod:`proxy.dialects.anthropic_messages`): an assistant message is one chat assistant
  message (``text`` blocks joined by newlines; ``tool_use`` blocks its ``tool_calls``, the
  arguments the ``input`` as JSON; ``thinking`` is not text); a user message is one ``tool``
  message per ``tool_result`` block (its text; ``"is_error": true`` kept as a member), then one
  ``user`` message for the user's own part when it has one (a string, or a text / image /
  document block, or no result at all); any other role a message of that role;
- Responses (:mod:`proxy.dialects.openai_responses`): a *turn* (a run of ``reasoning``, assistant
  ``message``, ``function_call`` and ``custom_tool_call`` items) is one chat assistant message
  (the messages' text joined by newlines, the calls its ``tool_calls``: a ``custom_tool_call``'s
  raw ``input`` is its arguments); a ``function_call_output`` / ``custom_tool_call_output`` a
  ``tool`` message; a ``message`` of another role one of that role; any other item
  (``web_search_call``, …) nothing;
- Gemini (:mod:`proxy.dialects.gemini`, :func:`trace_contents`): one chat message per slot of the
  dialect: a ``model`` content an assistant message (its text parts but thoughts joined by
  newlines, its ``functionCall`` parts the calls, ``args`` as JSON), a ``user`` content one
  ``tool`` message per ``functionResponse`` part (paired with a call as the dialect pairs it; a
  ``response`` with ``error`` and no ``output`` kept as ``"is_error": true``), then a ``user``
  message for its own part; another role a ``system`` message;
- Chat Completions (:func:`trace_chat`): the messages as they are.

The wires (:class:`MessagesNative`, :class:`ResponsesNative`, :class:`GeminiNative`,
:class:`ChatNative`, by dialect in :data:`NATIVE_WIRES`) are :class:`tests.helpers.corpus.ChatWire`
subclasses for :func:`tests.helpers.corpus.replay`: request *i* (chat assistant message *i*) is the
body cut just before that turn (Responses with ``store: false``, as Codex sends it; Gemini posted
to ``/v1beta/models/<model>:generateContent`` or ``:streamGenerateContent?alt=sse``, the model in
the path), the answer is the turn as recorded (:func:`tests.helpers.fake_messages.message_object` /
:func:`tests.helpers.fake_messages.sse_events`, :func:`tests.helpers.fake_responses.response_object` /
:func:`tests.helpers.fake_responses.sse_events`, :func:`tests.helpers.gemini_contents.answer_object` /
:func:`tests.helpers.gemini_contents.answer_events`, the corpus's chat completion), and what
reached the upstream is read back unit by unit (a ``tool_result`` block, a user's own part, an
item, a ``functionResponse`` part, a message): unchanged, the chat message it came from; changed,
that message with the new text; not sent (a reminder), a user message with its text.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.dialects import anthropic_messages as am
from proxy.dialects import gemini
from proxy.dialects import openai_responses as orsp
from tests.helpers import fake_messages, fake_responses, gemini_contents
from tests.helpers.corpus import ChatWire

Message = dict[str, Any]
#: Responses item types that make up an assistant turn (README of the sessions).
TURN_ITEMS = frozenset(("reasoning", "function_call", "custom_tool_call"))


def _is_turn_item(item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    kind = orsp.item_type(item)
    return kind in TURN_ITEMS or (kind == "message" and item.get("role") == "assistant")


def _call(cid: Any, name: Any, arguments: str) -> Message:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}


def _tool_message(block: dict[str, Any], text: str) -> Message:
    out: Message = {"role": "tool", "tool_call_id": block.get("tool_use_id") or block.get("call_id")}
    out["content"] = text
    if block.get("is_error") is True:
        out["is_error"] = True
    return out


# --- Messages --------------------------------------------------------------------------------------


def _own_blocks(content: Any) -> list[Any]:
    """The user's own part of a user message's content (every block but the results)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content if not am._is_result(b)] if isinstance(content, list) else []


def _has_own(content: Any) -> bool:
    if not isinstance(content, list):
        return True
    results = any(am._is_result(b) for b in content)
    own = any(isinstance(b, dict) and b.get("type") in am.USER_BLOCKS for b in content)
    return own or not results


def _messages_chat(m: dict[str, Any]) -> list[Message]:
    """The chat messages of one Messages message (module docstring)."""
    role = m.get("role")
    content = m.get("content")
    if role == "assistant":
        uses = (
            [b for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
            if isinstance(content, list)
            else []
        )
        out: Message = {"role": "assistant", "content": am.content_text(content)}
        if uses:
            out["tool_calls"] = [
                _call(u.get("id"), u.get("name"), json.dumps(u.get("input"), ensure_ascii=False))
                for u in uses
            ]
        return [out]
    if role != "user":
        return [{"role": role, "content": am.content_text(content)}]
    blocks = content if isinstance(content, list) else []
    msgs = [_tool_message(b, am.content_text(b.get("content"))) for b in blocks if am._is_result(b)]
    if _has_own(content):
        msgs.append({"role": "user", "content": am.content_text(content)})
    return msgs


@dataclass(frozen=True)
class Traced:
    """A native conversation and its chat form: ``chat`` the chat messages, ``units[j]`` the chat
    indexes native entry ``j`` (a message, or an item) became (empty for an item with none), and
    ``starts`` per chat assistant index the native index its turn starts at."""

    chat: list[Message]
    units: list[list[int]]
    starts: dict[int, int]


def trace_messages(messages: list[dict[str, Any]]) -> Traced:
    """A Messages ``messages`` list in chat form (module docstring)."""
    chat: list[Message] = []
    units: list[list[int]] = []
    starts: dict[int, int] = {}
    for j, m in enumerate(messages):
        got = _messages_chat(m)
        if m.get("role") == "assistant":
            starts[len(chat)] = j
        units.append(list(range(len(chat), len(chat) + len(got))))
        chat += got
    return Traced(chat, units, starts)


def _result_ids(m: Any) -> tuple[Any, ...]:
    content = m.get("content") if isinstance(m, dict) else None
    return (
        tuple(b.get("tool_use_id") for b in content if am._is_result(b)) if isinstance(content, list) else ()
    )


def _corresponds(a: Any, s: dict[str, Any]) -> bool:
    """Arrived message ``a`` is sent message ``s`` with edits (not a message the proxy inserted)."""
    if not isinstance(a, dict) or a.get("role") != s.get("role"):
        return False
    if s.get("role") != "user":
        return False
    ids = _result_ids(s)
    if ids:
        return _result_ids(a) == ids
    before = am.content_text(s.get("content"))
    return bool(before) and am.content_text(a.get("content")).startswith(before)


def _user_back(
    s: dict[str, Any], a: dict[str, Any], chat: list[Message], units: list[int]
) -> Iterator[Message]:
    """Chat messages for arrived user message ``a``, the sent ``s`` edited (module docstring)."""
    sent = s.get("content")
    arrived = a.get("content")
    blocks = arrived if isinstance(arrived, list) else [{"type": "text", "text": arrived}]
    results = {b.get("tool_use_id"): b for b in sent if am._is_result(b)} if isinstance(sent, list) else {}
    nth = (
        {b.get("tool_use_id"): k for k, b in enumerate(b for b in sent if am._is_result(b))}
        if results
        else {}
    )
    for b in blocks:
        if am._is_result(b) and b.get("tool_use_id") in results:
            orig = chat[units[nth[b.get("tool_use_id")]]]
            same = b == results[b.get("tool_use_id")]
            yield orig if same else {**orig, "content": am.content_text(b.get("content"))}
    own = _own_blocks(sent)
    others = [b for b in blocks if not am._is_result(b)]
    first = next((k for k, b in enumerate(others) if own and b == own[0]), None)
    if not _has_own(sent):
        first = len(others)
    elif first is None:  # the own part edited in place (a text appended to a string)
        first = 0
    for b in others[:first]:  # inserted after the results: reminders
        yield {"role": "user", "content": am.content_text([b])}
    if _has_own(sent):
        orig = chat[units[-1]]
        text = am.content_text(others[first:]) if isinstance(arrived, list) else am.content_text(arrived)
        yield orig if text == orig["content"] else {**orig, "content": text}


def messages_back(traced: Traced, sent: list[dict[str, Any]], arrived: list[Any]) -> list[Message]:
    """What reached the upstream (``arrived``, the sent ``messages`` after the proxy) as chat."""
    out: list[Message] = []
    s = 0
    for a in arrived:
        if s < len(sent) and a == sent[s]:
            out += [traced.chat[c] for c in traced.units[s]]
            s += 1
        elif s < len(sent) and _corresponds(a, sent[s]):
            out += list(_user_back(sent[s], a, traced.chat, traced.units[s]))
            s += 1
        else:  # a message that was not sent: a reminder
            content = a.get("content") if isinstance(a, dict) else None
            out.append({"role": "user", "content": am.content_text(content)})
    return out


# --- Responses -------------------------------------------------------------------------------------


def trace_items(items: list[Any]) -> Traced:
    """A Responses ``input`` list in chat form (module docstring)."""
    chat: list[Message] = []
    units: list[list[int]] = []
    starts: dict[int, int] = {}
    turn: Message | None = None
    for j, item in enumerate(items):
        kind = orsp.item_type(item) if isinstance(item, dict) else ""
        if _is_turn_item(item):
            if turn is None:
                turn = {"role": "assistant", "content": ""}
                starts[len(chat)] = j
                units.append([len(chat)])
                chat.append(turn)
            else:
                units.append([])
            if kind == "message":
                text = orsp.content_text(item.get("content"))
                turn["content"] = f"{turn['content']}\n{text}" if turn["content"] else text
            elif kind in orsp.CALL_TYPES:
                raw = item.get("arguments") if kind == "function_call" else item.get("input")
                turn.setdefault("tool_calls", []).append(_call(item.get("call_id"), item.get("name"), raw))
            continue
        turn = None
        got: list[Message] = []
        if kind in orsp.OUTPUT_TYPES:
            got = [_tool_message(item, orsp.content_text(item.get("output")))]
        elif kind == "message":
            got = [{"role": item.get("role"), "content": orsp.content_text(item.get("content"))}]
        units.append(list(range(len(chat), len(chat) + len(got))))
        chat += got
    return Traced(chat, units, starts)


def _item_corresponds(a: Any, s: dict[str, Any]) -> bool:
    if not isinstance(a, dict) or orsp.item_type(a) != orsp.item_type(s):
        return False
    if orsp.item_type(s) in orsp.OUTPUT_TYPES:
        return a.get("call_id") == s.get("call_id")
    if orsp.item_type(s) == "message" and a.get("role") == s.get("role"):
        before = orsp.content_text(s.get("content"))
        return bool(before) and orsp.content_text(a.get("content")).startswith(before)
    return False


def items_back(traced: Traced, sent: list[Any], arrived: list[Any]) -> list[Message]:
    """What reached the upstream (``arrived``, the sent ``input`` after the proxy) as chat."""
    out: list[Message] = []
    s = 0
    for a in arrived:
        if s < len(sent) and a == sent[s]:
            out += [traced.chat[c] for c in traced.units[s]]
            s += 1
        elif s < len(sent) and _item_corresponds(a, sent[s]):
            member = "output" if orsp.item_type(a) in orsp.OUTPUT_TYPES else "content"
            out += [{**traced.chat[c], "content": orsp.content_text(a.get(member))} for c in traced.units[s]]
            s += 1
        else:  # an item that was not sent: a reminder
            content = a.get("content") if isinstance(a, dict) else None
            out.append({"role": "user", "content": orsp.content_text(content)})
    return out


# --- the wires -------------------------------------------------------------------------------------


def _messages_received(raw: bytes, stream: bool) -> tuple[list[str | None], str]:
    """The ``tool_use`` ids and the text (text blocks joined by newlines) the agent received."""
    if not stream:
        content = orjson.loads(raw).get("content") or []
        ids = [b.get("id") for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
        return ids, am.content_text(content)
    ids: list[str | None] = []
    texts: dict[int, list[str]] = {}
    for ev in _sse(raw):
        block = ev.get("content_block") or {}
        if ev.get("type") == "content_block_start" and block.get("type") == "tool_use":
            ids.append(block.get("id"))
        elif ev.get("type") == "content_block_start" and block.get("type") == "text":
            texts.setdefault(int(ev.get("index", -1)), []).append(block.get("text") or "")
        elif ev.get("type") == "content_block_delta" and (ev.get("delta") or {}).get("type") == "text_delta":
            texts.setdefault(int(ev.get("index", -1)), []).append(ev["delta"].get("text", ""))
    return ids, "\n".join("".join(texts[k]) for k in sorted(texts))


def _responses_received(raw: bytes, stream: bool) -> tuple[list[str | None], str]:
    """The call ids (function and custom tool calls) and the text (messages' parts joined by
    newlines) the agent received; SSE: the ``response.output_item.done`` items (what Codex runs)."""
    if not stream:
        output = orjson.loads(raw).get("output") or []
    else:
        output = [
            ev["item"] for ev in _sse(raw) if ev.get("type") == "response.output_item.done" and ev.get("item")
        ]
    items = [o for o in output if isinstance(o, dict)]
    ids = [o.get("call_id") for o in items if o.get("type") in orsp.CALL_TYPES]
    texts = [orsp.content_text(o.get("content")) for o in items if o.get("type") == "message"]
    return ids, "\n".join(texts)


def _sse(raw: bytes) -> Iterator[dict[str, Any]]:
    for frame in raw.split(b"\n\n"):
        data = [line[5:].strip() for line in frame.split(b"\n") if line.startswith(b"data:")]
        if not data:
            continue
        try:
            ev = orjson.loads(b"\n".join(data))
        except orjson.JSONDecodeError:
            continue
        if isinstance(ev, dict):
            yield ev


def _frames(events: list[tuple[str, dict[str, Any]]]) -> list[bytes]:
    return [fake_messages.frame(etype, payload) for etype, payload in events]


class MessagesNative(ChatWire):
    """A Claude Code body (``fixture["native"]``: ``model``, ``system``, ``tools``, ``messages``)
    on ``POST /v1/messages``."""

    name = "messages-native"
    path = "/v1/messages"

    def __init__(self, fixture: dict[str, Any]) -> None:
        super().__init__(fixture)
        self.body: dict[str, Any] = fixture["native"]
        self.native: list[dict[str, Any]] = self.body.get("messages") or []
        self.traced = trace_messages(self.native)

    def request(self, i: int, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.body.get("model") or "claude", "max_tokens": 32000}
        if self.body.get("system") is not None:
            body["system"] = self.body["system"]
        if self.body.get("tools"):
            body["tools"] = self.body["tools"]
        body["messages"] = self.native[: self.traced.starts[i]]
        body["stream"] = stream
        return body

    def answer(self, i: int, message: dict[str, Any], stream: bool) -> bytes | list[bytes]:
        content = self.native[self.traced.starts[i]].get("content")
        blocks = [fake_messages.text(content)] if isinstance(content, str) else list(content or [])
        blocks = [{"signature": "", **b} if b.get("type") == "thinking" else b for b in blocks]
        model = str(self.body.get("model") or "claude")
        usage = (100, 10)
        if stream:
            return _frames(fake_messages.sse_events(f"msg_native_{i}", model, blocks, usage))
        return orjson.dumps(fake_messages.message_object(f"msg_native_{i}", model, blocks, usage))

    def arrived(self, i: int, body: dict[str, Any]) -> list[dict[str, Any]]:
        return messages_back(self.traced, self.native[: self.traced.starts[i]], body.get("messages") or [])

    def received(self, raw: bytes, stream: bool) -> tuple[list[str | None], str]:
        return _messages_received(raw, stream)


class ResponsesNative(ChatWire):
    """A Codex body (``fixture["native"]``: ``model``, ``instructions``, ``tools``, ``input``) on
    ``POST /v1/responses`` with ``store: false``."""

    name = "responses-native"
    path = "/v1/responses"

    def __init__(self, fixture: dict[str, Any]) -> None:
        super().__init__(fixture)
        self.body: dict[str, Any] = fixture["native"]
        self.native: list[Any] = self.body.get("input") or []
        self.traced = trace_items(self.native)

    def _end(self, start: int) -> int:
        end = start
        while end < len(self.native) and _is_turn_item(self.native[end]):
            end += 1
        return end

    def request(self, i: int, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.body.get("model") or "gpt-5"}
        if self.body.get("instructions") is not None:
            body["instructions"] = self.body["instructions"]
        body["input"] = self.native[: self.traced.starts[i]]
        if self.body.get("tools"):
            body["tools"] = self.body["tools"]
        body.update({"tool_choice": "auto", "parallel_tool_calls": True, "store": False, "stream": stream})
        return body

    def answer(self, i: int, message: dict[str, Any], stream: bool) -> bytes | list[bytes]:
        start = self.traced.starts[i]
        output = [
            _output_item(item, f"{start}_{n}") for n, item in enumerate(self.native[start : self._end(start)])
        ]
        body = self.request(i, stream)
        if stream:
            events = fake_responses.sse_events(f"resp_native_{i}", body, b"", output)
            return _frames(events)
        usage = fake_responses.usage_for(b"", output)
        return orjson.dumps(
            fake_responses.response_object(f"resp_native_{i}", body, output, "completed", usage)
        )

    def arrived(self, i: int, body: dict[str, Any]) -> list[dict[str, Any]]:
        items = body.get("input")
        return items_back(
            self.traced, self.native[: self.traced.starts[i]], items if isinstance(items, list) else []
        )

    def received(self, raw: bytes, stream: bool) -> tuple[list[str | None], str]:
        return _responses_received(raw, stream)


_PREFIX = {"function_call": "fc", "custom_tool_call": "ctc", "message": "msg", "reasoning": "rs"}


def _output_item(item: dict[str, Any], n: str) -> dict[str, Any]:
    """A recorded turn item as the server's output item: ``id`` and ``status`` as a server gives
    them when the recording has none (Codex keeps neither), a reasoning ``summary`` list."""
    kind = orsp.item_type(item)
    out = {"id": f"{_PREFIX.get(kind, 'it')}_native_{n}", "type": kind, **item}
    if kind != "reasoning":
        out.setdefault("status", "completed")
    else:
        out.setdefault("summary", [])
    if kind == "message":
        out["content"] = [
            {"annotations": [], **p, "text": p.get("text", "")} if isinstance(p, dict) else p
            for p in item.get("content") or []
        ]
    if kind == "function_call" and not isinstance(out.get("arguments"), str):
        out["arguments"] = json.dumps(out.get("arguments") or {})
    if kind == "custom_tool_call" and not isinstance(out.get("input"), str):
        out["input"] = ""
    return out


# --- Gemini API ------------------------------------------------------------------------------------


def _gemini_parts(content: Any) -> list[Any]:
    parts = content.get("parts") if isinstance(content, dict) else None
    return parts if isinstance(parts, list) else []


def _is_response(part: Any) -> bool:
    return isinstance(part, dict) and isinstance(part.get("functionResponse"), dict)


def _own_parts(parts: list[Any]) -> list[Any]:
    """The parts of a ``user`` content that are not results (the user's own part, when it has one)."""
    return [p for p in parts if not _is_response(p)]


def _has_own_part(parts: list[Any]) -> bool:
    own = any(isinstance(p, dict) and not gemini.USER_PARTS.isdisjoint(p) for p in parts)
    return own or not any(_is_response(p) for p in parts)


def trace_contents(contents: list[Any]) -> Traced:
    """A Gemini ``contents`` list in chat form (module docstring): one chat message per slot of
    :func:`proxy.dialects.gemini.slots`. A call without an ``id`` gets ``gemini-<content>-<n>``
    (the API sends none; Gemini CLI does), and each result the chat id of the call the dialect
    pairs it with (``id``, else name in the latest step, else the oldest waiting call there)."""
    chat: list[Message] = []
    units: list[list[int]] = []
    starts: dict[int, int] = {}
    waiting: list[tuple[str, str]] = []  # (chat id, name) of the latest step's calls without a result
    for j, content in enumerate(contents):
        role = content.get("role") if isinstance(content, dict) else None
        parts = _gemini_parts(content)
        got: list[Message] = []
        if role == "model":
            starts[len(chat)] = j
            msg: Message = {"role": "assistant", "content": gemini.parts_text(parts)}
            calls = [
                p["functionCall"]
                for p in parts
                if isinstance(p, dict) and isinstance(p.get("functionCall"), dict)
            ]
            if calls:
                waiting = []
                msg["tool_calls"] = []
                for n, fc in enumerate(calls):
                    cid = fc.get("id") if isinstance(fc.get("id"), str) else f"gemini-{j}-{n}"
                    name = fc.get("name") if isinstance(fc.get("name"), str) else ""
                    args = fc.get("args") if fc.get("args") is not None else {}
                    msg["tool_calls"].append(_call(cid, name, json.dumps(args, ensure_ascii=False)))
                    waiting.append((cid, name))
            got = [msg]
        elif role in ("user", None):
            for p in parts:
                if not _is_response(p):
                    continue
                answer = p["functionResponse"]
                text, failed = gemini.result_text(answer.get("response"))
                pick = [w for w in waiting if w[0] == answer.get("id")]
                pick = pick or [w for w in waiting if w[1] == answer.get("name")] or waiting[:1]
                if pick:
                    waiting.remove(pick[0])
                tm: Message = {"role": "tool", "tool_call_id": pick[0][0] if pick else None, "content": text}
                if failed:
                    tm["is_error"] = True
                got.append(tm)
            if _has_own_part(parts):
                got.append({"role": "user", "content": gemini.parts_text(_own_parts(parts))})
        else:  # a role the API does not have: a slot the guards do not read
            got = [{"role": "system", "content": gemini.parts_text(parts)}]
        units.append(list(range(len(chat), len(chat) + len(got))))
        chat += got
    return Traced(chat, units, starts)


def _responses_of(content: Any) -> list[Any]:
    return [
        (p["functionResponse"].get("id"), p["functionResponse"].get("name"))
        for p in _gemini_parts(content)
        if _is_response(p)
    ]


def _content_corresponds(a: Any, s: dict[str, Any]) -> bool:
    """Arrived content ``a`` is sent ``user`` content ``s`` with edits (not one the proxy inserted)."""
    if not isinstance(a, dict) or a.get("role") != s.get("role") or s.get("role") not in ("user", None):
        return False
    if _responses_of(s):
        return _responses_of(a) == _responses_of(s)
    before = gemini.parts_text(_gemini_parts(s))
    return bool(before) and gemini.parts_text(_gemini_parts(a)).startswith(before)


def contents_back(traced: Traced, sent: list[Any], arrived: list[Any]) -> list[Message]:
    """What reached the upstream (``arrived``, the sent ``contents`` after the proxy) as chat: a
    result whose ``response`` changed is its message with the new text; text parts added to a
    content holding the user's own part are appended to it; a text part added to a results
    content, or a content that was not sent, is a reminder (a user message with its text)."""
    out: list[Message] = []
    s = 0
    for a in arrived:
        if s < len(sent) and a == sent[s]:
            out += [traced.chat[c] for c in traced.units[s]]
            s += 1
        elif s < len(sent) and _content_corresponds(a, sent[s]):
            units = traced.units[s]
            parts = _gemini_parts(a)
            sent_parts = [p for p in _gemini_parts(sent[s]) if _is_response(p)]
            b = 0
            for p in parts:
                if _is_response(p):
                    orig = traced.chat[units[b]]
                    same = p == sent_parts[b]
                    text = gemini.result_text(p["functionResponse"].get("response"))[0]
                    out.append(orig if same else {**orig, "content": text})
                    b += 1
            if _has_own_part(_gemini_parts(sent[s])):
                orig = traced.chat[units[-1]]
                text = gemini.parts_text(_own_parts(parts))
                out.append(orig if text == orig["content"] else {**orig, "content": text})
            else:
                out += [{"role": "user", "content": gemini.parts_text([p])} for p in _own_parts(parts)]
            s += 1
        else:  # a content that was not sent: a reminder
            out.append({"role": "user", "content": gemini.parts_text(_gemini_parts(a))})
    return out


class GeminiNative(ChatWire):
    """A Gemini CLI body (``fixture["native"]``: ``model``, ``contents``, ``tools``, and
    ``systemInstruction`` / ``generationConfig`` when recorded) on ``POST
    /v1beta/models/<model>:generateContent``, or ``:streamGenerateContent?alt=sse`` for SSE (the
    model is in the path, not the body)."""

    name = "gemini-native"

    def __init__(self, fixture: dict[str, Any]) -> None:
        super().__init__(fixture)
        self.body: dict[str, Any] = fixture["native"]
        self.native: list[Any] = self.body.get("contents") or []
        self.traced = trace_contents(self.native)
        model = str(self.body.get("model") or "gemini")
        self.path = f"/v1beta/models/{model}:generateContent"

    def url_path(self, stream: bool) -> str:
        return (
            self.path.replace(":generateContent", ":streamGenerateContent?alt=sse") if stream else self.path
        )

    def request(self, i: int, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"contents": self.native[: self.traced.starts[i]]}
        for member in ("systemInstruction", "tools", "toolConfig", "generationConfig"):
            if self.body.get(member) is not None:
                body[member] = self.body[member]
        return body

    def answer(self, i: int, message: dict[str, Any], stream: bool) -> bytes | list[bytes]:
        content = self.native[self.traced.starts[i]]
        if stream:
            return gemini_contents.answer_events(content)
        return orjson.dumps(gemini_contents.answer_object(content))

    def arrived(self, i: int, body: dict[str, Any]) -> list[dict[str, Any]]:
        contents = body.get("contents")
        return contents_back(
            self.traced, self.native[: self.traced.starts[i]], contents if isinstance(contents, list) else []
        )

    def received(self, raw: bytes, stream: bool) -> tuple[list[str | None], str]:
        return gemini_contents.received_content(raw, stream)


# --- Chat Completions ------------------------------------------------------------------------------


def trace_chat(messages: list[Any]) -> Traced:
    """A Chat Completions ``messages`` list: its chat form is itself (one unit per message)."""
    chat = [m if isinstance(m, dict) else {"role": None, "content": m} for m in messages]
    starts = {k: k for k, m in enumerate(chat) if m.get("role") == "assistant"}
    return Traced(chat, [[k] for k in range(len(chat))], starts)


class ChatNative(ChatWire):
    """An OpenCode body (``fixture["native"]``: ``model``, ``messages``, ``tools``) on ``POST
    /v1/chat/completions``, as OpenCode sends it to an OpenAI-compatible provider; the answers
    and the reading back are the corpus's chat ones (:class:`tests.helpers.corpus.ChatWire`)."""

    name = "chat-native"

    def __init__(self, fixture: dict[str, Any]) -> None:
        super().__init__(fixture)
        self.body: dict[str, Any] = fixture["native"]
        self.tools = self.body.get("tools")

    def request(self, i: int, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.body.get("model") or "gpt-5", "messages": self.messages[:i]}
        if self.tools:
            body["tools"] = self.tools
        body["stream"] = stream
        return body


#: The wire per ``dialect`` of a session file.
NATIVE_WIRES: dict[str, type[ChatWire]] = {
    "anthropic_messages": MessagesNative,
    "openai_responses": ResponsesNative,
    "gemini_generate_content": GeminiNative,
    "openai_chat": ChatNative,
}
#: Per ``dialect``: the body member that holds the conversation, and how it reads as chat.
NATIVE_HISTORY: dict[str, tuple[str, Any]] = {
    "anthropic_messages": ("messages", trace_messages),
    "openai_responses": ("input", trace_items),
    "gemini_generate_content": ("contents", trace_contents),
    "openai_chat": ("messages", trace_chat),
}
