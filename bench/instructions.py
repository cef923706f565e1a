"""Instructions per request under callgrind: the bench's arms compared by what they execute, not
by how long it took, so the figure is the same on a quiet and on a loaded machine.

    .venv/bin/python bench/instructions.py [--requests 500] [--arms bare,loopguard-off,loopguard]
        [--workloads small,chat,agent] [--json FILE]

Starts the fake upstream, the load generator (``bench/run.py``'s) and each arm in turn under
``valgrind --tool=callgrind --instr-atstart=no`` (nothing is counted while it starts). Per
workload: 100 requests to warm up (the prefix cache, aiohttp's pools), then instrumentation on,
``--requests`` requests at concurrency 4, instrumentation off and a dump
(``callgrind_control``); the dump's total divided by the requests is the figure. Workload
``session`` (not run unless asked: several minutes an arm) is ``bench/run.py``'s agent session,
one conversation growing from 10 KB to 5 MB over 120 requests sent one after the other, counted
over its first and its last 10% of requests (the middle sent uncounted). Counted: the
arm's own user-space instructions (the interpreter, aiohttp's C parts, orjson); not counted: the
kernel's work (socket reads and writes, the same for every proxy), so ratios here are wider than
the throughput ratios of ``bench/run.py``, which include it. The same arms and configs as
``bench/run.py`` (``loopguard-off``: every guard off). Each arm takes about a minute.

Prints a markdown table (thousands of instructions per request, and each loopguard arm over
bare). Needs ``valgrind`` (Debian's package); says so and exits 2 without it.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run
import workloads
from loadgen import HEADERS, PATH

ARMS = ("bare", "loopguard-off", "loopguard")
WORKLOADS = ("small", "chat", "agent")
#: The agent session of ``bench/run.py`` (10 KB → 5 MB in 120 requests, one conversation, sent one
#: after the other): counted over its first and its last 10% of requests, the rest sent uncounted.
SESSION = "session"
SESSION_SPAN = (10 * 1024, 5 * 1024 * 1024, 120)
WARMUP = 100
CONCURRENCY = 4


def _totals(path: Path) -> int:
    """The ``totals:`` line of one callgrind dump: instructions counted (its ``summary:`` line
    is wrong after the first dump of a run: valgrind 3.19 subtracts the earlier dumps twice)."""
    for line in path.read_text().splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"{path}: no totals line")


def _control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True, timeout=120)


def measure(
    arm_name: str, tmp: Path, upstream: str, gen: run.LoadGen, workloads: list[str], n: int
) -> dict[str, float]:
    """Thousands of instructions per request of ``arm_name`` for each workload."""
    out_file = tmp / f"{arm_name}.callgrind"
    prefix = ("valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out_file}")
    if arm_name == "bare":
        arm = run.start_bare(tmp, upstream, prefix=prefix, timeout=600)
    else:
        arm = run.start_loopguard(
            arm_name,
            tmp,
            upstream,
            None,
            guards=False if arm_name == "loopguard-off" else None,
            prefix=prefix,
            timeout=600,
        )
    figures: dict[str, float] = {}
    dumps = iter(range(1, 100))
    try:
        for workload in workloads:
            if workload == SESSION:
                first, last = asyncio.run(_session(arm, out_file, dumps))
                figures["session first 10%"], figures["session last 10%"] = first, last
                continue
            k = next(dumps)
            batch = {
                "op": "batch",
                "url": arm.url,
                "workload": workload,
                "concurrency": CONCURRENCY,
                "duration": 0,
            }
            gen.call({**batch, "min": WARMUP, "max": WARMUP}, timeout=3000)
            _control("-i", "on", str(arm.pid))
            r = gen.call({**batch, "min": n, "max": n}, timeout=3000)
            _control("-d", str(arm.pid))  # dump and zero: one file per workload
            _control("-i", "off", str(arm.pid))
            if r["errors"]:
                raise RuntimeError(f"{arm_name} {workload}: {r['errors']} errors ({r['first_error']})")
            figures[workload] = _totals(_dump(out_file, k)) / r["n"] / 1000
    finally:
        run.stop(arm)
    return figures


def _dump(out_file: Path, k: int) -> Path:
    """The ``k``-th dump's file, once callgrind has written it."""
    dump = Path(f"{out_file}.{k}")
    deadline = time.monotonic() + 30
    while not dump.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    return dump


async def _session(arm: run.Arm, out_file: Path, dumps: Any) -> tuple[float, float]:
    """The session's requests in order: thousands of instructions per request over the first
    and the last 10% of them (those two stretches counted, the middle sent uncounted)."""
    bodies = workloads.session_bodies(*SESSION_SPAN)
    tenth = max(1, len(bodies) // 10)
    counted = {0: "first", len(bodies) - tenth: "last"}
    out: dict[str, float] = {}
    timeout = aiohttp.ClientTimeout(total=3000)
    async with aiohttp.ClientSession(timeout=timeout) as client:
        for i, body in enumerate(bodies):
            if i in counted:
                await asyncio.to_thread(_control, "-i", "on", str(arm.pid))
            async with client.post(arm.url + PATH, data=body, headers=HEADERS) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"{arm.name} session request {i + 1}: HTTP {r.status}")
            if i + 1 - tenth in counted:
                await asyncio.to_thread(_control, "-d", str(arm.pid))
                await asyncio.to_thread(_control, "-i", "off", str(arm.pid))
                out[counted[i + 1 - tenth]] = _totals(_dump(out_file, next(dumps))) / tenth / 1000
    return out["first"], out["last"]


def report(res: dict[str, dict[str, float]], asked: list[str]) -> str:
    workloads = [
        w for a in asked for w in ((f"{SESSION} first 10%", f"{SESSION} last 10%") if a == SESSION else (a,))
    ]
    lines = [
        "| arm | "
        + " | ".join(f"{w} kIr/req" for w in workloads)
        + " | "
        + " | ".join(f"{w} / bare" for w in workloads)
        + " |"
    ]
    lines.append("|---|" + "---:|" * (2 * len(workloads)))
    bare = res.get("bare", {})
    for arm, figs in res.items():
        cells = [f"{figs[w]:,.0f}" for w in workloads]
        ratios = [f"{figs[w] / bare[w]:.2f}×" if bare.get(w) else "" for w in workloads]
        lines.append(f"| {arm} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--keep", action="store_true", help="keep the callgrind dumps (printed folder)")
    args: Any = ap.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("bench/instructions.py needs valgrind (apt-get install valgrind)", file=sys.stderr)
        return 2
    arms = [a for a in args.arms.split(",") if a]
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = sorted(set(arms) - set(ARMS)) + sorted(set(workloads) - {*run.WORKLOADS, SESSION})
    if unknown:
        ap.error(f"unknown arm or workload: {', '.join(unknown)}")
    tmp = Path(tempfile.mkdtemp(prefix="lg-instructions-"))
    res: dict[str, dict[str, float]] = {}
    try:
        upstream = run.start_upstream(tmp)
        gen = run.LoadGen(tmp)
        for arm in arms:
            run.log(f"{arm} under callgrind")
            res[arm] = measure(arm, tmp, upstream.url, gen, workloads, args.requests)
        gen.quit()
    finally:
        run.stop_all()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(report(res, workloads))
    if args.json:
        args.json.write_bytes(
            orjson.dumps({"requests": args.requests, "kIr_per_request": res}, option=orjson.OPT_INDENT_2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
