"""A memo bounded by entries and by bytes: what a pure function gave, remembered across requests
(an agent resends its whole history every time, so its old calls and results come back on every
request), least recently used dropped first.

A memo only, never a decision input: what it returns is what the function returns. Its bound is
what the process keeps: a memo bounded by entries alone keeps whatever those entries hold, and an
agent's arguments strings and results can be any length (a file written whole, a patch), so every
memo built on this one is bounded by bytes too. An entry's bytes are charged by the memo's ``size``
function (:func:`call_bytes`, :func:`verdict_bytes`, :func:`text_bytes`): a fixed
:data:`ENTRY_BYTES` for the memo's own slot and the key's container plus the characters of the
strings the entry keeps alive. Measured with ``tracemalloc`` on 2,048 calls of the bench's
memory workload (``bench/workloads.memory_body``, arguments of 63 characters): a guard's
(tool, target) memo holds 783 KB counting its key strings and is charged 674 KB; the effect
verdicts hold 523 KB and are charged 546 KB.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

#: Bytes charged per entry whatever it holds: the ordered dict's slot and link (about 100), the
#: key tuple (56 for two items) and the value's container (a small tuple or string header, about
#: 50): 200 bytes, rounded up (``tracemalloc``, CPython 3.11, 64-bit).
ENTRY_BYTES = 200


def call_bytes(key: tuple[str, str], value: object) -> int:
    """Bytes of an entry keyed by (tool name, arguments string) whose value is derived from the
    arguments (a canonical form, a target): :data:`ENTRY_BYTES` plus the arguments' characters
    twice (the key string and a value about as long) plus the name's."""
    return ENTRY_BYTES + len(key[0]) + 2 * len(key[1])


def verdict_bytes(key: tuple[str, str], value: object) -> int:
    """Bytes of an entry keyed by (tool name, arguments string) whose value is a verdict (a
    bool): :data:`ENTRY_BYTES` plus the name's and the arguments' characters."""
    return ENTRY_BYTES + len(key[0]) + len(key[1])


def text_bytes(key: str, value: object) -> int:
    """Bytes of an entry keyed by a text whose value is small (a verdict): :data:`ENTRY_BYTES`
    plus the text's characters."""
    return ENTRY_BYTES + len(key)


class Memo(Generic[K, V]):
    """Least recently used first out once there are more than ``max_entries`` entries or their
    charged bytes (``size(key, value)``) pass ``max_bytes``. An entry whose own size passes
    ``max_bytes`` is not kept."""

    __slots__ = ("_bytes", "_data", "_size", "max_bytes", "max_entries")

    def __init__(self, max_entries: int, max_bytes: int, size: Callable[[K, V], int]) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._size = size
        self._data: OrderedDict[K, V] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._data)

    @property
    def bytes(self) -> int:
        """Charged bytes of the entries kept."""
        return self._bytes

    def get(self, key: K) -> V | None:
        """The value kept for ``key`` (now the most recently used), or None."""
        data = self._data
        value = data.get(key)
        if value is not None:
            data.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> V:
        """Keep ``value`` for ``key`` (not already kept) and return it; drop the least recently
        used entries past the bounds."""
        size = self._size(key, value)
        if size > self.max_bytes:
            return value
        data = self._data
        data[key] = value
        self._bytes += size
        while len(data) > self.max_entries or self._bytes > self.max_bytes:
            old_key, old_value = data.popitem(last=False)
            self._bytes -= self._size(old_key, old_value)
        return value

    def clear(self) -> None:
        self._data.clear()
        self._bytes = 0
