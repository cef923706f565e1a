"""Wire dialects: read a request body into a :class:`proxy.transcript.Transcript` and write
actions back into it (DESIGN §2.1).

:data:`REGISTRY` maps request path suffixes to dialects: ``/chat/completions``
(:mod:`proxy.dialects.openai_chat`) and ``/responses`` (:mod:`proxy.dialects.openai_responses`;
its answers: :mod:`proxy.response.responses_stream`; its ``previous_response_id`` chains:
:mod:`proxy.request.response_store`). Every other path is plain passthrough.

Both read tool calls written as text in assistant messages (:mod:`proxy.dialects.text_calls`,
issue 13) as steps like structured ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from proxy.actions import Action
from proxy.dialects import openai_chat, openai_responses
from proxy.transcript import Transcript


class Dialect(Protocol):
    """What the request side needs of a dialect module."""

    PATH_SUFFIX: str

    def parse_request(self, body: Any) -> Transcript: ...

    def apply(self, raw: bytes, actions: Sequence[Action], body: Any = None) -> bytes | None: ...


#: In lookup order; the first whose ``PATH_SUFFIX`` ends the request path wins.
REGISTRY: tuple[Dialect, ...] = (openai_chat, openai_responses)  # type: ignore[assignment]


def for_path(path: str) -> Dialect | None:
    """The dialect for a request path (``/v1/responses``, ``/openai/v1/chat/completions``, …),
    or None for passthrough."""
    for dialect in REGISTRY:
        if path.endswith(dialect.PATH_SUFFIX):
            return dialect
    return None
