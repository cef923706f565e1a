"""A prefix-cache hit costs what its new items cost: the parse state shares what can no
longer change between a fold and its copies (:mod:`proxy.dialects.fold`), and a request reuses the
edits the previous request of its conversation made before its cut
(:func:`proxy.dialects.edits.apply_kept`, :func:`proxy.request.edits.write`).

Either way the transcript and the upstream bytes are those of a full read and a full apply:
``tests/unit/request/test_prefix_cache.py`` replays every fixture in every form with the cache on and
off; here
the sharing itself (a copy fed further never changes what the original built), the exact number of
requests that reuse edits on the loop fixtures (an oracle computed from the cache-off decisions),
and the cases that must fall back to a full apply.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from bench.workloads import history_messages
from proxy.core.actions import Action, Remind, Withhold, applied
from proxy.core.transcript import Step, ToolCall
from proxy.dialects import Dialect, anthropic_messages, edits, jsonbody, openai_chat, openai_responses
from proxy.guards.resume import cut
from proxy.request import prefix_cache
from proxy.request.conversation import key_digest
from proxy.request.prefix_cache import PrefixCache
from proxy.request.rewrite import RequestDecision, decide_request
from tests.helpers import messages_blocks, responses_items
from tests.helpers.corpus import load_fixtures
from tests.unit.request.test_prefix_cache import GUARDS, HEADERS, NAMES

WIRES = ("chat", "responses", "messages")
DIALECTS: dict[str, Any] = {
    "chat": openai_chat,
    "responses": openai_responses,
    "messages": anthropic_messages,
}


def _body(messages: list[dict[str, Any]], wire: str, end: int) -> dict[str, Any]:
    """The request body of ``messages[:end]`` in ``wire``'s form."""
    if wire == "chat":
        return {"model": "m", "messages": messages[:end]}
    if wire == "responses":
        return responses_items.trace_items(messages).body(end)
    return messages_blocks.trace_blocks(messages).body(end)


def _items(body: dict[str, Any], wire: str) -> list[Any]:
    return body["input" if wire == "responses" else "messages"]  # type: ignore[no-any-return]


def _fold(dialect: Any, items: Sequence[Any]) -> Any:
    fold = dialect.Fold(None)
    for pos, item in enumerate(items):
        fold.feed(pos, item)
    return fold


# --- the fold's shared records ---------------------------------------------------------------


@pytest.mark.parametrize("wire", WIRES)
def test_a_copy_fed_further_never_changes_what_the_original_built(wire: str) -> None:
    messages = history_messages(20_000)
    dialect = DIALECTS[wire]
    items = _items(_body(messages, wire, len(messages)), wire)
    cuts = 0
    for k in range(1, len(items)):
        original = _fold(dialect, items[:k])
        before = original.finish(k)
        built = list(original.calls)
        copy = original.copy()
        for s, call in enumerate(original.calls):  # built calls are shared, open ones copied
            assert (copy.calls[s] is call) == isinstance(call, ToolCall), (k, s)
        for i, step in enumerate(original.steps):
            assert (copy.steps[i] is step) == isinstance(step, Step), (k, i)
        for pos in range(k, len(items)):
            copy.feed(pos, items[pos])
        assert copy.finish(len(items)) == dialect.parse_request({"messages": items, "input": items})
        after = original.finish(k)
        assert after == before, k
        assert all(a is b for a, b in zip(original.calls, built, strict=True)), k
        # what was built when the original finished is the same object when it finishes again
        for a, b in zip(after.calls, before.calls, strict=True):
            assert (a is b) == (a.result is not None), (k, a.seq)
        cuts += 1
    assert cuts == len(items) - 1


