"""A stop as the agent receives it, beyond the answer text (``stop.deliver``, DESIGN §6.4).

``deliver: answer`` (the default): the stop is the model's final answer, written by each wire's
encoder; a JSON answer also carries the header :data:`STOP_HEADER` (``x-loopguard-stop: denials``:
the stop's kind), which no client reads and a script can. A streamed answer's headers are sent
before its answer is decided, so it carries none: its trace is the incident record, the request's
log line and the text's first words, ``[loopguard] Stopped:``.

``deliver: error``: the stop is the upstream API's own error, so that an agent running unattended
exits non-zero. HTTP 400 with the body of an invalid request in the wire's own form, which each SDK
raises as an API error, with ``x-should-retry: false`` (which the SDKs honour before their own
rules) and :data:`STOP_HEADER`; a 429 or 500 would be retried for minutes, each retry reaching the
proxy again:

- chat completions and Responses: ``{"error": {"message", "type": "invalid_request_error",
  "param": null, "code": "loop_detected", "loopguard": {...}}}`` (the ``openai`` SDK's
  ``BadRequestError``, ``.code == "loop_detected"``);
- Anthropic Messages: ``{"type": "error", "error": {"type": "invalid_request_error", "message",
  "code": "loop_detected", "loopguard": {...}}}`` (the ``anthropic`` SDK's ``BadRequestError``);
- Gemini: ``{"error": {"code": 400, "message", "status": "INVALID_ARGUMENT", "details":
  [google.rpc.ErrorInfo {"reason": "LOOP_DETECTED", "domain": "loopguard", "metadata"}]}}``.

``loopguard`` (``metadata`` for Gemini) names the rule, the stop's kind (``denials``, ``cap``,
``monologue``, ``escalation``) and the tool; the message is the stop's text. When a streamed answer
had already sent bytes before it was stopped (a stream the relay judged could not be stopped,
:attr:`proxy.response.decide.StopJudge.possible`), the same error ends the stream as an event in
the wire's form (:func:`stop_event`) instead. No I/O here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson
from aiohttp import web

from proxy.core.actions import Action, Stop

#: The error code (OpenAI, Anthropic) of a stop delivered as an error.
LOOP_DETECTED = "loop_detected"
#: The header of a JSON answer that is a stop (``deliver: answer``): the stop's kind.
STOP_HEADER = "x-loopguard-stop"
#: The HTTP status of a stop delivered as an error: a client error, which agents do not retry.
STATUS = 400
#: Said on that error too: the ``openai`` and ``anthropic`` SDKs (and the agents built on them)
#: read ``x-should-retry`` before their own rules, so none retries it.
NO_RETRY = {"x-should-retry": "false"}


def enforced_stop(actions: Iterable[Action]) -> Stop | None:
    """The stop applied to this answer (not an observed one), or None."""
    return next((a for a in actions if isinstance(a, Stop) and not a.observed), None)


def _about(stop: Stop) -> dict[str, str]:
    return {"rule": stop.rule, "kind": stop.reason, "tool": stop.tool}


def _error(wire: str, stop: Stop) -> dict[str, Any]:
    """The error object of ``stop`` in ``wire``'s form (the ``error`` member of the body)."""
    if wire == "gemini":
        info = {
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": LOOP_DETECTED.upper(),
            "domain": "loopguard",
            "metadata": _about(stop),
        }
        return {"code": STATUS, "message": stop.text, "status": "INVALID_ARGUMENT", "details": [info]}
    if wire == "messages":
        return {
            "type": "invalid_request_error",
            "message": stop.text,
            "code": LOOP_DETECTED,
            "loopguard": _about(stop),
        }
    return {
        "message": stop.text,
        "type": "invalid_request_error",
        "param": None,
        "code": LOOP_DETECTED,
        "loopguard": _about(stop),
    }


def stop_body(wire: str, stop: Stop) -> bytes:
    """The JSON body of the HTTP 400 that delivers ``stop`` as an error on ``wire`` (``chat``,
    ``responses``, ``messages``, ``gemini``)."""
    if wire == "messages":
        return orjson.dumps({"type": "error", "error": _error(wire, stop)})
    return orjson.dumps({"error": _error(wire, stop)})


def stop_event(wire: str, stop: Stop, sequence: int | None = None) -> bytes:
    """The SSE event that ends a stream already under way with ``stop`` as an error:
    ``data: {"error": …}`` (chat completions, which the ``openai`` SDK raises as an ``APIError``;
    Gemini), an ``error`` event ``{"type": "error", "code", "message", "param"}`` (Responses;
    ``sequence``: its ``sequence_number``), an ``error`` event in Anthropic's form (Messages, which
    its SDK raises)."""
    error = _error(wire, stop)
    if wire == "responses":
        obj: dict[str, Any] = {"type": "error", "code": LOOP_DETECTED, "message": stop.text, "param": None}
        if sequence is not None:
            obj["sequence_number"] = sequence
        return b"event: error\ndata: " + orjson.dumps(obj) + b"\n\n"
    if wire == "messages":
        return b"event: error\ndata: " + orjson.dumps({"type": "error", "error": error}) + b"\n\n"
    return b"data: " + orjson.dumps({"error": error}) + b"\n\n"


def stop_response(wire: str, stop: Stop) -> web.Response:
    """The HTTP 400 that delivers ``stop`` as an error on ``wire`` (:func:`stop_body`), with
    ``x-should-retry: false`` and :data:`STOP_HEADER`."""
    return web.Response(
        status=STATUS,
        body=stop_body(wire, stop),
        content_type="application/json",
        headers={**NO_RETRY, STOP_HEADER: stop.reason or stop.rule},
    )
