"""loopguard benchmark: every arm side by side, in one run, on this machine, over loopback only.

    python bench/run.py [--json bench/results.json] [--rounds 3] [--skip-litellm] [--smoke]

Processes (each its own): a fast fake upstream (``fake_upstream.py``), the load generator
(``loadgen.py``, aiohttp client) and one process per arm:

1. ``direct``: the load generator talks to the fake upstream;
2. ``bare``: ``bare_proxy.py``, a minimal aiohttp reverse proxy (the floor for Python);
3. ``loopguard-off``: loopguard with every guard off: every ``enabled: false`` found in its
   ``proxy.config`` (read at run time), and the response side's limits at their off value;
4. ``loopguard``: loopguard with the default guards; every body is a looping conversation, so
   reminders and denials are injected on every request;
5. ``loopguard-nocache``: the default guards with ``prefix_cache.max_bytes_mb: 0`` (every
   history read in full, as without the prefix cache);
6. ``loopguard-uvloop``: the default guards on uvloop (``LOOPGUARD_EVENT_LOOP=uvloop``; every other
   arm, bare included, runs on asyncio's own loop);
7. ``litellm``: LiteLLM proxy, latest from PyPI, installed into its own venv under
   ``~/.cache/loopguard-bench`` and configured with the fake upstream as an OpenAI-compatible model.

An arm that cannot be installed or started is reported as ``not run`` with the reason.

Workloads, on every arm, interleaved (each round runs every arm once per workload, the arm order
rotating every round, so machine drift hits all arms alike): ``small`` (4 KB looping chat, not
streamed), ``agent`` (1 MiB history with ~300 tool calls, not streamed), ``chat`` (a plain chat:
no tools, no calls), ``stream`` (the small chat
answered with 64 SSE events 5 ms apart), each at concurrency 1 (latency) and 16 (throughput); then
body-size scaling (10 KB, 100 KB, 1 MB, 5 MB histories, concurrency 1), the agent session (one
conversation growing from 10 KB to 5 MB over 120 requests, each the previous one plus the next
steps, concurrency 1) and the memory test
(10,000 requests over 1,000 distinct conversations on fresh loopguard processes, one with the
default guards and one with every guard on).

Figures per arm: latency p50/p99 and the latency added over ``direct`` (same run), requests/s,
CPU seconds per 1000 requests and peak RSS (from ``/proc`` for the arm's process tree; for
``direct`` that is the fake upstream itself). A markdown report goes to stdout (progress to
stderr) and everything measured to the JSON file. ``--smoke`` runs a few requests per arm
(LiteLLM skipped) to check that the harness works; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import json
import os
import platform
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import workloads

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
CACHE = Path(os.environ.get("LOOPGUARD_BENCH_CACHE", Path.home() / ".cache" / "loopguard-bench"))
CLK_TCK = os.sysconf("SC_CLK_TCK")
#: Sent as ``Authorization: Bearer …`` by the load generator to every arm; LiteLLM's master key.
BENCH_KEY = "sk-bench-" + secrets.token_hex(16)

ARMS = ("direct", "bare", "loopguard-off", "loopguard", "loopguard-nocache", "loopguard-uvloop", "litellm")
ARM_LABELS = {
    "direct": "direct (no proxy)",
    "bare": "bare aiohttp proxy",
    "loopguard-off": "loopguard, guards off",
    "loopguard": "loopguard, default guards",
    "loopguard-nocache": "loopguard, default guards, prefix cache off (every history read in full)",
    "loopguard-uvloop": "loopguard, default guards, on uvloop",
    "litellm": "LiteLLM proxy",
}
WORKLOADS = ("small", "agent", "chat", "stream")
#: The loopguard arms compared in the ratios (``loopguard-uvloop`` runs on uvloop, every other arm,
#: bare included, on asyncio's own loop: its ratios to bare say what the faster loop buys).
LOOPGUARD_ARMS = ("loopguard", "loopguard-nocache", "loopguard-off", "loopguard-uvloop")
CONCURRENCY = (1, 16)
LITELLM_WORKERS = ("--num_workers", "1")
LITELLM_MAX_AGE_S = 7 * 24 * 3600  # reinstall (upgrade) the cached LiteLLM after a week


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- /proc ----------------------------------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    kids = _children()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of the processes (plus their reaped children), in seconds."""
    total = 0
    for p in pids:
        with contextlib.suppress(OSError):
            f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])
    return total / CLK_TCK


def memory_mb(pids: list[int], field_name: str) -> float:
    """Sum of a ``/proc/<pid>/status`` memory field (``VmRSS``, ``VmHWM``) in MB."""
    total = 0
    for p in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith(field_name + ":"):
                    total += int(line.split()[1])
    return total / 1024


# --- processes ------------------------------------------------------------------------------------


@dataclass
class Arm:
    name: str
    url: str = ""
    proc: subprocess.Popen[bytes] | None = None
    pid: int | None = None  # whose /proc figures are read
    status: str = "ok"
    reason: str = ""
    version: str = ""
    log_path: Path | None = None
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def tree(self) -> list[int]:
        if self.pid is None:
            return []
        return process_tree(self.pid)


STARTED: list[subprocess.Popen[bytes]] = []


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the bench process dies, however it dies (a test
    timeout kills it with SIGKILL), so no arm outlives the run."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def spawn(
    cmd: list[str], log_path: Path | None, merge_stdout: bool = False, **kw: Any
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in its own session (process group), stderr (and stdout if ``merge_stdout``)
    to ``log_path``, without ``LOOPGUARD_*`` variables from this environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPGUARD_")}
    env["BENCH_KEY"] = BENCH_KEY
    env.update(kw.pop("env", {}))
    with open(log_path or os.devnull, "wb") as out:  # the child keeps its own copy of the descriptor
        if merge_stdout:
            kw["stdout"] = out
        p = subprocess.Popen(
            cmd, stderr=out, env=env, start_new_session=True, preexec_fn=_die_with_parent, **kw
        )
    STARTED.append(p)
    return p


