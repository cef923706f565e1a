"""Read the new messages: the transcript of a located body, resuming a kept prefix's parse state.

The third stage of :func:`proxy.request.rewrite.decide_request`, after :mod:`proxy.request.locate`
(where the history is) and the cache lookup (the conversation's kept prefix,
:meth:`proxy.request.prefix_cache.PrefixCache.get`). An agent sends its whole history on every
step, each request the previous one plus one step: when the history starts with the kept
prefix's bytes (:func:`proxy.request.locate.point`), the kept parse state (the dialect's ``Fold``,
:mod:`proxy.dialects`) is copied and fed only the new items, and only those are spanned; else
the whole history is folded and spanned (:func:`proxy.dialects.jsonbody.items`). Both ways give
the same transcript and the same spans (``tests/unit/request/test_prefix_cache.py`` replays every
fixture both ways).

The :class:`Read` hands back what the next request needs, the entry to keep (:attr:`Read.entry`,
a :class:`proxy.request.prefix_cache.Prefix`), and whether it resumed; keeping it and counting
it are the keep stage's (:meth:`proxy.request.prefix_cache.PrefixCache.keep`). A body whose
history member is given twice, or is not a list, is read in full and nothing is kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.core.transcript import Transcript
from proxy.dialects import Dialect, jsonbody
from proxy.request.conversation import fingerprint_items
from proxy.request.locate import Located, Point, point
from proxy.request.prefix_cache import HEAD_BYTES, Prefix, Span, entry_size


@dataclass(frozen=True, slots=True)
class Read:
    """What :func:`read` found: the ``transcript``, the history items' byte ``spans`` (None: not
    known), and from the kept prefix it resumed the guards' ``checkpoint`` and the ``edits``
    (:attr:`Prefix.checkpoint`, :attr:`Prefix.edits`; None: a full read, or none kept).
    ``entry``: this request's history to keep (None: nothing to keep). ``hit``: it resumed a kept
    prefix (True), or read in full what it could have resumed (False), or neither (None: the
    cache off, no history list); ``fast``: the kept prefix was found by bytes
    (:class:`proxy.request.locate.Resume`)."""

    transcript: Transcript
    spans: list[Span] | None = None
    checkpoint: Any = None
    entry: Prefix | None = None
    edits: Any = None
    hit: bool | None = None
    fast: bool = False


def _feed(fold: Any, items: list[Any], first: int) -> Any:
    """Feed ``items`` (history positions ``first``…) to ``fold``; returns a copy of it taken
    before the last one (None when ``items`` is empty)."""
    before = None
    for pos, item in enumerate(items, first):
        if pos == first + len(items) - 1:
            before = fold.copy()
        fold.feed(pos, item)
    return before


def _entry(
    raw: bytes,
    start: int,
    spans: list[Span],
    fold: Any,
    offered: bytes,
    key_items: list[Any],
    before: Any = None,
    key_before: list[Any] | None = None,
    kept: tuple[tuple[Span, ...], int] | None = None,
) -> Prefix | None:
    """The entry of a history read (its items at ``spans``, ``start``: its ``[``), None when it
    has no item. ``before``/``key_before``: the parse state and fingerprint items after every
    item but the last. ``kept``: the relative spans of the first items as the resumed entry
    holds them, and how many (so only the new ones are shifted)."""
    if not spans:
        return None
    last = spans[-1][1]
    extra = start + sum(len(jsonbody.dumps(item, default=str)) for item in key_items)  # head, key items
    # A view of the body keeps all of it alive: kept only when the bytes outside the history
    # (its head again, and what follows it: a Messages ``system`` and ``tools``, ``metadata``,
    # a ``prompt_cache_key``) are at most the history's own, and then counted; else the history
    # is copied out (a copy the size of the history, and the body is freed with its request).
    outside = len(raw) - (last - start)
    view = type(raw) is bytes and outside <= last - start
    if view:
        extra += outside
    size = entry_size(last - start, len(fold.calls), len(spans), len(offered)) + extra
    digest = hash(raw[:HEAD_BYTES]) if last >= HEAD_BYTES else None
    if kept is not None:
        old, n = kept
        rel = old[:n] + tuple((s - start, e - start) for s, e in spans[n:])
    else:
        rel = tuple((s - start, e - start) for s, e in spans)
    items = memoryview(raw)[start:last] if view else bytes(raw[start:last])
    return Prefix(
        items,
        rel,
        fold,
        size,
        offered,
        None,
        raw[:start],
        tuple(key_items),
        digest,
        before=before if len(spans) > 1 else None,
        key_before=tuple(key_before or ()),
        absolute=tuple(spans),
    )


def _resumed(raw: bytes, located: Located) -> Read:
    """:func:`read` of a body found by bytes: the kept parse state fed the new items."""
    found = located.resume
    assert found is not None
    kept, start, at, new = found.entry, found.start, found.at, found.new
    n = at.n
    spans = at.spans(kept, start) + found.tail
    fold = at.fold.copy()
    before = _feed(fold, new, n)
    if before is None:  # nothing new: the point's own earlier state
        before = at.before
    transcript = fold.finish(n + len(new), located.body.get("tool_choice"))
    key_items = fingerprint_items([*at.key_items, *new])
    key_before = fingerprint_items([*at.key_items, *new[:-1]]) if new else list(at.key_before)
    entry = _entry(raw, start, spans, fold, kept.tools, key_items, before, key_before, (kept.spans, n))
    return Read(transcript, spans, kept.checkpoint, entry, kept.edits, hit=True, fast=True)


def read(
    raw: bytes,
    dialect: Dialect,
    located: Located,
    kept: Prefix | None = None,
    chained: dict[str, Any] | None = None,
) -> Read:
    """The transcript of ``located`` (what ``dialect.parse_request`` of the whole body gives),
    with the byte spans of its history's items (what :func:`proxy.dialects.jsonbody.items`
    gives; None when the history member is missing, not a list, or given twice: the dialect's
    ``apply`` then finds them itself), as a :class:`Read`. Resumes ``kept`` (the conversation's
    kept prefix) when the history starts with its bytes and offers the same tools, and the
    prefix found by bytes when ``located`` has one. ``chained``: the whole history a Responses
    request continues (:mod:`proxy.request.chain`), read in full.

    Raises what ``dialect.parse_request`` raises (:class:`proxy.errors.DialectError`).
    """
    if chained is not None:
        return Read(dialect.parse_request(chained))
    if located.resume is not None:
        return _resumed(raw, located)
    body, start, offered = located.body, located.start, located.offered
    if start is None or offered is None:  # the cache off, or no history list to resume
        return Read(dialect.parse_request(body))
    member: str = dialect.ITEMS
    listed = body[member]
    fold: Any = None
    checkpoint: Any = None
    kept_edits: Any = None
    spans: list[Span] | None = None
    key_items: list[Any] = []
    key_before: list[Any] = []
    before: Any = None
    at: Point | None = point(raw, start, kept) if kept is not None and kept.tools == offered else None
    resumed: tuple[tuple[Span, ...], int] | None = None
    if at is not None and kept is not None and at.n <= len(listed):
        n = at.n
        tail, end = jsonbody.items_after(raw, start + at.length, listed[n:])
        if n + len(tail) == len(listed):
            spans = at.spans(kept, start) + tail
            fold = at.fold.copy()
            checkpoint = kept.checkpoint
            kept_edits = kept.edits
            before = _feed(fold, listed[n:], n)
            if before is None:  # nothing new: the point's own earlier state
                before = at.before
            key_items = fingerprint_items([*at.key_items, *listed[n:]])
            key_before = (
                fingerprint_items([*at.key_items, *listed[n:-1]]) if n < len(listed) else list(at.key_before)
            )
            resumed = (kept.spans, n)
    hit = fold is not None
    if fold is None:
        spans = jsonbody.items(raw, start, listed)
        end = jsonbody.items_after(raw, spans[-1][1])[1] if spans else jsonbody.items_after(raw, start + 1)[1]
        fold = dialect.Fold(located.tools)
        before = _feed(fold, listed, 0)
        key_items = fingerprint_items(listed)
        key_before = fingerprint_items(listed[:-1])
    assert spans is not None
    if len(spans) != len(listed) or member in jsonbody.keys_after(raw, end, body):
        # the member given twice: decoders read the last
        return Read(dialect.parse_request(body), hit=hit)
    transcript = fold.finish(len(listed), body.get("tool_choice"))
    entry = _entry(raw, start, spans, fold, offered, key_items, before, key_before, resumed)
    return Read(transcript, spans, checkpoint, entry, kept_edits, hit=hit)
