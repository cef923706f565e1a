"""Request-side actions written into a body as byte edits, for every dialect.

A dialect describes where its history lives and how a reminder looks (:class:`Wire`); :func:`apply`
does the rest. Only the edited spans change (:func:`proxy.dialects.jsonbody.splice`): every other byte,
numbers and whitespace included, leaves as it came.

- ``Withhold(position)``: the result member of the item at ``position`` becomes the denial text
  (a parts array becomes that string). When several guards withhold one result, the first in
  registry order gives the text.
- ``Remind(after)``: one new item right after ``after`` (the step's last result); with
  ``delivery: tool_suffix`` the text is appended to that item's result member instead: a
  non-empty string gets a blank line and the text inside its quotes, a parts array one more text
  part, anything else (null, ``""``, missing) becomes the text. Reminders for one position are
  merged into one text, joined by a blank line, in action order; a suffix goes after a denial.
- Actions whose position does not exist are ignored.
- A withhold of one ``<tool_response>`` block of a message (``Withhold.part``, a text call's
  result) is turned into a withhold of that message by :func:`whole_results` first.
- ``Fold(after, start, stop)`` (``recovery.collapse``, :mod:`proxy.core.collapse`): the items
  at positions ``start`` through ``stop`` are removed (with the separator before them), and its
  note is a reminder after ``after`` (:func:`unfold`); a withhold or reminder on a removed
  position is removed with it (the note replaces them). Slotted dialects remove whole items: a
  fold whose positions do not begin and end an item is not applied (:func:`fold_items`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from proxy.core.actions import Action, Fold, Remind, Withhold
from proxy.dialects import jsonbody, text_calls

#: (start, end, replacement bytes): one edit of :func:`proxy.dialects.jsonbody.splice`.
Edit = tuple[int, int, bytes]
#: An item's ``type`` and ``role`` members (those present), decoded.
Kind = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Wire:
    """``items``: the top-level member holding the history (a list). ``result_member(kind)``: the
    member that holds an item's text (``content``, ``output``). ``text_part(kind, text)``: one
    text part for that member's parts array. ``reminder(text)``: the item a reminder becomes."""

    items: str
    result_member: Callable[[Kind], str]
    text_part: Callable[[Kind, str], dict[str, Any]]
    reminder: Callable[[str], dict[str, Any]]


def _kind(raw: bytes, fields: Mapping[str, tuple[int, int]]) -> dict[str, Any]:
    """The item's ``type`` and ``role`` when they are strings (anything else is no kind)."""
    return {
        k: _string(raw[fields[k][0] : fields[k][1]])
        for k in ("type", "role")
        if k in fields and raw[fields[k][0] : fields[k][0] + 1] == b'"'
    }


def _string(token: bytes) -> Any:
    """The value of the JSON string ``token`` (from a body already read as JSON): without a
    backslash its bytes between the quotes are the text (``"tool"``, ``"assistant"``), else
    the standard library's decoder reads it (escapes, lone surrogates)."""
    if b"\\" not in token:
        return token[1:-1].decode()
    return json.loads(token)


def replace_member(fields: Mapping[str, tuple[int, int]], start: int, member: str, text: str) -> Edit:
    """The edit that makes ``member`` of the object at byte ``start`` (its members: ``fields``)
    the string ``text``; a missing member is added first in the object."""
    span = fields.get(member)
    if span is not None:
        return (span[0], span[1], jsonbody.dumps(text))
    added = jsonbody.dumps(member) + b":" + jsonbody.dumps(text) + (b"," if fields else b"")
    return (start + 1, start + 1, added)  # a missing member goes first in the object


