"""loopguard soak test: hours of mixed traffic in minutes of reading; not part of CI.

    python bench/soak.py [--duration 30m] [--interval 30] [--concurrency 8] [--json soak.json]

Runs the real ``loopguard serve`` (its own process, default guards, an incident log in a temporary
directory) in front of the bench's fake upstream (``fake_upstream.py``) and drives, from this
process, ``--concurrency`` agents that cycle through a fixed mix until ``--duration`` has passed:

- looping conversations (:func:`workloads.memory_body`: reminders, then withheld results and an
  incident per conversation), JSON and SSE, each conversation growing for 12 requests before a new
  one starts, so the proxy sees thousands of distinct conversations;
- plain conversations that make progress (:func:`workloads.plain_body`), JSON and SSE;
- big bodies: the bench's 1 MiB looping history (JSON and SSE) and, every 200th request, 5 MiB;
- agents that hang up mid-stream (after the first read), and ``GET /v1/models``.

Every ``--interval`` seconds it samples the proxy's RSS (``VmRSS`` in ``/proc/<pid>/status``) and
open file descriptors (``/proc/<pid>/fd``) and prints one row of a table (time, requests done,
requests/s since the last row, RSS MiB, fds, errors). After the load: the agents' connections are
closed, ``--settle`` seconds pass (aiohttp closes the proxy's idle upstream connections 15 to 30 s
after their last use) and the fds are counted again. The verdict:

- RSS: the mean of the rows in the first quarter of the run (under load) against the mean of the
  rows in the last quarter; PASS when it grew by at most ``--rss-limit`` percent (or 5 MiB,
  whichever is more);
- fds: before the first request against after the settle; PASS when at most 2 more;
- errors: every answer must be a 200 (a JSON body, or a stream that ends with ``[DONE]``); any
  other status (counted per status), a broken answer or a client error is unexpected;
- the proxy: ``internal_errors`` and ``upstream_errors`` of ``GET /loop-guard`` are 0 and its log
  has no error-level line.

Exit status: 0 when every check passes, 1 when one fails, 2 when the harness itself could not run.
The table and the verdict go to stdout, progress to stderr, everything measured to ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import run as bench
import workloads

PATH = "/v1/chat/completions"
HEADERS = {"Content-Type": "application/json", "Authorization": f"Bearer {bench.BENCH_KEY}"}
#: Requests per conversation before the next one starts.
CONVERSATION_REQUESTS = 12
#: One cycle of the traffic mix (each agent takes the next entry); see the module docstring.
MIX = (
    ["loop_json"] * 6
    + ["loop_sse"] * 3
    + ["plain_json"] * 4
    + ["plain_sse"] * 2
    + ["big_json", "big_sse", "hang_up", "models"]
)
BIG_EVERY = 200  # every this many requests, a 5 MiB body
FD_SLACK = 2
RSS_SLACK_MIB = 5.0


def parse_duration(text: str) -> float:
    """Seconds of ``30m``, ``90s``, ``1.5h`` (a bare number is minutes)."""
    text = text.strip().lower()
    scale = {"s": 1, "m": 60, "h": 3600}.get(text[-1:])
    try:
        return float(text[:-1]) * scale if scale else float(text) * 60
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30m, 90s, 1h)") from None


def rss_mib(pid: int) -> float:
    return bench.memory_mb([pid], "VmRSS")


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@dataclass
class Driver:
    """The agents: the traffic mix, and what came back."""

    base: str
    done: int = 0
    errors: int = 0
    hang_ups: int = 0
    first_error: str | None = None
    unexpected: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    _seq: Counter[str] = field(default_factory=Counter)
    _mix: Any = field(default_factory=lambda: itertools.cycle(MIX))
    _big: dict[str, bytes] = field(default_factory=dict)

    def big(self, size: str, stream: bool) -> bytes:
        key = f"{size}/{stream}"
        if key not in self._big:
            self._big[key] = workloads.history_body(workloads.SIZES[size], stream=stream)
        return self._big[key]

    def body(self, kind: str) -> bytes:
        """The next body of ``kind``: request ``j`` of conversation ``c`` of that kind."""
        k = self._seq[kind]
        self._seq[kind] += 1
        c, j = divmod(k, CONVERSATION_REQUESTS)
        stream = kind.endswith("_sse") or kind == "hang_up"
        if kind.startswith("plain"):
            return workloads.plain_body(c, j + 1, stream)
        if kind.startswith("big"):
            return self.big("1MB", stream)
        # looping; the hung-up streams are conversations of their own (offset: never the same)
        return workloads.memory_body(c + (10_000_000 if kind == "hang_up" else 0), j + 1, stream)

    def fail(self, what: str) -> None:
        self.errors += 1
        self.first_error = self.first_error or what

    async def one(self, s: aiohttp.ClientSession, kind: str) -> None:
        n = self.done + self.errors + self.hang_ups + 1
        if kind != "models" and n % BIG_EVERY == 0:
            kind, body = "big_5mb", self.big("5MB", False)
        elif kind != "models":
            body = self.body(kind)
        self.kinds[kind] += 1
        try:
            if kind == "models":
                async with s.get(self.base + "/v1/models") as r:
                    data = await r.read()
                    ok = r.status == 200 and data.startswith(b"{")
            else:
                async with s.post(self.base + PATH, data=body, headers=HEADERS) as r:
                    if kind == "hang_up":
                        if r.status == 200:
                            await r.content.readany()
                            r.close()  # the agent goes away mid-stream
                            self.hang_ups += 1
                            return
                        data = b""
                    else:
                        data = await r.read()
                    stream = r.content_type == "text/event-stream"
                    ok = r.status == 200 and (b"data: [DONE]" in data if stream else data.startswith(b"{"))
            if r.status != 200:
                self.unexpected[str(r.status)] += 1
                self.fail(f"{kind}: HTTP {r.status}: {data[:200]!r}")
            elif not ok:
                self.fail(f"{kind}: broken answer ({len(data)} bytes, ends {data[-80:]!r})")
            else:
                self.done += 1
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            self.fail(f"{kind}: {type(exc).__name__}: {exc}")

    async def agent(self, s: aiohttp.ClientSession, until: float) -> None:
        while time.monotonic() < until:
            await self.one(s, next(self._mix))


def quarter_means(rows: list[dict[str, Any]], duration: float) -> tuple[float, float]:
    """Mean RSS of the rows in the first quarter of the run (under load: not the row at 0 s) and
    of the rows in the last quarter (a quarter shorter than the interval: its one nearest row)."""
    first = [r["rss_mib"] for r in rows[1:] if r["t"] <= duration / 4] or [
        rows[min(1, len(rows) - 1)]["rss_mib"]
    ]
    last = [r["rss_mib"] for r in rows[1:] if r["t"] >= duration * 3 / 4] or [rows[-1]["rss_mib"]]
    return sum(first) / len(first), sum(last) / len(last)


def row_line(r: dict[str, Any]) -> str:
    return (
        f"| {r['t']:7.0f} | {r['requests']:8d} | {r['rps']:6.1f} | {r['rss_mib']:7.1f} | {r['fds']:4d} "
        f"| {r['errors']:6d} |"
    )


async def drive(args: argparse.Namespace, base: str, pid: int) -> dict[str, Any]:
    driver = Driver(base)
    out: dict[str, Any] = {"fds_before": fd_count(pid), "rss_before_mib": rss_mib(pid)}
    connector = aiohttp.TCPConnector(limit=args.concurrency * 2)
    timeout = aiohttp.ClientTimeout(total=300)
    rows: list[dict[str, Any]] = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as s:
        for kind in dict.fromkeys(MIX):  # one of each before the clock starts
            await driver.one(s, kind)
        bench.log(f"warm-up done ({driver.done} ok, {driver.errors} errors); {args.duration:.0f} s of load")
        print("| time s | requests | req/s | RSS MiB | fds | errors |")
        print("|-------:|---------:|------:|--------:|----:|-------:|", flush=True)
        t0 = time.monotonic()
        until = t0 + args.duration
        agents = [asyncio.create_task(driver.agent(s, until)) for _ in range(args.concurrency)]
        last_t, last_n = 0.0, driver.done
        while True:
            t = time.monotonic() - t0
            row = {
                "t": round(t, 1),
                "requests": driver.done,
                "rps": (driver.done - last_n) / (t - last_t) if t > last_t else 0.0,
                "rss_mib": round(rss_mib(pid), 2),
                "fds": fd_count(pid),
                "errors": driver.errors,
            }
            rows.append(row)
            print(row_line(row), flush=True)
            last_t, last_n = t, driver.done
            if t >= args.duration:
                break
            await asyncio.sleep(min(args.interval, max(0.0, args.duration - t)))
        await asyncio.gather(*agents)
        out["fds_loaded"] = fd_count(pid)
    bench.log(f"load done; {args.settle:.0f} s for idle connections to close")
    await asyncio.sleep(args.settle)
    out.update(
        fds_after=fd_count(pid),
        rss_after_mib=rss_mib(pid),
        rows=rows,
        requests=driver.done,
        hang_ups=driver.hang_ups,
        errors=driver.errors,
        first_error=driver.first_error,
        unexpected_status=dict(driver.unexpected),
        kinds=dict(driver.kinds),
    )
    return out


def proxy_log_levels(path: Path | None) -> Counter[str]:
    levels: Counter[str] = Counter()
    if path is None or not path.exists():
        return levels
    with path.open("rb") as f:
        for line in f:
            try:
                levels[orjson.loads(line).get("level", "?")] += 1
            except orjson.JSONDecodeError:
                levels["not json"] += 1
    return levels


def verdict(res: dict[str, Any], duration: float, rss_limit: float) -> list[tuple[str, bool, str]]:
    """(check, passed, measured) for each check of the module docstring."""
    first, last = quarter_means(res["rows"], duration)
    growth = last - first
    allowed = max(RSS_SLACK_MIB, first * rss_limit / 100)
    checks = [
        (
            "RSS",
            growth <= allowed,
            f"first quarter {first:.1f} MiB, last quarter {last:.1f} MiB: {growth:+.1f} MiB "
            f"({growth / first * 100:+.1f}%; limit +{allowed:.1f} MiB)",
        ),
        (
            "fds",
            res["fds_after"] <= res["fds_before"] + FD_SLACK,
            f"{res['fds_before']} before the load, {res['fds_after']} after it (idle, "
            f"{res['settle_s']:.0f} s later); max {max(r['fds'] for r in res['rows'])} under load",
        ),
        (
            "errors",
            res["errors"] == 0,
            f"{res['requests']} requests ok, {res['hang_ups']} hung up on purpose, {res['errors']} "
            f"errors; unexpected non-2xx: {res['unexpected_status'] or 'none'}"
            + (f"; first: {res['first_error']}" if res["first_error"] else ""),
        ),
    ]
    stats, levels = res["proxy_stats"], res["proxy_log"]
    proxy_ok = (
        stats.get("internal_errors") == 0 and stats.get("upstream_errors") == 0 and not levels.get("error")
    )
    checks.append(
        (
            "proxy",
            proxy_ok,
            f"internal_errors {stats.get('internal_errors')}, upstream_errors "
            f"{stats.get('upstream_errors')}; log lines {dict(sorted(levels.items()))}",
        )
    )
    return checks


def soak(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    upstream = bench.start_upstream(tmp)
    config = {"guards": {"circuit_breaker": {"incident_log": str(tmp / "incidents.jsonl")}}}
    arm = bench.start_loopguard("loopguard-soak", tmp, upstream.url, config)
    assert arm.pid is not None
    bench.log(f"loopguard {arm.version} pid {arm.pid} at {arm.url}; upstream {upstream.url}")
    res: dict[str, Any] = {
        "mode": "soak",
        "machine": bench.machine_line(),
        "loopguard": arm.version,
        "duration_s": args.duration,
        "interval_s": args.interval,
        "concurrency": args.concurrency,
        "settle_s": args.settle,
    }
    res.update(asyncio.run(drive(args, arm.url, arm.pid)))
    stats = bench._get_json(f"{arm.url}/loop-guard")
    stats.pop("incidents", None)
    res["proxy_stats"] = stats
    bench.stop(arm)
    res["proxy_log"] = dict(proxy_log_levels(arm.log_path))
    incidents = tmp / "incidents.jsonl"
    res["incident_lines"] = len(incidents.read_bytes().splitlines()) if incidents.exists() else 0
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--duration",
        type=parse_duration,
        default=parse_duration("30m"),
        help="how long to drive load: 30m (default), 90s, 1h; a bare number is minutes",
    )
    p.add_argument("--interval", type=float, default=30.0, help="seconds between samples (default 30)")
    p.add_argument("--concurrency", type=int, default=8, help="agents sending at once (default 8)")
    p.add_argument(
        "--settle",
        type=float,
        default=40.0,
        help="seconds to wait after the load before counting fds again (default 40)",
    )
    p.add_argument(
        "--rss-limit",
        type=float,
        default=10.0,
        help="RSS growth allowed between the first and last quarter, percent (default 10)",
    )
    p.add_argument("--json", help="write everything measured to this file")
    p.add_argument("--keep-logs", action="store_true", help="keep the proxy's log (path on stderr)")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="loopguard-soak-"))
    try:
        res = soak(args, tmp)
    except Exception as exc:
        bench.log(f"soak could not run: {type(exc).__name__}: {exc}")
        return 2
    finally:
        bench.stop_all()
        if args.keep_logs:
            bench.log(f"logs kept in {tmp}")
        else:
            with contextlib.suppress(OSError):
                for f in tmp.iterdir():
                    f.unlink()
                tmp.rmdir()
    checks = verdict(res, args.duration, args.rss_limit)
    res["verdict"] = [{"check": c, "result": "PASS" if ok else "FAIL", "measured": m} for c, ok, m in checks]
    passed = all(ok for _, ok, _ in checks)
    res["result"] = "PASS" if passed else "FAIL"
    print()
    m = res["machine"]
    print(
        f"Machine: {m['cores']} cores ({m['cpu']}), {m['memory_gib']} GiB, Python {m['python']}, "
        f"loopguard {m['loopguard']}; load average at start {' '.join(map(str, m['loadavg_at_start']))} "
        "(shared machine: other processes may be running)."
    )
    print(
        f"Proxy: {res['proxy_stats'].get('requests')} requests; incidents written: {res['incident_lines']}; "
        f"actions {res['proxy_stats'].get('per_rule')}"
    )
    print("Verdict:")
    for c, ok, m in checks:
        print(f"- {c}: {'PASS' if ok else 'FAIL'}: {m}")
    print(f"SOAK {res['result']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
