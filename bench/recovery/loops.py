"""What counts as a loop in an episode, and whether it was broken (pure functions over call keys).

A step's key is its calls, each ``name`` plus canonical arguments (JSON with sorted keys; the raw
text when it is not JSON). An episode **looped** when some block of ``p`` consecutive steps
(``p`` = 1 to :data:`MAX_PERIOD`) occurs :data:`REPEATS` times in a row: the same call 3 times
running, or a 2-4-call cycle gone round 3 times. The tools are deterministic, so in a toy
repository the same call in the same state gets the same result: such a block is no progress.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

#: Longest cycle, in steps.
MAX_PERIOD = 4
#: How many times in a row a block must occur to be a loop.
REPEATS = 3


def call_key(name: str, arguments: str) -> str:
    """``name`` and its arguments canonicalised (sorted-key JSON), e.g. ``read_file {"path":"a"}``."""
    try:
        canon = json.dumps(json.loads(arguments or "{}"), sort_keys=True, separators=(",", ":"))
    except ValueError:
        canon = arguments
    return f"{name} {canon}"


def step_key(calls: Sequence[Sequence[str]]) -> str:
    """A step's key: its calls' keys joined with `` | `` (empty for a step without calls)."""
    return " | ".join(call_key(n, a) for n, a in calls)


@dataclass(frozen=True)
class Loop:
    """A loop found in a key sequence: it starts at step ``start`` (from 0), its block is
    ``period`` steps long, and it lasts until step ``end`` (exclusive: the first step after
    ``start`` whose key is not one of the block's, or the episode's length)."""

    start: int
    period: int
    end: int
    keys: frozenset[str]

    @property
    def steps(self) -> int:
        """Steps spent in the loop, its first occurrence included."""
        return self.end - self.start


def find_loop(keys: Sequence[str]) -> Loop | None:
    """The earliest loop in ``keys`` (shortest period at that start), or None. Steps without
    calls (empty keys) never form a loop."""
    n = len(keys)
    for s in range(n):
        for p in range(1, MAX_PERIOD + 1):
            span = p * REPEATS
            if s + span > n:
                break
            block = keys[s : s + p]
            if "" in block or (p > 1 and len(set(block)) == 1):
                continue
            if all(keys[s + i] == keys[s + i % p] for i in range(span)):
                members = frozenset(block)
                end = s + span
                while end < n and keys[end] in members:
                    end += 1
                return Loop(s, p, end, members)
    return None


def loop_before(keys: Sequence[str], at: int) -> frozenset[str]:
    """The looping calls as of step ``at`` (an intervention's step): the block of a loop that
    started before ``at``, else the keys that occur at least twice in ``keys[:at]``."""
    found = find_loop(keys[:at])
    if found is not None:
        return found.keys
    seen = [k for k in keys[:at] if k]
    return frozenset(k for k in seen if seen.count(k) >= 2)


def broken(keys: Sequence[str], results: Sequence[str], at: int) -> bool:
    """True if the loop was broken at step ``at`` (the step whose request or answer carried the
    first intervention): that step's answer has a call, not one of :func:`loop_before`'s, and from
    there on some step gets a (call, result) pair the episode had not seen before. A stopped turn
    (no call at ``at``) is not broken."""
    if at >= len(keys) or not keys[at]:
        return False
    looping = loop_before(keys, at)
    if keys[at] in looping:
        return False
    seen = set(zip(keys[:at], results[:at], strict=True))
    return any((keys[j], results[j]) not in seen for j in range(at, len(keys)) if keys[j])
