"""The agent session alone, fast to iterate with: ``bench/run.py``'s session figures in about a
minute instead of the whole run.

Starts the fake upstream, the bare proxy, loopguard with the guards off and loopguard with the
defaults (the same arms as ``bench/run.py``, by its own functions), then sends the session of
:func:`workloads.session_bodies` (10 KB → 5 MB in 120 requests, concurrency 1) ``--rounds`` times
to every arm, interleaved arm by arm, and prints per arm the added latency over direct of the
first and last 10% of requests (median over the rounds of each request's latency first), and
what loopguard adds over loopguard-off. ``--hold ARM`` then replays the session's last
request on that arm for ``--seconds`` (a prefix-cache hit with nothing new, after the first), for
``py-spy record --pid`` (printed).

    .venv/bin/python bench/session.py [--rounds 3] [--per-round] [--hold loopguard --seconds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run
import workloads
from loadgen import HEADERS, PATH


async def _session(client: aiohttp.ClientSession, url: str, bodies: list[bytes]) -> list[float]:
    out: list[float] = []
    for body in bodies:
        t0 = time.perf_counter()
        async with client.post(url + PATH, data=body, headers=HEADERS) as r:
            await r.read()
            if r.status != 200:
                raise RuntimeError(f"{url}: HTTP {r.status}")
        out.append((time.perf_counter() - t0) * 1000)
    return out


def _edge(xs: list[float]) -> tuple[float, float]:
    k = max(1, len(xs) // 10)
    return statistics.median(xs[:k]), statistics.median(xs[-k:])


def _line(what: str, xs: list[float], ratio: bool = False) -> str:
    first, last = _edge(xs)
    tail = f" ({last / first:.1f}×)" if ratio and first else ""
    return f"{what} first 10% {first:+7.2f} ms, last 10% {last:+7.2f} ms{tail}"


def _report(lat: dict[str, list[list[float]]], n: int, first: int, last: int, per_round: bool) -> None:
    """Print the added latencies (each request's median over the rounds, less direct's)."""
    if per_round:
        for name, rounds in lat.items():
            for r, xs in enumerate(rounds):
                over = [x - y for x, y in zip(xs, lat["direct"][r], strict=True)]
                print(_line(f"round {r + 1} {name:14} added", over))
    med = {
        name: [statistics.median(col) for col in zip(*rounds, strict=True)] for name, rounds in lat.items()
    }
    print(f"{n} requests, {first:,} → {last:,} bytes, {len(lat['direct'])} rounds")
    for name in ("bare", "loopguard-off", "loopguard"):
        print(
            _line(
                f"{name:14} added p50", [x - d for x, d in zip(med[name], med["direct"], strict=True)], True
            )
        )
    for name, base in (("loopguard", "loopguard-off"), ("loopguard-off", "bare"), ("loopguard", "bare")):
        print(_line(f"{name} over {base}:", [x - o for x, o in zip(med[name], med[base], strict=True)]))


async def _main(args: argparse.Namespace) -> None:
    bodies = workloads.session_bodies(10 * 1024, 5 * 1024 * 1024, 120)
    tmp = Path(tempfile.mkdtemp(prefix="lg-session-"))
    try:
        upstream = run.start_upstream(tmp)
        arms = {
            "direct": upstream,
            "bare": run.start_bare(tmp, upstream.url),
            "loopguard-off": run.start_loopguard("loopguard-off", tmp, upstream.url, None, guards=False),
            "loopguard": run.start_loopguard("loopguard", tmp, upstream.url, None),
        }
        lat: dict[str, list[list[float]]] = {name: [] for name in arms}
        async with aiohttp.ClientSession() as client:
            for _ in range(args.rounds):
                for name, arm in arms.items():
                    lat[name].append(await _session(client, arm.url, bodies))
            _report(lat, len(bodies), len(bodies[0]), len(bodies[-1]), args.per_round)
            if args.hold:
                arm = arms[args.hold]
                print(f"replaying the last request on {args.hold}, pid {arm.pid}", flush=True)
                # the session's last request again and again: after the first, each one resumes
                # the kept prefix with nothing new (every per-request cost but the new steps')
                tail = bodies[-1:]
                end = time.monotonic() + args.seconds
                while time.monotonic() < end:
                    await _session(client, arm.url, tail)
    finally:
        run.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hold", choices=("bare", "loopguard-off", "loopguard"))
    ap.add_argument("--per-round", action="store_true", help="also each round's figures")
    ap.add_argument("--seconds", type=float, default=60.0)
    args: Any = ap.parse_args(argv)
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
