"""Real-runs gate harness (DESIGN §2.2: judged on real recorded runs): replay recorded agent runs
through the real server.

The runs are third-party data read where they lie, never copied into the project:
``../shared/fixtures/realtraj/*.json`` from the project root, or ``$LOOPGUARD_REALTRAJ`` (fields in
that directory's ``README.md``: ``id``, ``outcome``, ``tools``, ``messages``). Each run is replayed
with :func:`tests.helpers.corpus.replay` (a fresh proxy per run with the shipped default config, the fake
model answering each recorded assistant message in turn, observations from what crossed the wire,
each counted at one call by the strict reading).

The gate:

- **precision** — no run with outcome ``resolved`` has a result withheld, its turn stopped or an
  answer cut (``instance_resolved`` sessions are reported, not gated: blocking one session of a
  solved multi-agent run need not have cost the run);
- **reminder facts** — every reminder the model received says only true things about the history
  before it (:func:`tests.helpers.reminder_facts.check_reminder`), on every run whatever its outcome.

Reported for recall: for ``exit_cost`` and ``unresolved`` runs, how many were blocked and how many
calls they still had after the first block.

Run ``python -m tests.helpers.realtraj [--stream] [--dir DIR]`` to print the table (exit status 1 when the
gate fails).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from proxy.cli import replay as replay_files
from proxy.edge.observe import configure_logging
from tests.helpers.corpus import ROOT, Replay, replay
from tests.helpers.reminder_facts import check_reminder

ENV = "LOOPGUARD_REALTRAJ"
DEFAULT_DIR = ROOT.parent / "shared" / "fixtures" / "realtraj"
#: Outcomes gated for precision: such a run must never be blocked.
GATED = ("resolved",)
#: Outcomes of runs that got stuck or failed: reported for recall.
STUCK = ("exit_cost", "unresolved")
OUTCOMES = ("resolved", "unresolved", "exit_cost", "instance_resolved", "instance_unresolved")


def runs_dir() -> Path:
    """``$LOOPGUARD_REALTRAJ`` when set, else ``../shared/fixtures/realtraj`` from the root."""
    env = os.environ.get(ENV)
    return Path(env) if env else DEFAULT_DIR


def load_runs(directory: Path | None = None) -> list[dict[str, Any]]:
    """Every ``*.json`` run of ``directory`` (default :func:`runs_dir`), sorted by id
    (:func:`proxy.cli.replay.load_runs`, the loader ``loopguard replay`` uses)."""
    return replay_files.load_runs(directory or runs_dir())


@contextmanager
def quiet_logs() -> Iterator[None]:
    """Warnings only while replaying (thousands of request lines would drown the table and cost
    time); the previous logging configuration is restored afterwards."""
    saved = structlog.get_config()
    configure_logging("warning")
    try:
        yield
    finally:
        structlog.configure(**saved)


async def replay_runs(
    runs: Sequence[dict[str, Any]],
    stream: bool = False,
    dialect: str = "chat",
    config: dict[str, Any] | None = None,
) -> list[Replay]:
    """Each run replayed through a fresh proxy with ``config`` (a dict; None: the shipped default
    config), in ``dialect`` (:data:`tests.helpers.corpus.WIRES`)."""
    with quiet_logs():
        return [await replay(run, config, stream, dialect) for run in runs]


# --- judging ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FactViolation:
    """A claim of one reminder that is not true of the history before it."""

    run: str
    call: int
    rules: tuple[str, ...]
    reminder: str
    violation: str

    def describe(self) -> str:
        rules = "+".join(self.rules) or "?"
        said = "" if self.violation.startswith("no checker") else f" (reminder: {self.reminder[:60]!r})"
        return f"{self.run} call {self.call} {rules}: {self.violation}{said}"


def fact_violations(r: Replay) -> list[FactViolation]:
    """The untrue claims of every reminder the model received in replay ``r``."""
    messages = r.fixture["messages"]
    run = str(r.fixture.get("id"))
    return [
        FactViolation(run, m.call, m.rules, m.text, v)
        for m in r.reminders
        for v in check_reminder(messages[: m.upto], m.text)
    ]


def outcome(r: Replay) -> str:
    return str(r.fixture.get("outcome"))


def block_failure(r: Replay) -> str | None:
    """Why ``r`` fails the precision gate (a gated run blocked), else None."""
    first = r.first_of(("withhold", "stop", "cut"))
    if outcome(r) in GATED and first is not None:
        return f"blocked: {first.describe()}"
    return None


def failed_open(r: Replay) -> str | None:
    """Why replay ``r`` is no evidence: the proxy failed open (a guard raised) during it."""
    return f"the proxy failed open {r.internal_errors} times" if r.internal_errors else None


def gate_failures(replays: Sequence[Replay]) -> list[str]:
    """``"<id>: …"`` for every gated run that was blocked, and every run the proxy failed open on."""
    return [
        f"{r.fixture.get('id')}: {why}"
        for r in replays
        for why in (block_failure(r), failed_open(r))
        if why is not None
    ]


def verdict(r: Replay, violations: int = 0) -> str:
    why = block_failure(r) or failed_open(r)
    out = f"FAIL ({why})" if why else "PASS" if outcome(r) in GATED else "not gated"
    return out + (f"; {violations} untrue reminder claim(s)" if violations else "")


def calls_left(r: Replay) -> int | None:
    """Calls the run still had after its first block (total calls minus that call)."""
    first = r.first_of(("withhold", "stop", "cut"))
    return None if first is None else r.calls - first.call


def table(replays: Sequence[Replay]) -> str:
    """One row per run, then the totals."""
    rows = [("id", "outcome", "calls", "reminders", "first reminder", "first block", "calls left", "verdict")]
    for r in replays:
        remind = r.first_of(("remind",))
        block = r.first_of(("withhold", "stop", "cut"))
        left = calls_left(r)
        rows.append(
            (
                str(r.fixture.get("id")),
                outcome(r),
                str(r.calls),
                str(len(r.reminders)),
                f"call {remind.call} {'+'.join(remind.rules) or '?'}" if remind else "-",
                block.describe() if block else "-",
                "-" if left is None else str(left),
                verdict(r, len(fact_violations(r))),
            )
        )
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join([*lines, "", *totals(replays)])


def totals(replays: Sequence[Replay]) -> list[str]:
    gated = [r for r in replays if outcome(r) in GATED]
    stuck = [r for r in replays if outcome(r) in STUCK]
    blocked = [r for r in gated if r.first_of(("withhold", "stop", "cut"))]
    left = [n for r in stuck if (n := calls_left(r)) is not None]
    calls = sum(r.calls for r in gated)
    reminders = sum(len(r.reminders) for r in gated)
    rate = f"{100 * reminders / calls:.1f}" if calls else "-"
    median = f"{statistics.median(left):g}" if left else "-"
    untrue = [v for r in replays for v in fact_violations(r)]
    return [
        f"resolved runs blocked: {len(blocked)} of {len(gated)}",
        f"reminders per 100 calls on resolved runs: {rate} ({reminders} reminders, {calls} calls)",
        f"exit_cost/unresolved runs blocked: {len(left)} of {len(stuck)}; "
        f"median calls left after the first block: {median}",
        f"untrue reminder claims: {len(untrue)} in {sum(len(r.reminders) for r in replays)} reminders",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tests.helpers.realtraj", description=__doc__.splitlines()[0])
    ap.add_argument("--stream", action="store_true", help="replay with stream=true (SSE answers)")
    ap.add_argument("--dir", help=f"runs directory (default: ${ENV} or {DEFAULT_DIR})")
    args = ap.parse_args(argv)
    directory = Path(args.dir) if args.dir else runs_dir()
    if not directory.is_dir():
        print(f"no real runs at {directory} (set ${ENV} to their directory)", file=sys.stderr)
        return 2
    replays = asyncio.run(replay_runs(load_runs(directory), args.stream))
    print(table(replays))
    untrue = [v for r in replays for v in fact_violations(r)]
    for v in untrue:
        print(f"untrue: {v.describe()}")
    failures = gate_failures(replays)
    for f in failures:
        print(f"FAIL {f}")
    return 1 if failures or untrue else 0


if __name__ == "__main__":
    sys.exit(main())
