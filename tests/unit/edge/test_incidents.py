"""Incident records (DESIGN §6.2): which denials are incidents, de-duplication, the JSONL
writer (background, flushed per line, failures logged once)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
from structlog.testing import capture_logs

from proxy.config import Config, build
from proxy.core.actions import Remind, Stop, Withhold
from proxy.core.clock import iso_utc
from proxy.edge.incidents import Incident, IncidentLog, first_fresh_denials
from proxy.edge.observe import Stats
from proxy.guards import build_guards
from proxy.request.conversation import key_digest
from proxy.request.rewrite import decide_request
from tests.unit.guards.test_circuit_breaker import conversation, letters

NOW = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def requests_of(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """What an agent sends, step by step: the history up to each tool result that ends a step."""
    out = []
    for i, m in enumerate(messages):
        nxt = messages[i + 1] if i + 1 < len(messages) else None
        if m["role"] == "tool" and (nxt is None or nxt["role"] != "tool"):
            out.append(messages[: i + 1])
    return out


def replay(
    log: IncidentLog,
    messages: list[dict[str, Any]],
    config: dict[str, Any] | None = None,
    agent: str = "agent-1",
    first: int = 1,
) -> list[Incident]:
    """Send the requests of ``messages`` (from the one answering call ``first``) through the
    guards and ``log``; the incidents recorded."""
    cfg = build(Config, config or {})
    guards = build_guards(cfg.guards)
    found: list[Incident] = []
    for history in requests_of(messages)[first - 1 :]:
        raw = orjson.dumps({"model": "m", "messages": history})
        decision = decide_request(raw, {"x-session-id": agent}, guards, cfg.conversation_key.headers)
        assert decision.conversation == key_digest(agent)
        found += log.record(decision.actions, decision.conversation, NOW)
    return found


def lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def withhold(reason: str, fresh: bool, rule: str = "circuit_breaker", count: int = 7) -> Withhold:
    return Withhold(1, "c", "t", rule, "bash", count, 6, fresh, reason)


# --- pure: which denials are incidents ------------------------------------------------------------


@pytest.mark.parametrize(
    ("actions", "expected"),
    [
        ([], []),
        ([withhold("duplicate", True)], [("duplicate", 7)]),
        ([withhold("duplicate", False), withhold("duplicate", True, count=8)], []),
        ([withhold("duplicate", True), withhold("duplicate", True, count=8)], [("duplicate", 7)]),
        ([withhold("duplicate", False), withhold("cap", True, count=301)], [("cap", 301)]),
        ([withhold("cap", True, count=9), withhold("duplicate", True)], [("cap", 9), ("duplicate", 7)]),
        ([withhold("waste", True, count=80), withhold("waste", True, count=81)], [("waste", 80)]),
        ([withhold("duplicate", True, rule="turn_guard")], []),
        ([Remind(3, "r", "repeat_reminder", "bash", 3, 3, True)], []),
    ],
)
def test_first_fresh_denials(actions: list[Any], expected: list[tuple[str, int]]) -> None:
    assert [(w.reason, w.count) for w in first_fresh_denials(actions)] == expected


def test_iso_utc() -> None:
    assert iso_utc(NOW) == "2026-01-01T00:00:00.000Z"
    assert iso_utc(NOW + 1234) == "2026-01-01T00:00:01.234Z"


# --- one conversation, request by request ------------------------------------------------------------


async def test_twenty_identical_calls_write_one_duplicate_line(tmp_path: Path) -> None:
    path = tmp_path / "incidents.jsonl"
    log = IncidentLog(str(path))
    await log.start()
    found = replay(log, conversation([("read_file", '{"path": "app.py"}')] * 20))
    await log.close()
    expected = {
        "time": "2026-01-01T00:00:00.000Z",
        "kind": "duplicate",
        "tool": "read_file",
        "count": 7,
        "limit": 6,
        "agent": key_digest("agent-1"),
    }
    assert [i.as_dict() for i in found] == [expected]
    assert path.read_bytes() == orjson.dumps(expected) + b"\n"


async def test_cap_incident_once_across_user_messages(tmp_path: Path) -> None:
    path = tmp_path / "incidents.jsonl"
    log = IncidentLog(str(path))
    await log.start()
    replay(
        log,
        conversation(letters("A B C u D E F u G H")),
        {"guards": {"circuit_breaker": {"max_calls_per_agent": 5}}},
    )
    await log.close()
    assert [(r["kind"], r["tool"], r["count"], r["limit"]) for r in lines(path)] == [
        ("cap", "read_file", 6, 5)
    ]


async def test_each_kind_once_per_conversation_and_per_agent(tmp_path: Path) -> None:
    path = tmp_path / "incidents.jsonl"
    log = IncidentLog(str(path))
    await log.start()
    cfg = {"guards": {"circuit_breaker": {"duplicate_limit": 2, "max_calls_per_agent": 4}}}
    messages = conversation(letters("A A A B B C D E A"))
    replay(log, messages, cfg, agent="one")
    replay(log, messages, cfg, agent="two")
    await log.close()
    assert [(r["agent"], r["kind"], r["count"], r["limit"]) for r in lines(path)] == [
        (key_digest("one"), "duplicate", 3, 2),
        (key_digest("one"), "cap", 6, 4),
        (key_digest("two"), "duplicate", 3, 2),
        (key_digest("two"), "cap", 6, 4),
    ]


async def test_client_retry_writes_nothing_twice(tmp_path: Path) -> None:
    path = tmp_path / "incidents.jsonl"
    log = IncidentLog(str(path))
    await log.start()
    messages = conversation([("bash", '{"command": "make"}')] * 7)
    assert len(replay(log, messages)) == 1
    assert replay(log, messages, first=7) == []  # the same last request again
    await log.close()
    assert len(lines(path)) == 1


async def test_restart_writes_no_duplicate_of_an_answered_denial(tmp_path: Path) -> None:
    """A new IncidentLog (empty memory) on the same file, later in the conversation: the history
    shows the denial was already made, so nothing is written."""
    path = tmp_path / "incidents.jsonl"
    messages = conversation([("bash", '{"command": "make"}')] * 9)
    first = IncidentLog(str(path))
    await first.start()
    replay(first, messages[:15])
    await first.close()
    second = IncidentLog(str(path))
    await second.start()
    assert replay(second, messages, first=8) == []  # calls 8 and 9: denials, not the first
    await second.close()
    assert [r["count"] for r in lines(path)] == [7]


def test_dedup_memory_is_bounded_lru() -> None:
    log = IncidentLog("", max_keys=2)
    fresh = [withhold("duplicate", True)]
    assert len(log.record(fresh, "a", NOW)) == 1
    assert len(log.record(fresh, "b", NOW)) == 1
    assert log.record(fresh, "a", NOW) == []  # refreshes a
    assert len(log.record(fresh, "c", NOW)) == 1  # evicts b, the least recently used
    assert log.record(fresh, "a", NOW) == []
    assert len(log.record(fresh, "b", NOW)) == 1


# --- the writer -----------------------------------------------------------------------------------


async def test_lines_are_written_off_the_event_loop_and_flushed_per_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "incidents.jsonl"
    threads: list[int] = []
    real_append = IncidentLog._append

    def spy(self: IncidentLog, line: bytes) -> None:
        threads.append(threading.get_ident())
        real_append(self, line)

    monkeypatch.setattr(IncidentLog, "_append", spy)
    log = IncidentLog(str(path))
    await log.start()
    log.record([withhold("duplicate", True)], "a", NOW)
    for _ in range(200):  # no close(): the line must reach the file on its own
        if path.exists() and path.read_bytes().endswith(b"\n"):
            break
        await asyncio.sleep(0.01)
    assert len(lines(path)) == 1
    log.record([withhold("cap", True)], "a", NOW)
    await log.close()
    assert [r["kind"] for r in lines(path)] == ["duplicate", "cap"]
    assert len(threads) == 2
    assert threading.get_ident() not in threads


async def test_unwritable_path_is_logged_once_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "missing-dir" / "incidents.jsonl"
    log = IncidentLog(str(path))
    await log.start()
    with capture_logs() as logs:
        for agent in ("a", "b", "c"):
            assert len(log.record([withhold("duplicate", True)], agent, NOW)) == 1
        await log.close()
    assert log.write_errors == 3
    errors = [e for e in logs if e["event"] == "incident_log_error"]
    assert errors == [
        {
            "event": "incident_log_error",
            "log_level": "error",
            "path": str(path),
            "error": "FileNotFoundError",
            "detail": "No such file or directory",
        }
    ]


async def test_a_directory_as_path_fails_without_raising(tmp_path: Path) -> None:
    log = IncidentLog(str(tmp_path))
    await log.start()
    with capture_logs() as logs:
        log.record([withhold("duplicate", True)], "a", NOW)
        await log.close()
    assert log.write_errors == 1
    assert [e["error"] for e in logs if e["event"] == "incident_log_error"] == ["IsADirectoryError"]


async def test_no_path_or_not_started_writes_nothing(tmp_path: Path) -> None:
    off = IncidentLog("")
    await off.start()
    assert len(off.record([withhold("duplicate", True)], "a", NOW)) == 1
    await off.close()
    path = tmp_path / "incidents.jsonl"
    idle = IncidentLog(str(path))
    assert len(idle.record([withhold("duplicate", True)], "a", NOW)) == 1
    await idle.close()
    assert not path.exists()


def test_stats_keep_the_last_50_incidents() -> None:
    stats = Stats()
    stats.record_incidents(Incident(iso_utc(NOW), "duplicate", "bash", 7, 6, f"a{i}") for i in range(60))
    snap = stats.snapshot()
    assert len(snap["incidents"]) == 50
    assert snap["incidents"][0] == {
        "time": "2026-01-01T00:00:00.000Z",
        "kind": "duplicate",
        "tool": "bash",
        "count": 7,
        "limit": 6,
        "agent": "a10",
    }
    assert snap["incidents"][-1]["agent"] == "a59"


def test_a_stop_already_recorded_skips_the_history_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a conversation's stop incident is recorded here, the next stopped answer records
    nothing without scanning its request body for earlier stops (a pass over the whole body)."""
    from proxy.edge import relay

    scans: list[int] = []
    real = relay.earlier_stops

    def counting(body: bytes, cfg: Any) -> Any:
        scans.append(len(body))
        return real(body, cfg)

    monkeypatch.setattr(relay, "earlier_stops", counting)
    cfg = build(Config, {})
    log, stats = IncidentLog(), Stats()
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    stop = Stop(text="stopped", rule="stop", tool="bash", count=3, limit=3)
    assert not log.seen("agent-1", "stop")
    for _ in range(3):
        side = relay.ResponseSide(kind="json", cfg=cfg, judge=None, actions=[stop])
        relay.record(side, stats, log, "agent-1", body, {})
    assert log.seen("agent-1", "stop")
    assert not log.seen("agent-2", "stop")
    assert scans == [len(body)]
    assert [i.kind for i in stats.incidents] == ["stop"]
