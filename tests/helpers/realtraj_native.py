"""Native-session gate harness: real Claude Code and Codex sessions replayed in their own wire.

The sessions are third-party data read where they lie, never copied into the project:
``../shared/fixtures/realtraj-native/*.json`` from the project root, or
``$LOOPGUARD_REALTRAJ_NATIVE`` (fields in that directory's ``README.md``: ``id``, ``agent``,
``dialect``, ``request_bodies_final``, ``compaction_segments``). Every conversation of a session
(each compaction segment, then the final body) is replayed with :func:`tests.helpers.corpus.replay` in
the session's own dialect (:data:`tests.helpers.native_wires.NATIVE_WIRES`): a fresh proxy per
conversation with the shipped default config, one request per recorded assistant turn (the body
cut just before it), the fake upstream answering that turn as recorded, JSON or SSE. Observations
are the corpus reading (what crossed the wire, each counted at one call): a result *withheld*, a
*reminder* (each distinct text), a turn *stopped* (the answer lost its calls), an answer *cut*
(fewer calls), the rule behind each from ``GET /loop-guard``.

The gate (:func:`gate_failures`, :func:`reminder_rate`): no session has a result withheld, a turn
stopped or an answer cut, and the proxy never fails open; at most :data:`MAX_REMINDERS_PER_1000`
reminders per 1,000 calls over the whole set; every reminder says only true things about the
history before it (:func:`tests.helpers.realtraj.fact_violations`).

Run ``python -m tests.helpers.realtraj_native [--stream] [--dir DIR]`` to print the table (exit status 1
when the gate fails).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from tests.helpers.corpus import ROOT, Observation, Replay, replay
from tests.helpers.native_wires import NATIVE_WIRES, trace_items, trace_messages
from tests.helpers.realtraj import FactViolation, fact_violations, failed_open, quiet_logs

ENV = "LOOPGUARD_REALTRAJ_NATIVE"
DEFAULT_DIR = ROOT.parent / "shared" / "fixtures" / "realtraj-native"
#: At most this many reminders per 1,000 calls over the set (they are noise on healthy work).
MAX_REMINDERS_PER_1000 = 2.0
#: Kinds of observation that block (never tolerated here).
BLOCKING = ("withhold", "stop", "cut")
KINDS = ("remind", "withhold", "stop", "cut")


def sessions_dir() -> Path:
    """``$LOOPGUARD_REALTRAJ_NATIVE`` when set, else ``../shared/fixtures/realtraj-native``."""
    env = os.environ.get(ENV)
    return Path(env) if env else DEFAULT_DIR


def load_sessions(directory: Path | None = None) -> list[dict[str, Any]]:
    """Every ``*.json`` session of ``directory`` (default :func:`sessions_dir`), by file name."""
    return [orjson.loads(p.read_bytes()) for p in sorted((directory or sessions_dir()).glob("*.json"))]


def conversations(session: dict[str, Any]) -> list[dict[str, Any]]:
    """The session's conversations as replayable fixtures: each compaction segment then the final
    body, ``id`` ``<session>#<n>`` (0-based), ``native`` the body, ``messages`` its chat form
    (:mod:`tests.helpers.native_wires`). Raises ``KeyError`` for a dialect without a wire."""
    dialect = session["dialect"]
    if dialect not in NATIVE_WIRES:
        raise KeyError(f"{session.get('id')}: no wire for dialect {dialect!r}")
    bodies = [*(session.get("compaction_segments") or []), session["request_bodies_final"]]
    out = []
    for n, body in enumerate(bodies):
        traced = (
            trace_messages(body["messages"])
            if dialect == "anthropic_messages"
            else trace_items(body["input"])
        )
        out.append(
            {
                "id": f"{session.get('id')}#{n}",
                "agent": session.get("agent"),
                "dialect": dialect,
                "native": body,
                "messages": traced.chat,
            }
        )
    return out


@dataclass(frozen=True)
class SessionReplay:
    """One session's replays (one per conversation, in order)."""

    session: dict[str, Any]
    replays: tuple[Replay, ...]

    @property
    def id(self) -> str:
        return str(self.session.get("id"))

    @property
    def agent(self) -> str:
        return str(self.session.get("agent"))

    @property
    def calls(self) -> int:
        return sum(r.calls for r in self.replays)

    @property
    def reminders(self) -> int:
        return sum(len(r.reminders) for r in self.replays)

    def observed(self, kind: str) -> list[tuple[str, Observation]]:
        """(conversation id, observation) of every observation of ``kind``."""
        return [(str(r.fixture.get("id")), o) for r in self.replays for o in r.observations if o.kind == kind]

    def count(self, kind: str) -> int:
        return self.reminders if kind == "remind" else len(self.observed(kind))

    def rules(self, kind: str) -> Counter[str]:
        """Per rule, how many observations of ``kind`` it was seen behind."""
        if kind == "remind":
            return Counter("+".join(m.rules) or "?" for r in self.replays for m in r.reminders)
        return Counter("+".join(o.rules) or "?" for _, o in self.observed(kind))

    @property
    def blocked(self) -> bool:
        return any(self.count(k) for k in BLOCKING)

    def violations(self) -> list[FactViolation]:
        return [v for r in self.replays for v in fact_violations(r)]


