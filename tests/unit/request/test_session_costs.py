"""What a resumed request no longer does in proportion to its history, pinned by value: the kept
history is a view of its body (not a copy), the kept edits carry their byte count (not summed
again), the splice copies the unedited runs once (same bytes as slicing them), and a guard
state's copy shares what it does not change (escalation's tracks)."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from proxy.config import Config, build
from proxy.core.effects import progress_rules
from proxy.core.transcript import Transcript
from proxy.dialects import edits, jsonbody, openai_chat
from proxy.guards import Context, Guard, build_guards
from proxy.guards.escalation import Escalation
from proxy.request import prefix_cache
from proxy.request.prefix_cache import PrefixCache
from proxy.request.rewrite import RequestDecision, decide_request
from tests.helpers.corpus import default_config

CFG: Config = build(Config, default_config())
GUARDS: tuple[Guard, ...] = build_guards(CFG.guards, *progress_rules(CFG.progress))
SYSTEM = "You are an agent. " * (prefix_cache.FAST_MIN // 16)


def _messages(steps: int) -> list[dict[str, Any]]:
    """A looping agent (the same call, the same result) with a break every fifth step, so that
    reminders and withholds pile up before the cut of every request."""
    out: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "fix it"}]
    for i in range(steps):
        args = '{"command":"pytest -x"}' if i % 5 else f'{{"command":"cat f{i}.py"}}'
        call = {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": args}}
        result = "FAILED test_x\nexit code 1" if i % 5 else f"print({i})"
        out += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": result},
        ]
    return out


def _decide(raw: bytes, cache: PrefixCache | None) -> RequestDecision:
    return decide_request(raw, {}, GUARDS, ("x-session-id",), prefixes=cache)


def _entry(cache: PrefixCache) -> prefix_cache.Prefix:
    (entry,) = cache._entries.values()
    return entry


def test_a_growing_session_keeps_views_and_carried_edit_sizes_and_decides_the_same() -> None:
    cache = PrefixCache(1 << 30)
    for steps in range(1, 30):
        raw = orjson.dumps({"model": "m", "messages": _messages(steps)})
        on, off = _decide(raw, cache), _decide(raw, None)
        assert (on.body, on.actions, on.transcript, on.conversation) == (
            off.body,
            off.actions,
            off.transcript,
            off.conversation,
        )
        entry = _entry(cache)
        # the kept history is a view of this very body, byte for byte its history
        assert isinstance(entry.items, memoryview)
        assert entry.items.obj is raw
        start = len(entry.head)
        assert bytes(entry.items) == raw[start : start + len(entry.items)]
        assert entry.items == raw[start : entry.absolute[-1][1]]
        kept = entry.edits
        if kept is None:
            continue
        # the carried byte count is what a count from scratch gives, exactly
        fresh = edits.Kept(kept.cut, kept.actions, kept.edits, kept.base)
        assert (kept.edit_bytes, kept.size) == (fresh.edit_bytes, fresh.size)
        assert kept.edit_bytes == sum(edits.EDIT_BYTES + len(e[3]) for e in kept.edits)
        assert kept.size == kept.edit_bytes + edits.EDIT_BYTES * len(kept.actions)
        assert all(p < kept.cut for p, *_ in kept.edits)
    assert cache.stats.fast_hits > 20 and cache.stats.edit_hits > 20


def test_kept_edits_given_their_byte_count_keep_it_and_count_it_otherwise() -> None:
    ws = (1, 10, 12, b'"no"')
    given = edits.Kept(3, (), (ws,), 0, 999)
    counted = edits.Kept(3, (), (ws,), 0)
    assert (given.edit_bytes, given.size) == (999, 999)
    assert (counted.edit_bytes, counted.size) == (edits.EDIT_BYTES + 4, edits.EDIT_BYTES + 4)
    assert given == counted  # neither count takes part in equality


def test_one_item_earlier_compares_the_view_of_the_kept_history() -> None:
    cache = PrefixCache(1 << 30)
    messages = _messages(6)
    _decide(orjson.dumps({"model": "m", "messages": messages}), cache)
    changed = [*messages[:-1], {**messages[-1], "content": "other"}, *_messages(7)[-2:]]
    raw = orjson.dumps({"model": "m", "messages": changed})
    on, off = _decide(raw, cache), _decide(raw, None)
    assert (on.body, on.actions, on.transcript) == (off.body, off.actions, off.transcript)
    assert cache.stats.fast_hits == 1


def _reference_splice(buf: bytes, given: list[tuple[int, int, bytes]]) -> bytes:
    ordered = sorted(enumerate(given), key=lambda e: (e[1][0], e[0]))
    parts: list[bytes] = []
    pos = 0
    for _, (start, end, replacement) in ordered:
        if start < pos:
            raise ValueError(f"overlapping edit at byte {start}")
        parts += [buf[pos:start], replacement]
        pos = end
    return b"".join([*parts, buf[pos:]])


@pytest.mark.parametrize("seed", range(40))
def test_splice_gives_the_bytes_and_errors_of_slicing(seed: int) -> None:
    rng = random.Random(seed)
    buf = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 60)))
    given: list[tuple[int, int, bytes]] = []
    for _ in range(rng.randrange(0, 8)):
        start = rng.randrange(-1 if seed % 7 == 0 else 0, len(buf) + 1)
        end = min(len(buf), start + rng.randrange(0, 4)) if start >= 0 else 0
        given.append((start, max(start, end), bytes([65 + rng.randrange(26)]) * rng.randrange(0, 3)))
    try:
        want: bytes | str = _reference_splice(buf, given)
    except ValueError as exc:
        want = str(exc)
    try:
        got: bytes | str = jsonbody.splice(buf, list(given))
    except ValueError as exc:
        got = str(exc)
    assert got == want
    assert type(got) is type(want)


def _transcript(steps: int) -> Transcript:
    return openai_chat.parse_request({"messages": _messages(steps)[1:]})


def test_an_escalation_state_and_its_copy_never_change_each_other() -> None:
    guard = next(g for g in GUARDS if isinstance(g, Escalation))
    short, long = _transcript(12), _transcript(24)
    prior = [
        a
        for g in GUARDS
        if g is not guard and getattr(g, "withholds", True) is False
        for a in g(long, Context(conversation="k"))
    ]
    ctx = Context(conversation="k", prior=tuple(prior))
    state = guard.begin()
    guard.advance(state, short, ctx, short.message_count)
    copy = state.copy()
    alone = guard.begin()
    guard.advance(alone, short, ctx, short.message_count)
    # the copy runs on over the long history (changing the tracks it shares); the original is
    # as it was, and a second copy of it decides what the first did
    out = guard.advance(copy, long, ctx, long.message_count)
    again = state.copy()
    assert guard.advance(again, long, ctx, long.message_count) == out
    assert out and any(a.rule == "escalation" for a in out)
    assert {on: (t.places, t.results, t.shapes) for on, t in state.tracks.items()} == {
        on: (t.places, t.results, t.shapes) for on, t in alone.tracks.items()
    }
