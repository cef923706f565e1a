"""The soak harness (bench/soak.py) runs end to end for a few seconds, so it cannot rot.

Not a soak: five seconds of load say nothing about leaks (the RSS of a fresh process grows as its
caches fill, and the proxy's idle upstream connections outlive a short settle), so the RSS and fd
checks may say FAIL here; this pins that the table and every verdict line are printed with their
figures, that every kind of traffic was sent, and that none of it failed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KINDS = {"loop_json", "loop_sse", "plain_json", "plain_sse", "big_json", "big_sse", "hang_up", "models"}
ROW = re.compile(r"^\|\s+(\d+) \|\s+(\d+) \|\s+([\d.]+) \|\s+([\d.]+) \|\s+(\d+) \|\s+(\d+) \|$")


def test_soak_smoke_prints_the_table_and_the_verdict(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "soak.py"),
            "--duration",
            "5s",
            "--interval",
            "1",
            "--settle",
            "0.5",
            "--concurrency",
            "4",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "| time s | requests | req/s | RSS MiB | fds | errors |"
    rows = [ROW.match(x) for x in lines[2:] if x.startswith("|")]
    assert len(rows) >= 4 and all(rows), lines
    assert int(rows[0][1]) == 0 and int(rows[-1][1]) >= 5
    assert all(float(r[4]) > 0 and int(r[5]) > 0 and int(r[6]) == 0 for r in rows)
    assert int(rows[-1][2]) > int(rows[0][2])
    verdict = [x for x in lines if x.startswith("- ")]
    assert [x.split(":")[0] for x in verdict] == ["- RSS", "- fds", "- errors", "- proxy"]
    assert "first quarter" in verdict[0] and "last quarter" in verdict[0]
    assert "before the load" in verdict[1] and "after it" in verdict[1]
    assert verdict[2].startswith("- errors: PASS: ") and "unexpected non-2xx: none" in verdict[2]
    assert verdict[3].startswith("- proxy: PASS: internal_errors 0, upstream_errors 0")
    assert lines[-1] in ("SOAK PASS", "SOAK FAIL")

    res = json.loads(out.read_text())
    assert res["mode"] == "soak" and res["errors"] == 0 and res["unexpected_status"] == {}
    assert set(res["kinds"]) >= KINDS, res["kinds"]
    assert res["hang_ups"] > 0 and res["requests"] > 0 and res["incident_lines"] > 0
    assert res["proxy_stats"]["reminders_injected"] > 0 and res["proxy_stats"]["results_withheld"] > 0
    # a disconnected line per hang-up (one whose stream the proxy had all sent already is at info),
    # plus the start's admin_loopback_only line (the soak sets no admin_token)
    assert 0 < res["proxy_log"]["warning"] - 1 <= res["hang_ups"]
    assert res["fds_before"] > 0 and res["fds_after"] > 0 and res["rss_after_mib"] > 0
    assert [v["check"] for v in res["verdict"]] == ["RSS", "fds", "errors", "proxy"]
