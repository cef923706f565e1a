"""Chat messages in Gemini API form, and back: the corpus gate's Gemini replay
(:class:`tests.helpers.corpus.GeminiWire`) and the dialect's tests.

:func:`trace_contents` converts a chat conversation so that every chat message is one transcript
position of :mod:`proxy.dialects.gemini` (its *slots*), in the same order, in the form Gemini CLI
sends:

- the first system / developer message, when nothing but other system messages comes before it,
  becomes ``systemInstruction``; later ones stay contents of their role (no slot the guards read);
- a user message is a ``user`` content, its text as one ``text`` part;
- an assistant message is a ``model`` content: a ``text`` part for its text, then one
  ``functionCall`` part per call (``name``, ``args``: the decoded arguments object, ``{}`` for
  none; no ``id``, as the API sends none); the legacy ``function_call`` is a call too;
- a run of ``tool`` / ``function`` messages is one ``user`` content of ``functionResponse`` parts
  (``id``: Gemini CLI's own kind of id, ``{name}-lg-{n}``, which no call carries; ``name``: the
  call's, paired as the chat dialect pairs it; ``response``: ``{"output": <text>}``).

:func:`back_to_messages` reads what reached the upstream back as chat messages: every unit (a
content, or a ``functionResponse`` part) that arrived unchanged is the message it came from, a
changed one that message with the unit's new text as content (a result: the text of its
``response``), a content that was not sent (a reminder) a user message with its text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from proxy.dialects.gemini import parts_text, result_text


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _args(arguments: Any) -> Any:
    """A chat call's arguments as ``functionCall.args``: the decoded object (a string that is not
    a JSON object stays the string: the fixture's own bytes, which the API would refuse)."""
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
class TracedContents:
    """A chat conversation in Gemini form. ``system``: the ``systemInstruction`` text (None
    without one) and ``system_from`` the chat index it came from. ``contents``: the Gemini
    contents; ``units[j]``: per content ``j`` the chat indexes it holds (one per
    ``functionResponse`` part of a results content, else one)."""

    system: str | None
    system_from: int | None
    contents: list[dict[str, Any]]
    units: list[list[int]]

    def before(self, i: int) -> list[dict[str, Any]]:
        """The contents of chat ``messages[:i]`` (a results content cut to its parts from those
        messages)."""
        out: list[dict[str, Any]] = []
        for c, units in zip(self.contents, self.units, strict=True):
            kept = [u for u in units if u < i]
            if not kept:
                break
            if len(kept) < len(units):
                out.append({**c, "parts": c["parts"][: len(kept)]})
                break
            out.append(c)
        return out

    def body(self, i: int, tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The ``generateContent`` request for chat ``messages[:i]``, as Gemini CLI orders it:
        ``contents``, ``systemInstruction`` when it was among them, ``tools``,
        ``generationConfig``."""
        body: dict[str, Any] = {"contents": self.before(i)}
        if self.system is not None and self.system_from is not None and self.system_from < i:
            body["systemInstruction"] = {"role": "user", "parts": [{"text": self.system}]}
        if tools:
            body["tools"] = chat_tools(tools)
        body["generationConfig"] = {"temperature": 0}
        return body

    def of(self, k: int) -> dict[str, Any]:
        """The content chat message ``k`` (an assistant message) became."""
        j = next(j for j, units in enumerate(self.units) if k in units)
        return self.contents[j]


def trace_contents(messages: list[dict[str, Any]]) -> TracedContents:
    """Convert chat ``messages`` to Gemini form (module docstring)."""
    system: str | None = None
    system_from: int | None = None
    out: list[dict[str, Any]] = []
    units: list[list[int]] = []
    pending: dict[str | None, list[str]] = {}  # chat id -> names of its waiting calls
    latest: list[tuple[str | None, str]] = []
    n = 0
    for k, m in enumerate(messages):
        role = m.get("role")
        content = m.get("content")
        if role in ("system", "developer") and system_from is None and not out:
            system, system_from = _text(content), k
        elif role == "user":
            out.append({"role": "user", "parts": [{"text": _text(content)}]})
            units.append([k])
        elif role == "assistant":
            calls = [tc for tc in m.get("tool_calls") or [] if isinstance(tc, dict)]
            entries = [(tc.get("id"), tc.get("function") or {}) for tc in calls]
            if not entries and isinstance(m.get("function_call"), dict):
                entries = [(None, m["function_call"])]
            text = _text(content)
            parts: list[dict[str, Any]] = [{"text": text}] if text else []
            if entries:
                latest = []
            for cid, fn in entries:
                fn = fn if isinstance(fn, dict) else {}
                name = fn.get("name") if isinstance(fn.get("name"), str) else ""
                parts.append({"functionCall": {"name": name, "args": _args(fn.get("arguments"))}})
                chat_id = cid if isinstance(cid, str) else None
                pending.setdefault(chat_id, []).append(name)
                latest.append((chat_id, name))
            out.append({"role": "model", "parts": parts})
            units.append([k])
        elif role in ("tool", "function"):
            cid = m.get("tool_call_id") if role == "tool" else None
            chat_id = cid if isinstance(cid, str) else None
            name = ""
            queue = pending.get(chat_id)
            if queue:
                name = queue.pop(0)
            elif chat_id is None or role == "function":
                for waiting_id, waiting_name in latest:
                    if waiting_name in pending.get(waiting_id, []):
                        pending[waiting_id].remove(waiting_name)
                        name = waiting_name
                        break
            n += 1
            answer = {"id": f"{name}-lg-{n}", "name": name, "response": {"output": _text(content)}}
            part = {"functionResponse": answer}
            prev = messages[k - 1].get("role") if k else None
            if prev in ("tool", "function") and out and units[-1][-1] == k - 1:
                out[-1]["parts"].append(part)
                units[-1].append(k)
            else:
                out.append({"role": "user", "parts": [part]})
                units.append([k])
        else:  # a role neither dialect reads: a content of that role
            out.append({"role": role, "parts": [{"text": _text(content)}]})
            units.append([k])
    return TracedContents(system, system_from, out, units)


def gemini_body(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The ``generateContent`` request body of a whole chat conversation."""
    return trace_contents(messages).body(len(messages), tools)


def _results(c: dict[str, Any]) -> bool:
    return c.get("role") == "user" and any(
        isinstance(p, dict) and "functionResponse" in p for p in c.get("parts") or []
    )


def _appended(s: dict[str, Any], a: dict[str, Any]) -> bool:
    """``a`` is the sent content ``s`` (not a results content) with a text appended."""
    if a.get("role") != s.get("role") or _results(a) or _results(s):
        return False
    before = parts_text(s.get("parts") or [])
    return bool(before) and parts_text(a.get("parts") or []).startswith(before)


def back_to_messages(
    messages: list[dict[str, Any]], traced: TracedContents, i: int, arrived: dict[str, Any]
) -> list[dict[str, Any]]:
    """What reached the upstream (``arrived``, the request :meth:`TracedContents.body` built for
    ``messages[:i]``, after the proxy) read back as chat messages (module docstring)."""
    sent = traced.before(i)
    units = [[u for u in us if u < i] for us in traced.units[: len(sent)]]
    out: list[dict[str, Any]] = []
    given = traced.system_from
    system = arrived.get("systemInstruction")
    same = isinstance(system, dict) and parts_text(system["parts"]) == traced.system
    if given is not None and given < i and same:
        out.append(messages[given])
    j = 0
    for a in arrived.get("contents") or []:
        if not isinstance(a, dict):
            continue
        s = sent[j] if j < len(sent) else None
        if s is not None and a == s:
            out += [messages[k] for k in units[j]]
            j += 1
        elif s is not None and _results(s) and _results(a):
            b = 0
            for part in a["parts"]:
                if b < len(s["parts"]) and isinstance(part, dict) and "functionResponse" in part:
                    k = units[j][b]
                    same = part == s["parts"][b]
                    text = result_text(part["functionResponse"].get("response"))[0]
                    out.append(messages[k] if same else {**messages[k], "content": text})
                    b += 1
                else:  # an inserted part: a reminder
                    out.append({"role": "user", "content": parts_text([part])})
            j += 1
        elif s is not None and _appended(s, a):
            k = units[j][0]
            out.append({**messages[k], "content": _joined(s, a)})
            j += 1
        else:  # a content that was not sent: a reminder
            out.append({"role": "user", "content": parts_text(a.get("parts") or [])})
    return out


def _joined(s: dict[str, Any], a: dict[str, Any]) -> str:
    """The text of ``a`` (``s`` with text parts appended) as chat would hold it: the parts after
    ``s``'s joined to its text by a blank line each."""
    n = len(s.get("parts") or [])
    added = [p.get("text", "") for p in a["parts"][n:] if isinstance(p, dict)]
    return "\n\n".join([parts_text(s["parts"]), *added])


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Chat ``tools`` as one Gemini tool of ``functionDeclarations`` (``parametersJsonSchema``,
    as Gemini CLI sends them)."""
    if not tools:
        return tools
    declarations = []
    for t in tools:
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict):
            schema = fn.get("parameters") or {"type": "object"}
            decl = {"name": fn.get("name"), "parametersJsonSchema": schema}
            if "description" in fn:
                decl["description"] = fn["description"]
            declarations.append(decl)
    return [{"functionDeclarations": declarations}]


# --- answers ------------------------------------------------------------------------------------


def _answer_parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A Gemini ``model`` content's parts, or a chat assistant message's converted."""
    if message.get("role") == "model":
        return list(message.get("parts") or [])
    return trace_contents([message]).contents[0]["parts"]


def answer_object(message: dict[str, Any]) -> dict[str, Any]:
    """The ``GenerateContentResponse`` (JSON) whose content is ``message``'s."""
    content = {"role": "model", "parts": _answer_parts(message)}
    return {
        "candidates": [{"content": content, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
        "modelVersion": "corpus-model",
        "responseId": "corpus-response",
    }


_BASE = {"modelVersion": "corpus-model", "responseId": "corpus-response"}


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\r\n\r\n"


def answer_events(message: dict[str, Any]) -> list[bytes]:
    """The same answer as ``alt=sse`` events, as Gemini streams it: the text in 16-character
    pieces, one event each, then one event per ``functionCall`` part; the last event carries
    ``finishReason`` and ``usageMetadata`` (an empty answer: one event with an empty text)."""
    pieces: list[dict[str, Any]] = []
    for part in _answer_parts(message):
        text = part.get("text") if isinstance(part, dict) else None
        if isinstance(text, str) and "functionCall" not in part:
            pieces += [{**part, "text": text[p : p + 16]} for p in range(0, len(text), 16)]
        else:
            pieces.append(part)
    if not pieces:
        pieces = [{"text": ""}]
    out = []
    for n, part in enumerate(pieces):
        cand: dict[str, Any] = {"content": {"role": "model", "parts": [part]}, "index": 0}
        obj: dict[str, Any] = {"candidates": [cand], **_BASE}
        if n == len(pieces) - 1:
            cand["finishReason"] = "STOP"
            obj["usageMetadata"] = {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15}
        out.append(_event(obj))
    return out


def received_content(raw: bytes, stream: bool) -> tuple[list[str | None], str]:
    """The ``functionCall`` ids (None without one), in order, and the text the agent received in
    one Gemini answer (JSON: the candidate's parts; SSE: every event's)."""
    objs: list[Any] = []
    if not stream:
        objs = [json.loads(raw)]
    else:
        for frame in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
            data = [line[5:].strip() for line in frame.split(b"\n") if line.startswith(b"data:")]
            if data:
                try:
                    objs.append(json.loads(b"\n".join(data)))
                except ValueError:
                    continue
    ids: list[str | None] = []
    text: list[str] = []
    for obj in objs:
        for cand in obj.get("candidates") or [] if isinstance(obj, dict) else []:
            for part in (cand.get("content") or {}).get("parts") or []:
                if isinstance(part.get("functionCall"), dict):
                    ids.append(part["functionCall"].get("id"))
                elif isinstance(part.get("text"), str) and part.get("thought") is not True:
                    text.append(part["text"])
    return ids, "".join(text)
