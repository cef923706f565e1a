"""One scripted model over the three fake servers (:mod:`tests.helpers.fake_qwen_server` for Chat
Completions, :mod:`tests.helpers.fake_responses` for Responses, :mod:`tests.helpers.fake_messages` for
Anthropic
Messages), so an agent that speaks several wire formats (pi, Cline, Continue CLI) is driven by
the same script in each, and the same readers say what came back.

A script is a list of :class:`Call` / final-text steps; step ``n`` answers the ``n``-th request
that offers tools (requests without tools, such as opencode's title request, are side requests
answered with :data:`SIDE_TEXT` and do not advance the script). A step naming a tool or a
parameter the request does not offer is recorded in :attr:`ScriptedModel.errors` and answered
with text saying so, so a renamed tool in a new agent version fails the test instead of testing
nothing. After the last step the model answers the script's ``final`` text every time.

Readers (:func:`results`, :func:`reminders`, :func:`calls`) take one decoded request body in
any of the three formats and return what the history holds: every tool result's text in order,
loopguard's ``[loopguard]`` user texts, and the (name, arguments) of each call echoed back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.helpers import fake_messages, fake_responses
from tests.helpers.fake_qwen_server import Answer, FakeChat
from tests.helpers.fakes import tool_call

#: The wire formats: the ``/v1`` path each is posted to.
PATHS = {"chat": "/chat/completions", "responses": "/responses", "messages": "/messages"}
#: What a side request (no tools offered) gets.
SIDE_TEXT = "Reading a file"


@dataclass(frozen=True)
class Call:
    """One tool call the model makes: tool ``name`` with ``arguments``."""

    name: str
    arguments: dict[str, Any]


Step = Call | str


def offered_parameters(body: dict[str, Any], name: str) -> set[str] | None:
    """The parameter names of tool ``name`` in a request's ``tools`` in any of the three shapes
    (chat ``function.parameters``, Responses ``parameters``, Messages ``input_schema``); None
    when it is not offered."""
    for tool in body.get("tools") or []:
        fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        if fn.get("name") == name:
            schema = fn.get("parameters") or fn.get("input_schema") or {}
            return set(schema.get("properties") or {})
    return None


@dataclass
class ScriptedModel:
    """The script (``steps`` then ``final`` forever) answered on one ``wire``; ``fake`` is the
    wire's fake server (its ``bodies`` and answers), :attr:`bodies` the script's requests only."""

    wire: str
    steps: Sequence[Step]
    final: str = "Giving up."
    bodies: list[dict[str, Any]] = field(default_factory=list)
    side_bodies: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    fake: Any = None

    def __post_init__(self) -> None:
        if self.wire == "chat":
            self.fake = FakeChat(self._chat)
        elif self.wire == "responses":
            self.fake = fake_responses.FakeResponses(self._responses)
        elif self.wire == "messages":
            self.fake = fake_messages.FakeMessages(self._messages)
        else:
            raise ValueError(f"unknown wire {self.wire!r}")

    def step_for(self, body: dict[str, Any]) -> Step:
        """The step answering ``body``: a side text, the next script step, or ``final``."""
        if not body.get("tools"):
            self.side_bodies.append(body)
            return SIDE_TEXT
        n = len(self.bodies)
        self.bodies.append(body)
        step = self.steps[n] if n < len(self.steps) else self.final
        if isinstance(step, Call):
            params = offered_parameters(body, step.name)
            if params is None or not set(step.arguments) <= params:
                miss = f"tool {step.name} with parameters {sorted(step.arguments)} not offered"
                miss += f" (offered: {params})"
                self.errors.append(miss)
                return f"fake: {miss}"
        return step

    def _chat(self, n: int, body: dict[str, Any]) -> Answer:
        step = self.step_for(body)
        if isinstance(step, str):
            return Answer(content=step)
        return Answer(tool_calls=[tool_call(step.name, json.dumps(step.arguments))])

    def _responses(self, n: int, body: dict[str, Any]) -> list[dict[str, Any]]:
        step = self.step_for(body)
        if isinstance(step, str):
            return [fake_responses.message(step)]
        return [fake_responses.function_call(step.name, json.dumps(step.arguments))]

    def _messages(self, n: int, body: dict[str, Any]) -> list[dict[str, Any]]:
        step = self.step_for(body)
        if isinstance(step, str):
            return [fake_messages.text(step)]
        return [fake_messages.tool_use(step.name, step.arguments)]

    async def handle(self, request: web.Request, raw: bytes) -> web.StreamResponse:
        """A :data:`tests.helpers.fakes.Handler`: the wire's fake answers."""
        return await self.fake.handle(request, raw)

    def answers(self) -> list[bytes]:
        """The exact bytes of every answer the fake sent, in order (side requests included)."""
        return list(self.fake.answers)


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [p.get("text", "") for p in content if isinstance(p, dict) and "text" in p]
    return []


def results(body: dict[str, Any]) -> list[str]:
    """The text of every tool result in the history, in order (chat ``tool`` messages,
    Responses ``function_call_output`` items, Messages ``tool_result`` blocks)."""
    out: list[str] = []
    for m in body.get("messages") or body.get("input") or []:
        if not isinstance(m, dict):
            continue
        if m.get("role") == "tool":
            out.append("".join(_texts(m.get("content"))))
        elif m.get("type") == "function_call_output":
            out.append("".join(_texts(m.get("output"))))
        elif m.get("role") == "user" and isinstance(m.get("content"), list):
            out += [
                "".join(_texts(b.get("content")))
                for b in m["content"]
                if isinstance(b, dict) and b.get("type") == "tool_result"
            ]
    return out


def reminders(body: dict[str, Any]) -> list[str]:
    """The ``[loopguard]`` texts of user messages in the history (the reminders loopguard
    inserts), in order."""
    out: list[str] = []
    for m in body.get("messages") or body.get("input") or []:
        if isinstance(m, dict) and m.get("role") == "user":
            out += [t for t in _texts(m.get("content")) if t.startswith("[loopguard]")]
    return out


def calls(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The (name, arguments) of every call echoed back in the history."""
    out: list[tuple[str, dict[str, Any]]] = []
    for m in body.get("messages") or body.get("input") or []:
        if not isinstance(m, dict):
            continue
        for tc in m.get("tool_calls") or []:
            out.append((tc["function"]["name"], json.loads(tc["function"]["arguments"] or "{}")))
        if m.get("type") == "function_call":
            out.append((m["name"], json.loads(m["arguments"] or "{}")))
        if m.get("role") == "assistant" and isinstance(m.get("content"), list):
            out += [(b["name"], b["input"]) for b in m["content"] if b.get("type") == "tool_use"]
    return out
