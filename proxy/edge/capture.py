"""Capture of guarded requests for ``loopguard replay`` (config ``capture.*``).

One JSON line per guarded request (chat completions, and Responses requests that send their whole
``input``; a ``previous_response_id`` request is captured with ``"chained": true`` and no items,
and replay skips it)::

    {"v": 1, "time_ms": 1764590000000, "conversation": "<key>", "dialect": "chat",
     "contents": false, "messages": [...], "answer": {"content": ..., "tool_calls": [...]}}

``messages`` (chat) or ``input`` (Responses) is the history as the agent sent it (before
loopguard's edits); ``answer`` is the upstream's answer (what the model said, before a stop or a
cut: replay decides on it again), read from the bytes the response side reads (null when it
reads none: response side off, a compressed or non-200 answer, a Responses answer). Never
headers, credentials, the model name or sampling parameters: only the keys the guards read.

With ``contents: false`` (the default) no text leaves as written (:func:`redact_messages`):

- every string in a message or item other than the protocol's own fields (``role``, ``type``,
  ``name``, ids, ``status``) becomes :func:`digest` of it: equal texts give equal digests. A tool
  result's text is masked with ``progress.masks`` first (:func:`proxy.core.volatile.mask`), so two
  results the live run judged the same (a timestamp apart) have one digest, and digests contain
  nothing a mask matches (letters ``g``–``z`` only), so replay judges them the same too;
- a call's ``arguments`` keep their keys (``ignore_args`` drop keys by name) and every value
  (string, number) becomes the digest of its canonical JSON (:func:`redact_arguments`), so two
  calls have equal canonical arguments after redaction exactly when they had before; arguments
  that are not JSON become the digest of the string.

What a digest cannot keep: rules that read *inside* a text (failure patterns and rejection
texts in results, a shell command's program and files for ``progress.read_only_commands`` and
targets, echo-loop literals, degenerate text) see digests. Replaying a ``contents: false``
capture therefore gives the live actions for loops of equal calls and equal results (the exact
and windowed repeats, the circuit breaker's duplicates, cycles over equal arguments); capture
with ``contents: true`` to tune the rules that read texts.

Writing goes through :class:`logging.handlers.RotatingFileHandler` (``max_bytes``, ``backups``)
behind a :class:`logging.handlers.QueueListener` thread, so the event loop never touches the disk;
a failed write is counted (``write_errors``), handed to ``on_error`` (the server counts it as
``capture_write_errors`` and logs the first one as a ``capture_write_error`` warning) and never
reaches the request path.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import logging.handlers
import queue
import sys
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from proxy.config import CaptureConfig
from proxy.core.canonical import INVALID, parse_arguments
from proxy.core.volatile import Masks, mask

#: The capture format's version (``"v"``).
VERSION = 1
#: Keys whose string values are the protocol's, not content: kept as they are.
KEPT = frozenset(
    ("role", "type", "name", "id", "tool_call_id", "call_id", "status", "index", "object", "finish_reason")
)
#: The alphabet of a digest: no hex digit, no digit at all, so no ``progress.masks`` span matches.
_ALPHABET = "ghijklmnopqrstuvwxyz"
PREFIX = "digest:"


def digest(text: str) -> str:
    """``"digest:" + 16 letters`` from the SHA-256 of ``text`` (UTF-8; lone surrogates kept as
    ``surrogatepass``). Equal texts give equal digests; 20^16 ≈ 2^69 values."""
    h = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
    return PREFIX + "".join(_ALPHABET[b % 20] for b in h[:16])


def _leaf(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _leaf(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_leaf(v) for v in value]
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        value = int(value)  # as proxy.core.canonical normalizes it
    return digest(orjson.dumps(value, default=str).decode())


def redact_arguments(raw: Any) -> Any:
    """A call's ``arguments`` with every value digested and the keys kept (a JSON string in, a
    JSON string out; an already-decoded object stays one). Not JSON: the digest of the string."""
    parsed = parse_arguments(raw)
    if parsed is INVALID:
        return digest(str(raw))
    out = _leaf(parsed)
    return orjson.dumps(out).decode() if isinstance(raw, str) or raw is None else out


def _redact(value: Any, masks: Masks | None, key: str = "") -> Any:
    if isinstance(value, dict):
        return {
            k: (redact_arguments(v) if k == "arguments" else v if k in KEPT else _redact(v, masks, k))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_redact(v, masks, key) for v in value]
    if isinstance(value, str):
        return digest(mask(value, masks) if masks is not None else value)
    return value


def redact_messages(messages: Sequence[Any], masks: Masks) -> list[Any]:
    """Chat messages or Responses items with every text digested (tool results after masking
    with ``masks``) and every call's arguments redacted (:func:`redact_arguments`)."""
    out: list[Any] = []
    for m in messages:
        tool_result = isinstance(m, dict) and (
            m.get("role") in ("tool", "function") or m.get("type") == "function_call_output"
        )
        out.append(_redact(m, masks if tool_result else None))
    return out


