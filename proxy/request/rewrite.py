"""The request side as one pure function: body bytes in, bytes to send upstream plus actions out.

No sockets here; the server calls :func:`decide_request` and forwards ``decision.body``. A body that
is not JSON, or JSON the dialect cannot read, comes back unchanged with no actions and the reason
in ``unguarded``. JSON that orjson refuses but is still JSON (lone surrogates, ``1e400``, deep
nesting) is read by :func:`proxy.dialects.jsonbody.decode`, and a rewrite changes only the edited
bytes. Any other exception is a bug and propagates; the server then forwards the original bytes (fail open).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from proxy.core.actions import Action, Remind, Withhold, applied, mark_observed
from proxy.core.state import ConversationState
from proxy.core.transcript import Transcript
from proxy.dialects import Dialect, anthropic_messages, gemini, jsonbody, openai_chat, openai_responses
from proxy.errors import DialectError
from proxy.guards import Context, Guard
from proxy.guards.resume import Checkpoint, evaluate_from
from proxy.request import prefix_cache
from proxy.request.conversation import conversation_key
from proxy.request.prefix_cache import PrefixCache
from proxy.request.response_store import UNKNOWN_PREVIOUS, Chain, Entry, chain_of


@dataclass(frozen=True, slots=True)
class RequestDecision:
    """``body``: bytes for the upstream (the original object when nothing changed).
    ``actions``: every action derived (fresh and re-derived). ``conversation``: DESIGN §4 key
    (``""`` when the body was not readable). ``model``/``stream``: from the body, for the log.
    ``transcript``: what the guards read (None when the body was not readable), for the server to
    remember what it saw (:mod:`proxy.core.state`). ``unguarded``: why the guards could not read the
    body (``not_json``, ``nesting``: :class:`proxy.dialects.jsonbody.Unreadable`; :data:`NOT_CHAT`), else
    None."""

    body: bytes
    actions: tuple[Action, ...]
    changed: bool
    conversation: str = ""
    model: str | None = None
    stream: bool | None = None
    transcript: Transcript | None = None
    unguarded: str | None = None
    chain: Chain | None = None
    #: the guards' checkpoint of ``transcript`` (:class:`proxy.guards.resume.Checkpoint`; None: no
    #: step, or a chained Responses request), for the response side to resume from
    checkpoint: Checkpoint | None = None
    #: the body has nothing to guard (:func:`proxy.request.plain.nothing_to_guard`): not decoded,
    #: no guard run; the response side builds its stop judge from ``body`` only if an answer has calls
    plain: bool = False


#: ``RequestDecision.unguarded`` for JSON that is not a chat request the dialect reads.
NOT_CHAT = "not_chat"
#: ... for a body nested deeper than the decoders or the guards read (:class:`jsonbody.Unreadable`
#: says it for the decoders; the guards' walks of call arguments stop at about 500 levels).
NESTING = "nesting"


def decide_request(
    raw: bytes,
    headers: Mapping[str, str],
    guards: Sequence[Guard],
    header_names: Sequence[str],
    now_ms: int = 0,
    state_for: Callable[[str], ConversationState | None] | None = None,
    dialect: Dialect = openai_chat,  # type: ignore[assignment]
    previous: Callable[[str], Entry | None] | None = None,
    prefixes: PrefixCache | None = None,
    observed: AbstractSet[str] = frozenset(),
) -> RequestDecision:
    """Parse a request body with ``dialect`` (chat completions by default), run the guards, apply
    their actions.

    ``state_for(conversation_key)`` gives the remembered state handed to the guards in
    ``Context.state`` (read only; None = no state, as after a restart).

    ``previous(response_id)``: the response store's lookup (:mod:`proxy.request.response_store`; None =
    no store). A Responses request naming a ``previous_response_id`` is guarded over the kept
    chain plus its new items (actions inside the kept part are not applied again, the others
    shifted to its ``input``); one whose id is not kept comes back unchanged with ``unguarded``
    :data:`proxy.request.response_store.UNKNOWN_PREVIOUS`. With a store, every guarded Responses request
    not sent with ``store: false`` carries its chain in ``chain``, for the answer to be kept.

    ``prefixes``: what earlier requests of each conversation established
    (:mod:`proxy.request.prefix_cache`; None = read every history in full). The decision is the
    same with or without it.

    ``observed``: the rule names in observe mode (issue 16,
    :meth:`proxy.config.Config.observed_rules`): their actions are in ``actions`` marked
    ``observed`` and are not applied; with every rule observed the body is ``raw`` itself.

    Returns the original ``raw`` object (identity, byte for byte) when no action changes the body.
    """
    fast = _find(raw, dialect, prefixes, previous)
    read = _read(raw, fast.body if fast is not None else None)
    if isinstance(read, RequestDecision):
        return read
    body, model, stream = read
    if dialect is openai_responses:
        return _decide_responses(
            raw,
            body,
            headers,
            guards,
            header_names,
            now_ms,
            state_for,
            previous,
            model,
            stream,
            prefixes,
            observed,
            fast,
        )
    key = conversation_key(headers, fast.key_body(dialect.ITEMS) if fast else body, header_names)
    try:
        if fast is not None and prefixes is not None:
            found = prefix_cache.resume(fast, raw, dialect, key, prefixes)
        else:
            found = prefix_cache.read(raw, body, dialect, key, prefixes)
    except DialectError:
        return RequestDecision(raw, (), False, key, model, stream, unguarded=NOT_CHAT)
    transcript = found.transcript
    state = state_for(key) if state_for is not None else None
    ctx = Context(conversation=key, now_ms=now_ms, state=state)
    try:
        evaluated, checkpoint = evaluate_from(transcript, guards, ctx, observed, found.checkpoint)
    except RecursionError:  # arguments nested past what the guards' walks take (~500 levels)
        return RequestDecision(raw, (), False, key, model, stream, unguarded=NESTING)
    actions = mark_observed(evaluated, observed)
    if prefixes is not None and found.entry is not None:
        prefixes.keep_checkpoint(dialect.PATH_SUFFIX, key, found.entry, checkpoint)
    enforced = applied(actions)
    out = None
    if enforced:  # reusing the previous request's edits when the prefix cache kept them
        if fast is not None:
            body = _body_for(fast, raw, dialect, enforced, found)
        out = prefix_cache.apply_edits(prefixes, dialect, key, found, raw, enforced, body)
    if out is None:
        return RequestDecision(raw, actions, False, key, model, stream, transcript, checkpoint=checkpoint)
    return RequestDecision(out, actions, True, key, model, stream, transcript, checkpoint=checkpoint)


def decide_plain(
    raw: bytes, headers: Mapping[str, str], header_names: Sequence[str], dialect: Dialect
) -> RequestDecision:
    """:func:`decide_request` for a body with nothing to guard
    (:func:`proxy.request.plain.nothing_to_guard` said so from its bytes): the same decision,
    read without the guards or the prefix cache. Every guard reads tool calls and this history
    has none, so there are no actions and the body goes as it came; what the decision tells
    (conversation key, model, stream, transcript, or why the body is unguarded) is what a full
    read tells. ``plain`` is True for a readable body: the response side then builds its stop
    judge only for an answer with calls (:class:`proxy.response.decide.LazyJudge`)."""
    read = _read(raw)
    if isinstance(read, RequestDecision):
        return read
    body, model, stream = read
    key = conversation_key(headers, body, header_names)
    try:
        transcript = dialect.parse_request(body)
    except DialectError:
        return RequestDecision(raw, (), False, key, model, stream, unguarded=NOT_CHAT)
    return RequestDecision(raw, (), False, key, model, stream, transcript, plain=True)


def _read(raw: bytes, body: Any = None) -> tuple[dict[str, Any], str | None, bool | None] | RequestDecision:
    """The body as an object (``body``, or ``raw`` decoded here when None) with its ``model`` and
    ``stream`` (None when not a string / a bool), or the unguarded decision for a body that is
    not JSON (its reason) or not an object (:data:`NOT_CHAT`): it goes as it came."""
    if body is None:
        try:
            body = jsonbody.decode(raw)
        except jsonbody.Unreadable as exc:
            return RequestDecision(raw, (), False, unguarded=exc.reason)
    if not isinstance(body, dict):
        return RequestDecision(raw, (), False, unguarded=NOT_CHAT)
    model = body.get("model") if isinstance(body.get("model"), str) else None
    stream = body.get("stream") if isinstance(body.get("stream"), bool) else None
    return body, model, stream


def _find(
    raw: bytes,
    dialect: Dialect,
    prefixes: PrefixCache | None,
    previous: Callable[[str], Entry | None] | None,
) -> prefix_cache.Found | None:
    """The kept prefix ``raw`` resumes without being decoded whole (:func:`prefix_cache.find`),
    or None: read it in full. A Responses request chained by ``previous_response_id``, or one the
    response store keeps (a store, and not ``store: false``: its chain holds every input item),
    is always read in full; Codex CLI sends ``store: false``."""
    if prefixes is None:
        return None
    fast = prefix_cache.find(raw, dialect, prefixes)
    if fast is None or dialect is not openai_responses:
        return fast
    chained = openai_responses.previous_id(fast.body) is not None
    kept = previous is not None and fast.body.get("store") is not False
    return None if chained or kept else fast


def _body_for(
    fast: prefix_cache.Found,
    raw: bytes,
    dialect: Dialect,
    enforced: Sequence[Action],
    found: prefix_cache.Read,
) -> Any:
    """The body the dialect's ``apply`` reads for ``enforced``, from what the fast path decoded:
    the kept items the actions edit decoded from their bytes (:func:`prefix_cache.full_body`);
    with edits kept from the previous request only those at or after their cut (the others are
    reused, or, when the actions there changed, found by a scan of the bytes: an item without its
    decoded hint is read from its bytes). A withheld text-call part needs its item's text, so
    then every edited item is decoded. Messages and Gemini read every message's blocks (parts)
    for its positions (:func:`anthropic_messages.slots`, :func:`gemini.slots`), so their body is
    decoded whole."""
    if dialect is anthropic_messages or dialect is gemini:
        return jsonbody.decode(raw)
    withheld = [a for a in enforced if isinstance(a, Withhold)]
    since = found.edits.cut if found.edits is not None and all(a.part is None for a in withheld) else 0
    positions = {a.position for a in withheld if a.position >= since}
    positions |= {a.after for a in enforced if isinstance(a, Remind) and a.after >= since}
    return prefix_cache.full_body(fast, raw, dialect.ITEMS, positions)


def _decide_responses(
    raw: bytes,
    body: dict[str, Any],
    headers: Mapping[str, str],
    guards: Sequence[Guard],
    header_names: Sequence[str],
    now_ms: int,
    state_for: Callable[[str], ConversationState | None] | None,
    previous: Callable[[str], Entry | None] | None,
    model: str | None,
    stream: bool | None,
    prefixes: PrefixCache | None,
    observed: AbstractSet[str] = frozenset(),
    fast: prefix_cache.Found | None = None,
) -> RequestDecision:
    """:func:`decide_request` for ``POST /v1/responses``, with ``previous_response_id`` chains
    (a chained request is read in full: its kept chain is not in its bytes)."""
    prev = openai_responses.previous_id(body)
    entry = previous(prev) if prev is not None and previous is not None else None
    if prev is not None and entry is None:
        key = conversation_key(headers, body, header_names)
        lost = Chain(previous=prev, lost=True)
        return RequestDecision(raw, (), False, key, model, stream, unguarded=UNKNOWN_PREVIOUS, chain=lost)
    try:
        new = openai_responses.input_items(body)
        full = body if entry is None else {**body, "input": [*entry.items(), *new]}
        key = conversation_key(headers, fast.key_body("input") if fast else full, header_names)
        if fast is not None and prefixes is not None:
            found = prefix_cache.resume(fast, raw, openai_responses, key, prefixes)  # type: ignore[arg-type]
        elif entry is None:
            found = prefix_cache.read(raw, body, openai_responses, key, prefixes)  # type: ignore[arg-type]
        else:
            found = prefix_cache.Read(openai_responses.parse_request(full))
        transcript = found.transcript
    except DialectError:
        key = conversation_key(headers, fast.key_body("input") if fast else body, header_names)
        return RequestDecision(raw, (), False, key, model, stream, unguarded=NOT_CHAT)
    chain = None
    if previous is not None:
        chain = chain_of(entry, new, prev, keep=body.get("store") is not False)
    state = state_for(key) if state_for is not None else None
    ctx = Context(conversation=key, now_ms=now_ms, state=state)
    evaluated, checkpoint = evaluate_from(transcript, guards, ctx, observed, found.checkpoint)
    actions = mark_observed(evaluated, observed)
    if prefixes is not None and found.entry is not None:
        prefixes.keep_checkpoint(openai_responses.PATH_SUFFIX, key, found.entry, checkpoint)
    enforced = applied(actions)
    if entry is None:
        dialect: Any = openai_responses
        if enforced and fast is not None:
            body = _body_for(fast, raw, dialect, enforced, found)
        out = (
            prefix_cache.apply_edits(prefixes, dialect, key, found, raw, enforced, body) if enforced else None
        )
    else:
        out = openai_responses.apply_chained(raw, enforced, body, entry.count, entry.repair)
    changed = out is not None
    return RequestDecision(
        out if out is not None else raw,
        actions,
        changed,
        key,
        model,
        stream,
        transcript,
        chain=chain,
        checkpoint=checkpoint,
    )
