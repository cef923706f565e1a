"""Capture and replay: ``capture.*`` through the real server, ``loopguard replay``.

- A looping session through the real server with ``capture.contents: false`` replays to the
  same actions, request by request, as the live run logged (enforce and observe, JSON and SSE).
- The capture holds no header, no text and no argument value as sent (digests that keep
  equality), unless ``contents: true``; it rotates at ``max_bytes`` and replay reads the backups.
- The replay output is pinned on fixtures of ``shared/fixtures/loops`` (table and JSON, through
  the real CLI) and its totals per rule over the whole loops corpus.
"""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.cli.replay import as_json, load, replay, replay_all, table, totals
from proxy.config import Config, build
from proxy.core.canonical import canonical_arguments, parse_arguments
from proxy.edge.capture import PREFIX, digest, redact_arguments
from proxy.edge.observe import configure_logging
from proxy.request.conversation import key_digest
from tests.e2e.test_observe_mode import LoopingModel, request_lines, run_agent
from tests.helpers.corpus import fixture_dir
from tests.helpers.fakes import FakeUpstream
from tests.helpers.proxy_server import serve
from tests.helpers.realtraj import runs_dir

ROOT = Path(__file__).resolve().parents[2]
LOOPS = fixture_dir()


async def _live(
    upstream: FakeUpstream,
    config: dict[str, Any],
    stream: bool,
    capsys: Any,
    model: LoopingModel | None = None,
) -> list[dict[str, Any]]:
    upstream.handler = model or LoopingModel()
    configure_logging("info")
    capsys.readouterr()
    async with serve(config, upstream.url) as (base, _app):
        await run_agent(base, stream)
    return request_lines(capsys.readouterr().err)


def _by_exchange(acts: list[Any]) -> list[list[tuple[str, str, str]]]:
    out: dict[int, list[tuple[str, str, str]]] = defaultdict(list)
    for a in acts:
        out[a.exchange].append((a.rule, a.kind, a.mode))
    return [sorted(out[i]) for i in range(max(out, default=-1) + 1)]


@pytest.mark.parametrize(
    "tool",
    [("read_file", '{"path": "app.py"}'), ("bash", '{"command": "cat app.py | head -5"}')],
    ids=["read", "bash"],
)
@pytest.mark.parametrize("mode", ["enforce", "observe"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_replaying_a_digest_capture_gives_the_live_actions(
    upstream: FakeUpstream, tmp_path: Path, capsys: Any, stream: bool, mode: str, tool: tuple[str, str]
) -> None:
    path = tmp_path / "capture.jsonl"
    config = {"mode": mode, "capture": {"path": str(path)}}
    lines = await _live(upstream, config, stream, capsys, LoopingModel(*tool))
    live = [
        sorted((a["rule"], a["kind"], a.get("mode", "enforce")) for a in line["actions"]) for line in lines
    ]
    assert any(live), "the session must loop"
    (conv,) = load([path])
    assert len(conv.exchanges) == len(lines)
    result = replay(conv, build(Config, config))
    assert result.errors == 0
    replayed = _by_exchange(result.acts)
    replayed += [[]] * (len(live) - len(replayed))
    assert replayed == live


async def test_capture_holds_no_header_and_no_text_unless_contents(
    upstream: FakeUpstream, tmp_path: Path, capsys: Any
) -> None:
    path = tmp_path / "capture.jsonl"
    upstream.handler = LoopingModel()

    async with serve({"capture": {"path": str(path)}}, upstream.url) as (base, _app):
        body = {
            "model": "secret-model",
            "temperature": 0.25,
            "messages": [
                {"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": "Fix the bug in app.py"},
            ],
        }
        headers = {"Authorization": "Bearer sk-topsecret", "x-session-id": "sess-1"}
        async with (
            aiohttp.ClientSession() as s,
            s.post(f"{base}/v1/chat/completions", json=body, headers=headers) as r,
        ):
            assert r.status == 200
            await r.read()
    raw = path.read_bytes()
    for secret in (
        b"sk-topsecret",
        b"Authorization",
        b"secret-model",
        b"temperature",
        b"Fix the bug",
        b"app.py",
    ):
        assert secret not in raw
    (line,) = [orjson.loads(x) for x in raw.splitlines()]
    assert line["conversation"] == key_digest("sess-1")
    assert line["messages"] == [
        {"role": "system", "content": digest("You are a coding agent.")},
        {"role": "user", "content": digest("Fix the bug in app.py")},
    ]
    assert line["answer"] == {
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "name": "read_file",
                "arguments": f'{{"path":"{digest(chr(34) + "app.py" + chr(34))}"}}',
            }
        ],
    }
    assert set(line) == {"v", "time_ms", "conversation", "dialect", "contents", "messages", "answer"}


