"""What a kept prefix and the bytes it holds count against the cache's budget: exact values of
:func:`proxy.request.prefix_cache.entry_size` and :func:`checkpoint_size` (calibrated with
``tracemalloc`` on the bench's memory workload: the module docstring), and kept bytes at their
own size (:func:`proxy.dialects.jsonbody.kept`)."""

from __future__ import annotations

import tracemalloc
from types import SimpleNamespace

import orjson

from proxy.dialects import jsonbody
from proxy.dialects.edits import Kept, reuse
from proxy.request import prefix_cache
from proxy.request.locate import tools_key
from proxy.request.prefix_cache import checkpoint_size, entry_size


def test_an_entry_counts_its_history_twice_per_call_per_item_and_its_tools_eight_times() -> None:
    assert (prefix_cache.HISTORY_FACTOR, prefix_cache.CALL_BYTES, prefix_cache.ITEM_BYTES) == (2, 1024, 384)
    assert prefix_cache.TOOLS_FACTOR == 8
    assert entry_size(15_405, 12, 26, 748) == 2 * 15_405 + 12 * 1024 + 26 * 384 + 8 * 748 == 59_066
    assert entry_size(100, 0, 1) == 584  # no tools given: none counted


def test_a_checkpoint_counts_its_records_per_call_and_per_action() -> None:
    assert (prefix_cache.CHECKPOINT_BYTES, prefix_cache.CHECKPOINT_CALL_BYTES) == (4096, 1792)
    assert prefix_cache.ACTION_BYTES == 128
    checkpoint = SimpleNamespace(actions=((object(), object()), (), (object(),)))
    assert checkpoint_size(checkpoint, 12) == 4096 + 12 * 1792 + 3 * 128 == 25_984
    assert checkpoint_size(SimpleNamespace(actions=()), 0) == 4096


def _traced(make: object) -> int:
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        held = [make() for _ in range(50)]  # type: ignore[operator]
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(held) == 50
    return grown // 50


def test_kept_bytes_are_their_own_size_where_orjson_output_holds_its_buffer() -> None:
    text = "x" * 300
    assert jsonbody.kept(orjson.dumps(text)) == orjson.dumps(text)
    assert _traced(lambda: jsonbody.kept(orjson.dumps(text))) < 600
    assert _traced(lambda: orjson.dumps(text + "")) >= 4000  # why: orjson's buffer, 4 KiB at least


def test_the_bytes_a_prefix_and_its_kept_edits_hold_are_their_own_size() -> None:
    key = tools_key([{"type": "function", "function": {"name": "bash"}}])
    assert key == b'[{"type":"function","function":{"name":"bash"}}]'
    assert _traced(lambda: tools_key([{"type": "function", "function": {"name": "bash"}}])) < 600
    raw = b'[{"a":1},{"b":2}]'
    done = reuse(raw, (), [(1, 8), (9, 16)], None, 2, lambda rest: [(0, (1, 8, orjson.dumps("y" * 200)))], 2)
    assert isinstance(done.kept, Kept)
    ((_, _, _, replacement),) = done.kept.edits
    assert replacement == orjson.dumps("y" * 200)
    assert (
        _traced(
            lambda: (
                reuse(
                    raw,
                    (),
                    [(1, 8), (9, 16)],
                    None,
                    2,
                    lambda rest: [(0, (1, 8, orjson.dumps("y" * 200)))],
                    2,
                ).kept
            )
        )
        < 2000
    )