def append_text(
    raw: bytes, fields: Mapping[str, tuple[int, int]], start: int, member: str, part: dict[str, Any]
) -> Edit:
    """The edit that appends ``part["text"]`` to ``member`` of the object at byte ``start``: a
    non-empty string gets a blank line and the text inside its quotes, an array the text part
    ``part``; anything else (null, ``""``, missing) becomes the text."""
    text = part["text"]
    span = fields.get(member)
    if span is not None:
        vs, ve = span
        first = raw[vs : vs + 1]
        if first == b'"' and ve - vs > 2:
            return (ve - 1, ve - 1, jsonbody.dumps(f"\n\n{text}")[1:-1])
        if first == b"[":
            encoded = jsonbody.dumps(part)
            return (ve - 1, ve - 1, (b"," + encoded) if jsonbody.items(raw, vs) else encoded)
    return replace_member(fields, start, member, text)


def unfold(actions: Sequence[Action]) -> tuple[Sequence[Action], tuple[Fold, ...]]:
    """``actions`` with each :class:`Fold` turned into its note (a reminder after its first step,
    after the reminders already there) and every withhold or reminder on a folded position
    dropped; and the folds, in order. Without a fold, ``actions`` itself and ``()``."""
    folds = tuple(a for a in actions if isinstance(a, Fold))
    if not folds:
        return actions, ()

    def gone(pos: int) -> bool:
        return any(f.start <= pos <= f.stop for f in folds)

    out: list[Action] = []
    for a in actions:
        if isinstance(a, Withhold) and gone(a.position):
            continue
        if isinstance(a, Remind) and gone(a.after):
            continue
        if not isinstance(a, Fold):
            out.append(a)
    for f in folds:
        out.append(Remind(f.after, f.text, f.rule, f.tool, f.count, f.limit, f.fresh, f.delivery))
    return out, folds


def fold_edits(folds: Sequence[Fold], spans: Sequence[tuple[int, int]]) -> list[tuple[int, Edit]]:
    """The edits that remove the items of ``folds`` (positions ``start`` through ``stop`` of a
    history whose items are at ``spans``): from the end of the item before ``start`` to the end
    of ``stop``, so the separator goes too. A fold outside the history is ignored."""
    out: list[tuple[int, Edit]] = []
    for f in folds:
        if 0 < f.start <= f.stop < len(spans):
            out.append((f.start, (spans[f.start - 1][1], spans[f.stop][1], b"")))
    return out


def apply(
    raw: bytes,
    actions: Sequence[Action],
    body: Any,
    wire: Wire,
    spans: Sequence[tuple[int, int]] | None = None,
) -> bytes | None:
    """Write ``actions`` into ``raw`` (rules in the module docstring). Returns the new body, or
    None when no action applies. ``body``: ``raw`` decoded, or None; with it, finding the edited
    spans is a compare instead of a scan (:func:`proxy.dialects.jsonbody.value_end`). ``spans``:
    the byte spans of the history's items when the caller knows them (what
    :func:`proxy.dialects.jsonbody.items` gives for the first ``wire.items`` member;
    :mod:`proxy.request.prefix_cache`)."""
    hints = body if isinstance(body, dict) else None
    listed = hints.get(wire.items) if hints is not None else None
    if spans is None:
        start = jsonbody.member_start(raw, jsonbody.root(raw), wire.items, hints)
        if start is None or raw[start : start + 1] != b"[":
            return None
        spans = jsonbody.items(raw, start, listed)
    actions, folds = unfold(actions)
    # a deletion after the note's insertion at the same byte: splice keeps the given order
    planned = _plan(raw, actions, listed, wire, spans) + fold_edits(folds, spans)
    return jsonbody.splice(raw, [e for _, e in planned]) if planned else None


