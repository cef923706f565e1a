"""Logs and a command line for people: the real CLI as a child process.

``--version``; ``serve --help`` lists every environment variable the proxy reads; a port in use
is one line on stderr and exit status 2; ``check-config`` lists every error of a file and prints
``admin_token`` redacted; ``--log-format console`` (colour on a terminal only) and the JSON
default when stderr is not a terminal; the startup line names the config file, the upstream,
the address and the enabled guards with their modes.
"""

from __future__ import annotations

import contextlib
import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

import proxy
from proxy.cli.main import ENVIRONMENT, REDACTED
from proxy.config import Config

ROOT = Path(__file__).resolve().parents[2]
ENV = {k: v for k, v in os.environ.items() if not k.startswith("LOOPGUARD_")} | {"PYTHONUNBUFFERED": "1"}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args], capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=60
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_version_prints_the_package_version() -> None:
    done = cli("--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"loopguard {proxy.__version__}\n", "")


def test_serve_help_lists_every_environment_variable_the_proxy_reads() -> None:
    read = set()
    for path in (ROOT / "proxy").rglob("*.py"):
        read |= set(re.findall(r"""(?:environ|env)(?:\.get)?[\[(]\s*["'](LOOPGUARD_\w+)""", path.read_text()))
    assert read == {name for name, _ in ENVIRONMENT}
    out = cli("serve", "--help").stdout
    for name, what in ENVIRONMENT:
        assert re.search(rf"^  {name} +{re.escape(what)}$", out, re.M), name


def test_port_in_use_is_one_line_and_exit_status_2() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        done = cli("serve", "--port", str(port))
    assert done.returncode == 2
    assert done.stderr == f"loopguard: cannot listen on 127.0.0.1:{port}: address already in use\n"


def test_check_config_lists_every_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "guards:\n  cycles:\n    repetitions: 1\n  nosuch: {}\nlisten:\n  port: 99999\nadmin_token: s3cret\n"
    )
    done = cli("check-config", str(bad))
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (
        "loopguard: invalid configuration: guards.cycles.repetitions: must be an integer >= 2\n"
        "loopguard: invalid configuration: guards.nosuch: unknown key\n"
        "loopguard: invalid configuration: listen.port: must be between 0 and 65535\n"
    )
    assert "s3cret" not in done.stderr