def test_only_the_calls_waiting_for_a_result_and_their_steps_stay_open() -> None:
    messages = history_messages(20_000)
    ends = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    fold = _fold(openai_chat, messages[: ends[-1] + 1])  # ends with a step whose result is to come
    open_calls = [s for s, c in enumerate(fold.calls) if isinstance(c, dict)]
    open_steps = [i for i, s in enumerate(fold.steps) if isinstance(s, dict)]
    assert open_calls == [len(fold.calls) - 1]
    assert open_steps == [len(fold.steps) - 1]
    assert [list(q) for q in fold.pending.values()] == [[len(fold.calls) - 1]]
    fold.feed(ends[-1] + 1, messages[ends[-1] + 1])  # its result: the call is built, the step stays open
    assert [s for s, c in enumerate(fold.calls) if isinstance(c, dict)] == []
    assert [i for i, s in enumerate(fold.steps) if isinstance(s, dict)] == [len(fold.steps) - 1]
    assert fold.pending == {}


def test_a_result_that_arrives_late_rebuilds_only_its_own_step() -> None:
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "tool_calls": [_call("a", "read"), _call("b", "read")]},
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "assistant", "tool_calls": [_call("c", "ls")]},
        {"role": "tool", "tool_call_id": "c", "content": "2"},
    ]
    fold = _fold(openai_chat, msgs)
    assert [type(s).__name__ for s in fold.steps] == ["dict", "dict"]  # step 0 still waits for b
    copy = fold.copy()
    copy.feed(5, {"role": "tool", "tool_call_id": "b", "content": "3"})
    assert [type(s).__name__ for s in copy.steps] == ["Step", "dict"]
    assert copy.steps[0] == Step(0, 1, (0, 1), 5)
    assert [type(s).__name__ for s in fold.steps] == ["dict", "dict"]
    assert fold.steps[0]["end"] == 2 and fold.calls[1]["result"] is None
    assert fold.finish(5) == openai_chat.parse_request({"messages": msgs})


def _call(cid: str, name: str) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": "{}"}}


# --- kept edits -------------------------------------------------------------------------------


def _decide(
    raw: bytes, dialect: Dialect, cache: PrefixCache | None, observed: Any = frozenset()
) -> RequestDecision:
    return decide_request(raw, HEADERS, GUARDS, NAMES, dialect=dialect, prefixes=cache, observed=observed)


def _position(a: Action) -> int | None:
    return a.position if isinstance(a, Withhold) else a.after if isinstance(a, Remind) else None


def _before(actions: Sequence[Action], upto: int) -> list[Action]:
    return [a for a in actions if (p := _position(a)) is not None and 0 <= p < upto]


def _expected_edit_hits(decisions: Sequence[RequestDecision]) -> int:
    """Requests that must reuse edits, from the cache-off decisions: the previous request applied
    actions (so it kept its edits before its cut), this one applies actions too, and those
    before the previous cut are the same ones (no withhold of a ``<tool_response>`` block)."""
    hits = 0
    for prev, now in itertools.pairwise(decisions):
        before, after = applied(prev.actions), applied(now.actions)
        if not before or not after or prev.transcript is None or now.transcript is None:
            continue
        if any(isinstance(a, Withhold) and a.part is not None for a in (*before, *after)):
            continue
        upto = cut(prev.transcript)
        if upto is not None and _before(after, upto) == _before(before, upto):
            hits += 1
    return hits


def _bodies(messages: list[dict[str, Any]], wire: str) -> list[bytes]:
    ends = [i for i, m in enumerate(messages) if m.get("role") == "assistant"] + [len(messages)]
    return [orjson.dumps(_body(messages, wire, e)) for e in ends]


FIXTURES = [(f["id"], f["messages"]) for f in load_fixtures()]


