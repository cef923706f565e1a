"""The memos kept across requests (:mod:`proxy.core.memo`): least recently used first out, bounded
by entries and by charged bytes; the bounds each memo of the process is built with."""

from __future__ import annotations

import orjson

from proxy.core import agents, canonical
from proxy.core.canonical import canonical_arguments, parse_arguments
from proxy.core.effects import EffectRule
from proxy.core.failures import FailureRule, RejectionRule
from proxy.core.memo import ENTRY_BYTES, Memo, call_bytes, text_bytes, verdict_bytes
from proxy.core.transcript import ToolCall
from proxy.guards import monologue, turns
from proxy.guards.turns import call_memo, memoized

MiB = 1024 * 1024


def _call(name: str, raw: str) -> ToolCall:
    return ToolCall(0, 0, 0, 1, "c1", name, raw, parse_arguments(raw))


# --- the memo -------------------------------------------------------------------------------------


def test_the_charges_are_a_fixed_entry_plus_the_characters_kept() -> None:
    assert ENTRY_BYTES == 200
    assert call_bytes(("bash", "x" * 10), ("bash", "y" * 10)) == 200 + 4 + 20
    assert verdict_bytes(("bash", "x" * 10), True) == 200 + 4 + 10
    assert text_bytes("x" * 10, False) == 210


def test_past_max_entries_the_least_recently_used_goes_first() -> None:
    memo: Memo[str, int] = Memo(3, MiB, text_bytes)
    for i, key in enumerate("abc"):
        assert memo.put(key, i) == i
    assert memo.get("a") == 0  # now the most recently used: "b" is the oldest
    memo.put("d", 3)
    assert (len(memo), memo.bytes) == (3, 3 * 201)
    assert [memo.get(k) for k in "abcd"] == [0, None, 2, 3]


def test_past_max_bytes_the_oldest_go_until_the_rest_fit() -> None:
    memo: Memo[str, int] = Memo(100, 1000, text_bytes)
    memo.put("a" * 300, 1)  # 500 bytes each
    memo.put("b" * 300, 2)
    assert (len(memo), memo.bytes) == (2, 1000)
    memo.put("c" * 300, 3)
    assert (len(memo), memo.bytes) == (2, 1000)
    assert [memo.get(c * 300) for c in "abc"] == [None, 2, 3]
    memo.put("d", 4)  # 201 more: one 500-byte entry goes
    assert (len(memo), memo.bytes) == (2, 701)


def test_an_entry_larger_than_the_whole_budget_is_returned_not_kept() -> None:
    memo: Memo[str, int] = Memo(100, 1000, text_bytes)
    memo.put("a", 1)
    assert memo.put("x" * 801, 2) == 2  # 1,001 bytes
    assert (len(memo), memo.bytes, memo.get("a")) == (1, 201, 1)
    memo.clear()
    assert (len(memo), memo.bytes) == (0, 0)


# --- the bounds of each memo ----------------------------------------------------------------------


def test_the_bounds_each_memo_is_built_with() -> None:
    memo = call_memo()
    assert (2048, MiB) == (turns.MEMO_ENTRIES, turns.MEMO_BYTES)
    assert (memo.max_entries, memo.max_bytes) == (2048, MiB)
    effects = EffectRule()
    assert (2048, MiB) == (EffectRule.MEMO_ENTRIES, EffectRule.MEMO_BYTES)
    assert (effects._memo.max_entries, effects._memo.max_bytes) == (2048, MiB)
    assert (
        4096,
        2 * MiB,
        2048,
    ) == (canonical.CACHE_ENTRIES, canonical.CACHE_BYTES, canonical.CACHE_MAX_CHARS)
    assert (canonical._memo.max_entries, canonical._memo.max_bytes) == (4096, 2 * MiB)
    assert (
        2048,
        2 * MiB,
        16384,
    ) == (FailureRule.MEMO_ENTRIES, FailureRule.MEMO_BYTES, FailureRule.MEMO_MAX_CHARS)
    assert (4096, 2 * MiB) == (RejectionRule.MEMO_ENTRIES, RejectionRule.MEMO_BYTES)
    assert (4096, 2 * MiB) == (monologue.NORMALIZE_ENTRIES, monologue.NORMALIZE_BYTES)


