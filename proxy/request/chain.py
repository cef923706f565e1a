"""The chain stage: the history a Responses request continues by ``previous_response_id``.

A stage of :func:`proxy.request.rewrite.decide_request` for ``POST /v1/responses`` only, between
locating the body and reading it. A request naming a ``previous_response_id`` carries only its
new items; the guards read the kept chain (:class:`proxy.request.response_store.Entry`) plus
them, and the edits are written over its own ``input`` (:mod:`proxy.request.edits`). An id the
store does not hold makes the request unguarded
(:data:`proxy.request.response_store.UNKNOWN_PREVIOUS`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.dialects import openai_responses
from proxy.request.response_store import Chain, Entry, chain_of


def reads_whole(previous: Callable[[str], Entry | None] | None) -> Callable[[dict[str, Any]], bool]:
    """The rule :func:`proxy.request.locate.locate` refuses a kept prefix found by bytes with: a
    request chained by ``previous_response_id`` (its kept chain is not in its bytes), or one the
    response store keeps (a store, and not ``store: false``: its chain holds every input item),
    is decoded whole. Codex CLI sends ``store: false``."""

    def whole(body: dict[str, Any]) -> bool:
        chained = openai_responses.previous_id(body) is not None
        return chained or (previous is not None and body.get("store") is not False)

    return whole


@dataclass(frozen=True, slots=True)
class Link:
    """A Responses request's place in its chain. ``previous``: its ``previous_response_id``
    (None: none); ``entry``: the kept chain it continues (None: not chained, or ``lost``: the id
    is not kept); ``history``: the body the guards read (the kept items then ``input``; None:
    the request's own); ``new``: its ``input`` items; ``keep``: not sent with ``store: false``."""

    previous: str | None = None
    entry: Entry | None = None
    lost: bool = False
    history: dict[str, Any] | None = None
    new: Sequence[Any] = ()
    keep: bool = False

    def chain(self, stored: bool) -> Chain | None:
        """What the answer is kept with (:func:`proxy.request.response_store.chain_of`; the lost
        chain when ``lost``); None when there is no store (``stored`` False)."""
        if self.lost:
            return Chain(previous=self.previous, lost=True)
        return chain_of(self.entry, self.new, self.previous, keep=self.keep) if stored else None


def link(body: dict[str, Any], previous: Callable[[str], Entry | None] | None) -> Link:
    """The :class:`Link` of a decoded Responses ``body``; ``previous(response_id)``: the response
    store's lookup (None: no store). Raises :class:`proxy.errors.DialectError` for an ``input``
    that is neither a string nor a list."""
    prev = openai_responses.previous_id(body)
    entry = previous(prev) if prev is not None and previous is not None else None
    if prev is not None and entry is None:
        return Link(prev, lost=True)
    new = openai_responses.input_items(body)
    history = None if entry is None else {**body, "input": [*entry.items(), *new]}
    return Link(prev, entry, False, history, new, body.get("store") is not False)
