"""Canonical call key (DESIGN §5): ``(tool name, canonical arguments)``.

Canonical arguments: parse the arguments JSON string (an empty or absent string means ``{}``;
arguments sent as a JSON object instead of a string are used as they are); invalid JSON stays the
raw string and is compared as a string. Top-level keys listed in the guard's ``ignore_args`` are
dropped, but only when the call keeps at least one other argument: a ``think``
tool whose one argument is ``thought`` must not make every call look the same. ``keep_sole=False``
drops them even then (the seed dsh-circuit-breaker did). The result is serialized with keys
sorted recursively, compact separators, non-ASCII kept as is, and floats with integral values
written as integers (``1.0 == 1``, as JavaScript's ``JSON.stringify`` does below 1e21; ``-0.0``
becomes ``0``). Arrays keep their order.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

import orjson

from proxy.core.memo import ENTRY_BYTES, Memo

#: Marker for arguments that are not valid JSON; the raw string is then the canonical form.
INVALID: Any = type("InvalidArguments", (), {"__repr__": lambda self: "INVALID"})()


def parse_arguments(raw: Any) -> Any:
    """Parse a call's ``arguments`` value.

    ``raw`` is what the wire carried: a JSON string, ``""``/``None`` (no parameters), or an
    already-decoded object. Returns the decoded value, or :data:`INVALID` when ``raw`` is a string
    that is not JSON. Never raises.
    """
    if raw is None:
        return {}
    if isinstance(raw, str):
        if not raw.strip():
            return {}
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            return INVALID
    return raw


def _normalize(value: Any) -> Any:
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e21:
            return int(value)
        return value
    if isinstance(value, dict):
        return {k: _normalize(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalize(v) for v in value]
    return value


#: Arguments strings up to this many characters are memoized (every guard canonicalizes every
#: call of the history it reads; a conversation's old calls repeat request after request).
CACHE_MAX_CHARS = 2048
#: Bounds of the memo shared by every guard (least recently used dropped): entries, and bytes
#: charged by :func:`proxy.core.memo.call_bytes` (the arguments string and its canonical form).
#: One call is one entry per ``ignore_args`` set that asks for it (a few guards each): 4,096
#: keep the hit rate of 8,192 on the recorded real runs and the bench's 5 MB session.
CACHE_ENTRIES = 4096
CACHE_BYTES = 2 * 1024 * 1024

_memo: Memo[tuple[str, frozenset[str], bool], str] = Memo(
    CACHE_ENTRIES, CACHE_BYTES, lambda key, value: ENTRY_BYTES + len(key[0]) + len(value)
)


def _canonical_of_string(raw: str, ignore_args: frozenset[str], keep_sole: bool) -> str:
    key = (raw, ignore_args, keep_sole)
    found = _memo.get(key)
    if found is None:
        found = _memo.put(key, _canonical(parse_arguments(raw), raw, ignore_args, keep_sole))
    return found


def canonical_arguments(
    parsed: Any, raw: Any, ignore_args: Collection[str] = (), keep_sole: bool = True
) -> str:
    """Canonical string of one call's arguments (memoized for short argument strings).

    ``parsed`` comes from :func:`parse_arguments` on ``raw``. Returns a compact, key-sorted JSON
    string, or the raw string itself when the arguments are not valid JSON. Never raises.
    Integer literals beyond 64 bits are read as floats by orjson (so two such literals that differ
    only past the 17th digit compare equal) and written with the stdlib encoder.
    """
    if isinstance(raw, str) and len(raw) <= CACHE_MAX_CHARS:
        ignore = ignore_args if isinstance(ignore_args, frozenset) else frozenset(ignore_args)
        return _canonical_of_string(raw, ignore, keep_sole)
    return _canonical(parsed, raw, ignore_args, keep_sole)


def _canonical(parsed: Any, raw: Any, ignore_args: Collection[str], keep_sole: bool = True) -> str:
    """Canonical string of one call's arguments.

    ``parsed`` comes from :func:`parse_arguments` on ``raw``. Returns a compact, key-sorted JSON
    string, or the raw string itself when the arguments are not valid JSON. Never raises.
    Integer literals beyond 64 bits are read as floats by orjson (so two such literals that differ
    only past the 17th digit compare equal) and written with the stdlib encoder.
    """
    if parsed is INVALID:
        return raw if isinstance(raw, str) else str(raw)
    if ignore_args and isinstance(parsed, dict):
        kept = {k: v for k, v in parsed.items() if k not in ignore_args}
        if kept or not keep_sole:  # an ignored key that is all the call has distinguishes it
            parsed = kept
    value = _normalize(parsed)
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except (TypeError, orjson.JSONEncodeError):
        pass
    try:  # integers beyond 64 bits: the stdlib encoder has no size limit
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        return raw if isinstance(raw, str) else repr(raw)
