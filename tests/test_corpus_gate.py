"""Corpus gate (issue 7): every loop fixture is acted on in time, no legit fixture is blocked.

Replays each fixture of ``tests/fixtures/loops`` (or ``$LOOPGUARD_LOOP_FIXTURES``) through the real
server with the shipped default config (:mod:`tests.corpus`). Run with ``-s`` to see the table.
Nothing is skipped or special-cased: every fixture found is replayed and judged by the same rule.
"""

from __future__ import annotations

import pytest

from tests.corpus import Replay, judge, load_fixtures, replay, table

FIXTURES = load_fixtures()


async def _all(stream: bool) -> list[Replay]:
    return [await replay(fx, None, stream) for fx in FIXTURES]


def test_fixtures_found() -> None:
    assert FIXTURES, "no loop fixtures found"
    assert {fx["kind"] for fx in FIXTURES} <= {"loop", "legit"}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_corpus_gate(stream: bool) -> None:
    replays = await _all(stream)
    print(f"\ncorpus gate ({'sse' if stream else 'json'}), default config:\n{table(replays)}")
    failures = [f"{r.fixture['id']}: {judge(r).reason}" for r in replays if not judge(r).ok]
    assert not failures, "; ".join(failures)
