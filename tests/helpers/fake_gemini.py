"""A scripted fake Gemini API server (``POST …/models/{model}:generateContent`` and
``:streamGenerateContent``) for agent harness tests (Gemini CLI through loopguard).

It answers as the API does (https://ai.google.dev/api/generate-content): ``:generateContent`` with
one ``GenerateContentResponse`` (JSON); ``:streamGenerateContent?alt=sse`` with SSE events
``data: <GenerateContentResponse>`` separated by CRLF CRLF (text in 16-character pieces, one event
each, then one event per ``functionCall``; the last event carries ``finishReason: "STOP"``, for
calls too, and ``usageMetadata``); ``:streamGenerateContent`` without ``alt=sse`` with the same
objects as one JSON array. ``:countTokens`` answers ``{"totalTokens": n}`` (about 4 bytes a
token). Any other path is a 404 in the API's error shape.

What it answers is a *script*: a function of the request number (0-based, counting the
generation requests that offer ``tools``) and the decoded body, returning the parts to send
(:func:`text` / :func:`call`). A generation request without ``tools`` (a side request: Gemini
CLI's model router, its loop check) gets :attr:`FakeGemini.side_text` and is not a step.

:meth:`FakeGemini.handle` is a handler for :class:`tests.helpers.fakes.FakeUpstream`. The fake keeps
every request it got (:attr:`FakeGemini.requests`: method, path with query, headers, raw body),
the exact bytes of its answer to each (:attr:`FakeGemini.answers`), the decoded bodies of the
script's requests (:attr:`FakeGemini.bodies`) and its answers alone (:attr:`FakeGemini.step_answers`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

Part = dict[str, Any]
Script = Callable[[int, dict[str, Any]], list[Part]]


def text(value: str) -> Part:
    """A ``text`` part."""
    return {"text": value}


def call(name: str, args: dict[str, Any]) -> Part:
    """A ``functionCall`` part, without ``id`` (the API sends none; Gemini CLI numbers its calls)."""
    return {"functionCall": {"name": name, "args": args}}


def fragments(name: str, path: str, pieces: list[str], end: bool = True) -> list[Part]:
    """One call as Vertex AI streams it: the name first, then one ``partialArgs`` string fragment
    per piece (all but the last say the string goes on), then an empty ``functionCall`` ends it."""
    parts: list[Part] = [{"functionCall": {"name": name, "willContinue": True}}]
    for i, piece in enumerate(pieces):
        more = i < len(pieces) - 1
        arg: dict[str, Any] = {"jsonPath": path, "stringValue": piece}
        if more:
            arg["willContinue"] = True
        parts.append({"functionCall": {"partialArgs": [arg], "willContinue": True}})
    if end:
        parts.append({"functionCall": {}})
    return parts


#: one write_file call in 40 fragments: its name, its path, 37 pieces of content, the end
WRITE_40 = [
    {"functionCall": {"name": "write_file", "willContinue": True}},
    {
        "functionCall": {
            "partialArgs": [{"jsonPath": "$.path", "stringValue": "app.py"}],
            "willContinue": True,
        }
    },
    *fragments("write_file", "$.content", [f"line {i}\n" for i in range(37)], end=True)[1:],
]


def _usage(raw: bytes, parts: list[Part]) -> dict[str, int]:
    prompt, out = max(1, len(raw) // 4), max(1, len(orjson.dumps(parts)) // 4)
    return {"promptTokenCount": prompt, "candidatesTokenCount": out, "totalTokenCount": prompt + out}


def response(parts: list[Part], usage: dict[str, int] | None = None, model: str = "gemini-2.5-pro") -> Part:
    """One ``GenerateContentResponse`` with one candidate holding ``parts``; ``usage`` (the
    ``usageMetadata``) only when given, ``finishReason: "STOP"`` then."""
    cand: Part = {"content": {"role": "model", "parts": parts}, "index": 0}
    obj: Part = {"candidates": [cand]}
    if usage is not None:
        cand["finishReason"] = "STOP"
        obj["usageMetadata"] = usage
    obj["modelVersion"] = model
    obj["responseId"] = "fake-response"
    return obj


def chunks(parts: list[Part], usage: dict[str, int]) -> list[Part]:
    """The streamed answer: text parts in 16-character pieces, one call per chunk, the last chunk
    with ``finishReason`` and ``usage``."""
    pieces: list[Part] = []
    for p in parts:
        if "text" in p and "functionCall" not in p:
            pieces += [{**p, "text": p["text"][i : i + 16]} for i in range(0, len(p["text"]), 16)]
        else:
            pieces.append(p)
    pieces = pieces or [text("")]
    return [response([p], usage if n == len(pieces) - 1 else None) for n, p in enumerate(pieces)]


@dataclass
class Received:
    """One request the fake got: method, path with query, headers, raw body."""

    method: str
    path_qs: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class FakeGemini:
    """The fake server's state (module docstring)."""

    script: Script
    side_text: str = '{"reasoning": "simple", "model_choice": "flash"}'
    requests: list[Received] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    side_bodies: list[dict[str, Any]] = field(default_factory=list)
    answers: list[bytes] = field(default_factory=list)
    step_answers: list[bytes] = field(default_factory=list)
    step_parts: list[list[Part]] = field(default_factory=list)

    def _json(self, index: int, data: bytes, status: int = 200) -> web.Response:
        self.answers[index] = data
        return web.Response(body=data, status=status, content_type="application/json")

    async def handle(self, request: web.Request, raw: bytes) -> web.StreamResponse:
        """Answer one request (a :data:`tests.helpers.fakes.Handler`)."""
        index = len(self.requests)
        self.requests.append(Received(request.method, request.raw_path, dict(request.headers), raw))
        self.answers.append(b"")
        path = request.path
        if request.method == "POST" and path.endswith(":countTokens"):
            return self._json(index, orjson.dumps({"totalTokens": max(1, len(raw) // 4)}))
        streamed = path.endswith(":streamGenerateContent")
        if request.method != "POST" or not (streamed or path.endswith(":generateContent")):
            error = {"code": 404, "message": f"Not found: {request.method} {path}", "status": "NOT_FOUND"}
            return self._json(index, orjson.dumps({"error": error}), status=404)
        body = orjson.loads(raw)
        side = "tools" not in body
        if side:
            self.side_bodies.append(body)
            parts = [text(self.side_text)]
        else:
            parts = self.script(len(self.bodies), body)
            self.bodies.append(body)
            self.step_parts.append(parts)
        usage = _usage(raw, parts)
        if not streamed:
            data = orjson.dumps(response(parts, usage))
        elif request.query.get("alt") != "sse":
            data = orjson.dumps(chunks(parts, usage))
        else:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            sent = bytearray()
            for obj in chunks(parts, usage):
                frame = b"data: " + orjson.dumps(obj) + b"\r\n\r\n"
                sent += frame
                await resp.write(frame)
            self.answers[index] = bytes(sent)
            if not side:
                self.step_answers.append(bytes(sent))
            await resp.write_eof()
            return resp
        if not side:
            self.step_answers.append(data)
        return self._json(index, data)