def _plan(
    raw: bytes, actions: Sequence[Action], listed: Any, wire: Wire, spans: Sequence[tuple[int, int]]
) -> list[tuple[int, Edit]]:
    """The edits :func:`apply` makes, each with the position of the item it belongs to (an edit
    of item ``p`` lies inside it or at its end). Positions are independent: the edits of one
    depend only on the actions on it and its bytes."""
    withheld: dict[int, str] = {}
    for a in actions:
        if isinstance(a, Withhold) and 0 <= a.position < len(spans) and a.position not in withheld:
            withheld[a.position] = a.text
    grouped: dict[int, list[Remind]] = {}
    for a in actions:
        if isinstance(a, Remind) and 0 <= a.after < len(spans):
            grouped.setdefault(a.after, []).append(a)
    if not withheld and not grouped:
        return []
    suffix = {p: "\n\n".join(r.text for r in g) for p, g in grouped.items() if g[0].delivery == "tool_suffix"}
    out: list[tuple[int, Edit]] = []
    for pos in sorted(withheld.keys() | suffix.keys()):
        item_start = spans[pos][0]
        fields = jsonbody.members(raw, item_start, listed[pos] if isinstance(listed, list) else None)
        kind = _kind(raw, fields)
        member = wire.result_member(kind)
        if pos in withheld:
            text = "\n\n".join(t for t in (withheld[pos], suffix.get(pos, "")) if t)
            out.append((pos, replace_member(fields, item_start, member, text)))
        else:
            out.append((pos, append_text(raw, fields, item_start, member, wire.text_part(kind, suffix[pos]))))
    for after, group in grouped.items():
        if after not in suffix:
            end = spans[after][1]
            reminder = b"," + jsonbody.dumps(wire.reminder("\n\n".join(r.text for r in group)))
            out.append((after, (end, end, reminder)))
    return out


#: Bytes a kept edit counts beyond its replacement bytes (:attr:`Kept.size`).
EDIT_BYTES = 128


@dataclass(frozen=True, slots=True)
class Kept:
    """The edits one request made for its actions on the items before ``cut`` (a position), kept
    for the next request of its conversation (:mod:`proxy.request.prefix_cache`).
    ``actions``: those actions (withholds and reminders at ``0 <= position < cut``), in order.
    ``edits``: (position, start, end, replacement), byte offsets in that request's body, whose
    first history item started at byte ``base``. Valid for a request whose history has the same
    bytes through item ``cut - 1``."""

    cut: int
    actions: tuple[Action, ...]
    edits: tuple[tuple[int, int, int, bytes], ...]
    base: int = 0
    #: its replacement bytes plus :data:`EDIT_BYTES` per edit; given by a maker that knows it
    #: (:func:`reuse`: the kept ones' plus the new ones', instead of a pass over a thousand
    #: edits on every request), else (-1) computed when made
    edit_bytes: int = dataclasses.field(default=-1, compare=False, repr=False)
    #: what it counts against the prefix cache's budget (bytes, an estimate): ``edit_bytes``
    #: plus :data:`EDIT_BYTES` per action (computed when made)
    size: int = dataclasses.field(init=False, compare=False)

    def __post_init__(self) -> None:
        edit_bytes = self.edit_bytes
        if edit_bytes < 0:
            edit_bytes = sum(EDIT_BYTES + len(e[3]) for e in self.edits)
            object.__setattr__(self, "edit_bytes", edit_bytes)
        object.__setattr__(self, "size", edit_bytes + EDIT_BYTES * len(self.actions))


@dataclass(frozen=True, slots=True)
class Applied:
    """What :func:`apply_kept` did: ``body`` (None: no action applies), ``kept`` (what the next
    request may reuse; None: no cut) and ``reused`` (the edits of ``kept`` given were reused)."""

    body: bytes | None
    kept: Kept | None
    reused: bool = False


def _split(actions: Sequence[Action], cut: int) -> tuple[tuple[Action, ...], list[Action]]:
    """The withholds and reminders at positions in ``[0, cut)``, and those at ``cut`` or after
    (in order; other actions write nothing and are in neither)."""
    before: list[Action] = []
    after: list[Action] = []
    for a in actions:
        kind = type(a)
        if kind is Withhold:
            pos = a.position  # type: ignore[attr-defined]
        elif kind is Remind:
            pos = a.after  # type: ignore[attr-defined]
        else:
            continue
        if pos >= cut:
            after.append(a)
        elif pos >= 0:
            before.append(a)
    return tuple(before), after


