"""Tool calls the model wrote as text, rewritten into structured calls.

A local server without (or with the wrong) tool parser sends a call as markup in the answer's
``content`` (:mod:`proxy.dialects.text_calls` says which markup). The agent then sees no call: it
stops, or tells the model it used no tool, and the model repeats itself. With
``response.repair_text_tool_calls`` (default on), a chat answer to a request that offered ``tools``,
that has no structured calls and whose content (a string) holds only complete, well-formed blocks
naming offered tools after its text, becomes what a server with the right parser sends:

- ``tool_calls``: one ``{"id", "type": "function", "function": {"name", "arguments"}}`` per block,
  in order, ``arguments`` the block's arguments as a compact JSON string;
- ``content``: the text before the first block, trailing whitespace removed; ``null`` when that is
  empty (what OpenAI and vLLM send for an answer that only calls tools);
- ``finish_reason``: ``"tool_calls"``.

Never repaired: an answer whose ``finish_reason`` is ``"length"`` or ``"content_filter"`` (it was
cut short: more calls or text may have followed, and relabelling it ``tool_calls`` would hide
that), an answer to a request with ``tool_choice: "none"`` (the agent asked for text), and, when
``tool_choice`` names one function, a call to any other tool.

The repaired calls then go through the same decisions as structured ones (runaway, stop judge).
Streams: :class:`proxy.response.stream_guard.StreamGuard` holds content from a possible opening
tag on and rewrites or releases it at the choice's finish. ``reasoning_content`` is never read.

Ids: ``call_lg`` + 24 hex digits of SHA-256 over the request body, the choice index and the
call's position. Deterministic (a retried request gets the same ids) and unique in a
conversation: a request's body never holds the ids made from it, and every later request's body
differs from it, so ids made for different requests differ (short of a hash collision).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from proxy.config import Config
from proxy.core.actions import Repair
from proxy.core.transcript import Transcript
from proxy.dialects.text_calls import Found, find_calls
from proxy.response.assemble import AssembledCall

RULE = "repair_text_tool_calls"
#: Upstream ``finish_reason`` values of an answer that was cut short: never repaired.
CUT_SHORT = frozenset(("length", "content_filter"))


class Repairer:
    """The repair for one request: its offered ``tools`` (name → parameters schema) and its body
    (the seed of the ids)."""

    __slots__ = ("_digest", "_seed", "tools")

    def __init__(self, tools: Mapping[str, Any], seed: bytes) -> None:
        self.tools = tools
        self._seed = seed
        self._digest: bytes | None = None

    def call_id(self, choice: int, k: int) -> str:
        """The id of the ``k``-th repaired call of choice ``choice`` (module docstring)."""
        if self._digest is None:
            self._digest = hashlib.sha256(self._seed).digest()
        tail = hashlib.sha256(self._digest + f"/{choice}/{k}".encode()).hexdigest()[:24]
        return f"call_lg{tail}"

    def calls(self, text: str, choice: int) -> tuple[Found, list[AssembledCall]] | None:
        """The calls written in ``text`` (an answer's content), as assembled calls with their
        ids, or None when it holds none that repair takes."""
        found = find_calls(text, self.tools)
        if found is None:
            return None
        out = [
            AssembledCall(
                id=self.call_id(choice, k),
                name=c.name,
                arguments=json.dumps(c.arguments, ensure_ascii=False, separators=(",", ":")),
                index=k,
            )
            for k, c in enumerate(found.calls)
        ]
        return found, out

    @staticmethod
    def action(found: Found) -> Repair:
        forms = {c.form for c in found.calls}
        form = forms.pop() if len(forms) == 1 else "mixed"
        return Repair(rule=RULE, tool=found.calls[0].name, count=len(found.calls), reason=form)

    def message(self, msg: dict[str, Any], choice: int) -> Repair | None:
        """Rewrite a complete assistant ``message`` (no structured calls) in place; returns the
        action, or None (``msg`` untouched) when its content holds no calls repair takes."""
        content = msg.get("content")
        if not isinstance(content, str) or ("<tool_call>" not in content and "<function=" not in content):
            return None
        got = self.calls(content, choice)
        if got is None:
            return None
        found, calls = got
        text = found.text.rstrip()
        msg["content"] = text or None
        msg["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ]
        return self.action(found)


def allowed_tools(tools: Mapping[str, Any], tool_choice: Any) -> Mapping[str, Any] | None:
    """The tools an answer's text calls may name under the request's ``tool_choice``: all of
    ``tools`` (absent, ``"auto"``, ``"required"``, anything unknown), none for ``"none"``, only
    the named one for ``{"type": "function", "function": {"name": …}}`` (or the Responses API's
    flat ``{"type": "function", "name": …}``). None: nothing to repair."""
    if tool_choice == "none":
        return None
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        fn = tool_choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else tool_choice.get("name")
        if isinstance(name, str):
            return {name: tools[name]} if name in tools else None
    return tools


def for_request(cfg: Config, transcript: Transcript | None, body: bytes) -> Repairer | None:
    """The repair for a chat request: None when it is off, the request offered no tools, or its
    ``tool_choice`` allows none (:func:`allowed_tools`)."""
    if not cfg.response.repair_text_tool_calls or transcript is None or not transcript.tools:
        return None
    tools = allowed_tools(transcript.tools, transcript.tool_choice)
    return Repairer(tools, body) if tools else None