def stop_all() -> None:
    """End the processes this run started (each by its own process group id)."""
    for p in STARTED:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    for p in STARTED:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    STARTED.clear()


def stop(arm: Arm) -> None:
    """End one arm's process (its own process group) and wait for it."""
    p = arm.proc
    if p is None or p.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGTERM)
    try:
        p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def read_port_line(p: subprocess.Popen[bytes], timeout: float) -> int:
    assert p.stdout is not None
    ready, _, _ = select.select([p.stdout], [], [], timeout)
    if not ready:
        raise RuntimeError(f"no PORT line within {timeout:.0f} s")
    line = p.stdout.readline().decode().strip()
    if not line.startswith("PORT "):
        raise RuntimeError(f"unexpected output {line!r}")
    return int(line.split()[1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path | None, n: int = 3) -> str:
    if path is None or not path.exists():
        return ""
    return tail_text(path.read_text(errors="replace"), n)


def wait_http(url: str, p: subprocess.Popen[bytes], timeout: float, log_path: Path | None) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise RuntimeError(f"exited with code {p.returncode}: {tail(log_path)}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError) as e:
            last = str(e)
        time.sleep(0.1)
    raise RuntimeError(f"not ready after {timeout:.0f} s ({last}): {tail(log_path)}")


def post_json(url: str, body: bytes, timeout: float = 60) -> tuple[int, bytes]:
    req = urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/json", "Authorization": f"Bearer {BENCH_KEY}"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def start_upstream(tmp: Path) -> Arm:
    p = spawn([sys.executable, str(BENCH / "fake_upstream.py")], tmp / "upstream.log", stdout=subprocess.PIPE)
    port = read_port_line(p, 30)
    return Arm("direct", f"http://127.0.0.1:{port}", p, p.pid, note="figures of the fake upstream itself")


def start_bare(tmp: Path, upstream: str, prefix: tuple[str, ...] = (), timeout: float = 30) -> Arm:
    """The bare proxy on a free port; ``prefix``: a command it runs under (``valgrind …``)."""
    arm = Arm("bare", log_path=tmp / "bare.log")
    p = spawn(
        [*prefix, sys.executable, str(BENCH / "bare_proxy.py"), "--upstream", upstream],
        arm.log_path,
        stdout=subprocess.PIPE,
    )
    arm.proc, arm.pid = p, p.pid
    arm.url = f"http://127.0.0.1:{read_port_line(p, timeout)}"
    arm.version = f"aiohttp {_version('aiohttp')}"
    return arm


#: Run in a child with the arms' interpreter and cwd, so it reads the ``proxy.config`` they run:
#: prints a config that sets every ``enabled`` key anywhere in it to on/off; "off" also sets the
#: response side's limits that exist to their documented off value (0 / false).
_GUARDS_ALL = """
import dataclasses, json, sys, typing
from proxy.config import Config
ON = sys.argv[1] == "on"
OFF = {"after_ignored_denials": 0, "on_cap": False, "max_calls_per_response": 0,
       "max_identical_per_response": 0, "max_identical_reads_per_response": 0}
def walk(cls):
    hints, out = typing.get_type_hints(cls), {}
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        if dataclasses.is_dataclass(t):
            sub = walk(t)
            if sub:
                out[f.name] = sub
        elif f.name == "enabled":
            out[f.name] = ON
        elif not ON and f.name in OFF:
            out[f.name] = OFF[f.name]
    return out
print(json.dumps(walk(Config)))
"""


def guards_config(on: bool) -> dict[str, Any]:
    """A config that turns every guard on or off (:data:`_GUARDS_ALL`), for the guards that exist
    in the ``proxy.config`` the loopguard arms run."""
    done = subprocess.run(
        [sys.executable, "-c", _GUARDS_ALL, "on" if on else "off"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"cannot read proxy.config: {tail_text(done.stderr)}")
    return json.loads(done.stdout)


def tail_text(text: str, n: int = 3) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[-300:]


def start_loopguard(
    name: str,
    tmp: Path,
    upstream: str,
    config: dict[str, Any] | None,
    guards: bool | None = None,
    loop: str = "asyncio",
    prefix: tuple[str, ...] = (),
    timeout: float = 60,
) -> Arm:
    """loopguard on a free port: with ``config`` (None = defaults), or with every guard on or off
    (``guards``); on asyncio's own event loop, like the bare arm, or on ``loop``
    (``LOOPGUARD_EVENT_LOOP``: ``uvloop``). ``prefix``: a command it runs under (``valgrind …``),
    ``timeout``: seconds it gets to answer its health check."""
    arm = Arm(name, log_path=tmp / f"{name}.log")
    if guards is not None:
        config = guards_config(guards)
    port = free_port()
    cmd = [
        *prefix,
        sys.executable,
        "-m",
        "proxy",
        "serve",
        "--upstream",
        f"{upstream}/v1",
        "--port",
        str(port),
    ]
    cmd += ["--host", "127.0.0.1"]
    if config is not None:
        cfg_path = tmp / f"{name}.yaml"
        cfg_path.write_text(json.dumps(config))  # JSON is YAML
        cmd += ["--config", str(cfg_path)]
        arm.note = "config: " + json.dumps(config, separators=(",", ":"))
    p = spawn(cmd, arm.log_path, cwd=ROOT, env={"LOOPGUARD_EVENT_LOOP": loop})
    arm.proc, arm.pid = p, p.pid
    arm.url = f"http://127.0.0.1:{port}"
    wait_http(f"{arm.url}/loop-guard/healthz", p, timeout, arm.log_path)
    arm.version = f"loopguard {_git_rev()}"
    if loop != "asyncio":
        arm.version += f", {loop} {_version(loop)}"
    return arm


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


def _git_rev() -> str:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "proxy"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return (rev or "?") + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "?"


def ensure_litellm(upgrade: bool) -> tuple[Path, str]:
    """The LiteLLM venv (created or upgraded as needed) and the installed version."""
    venv = CACHE / "litellm-venv"
    exe = venv / "bin" / "litellm"
    stamp = venv / ".installed"
    fresh = stamp.exists() and time.time() - stamp.stat().st_mtime < LITELLM_MAX_AGE_S
    if not exe.exists() or not fresh or upgrade:
        CACHE.mkdir(parents=True, exist_ok=True)
        if not (venv / "bin" / "python").exists():
            log(f"creating {venv}")
            subprocess.run(
                [sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300
            )
        log("installing the latest litellm[proxy] from PyPI (first run: about a minute)")
        done = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--upgrade", "litellm[proxy]"],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if done.returncode != 0 or not exe.exists():
            lines = [ln for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
            raise RuntimeError("pip install litellm[proxy] failed: " + (lines[-1] if lines else "?"))
        stamp.touch()
    ver = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    return exe, ver or "?"


def start_litellm(tmp: Path, upstream: str, upgrade: bool) -> Arm:
    arm = Arm("litellm", log_path=tmp / "litellm.log")
    exe, arm.version = ensure_litellm(upgrade)
    arm.version = f"litellm {arm.version}"
    cfg = {
        "model_list": [
            {
                "model_name": workloads.MODEL,
                "litellm_params": {
                    "model": f"openai/{workloads.MODEL}",
                    "api_base": f"{upstream}/v1",
                    "api_key": "sk-bench",
                },
            }
        ]
    }
    cfg_path = tmp / "litellm.yaml"
    cfg_path.write_text(json.dumps(cfg))
    port = free_port()
    env = {
        "LITELLM_MASTER_KEY": BENCH_KEY,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch from the network at start
        "LITELLM_TELEMETRY": "False",
    }
    p = spawn(
        [str(exe), "--config", str(cfg_path), "--host", "127.0.0.1", "--port", str(port), *LITELLM_WORKERS],
        arm.log_path,
        merge_stdout=True,
        env=env,
        cwd=tmp,
    )
    arm.proc, arm.pid = p, p.pid
    arm.url = f"http://127.0.0.1:{port}"
    wait_http(f"{arm.url}/health/liveliness", p, 240, arm.log_path)
    status, body = post_json(f"{arm.url}/v1/chat/completions", workloads.small_body())
    if status != 200:
        raise RuntimeError(f"test request answered HTTP {status}: {body[:300]!r}")
    arm.note = "default settings, master key, one worker; the fake upstream as an openai/ model"
    return arm


# --- load generator -------------------------------------------------------------------------------


class LoadGen:
    def __init__(self, tmp: Path) -> None:
        self.p = spawn(
            [sys.executable, str(BENCH / "loadgen.py")],
            tmp / "loadgen.log",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def call(self, cmd: dict[str, Any], timeout: float = 900) -> dict[str, Any]:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write(orjson.dumps(cmd) + b"\n")
        self.p.stdin.flush()
        ready, _, _ = select.select([self.p.stdout], [], [], timeout)
        if not ready:
            raise RuntimeError(f"load generator did not answer within {timeout:.0f} s")
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"load generator exited ({self.p.poll()})")
        return orjson.loads(line)

    def quit(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(b'{"op": "quit"}\n')
        self.p.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.p.wait(timeout=10)


# --- statistics -----------------------------------------------------------------------------------


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def div(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


@dataclass
class Acc:
    """Everything measured for one arm on one workload cell, over all rounds."""

    n: int = 0
    errors: int = 0
    first_error: str | None = None
    elapsed: float = 0.0
    cpu: float = 0.0
    lat: list[float] = field(default_factory=list)
    ttfb: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    events: list[int] = field(default_factory=list)
    reads: int = 0
    multi_reads: int = 0

    def add(self, r: dict[str, Any], cpu: float) -> None:
        self.n += r["n"]
        self.errors += r["errors"]
        self.first_error = self.first_error or r["first_error"]
        self.elapsed += r["elapsed"]
        self.cpu += cpu
        self.lat += r["lat"]
        if "ttfb" in r:
            self.ttfb += r["ttfb"]
            self.gaps += r["gaps"]
            self.events += r["events"]
            self.reads += r["reads"]
            self.multi_reads += r["multi_reads"]

    def summary(self, direct: Acc | None) -> dict[str, Any]:
        d = direct or Acc()
        out: dict[str, Any] = {
            "n": self.n,
            "errors": self.errors,
            "first_error": self.first_error,
            "p50_ms": pct(self.lat, 0.5),
            "p99_ms": pct(self.lat, 0.99),
            "added_p50_ms": sub(pct(self.lat, 0.5), pct(d.lat, 0.5)),
            "added_p99_ms": sub(pct(self.lat, 0.99), pct(d.lat, 0.99)),
            "rps": div(self.n, self.elapsed),
            "cpu_s_per_1k": div(self.cpu * 1000, self.n),
        }
        if self.events:
            out.update(
                ttfb_p50_ms=pct(self.ttfb, 0.5),
                ttfb_p99_ms=pct(self.ttfb, 0.99),
                added_ttfb_p50_ms=sub(pct(self.ttfb, 0.5), pct(d.ttfb, 0.5)),
                added_ttfb_p99_ms=sub(pct(self.ttfb, 0.99), pct(d.ttfb, 0.99)),
                gap_p50_ms=pct(self.gaps, 0.5),
                gap_p99_ms=pct(self.gaps, 0.99),
                added_gap_p50_ms=sub(pct(self.gaps, 0.5), pct(d.gaps, 0.5)),
                added_gap_p99_ms=sub(pct(self.gaps, 0.99), pct(d.gaps, 0.99)),
                events_min=min(self.events),
                events_max=max(self.events),
                merged_read_fraction=div(self.multi_reads, self.reads),
            )
        return out


# --- the run --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    rounds: int
    #: (duration s, min requests, max requests) per workload cell
    cells: dict[tuple[str, int], tuple[float, int, int]]
    scale_rounds: int
    scale: dict[str, tuple[float, int, int]]
    warmup: bool
    memory_first: int
    memory_total: int
    memory_conversations: int
    #: the agent session: (first body bytes, last body bytes, requests)
    session: tuple[int, int, int] = (10 * 1024, 5 * 1024 * 1024, 120)


FULL = Plan(
    rounds=3,
    cells={
        ("small", 1): (1.0, 20, 100_000),
        ("small", 16): (1.5, 64, 100_000),
        ("agent", 1): (1.5, 5, 100_000),
        ("agent", 16): (2.0, 32, 100_000),
        ("chat", 1): (1.0, 20, 100_000),
        ("chat", 16): (1.5, 64, 100_000),
        ("stream", 1): (3.0, 4, 100_000),
        ("stream", 16): (2.0, 32, 100_000),
    },
    scale_rounds=2,
    scale={
        "10KB": (0.6, 10, 10_000),
        "100KB": (0.6, 8, 10_000),
        "1MB": (0.8, 4, 10_000),
        "5MB": (1.5, 3, 10_000),
    },
    warmup=True,
    memory_first=100,
    memory_total=10_000,
    memory_conversations=1_000,
)

SMOKE = Plan(
    rounds=1,
    cells={
        ("small", 1): (0.0, 3, 3),
        ("small", 16): (0.0, 16, 16),
        ("agent", 1): (0.0, 2, 2),
        ("agent", 16): (0.0, 16, 16),
        ("chat", 1): (0.0, 3, 3),
        ("chat", 16): (0.0, 16, 16),
        ("stream", 1): (0.0, 2, 2),
        ("stream", 16): (0.0, 16, 16),
    },
    scale_rounds=1,
    scale={"10KB": (0.0, 2, 2), "100KB": (0.0, 2, 2), "1MB": (0.0, 2, 2), "5MB": (0.0, 1, 1)},
    warmup=False,
    memory_first=10,
    memory_total=50,
    memory_conversations=10,
    session=(10 * 1024, 200 * 1024, 6),
)


def batch(
    gen: LoadGen, arm: Arm, workload: str, conc: int, spec: tuple[float, int, int]
) -> tuple[dict[str, Any], float]:
    pids = arm.tree()
    c0 = cpu_seconds(pids)
    r = gen.call(
        {
            "op": "batch",
            "url": arm.url,
            "workload": workload,
            "concurrency": conc,
            "duration": spec[0],
            "min": spec[1],
            "max": spec[2],
        }
    )
    return r, cpu_seconds(pids) - c0


def machine_line() -> dict[str, Any]:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(mem_gib, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "aiohttp": _version("aiohttp"),
        "loopguard": _git_rev(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    plan = SMOKE if args.smoke else dataclasses.replace(FULL, rounds=args.rounds)
    t_run = time.monotonic()
    result: dict[str, Any] = {"mode": "smoke" if args.smoke else "full", "machine": machine_line()}
    tmp = Path(tempfile.mkdtemp(prefix="loopguard-bench-"))
    arms: dict[str, Arm] = {}
    try:
        log(f"logs in {tmp}")
        upstream = start_upstream(tmp)
        arms["direct"] = upstream
        starters = {
            "bare": lambda: start_bare(tmp, upstream.url),
            "loopguard-off": lambda: start_loopguard("loopguard-off", tmp, upstream.url, None, guards=False),
            "loopguard": lambda: start_loopguard("loopguard", tmp, upstream.url, None),
            "loopguard-nocache": lambda: start_loopguard(
                "loopguard-nocache", tmp, upstream.url, {"prefix_cache": {"max_bytes_mb": 0}}
            ),
            "loopguard-uvloop": lambda: start_loopguard(
                "loopguard-uvloop", tmp, upstream.url, None, loop="uvloop"
            ),
            "litellm": lambda: start_litellm(tmp, upstream.url, args.litellm_upgrade),
        }
        for name, start in starters.items():
            if name == "litellm" and (args.smoke or args.skip_litellm):
                why = "skipped in --smoke" if args.smoke else "skipped (--skip-litellm)"
                arms[name] = Arm(name, status="not run", reason=why)
                continue
            log(f"starting {name}")
            try:
                arms[name] = start()
            except Exception as e:
                log(f"{name}: not run: {e}")
                arms[name] = Arm(name, status="not run", reason=f"{type(e).__name__}: {e}")
        live = [a for a in arms.values() if a.ok]
        gen = LoadGen(tmp)
        gen.call({"op": "prepare", "workloads": [*WORKLOADS, *(f"size:{s}" for s in plan.scale)]}, 300)

        # sanity: every proxy answers the small request
        for a in live:
            r = gen.call(
                {
                    "op": "batch",
                    "url": a.url,
                    "workload": "small",
                    "concurrency": 1,
                    "duration": 0,
                    "min": 1,
                    "max": 1,
                }
            )
            if r["n"] != 1:
                a.status, a.reason = "not run", f"test request failed: {r['first_error']}"
                log(f"{a.name}: not run: {a.reason}")
        live = [a for a in arms.values() if a.ok]

        cells = list(plan.cells)
        accs: dict[tuple[str, int], dict[str, Acc]] = {c: {a.name: Acc() for a in live} for c in cells}
        if plan.warmup:
            log("warm-up")
            for w, c in cells:
                for a in live:
                    gen.call(
                        {
                            "op": "batch",
                            "url": a.url,
                            "workload": w,
                            "concurrency": c,
                            "duration": 0,
                            "min": 2 * c,
                            "max": 2 * c,
                        }
                    )
        for rnd in range(plan.rounds):
            order = live[rnd % len(live) :] + live[: rnd % len(live)]
            for w, c in cells:
                log(f"round {rnd + 1}/{plan.rounds}: {w} c={c}")
                for a in order:
                    r, cpu = batch(gen, a, w, c, plan.cells[(w, c)])
                    accs[(w, c)][a.name].add(r, cpu)

        result["workloads"] = {}
        for (w, c), per_arm in accs.items():
            direct = per_arm.get("direct")
            result["workloads"][f"{w}/c{c}"] = {name: acc.summary(direct) for name, acc in per_arm.items()}

        # body-size scaling (concurrency 1)
        log("body-size scaling")
        sacc: dict[str, dict[str, Acc]] = {s: {a.name: Acc() for a in live} for s in plan.scale}
        for rnd in range(plan.scale_rounds):
            order = live[rnd % len(live) :] + live[: rnd % len(live)]
            for s, spec in plan.scale.items():
                for a in order:
                    if plan.warmup and rnd == 0:
                        gen.call(
                            {
                                "op": "batch",
                                "url": a.url,
                                "workload": f"size:{s}",
                                "concurrency": 1,
                                "duration": 0,
                                "min": 1,
                                "max": 1,
                            }
                        )
                    r, cpu = batch(gen, a, f"size:{s}", 1, spec)
                    sacc[s][a.name].add(r, cpu)
        result["scaling"] = {}
        for s, per_arm in sacc.items():
            body = workloads.history_body(workloads.SIZES[s])
            result["scaling"][s] = {
                "bytes": len(body),
                "tool_calls": workloads.count_calls(body),
                "arms": {n: acc.summary(per_arm.get("direct")) for n, acc in per_arm.items()},
            }

        # per-arm process figures (peak RSS over everything above)
        result["arms"] = {}
        for name in ARMS:
            a = arms[name]
            entry: dict[str, Any] = {
                "label": ARM_LABELS[name],
                "status": a.status,
                "reason": a.reason or None,
                "version": a.version or None,
                "url": a.url or None,
                "note": a.note or None,
            }
            if a.ok:
                pids = a.tree()
                entry.update(
                    peak_rss_mb=memory_mb(pids, "VmHWM"), rss_mb=memory_mb(pids, "VmRSS"), processes=len(pids)
                )
            result["arms"][name] = entry

        if arms["loopguard"].ok:
            result["loopguard_stats"] = _get_json(f"{arms['loopguard'].url}/loop-guard")
        if arms["loopguard-off"].ok:
            result["loopguard_off_stats"] = _get_json(f"{arms['loopguard-off'].url}/loop-guard")

        # the agent session (concurrency 1): every arm, plus loopguard with its prefix cache off
        log("agent session")
        result["session"] = session_test(gen, tmp, upstream.url, plan, live)

        # memory: fresh loopguard processes (default guards; every guard on), distinct conversations
        for a in live:
            if a.name != "direct":
                stop(a)
        result["memory"] = {
            "loopguard": memory_test(gen, tmp, upstream.url, plan, None),
            "loopguard-all-guards": memory_test(gen, tmp, upstream.url, plan, True),
        }
        gen.quit()
    finally:
        stop_all()
        if not args.keep_logs:
            shutil.rmtree(tmp, ignore_errors=True)
    result["ratios"] = ratios(result)
    result["targets"] = targets(result)
    result["duration_s"] = round(time.monotonic() - t_run, 1)
    return result


def session_test(gen: LoadGen, tmp: Path, upstream: str, plan: Plan, live: list[Arm]) -> dict[str, Any]:
    """The agent session of :func:`workloads.session_bodies` on every live arm, one after the
    other. Per arm: the added latency of each request over direct's for the same request, and the
    medians of its first and last 10% of requests."""
    start, end, requests = plan.session
    lat: dict[str, dict[str, Any]] = {}
    for a in live:
        cmd = {"op": "session", "url": a.url, "start": start, "end": end, "requests": requests}
        lat[a.name] = gen.call(cmd)
    direct = lat.get("direct", {}).get("lat") or []
    out: dict[str, Any] = {"start_bytes": start, "end_bytes": end}
    for name, r in lat.items():
        row: dict[str, Any] = {"n": r["n"], "errors": r["errors"], "first_error": r["first_error"]}
        if r["errors"] == 0 and len(r["lat"]) == len(direct) and direct:
            added = [x - d for x, d in zip(r["lat"], direct, strict=True)]
            k = max(1, len(added) // 10)
            row.update(
                requests=len(added),
                first_bytes=r["bytes"][0],
                last_bytes=r["bytes"][-1],
                first10_added_p50_ms=pct(added[:k], 0.5),
                last10_added_p50_ms=pct(added[-k:], 0.5),
                total_s=sum(r["lat"]) / 1000,
            )
            row["growth"] = div(row["last10_added_p50_ms"], row["first10_added_p50_ms"])
        out[name] = row
    # what the guards themselves add: each request's latency over loopguard-off's for the same
    # request (the forwarding of a growing body costs every proxy more; see the bare arm)
    off = lat.get("loopguard-off", {}).get("lat") or []
    for name, row in out.items():
        mine = lat.get(name, {}).get("lat") or []
        if not isinstance(row, dict) or name in ("direct", "loopguard-off") or "requests" not in row:
            continue
        if len(mine) != len(off) or not off:
            continue
        over = [x - o for x, o in zip(mine, off, strict=True)]
        k = max(1, len(over) // 10)
        row["first10_over_off_p50_ms"] = pct(over[:k], 0.5)
        row["last10_over_off_p50_ms"] = pct(over[-k:], 0.5)
    return out


def _get_json(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError) as e:
        return {"error": str(e)}


def memory_test(gen: LoadGen, tmp: Path, upstream: str, plan: Plan, guards: bool | None) -> dict[str, Any]:
    """RSS of a fresh loopguard after the first requests and after all of them, request ``k`` being
    request ``k // conversations + 1`` of conversation ``k % conversations`` (c16)."""
    what = "every guard on" if guards else "default guards"
    log(f"memory ({what}): {plan.memory_total} requests over {plan.memory_conversations} conversations")
    out: dict[str, Any] = {
        "requests": plan.memory_total,
        "conversations": plan.memory_conversations,
        "first": plan.memory_first,
        "arm": f"loopguard (fresh process, {what})",
    }
    try:
        arm = start_loopguard("loopguard-memory" + ("-all" if guards else ""), tmp, upstream, None, guards)
        out["note"] = arm.note or None
    except Exception as e:
        out.update(status="not run", reason=f"{type(e).__name__}: {e}")
        return out
    base = {"op": "memory", "url": arm.url, "concurrency": 16, "conversations": plan.memory_conversations}
    r1 = gen.call({**base, "start": 0, "count": plan.memory_first})
    pids = arm.tree()
    rss_first = memory_mb(pids, "VmRSS")
    r2 = gen.call({**base, "start": plan.memory_first, "count": plan.memory_total - plan.memory_first})
    rss_all = memory_mb(pids, "VmRSS")
    out.update(
        status="ok",
        n=r1["n"] + r2["n"],
        errors=r1["errors"] + r2["errors"],
        first_error=r1["first_error"] or r2["first_error"],
        rps=div(r2["n"], r2["elapsed"]),
        rss_after_first_mb=rss_first,
        rss_after_all_mb=rss_all,
        growth_mb=rss_all - rss_first,
        peak_rss_mb=memory_mb(pids, "VmHWM"),
        stats=_get_json(f"{arm.url}/loop-guard"),
    )
    out["stats"].pop("incidents", None)
    stop(arm)
    return out


# --- ratios and targets ---------------------------------------------------------------------------


def _cell(result: dict[str, Any], cell: str, arm: str, key: str) -> float | None:
    return result.get("workloads", {}).get(cell, {}).get(arm, {}).get(key)


def ratios(result: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for w in WORKLOADS:
        for lg in LOOPGUARD_ARMS:
            for other in ("bare", "litellm"):
                out[f"{lg}/{other} req/s {w}/c16"] = div(
                    _cell(result, f"{w}/c16", lg, "rps"), _cell(result, f"{w}/c16", other, "rps")
                )
    return out


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    arms = result.get("arms", {})
    ran = {n for n, a in arms.items() if a.get("status") == "ok"}
    out: list[dict[str, Any]] = []

    def target(name: str, needs: set[str], ok: bool | None, measured: str) -> None:
        missing = sorted(needs - ran)
        if missing:
            verdict = "SKIP"
            measured = f"{', '.join(missing)} not run (see Arms)"
        elif ok is None:
            verdict = "SKIP"
            measured = measured or "not measured"
        else:
            verdict = "PASS" if ok else "FAIL"
        out.append({"target": name, "result": verdict, "measured": measured})

    def rps_ratio(lg: str, other: str, w: str) -> float | None:
        return div(_cell(result, f"{w}/c16", lg, "rps"), _cell(result, f"{w}/c16", other, "rps"))

    def cmp(name: str, lg: str, other: str, w: str, k: float) -> None:
        r = rps_ratio(lg, other, w)
        target(name, {lg, other}, None if r is None else r >= k, f"{r:.2f}×" if r is not None else "")

    # the fixed cost of a request: guards off within 0.9 × bare, the defaults within 0.7 / 0.5
    cmp("loopguard (guards off) req/s at c16 ≥ 0.9 × bare, small", "loopguard-off", "bare", "small", 0.9)
    cmp("loopguard (guards off) req/s at c16 ≥ 0.9 × bare, 1 MB", "loopguard-off", "bare", "agent", 0.9)
    cmp("loopguard (defaults) req/s at c16 ≥ 0.7 × bare, small", "loopguard", "bare", "small", 0.7)
    cmp("loopguard (defaults) req/s at c16 ≥ 0.5 × bare, 1 MB", "loopguard", "bare", "agent", 0.5)
    # a plain chat (no tools, no calls) costs what the guards off cost (0.9: the noise of two arms)
    cmp(
        "loopguard (defaults) plain chat req/s at c16 ≥ 0.9 × loopguard (guards off)'s",
        "loopguard",
        "loopguard-off",
        "chat",
        0.9,
    )
    for w in ("small", "agent", "stream"):
        cmp(f"loopguard (defaults) req/s at c16 ≥ 20 × LiteLLM, {w}", "loopguard", "litellm", w, 20)
    sess = result.get("session", {}).get("loopguard", {})
    g = sess.get("growth")
    target(
        "agent session, loopguard added p50 of the last 10% ≤ 1.5 × the first 10%",
        {"loopguard", "direct"},
        None if g is None else g <= 1.5,
        f"{f(sess.get('first10_added_p50_ms'))} → {f(sess.get('last10_added_p50_ms'))} ms ({f(g, 1)}×)"
        if g is not None
        else "",
    )
    a0, a1 = sess.get("first10_over_off_p50_ms"), sess.get("last10_over_off_p50_ms")
    flat = None if a0 is None or a1 is None else a1 <= 1.5 * max(a0, 0.0) + 0.5
    target(
        "agent session, what the guards add over loopguard-off: last 10% ≤ 1.5 × the first 10% "
        "(+0.5 ms of noise)",
        {"loopguard", "loopguard-off"},
        flat,
        f"{f(a0)} → {f(a1)} ms" if flat is not None else "",
    )
    for w in WORKLOADS:
        for c in CONCURRENCY:
            key = "added_ttfb_p50_ms" if w == "stream" else "added_p50_ms"
            lg = _cell(result, f"{w}/c{c}", "loopguard", key)
            ll = _cell(result, f"{w}/c{c}", "litellm", key)
            what = "added TTFB p50" if w == "stream" else "added p50"
            target(
                f"loopguard (defaults) {what} < LiteLLM's, {w}/c{c}",
                {"loopguard", "litellm", "direct"},
                None if lg is None or ll is None else lg < ll,
                f"{lg:.2f} vs {ll:.2f} ms" if lg is not None and ll is not None else "",
            )
    for lg in ("loopguard", "loopguard-off"):
        a = _cell(result, "stream/c1", lg, "added_ttfb_p50_ms")
        b = _cell(result, "stream/c1", "bare", "added_ttfb_p50_ms")
        # A floor of 0.05 ms for bare keeps the ratio meaningful when bare adds ~nothing.
        ok = None if a is None or b is None else a <= 1.5 * max(b, 0.05)
        target(
            f"{lg}: streaming added TTFB ≤ 1.5 × bare's (c1)",
            {lg, "bare", "direct"},
            ok,
            f"{a:.3f} vs {b:.3f} ms" if a is not None and b is not None else "",
        )
    for lg in ("loopguard", "loopguard-off"):
        parts, ok = [], True
        for c in CONCURRENCY:
            g = _cell(result, f"stream/c{c}", lg, "added_gap_p50_ms")
            ev = _cell(result, f"stream/c{c}", lg, "events_min")
            mf = _cell(result, f"stream/c{c}", lg, "merged_read_fraction")
            mf_direct = _cell(result, f"stream/c{c}", "direct", "merged_read_fraction")
            if g is None or ev is None or mf is None or mf_direct is None:
                ok = None
                break
            ok = ok and g <= 1.0 and ev == workloads.SSE_EVENTS and (c > 1 or mf <= mf_direct + 0.01)
            parts.append(
                f"c{c}: gap {g:+.3f} ms, merged reads {mf:.1%} (direct {mf_direct:.1%}), min events {ev}"
            )
        target(
            f"{lg}: stream chunks not merged or delayed (gap added ≤ 1 ms median)",
            {lg, "direct"},
            ok,
            "; ".join(parts),
        )
    for name, mem in result.get("memory", {}).items():
        label = (
            f"{name} RSS after {mem['requests']:,} requests / {mem['conversations']:,} conversations "
            f"within 50 MB of RSS after the first {mem['first']}"
        )
        if mem.get("status") == "ok":
            g = mem["growth_mb"]
            out.append(
                {
                    "target": label,
                    "result": "PASS" if g <= 50 and mem["errors"] == 0 else "FAIL",
                    "measured": f"{mem['rss_after_first_mb']:.1f} → {mem['rss_after_all_mb']:.1f} MB "
                    f"({g:+.1f} MB), {mem['errors']} errors",
                }
            )
        else:
            out.append({"target": label, "result": "SKIP", "measured": mem.get("reason", "not run")})
    return out


# --- report ---------------------------------------------------------------------------------------


def f(x: float | None, nd: int = 2, sign: bool = False) -> str:
    if x is None:
        return "—"
    return f"{x:+.{nd}f}" if sign else f"{x:.{nd}f}"


def report(res: dict[str, Any]) -> str:
    m = res["machine"]
    lines = [
        f"# loopguard benchmark ({res['mode']} run, {res['duration_s']:.0f} s)",
        "",
        f"Machine: {m['cores']} cores ({m['cpu']}), {m['memory_gib']} GiB, {m['os']}, Python {m['python']}, "
        f"aiohttp {m['aiohttp']}, loopguard {m['loopguard']}; load average at start "
        f"{' '.join(str(x) for x in m['loadavg_at_start'])} "
        "(shared machine: other processes may be running).",
        "",
    ]
    if res["mode"] == "smoke":
        lines += ["**Smoke run: a few requests per arm; the numbers and verdicts below mean nothing.**", ""]
    arms = res["arms"]
    ran = [n for n in ARMS if arms[n]["status"] == "ok"]
    lines += ["## Arms", "", "| arm | status | version | peak RSS MB | notes |", "|---|---|---|---:|---|"]
    for n in ARMS:
        a = arms[n]
        status = "ok" if a["status"] == "ok" else f"**not run**: {a['reason']}"
        lines.append(
            f"| {a['label']} | {status} | {a['version'] or ''} | {f(a.get('peak_rss_mb'), 0)} "
            f"| {a['note'] or ''} |"
        )
    lines.append("")
    wl = res["workloads"]
    small_b = len(workloads.small_body())
    titles = {
        "small": f"Small chat request ({small_b / 1024:.1f} KB, 7 tool calls), not streamed",
        "agent": "Agent history of 1 MB (~300 tool calls), not streamed",
        "chat": f"Plain chat request ({len(workloads.chat_body()) / 1024:.1f} KB, no tools, no tool calls), "
        "not streamed",
    }
    for w in ("small", "agent", "chat"):
        c1, c16 = wl[f"{w}/c1"], wl[f"{w}/c16"]
        lines += [
            f"## {titles[w]}",
            "",
            "| arm | c1 p50 ms | c1 p99 ms | added p50 | added p99 | CPU s/1k req | c16 req/s | c16 p50 ms "
            "| c16 added p50 | c16 added p99 | c16 CPU s/1k req |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for n in ran:
            a, b = c1[n], c16[n]
            lines.append(
                f"| {n} | {f(a['p50_ms'])} | {f(a['p99_ms'])} | {f(a['added_p50_ms'], sign=True)} "
                f"| {f(a['added_p99_ms'], sign=True)} | {f(a['cpu_s_per_1k'])} | {f(b['rps'], 0)} "
                f"| {f(b['p50_ms'])} | {f(b['added_p50_ms'], sign=True)} | {f(b['added_p99_ms'], sign=True)} "
                f"| {f(b['cpu_s_per_1k'])} |"
            )
        lines.append("")
    c1, c16 = wl["stream/c1"], wl["stream/c16"]
    lines += [
        f"## Streaming ({workloads.SSE_EVENTS} SSE events {workloads.SSE_INTERVAL_S * 1000:.0f} ms apart)",
        "",
        "| arm | TTFB p50 ms | added TTFB p50 | added TTFB p99 | total p50 ms | added total p50 "
        "| gap added p50 | gap added p99 | merged reads | CPU s/1k req | c16 req/s | c16 added TTFB p50 "
        "| c16 gap added p50 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in ran:
        a, b = c1[n], c16[n]
        lines.append(
            f"| {n} | {f(a['ttfb_p50_ms'])} | {f(a['added_ttfb_p50_ms'], sign=True)} "
            f"| {f(a['added_ttfb_p99_ms'], sign=True)} | {f(a['p50_ms'], 1)} "
            f"| {f(a['added_p50_ms'], sign=True)} "
            f"| {f(a['added_gap_p50_ms'], 3, True)} | {f(a['added_gap_p99_ms'], 2, True)} "
            f"| {f(100 * (a['merged_read_fraction'] or 0), 1)}% | {f(a['cpu_s_per_1k'])} | {f(b['rps'], 0)} "
            f"| {f(b['added_ttfb_p50_ms'], sign=True)} | {f(b['added_gap_p50_ms'], 3, True)} |"
        )
    lines.append("")
    sc = res["scaling"]
    lines += [
        "## Body-size scaling (added p50 ms over direct, concurrency 1)",
        "",
        "| history | bytes | tool calls | "
        + " | ".join(n for n in ran if n != "direct")
        + " | direct p50 ms |",
        "|---|---:|---:|" + "---:|" * (len(ran) - 1) + "---:|",
    ]
    for s, row in sc.items():
        cols = " | ".join(f(row["arms"][n]["added_p50_ms"], sign=True) for n in ran if n != "direct")
        lines.append(
            f"| {s} | {row['bytes']:,} | {row['tool_calls']} | {cols} "
            f"| {f(row['arms'].get('direct', {}).get('p50_ms'))} |"
        )
    lines.append("")
    if "1MB" in sc and "5MB" in sc:
        growth = [
            f"{n} {f(div(sc['5MB']['arms'][n]['added_p50_ms'], sc['1MB']['arms'][n]['added_p50_ms']), 1)}×"
            for n in ran
            if n != "direct"
        ]
        lines += [
            f"Added latency 5 MB / 1 MB: {', '.join(growth)} (the bodies grow "
            f"{sc['5MB']['bytes'] / sc['1MB']['bytes']:.1f}×; linear growth would give about that).",
            "",
        ]
    sess = res.get("session", {})
    if sess:
        lines += [
            f"## Agent session (one conversation growing {sess['start_bytes'] // 1024:,} KB → "
            f"{sess['end_bytes'] // 1024:,} KB, each request the previous one plus the next steps; "
            "concurrency 1)",
            "",
            "| arm | requests | bytes first → last | added p50 first 10% ms | added p50 last 10% ms "
            "| last / first | over loopguard-off first 10% ms | over loopguard-off last 10% ms "
            "| whole session s |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, row in sess.items():
            if not isinstance(row, dict) or name == "direct":
                continue
            if "requests" not in row:
                err = row.get("first_error")
                lines.append(f"| {name} | {row.get('n')} | — | — | — | — | — | — | errors: {err} |")
                continue
            lines.append(
                f"| {name} | {row['requests']} | {row['first_bytes']:,} → {row['last_bytes']:,} "
                f"| {f(row['first10_added_p50_ms'], sign=True)} | {f(row['last10_added_p50_ms'], sign=True)} "
                f"| {f(row['growth'], 1)}× | {f(row.get('first10_over_off_p50_ms'), sign=True)} "
                f"| {f(row.get('last10_over_off_p50_ms'), sign=True)} | {f(row['total_s'], 1)} |"
            )
        lines.append("")
    lines += ["## Memory (fresh loopguard processes, looping conversations at c16)", ""]
    for mem in res["memory"].values():
        if mem.get("status") == "ok":
            lines.append(
                f"- {mem['arm']}: {mem['n']:,} requests over {mem['conversations']:,} distinct conversations "
                f"({f(mem['rps'], 0)} req/s): RSS {mem['rss_after_first_mb']:.1f} MB after the first "
                f"{mem['first']}, {mem['rss_after_all_mb']:.1f} MB after all ({mem['growth_mb']:+.1f} MB); "
                f"peak {mem['peak_rss_mb']:.1f} MB; {mem['errors']} errors."
            )
        else:
            lines.append(f"- {mem['arm']}: **not run**: {mem.get('reason')}")
    lines.append("")
    st = res.get("loopguard_stats") or {}
    if "requests" in st:
        lines += [
            f"loopguard (defaults) counters: {st.get('guarded_requests')} guarded requests, "
            f"{st.get('rewritten_requests')} rewritten, {st.get('reminders_injected')} fresh reminders, "
            f"{st.get('results_withheld')} fresh withholds, {st.get('internal_errors')} internal errors.",
            "",
        ]
    lines += [
        "## Headline ratios (req/s at concurrency 16, same run)",
        "",
        "| ratio | small | 1 MB | plain chat | stream |",
        "|---|---:|---:|---:|---:|",
    ]
    rt = res["ratios"]
    for lg in LOOPGUARD_ARMS:
        for other in ("bare", "litellm"):
            vals = [rt.get(f"{lg}/{other} req/s {w}/c16") for w in WORKLOADS]
            lines.append(f"| {lg} / {other} | " + " | ".join(f"{f(v)}×" if v else "—" for v in vals) + " |")
    lines += ["", "## Targets", "", "| target | result | measured |", "|---|---|---|"]
    for t in res["targets"]:
        lines.append(f"| {t['target']} | **{t['result']}** | {t['measured']} |")
    errs = [
        (c, n, a["errors"], a["first_error"]) for c, row in wl.items() for n, a in row.items() if a["errors"]
    ]
    if errs:
        lines += ["", "Errors: " + "; ".join(f"{n} {c}: {k} ({e})" for c, n, k, e in errs)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=str(BENCH / "results.json"), help="where to write the results JSON")
    p.add_argument("--rounds", type=int, default=FULL.rounds, help="interleaved rounds per workload")
    p.add_argument("--smoke", action="store_true", help="a few requests per arm, LiteLLM skipped")
    p.add_argument("--skip-litellm", action="store_true", help="do not install or run the LiteLLM arm")
    p.add_argument("--litellm-upgrade", action="store_true", help="pip install --upgrade LiteLLM first")
    p.add_argument("--keep-logs", action="store_true", help="keep the arms' logs (path printed on stderr)")
    args = p.parse_args(argv)
    try:
        res = run(args)
    except KeyboardInterrupt:
        return 130
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_bytes(orjson.dumps(res, option=orjson.OPT_INDENT_2))
    sys.stdout.write(report(res))
    log(f"results in {args.json}; {res['duration_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
