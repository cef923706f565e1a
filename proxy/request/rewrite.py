"""The request side as one pure function: body bytes in, bytes to send upstream plus actions out.

No sockets here; the server calls :func:`decide_request` and forwards ``decision.body``. A body that
is not JSON, or JSON the dialect cannot read, comes back unchanged with no actions and the reason
in ``unguarded``. JSON that orjson refuses but is still JSON (lone surrogates, ``1e400``, deep
nesting) is read by :func:`proxy.dialects.jsonbody.decode`, and a rewrite changes only the edited
bytes. Any other exception is a bug and propagates; the server then forwards the original bytes (fail open).

:func:`decide_request` is a pipeline; each stage is called once from it, is one module and knows
nothing of the stages after it:

1. locate the messages (:func:`proxy.request.locate.locate`): the body decoded, or found by its
   bytes after a kept prefix the cache handed back (:meth:`PrefixCache.candidates`);
2. Responses only, the chain (:func:`proxy.request.chain.link`): the kept history a
   ``previous_response_id`` continues;
3. the conversation key (:func:`proxy.request.conversation.conversation_key`) and the kept prefix
   (:meth:`PrefixCache.get`: a look-up only);
4. read the new messages (:func:`proxy.request.read.read`): the transcript, resuming the kept
   parse state;
5. run the guards (:func:`proxy.guards.resume.evaluate_resumed`), resuming the kept checkpoint;
   with ``recovery.collapse`` on, the runs of identical steps to fold
   (:func:`proxy.core.collapse.folds`);
6. write the edits (:func:`proxy.request.edits.write`), reusing the kept ones;
7. keep the state (:meth:`PrefixCache.keep`) for the next request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from proxy.core import collapse as collapsing
from proxy.core.actions import Action, Remind, Withhold, applied, mark_observed
from proxy.core.state import ConversationState
from proxy.core.transcript import Transcript
from proxy.dialects import Dialect, openai_chat, openai_responses
from proxy.errors import DialectError
from proxy.guards import Context, Guard
from proxy.guards.resume import Checkpoint, evaluate_resumed
from proxy.request import chain as chains
from proxy.request.conversation import conversation_key, conversation_keys
from proxy.request.edits import write
from proxy.request.locate import NOT_CHAT, Located, locate
from proxy.request.prefix_cache import Prefix, PrefixCache
from proxy.request.read import read
from proxy.request.response_store import UNKNOWN_PREVIOUS, Chain, Entry


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
    #: the guards' states after the whole of ``transcript`` (:attr:`proxy.guards.resume.Evaluation.end`;
    #: None: not guarded), for the response side's stop judge to resume from (it reads the
    #: answer's calls only); the prefix cache keeps the one at the cut instead
    checkpoint: Checkpoint | None = None
    #: the body has nothing to guard (:func:`proxy.request.plain.nothing_to_guard`): not decoded,
    #: no guard run; the response side builds its stop judge from ``body`` only if an answer has calls
    plain: bool = False
    #: a fingerprinted conversation past its first tool call: the key its first request had
    #: (:func:`proxy.request.conversation.conversation_keys`), for the log line
    opened_as: str | None = None


__all__ = ["NESTING", "NOT_CHAT", "RequestDecision", "decide_plain", "decide_request"]

#: ``RequestDecision.unguarded`` (besides :data:`NOT_CHAT`, JSON that is not a chat request the
#: dialect reads) for a body nested deeper than the decoders or the guards read (:class:`jsonbody.Unreadable`
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
    collapse: collapsing.Collapse | None = None,
) -> RequestDecision:
    """Parse a request body with ``dialect`` (chat completions by default), run the guards, apply
    their actions (the stages: module doc).

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

    ``observed``: the rule names in observe mode (:meth:`proxy.config.Config.observed_rules`):
    their actions are in ``actions`` marked ``observed`` and are not applied; with every rule
    observed the body is ``raw`` itself.

    ``collapse``: fold runs of identical steps (``recovery.collapse``; None = off): its
    :class:`proxy.core.actions.Fold` actions follow the guards' in ``actions``. Not for a
    Responses request that continues a ``previous_response_id``: the history it would fold is
    in the upstream's copy, not in the body.

    Returns the original ``raw`` object (identity, byte for byte) when no action changes the body.
    """
    responses = dialect is openai_responses
    suffix = dialect.PATH_SUFFIX
    candidates = prefixes.candidates(suffix, raw) if prefixes is not None else ()
    whole = chains.reads_whole(previous) if responses else None
    located = locate(raw, dialect, candidates, history=prefixes is not None, whole=whole)
    if isinstance(located, str):
        return RequestDecision(raw, (), False, unguarded=located)
    model, stream = located.model, located.stream
    member = getattr(dialect, "ITEMS", "messages")
    try:
        link = chains.link(located.body, previous) if responses else None
    except DialectError:
        key = conversation_key(headers, located.key_body(member), header_names)
        return RequestDecision(raw, (), False, key, model, stream, unguarded=NOT_CHAT)
    if link is not None and link.lost:
        key = conversation_key(headers, located.body, header_names)
        lost = link.chain(True)
        return RequestDecision(raw, (), False, key, model, stream, unguarded=UNKNOWN_PREVIOUS, chain=lost)
    chained = link.history if link is not None else None  # the kept chain and the new items
    key, opened_as = conversation_keys(
        headers, located.key_body(member) if chained is None else chained, header_names
    )
    kept = _kept(prefixes, suffix, key, located, chained)
    try:
        history = read(raw, dialect, located, kept, chained)
    except DialectError:
        if chained is not None:  # the key of what could be read: the request's own body
            key = conversation_key(headers, located.key_body(member), header_names)
        return RequestDecision(raw, (), False, key, model, stream, unguarded=NOT_CHAT)
    chain = link.chain(previous is not None) if link is not None else None
    state = state_for(key) if state_for is not None else None
    ctx = Context(conversation=key, now_ms=now_ms, state=state)
    try:
        done = evaluate_resumed(history.transcript, guards, ctx, observed, history.checkpoint, end=True)
    except RecursionError:  # arguments nested past what the guards' walks take (~500 levels)
        if prefixes is not None:  # what the read established holds still; the guards kept nothing
            prefixes.keep(suffix, key, history.entry, hit=history.hit, fast=history.fast)
        if responses:  # a Responses request has always failed open here (the server's fail-open)
            raise
        return RequestDecision(raw, (), False, key, model, stream, unguarded=NESTING)
    actions = mark_observed(done.actions, observed)
    if collapse is not None and chained is None:
        enforced = applied(actions, observed)
        withheld = {a.position for a in enforced if isinstance(a, Withhold)}
        reminded = {a.after for a in enforced if isinstance(a, Remind)}
        folded = collapsing.folds(history.transcript, collapse, withheld, reminded)
        actions += mark_observed(folded, observed)
    continued = link.entry if link is not None else None
    written = write(raw, dialect, located, history, applied(actions, observed), continued)
    if prefixes is not None:
        prefixes.keep(
            suffix,
            key,
            history.entry,
            done.checkpoint,
            written.kept,
            hit=history.hit,
            fast=history.fast,
            reused=written.reused,
        )
    out = written.body
    return RequestDecision(
        out if out is not None else raw,
        actions,
        out is not None,
        key,
        model,
        stream,
        history.transcript,
        chain=chain,
        checkpoint=done.end,
        opened_as=opened_as,
    )


def _kept(
    prefixes: PrefixCache | None, suffix: str, key: str, located: Located, chained: dict[str, Any] | None
) -> Prefix | None:
    """The kept prefix the read resumes: the one found by bytes, else the conversation's (a
    look-up when the body has a history list to resume; none for a chained Responses request,
    read in full)."""
    if located.resume is not None:
        return located.resume.entry
    if prefixes is None or located.start is None or chained is not None:
        return None
    return prefixes.get(suffix, key)


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
    located = locate(raw, dialect)
    if isinstance(located, str):
        return RequestDecision(raw, (), False, unguarded=located)
    model, stream = located.model, located.stream
    key, opened_as = conversation_keys(headers, located.body, header_names)
    try:
        transcript = dialect.parse_request(located.body)
    except DialectError:
        return RequestDecision(raw, (), False, key, model, stream, unguarded=NOT_CHAT)
    return RequestDecision(raw, (), False, key, model, stream, transcript, plain=True, opened_as=opened_as)