async def replay_session(session: dict[str, Any], stream: bool = False) -> SessionReplay:
    """Every conversation of ``session`` through a fresh proxy with the shipped default config."""
    wire = NATIVE_WIRES[session["dialect"]]
    done = [await replay(fx, None, stream, wire, final=False) for fx in conversations(session)]
    return SessionReplay(session, tuple(done))


async def replay_sessions(sessions: Sequence[dict[str, Any]], stream: bool = False) -> list[SessionReplay]:
    with quiet_logs():
        return [await replay_session(s, stream) for s in sessions]


# --- judging ---------------------------------------------------------------------------------------


def block_failures(s: SessionReplay) -> list[str]:
    """``"<conversation>: call N rule kind"`` for every block in ``s``."""
    return [f"{cid}: {o.describe()}" for kind in BLOCKING for cid, o in s.observed(kind)]


def gate_failures(done: Sequence[SessionReplay]) -> list[str]:
    """Every block, and every conversation the proxy failed open on."""
    out = [f for s in done for f in block_failures(s)]
    out += [f"{r.fixture.get('id')}: {why}" for s in done for r in s.replays if (why := failed_open(r))]
    return out


def reminder_rate(done: Sequence[SessionReplay]) -> float:
    """Reminders per 1,000 calls over ``done`` (0 without calls)."""
    calls = sum(s.calls for s in done)
    return 1000 * sum(s.reminders for s in done) / calls if calls else 0.0


def _rules_cell(s: SessionReplay) -> str:
    parts = []
    for kind in KINDS:
        for rule, n in sorted(s.rules(kind).items()):
            parts.append(f"{kind} {rule} x{n}")
    return "; ".join(parts) or "-"


def table(done: Sequence[SessionReplay]) -> str:
    """One row per session, then the totals per agent."""
    rows = [("session", "agent", "calls", "reminders", "withheld", "stops", "cuts", "rules")]
    for s in done:
        counts = [str(s.count(k)) for k in KINDS]
        rows.append((s.id, s.agent, str(s.calls), *counts, _rules_cell(s)))
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join([*lines, "", *totals(done)])


def totals(done: Sequence[SessionReplay]) -> list[str]:
    out = []
    for agent in sorted({s.agent for s in done}):
        mine = [s for s in done if s.agent == agent]
        calls = sum(s.calls for s in mine)
        reminders = sum(s.reminders for s in mine)
        blocked = sum(s.blocked for s in mine)
        out.append(
            f"{agent}: sessions blocked {blocked} of {len(mine)}; reminders per 1,000 calls "
            f"{reminder_rate(mine):.1f} ({reminders} reminders, {calls} calls)"
        )
    untrue = [v for s in done for v in s.violations()]
    out.append(
        f"all: sessions blocked {sum(s.blocked for s in done)} of {len(done)}; reminders per 1,000 calls "
        f"{reminder_rate(done):.1f} (gate: at most {MAX_REMINDERS_PER_1000:g}); untrue reminder claims: "
        f"{len(untrue)} in {sum(s.reminders for s in done)} reminders"
    )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m tests.helpers.realtraj_native", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--stream", action="store_true", help="replay with stream=true (SSE answers)")
    ap.add_argument("--dir", help=f"sessions directory (default: ${ENV} or {DEFAULT_DIR})")
    args = ap.parse_args(argv)
    directory = Path(args.dir) if args.dir else sessions_dir()
    if not directory.is_dir():
        print(f"no native sessions at {directory} (set ${ENV} to their directory)", file=sys.stderr)
        return 2
    began = time.monotonic()
    done = asyncio.run(replay_sessions(load_sessions(directory), args.stream))
    print(table(done))
    print(f"replayed in {time.monotonic() - began:.1f} s ({'sse' if args.stream else 'json'})")
    untrue = [v for s in done for v in s.violations()]
    for v in untrue:
        print(f"untrue: {v.describe()}")
    failures = gate_failures(done)
    for f in failures:
        print(f"FAIL {f}")
    rate = reminder_rate(done)
    if rate > MAX_REMINDERS_PER_1000:
        print(f"FAIL {rate:.1f} reminders per 1,000 calls (at most {MAX_REMINDERS_PER_1000:g})")
    return 1 if failures or untrue or rate > MAX_REMINDERS_PER_1000 else 0


if __name__ == "__main__":
    sys.exit(main())
