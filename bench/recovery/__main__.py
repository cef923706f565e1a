"""``python -m bench.recovery``: run the arms, print the table, write the docs table and the raw JSON.

python -m bench.recovery [--episodes N] [--arms direct,default,...] [--max-steps S]
                         [--seed K] [--out docs/recovery.md] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from bench.recovery.arms import ARMS
from bench.recovery.metrics import arm_summary, episode_figures
from bench.recovery.report import splice, table
from bench.recovery.runner import run_all

#: Defaults sized so that every arm finishes in about 25 minutes on 2 shared cores.
DEFAULT_EPISODES = 20
DEFAULT_MAX_STEPS = 30
DEFAULT_SEED = 1000


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run, report; 0 on success, 2 on an unknown arm."""
    p = argparse.ArgumentParser(prog="python -m bench.recovery", description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=DEFAULT_EPISODES, help="episodes per arm")
    p.add_argument("--arms", default=",".join(ARMS), help="comma-separated, from: " + ", ".join(ARMS))
    p.add_argument(
        "--max-steps", type=int, default=DEFAULT_MAX_STEPS, help="agent requests per episode at most"
    )
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="episode i's seed is SEED + i")
    p.add_argument("--out", type=Path, help="a markdown page whose table (between the markers) is replaced")
    p.add_argument(
        "--threads", type=int, help="the model servers' CPU threads (default: the cores, at most 4)"
    )
    p.add_argument("--json", type=Path, help="raw records and figures (default: a file under /tmp)")
    args = p.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        print(f"unknown arm(s): {', '.join(unknown)}; known: {', '.join(ARMS)}", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="loopguard-recovery-"))
    t0 = time.monotonic()
    records = asyncio.run(
        run_all(
            arms,
            episodes=args.episodes,
            seed=args.seed,
            max_steps=args.max_steps,
            workdir=workdir,
            threads=args.threads,
        )
    )
    direct = {r["episode"]: r for r in records.get("direct", [])}
    figures = {
        arm: [episode_figures(r, direct.get(r["episode"])) for r in recs] for arm, recs in records.items()
    }
    summaries = {arm: arm_summary(f) for arm, f in figures.items()}
    md = table(summaries)
    print(md)
    elapsed = time.monotonic() - t0
    print(f"{elapsed:.0f} s in all; logs in {workdir}", file=sys.stderr)
    out_json = args.json or workdir / "recovery.json"
    meta = {
        "episodes": args.episodes,
        "max_steps": args.max_steps,
        "seed": args.seed,
        "seconds": round(elapsed),
    }
    payload = {"meta": meta, "summaries": summaries, "figures": figures, "records": records}
    out_json.write_text(json.dumps(payload, indent=1))
    print(f"raw records: {out_json}", file=sys.stderr)
    if args.out:
        args.out.write_text(splice(args.out.read_text(), md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
