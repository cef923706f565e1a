"""Corpus gate harness: replay loop fixtures through the real server, black-box.

Each fixture (``tests/fixtures/loops/*.json``, schema in ``tests/fixtures/README.md``; the directory
is ``$LOOPGUARD_LOOP_FIXTURES`` when set) is replayed one assistant message at a time: the history
before assistant message *i* (with the fixture's ``tools``) is the request; message *i* is the fake
upstream's answer (a ``chat.completion`` JSON, or the same as SSE with ``stream=True``). A fresh
loopguard server (same code path as ``loopguard serve``) runs in front of the fake upstream for
each fixture, with the given config.

What the proxy did is observed from the outside only, and each action is counted at one call (the
strict reading: an action on the request side counts at the last call of the step it follows, since
the agent ran every call of that step before the model saw it; a cut counts at the first call the
agent did not get; a stop at the call it replaced):

- **request side** — what reached the upstream, compared with what was sent: a message that was not
  sent is a *reminder*, at the last call whose result precedes it (the last call of that step); a
  tool result whose content changed is a *withhold* at its own call, or a reminder appended to it
  (``tool_suffix`` delivery: the original content is a prefix of the new one; also text appended
  to a user message) at the last call of the step that result belongs to; a reminder appended to
  a denial text (``\n\n[loopguard]…`` after it) is a reminder too;
- **response side** — what the agent received, compared with message *i*: no tool calls any more
  is a *stop* at the first call of message *i*, fewer is a *cut* at the first call the agent did
  not get.

Every reminder text the model received is kept (:attr:`Replay.reminders`) with the position it
had in the agent's messages, so that its claims can be checked against the history before it.

Calls are numbered in conversation order from 1, counting every call of every assistant message.
The rule behind an observation is read from ``GET /loop-guard`` (``per_rule``: fresh actions) — a
name for the table, never part of a verdict.

The same replay runs in the Responses dialect (``dialect="responses"``, :class:`ResponsesWire`):
the fixture converted to input items posted to ``/v1/responses``, each answer a ``response``
object or its SSE events, and what reached the upstream read back as chat messages, so that the
reading above and the call numbers are the same; :func:`compare` lists the fixtures on which the
proxy acted differently in the two forms. Likewise in Anthropic Messages
(``dialect="messages"``, :class:`MessagesWire`) and the Gemini API (``dialect="gemini"``,
:class:`GeminiWire`).

Run ``python -m tests.helpers.corpus [--stream] [--config FILE] [--dialect responses | --compare]`` to
print the gate table (or the differences between the two dialects).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml
from aiohttp import web

from proxy.cli import replay as replay_files
from proxy.config import Config, ListenConfig, build
from proxy.edge.observe import configure_logging
from proxy.edge.serve import start
from tests.helpers import gemini_contents, messages_blocks, responses_items, text_form

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_FIXTURES = ROOT / "tests" / "fixtures" / "loops"
DEFAULT_CONFIG = ROOT / "config" / "loopguard.yaml"
#: The answer to the request after the fixture's last message.
FINAL_ANSWER: dict[str, Any] = {"role": "assistant", "content": "Done."}
#: Kinds of action that count as acting on a loop. A runaway cut counts: the calls it drops never
#: reach the agent (stronger than a reminder), and it is the only action possible inside one response.
ACTING = ("remind", "withhold", "stop", "cut")
#: Kinds of action that block (not tolerated on a ``legit`` fixture).
BLOCKING = ("withhold", "stop", "cut")


def fixture_dir() -> Path:
    env = os.environ.get("LOOPGUARD_LOOP_FIXTURES")
    return Path(env) if env else DEFAULT_FIXTURES


def load_fixtures(directory: Path | None = None) -> list[dict[str, Any]]:
    """Every ``*.json`` fixture of ``directory`` (default :func:`fixture_dir`), sorted by id
    (:func:`proxy.cli.replay.load_fixtures`, the loader ``loopguard replay`` uses)."""
    return replay_files.load_fixtures(directory or fixture_dir())


_id_key = replay_files.id_key


def default_config() -> dict[str, Any]:
    """The shipped default config file as a dict."""
    return yaml.safe_load(DEFAULT_CONFIG.read_text(encoding="utf-8")) or {}


@dataclass(frozen=True)
class Observation:
    """One thing the proxy did: ``kind`` (remind, withhold, stop, cut), the 1-based ``call`` it acts
    at, the replayed assistant message ``message`` (index into the fixture's messages), ``side``
    (``request`` or ``response``) and the ``rules`` seen acting in that exchange."""

    kind: str
    call: int
    message: int
    side: str
    rules: tuple[str, ...] = ()

    def describe(self) -> str:
        rules = "+".join(self.rules) or "?"
        return f"call {self.call} {rules} {self.kind}"


@dataclass(frozen=True)
class Reminder:
    """One reminder text the model received: ``text`` (one reminder: merged ones are split), the
    1-based ``call`` it counts at, the replayed assistant message ``message``, ``upto`` (the agent's
    messages before it: ``fixture["messages"][:upto]``, the message a text was appended to
    included, as the agent sent it) and the ``rules`` seen reminding in that exchange."""

    text: str
    call: int
    message: int
    upto: int
    rules: tuple[str, ...] = ()


@dataclass
class Replay:
    """A fixture's replay: every observation (first occurrence of each, in order of the calls) and
    every distinct reminder text received (first occurrence of each ``(upto, text)``)."""

    fixture: dict[str, Any]
    stream: bool
    observations: list[Observation] = field(default_factory=list)
    reminders: list[Reminder] = field(default_factory=list)
    requests: int = 0
    #: ``internal_errors`` of ``GET /loop-guard`` after the replay: the times the proxy failed open
    #: (a replay with any is no evidence of what the guards would do).
    internal_errors: int = 0
    #: The wire it was replayed in (:data:`WIRES`).
    dialect: str = "chat"

    @property
    def first(self) -> Observation | None:
        return min(self.observations, key=lambda o: (o.call, o.message), default=None)

    @property
    def calls(self) -> int:
        """Tool calls in the fixture (every call of every assistant message)."""
        return sum(map(len, call_numbers(self.fixture["messages"])[1]))

    def blocking(self) -> list[Observation]:
        return [o for o in self.observations if o.kind in BLOCKING]

    def first_of(self, kinds: Sequence[str]) -> Observation | None:
        """The earliest observation of one of ``kinds``."""
        return min(
            (o for o in self.observations if o.kind in kinds), key=lambda o: (o.call, o.message), default=None
        )


@dataclass(frozen=True)
class Verdict:
    ok: bool
    expected: str
    reason: str


def judge(replay: Replay) -> Verdict:
    """The gate's verdict on one replay."""
    fx = replay.fixture
    expect = fx.get("expect") or {}
    if fx.get("kind") == "legit":
        blocks = replay.blocking()
        if blocks:
            return Verdict(False, "no block", f"blocked: {blocks[0].describe()}")
        return Verdict(True, "no block", "ok")
    k = expect.get("intervene_by_call")
    if k is None:
        return Verdict(True, "-", "no call-based expectation")
    acted = [o for o in replay.observations if o.kind in ACTING]
    first = min((o.call for o in acted), default=None)
    if first is None:
        return Verdict(False, f"by call {k}", "never acted")
    if first > k:
        return Verdict(False, f"by call {k}", f"late (call {first})")
    return Verdict(True, f"by call {k}", "ok")


# --- the fake upstream --------------------------------------------------------------------------


def completion_body(message: dict[str, Any]) -> dict[str, Any]:
    msg = {k: v for k, v in message.items() if k in ("role", "content", "tool_calls", "function_call")}
    msg.setdefault("content", None)
    return {
        "id": "chatcmpl-corpus",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "corpus-model",
        "choices": [
            {"index": 0, "message": msg, "finish_reason": "tool_calls" if msg.get("tool_calls") else "stop"}
        ],
    }


def sse_body(message: dict[str, Any]) -> list[bytes]:
    base = {"id": "chatcmpl-corpus", "object": "chat.completion.chunk", "created": 1700000000, "model": "m"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return (
            b"data: "
            + orjson.dumps({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
            + b"\n\n"
        )

    calls = message.get("tool_calls") or []
    out = [chunk({"role": "assistant", "content": None if calls else ""})]
    content = _text(message.get("content"))  # text parts are streamed as their text
    if content:
        for i in range(0, len(content), 16):
            out.append(chunk({"content": content[i : i + 16]}))
    for idx, tc in enumerate(calls):
        fn = tc.get("function") or {}
        args = fn.get("arguments", "")
        args = args if isinstance(args, str) else orjson.dumps(args).decode()
        head = {
            "index": idx,
            "id": tc.get("id"),
            "type": "function",
            "function": {"name": fn.get("name"), "arguments": ""},
        }
        out.append(chunk({"tool_calls": [head]}))
        half = len(args) // 2
        for part in (args[:half], args[half:]):
            if part:
                out.append(chunk({"tool_calls": [{"index": idx, "function": {"arguments": part}}]}))
    fc = message.get("function_call")
    if not calls and isinstance(fc, dict):  # legacy single call
        args = fc.get("arguments", "")
        args = args if isinstance(args, str) else orjson.dumps(args).decode()
        out.append(chunk({"function_call": {"name": fc.get("name"), "arguments": args}}))
        out.append(chunk({}, "function_call"))
    else:
        out.append(chunk({}, "tool_calls" if calls else "stop"))
    out.append(b"data: [DONE]\n\n")
    return out


class FakeModel:
    """Answers every request with ``answer`` (a chat message, set before each request), or with
    ``reply`` when set (the body as bytes for a JSON answer, the events for SSE); records bodies."""

    def __init__(self) -> None:
        self.answer: dict[str, Any] = {}
        self.reply: bytes | list[bytes] | None = None
        self.received: list[dict[str, Any]] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.received.append(body)
        reply = self.reply
        if isinstance(reply, list) or (reply is None and body.get("stream")):  # Gemini: by the path
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for ev in reply if isinstance(reply, list) else sse_body(self.answer):
                await resp.write(ev)
            await resp.write_eof()
            return resp
        out = reply if isinstance(reply, bytes) else orjson.dumps(completion_body(self.answer))
        return web.Response(body=out, content_type="application/json")

    async def __aenter__(self) -> FakeModel:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


# --- comparing what was sent with what arrived ---------------------------------------------------


def call_numbers(messages: Sequence[dict[str, Any]]) -> tuple[dict[str, int], list[list[int]]]:
    """Per tool_call id its 1-based number, and per message the numbers of its calls."""
    by_id: dict[str, int] = {}
    per_message: list[list[int]] = []
    n = 0
    for m in messages:
        nums = []
        for tc in m.get("tool_calls") or []:
            n += 1
            nums.append(n)
            if isinstance(tc, dict) and isinstance(tc.get("id"), str):
                by_id.setdefault(tc["id"], n)
        if not nums and isinstance(m.get("function_call"), dict):  # legacy: one call, no id
            n += 1
            nums.append(n)
        per_message.append(nums)
    return by_id, per_message


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


@dataclass(frozen=True)
class Change:
    """One request-side change: ``kind`` (``remind`` or ``withhold``), the ``call`` it counts at,
    ``upto`` (the sent messages before it, the changed message included) and ``text`` (the
    reminder text, or a withheld result's new content)."""

    kind: str
    call: int
    upto: int
    text: str


#: Where one reminder starts inside a text that holds several (merged with a blank line) or
#: follows a denial text.
_REMINDER_START = re.compile(r"\n\n(?=\[loopguard\])")


def split_reminders(text: str) -> list[str]:
    """The reminders of one inserted or appended text (several for one step are merged)."""
    return [t for t in _REMINDER_START.split(text) if t]


def diff_request(
    sent: Sequence[dict[str, Any]],
    arrived: Sequence[dict[str, Any]],
    by_id: dict[str, int],
    per_message: list[list[int]],
) -> list[tuple[str, int]]:
    """(kind, call) for every change between ``sent`` and ``arrived`` (message lists)."""
    return [(c.kind, c.call) for c in request_changes(sent, arrived, by_id, per_message)]


def request_changes(
    sent: Sequence[dict[str, Any]],
    arrived: Sequence[dict[str, Any]],
    by_id: dict[str, int],
    per_message: list[list[int]],
) -> list[Change]:
    """Every change between ``sent`` and ``arrived`` (message lists), in order, with the call each
    counts at (the strict reading of the module docstring)."""
    out: list[Change] = []
    last_call = 0  # the last call whose result precedes the current position
    legacy = 0
    j = 0
    for k, m in enumerate(sent):
        while j < len(arrived) and arrived[j] != m and not _same_message(arrived[j], m):
            out.append(Change("remind", last_call, k, _text(arrived[j].get("content"))))  # not sent
            j += 1
        if j >= len(arrived):
            break
        a = arrived[j]
        j += 1
        role = m.get("role")
        own: int | None = None  # the call whose result ``m`` is
        if role == "tool":
            own = by_id.get(str(m.get("tool_call_id")))
        elif role == "function" and legacy:
            own = legacy
        step = next((nums for nums in per_message if own in nums), [own]) if own is not None else []
        if a != m:
            before, after = _text(m.get("content")), _text(a.get("content"))
            at = step[-1] if step else last_call  # a reminder after a step: its last call
            if after.startswith(before) and after != before:
                out.append(Change("remind", at, k + 1, after[len(before) :].lstrip("\n")))
            else:
                out.append(Change("withhold", own if own is not None else last_call, k + 1, after))
                parts = _REMINDER_START.split(after, maxsplit=1)
                if len(parts) == 2:  # a reminder appended to the denial
                    out.append(Change("remind", at, k + 1, parts[1]))
        if role == "assistant" and per_message[k] and not m.get("tool_calls"):
            legacy = per_message[k][0]  # a function_call: its result is the next function message
        if role == "function" and legacy:
            last_call = max(last_call, legacy)
        if role == "tool" and own is not None:
            # a reminder after a step's results counts at the last call of that step
            last_call = max(last_call, step[-1] if _last_result_of_step(sent, k, by_id, step) else own)
    while j < len(arrived):
        out.append(Change("remind", last_call, len(sent), _text(arrived[j].get("content"))))
        j += 1
    return out


def _last_result_of_step(
    sent: Sequence[dict[str, Any]], k: int, by_id: dict[str, int], step: list[int]
) -> bool:
    nxt = sent[k + 1] if k + 1 < len(sent) else None
    if nxt is None or nxt.get("role") not in ("tool", "function"):
        return True
    return by_id.get(str(nxt.get("tool_call_id"))) not in step


def _same_message(a: dict[str, Any], m: dict[str, Any]) -> bool:
    """``a`` is ``m`` with another content: the same tool result (denied, or with a text appended),
    or another message with a text appended (never an inserted message)."""
    if a.get("role") != m.get("role"):
        return False
    if {k: v for k, v in a.items() if k != "content"} != {k: v for k, v in m.items() if k != "content"}:
        return False
    if m.get("role") in ("tool", "function"):  # a result (a legacy function message has no id)
        return a.get("tool_call_id") == m.get("tool_call_id")
    before = _text(m.get("content"))
    return bool(before) and _text(a.get("content")).startswith(before)


def received_calls(raw: bytes, stream: bool) -> tuple[list[str | None], str]:
    """The tool-call ids (in order) and the text the agent received in one answer."""
    if not stream:
        obj = orjson.loads(raw)
        msg = obj["choices"][0]["message"]
        legacy = [None] if isinstance(msg.get("function_call"), dict) else []
        return [tc.get("id") for tc in msg.get("tool_calls") or []] or legacy, _text(msg.get("content"))
    calls: dict[int, str | None] = {}
    text: list[str] = []
    for line in raw.split(b"\n"):
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        try:
            obj = orjson.loads(line[6:])
        except orjson.JSONDecodeError:
            continue
        for choice in obj.get("choices") or []:
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                text.append(delta["content"])
            for tc in delta.get("tool_calls") or []:
                idx = tc.get("index", len(calls))
                if tc.get("id") or idx not in calls:
                    calls[idx] = tc.get("id") or calls.get(idx)
            if isinstance(delta.get("function_call"), dict):  # legacy: one call
                calls.setdefault(0, None)
    return [calls[i] for i in sorted(calls)], "".join(text)


# --- the wires: how a fixture is sent, answered and read back, per dialect ----------------------


class ChatWire:
    """Chat completions: the fixture's messages as they are."""

    name = "chat"
    path = "/v1/chat/completions"

    def __init__(self, fixture: dict[str, Any]) -> None:
        self.messages: list[dict[str, Any]] = fixture["messages"]
        self.tools = fixture.get("tools")

    def url_path(self, stream: bool) -> str:
        """The path (and query) the request is posted to."""
        return self.path

    def request(self, i: int, stream: bool) -> dict[str, Any]:
        """The agent's request before assistant message ``i``."""
        body: dict[str, Any] = {"model": "corpus-model", "messages": self.messages[:i], "stream": stream}
        if self.tools:
            body["tools"] = self.tools
        return body

    def answer(self, i: int, message: dict[str, Any], stream: bool) -> bytes | list[bytes]:
        """The upstream's answer ``message`` (assistant message ``i``, or the final answer)."""
        return sse_body(message) if stream else orjson.dumps(completion_body(message))

    def arrived(self, i: int, body: dict[str, Any]) -> list[dict[str, Any]]:
        """What reached the upstream for request ``i``, as chat messages."""
        return body.get("messages") or []

    def received(self, raw: bytes, stream: bool) -> tuple[list[str | None], str]:
        """The call ids and the text the agent received."""
        return received_calls(raw, stream)


class ResponsesWire(ChatWire):
    """The Responses API (``POST /v1/responses``): the fixture converted to input items
    (:func:`tests.helpers.responses_items.trace_items`), each answer a ``response`` object or its SSE
    events (function_call items after a message item for the text), and what reached the upstream
    read back as chat messages (:func:`tests.helpers.responses_items.back_to_messages`), so that the call
    numbers and the reading are the chat replay's."""

    name = "responses"
    path = "/v1/responses"

    def __init__(self, fixture: dict[str, Any]) -> None:
        super().__init__(fixture)
        self.traced = responses_items.trace_items(self.messages)

    def request(self, i: int, stream: bool) -> dict[str, Any]:
        body = self.traced.body(i, model="corpus-model", stream=stream)
        if self.tools:
            body["tools"] = responses_items.chat_tools(self.tools)
        return body

    def answer(self, i: int, message: dict[str, Any], stream: bool) -> bytes | list[bytes]:
        items = self.traced.of(i) if i < len(self.messages) else responses_items.trace_items([message]).items
        if stream:
            return responses_items.response_events(*responses_items.answer_output(items))
        return orjson.dumps(responses_items.answer_object(items))

    def arrived(self, i: int, body: dict[str, Any]) -> list[dict[str, Any]]:
        return responses_items.back_to_messages(self.messages, self.traced, i, body)

    def received(self, raw: bytes, stream: bool) -> tuple[list[str | None], str]:
        return responses_items.received_output(raw, stream)


class MessagesWire(ChatWire):
    """Anthropic Messages (``POST /v1/messages``): the fixture converted to Messages form
    (:func:`tests.helpers.messages_blocks.trace_blocks`: a run of tool messages is one user message of
    ``tool_result`` blocks), each answer a Messages ``message`` object or its SSE events, and what
    reached the upstream read back as chat messages (:func:`tests.helpers.messages_blocks.back_to_messages`),
    so that the call numbers and the reading are the chat replay's."""

    name = "messages"
    path = "/v1/messages"

    def __init__(self, fixture: dict[str, Any]) -> None:
        super().__init__(fixture)
        self.traced = messages_blocks.trace_blocks(self.messages)

    def request(self, i: int, stream: bool) -> dict[str, Any]:
        body = self.traced.body(i, model="corpus-model", stream=stream)
        if self.tools:
            body["tools"] = messages_blocks.chat_tools(self.tools)
        return body

    def answer(self, i: int, message: dict[str, Any], stream: bool) -> bytes | list[bytes]:
        converted = (
            self.traced.of(i)
            if i < len(self.messages)
            else messages_blocks.trace_blocks([message]).messages[0]
        )
        if stream:
            return messages_blocks.message_events(converted)
        return orjson.dumps(messages_blocks.message_object(converted))

    def arrived(self, i: int, body: dict[str, Any]) -> list[dict[str, Any]]:
        return messages_blocks.back_to_messages(self.messages, self.traced, i, body)

    def received(self, raw: bytes, stream: bool) -> tuple[list[str | None], str]:
        return messages_blocks.received_content(raw, stream)


class GeminiWire(ChatWire):
    """The Gemini API (``POST /v1beta/models/{model}:generateContent``, and
    ``:streamGenerateContent?alt=sse`` for SSE): the fixture converted to contents as Gemini CLI
    sends them (:func:`tests.helpers.gemini_contents.trace_contents`: calls without ids, results paired
    by name and order), each answer a ``GenerateContentResponse`` or its SSE events, and what
    reached the upstream read back as chat messages
    (:func:`tests.helpers.gemini_contents.back_to_messages`), so that the call numbers and the reading
    are the chat replay's."""

    name = "gemini"
    path = "/v1beta/models/corpus-model:generateContent"

    def __init__(self, fixture: dict[str, Any]) -> None:
        super().__init__(fixture)
        self.traced = gemini_contents.trace_contents(self.messages)

    def url_path(self, stream: bool) -> str:
        return "/v1beta/models/corpus-model:streamGenerateContent?alt=sse" if stream else self.path

    def request(self, i: int, stream: bool) -> dict[str, Any]:
        return self.traced.body(i, self.tools)

    def answer(self, i: int, message: dict[str, Any], stream: bool) -> bytes | list[bytes]:
        converted = self.traced.of(i) if i < len(self.messages) else message
        if stream:
            return gemini_contents.answer_events(converted)
        return orjson.dumps(gemini_contents.answer_object(converted))

    def arrived(self, i: int, body: dict[str, Any]) -> list[dict[str, Any]]:
        return gemini_contents.back_to_messages(self.messages, self.traced, i, body)

    def received(self, raw: bytes, stream: bool) -> tuple[list[str | None], str]:
        return gemini_contents.received_content(raw, stream)


class TextWire(ChatWire):
    """Chat completions with every call written as text (:mod:`tests.helpers.text_form`):
    ``form`` ``hermes`` or ``xml``, results as ``tool`` messages (``results = "tool"``) or as
    ``<tool_response>`` user messages (``"user"``); the answers are text too, and the agent
    receives them as structured calls (the proxy's repair, on by default)."""

    form = "hermes"
    results = "tool"

    def __init__(self, fixture: dict[str, Any]) -> None:
        super().__init__(fixture)
        self.text = text_form.TextForm(self.messages, self.form, self.results)

    def request(self, i: int, stream: bool) -> dict[str, Any]:
        return {**super().request(i, stream), "messages": self.text.before(i)}

    def answer(self, i: int, message: dict[str, Any], stream: bool) -> bytes | list[bytes]:
        return super().answer(i, text_form.as_text(self.form, message), stream)

    def arrived(self, i: int, body: dict[str, Any]) -> list[dict[str, Any]]:
        return self.text.back(i, body.get("messages") or [])


class HermesWire(TextWire):
    name = "hermes"


class XmlWire(TextWire):
    name = "xml"
    form = "xml"


class XmlUserWire(TextWire):
    name = "xml_user"
    form = "xml"
    results = "user"


#: The dialects a fixture can be replayed in (and the text forms of chat completions).
WIRES: dict[str, type[ChatWire]] = {
    "chat": ChatWire,
    "responses": ResponsesWire,
    "messages": MessagesWire,
    "gemini": GeminiWire,
    "hermes": HermesWire,
    "xml": XmlWire,
    "xml_user": XmlUserWire,
}


# --- the replay -----------------------------------------------------------------------------------


_ACTION_LINE = re.compile(r"^loopguard_actions_total\{([^}]*)\}\s+([0-9.e+]+)", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


async def _actions(session: aiohttp.ClientSession, proxy_url: str) -> Counter[tuple[str, str]]:
    """Fresh actions so far per (rule, kind), from ``GET /loop-guard/metrics`` (or, without it,
    per rule from ``GET /loop-guard`` with kind ``?``)."""
    async with session.get(f"{proxy_url}/loop-guard/metrics") as r:
        if r.status == 200:
            out: Counter[tuple[str, str]] = Counter()
            for labels, value in _ACTION_LINE.findall(await r.text()):
                d = dict(_LABEL.findall(labels))
                out[(d.get("rule", "?"), d.get("kind", "?"))] += int(float(value))
            return out
    async with session.get(f"{proxy_url}/loop-guard") as r:
        return Counter({(rule, "?"): n for rule, n in ((await r.json()).get("per_rule") or {}).items()})


def _rules_for(kind: str, delta: Counter[tuple[str, str]]) -> tuple[str, ...]:
    """The rules in ``delta`` that took an action of ``kind`` (any kind when none matches)."""
    kinds = {"remind": ("remind",), "withhold": ("withhold",), "stop": ("stop",), "cut": ("cut",)}[kind]
    rules = sorted({r for (r, k), n in delta.items() if n > 0 and k in kinds})
    return tuple(rules or sorted({r for (r, _), n in delta.items() if n > 0}))


async def replay(
    fixture: dict[str, Any],
    config: dict[str, Any] | None = None,
    stream: bool = False,
    dialect: str | type[ChatWire] = "chat",
    final: bool = True,
) -> Replay:
    """Replay ``fixture`` through a fresh proxy with ``config`` (a dict; None = the shipped default
    file), in ``dialect`` (:data:`WIRES`: ``chat``, ``responses`` or ``messages``; or a wire class,
    such as those of :mod:`tests.helpers.native_wires`). ``final``: after the last message, the
    request the agent
    would send next, answered with plain text (False: only the recorded answers). Returns every
    distinct observation and reminder text."""
    cfg = build(Config, default_config() if config is None else config)
    messages: list[dict[str, Any]] = fixture["messages"]
    wire = WIRES[dialect](fixture) if isinstance(dialect, str) else dialect(fixture)
    by_id, per_message = call_numbers(messages)
    result = Replay(fixture, stream, dialect=wire.name)
    seen: set[tuple[str, int]] = set()
    seen_texts: set[tuple[int, str]] = set()
    async with FakeModel() as model:
        cfg = dataclasses.replace(
            cfg,
            listen=ListenConfig(host="127.0.0.1", port=0),
            upstream=dataclasses.replace(cfg.upstream, url=model.url),
            admin_token=None,
        )
        runner, port = await start(cfg)
        proxy_url = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession(auto_decompress=True) as session:
                before = await _actions(session, proxy_url)
                # Each assistant message is an answer; after the last message comes the request the
                # agent would send next (the last results included), answered with plain text.
                answers = [(i, m) for i, m in enumerate(messages) if m.get("role") == "assistant" and i]
                if final:
                    answers.append((len(messages), FINAL_ANSWER))
                per_message.append([])

                async def post(i: int, answer: dict[str, Any]) -> bytes:
                    """Send request ``i`` as the agent; the fake model answers ``answer``."""
                    model.reply = wire.answer(i, answer, stream)
                    model.received.clear()
                    async with session.post(
                        f"{proxy_url}{wire.url_path(stream)}",
                        data=orjson.dumps(wire.request(i, stream)),
                        headers={"Content-Type": "application/json"},
                    ) as resp:
                        return await resp.read()

                for i, msg in answers:
                    raw = await post(i, msg)
                    result.requests += 1
                    found: list[tuple[str, int, str]] = []
                    texts: list[tuple[str, int, int]] = []  # (reminder text, call, upto)
                    if model.received:
                        arrived = wire.arrived(i, model.received[0])
                        for c in request_changes(messages[:i], arrived, by_id, per_message):
                            found.append((c.kind, c.call, "request"))
                            if c.kind == "remind":
                                texts += [(t, c.call, c.upto) for t in split_reminders(c.text)]
                    ids, text = wire.received(raw, stream)
                    nums = per_message[i]
                    if len(ids) < len(nums):
                        found.append(("stop" if not ids else "cut", nums[len(ids)], "response"))
                    elif len(text) < len(_text(msg.get("content"))):  # degenerate text cut (SSE)
                        found.append(
                            ("cut", nums[0] if nums else sum(map(len, per_message[:i])) + 1, "response")
                        )
                    new = [f for f in found if (f[0], f[1]) not in seen]
                    new_texts = [t for t in texts if (t[2], t[0]) not in seen_texts]
                    delta: Counter[tuple[str, str]] = Counter()
                    if new or new_texts:
                        wanted = {f[0] for f in new} | ({"remind"} if new_texts else set())
                        for _ in range(50):  # stats are recorded as the exchange ends
                            now = await _actions(session, proxy_url)
                            delta = now - before
                            if {k for (_, k) in delta} >= wanted:
                                break
                            await asyncio.sleep(0.01)
                    before = await _actions(session, proxy_url) if not delta else before + delta
                    for kind, call, side in new:
                        seen.add((kind, call))
                        result.observations.append(Observation(kind, call, i, side, _rules_for(kind, delta)))
                    for t, call, upto in new_texts:
                        seen_texts.add((upto, t))
                        result.reminders.append(Reminder(t, call, i, upto, _rules_for("remind", delta)))
                async with session.get(f"{proxy_url}/loop-guard") as r:
                    result.internal_errors = int((await r.json()).get("internal_errors") or 0)
        finally:
            await runner.cleanup()
    return result


async def replay_all(
    config: dict[str, Any] | None = None,
    stream: bool = False,
    directory: Path | None = None,
    dialect: str = "chat",
) -> list[Replay]:
    return [await replay(fx, config, stream, dialect) for fx in load_fixtures(directory)]


def row(r: Replay) -> tuple[str, ...]:
    """A replay's row of the gate table (:func:`table`)."""
    v = judge(r)
    first = r.first.describe() if r.first else "none"
    blocks = ", ".join(o.describe() for o in r.blocking()[:1]) or "-"
    return (
        str(r.fixture.get("id")),
        str(r.fixture.get("kind")),
        v.expected,
        first,
        blocks,
        "PASS" if v.ok else f"FAIL ({v.reason})",
    )


def outcome(r: Replay) -> str:
    """Everything a replay saw the proxy do, dialect aside: its table row (first action, first
    block, verdict), then every action as ``call rules kind``, and any internal error."""
    acts = "; ".join(o.describe() for o in sorted(r.observations, key=lambda o: (o.call, o.kind, o.message)))
    errors = f" | {r.internal_errors} internal errors" if r.internal_errors else ""
    return f"{' | '.join(row(r)[2:])} | all: {acts or 'none'}{errors}"


def compare(these: Sequence[Replay], those: Sequence[Replay]) -> list[str]:
    """Where two replays of the same fixtures (two dialects, say) differ, fixture by fixture: one
    entry per fixture whose :func:`outcome` differs (or that only one side replayed), both
    outcomes in it. Empty when the proxy acted alike in both."""
    left = {str(r.fixture.get("id")): r for r in these}
    right = {str(r.fixture.get("id")): r for r in those}
    out: list[str] = []
    for fid in sorted(left.keys() | right.keys(), key=_id_key):
        a, b = left.get(fid), right.get(fid)
        oa = outcome(a) if a else "not replayed"
        ob = outcome(b) if b else "not replayed"
        if oa != ob:
            na = a.dialect if a else "?"
            nb = b.dialect if b else "?"
            out.append(f"{fid}:\n  {na}: {oa}\n  {nb}: {ob}")
    return out


def table(replays: Sequence[Replay]) -> str:
    """The gate table: id, kind, expected, first action (call# + rule + kind), verdict."""
    rows = [("id", "kind", "expected", "first action", "blocks", "verdict")]
    rows += [row(r) for r in replays]
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tests.helpers.corpus", description=__doc__.splitlines()[0])
    ap.add_argument("--stream", action="store_true", help="replay with stream=true (SSE answers)")
    ap.add_argument("--config", help="config YAML (default: config/loopguard.yaml)")
    ap.add_argument(
        "--fixtures", help="fixture directory (default: $LOOPGUARD_LOOP_FIXTURES or tests/fixtures/loops)"
    )
    ap.add_argument(
        "--dialect", choices=sorted(WIRES), default="chat", help="the wire to replay in (default: chat)"
    )
    ap.add_argument(
        "--compare", action="store_true", help="replay in chat and in Responses form and list the differences"
    )
    args = ap.parse_args(argv)
    config = yaml.safe_load(Path(args.config).read_text(encoding="utf-8")) or {} if args.config else None
    directory = Path(args.fixtures) if args.fixtures else None
    configure_logging("warning")  # the per-request lines would drown the table
    if args.compare:
        chat = asyncio.run(replay_all(config, args.stream, directory, "chat"))
        responses = asyncio.run(replay_all(config, args.stream, directory, "responses"))
        print(f"chat:\n{table(chat)}\n\nresponses:\n{table(responses)}\n")
        differences = compare(chat, responses)
        print("\n".join(differences) or f"the same in both dialects ({len(chat)} fixtures)")
        return 1 if differences else 0
    replays = asyncio.run(replay_all(config, args.stream, directory, args.dialect))
    print(table(replays))
    return 0 if all(judge(r).ok for r in replays) else 1


if __name__ == "__main__":
    sys.exit(main())