def _split_twice(
    actions: Sequence[Action], cut: int, later: int
) -> tuple[tuple[Action, ...], list[Action], tuple[Action, ...]]:
    """``_split(actions, cut)`` and ``_split(actions, later)[0]`` (``cut < later``) in one pass."""
    before: list[Action] = []
    after: list[Action] = []
    until: list[Action] = []
    for a in actions:
        kind = type(a)
        if kind is Withhold:
            pos = a.position  # type: ignore[attr-defined]
        elif kind is Remind:
            pos = a.after  # type: ignore[attr-defined]
        else:
            continue
        if pos < 0:
            continue
        if pos >= cut:
            after.append(a)
        else:
            before.append(a)
        if pos < later:
            until.append(a)
    return tuple(before), after, tuple(until)


def apply_kept(
    raw: bytes,
    actions: Sequence[Action],
    body: Any,
    wire: Wire,
    spans: Sequence[tuple[int, int]],
    kept: Kept | None,
    cut: int | None,
) -> Applied:
    """:func:`apply` for a request whose items' ``spans`` are known, reusing the edits ``kept``
    by the previous request of its conversation when its actions before ``kept.cut`` are the
    same ones (:func:`reuse`). ``cut``: where this request's kept edits end (None: keep none)."""
    listed = body.get(wire.items) if isinstance(body, dict) else None
    return reuse(
        raw, actions, spans, kept, cut, lambda rest: _plan(raw, rest, listed, wire, spans), len(spans)
    )


def kept_apply(
    wire: Wire, apply_all: Callable[[bytes, Sequence[Action], Any, Sequence[tuple[int, int]]], bytes | None]
) -> Callable[[bytes, Sequence[Action], Any, Sequence[tuple[int, int]], Kept | None, int | None], Applied]:
    """The ``apply_kept(raw, actions, body, spans, kept, cut)`` of a dialect whose rewrite is
    :func:`apply` with ``wire`` (chat, Responses): :func:`apply_kept`, except that a withhold of
    one ``<tool_response>`` block (``part`` set) is a full ``apply_all`` that keeps nothing."""

    def apply_kept_for(
        raw: bytes,
        actions: Sequence[Action],
        body: Any,
        spans: Sequence[tuple[int, int]],
        kept: Kept | None,
        cut: int | None,
    ) -> Applied:
        if any(isinstance(a, Withhold) and a.part is not None for a in actions):
            return Applied(apply_all(raw, actions, body, spans), None)
        return apply_kept(raw, actions, body, wire, spans, kept, cut)

    return apply_kept_for


def reuse(
    raw: bytes,
    actions: Sequence[Action],
    spans: Sequence[tuple[int, int]],
    kept: Kept | None,
    cut: int | None,
    plan: Callable[[Sequence[Action]], list[tuple[int, Edit]]],
    count: int,
) -> Applied:
    """Write ``actions`` into ``raw`` with a dialect's ``plan`` (its edits for some actions, each
    with the position it belongs to; the edits of one position depend only on the actions on it
    and its bytes), reusing ``kept`` when the withholds and reminders before ``kept.cut`` are the
    same ones (then ``plan`` gets only those at or after it); anything else plans every action.
    The same bytes either way. ``kept``: the caller's promise is that this history's bytes
    through the position before ``kept.cut`` are the previous request's (a prefix cache hit);
    ``count``: the history's positions; ``spans``: its items' byte spans (the first one's start
    is what kept offsets move with). ``cut``: where this request's kept edits end (None: keep
    none)."""
    base = spans[0][0] if spans else 0
    reused: tuple[tuple[int, int, int, bytes], ...] = ()
    rest: Sequence[Action] = actions
    hit = False
    until: tuple[Action, ...] | None = None  # the actions before ``cut``, when it is past kept.cut
    if kept is not None and kept.cut <= count:
        if cut is not None and cut > kept.cut:
            before, after, until = _split_twice(actions, kept.cut, cut)
        else:
            before, after = _split(actions, kept.cut)
        if before == kept.actions:
            hit, rest = True, after
            shift = base - kept.base
            reused = kept.edits
            if shift:
                reused = tuple((p, s + shift, e + shift, b) for p, s, e, b in reused)
    fresh = [(p, s, e, b) for p, (s, e, b) in plan(rest)]
    out = jsonbody.splice(raw, [(s, e, b) for _, s, e, b in (*reused, *fresh)]) if reused or fresh else None
    mine = None
    if cut is not None:
        if hit and kept is not None and cut == kept.cut:
            mine = Kept(cut, kept.actions, reused, base) if reused is not kept.edits else kept
        elif hit and kept is not None and until is not None:
            # every kept edit is of an item before kept.cut < cut: only the new ones are filtered
            extra = tuple((p, s, e, jsonbody.kept(b)) for p, s, e, b in fresh if p < cut)  # own size
            grown = kept.edit_bytes + sum(EDIT_BYTES + len(x[3]) for x in extra)
            mine = Kept(cut, until, (*reused, *extra), base, grown)
        else:
            own = tuple((p, s, e, jsonbody.kept(b)) for p, s, e, b in fresh if p < cut)  # kept: own size
            mine = Kept(cut, _split(actions, cut)[0], tuple(x for x in reused if x[0] < cut) + own, base)
    return Applied(out, mine, hit)


