"""Plan and write the edits: the bytes the enforced actions make of a request body.

The stage of :func:`proxy.request.rewrite.decide_request` after the guards. The body that goes
upstream is the original bytes with only the edited spans replaced (the dialect's ``apply``,
:func:`proxy.dialects.jsonbody.splice`). When the read resumed a kept prefix, the edits the
previous request made before its cut (:func:`proxy.guards.resume.cut`) are reused and only the
actions at or after it are written (:func:`proxy.dialects.edits.apply_kept`; the history's bytes
through that cut are then the same, and so are the upstream bytes); this request's own edits
before its cut come back in :attr:`Written.kept`, for the keep stage. A chained Responses request
is written over its own ``input`` (:func:`proxy.dialects.openai_responses.apply_chained`).
A request with a fold (``recovery.collapse``, :class:`proxy.core.actions.Fold`) is written in full
and keeps no edits: its removals are not edits of single items the next request could reuse.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core.actions import Action, Fold, Remind, Withhold
from proxy.dialects import Dialect, anthropic_messages, gemini, jsonbody, openai_responses
from proxy.guards.resume import cut
from proxy.request.locate import Located, Resume
from proxy.request.read import Read
from proxy.request.response_store import Entry


@dataclass(frozen=True, slots=True)
class Written:
    """What :func:`write` made: ``body``, the bytes for the upstream (None: nothing changes);
    ``kept``, this request's edits before its cut (:class:`proxy.dialects.edits.Kept`; None:
    none to keep); ``reused``: the previous request's edits were reused."""

    body: bytes | None = None
    kept: Any = None
    reused: bool = False


def full_body(found: Resume, body: dict[str, Any], raw: bytes, member: str, positions: Any) -> dict[str, Any]:
    """``body`` (found by bytes: its history member holds the new items only) with its history
    member as long as the whole body's: the new items, and of the kept ones those at
    ``positions`` decoded from their bytes (the items a dialect's ``apply`` reads: those its
    actions edit); the other kept items are None."""
    kept, start = found.entry, found.start
    n = found.at.n
    items: list[Any] = [None] * n + found.new
    for p in positions:
        if 0 <= p < n:
            s, e = kept.spans[p]
            items[p] = jsonbody.decode(raw[start + s : start + e])
    return {**body, member: items}


def _body_for(located: Located, raw: bytes, dialect: Dialect, enforced: Sequence[Action], read: Read) -> Any:
    """The body the dialect's ``apply`` reads for ``enforced``, from what was found by bytes: the
    kept items the actions edit decoded from their bytes (:func:`full_body`); with edits kept from
    the previous request only those at or after their cut (the others are reused, or, when the
    actions there changed, found by a scan of the bytes: an item without its decoded hint is read
    from its bytes). A withheld text-call part needs its item's text, so then every edited item
    is decoded. Messages and Gemini read every message's blocks (parts) for its positions
    (:func:`proxy.dialects.anthropic_messages.slots`, :func:`proxy.dialects.gemini.slots`), so
    their body is decoded whole."""
    if located.resume is None:
        return located.body
    if dialect is anthropic_messages or dialect is gemini:
        return jsonbody.decode(raw)
    withheld = [a for a in enforced if isinstance(a, Withhold)]
    reusable = read.edits is not None and all(a.part is None for a in withheld) and not _folds(enforced)
    since = read.edits.cut if reusable else 0
    positions: set[int] = set()
    if since < located.resume.at.n:  # only kept items are decoded: none at or after the reused edits
        positions = {a.position for a in withheld if a.position >= since}
        positions |= {a.after for a in enforced if isinstance(a, Remind | Fold) and a.after >= since}
    return full_body(located.resume, located.body, raw, dialect.ITEMS, positions)


def _folds(actions: Sequence[Action]) -> bool:
    return any(isinstance(a, Fold) for a in actions)


def write(
    raw: bytes,
    dialect: Dialect,
    located: Located,
    read: Read,
    enforced: Sequence[Action],
    chained: Entry | None = None,
) -> Written:
    """The bytes ``enforced`` (the actions applied, in order) make of ``raw``, as a
    :class:`Written`: ``dialect.apply(raw, enforced, body, read.spans)``, reusing the edits of
    the prefix ``read`` resumed (module doc) when the dialect has ``apply_kept`` and the read
    will keep an entry. ``chained``: the kept chain of a Responses request
    (:mod:`proxy.request.chain`): its ``count`` items are in the upstream's copy already, and its
    repair items go first (written even with no action)."""
    if chained is not None:
        body = openai_responses.apply_chained(raw, enforced, located.body, chained.count, chained.repair)
        return Written(body)
    if not enforced:
        return Written()
    body = _body_for(located, raw, dialect, enforced, read)
    kept_apply = getattr(dialect, "apply_kept", None)
    if read.entry is None or read.spans is None or kept_apply is None or _folds(enforced):
        if read.spans is not None:
            return Written(dialect.apply(raw, enforced, body, read.spans))
        return Written(dialect.apply(raw, enforced, body))
    done = kept_apply(raw, enforced, body, read.spans, read.edits, cut(read.transcript))
    return Written(done.body, done.kept, done.reused)
