"""What an operator reads, as a new user's tryout found it: ``check-config`` lists every error of a
section; no credential is ever printed in an error or by ``check-config`` (``admin_token``'s
value, a URL's user info and query values) and an empty ``admin_token`` shows as off; a
``capture.path`` whose directory is missing fails at start naming the key, and capture write
errors are logged once and counted; ``loopguard replay`` skips unreadable capture lines and says
so per file, and names a conversation by the key the live log uses; a Redis outage keeps the
failure's type in the log while Redis rests; the ``listening`` line names the state backend;
``config_reloaded`` lists the guards with their modes. The real CLI runs as a subprocess where
the behaviour is the CLI's."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from structlog.testing import capture_logs

from proxy.cli.replay import load
from proxy.config import Config, StateConfig, build, config_errors, load_config
from proxy.config.redact import redact_url
from proxy.edge.keys import METRICS_KEY, STATS_KEY
from proxy.edge.observe import Stats, configure_logging
from proxy.edge.runtime import Live, build_runtime, reload_logged
from proxy.edge.serve import start
from proxy.edge.shared_state import LOST, SharedState
from proxy.errors import ConfigError
from tests.e2e.test_cli_and_log_formats import ENV, ROOT, _startup_line, cli, free_port
from tests.e2e.test_hot_reload import wait_for_event, with_overrides
from tests.e2e.test_observe_mode import LoopingModel, request_lines, run_agent
from tests.helpers.fakes import FakeUpstream
from tests.helpers.proxy_server import serve, serve_process
from tests.unit.request.test_shared_state import STATE, Scripted

INVALID = "loopguard: invalid configuration: "
TOKEN = "98765432109"


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "lg.yaml"
    path.write_text(text)
    return path


# --- every error of a section ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "errors"),
    [
        (
            "listen: {max_connections: 0, header_timeout_s: -1}\n",
            [
                "listen.header_timeout_s: must be > 0 or null",
                "listen.max_connections: must be an integer >= 1",
            ],
        ),
        (
            "response: {max_identical_per_response: -1, max_calls_per_response: -3}\n",
            [
                "response.max_calls_per_response: must be an integer >= 0 (0 = no limit)",
                "response.max_identical_per_response: must be an integer >= 0 (0 = no limit)",
            ],
        ),
        (
            "guards:\n  cycles: {min_period: 1, repetitions: 1, withhold_at: 1}\n",
            [
                "guards.cycles.min_period: must be an integer >= 2",
                "guards.cycles.repetitions: must be an integer >= 2",
                "guards.cycles.withhold_at: must be 0 (off) or > repetitions (1)",
            ],
        ),
        (
            "guards:\n  circuit_breaker: {duplicate_limit: 0, window: 0, max_calls_per_agent: -1}\n",
            [
                "guards.circuit_breaker.duplicate_limit: must be an integer >= 1",
                "guards.circuit_breaker.window: must be an integer >= 1",
                "guards.circuit_breaker.max_calls_per_agent: must be an integer >= 0 (0 = no cap)",
            ],
        ),
        (
            "progress:\n  masks: ['', '(', 'x*']\n",
            [
                "progress.masks[0]: must not be empty",
                "progress.masks[1]: is not a valid regular expression: missing ), unterminated "
                "subpattern at position 0",
                "progress.masks[2]: must not match the empty string",
            ],
        ),
        (
            "stop: {after_ignored_denials: -1, message: '{nope} {tool}'}\n",
            [
                "stop.after_ignored_denials: must be an integer >= 0 (0 = off)",
                "stop.message: unknown placeholder {nope}; allowed: {tool}, {count}, {limit}, {kind}, "
                "{denials}",
            ],
        ),
    ],
    ids=["listen", "response", "cycles", "circuit_breaker", "masks", "stop"],
)
def test_check_config_reports_every_error_of_a_section(tmp_path: Path, text: str, errors: list[str]) -> None:
    done = cli("check-config", str(_file(tmp_path, text)))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == "".join(f"{INVALID}{e}\n" for e in errors)


def test_serve_and_load_config_still_stop_at_the_first_error(tmp_path: Path) -> None:
    path = _file(tmp_path, "listen: {max_connections: 0, header_timeout_s: -1}\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value) == "listen.header_timeout_s: must be > 0 or null"
    done = cli("serve", "--config", str(path))
    assert (done.returncode, done.stderr) == (2, f"{INVALID}listen.header_timeout_s: must be > 0 or null\n")


# --- credentials -------------------------------------------------------------------------------

NOT_SHOWN = "admin_token: must be a string, got a value of type int (not shown)"


def test_a_non_string_admin_token_is_never_printed_by_check_config_or_serve(tmp_path: Path) -> None:
    path = _file(tmp_path, f"admin_token: {TOKEN}\n")
    for args in (("check-config", str(path)), ("serve", "--config", str(path))):
        done = cli(*args)
        assert (done.returncode, done.stdout, done.stderr) == (2, "", f"{INVALID}{NOT_SHOWN}\n"), args


async def test_a_non_string_admin_token_is_never_in_the_reload_answer_or_log(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    path = _file(tmp_path, "admin_token: tok\n")
    runner, port = await start(with_overrides(path, upstream.url), lambda: with_overrides(path, upstream.url))
    try:
        path.write_text(f"admin_token: {TOKEN}\n")
        with capture_logs() as logs:
            async with (
                aiohttp.ClientSession() as s,
                s.post(
                    f"http://127.0.0.1:{port}/loop-guard/reload", headers={"Authorization": "Bearer tok"}
                ) as r,
            ):
                status, body = r.status, await r.json()
    finally:
        await runner.cleanup()
    assert status == 400
    assert body["error"]["message"] == f"loopguard: config not reloaded: {NOT_SHOWN}"
    (rejected,) = [e for e in logs if e["event"] == "config_reload_rejected"]
    assert (rejected["key"], rejected["error"]) == ("admin_token", NOT_SHOWN)
    assert TOKEN not in repr(logs)


async def test_a_non_string_admin_token_is_never_in_the_sighup_log(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    path = _file(tmp_path, "admin_token: tok\n")
    proc = await serve_process(upstream.url, free_port(), path, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    try:
        await wait_for_event(proc.stderr, "listening")
        path.write_text(f"admin_token: {TOKEN}\n")
        os.kill(proc.pid, signal.SIGHUP)
        rejected = await wait_for_event(proc.stderr, "config_reload_rejected")
        proc.send_signal(signal.SIGTERM)
        rest = await asyncio.wait_for(proc.stderr.read(), 20)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert (rejected["via"], rejected["key"], rejected["error"]) == ("SIGHUP", "admin_token", NOT_SHOWN)
    assert TOKEN.encode() not in rest


def test_check_config_redacts_urls_and_shows_an_empty_admin_token_as_off(tmp_path: Path) -> None:
    path = _file(
        tmp_path,
        'admin_token: ""\n'
        "state: {backend: 'redis://default:RedisPw123@redis:6379/0'}\n"
        "upstream: {url: 'https://user:pw@h.example/v1?api-key=sk-1&api-version=2024-02-01'}\n",
    )
    done = cli("check-config", str(path), "--print")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "  url: https://<redacted>@h.example/v1?api-key=<redacted>&api-version=<redacted>" in lines
    assert "  backend: redis://<redacted>@redis:6379/0" in lines
    assert "admin_token: <empty = off>" in lines
    for secret in ("RedisPw123", "user:pw", "sk-1"):
        assert secret not in done.stdout


def test_an_unset_admin_token_stays_null_and_urls_without_credentials_stay_as_written(tmp_path: Path) -> None:
    done = cli(
        "check-config", str(_file(tmp_path, "state: {backend: 'unix:///run/redis.sock'}\n")), "--print"
    )
    lines = done.stdout.splitlines()
    assert "admin_token: null" in lines
    assert "  url: http://127.0.0.1:8080/v1" in lines
    assert "  backend: unix:///run/redis.sock" in lines


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            "upstream: {url: 'ftp://user:pw@h/v1?api-key=sk-1'}\n",
            "upstream.url: must be an http(s) URL, got 'ftp://<redacted>@h/v1?api-key=<redacted>'",
        ),
        (
            "state: {backend: 'redis:/default:RedisPw123@x'}\n",
            "state.backend: must be 'memory' or a redis:// URL, got a value that is not a URL with a "
            "host (not shown)",
        ),
        ("state: {backend: memry}\n", "state.backend: must be 'memory' or a redis:// URL, got 'memry'"),
        ("upstream: {url: 12}\n", "upstream.url: must be a string, got 12"),
        (
            "upstream: {url: 'localhost:8080/v1'}\n",
            "upstream.url: must be an http(s) URL, got 'localhost:8080/v1'",
        ),
        (
            "upstream: {url: '127.0.0.1:8080/v1?api-key=sk-1&api-version=2024&auth_token=t'}\n",
            "upstream.url: must be an http(s) URL, got "
            "'127.0.0.1:8080/v1?api-key=<redacted>&api-version=2024&auth_token=<redacted>'",
        ),
        (
            "upstream: {url: 'u:pw@localhost:8080/v1'}\n",
            "upstream.url: must be an http(s) URL, got a value that is not a URL with a host (not shown)",
        ),
    ],
    ids=[
        "upstream-userinfo",
        "backend-unparsed",
        "backend-word",
        "url-not-a-string",
        "url-without-scheme-shown",
        "url-without-scheme-key-query-marked",
        "url-without-scheme-userinfo-hidden",
    ],
)
def test_url_errors_never_show_credentials(tmp_path: Path, text: str, error: str) -> None:
    _, errors = config_errors(_file(tmp_path, text))
    assert [str(e) for e in errors] == [error]


@pytest.mark.parametrize(
    ("url", "plain", "marked"),
    [
        (
            "https://u:pw@h/v1?api-key=k&x",
            "https://h/v1",
            "https://<redacted>@h/v1?api-key=<redacted>&<redacted>",
        ),
        ("redis://default:pw@redis:6379/0", "redis://redis:6379/0", "redis://<redacted>@redis:6379/0"),
        ("http://[::1]:8080/v1", "http://[::1]:8080/v1", "http://[::1]:8080/v1"),
        ("unix:///tmp/r.sock?password=p", "unix:///tmp/r.sock", "unix:///tmp/r.sock?password=<redacted>"),
        ("http://h:port/v1", "", "http://<redacted>"),
        ("memory", "memory", "memory"),
    ],
)
def test_redact_url(url: str, plain: str, marked: str) -> None:
    assert (redact_url(url), redact_url(url, marked=True)) == (plain, marked)


# --- capture.path ------------------------------------------------------------------------------


def test_a_capture_path_in_a_missing_directory_fails_at_start(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    path = _file(tmp_path, f"capture: {{path: {missing / 'cap.jsonl'}}}\n")
    error = f"{INVALID}capture.path: its directory {str(missing)!r} does not exist\n"
    for args in (("check-config", str(path)), ("serve", "--config", str(path))):
        done = cli(*args)
        assert (done.returncode, done.stdout, done.stderr) == (2, "", error), args


def test_a_capture_path_that_cannot_be_a_file_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    (tmp_path / "d.jsonl").mkdir()
    cases = {
        tmp_path / "f" / "cap.jsonl": f"capture.path: {str(tmp_path / 'f')!r} is not a directory",
        tmp_path / "d.jsonl": f"capture.path: {str(tmp_path / 'd.jsonl')!r} is a directory",
    }
    for target, error in cases.items():
        _, errors = config_errors(_file(tmp_path, f"capture: {{path: {target}}}\n"))
        assert [str(e) for e in errors] == [error]


async def test_capture_write_errors_are_logged_once_and_counted(
    upstream: FakeUpstream, tmp_path: Path, capsys: Any
) -> None:
    directory = tmp_path / "captures"
    directory.mkdir()
    path = directory / "cap.jsonl"
    upstream.handler = LoopingModel()
    configure_logging("info")
    capsys.readouterr()
    async with serve({"capture": {"path": str(path)}}, upstream.url) as (base, app):
        shutil.rmtree(directory)  # the file is opened at the first line: every write fails
        await run_agent(base, False)
        guarded = app[STATS_KEY].guarded_requests
    await asyncio.sleep(0)  # the writer thread's reports, queued on the loop while it drained
    err = capsys.readouterr().err
    events = [orjson.loads(x) for x in err.splitlines() if x.startswith("{")]
    warnings = [e for e in events if e["event"] == "capture_write_error"]
    assert [(w["level"], w["path"], w["error"]) for w in warnings] == [
        ("warning", str(path), "FileNotFoundError")
    ]
    assert warnings[0]["detail"] == "No such file or directory"
    stats = app[STATS_KEY]
    assert guarded > 1
    assert stats.capture_write_errors == guarded
    assert stats.snapshot()["capture_write_errors"] == guarded
    metrics = app[METRICS_KEY].render().decode()
    assert f"loopguard_capture_write_errors_total {float(guarded)}" in metrics.splitlines()


# --- replay ------------------------------------------------------------------------------------


async def _captured(upstream: FakeUpstream, path: Path, capsys: Any) -> list[dict[str, Any]]:
    upstream.handler = LoopingModel()
    configure_logging("info")
    capsys.readouterr()
    async with serve({"capture": {"path": str(path)}}, upstream.url) as (base, _app):
        await run_agent(base, False)
    return request_lines(capsys.readouterr().err)


def _replay(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", "replay", "--no-progress", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=ENV,
        timeout=120,
    )


async def test_replay_skips_unreadable_capture_lines_and_says_how_many_per_file(
    upstream: FakeUpstream, tmp_path: Path, capsys: Any
) -> None:
    clean = tmp_path / "clean.jsonl"
    await _captured(upstream, clean, capsys)
    lines = clean.read_bytes().splitlines(keepends=True)
    broken = tmp_path / "broken.jsonl"
    # a line of something else in the middle, and a last line cut short (a crash, a full disk)
    broken.write_bytes(b"".join(lines[:2]) + b"[1, 2]\n" + b"".join(lines[2:]) + lines[-1][:25])
    expected = _replay(str(clean))
    assert (expected.returncode, expected.stderr) == (0, "")
    assert "actions" in expected.stdout
    done = _replay(str(broken))
    assert done.returncode == 0
    assert done.stderr == f"loopguard: replay: {broken}: skipped 2 unreadable lines (not a JSON object)\n"
    assert done.stdout == expected.stdout.replace(str(clean), str(broken))
    one = tmp_path / "one.jsonl"
    one.write_bytes(b"".join(lines) + lines[-1][:25])
    done = _replay(str(one), str(clean))
    assert done.returncode == 0
    assert done.stderr == f"loopguard: replay: {one}: skipped 1 unreadable line (not a JSON object)\n"


async def test_replay_names_a_conversation_by_the_key_the_live_log_uses(
    upstream: FakeUpstream, tmp_path: Path, capsys: Any
) -> None:
    path = tmp_path / "cap.jsonl"
    live = await _captured(upstream, path, capsys)
    keys = [line["conversation"] for line in live]
    assert len(set(keys[1:])) == 1 and keys[0] != keys[1]  # a first request has no call id yet
    (conv,) = load([path])
    assert conv.id == keys[1]
    assert [e.key for e in conv.exchanges] == keys
    done = _replay(str(path))
    assert done.stdout.splitlines()[0].startswith(f"{keys[1]} (capture): ")


# --- logs --------------------------------------------------------------------------------------


async def test_while_redis_rests_the_log_keeps_the_failures_type() -> None:
    backend = Scripted(fail=True)
    shared = SharedState(StateConfig(backend="redis://x", retry_s=3600), Stats(), backend=backend)
    with capture_logs() as logs:
        await shared.save_state("c", STATE)  # fails: Redis rests
        assert await shared.claim("c", "duplicate") is True  # not asked while resting
    warnings = [e for e in logs if e["event"] == "state_backend_error"]
    assert [(w["op"], w["error"], w.get("resting")) for w in warnings] == [
        ("save_state", "ConnectionRefusedError", None),
        ("claim_incident", "ConnectionRefusedError", True),
    ]
    assert warnings[1]["lost"] == LOST["claim_incident"]


def test_the_listening_line_names_the_state_backend_without_credentials(tmp_path: Path) -> None:
    path = _file(tmp_path, "state: {backend: 'redis://default:RedisPw123@127.0.0.1:9/0'}\n")
    line = orjson.loads(_startup_line(["--config", str(path)]))
    assert (line["event"], line["state"]) == ("listening", "redis://127.0.0.1:9/0")
    line = orjson.loads(_startup_line([]))
    assert line["state"] == "memory"


async def test_config_reloaded_lists_the_guards_with_their_modes(tmp_path: Path) -> None:
    path = _file(tmp_path, "")
    live = Live(build_runtime(Config()), lambda: load_config(path))
    path.write_text("guards:\n  circuit_breaker: {mode: observe}\n  cycles: {enabled: false}\n")
    with capture_logs() as logs:
        assert await reload_logged(live, "http") is None
    (reloaded,) = logs
    assert reloaded["event"] == "config_reloaded"
    assert reloaded["guards"] == {
        "repeat_reminder": "enforce",
        "circuit_breaker": "observe",
        "recurrence": "enforce",
        "repeated_failure": "enforce",
        "monologue": "enforce",
        "echo_loop": "enforce",
        "same_target": "enforce",
        "escalation": "enforce",
        "waiting": "enforce",
        "stop": "enforce",
        "response": "enforce",
    }
    assert (
        reloaded["guards"]
        == build(
            Config, {"guards": {"circuit_breaker": {"mode": "observe"}, "cycles": {"enabled": False}}}
        ).modes()
    )