class Slotted(Protocol):
    """A transcript position of a dialect whose positions are *slots* (Gemini, Messages): one
    item can hold several positions, and ``kind`` says what one is (``result`` is the only kind
    a withhold applies to)."""

    @property
    def kind(self) -> str: ...

    #: the index of the history item that holds it
    @property
    def item(self) -> int: ...


#: A slotted dialect's edits: ``(raw, layout, withheld, grouped, items, spans)`` to the edits,
#: each with the slot it belongs to (:func:`targets` gives ``withheld`` and ``grouped``).
SlotPlan = Callable[
    [bytes, Sequence[Any], dict[int, str], dict[int, list[Remind]], list[Any], Sequence[tuple[int, int]]],
    list[tuple[int, Edit]],
]


@dataclass(frozen=True, slots=True)
class SlotWire:
    """A slotted dialect's rewrite: ``items``, the top-level member holding the history (a list);
    ``slots(items)``, its positions in order (:class:`Slotted`; may raise
    :class:`proxy.errors.DialectError`); ``plan``, its edits (:data:`SlotPlan`)."""

    items: str
    slots: Callable[[list[Any]], Sequence[Any]]
    plan: SlotPlan


def targets(
    actions: Sequence[Action], layout: Sequence[Slotted]
) -> tuple[dict[int, str], dict[int, list[Remind]]]:
    """The withheld result slots of ``layout`` (the first text per slot; a withhold of another
    kind of slot, or of no slot, is ignored) and the reminders by slot (in action order)."""
    withheld: dict[int, str] = {}
    for a in actions:
        if not isinstance(a, Withhold) or not 0 <= a.position < len(layout) or a.position in withheld:
            continue
        if layout[a.position].kind == "result":
            withheld[a.position] = a.text
    grouped: dict[int, list[Remind]] = {}
    for a in actions:
        if isinstance(a, Remind) and 0 <= a.after < len(layout):
            grouped.setdefault(a.after, []).append(a)
    return withheld, grouped


def apply_slots(
    raw: bytes,
    actions: Sequence[Action],
    body: Any,
    wire: SlotWire,
    spans: Sequence[tuple[int, int]] | None = None,
) -> bytes | None:
    """A slotted dialect's ``apply``: write ``actions`` into ``raw`` with ``wire.plan``. ``body``:
    ``raw`` decoded, or None (then it is decoded here); ``spans``: the items' byte spans, when
    known (:mod:`proxy.request.prefix_cache`). Returns the new body, or None when no action
    applies, the history is not a list, or its spans do not match it (the member given twice:
    the decoders read another one)."""
    if body is None:
        body = jsonbody.decode(raw)
    listed = body.get(wire.items) if isinstance(body, dict) else None
    if not isinstance(listed, list):
        return None
    layout = wire.slots(listed)
    actions, folds = unfold(actions)
    withheld, grouped = targets(actions, layout)
    if not withheld and not grouped:
        return None
    if spans is None:
        start = jsonbody.member_start(raw, jsonbody.root(raw), wire.items, body)
        if start is None or raw[start : start + 1] != b"[":
            return None
        spans = jsonbody.items(raw, start, listed)
    if len(spans) != len(listed):
        return None
    out = wire.plan(raw, layout, withheld, grouped, listed, spans)
    out += fold_edits(fold_items(folds, layout), spans)  # after the note, as in :func:`apply`
    return jsonbody.splice(raw, [e for _, e in out]) if out else None