@pytest.mark.parametrize(("name", "messages"), FIXTURES, ids=[f[0] for f in FIXTURES])
@pytest.mark.parametrize("wire", WIRES)
def test_every_request_whose_actions_before_the_cut_repeat_reuses_the_kept_edits(
    name: str, messages: list[dict[str, Any]], wire: str
) -> None:
    dialect: Any = DIALECTS[wire]
    bodies = _bodies(messages, wire)
    cache = PrefixCache(1 << 30)
    want = [_decide(b, dialect, None) for b in bodies]
    for i, (raw, off) in enumerate(zip(bodies, want, strict=True)):
        on = _decide(raw, dialect, cache)
        assert on.body == off.body, f"{name} request {i}: upstream bytes differ"
        assert on.actions == off.actions, f"{name} request {i}"
    assert cache.stats.edit_hits == _expected_edit_hits(want), name


@pytest.mark.parametrize("wire", WIRES)
def test_the_loop_fixtures_reuse_edits_at_all(wire: str) -> None:
    total = 0
    for _, messages in FIXTURES:
        total += _expected_edit_hits([_decide(b, DIALECTS[wire], None) for b in _bodies(messages, wire)])
    assert total >= 10  # the oracle above is not vacuous (76 in each form when written)


def test_a_repeated_request_reuses_every_edit_and_a_grown_one_writes_only_its_new_step() -> None:
    messages = history_messages(40_000)
    ends = [i + 1 for i, m in enumerate(messages) if m["role"] == "tool"]
    first, second = (orjson.dumps({"model": "m", "messages": messages[:e]}) for e in ends[-2:])
    cache = PrefixCache(1 << 30)
    for n, raw in enumerate((first, first, second), start=1):
        on = _decide(raw, openai_chat, cache)
        assert on.body == _decide(raw, openai_chat, None).body
        assert on.changed
        assert cache.stats.edit_hits == n - 1
    entry = cache.get(openai_chat.PATH_SUFFIX, key_digest("s1"))
    assert entry is not None and entry.edits is not None
    assert entry.edits.cut == on.transcript.steps[-1].position  # type: ignore[union-attr]
    assert entry.edits.actions == tuple(_before(applied(on.actions), entry.edits.cut))


def test_actions_before_the_cut_that_change_fall_back_to_a_full_apply() -> None:
    # observe mode for one rule between two requests of one history: its actions before the cut
    # are no longer applied, so the kept edits are not those of this request
    messages = history_messages(40_000)
    raw = orjson.dumps({"model": "m", "messages": messages})
    cache = PrefixCache(1 << 30)
    _decide(raw, openai_chat, cache)
    observed = frozenset({"escalation"})
    on = _decide(raw, openai_chat, cache, observed)
    assert on.body == _decide(raw, openai_chat, None, observed).body
    assert on.body != _decide(raw, openai_chat, None).body
    assert (cache.stats.hits, cache.stats.edit_hits) == (1, 0)
    again = _decide(raw, openai_chat, cache, observed)  # the same observed rules again: reused
    assert again.body == on.body
    assert cache.stats.edit_hits == 1


CHAT = (
    b'{"model":"m","messages":[{"role":"user","content":"go"},'
    b'{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"ls","arguments":"{}"}}]},'
    b'{"role":"tool","tool_call_id":"a","content":"x"},'
    b'{"role":"assistant","tool_calls":[{"id":"b","type":"function","function":{"name":"ls","arguments":"{}"}}]},'
    b'{"role":"tool","tool_call_id":"b","content":"y"}]}'
)


def _remind(after: int, text: str, rule: str = "repeat_reminder", delivery: Any = "user") -> Remind:
    return Remind(after, text, rule, "ls", 2, 3, False, delivery)


def _withhold(position: int, text: str, part: int | None = None) -> Withhold:
    return Withhold(position, None, text, "circuit_breaker", "ls", 2, 3, False, part=part)


def _spans(raw: bytes) -> list[tuple[int, int]]:
    body = jsonbody.decode(raw)
    return jsonbody.items(raw, jsonbody.member_start(raw, jsonbody.root(raw), "messages", body) or 0)


