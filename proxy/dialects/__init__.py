"""Wire dialects: read a request body into a :class:`proxy.core.transcript.Transcript` and write
actions back into it (DESIGN §2.1).

:data:`REGISTRY` maps request path suffixes to dialects: ``/chat/completions``
(:mod:`proxy.dialects.openai_chat`), ``/responses`` (:mod:`proxy.dialects.openai_responses`;
its answers: :mod:`proxy.response.responses_stream`; its ``previous_response_id`` chains:
:mod:`proxy.request.response_store`), ``/v1/messages`` (:mod:`proxy.dialects.anthropic_messages`,
Anthropic Messages) and ``…/models/{model}:generateContent`` / ``:streamGenerateContent``
(:mod:`proxy.dialects.gemini`, the Gemini API; a dialect with a ``matches(path)`` function is
chosen by it instead of its suffix). Every other path is plain passthrough
(``/v1/messages/count_tokens``, ``:countTokens``, ``/v1/models``, …). The suffixes end in different
words, so at most one matches a path and the order of the registry does not matter; the query
string is never part of the path.

Chat and Responses read tool calls written as text in assistant messages
(:mod:`proxy.dialects.text_calls`) as steps like structured ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from proxy.core.actions import Action
from proxy.core.transcript import Transcript
from proxy.dialects import anthropic_messages, gemini, openai_chat, openai_responses


class Dialect(Protocol):
    """What the request side needs of a dialect module. ``ITEMS`` and ``Fold`` are for
    :mod:`proxy.request.prefix_cache`: a dialect without them is read in full on every request
    (and its ``apply`` is then called without ``spans``)."""

    PATH_SUFFIX: str
    #: the top-level member that holds the history
    ITEMS: str

    def parse_request(self, body: Any) -> Transcript: ...

    def apply(
        self,
        raw: bytes,
        actions: Sequence[Action],
        body: Any = None,
        spans: Sequence[tuple[int, int]] | None = None,
    ) -> bytes | None: ...

    #: ``Fold(tools)``: the transcript read one history item at a time, against the request's
    #: offered tools (:func:`proxy.dialects.text_calls.offered_tools`) (``feed(pos, item)``,
    #: ``copy()``, ``finish(count, tool_choice)``); ``parse_request`` folds over every item
    Fold: Callable[[Any], Any]


#: In lookup order; the first whose ``PATH_SUFFIX`` ends the request path wins.
REGISTRY: tuple[Dialect, ...] = (openai_chat, openai_responses, anthropic_messages, gemini)  # type: ignore[assignment]


#: ``for_path``'s memo: (the registry it was made for, path → dialect); at most
#: :data:`_PATHS_KEPT` paths (an agent sends a handful; every request asks two or three times).
_BY_PATH: tuple[tuple[Dialect, ...], dict[str, Dialect | None]] = ((), {})
_PATHS_KEPT = 256


def for_path(path: str) -> Dialect | None:
    """The dialect for a request path (``/v1/responses``, ``/openai/v1/chat/completions``,
    ``/v1/messages``, ``/v1beta/models/gemini-2.5-pro:streamGenerateContent``, …; aiohttp's
    ``request.path``, without the query), or None for passthrough. Memoized per path (for the
    :data:`REGISTRY` of the moment)."""
    global _BY_PATH
    registry, memo = _BY_PATH
    if registry is not REGISTRY or len(memo) >= _PATHS_KEPT:
        registry, memo = _BY_PATH = (REGISTRY, {})
    if path in memo:
        return memo[path]
    found = None
    for dialect in registry:
        matches = getattr(dialect, "matches", None)
        if matches(path) if matches is not None else path.endswith(dialect.PATH_SUFFIX):
            found = dialect
            break
    memo[path] = found
    return found
