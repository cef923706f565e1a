"""Re-sample and fallback (``recovery.resample``, ``recovery.fallback``): the pure half.

When the upstream's answer repeats a call whose result this turn already had withheld, the edge
(:mod:`proxy.edge.recovery`) asks again instead of delivering it. This module decides, without
I/O, everything that question needs:

- **Trigger** (:func:`withheld_keys`, :func:`repeated`): the answer has a tool call whose key
  (name and canonical arguments, DESIGN §5, nothing ignored: :func:`proxy.response.decide.call_key`)
  equals the key of a call in the current turn whose result the request withheld (an applied
  :class:`~proxy.core.actions.Withhold`, fresh or re-derived, after
  :func:`proxy.response.decide.turn_start`: the results the stop judge counts as
  ``withheld``). An answer of text only never repeats. The guards would deny such a call again
  (it is the call they denied), so delivering it feeds the loop the denial did not break.
- **The answer's calls** (:func:`answer_calls`): read by the wire's own decoder, the JSON
  decider or the stream guard that the response side uses (:mod:`proxy.response.decide`,
  :mod:`~proxy.response.responses_stream`, :mod:`~proxy.response.messages_stream`,
  :mod:`~proxy.response.gemini_stream`), with a judge that only records what it is asked about
  (:class:`CallRecorder`), so the calls are exactly the ones the stop judge would read.
- **The request asked again** (:func:`resample_body`): the body loopguard sent upstream with the
  configured ``params`` set as top-level keys (Gemini: inside ``generationConfig``) and, with
  ``new_seed``, the attempt's seed (:func:`seed_for`) where the wire has one: chat completions
  ``seed``, Gemini ``generationConfig.seed``; the Responses API and Anthropic Messages have none.
- **The request to the fallback** (:func:`fallback_body`, :func:`fallback_path`): the same body,
  its model replaced when ``fallback.model`` is set (Gemini: the model in the path); the
  credential header of each wire (:data:`CREDENTIAL`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.config import Config
from proxy.core.actions import Action, Withhold
from proxy.core.canonical import canonical_arguments
from proxy.core.transcript import Transcript
from proxy.dialects import jsonbody
from proxy.response import gemini_stream, messages_stream
from proxy.response import responses_stream as responses_answer
from proxy.response.assemble import AssembledCall
from proxy.response.decide import call_key, decide_json, turn_start, without_cuts
from proxy.response.gemini_stream import GeminiArrayGuard, GeminiStreamGuard
from proxy.response.messages_stream import MessagesStreamGuard
from proxy.response.responses_stream import ResponsesStreamGuard
from proxy.response.stream_guard import FramedGuard, StreamGuard

#: The rules of the two interventions, as their actions name them.
RESAMPLE_RULE = "resample"
FALLBACK_RULE = "fallback"
#: Outcomes: an answer that does not repeat was delivered; every answer asked for repeated; the
#: upstream failed (a 4xx/5xx, a timeout, an answer that could not be read).
RECOVERED = "recovered"
REPEATED = "repeated"
ERROR = "error"

#: The credential header of each wire, and the prefix of its value.
CREDENTIAL = {
    "chat": ("Authorization", "Bearer "),
    "responses": ("Authorization", "Bearer "),
    "messages": ("x-api-key", ""),
    "gemini": ("x-goog-api-key", ""),
}

Key = tuple[str, str]


def withheld_keys(transcript: Transcript, actions: Sequence[Action]) -> frozenset[Key]:
    """The keys (name, canonical arguments) of the calls in the current turn whose results
    ``actions`` withheld and applied (observed withholds are not applied: not counted)."""
    start = turn_start(transcript)
    positions = {
        (a.position, a.part)
        for a in actions
        if isinstance(a, Withhold) and not a.observed and a.position > start
    }
    if not positions:
        return frozenset()
    keys = set()
    for call in transcript.calls:
        result = call.result
        if result is not None and (result.position, result.part) in positions:
            keys.add((call.name, canonical_arguments(call.arguments, call.arguments_raw)))
    return frozenset(keys)


def repeated(calls: Sequence[AssembledCall], keys: frozenset[Key]) -> AssembledCall | None:
    """The first of ``calls`` whose key is one of ``keys`` (a withheld call repeated), or None."""
    for call in calls:
        if call_key(call) in keys:
            return call
    return None


class CallRecorder:
    """A stop judge that stops nothing and records the calls it is asked about (every choice's,
    in order): how :func:`answer_calls` reads an answer with the response side's own decoders."""

    __slots__ = ("calls",)

    on_text_only = False
    possible = False
    action_shapes: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self.calls: list[AssembledCall] = []

    def __call__(self, calls: Sequence[AssembledCall], text: str = "") -> None:
        self.calls.extend(calls)


_STREAM_GUARDS: dict[str, type[FramedGuard]] = {
    "responses": ResponsesStreamGuard,
    "messages": MessagesStreamGuard,
    "gemini": GeminiStreamGuard,
    "gemini_array": GeminiArrayGuard,
}