def answer_of(body: bytes) -> dict[str, Any] | None:
    """``{"content", "tool_calls"}`` of a ``chat.completion`` body's first choice, else None."""
    try:
        obj = orjson.loads(body)
        msg = obj["choices"][0]["message"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return None
    if not isinstance(msg, dict):
        return None
    calls = []
    for tc in msg.get("tool_calls") or []:
        fn = tc.get("function") if isinstance(tc, dict) else None
        if isinstance(fn, dict):
            calls.append({"id": tc.get("id"), "name": fn.get("name"), "arguments": fn.get("arguments")})
    content = msg.get("content")
    return {"content": content if isinstance(content, str) else None, "tool_calls": calls}


def line(
    *,
    time_ms: int,
    conversation: str,
    dialect: str,
    body: Any,
    answer: dict[str, Any] | None,
    contents: bool,
    masks: Masks,
) -> bytes:
    """One capture line (with its newline) for a request ``body`` (the decoded JSON the agent
    sent) and the upstream's ``answer`` (:func:`answer_of`)."""
    out: dict[str, Any] = {
        "v": VERSION,
        "time_ms": time_ms,
        "conversation": conversation,
        "dialect": dialect,
        "contents": contents,
    }
    field = "input" if dialect == "responses" else "messages"
    items = body.get(field) if isinstance(body, dict) else None
    if dialect == "responses" and isinstance(body, dict) and body.get("previous_response_id"):
        out["chained"] = True
        items = None
    if isinstance(items, str):  # Responses: a plain-text input is one user message
        items = [{"role": "user", "content": items}]
    if isinstance(items, list):
        out[field] = items if contents else redact_messages(items, masks)
    if answer is not None:
        if not contents:
            answer = {
                "content": None if answer.get("content") is None else digest(str(answer["content"])),
                "tool_calls": [
                    {
                        "id": c.get("id"),
                        "name": c.get("name"),
                        "arguments": redact_arguments(c.get("arguments")),
                    }
                    for c in answer.get("tool_calls") or []
                ],
            }
        out["answer"] = answer
    return orjson.dumps(out) + b"\n"


class _Raw(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return str(record.msg)


class _Handler(logging.handlers.RotatingFileHandler):
    """The rotating file handler; a failed write (open, rotate, write) is counted and handed to
    ``on_error`` instead of printed (on the writer thread)."""

    write_errors = 0
    on_error: Callable[[BaseException | None], None] | None = None

    def handleError(self, record: logging.LogRecord) -> None:
        self.write_errors += 1
        if self.on_error is not None:
            with contextlib.suppress(Exception):  # the callback must never stop the writer
                self.on_error(sys.exc_info()[1])


class CaptureLog:
    """Writes capture lines to ``cfg.path`` with rotation, off the event loop. ``write(line)`` is
    cheap and never raises; ``close()`` drains and stops the writer thread. ``on_error(exc)`` is
    called on the writer thread for each line that could not be written (``exc``: the OSError,
    or None)."""

    __slots__ = ("_handler", "_listener", "_queue", "cfg")

    def __init__(
        self, cfg: CaptureConfig, on_error: Callable[[BaseException | None], None] | None = None
    ) -> None:
        self.cfg = cfg
        self._queue: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        self._handler = _Handler(
            cfg.path, maxBytes=cfg.max_bytes, backupCount=cfg.backups, encoding="utf-8", delay=True
        )
        self._handler.terminator = ""
        self._handler.on_error = on_error
        self._handler.setFormatter(_Raw())
        self._listener = logging.handlers.QueueListener(self._queue, self._handler)
        self._listener.start()

    @property
    def write_errors(self) -> int:
        return self._handler.write_errors

    def write(self, data: bytes) -> None:
        record = logging.LogRecord("loopguard.capture", logging.INFO, "", 0, data.decode(), None, None)
        self._queue.put(record)

    def close(self) -> None:
        self._listener.stop()
        self._handler.close()