def test_digested_arguments_keep_equality_and_keys() -> None:
    a = redact_arguments('{"path": "app.py", "n": 2.0}')
    b = redact_arguments('{"n": 2, "path": "app.py"}')
    assert canonical_arguments(parse_arguments(a), a) == canonical_arguments(parse_arguments(b), b)
    assert orjson.loads(a).keys() == {"path", "n"}
    assert (
        orjson.loads(redact_arguments('{"n": 2}'))["n"] == orjson.loads(redact_arguments('{"n": 2.0}'))["n"]
    )
    assert redact_arguments('{"path": "a"}') != redact_arguments('{"path": "b"}')
    assert redact_arguments("not json") == digest("not json")
    assert digest("x").startswith(PREFIX)
    assert not any(ch.isdigit() or ch in "abcdef" for ch in digest("x")[len(PREFIX) :])


async def test_contents_true_keeps_texts(upstream: FakeUpstream, tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "capture.jsonl"
    await _live(upstream, {"capture": {"path": str(path), "contents": True}}, False, capsys)
    first = orjson.loads(path.read_bytes().splitlines()[0])
    assert first["messages"][1] == {"role": "user", "content": "Fix the bug in app.py"}
    assert first["answer"]["tool_calls"][0]["arguments"] == '{"path": "app.py"}'


async def test_capture_rotates_and_replay_reads_the_backups(
    upstream: FakeUpstream, tmp_path: Path, capsys: Any
) -> None:
    path = tmp_path / "capture.jsonl"
    config = {"mode": "observe", "capture": {"path": str(path), "max_bytes": 5000, "backups": 2}}
    lines = await _live(upstream, config, False, capsys)
    files = sorted(p.name for p in tmp_path.iterdir())
    sizes = {p.name: [len(x) for x in p.read_bytes().splitlines()] for p in tmp_path.iterdir()}
    assert files == ["capture.jsonl", "capture.jsonl.1", "capture.jsonl.2"], sizes
    assert all(p.stat().st_size <= 5000 for p in tmp_path.iterdir()), sizes
    kept = sum(len(p.read_bytes().splitlines()) for p in tmp_path.iterdir())
    assert kept < len(lines)  # the oldest lines were dropped with the third backup
    (conv,) = load([tmp_path])
    assert len(conv.exchanges) == kept
    times = [e.time_ms for e in conv.exchanges]
    assert times == sorted(times)  # backups oldest first


# --- pinned output on the fixtures ------------------------------------------------------------------

T3_TABLE = """\
T3 (loop): 10 calls, 1 actions
  call  rule       kind    reason  count  side     mode
  5     echo_loop  remind  -       3/3    request  enforce

totals over 1 conversation:
  rule       remind  withhold  stop  cut  total
  echo_loop  1       0         0     0    1
  total      1       0         0     0    1
"""


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", "replay", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_replay_table_on_a_fixture_through_the_cli() -> None:
    done = _cli(str(LOOPS / "T3.json"))
    assert (done.returncode, done.stdout, done.stderr) == (0, T3_TABLE, "")


def test_replay_json_on_fixtures_through_the_cli() -> None:
    done = _cli(str(LOOPS / "T10.json"), str(LOOPS / "F3.json"), "--format", "json")
    assert done.returncode == 0
    doc = orjson.loads(done.stdout)
    assert [(c["id"], c["label"], c["calls"], c["errors"]) for c in doc["conversations"]] == [
        ("T10", "loop", 12, 0),
        ("F3", "legit", 25, 0),
    ]
    assert [
        (a["call"], a["rule"], a["kind"], a["reason"], a["side"]) for a in doc["conversations"][0]["actions"]
    ] == [
        (5, "recurrence", "remind", "", "request"),
        (6, "cycles", "remind", "", "request"),
        (6, "repeated_failure", "remind", "", "request"),
        (8, "recurrence", "remind", "", "request"),
        (8, "cycles", "withhold", "cycle", "request"),
        (9, "cycles", "withhold", "cycle", "request"),
        (10, "stop", "stop", "denials", "response"),
        (10, "cycles", "withhold", "cycle", "request"),
        (10, "escalation", "withhold", "reminders", "request"),
        (11, "stop", "stop", "denials", "response"),
        (11, "cycles", "withhold", "cycle", "request"),
        (12, "stop", "stop", "escalation", "response"),
        (12, "cycles", "withhold", "cycle", "request"),
        (12, "escalation", "withhold", "reminders", "request"),
    ]
    assert doc["conversations"][1]["actions"] == []
    assert doc["totals"] == totals(replay_all(load([LOOPS / "T10.json", LOOPS / "F3.json"]), Config()))


def test_two_reminders_of_one_rule_at_one_call_are_told_apart_by_their_count() -> None:
    """T1's last step has parallel calls that pass two thresholds of repeat_reminder (5 and 8):
    two reminders after the same results (delivered as one message), both at its last call."""
    (result,) = replay_all(load([LOOPS / "T1.json"]), Config())
    at_25 = [(a.rule, a.kind, a.evidence) for a in result.acts if a.call == 25 and a.kind == "remind"]
    assert at_25 == [("repeat_reminder", "remind", "5/5"), ("repeat_reminder", "remind", "8/8")]


def test_replay_output_formats_agree() -> None:
    results = replay_all(load([LOOPS / "T3.json"]), Config())
    assert table(results) == T3_TABLE
    doc = orjson.loads(as_json(results))
    assert doc["conversations"][0]["actions"] == [
        {
            "call": 5,
            "rule": "echo_loop",
            "kind": "remind",
            "side": "request",
            "exchange": 5,
            "mode": "enforce",
            "reason": "",
            "count": 3,
            "limit": 3,
        }
    ]


LOOPS_TOTALS = {
    "circuit_breaker": {"withhold": 72},
    "cycles": {"remind": 2, "withhold": 24},
    "echo_loop": {"remind": 1},
    "escalation": {"withhold": 55},
    "recurrence": {"remind": 5},
    "repeat_reminder": {"remind": 17},
    "repeated_failure": {"remind": 5},
    # T16's 24 identical submit_implementation calls (cut past 2), and T1's 20 identical
    # ``git status -sb`` in one reply (read-only: cut past 4)
    "runaway": {"cut": 2},
    "stop": {"stop": 49},
}


def test_replay_totals_per_rule_over_the_loops_corpus() -> None:
    results = replay_all(load([LOOPS]), Config())
    assert [r.conversation.id for r in results][:3] == ["F2", "F3", "F5"]
    assert len(results) == 14
    assert sum(r.errors for r in results) == 0
    assert totals(results) == LOOPS_TOTALS


def test_observe_mode_replay_marks_every_action_observed_and_decides_the_same() -> None:
    enforce = replay_all(load([LOOPS]), Config())
    observe = replay_all(load([LOOPS]), build(Config, {"mode": "observe"}))
    assert {a.mode for r in observe for a in r.acts} == {"observe"}
    assert [[(a.call, a.rule, a.kind) for a in r.acts] for r in observe] == [
        [(a.call, a.rule, a.kind) for a in r.acts] for r in enforce
    ]


async def test_replay_of_a_capture_keeps_narration_timing(
    upstream: FakeUpstream, tmp_path: Path, capsys: Any
) -> None:
    """Narration is the one rule that reads time: the capture records the time each request was
    decided at, and replay decides at it, so the narration reminders are the live ones."""
    path = tmp_path / "capture.jsonl"
    config = {"capture": {"path": str(path)}, "guards": {"turn_guard": {"enabled": True}}}
    upstream.handler = LoopingModel()
    configure_logging("info")
    capsys.readouterr()
    ticks = iter(range(1_700_000_000_000, 1_800_000_000_000, 100_000))  # 100 s per request
    async with serve(config, upstream.url) as (base, app):
        from proxy.edge.keys import MEMORY_KEY

        app[MEMORY_KEY].clock = lambda: next(ticks)
        await run_agent(base, False)
    lines = request_lines(capsys.readouterr().err)
    live = [
        sorted((a["rule"], a["kind"], a.get("mode", "enforce")) for a in line["actions"]) for line in lines
    ]
    assert any(("narration", "remind", "enforce") in acts for acts in live)
    (conv,) = load([path])
    result = replay(conv, build(Config, config))
    replayed = _by_exchange(result.acts)
    replayed += [[]] * (len(live) - len(replayed))
    assert replayed == live


REALTRAJ = runs_dir()
REALTRAJ_TABLE = """\
coder-django__django-12915-3-programmer (real instance_resolved): 20 calls, 3 actions
  call  rule              kind      reason     count  side     mode
  12    repeated_failure  remind    -          2/2    request  enforce
  13    repeat_reminder   remind    -          3/3    request  enforce
  14    escalation        withhold  reminders  2/2    request  enforce

coder-sympy__sympy-17022-4-tester (real exit_cost): 31 calls, 3 actions
  call  rule              kind    reason  count  side     mode
  19    repeated_failure  remind  -       3/3    request  enforce
  26    repeated_failure  remind  -       2/2    request  enforce
  27    repeated_failure  remind  -       3/3    request  enforce

totals over 2 conversations:
  rule              remind  withhold  stop  cut  total
  escalation        0       1         0     0    1
  repeat_reminder   1       0         0     0    1
  repeated_failure  4       0         0     0    4
  total             5       1         0     0    6
"""


@pytest.mark.skipif(
    not REALTRAJ.is_dir(), reason="no recorded runs ($LOOPGUARD_REALTRAJ or ../shared/fixtures/realtraj)"
)
def test_replay_table_on_recorded_runs_through_the_cli() -> None:
    names = ("coder-django__django-12915-3-programmer.json", "coder-sympy__sympy-17022-4-tester.json")
    done = _cli(*(str(REALTRAJ / n) for n in names))
    assert (done.returncode, done.stdout, done.stderr) == (0, REALTRAJ_TABLE, "")
