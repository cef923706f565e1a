"""``loopguard serve`` freezes what is alive once it has started (``proxy.edge.serve.settle_heap``):
the full collections the requests trigger then walk only objects made since."""

from __future__ import annotations

import gc

from proxy.config import Config, build
from proxy.edge.app import create_app
from proxy.edge.serve import GC_THRESHOLDS, settle_heap


def test_settle_heap_freezes_the_started_app_and_leaves_garbage_out() -> None:
    app = create_app(build(Config, {}), None)
    cycle: list[object] = []
    cycle.append(cycle)  # garbage in a cycle: collected first, not frozen
    del cycle
    before = gc.get_threshold()
    try:
        frozen = settle_heap()
        assert frozen == gc.get_freeze_count()
        assert frozen > 10_000  # modules, the config and the app
        assert gc.get_threshold() == GC_THRESHOLDS == (10_000, 10, 10)
        assert gc.collect() == 0  # nothing was left to find: the frozen part is not walked
        made_after = [[i] for i in range(100)]
        assert gc.get_freeze_count() == frozen  # new objects stay collectable
        assert made_after[99] == [99]
        assert app is not None
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
    assert gc.get_freeze_count() == 0
