"""The request path is a pipeline (:mod:`proxy.request.rewrite`): :func:`decide_request` calls each
stage once, in order, and the prefix cache (:mod:`proxy.request.prefix_cache`) is entered only to
look up and to keep what a request established; nothing is parsed, folded or applied inside it.

Traced with ``sys.setprofile`` over one guarded request each way it can go: a small chat body
decoded whole, a chat body found by its bytes after the kept prefix, and a Responses request
continuing a kept chain by ``previous_response_id``. Each request is the second of its
conversation (the cache warm) and is rewritten (the write stage runs).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import orjson
import pytest

from proxy.dialects import openai_chat, openai_responses
from proxy.request import prefix_cache, rewrite
from proxy.request.prefix_cache import PrefixCache
from proxy.request.response_store import Entry
from proxy.request.rewrite import RequestDecision, decide_request
from tests.helpers.fakes import repeated_call_messages
from tests.helpers.responses_items import responses_body
from tests.unit.request.test_prefix_cache import GUARDS, NAMES

PROXY = Path(rewrite.__file__).resolve().parents[1]
DECIDE = decide_request.__code__

#: The stages :func:`decide_request` calls (module under ``proxy/``, function), in order.
CHAT = [
    ("request/prefix_cache.py", "candidates"),  # found by bytes: a look-up only
    ("request/locate.py", "locate"),
    ("request/locate.py", "key_body"),
    ("request/conversation.py", "conversation_keys"),
    ("request/rewrite.py", "_kept"),  # the conversation's kept prefix: a look-up only
    ("request/read.py", "read"),
    ("guards/resume.py", "evaluate_resumed"),
    ("core/actions.py", "mark_observed"),
    ("core/actions.py", "applied"),
    ("request/edits.py", "write"),
    ("request/prefix_cache.py", "keep"),
]
RESPONSES_CHAINED = [
    ("request/prefix_cache.py", "candidates"),
    ("request/chain.py", "reads_whole"),
    ("request/locate.py", "locate"),
    ("request/chain.py", "link"),
    ("request/conversation.py", "conversation_keys"),
    ("request/rewrite.py", "_kept"),
    ("request/read.py", "read"),
    ("request/chain.py", "chain"),
    ("guards/resume.py", "evaluate_resumed"),
    ("core/actions.py", "mark_observed"),
    ("core/actions.py", "applied"),
    ("request/edits.py", "write"),
    ("request/prefix_cache.py", "keep"),
]
#: What the request path may call in the prefix cache: its look-ups, its store, its sizes.
CACHE_ENTRIES = {"candidates", "get", "keep", "entry_size"}


def _where(frame: FrameType) -> str | None:
    path = Path(frame.f_code.co_filename)
    try:
        return str(path.resolve().relative_to(PROXY))
    except ValueError:
        return None


@contextmanager
def _traced() -> Iterator[list[tuple[str, str, str | None, bool]]]:
    """Every call into ``proxy/`` code while the block runs: (module, function, the caller's
    module, called by :func:`decide_request` itself)."""
    calls: list[tuple[str, str, str | None, bool]] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        where = _where(frame)
        if where is None:
            return
        back = frame.f_back
        caller = _where(back) if back is not None else None
        calls.append((where, frame.f_code.co_name, caller, back is not None and back.f_code is DECIDE))

    sys.setprofile(profile)
    try:
        yield calls
    finally:
        sys.setprofile(None)


def _second(
    decide: Callable[[], RequestDecision],
) -> tuple[RequestDecision, list[tuple[str, str, str | None, bool]]]:
    decide()  # the first request of the conversation: the cache is warm after it
    with _traced() as calls:
        decision = decide()
    return decision, calls


def _chat(pad: int) -> bytes:
    messages = [{"role": "system", "content": "pad " * pad}, *repeated_call_messages(4)]
    return orjson.dumps({"model": "m", "messages": messages})


def _responses_chained() -> tuple[bytes, Entry]:
    items = responses_body(repeated_call_messages(5))["input"]
    kept = orjson.dumps(items[:-1])
    raw = orjson.dumps({"model": "m", "previous_response_id": "resp_1", "input": items[-1:]})
    return raw, Entry((kept,), len(items) - 1, len(kept))


def _decisions() -> Iterator[Any]:
    for name, pad in (("decoded_whole", 0), ("found_by_bytes", prefix_cache.FAST_MIN // 4)):
        raw, cache = _chat(pad), PrefixCache(1 << 30)
        yield pytest.param(
            lambda raw=raw, cache=cache: decide_request(raw, {}, GUARDS, NAMES, prefixes=cache), CHAT, id=name
        )
    raw, entry = _responses_chained()
    cache = PrefixCache(1 << 30)

    def chained(raw: bytes = raw, cache: PrefixCache = cache) -> RequestDecision:
        return decide_request(
            raw, {}, GUARDS, NAMES, dialect=openai_responses, previous=lambda rid: entry, prefixes=cache
        )

    yield pytest.param(chained, RESPONSES_CHAINED, id="responses_chained")


@pytest.mark.parametrize(("decide", "stages"), list(_decisions()))
def test_decide_request_calls_each_stage_once_in_order(
    decide: Callable[[], RequestDecision], stages: list[tuple[str, str]]
) -> None:
    decision, calls = _second(decide)
    assert decision.changed and decision.transcript is not None
    assert [(module, name) for module, name, _, direct in calls if direct] == stages


@pytest.mark.parametrize(("decide", "stages"), list(_decisions()))
def test_the_prefix_cache_is_entered_only_to_look_up_and_to_keep(
    decide: Callable[[], RequestDecision], stages: list[tuple[str, str]]
) -> None:
    _, calls = _second(decide)
    cache = "request/prefix_cache.py"
    entered = {name for module, name, caller, _ in calls if module == cache and caller != cache}
    assert entered <= CACHE_ENTRIES
    # inside it nothing is parsed, folded, spanned or applied: it calls only itself
    assert {module for module, _, caller, _ in calls if caller == cache} <= {cache}


def test_the_fast_path_is_taken_and_counted_once() -> None:
    raw, cache = _chat(prefix_cache.FAST_MIN // 4), PrefixCache(1 << 30)
    decide_request(raw, {}, GUARDS, NAMES, prefixes=cache)
    decide_request(raw, {}, GUARDS, NAMES, prefixes=cache)
    assert (cache.stats.hits, cache.stats.fast_hits, cache.stats.misses) == (1, 1, 1)
    assert cache.get(openai_chat.PATH_SUFFIX, decide_request(raw, {}, GUARDS, NAMES).conversation) is not None
