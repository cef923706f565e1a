"""Native-session gate harness: real agent sessions replayed in their own wire.

The sessions are third-party data read where they lie, never copied into the project: two folders,
``../shared/fixtures/realtraj-native/*.json`` (Claude Code, Codex) and
``../shared/fixtures/realtraj-native-more/*.json`` (Codex, Gemini CLI, OpenCode) from the project
root, or ``$LOOPGUARD_REALTRAJ_NATIVE`` and ``$LOOPGUARD_REALTRAJ_NATIVE_MORE`` (fields in each
directory's ``README.md``: ``id``, ``agent``, ``dialect``, ``request_bodies_final``,
``compaction_segments``). Every conversation of a session (each compaction segment, then the final
body) is replayed with :func:`tests.helpers.corpus.replay` in the session's own dialect
(:data:`tests.helpers.native_wires.NATIVE_WIRES`: ``anthropic_messages``, ``openai_responses``,
``gemini_generate_content``, ``openai_chat``): a fresh proxy per conversation with the shipped
default config, one request per recorded assistant turn (the body cut just before it), the fake
upstream answering that turn as recorded, JSON or SSE. Observations are the corpus reading (what
crossed the wire, each counted at one call): a result *withheld*, a *reminder* (each distinct
text), a turn *stopped* (the answer lost its calls), an answer *cut* (fewer calls), the rule
behind each from ``GET /loop-guard``.

The gate (:func:`gate_failures`, :func:`rate_failures`): no session has a result withheld, a turn
stopped or an answer cut, and the proxy never fails open; at most :data:`MAX_REMINDERS_PER_1000`
reminders per 1,000 calls for each agent (and so over the whole set); every reminder says only
true things about the history before it (:func:`tests.helpers.realtraj.fact_violations`).

Run ``python -m tests.helpers.realtraj_native [--stream] [--dir DIR ...]`` to print the table (exit
status 1 when the gate fails).
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
from tests.helpers.native_wires import NATIVE_HISTORY, NATIVE_WIRES
from tests.helpers.realtraj import FactViolation, fact_violations, failed_open, quiet_logs

ENV = "LOOPGUARD_REALTRAJ_NATIVE"
ENV_MORE = "LOOPGUARD_REALTRAJ_NATIVE_MORE"
DEFAULT_DIR = ROOT.parent / "shared" / "fixtures" / "realtraj-native"
DEFAULT_DIR_MORE = ROOT.parent / "shared" / "fixtures" / "realtraj-native-more"
#: Each folder of sessions: the variable that names it, and where it is looked for without it.
FOLDERS = ((ENV, DEFAULT_DIR), (ENV_MORE, DEFAULT_DIR_MORE))
#: At most this many reminders per 1,000 calls for each agent (they are noise on healthy work).
MAX_REMINDERS_PER_1000 = 2.0
#: Kinds of observation that block (never tolerated here).
BLOCKING = ("withhold", "stop", "cut")
KINDS = ("remind", "withhold", "stop", "cut")


def sessions_dirs() -> list[tuple[str, Path]]:
    """Per folder of :data:`FOLDERS`: (its variable, ``$VARIABLE`` when set, else the default)."""
    out = []
    for env, default in FOLDERS:
        value = os.environ.get(env)
        out.append((env, Path(value) if value else default))
    return out


def sessions_dir() -> Path:
    """The first folder (``$LOOPGUARD_REALTRAJ_NATIVE``, else ``../shared/fixtures/realtraj-native``)."""
    return sessions_dirs()[0][1]


def load_sessions(directory: Path | None = None) -> list[dict[str, Any]]:
    """Every ``*.json`` session of ``directory`` (default :func:`sessions_dir`), by file name."""
    return [orjson.loads(p.read_bytes()) for p in sorted((directory or sessions_dir()).glob("*.json"))]


def conversations(session: dict[str, Any]) -> list[dict[str, Any]]:
    """The session's conversations as replayable fixtures: each compaction segment then the final
    body, ``id`` ``<session>#<n>`` (0-based), ``native`` the body, ``messages`` its chat form
    (:data:`tests.helpers.native_wires.NATIVE_HISTORY`). Raises ``KeyError`` for a dialect
    without a wire."""
    dialect = session["dialect"]
    if dialect not in NATIVE_WIRES:
        raise KeyError(f"{session.get('id')}: no wire for dialect {dialect!r}")
    member, trace = NATIVE_HISTORY[dialect]
    bodies = [*(session.get("compaction_segments") or []), session["request_bodies_final"]]
    return [
        {
            "id": f"{session.get('id')}#{n}",
            "agent": session.get("agent"),
            "dialect": dialect,
            "native": body,
            "messages": trace(body[member]).chat,
        }
        for n, body in enumerate(bodies)
    ]


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


async def replay_session(
    session: dict[str, Any], stream: bool = False, config: dict[str, Any] | None = None
) -> SessionReplay:
    """Every conversation of ``session`` through a fresh proxy with ``config`` (a dict; None: the
    shipped default config)."""
    wire = NATIVE_WIRES[session["dialect"]]
    done = [await replay(fx, config, stream, wire, final=False) for fx in conversations(session)]
    return SessionReplay(session, tuple(done))


async def replay_sessions(
    sessions: Sequence[dict[str, Any]], stream: bool = False, config: dict[str, Any] | None = None
) -> list[SessionReplay]:
    with quiet_logs():
        return [await replay_session(s, stream, config) for s in sessions]


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


def by_agent(done: Sequence[SessionReplay]) -> dict[str, list[SessionReplay]]:
    """``done`` grouped by agent, agents sorted by name."""
    return {agent: [s for s in done if s.agent == agent] for agent in sorted({s.agent for s in done})}


def rate_failures(done: Sequence[SessionReplay]) -> list[str]:
    """``"<agent>: <rate> reminders per 1,000 calls (...)"`` for every agent over the limit."""
    out = []
    for agent, mine in by_agent(done).items():
        rate = reminder_rate(mine)
        if rate > MAX_REMINDERS_PER_1000:
            out.append(
                f"{agent}: {rate:.1f} reminders per 1,000 calls ({sum(s.reminders for s in mine)} reminders, "
                f"{sum(s.calls for s in mine)} calls; at most {MAX_REMINDERS_PER_1000:g})"
            )
    return out


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
    """Per agent, then over all: calls, reminders, withheld results, stops, cuts, sessions blocked
    and reminders per 1,000 calls; then the untrue reminder claims."""
    rows = [("agent", "sessions", "blocked", "calls", "reminders", "withheld", "stops", "cuts", "per 1,000")]
    groups = [*by_agent(done).items(), ("all", list(done))]
    for agent, mine in groups:
        counts = [str(sum(s.count(k) for s in mine)) for k in KINDS]
        calls = str(sum(s.calls for s in mine))
        blocked = str(sum(s.blocked for s in mine))
        rows.append((agent, str(len(mine)), blocked, calls, *counts, f"{reminder_rate(mine):.1f}"))
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    untrue = [v for s in done for v in s.violations()]
    lines.append(
        f"gate: no block; at most {MAX_REMINDERS_PER_1000:g} reminders per 1,000 calls per agent; "
        f"untrue reminder claims: {len(untrue)} in {sum(s.reminders for s in done)} reminders"
    )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m tests.helpers.realtraj_native", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--stream", action="store_true", help="replay with stream=true (SSE answers)")
    ap.add_argument(
        "--dir",
        action="append",
        help=f"a sessions directory, repeatable (default: ${ENV} and ${ENV_MORE}, or their defaults)",
    )
    args = ap.parse_args(argv)
    directories = [Path(d) for d in args.dir] if args.dir else [d for _, d in sessions_dirs()]
    missing = [d for d in directories if not d.is_dir()]
    for d in missing:
        print(f"no native sessions at {d} (set ${ENV} / ${ENV_MORE} to their directories)", file=sys.stderr)
    if len(missing) == len(directories):
        return 2
    began = time.monotonic()
    sessions = [s for d in directories if d.is_dir() for s in load_sessions(d)]
    done = asyncio.run(replay_sessions(sessions, args.stream))
    print(table(done))
    print(f"replayed in {time.monotonic() - began:.1f} s ({'sse' if args.stream else 'json'})")
    untrue = [v for s in done for v in s.violations()]
    for v in untrue:
        print(f"untrue: {v.describe()}")
    failures = gate_failures(done) + rate_failures(done)
    for f in failures:
        print(f"FAIL {f}")
    return 1 if failures or untrue else 0


if __name__ == "__main__":
    sys.exit(main())