@pytest.mark.parametrize(
    ("now", "reused"),
    [
        ([_remind(2, "r"), _withhold(2, "w"), _withhold(4, "z")], True),
        ([_remind(2, "r"), _withhold(2, "w"), _remind(4, "new")], True),
        (
            [_remind(2, "r"), _withhold(2, "w"), _remind(1, "n", "narration")],
            False,
        ),  # one more before the cut
        ([_remind(2, "r"), _withhold(2, "other")], False),  # another text
        ([_withhold(2, "w"), _remind(2, "r")], False),  # another order
        ([_remind(2, "r", delivery="tool_suffix"), _withhold(2, "w")], False),  # another delivery
        ([_remind(2, "r")], False),  # one fewer
    ],
    ids=["same", "new-after-cut", "narration-before-cut", "text", "order", "delivery", "fewer"],
)
def test_kept_edits_are_reused_only_for_the_same_actions_before_the_cut(
    now: list[Action], reused: bool
) -> None:
    body = jsonbody.decode(CHAT)
    spans = _spans(CHAT)
    first = openai_chat.apply_kept(CHAT, [_remind(2, "r"), _withhold(2, "w")], body, spans, None, 3)
    assert first.kept is not None and first.kept.cut == 3 and len(first.kept.edits) == 2
    # the same history behind more whitespace before it: offsets move with the first item
    moved = CHAT.replace(b'"messages":[', b'"messages":   [')
    moved_spans = _spans(moved)
    done = openai_chat.apply_kept(moved, now, jsonbody.decode(moved), moved_spans, first.kept, 3)
    assert done.reused is reused
    assert done.body == openai_chat.apply(moved, now, jsonbody.decode(moved))


def test_kept_edits_past_the_history_or_with_a_block_withhold_are_not_used() -> None:
    body = jsonbody.decode(CHAT)
    spans = _spans(CHAT)
    first = openai_chat.apply_kept(CHAT, [_remind(2, "r")], body, spans, None, 3)
    assert first.kept is not None
    wide = edits.Kept(len(spans) + 1, first.kept.actions, first.kept.edits)
    assert not openai_chat.apply_kept(CHAT, [_remind(2, "r")], body, spans, wide, 3).reused
    block = openai_chat.apply_kept(
        CHAT, [_remind(2, "r"), _withhold(4, "w", part=0)], body, spans, first.kept, 3
    )
    assert (block.reused, block.kept) == (False, None)
    assert block.body == openai_chat.apply(CHAT, [_remind(2, "r"), _withhold(4, "w", part=0)], body)


def test_a_kept_entry_counts_its_edits_and_drops_them_past_the_budget() -> None:
    messages = history_messages(40_000)
    raw = orjson.dumps({"model": "m", "messages": messages})
    cache = PrefixCache(1 << 30)
    _decide(raw, openai_chat, cache)
    entry = cache.get(openai_chat.PATH_SUFFIX, key_digest("s1"))
    assert entry is not None and entry.edits is not None
    assert entry.edits.size == sum(
        edits.EDIT_BYTES + len(e[3]) for e in entry.edits.edits
    ) + edits.EDIT_BYTES * len(entry.edits.actions)
    assert cache.stats.bytes == entry.size
    history = prefix_cache.entry_size(
        len(entry.items), len(entry.fold.calls), len(entry.spans), len(entry.tools)
    )
    head = len(entry.head) + sum(len(orjson.dumps(item)) for item in entry.key_items)
    guards = prefix_cache.checkpoint_size(entry.checkpoint, len(entry.fold.calls))
    # a view of the body: the rest of it is kept too, and counted
    assert isinstance(entry.items, memoryview)
    viewed = len(raw) - len(entry.items)
    assert entry.size == history + head + viewed + guards + entry.edits.size
    tight = PrefixCache(entry.size - entry.edits.size)  # room for the history, not its edits
    _decide(raw, openai_chat, tight)
    kept = tight.get(openai_chat.PATH_SUFFIX, key_digest("s1"))
    assert kept is not None and kept.edits is None
    assert tight.stats.bytes == kept.size == entry.size - entry.edits.size
