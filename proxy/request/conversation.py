"""Conversation key (DESIGN §4): which conversation a request belongs to.

Decisions never need it (they are a pure function of the history); stats, narration timing and
incident records do. Order: the first configured header present (default ``x-session-id``,
``session_id``, ``conversation_id``), else the body's ``prompt_cache_key``, else a fingerprint:
``fp-`` + the first 16 hex digits of SHA-256 over the first system/developer message (Responses:
``instructions``; Anthropic Messages: the top-level ``system``, a string or text blocks; Gemini:
``systemInstruction``'s text parts), the first user message (Gemini: its ``parts``) and the id of
the first tool call (a chat ``tool_calls`` entry, a Responses call item, a Messages ``tool_use``
block, a Gemini ``functionCall`` part: its ``id``, or the whole call when it has none). The history
is the chat or Messages ``messages``, the Responses ``input`` (items) or the Gemini ``contents``.
The same conversation keeps its key as it grows from its first tool call on; its first request
(no call yet) is keyed without the call id, and every later request's log line names that key
as ``opened_as`` (:func:`conversation_keys`).

A key a header or ``prompt_cache_key`` gives is used as its digest (:func:`key_digest`,
``id-<16 hex>``): an agent chooses that value and may send megabytes of it, and the key names
an entry in every per-conversation table (the state store, the prefix cache, the incident
de-duplication, Redis) and is written on every log line, so only its fixed-size digest is. The
digest is a plain SHA-256 (no per-process salt), so every replica computes the same one.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.dialects import jsonbody

#: The shape of a digest this module writes (``id-`` a given key's, ``fp-`` a fingerprint).
DIGEST = re.compile(r"(?:id|fp)-[0-9a-f]{16}")


def key_digest(value: str) -> str:
    """The fixed-size key (19 characters) of a conversation key an agent gave (a header,
    ``prompt_cache_key``, or the ``?conversation=`` of ``GET /loop-guard``): ``id-`` + the first
    16 hex digits of SHA-256 over its UTF-8 bytes; a value that already is a digest (an operator
    pasting the key from a log line) is itself.

    >>> key_digest("sess-1")
    'id-abe633f3a47a2758'
    >>> key_digest("id-abe633f3a47a2758")
    'id-abe633f3a47a2758'
    """
    if DIGEST.fullmatch(value):
        return value
    raw = value.encode("utf-8", "surrogatepass")
    return f"id-{hashlib.sha256(raw).hexdigest()[:16]}"


def _first(messages: list[Any], roles: tuple[str, ...]) -> Any:
    for m in messages:
        if isinstance(m, dict) and m.get("role") in roles:
            return m.get("content", m.get("parts"))  # Gemini contents hold parts
    return None


def _call_id(m: Any) -> tuple[bool, Any]:
    """(True, the id) when item ``m`` is where :func:`_first_call_id` stops, else (False, None)."""
    if not isinstance(m, dict):
        return False, None
    if isinstance(m.get("tool_calls"), list):  # chat: an assistant message's calls
        for tc in m["tool_calls"]:
            if isinstance(tc, dict):
                return True, tc.get("id")
    if m.get("type") in ("function_call", "custom_tool_call"):  # Responses: a call item
        return True, m.get("call_id")
    if m.get("role") == "assistant" and isinstance(m.get("content"), list):  # Messages: tool_use
        for block in m["content"]:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                return True, block.get("id")
    if m.get("role") == "model" and isinstance(m.get("parts"), list):  # Gemini: functionCall
        for part in m["parts"]:
            call = part.get("functionCall") if isinstance(part, dict) else None
            if isinstance(call, dict):
                return True, call.get("id", call)
    return False, None


def _first_call_id(messages: list[Any]) -> Any:
    for m in messages:
        found, cid = _call_id(m)
        if found:
            return cid
    return None


def fingerprint_items(items: list[Any]) -> list[Any]:
    """The items of a history that the fingerprint reads (:func:`conversation_key`): the first
    system/developer message, the first user message and the first item with a call id, in their
    order (each once). The key of a body whose history is replaced by them is the same, and so is
    ``fingerprint_items(fingerprint_items(a) + b)`` to ``fingerprint_items(a + b)``: the prefix
    cache keeps them instead of the old items (:mod:`proxy.request.prefix_cache`)."""
    system = user = call = False
    out: list[Any] = []
    for m in items:
        if not isinstance(m, dict):
            continue
        role = m.get("role")
        hit = False
        if not system and role in ("system", "developer"):
            system = hit = True
        if not user and role == "user":
            user = hit = True
        if not call and _call_id(m)[0]:
            call = hit = True
        if hit:
            out.append(m)
            if system and user and call:
                break
    return out


def _system_text(system: Any) -> str | None:
    """An Anthropic Messages ``system``: a string, or the texts of its blocks (their
    ``cache_control``, which agents move, left out); None when there is none."""
    if isinstance(system, str):
        return system
    if isinstance(system, dict):  # Gemini's systemInstruction: a content
        system = system.get("parts")
    if isinstance(system, list):
        return "\n".join(b["text"] for b in system if isinstance(b, dict) and isinstance(b.get("text"), str))
    return None


def conversation_key(headers: Mapping[str, str], body: Any, header_names: Sequence[str]) -> str:
    """Key of the conversation a request belongs to: ``id-<16 hex>`` (:func:`key_digest` of a
    header value or ``prompt_cache_key``), ``fp-<16 hex>``, or ``unknown``. ``headers`` must be
    case-insensitive (aiohttp's are)."""
    return conversation_keys(headers, body, header_names)[0]


def conversation_keys(
    headers: Mapping[str, str], body: Any, header_names: Sequence[str]
) -> tuple[str, str | None]:
    """(:func:`conversation_key`, ``opened_as``): for a fingerprint that reads a first tool call,
    the fingerprint the same conversation had before its first call (the same system and user
    message, no call id), which its first request was keyed by; else None. Two runs of one task
    open alike and part at their first call's id, so the key keeps the id (their stats and
    incidents stay apart) and the log says how the keys of the opening and the rest relate."""
    for name in header_names:
        value = headers.get(name)
        if value:
            return key_digest(value), None
    if isinstance(body, dict):
        pck = body.get("prompt_cache_key")
        if isinstance(pck, str) and pck:
            return key_digest(pck), None
        messages = body.get("messages")
        if "messages" not in body:
            messages = body.get("input", body.get("contents"))
            if isinstance(messages, str):  # Responses: one user message
                messages = [{"role": "user", "content": messages}]
        if isinstance(messages, list):
            instructions = body.get("instructions")
            if not isinstance(instructions, str):
                instructions = _system_text(body.get("system", body.get("systemInstruction")))
            parts = [
                instructions if instructions is not None else _first(messages, ("system", "developer")),
                _first(messages, ("user",)),
                _first_call_id(messages),
            ]
            return _fingerprints(parts)
    return "unknown", None


def _fingerprints(parts: list[Any]) -> tuple[str, str | None]:
    """The fingerprint of ``parts`` (system, user, first call id) and, when there is a call id,
    that of the same parts without it, from one serialization and one hash pass over the
    shared prefix (a coding agent's opening is tens of KiB)."""
    raw = jsonbody.dumps(parts, default=str)
    tail = b"," + jsonbody.dumps(parts[2], default=str) + b"]"
    if parts[2] is None or not raw.endswith(tail):
        opened = None
        if parts[2] is not None:  # a lone surrogate made the list ASCII-escaped: the slow way
            opened = f"fp-{hashlib.sha256(jsonbody.dumps([*parts[:2], None], default=str)).hexdigest()[:16]}"
        return f"fp-{hashlib.sha256(raw).hexdigest()[:16]}", opened
    prefix = hashlib.sha256(memoryview(raw)[: len(raw) - len(tail)])
    opening = prefix.copy()
    prefix.update(tail)
    opening.update(b",null]")
    return f"fp-{prefix.hexdigest()[:16]}", f"fp-{opening.hexdigest()[:16]}"
