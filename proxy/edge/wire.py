"""Which dialect guards a request, and which wire its answer is read on (from the method and the
path alone: known before the body is read)."""

from __future__ import annotations

from aiohttp import web

from proxy import dialects
from proxy.dialects import anthropic_messages, gemini, openai_chat, openai_responses


def dialect_of(request: web.Request) -> dialects.Dialect | None:
    """The dialect that guards this request (:data:`proxy.dialects.REGISTRY`), None = passthrough."""
    return dialects.for_path(request.path) if request.method == "POST" else None


def wire_of(request: web.Request) -> str | None:
    """The wire of the answer the response side reads (``chat``, ``responses``, ``messages``,
    ``gemini``, ``gemini_array``), or None. A Gemini ``:streamGenerateContent`` without
    ``alt=sse`` answers one JSON array that streams (``gemini_array``: its elements are read as
    the SSE form's events, :class:`proxy.response.gemini_stream.GeminiArrayGuard`)."""
    dialect = dialect_of(request)
    if dialect is openai_chat:
        return "chat"
    if dialect is anthropic_messages:
        return "messages"
    if dialect is gemini:
        streamed = gemini.is_stream(request.path)
        return "gemini" if not streamed or request.query.get("alt") == "sse" else "gemini_array"
    return "responses" if dialect is openai_responses else None