def test_a_guards_memo_keeps_2048_calls_and_gives_what_computing_gives() -> None:
    memo = call_memo()
    computed: list[str] = []

    def compute(call: ToolCall) -> tuple[str, str]:
        computed.append(call.arguments_raw)
        return call.name, call.arguments_raw.upper()

    calls = [_call("bash", orjson.dumps({"command": f"ls {i}"}).decode()) for i in range(3000)]
    for c in calls:
        assert memoized(memo, c, compute) == ("bash", c.arguments_raw.upper())
    assert len(memo) == 2048
    assert memoized(memo, calls[-1], compute) == ("bash", calls[-1].arguments_raw.upper())
    assert len(computed) == 3000  # the newest was kept
    memoized(memo, calls[0], compute)
    assert len(computed) == 3001  # the oldest was not


def test_long_arguments_are_bounded_by_bytes_not_by_count() -> None:
    rule = EffectRule()
    big = [
        _call("write_file", orjson.dumps({"path": f"f{i:02d}.py", "content": "x" * 100_000}).decode())
        for i in range(20)
    ]
    for c in big:
        assert rule(c) is True
    size = verdict_bytes(("write_file", big[0].arguments_raw), True)
    assert size == 200 + 10 + 100_030
    assert len(rule._memo) == MiB // size == 10
    assert rule._memo.bytes == 10 * size


def test_the_canonical_memo_stays_within_its_bytes() -> None:
    canonical._memo.clear()
    raws = [orjson.dumps({"a": f"{i:05d}" + "x" * 1990}).decode() for i in range(600)]
    assert {len(r) for r in raws} == {2003}  # under CACHE_MAX_CHARS: memoized
    for raw in raws:
        assert canonical_arguments(parse_arguments(raw), raw) == raw  # already canonical
    per_entry = ENTRY_BYTES + 2003 + 2003
    assert len(canonical._memo) == 2 * MiB // per_entry == 498
    assert canonical._memo.bytes == 498 * per_entry
    canonical._memo.clear()


def test_normalize_is_memoized_within_its_bytes() -> None:
    monologue._normalized.clear()
    texts = [f"{i:05d}  " + "word  " * 2000 for i in range(400)]  # 12,007 characters each
    for t in texts:
        assert monologue.normalize(t) == " ".join(t.split())
    per_entry = ENTRY_BYTES + 12_007 + 10_005
    assert len(monologue._normalized) == 2 * MiB // per_entry == 94
    monologue._normalized.clear()


def test_a_patch_run_through_a_shell_is_memoized_within_its_bytes() -> None:
    agents._patches.clear()
    body = "*** Begin Patch\n*** Update File: a.py\n" + "+x\n" * 5000 + "*** End Patch"
    scripts = [f"cd d{i:03d} && apply_patch <<'EOF'\n{body}\nEOF" for i in range(300)]
    for script in scripts:
        assert agents._heredoc_patch(script) == body
    assert agents._heredoc_patch("echo apply_patch") is None  # no patch: kept as ""
    assert agents._patches.get("echo apply_patch") == ""
    assert (1024, 2 * MiB) == (agents.PATCH_MEMO_ENTRIES, agents.PATCH_MEMO_BYTES)
    per_entry = ENTRY_BYTES + len(scripts[0]) + len(body)
    assert (len(scripts[0]), len(body)) == (15086, 15051)
    assert len(agents._patches) == (2 * MiB - (ENTRY_BYTES + 16)) // per_entry + 1 == 70
    agents._patches.clear()
