"""The benchmark harness (bench/run.py) runs end to end in --smoke mode, so it cannot rot.

Not timed: the numbers of a smoke run mean nothing; this pins that every arm that runs produced
every figure (exact keys, counts > 0) and that LiteLLM is reported as not run, never dropped.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The uvloop arm runs where the optional extra is installed (``pip install 'loopguard[uvloop]'``);
#: without it the arm is reported as not run, saying why, like LiteLLM's.
HAVE_UVLOOP = importlib.util.find_spec("uvloop") is not None
RUN_ARMS = {"direct", "bare", "loopguard-off", "loopguard", "loopguard-nocache"} | (
    {"loopguard-uvloop"} if HAVE_UVLOOP else set()
)
ALL_ARMS = RUN_ARMS | {"litellm", "loopguard-uvloop"}
CELLS = {f"{w}/c{c}" for w in ("small", "agent", "chat", "stream") for c in (1, 16)}
FIGURES = {
    "n",
    "errors",
    "first_error",
    "p50_ms",
    "p99_ms",
    "added_p50_ms",
    "added_p99_ms",
    "rps",
    "cpu_s_per_1k",
}
STREAM_FIGURES = FIGURES | {
    "ttfb_p50_ms",
    "ttfb_p99_ms",
    "added_ttfb_p50_ms",
    "added_ttfb_p99_ms",
    "gap_p50_ms",
    "gap_p99_ms",
    "added_gap_p50_ms",
    "added_gap_p99_ms",
    "events_min",
    "events_max",
    "merged_read_fraction",
}


def _numbers(figures: dict, keys: set[str]) -> None:
    for k in keys - {"first_error"}:
        assert isinstance(figures[k], int | float), (k, figures[k])


def test_bench_smoke_gives_every_arm_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--smoke", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    res = json.loads(out.read_text())
    assert res["mode"] == "smoke"

    assert set(res["arms"]) == ALL_ARMS
    assert res["arms"]["litellm"]["status"] == "not run"
    assert res["arms"]["litellm"]["reason"]
    if not HAVE_UVLOOP:
        uvloop_arm = res["arms"]["loopguard-uvloop"]
        assert uvloop_arm["status"] == "not run"
        assert "uvloop is not installed" in uvloop_arm["reason"], uvloop_arm["reason"]
    for name in RUN_ARMS:
        arm = res["arms"][name]
        assert arm["status"] == "ok", (name, arm["reason"])
        assert arm["peak_rss_mb"] > 0

    assert set(res["workloads"]) == CELLS
    for cell, row in res["workloads"].items():
        assert set(row) == RUN_ARMS, cell
        keys = STREAM_FIGURES if cell.startswith("stream/") else FIGURES
        for name, figures in row.items():
            assert set(figures) == keys, (cell, name)
            assert figures["n"] > 0 and figures["errors"] == 0, (cell, name, figures["first_error"])
            assert figures["rps"] > 0 and figures["p50_ms"] > 0
            _numbers(figures, keys)
            if cell.startswith("stream/"):
                assert figures["events_min"] == 64, (cell, name)

    assert set(res["scaling"]) == {"10KB", "100KB", "1MB", "5MB"}
    for size, row in res["scaling"].items():
        assert row["bytes"] > 0 and row["tool_calls"] > 0
        assert set(row["arms"]) == RUN_ARMS, size
        for name, figures in row["arms"].items():
            assert figures["n"] > 0 and figures["errors"] == 0, (size, name)
            _numbers(figures, FIGURES)

    session = res["session"]
    assert set(session) == {"start_bytes", "end_bytes", *RUN_ARMS}
    for name in RUN_ARMS:
        assert session[name]["errors"] == 0, (name, session[name]["first_error"])
        assert session[name]["n"] == session["direct"]["n"] >= 5, name
    assert session["loopguard"]["requests"] == session["direct"]["n"]
    assert session["loopguard"]["growth"] is not None
    assert set(res["memory"]) == {"loopguard", "loopguard-all-guards"}
    for name, mem in res["memory"].items():
        assert mem["status"] == "ok", (name, mem.get("reason"))
        assert mem["n"] == mem["requests"] > 0 and mem["errors"] == 0, name
        assert mem["rss_after_first_mb"] > 0 and mem["rss_after_all_mb"] > 0

    # the default guards really rewrote every looping request and skipped every plain chat (no
    # tools, no calls: nothing to guard); with every guard off, none rewritten
    lg, off = res["loopguard_stats"], res["loopguard_off_stats"]
    chats = sum(res["workloads"][f"chat/c{c}"]["loopguard"]["n"] for c in (1, 16))  # no warm-up
    assert lg["nothing_to_guard"] == chats == 3 + 16
    assert lg["guarded_requests"] > 0
    assert lg["rewritten_requests"] == lg["guarded_requests"] - lg["nothing_to_guard"]
    assert lg["internal_errors"] == 0
    assert off["rewritten_requests"] == 0

    assert res["targets"] and all(t["result"] in {"PASS", "FAIL", "SKIP"} for t in res["targets"])
    assert all(t["result"] == "SKIP" for t in res["targets"] if "LiteLLM" in t["target"])
    assert "Machine:" in done.stdout and "| target | result | measured |" in done.stdout


def test_instruction_counts_run_end_to_end(tmp_path: Path) -> None:
    """``bench/instructions.py`` counts each arm's instructions per request under callgrind: a
    figure for every arm and workload asked for, the bare arm's ratio exactly 1."""
    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is not installed (.ci/run installs it)")
    out = tmp_path / "instructions.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "instructions.py"),
            "--requests",
            "20",
            "--arms",
            "bare,loopguard-off",
            "--workloads",
            "chat",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["requests"] == 20
    figures = res["kIr_per_request"]
    assert sorted(figures) == ["bare", "loopguard-off"]
    assert [sorted(f) for f in figures.values()] == [["chat"], ["chat"]]
    # a forwarded request costs an aiohttp proxy a few hundred thousand instructions at least
    assert all(f["chat"] > 100 for f in figures.values())
    table = done.stdout.splitlines()
    assert table[0] == "| arm | chat kIr/req | chat / bare |"
    assert table[2].startswith("| bare | ") and table[2].endswith(" | 1.00× |")
