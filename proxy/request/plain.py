"""Nothing to guard: a request body in which no tool call, tool result or offered tool can be,
told from its bytes without decoding them.

Every guard reads tool calls (DESIGN §2.2: nothing blocks a conversation without any), so a body
that holds none is forwarded on the guards-off path: not decoded, no conversation key, no prefix
cache entry, no guard run (:func:`proxy.edge.server.proxy_handler`). The check is conservative:
it says "nothing to guard" only when none of :data:`MARKERS` occurs anywhere in the bytes, and
each marker is a piece of every spelling a call, a result or an offered tool has in a wire the
dialects read:

- ``tool``: chat ``tools`` / ``tool_calls`` / ``tool_choice`` / role ``tool``; Responses
  ``custom_tool_call*``; Messages ``tools`` / ``tool_use`` / ``tool_result`` (and the server and
  MCP kinds); calls written as text (:mod:`proxy.dialects.text_calls`: ``<tool_call>``,
  ``<tool_response>``);
- ``function``: chat ``functions`` / ``function_call`` / role ``function``; Responses
  ``function_call`` / ``function_call_output``; the ``<function=…>`` text form;
- three backticks and ``~~~``: a fence, which every action a harness writes as text needs
  (:mod:`proxy.dialects.text_actions`: mini-swe-agent's and SWE-agent's fenced actions;
  smolagents' ``Calling tools:`` has ``tool``);
- ``previous_response_id`` and ``item_reference``: Responses history loopguard may hold itself;
- ``\\u``: a JSON escape, which could spell any of the above with other bytes.

Responses items of other kinds (``local_shell_call``, ``mcp_call``, …) are not calls the
Responses dialect reads (:data:`proxy.dialects.openai_responses.CALL_TYPES`), so they are not
markers. A word in a message's text (a user asking about a "function") makes the body guarded as
before: the cost of a false "guard" is today's path, never a missed loop. The check costs one
substring search per marker (CPython's fast search; about 1 µs per KB of body for all of them).
"""

from __future__ import annotations

#: Byte strings whose presence anywhere in a body means it may hold something to guard.
MARKERS = (b"tool", b"function", b"```", b"~~~", b"previous_response_id", b"item_reference", b"\\u")


def nothing_to_guard(raw: bytes) -> bool:
    """True when ``raw`` (a request body, any dialect) holds none of :data:`MARKERS`: no tool call,
    tool result or offered tool can be in it. One substring search per marker, O(bytes)."""
    return not any(marker in raw for marker in MARKERS)