def fold_items(folds: Sequence[Fold], layout: Sequence[Slotted]) -> list[Fold]:
    """``folds`` over slots as folds over the history items that hold them (``start``/``stop``
    item indexes), for :func:`fold_edits`; a fold whose slots do not begin and end their items
    (an item would keep some of its slots) is left out."""
    out: list[Fold] = []
    n = len(layout)
    for f in folds:
        if not 0 < f.start <= f.stop < n:
            continue
        first, last = layout[f.start].item, layout[f.stop].item
        if layout[f.start - 1].item == first or (f.stop + 1 < n and layout[f.stop + 1].item == last):
            continue
        out.append(dataclasses.replace(f, start=first, stop=last))
    return out


def apply_slots_kept(
    raw: bytes,
    actions: Sequence[Action],
    body: Any,
    wire: SlotWire,
    spans: Sequence[tuple[int, int]],
    kept: Kept | None,
    cut: int | None,
) -> Applied:
    """:func:`apply_slots` reusing the previous request's edits before its cut (a slot position;
    :func:`reuse`, whose promise on ``kept`` holds here). A body whose history is not a list or
    does not match ``spans`` is a full :func:`apply_slots` that keeps nothing."""
    listed = body.get(wire.items) if isinstance(body, dict) else None
    if not isinstance(listed, list) or len(spans) != len(listed):
        return Applied(apply_slots(raw, actions, body, wire, spans), None)
    layout = wire.slots(listed)

    def plan(some: Sequence[Action]) -> list[tuple[int, Edit]]:
        withheld, grouped = targets(some, layout)
        return wire.plan(raw, layout, withheld, grouped, listed, spans) if withheld or grouped else []

    return reuse(raw, actions, spans, kept, cut, plan, len(layout))


def whole_results(
    actions: Sequence[Action], items: Any, text_of: Callable[[dict[str, Any]], str]
) -> list[Action]:
    """Withholds of ``<tool_response>`` blocks (``part`` set: a text call's result in a user
    message, :mod:`proxy.dialects.text_calls`) as withholds of their whole item: its text
    (``text_of(item)``) with each withheld block's inner text replaced (the first action per block
    gives the text), one action per item, at the place of its first. An item that is not there or
    no longer has the block is left alone. ``items``: the request's history list."""
    by_pos: dict[int, dict[int, str]] = {}
    for a in actions:
        if isinstance(a, Withhold) and a.part is not None:
            by_pos.setdefault(a.position, {}).setdefault(a.part, a.text)
    out: list[Action] = []
    done: set[int] = set()
    for a in actions:
        if not (isinstance(a, Withhold) and a.part is not None):
            out.append(a)
            continue
        if a.position in done:
            continue
        done.add(a.position)
        item = items[a.position] if isinstance(items, list) and 0 <= a.position < len(items) else None
        text = text_of(item) if isinstance(item, dict) else ""
        spans = text_calls.response_spans(text)
        parts = by_pos[a.position]
        if any(p >= len(spans) for p in parts):
            continue
        pieces: list[str] = []
        last = 0
        for k, (start, end) in enumerate(spans):
            if k in parts:
                pieces += [text[last:start], parts[k]]
                last = end
        pieces.append(text[last:])
        out.append(dataclasses.replace(a, text="".join(pieces), part=None))
    return out