def answer_calls(wire: str, sse: bool, raw: bytes, cfg: Config) -> list[AssembledCall] | None:
    """The tool calls of one whole answer on ``wire`` (``chat``, ``responses``, ``messages``,
    ``gemini``, ``gemini_array``): ``raw`` its body, an event stream (or Gemini's streamed array)
    when ``sse``. None when it cannot be read: not JSON, not an answer object, a stream that did
    not say how it ended or had an event too large to read. The runaway and degenerate-text cuts
    are not applied (every call counts)."""
    plain = without_cuts(cfg)
    spy = CallRecorder()
    if sse:
        guard: FramedGuard = (
            StreamGuard(plain, spy, None) if wire == "chat" else _STREAM_GUARDS[wire](plain, spy)  # type: ignore[arg-type]
        )
        guard.feed(raw)
        guard.finish()
        if not guard.complete or guard.unread is not None:
            return None
        return spy.calls
    try:
        obj = jsonbody.decode(raw)
    except jsonbody.Unreadable:
        return None
    if not isinstance(obj, dict):
        return None
    if wire == "responses":
        if not isinstance(obj.get("output"), list):
            return None
        responses_answer.decide_json_answer(raw, spy, plain)  # type: ignore[arg-type]
    elif wire == "messages":
        if not isinstance(obj.get("content"), list):
            return None
        messages_stream.decide_json(raw, spy, plain)  # type: ignore[arg-type]
    elif wire in ("gemini", "gemini_array"):
        if not isinstance(obj.get("candidates"), list):
            return None
        gemini_stream.decide_json_answer(raw, spy, plain)  # type: ignore[arg-type]
    else:
        if not isinstance(obj.get("choices"), list):
            return None
        decide_json(raw, spy, plain)  # type: ignore[arg-type]
    return spy.calls


def seed_for(body: bytes, attempt: int) -> int:
    """The seed of re-sample ``attempt`` (1, 2, …) of the request ``body`` (the bytes loopguard
    sent upstream): the first 31 bits of SHA-256 over ``b"loopguard-resample:"``, the attempt in
    decimal, ``b":"`` and the body. The same request asked again (a replay, a retry) gets the same
    seeds; it fits every server's seed type (a non-negative 32-bit integer)."""
    digest = hashlib.sha256(b"loopguard-resample:%d:" % attempt + body).digest()
    return int.from_bytes(digest[:4], "big") >> 1


def base_wire(wire: str) -> str:
    """The request's wire of an answer wire (Gemini's streamed array is a Gemini request)."""
    return "gemini" if wire == "gemini_array" else wire


def has_seed(wire: str) -> bool:
    """The wire's request has a sampling seed (chat completions, Gemini)."""
    return base_wire(wire) in ("chat", "gemini")


def resample_body(wire: str, body: bytes, params: Mapping[str, Any], seed: int | None) -> bytes | None:
    """``body`` (a JSON request object on ``wire``) with ``params`` set, and ``seed`` when given
    and the wire has one (it replaces any ``seed`` in ``params``): top-level keys, Gemini's inside
    ``generationConfig`` (created when absent). Keys already present keep their place, new ones
    follow. None when ``body`` is not a JSON object (or Gemini's ``generationConfig`` is not one)."""
    try:
        obj = jsonbody.decode(body)
    except jsonbody.Unreadable:
        return None
    if not isinstance(obj, dict):
        return None
    target: dict[str, Any] = obj
    if base_wire(wire) == "gemini":
        config = obj.setdefault("generationConfig", {})
        if not isinstance(config, dict):
            return None
        target = config
    target.update(params)
    if seed is not None and has_seed(wire):
        target["seed"] = seed
    return jsonbody.dumps(obj)


def fallback_body(wire: str, body: bytes, model: str) -> bytes | None:
    """``body`` for the fallback upstream: its ``model`` replaced by ``model`` (chat completions,
    Responses, Messages; Gemini names the model in the path, :func:`fallback_path`); ``body`` as
    it is when ``model`` is empty or the wire is Gemini. None when it is not a JSON object."""
    if not model or base_wire(wire) == "gemini":
        return body
    try:
        obj = jsonbody.decode(body)
    except jsonbody.Unreadable:
        return None
    if not isinstance(obj, dict):
        return None
    obj["model"] = model
    return jsonbody.dumps(obj)


_GEMINI_MODEL = re.compile(r"(/models/)[^/:?]+(:)")


def fallback_path(wire: str, path: str, model: str) -> str:
    """The request target (path and query) for the fallback: a Gemini path's model
    (``…/models/<model>:generateContent``) replaced by ``model`` when set; others unchanged."""
    if not model or base_wire(wire) != "gemini":
        return path
    return _GEMINI_MODEL.sub(lambda m: m.group(1) + model + m.group(2), path, count=1)