def test_check_config_on_a_valid_file_says_it_is_valid_in_one_line(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("listen: {port: 4100}\n")
    done = cli("check-config", str(good))
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == (
        f"loopguard: {good} is valid: every key is known and every value has its type and range "
        "(templates, patterns and URLs included); unset keys take their defaults. Enabled: "
        + ", ".join(f"{name} ({mode})" for name, mode in Config().modes().items())
        + ". --print shows the effective config.\n"
    )


def test_check_config_names_the_recovery_interventions_a_file_turns_on(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(
        "recovery:\n  reminders: redirect\n  collapse: {enabled: true, min_repeats: 4}\n"
        "  resample: {attempts: 2}\n  fallback: {url: 'http://127.0.0.1:8081/v1'}\n"
    )
    done = cli("check-config", str(good))
    assert done.returncode == 0
    assert done.stdout.endswith(
        ". Recovery: reminders: redirect, collapse (min_repeats 4), resample (2 attempts), fallback."
        " --print shows the effective config.\n"
    )


def test_the_startup_line_names_recovery_and_warns_of_an_unset_fallback_key(tmp_path: Path) -> None:
    path = tmp_path / "lg.yaml"
    path.write_text(
        "upstream:\n  url: http://127.0.0.1:9/v1\nrecovery:\n  resample: {attempts: 1}\n"
        "  fallback: {url: 'http://127.0.0.1:8081/v1', api_key_env: LOOPGUARD_TEST_UNSET_KEY}\n"
    )
    lines = _startup_lines(["--config", str(path)], 2)
    first, second = (orjson.loads(x) for x in lines)
    assert (first["event"], first["recovery"]) == ("listening", ["resample (1 attempt)", "fallback"])
    assert (second["event"], second["level"], second["variable"]) == (
        "recovery_fallback_key_missing",
        "warning",
        "LOOPGUARD_TEST_UNSET_KEY",
    )


def test_check_config_prints_admin_token_redacted(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("admin_token: s3cret\nmode: observe\n")
    done = cli("check-config", str(good), "--print")
    assert done.returncode == 0
    assert f"\nadmin_token: {REDACTED}\n" in done.stdout
    assert "s3cret" not in done.stdout
    assert "\nmode: observe\n" in done.stdout


def _startup_lines(args: list[str], count: int) -> list[str]:
    """The first ``count`` stderr lines of ``loopguard serve`` (JSON off a terminal), then SIGTERM."""
    port = free_port()
    argv = [sys.executable, "-m", "proxy", "serve", "--port", str(port), *args]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, cwd=ROOT, env=ENV)
    try:
        assert proc.stderr is not None
        return [proc.stderr.readline().decode() for _ in range(count)]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def _startup_line(args: list[str], tty: bool = False) -> str:
    """The first stderr line of ``loopguard serve`` (its startup line), then SIGTERM."""
    if not tty:
        return _startup_lines(args, 1)[0]
    port = free_port()
    argv = [sys.executable, "-m", "proxy", "serve", "--port", str(port), *args]
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stderr=slave, cwd=ROOT, env=ENV)
    os.close(slave)
    try:
        buf = b""
        while b"\n" not in buf:
            ready, _, _ = select.select([master], [], [], 60)
            assert ready, "no startup line"
            buf += os.read(master, 4096)
        return buf.split(b"\n")[0].decode()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        with contextlib.suppress(OSError):
            os.close(master)


@pytest.fixture
def config_file(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "lg.yaml"
    path.write_text(
        "guards:\n  circuit_breaker:\n    mode: observe\nupstream:\n  url: http://127.0.0.1:9/v1\n"
    )
    yield path


GUARDS = (
    "{'repeat_reminder': 'enforce', 'circuit_breaker': 'observe', 'recurrence': 'enforce', "
    "'cycles': 'enforce', 'repeated_failure': 'enforce', 'monologue': 'enforce', 'echo_loop': 'enforce', "
    "'same_target': 'enforce', 'escalation': 'enforce', 'waiting': 'enforce', 'stop': 'enforce', "
    "'response': 'enforce'}"
)


def test_console_format_is_for_people_and_has_no_colour_off_a_terminal(config_file: Path) -> None:
    line = _startup_line(["--config", str(config_file), "--log-format", "console"])
    assert "\x1b[" not in line
    pattern = (
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z \[info     \] listening +host=127\.0\.0\.1 port=\d+ "
        r"upstream=http://127\.0\.0\.1:9/v1 config=(?P<config>\S+) guards=(?P<guards>\{.*\}) "
        r"recovery=None capture=None "
        r"state=memory event_loop=(?P<loop>'uvloop [\d.]+'|asyncio)"
    )
    m = re.fullmatch(pattern, line.rstrip("\n"))
    assert m is not None, line
    assert (m["config"], m["guards"]) == (str(config_file), GUARDS)


def test_console_format_is_in_colour_on_a_terminal(config_file: Path) -> None:
    line = _startup_line(["--config", str(config_file), "--log-format", "console"], tty=True)
    assert "\x1b[" in line
    assert "listening" in line


def test_json_is_the_default_off_a_terminal_and_the_startup_line_names_everything(config_file: Path) -> None:
    line = orjson.loads(_startup_line(["--config", str(config_file)]))
    assert line["event"] == "listening"
    assert (line["config"], line["upstream"], line["host"]) == (
        str(config_file),
        "http://127.0.0.1:9/v1",
        "127.0.0.1",
    )
    assert line["guards"]["circuit_breaker"] == "observe"
    assert str(line["guards"]) == GUARDS
    assert "turn_guard" not in line["guards"]  # not enabled


def test_console_is_the_default_on_a_terminal(config_file: Path) -> None:
    line = _startup_line(["--config", str(config_file)], tty=True)
    assert not line.startswith("{")
    assert "\x1b[" in line
