"""Message-boundary candidates for the incremental request side, measured in one run.

For chat bodies of about 1, 5 and 20 MB (``bench.workloads.history_body``) it times, best of
``--rounds``: orjson's full decode (the baseline: what every request pays today), msgspec decoding
``messages`` as a list of ``msgspec.Raw`` (raw slices, no Python objects per message; only when
msgspec is installed), the project's span scanner (:func:`proxy.dialects.jsonbody.items`) with and
without the decoded body as a hint, and the cached-prefix check the request side uses
(:mod:`proxy.request.prefix_cache`: one ``bytes.startswith`` over the previous request's messages).
Prints milliseconds and each ratio against the orjson baseline of the same size, same run::

    .venv/bin/python bench/boundaries.py [--rounds 5] [--sizes 1,5,20]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.workloads import history_body
from proxy.dialects import jsonbody


def best_ms(fn: Callable[[], Any], rounds: int) -> float:
    """Best wall time of ``fn`` over ``rounds`` calls, in ms (the collector runs between calls)."""
    best = float("inf")
    for _ in range(rounds):
        gc.collect()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1000


def candidates(raw: bytes) -> dict[str, Callable[[], Any]]:
    """Name → a call that finds (or checks) the message boundaries of ``raw``."""
    body = orjson.loads(raw)
    start = jsonbody.member_start(raw, jsonbody.root(raw), "messages", body)
    assert start is not None
    spans = jsonbody.items(raw, start, body["messages"])
    prefix = raw[start : spans[-2][1]]  # the previous request: every message but the newest
    out: dict[str, Callable[[], Any]] = {
        "orjson.loads (baseline)": lambda: orjson.loads(raw),
        "jsonbody.items, hinted": lambda: jsonbody.items(raw, start, body["messages"]),
        "jsonbody.items, scan": lambda: jsonbody.items(raw, start),
        "cached prefix startswith": lambda: raw.startswith(prefix, start),
    }
    try:
        import msgspec
    except ImportError:
        return out

    chat = msgspec.defstruct("Chat", [("messages", list[msgspec.Raw])])  # local: no __future__ names
    decoder = msgspec.json.Decoder(chat)
    out["msgspec Raw messages"] = lambda: decoder.decode(raw)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", default="1,5,20", help="MB, comma separated")
    args = parser.parse_args(argv)
    print("| body | candidate | best ms | × orjson.loads |")
    print("|---|---|---:|---:|")
    for mb in (float(s) for s in args.sizes.split(",")):
        raw = history_body(int(mb * 1024 * 1024))
        times = {name: best_ms(fn, args.rounds) for name, fn in candidates(raw).items()}
        base = times["orjson.loads (baseline)"]
        for name, ms in times.items():
            print(f"| {len(raw) / 1e6:.1f} MB | {name} | {ms:.2f} | {ms / base:.2f}× |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
