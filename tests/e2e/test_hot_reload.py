"""Hot reload: ``POST /loop-guard/reload`` (in process) and ``SIGHUP`` (the real
``loopguard serve`` as a child process) re-read the config file. A valid file applies to the
requests that start after it; a request in flight finishes under the config it started with; an
invalid file, or one that changes a key only a restart can change, is rejected naming the key
and the old config stays."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy.config import Config, load_config, restart_keys
from proxy.config.checks import NESTED_QUANTIFIERS
from proxy.config.load import MAX_NODES
from proxy.edge.serve import start
from tests.e2e.test_shutdown import free_port
from tests.helpers.fakes import FakeUpstream, completion, repeated_call_messages, tool_call
from tests.helpers.proxy_server import serve_process
from tests.unit.config.test_hostile_config import bomb

CHAT = "/v1/chat/completions"
#: The response side's runaway limit is on (2 identical calls per answer, the default) ...
CUTS = "admin_token: tok\n"
#: ... or off: the same answer passes unchanged.
PASSES = "admin_token: tok\nresponse: {max_identical_per_response: 0}\n"
AUTH = {"Authorization": "Bearer tok"}


def three_identical() -> dict[str, Any]:
    """An answer making the same call three times (the runaway limit keeps two)."""
    return completion(
        [tool_call("write_file", '{"path": "a.py", "content": "x"}', f"call_{i}") for i in range(3)]
    )


def answer_with(obj: dict[str, Any], gate: asyncio.Event | None = None, arrived: asyncio.Event | None = None):
    """An upstream handler answering ``obj``; with ``gate``, only once it is set (``arrived`` is
    set when the request is held)."""

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        if arrived is not None:
            arrived.set()
        if gate is not None:
            await gate.wait()
        return web.json_response(obj, dumps=lambda o: orjson.dumps(o).decode())

    return handler


def with_overrides(path: Path, upstream_url: str) -> Config:
    """What the CLI's re-read gives: the file, then the listen and upstream flags on top."""
    cfg = load_config(path)
    return dataclasses.replace(
        cfg,
        listen=dataclasses.replace(cfg.listen, host="127.0.0.1", port=0),
        upstream=dataclasses.replace(cfg.upstream, url=upstream_url),
    )


@pytest.fixture
async def proxy(upstream: FakeUpstream, tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    """The real server started from a file (``CUTS``); yields its base URL and the file."""
    path = tmp_path / "lg.yaml"
    path.write_text(CUTS)
    runner, port = await start(with_overrides(path, upstream.url), lambda: with_overrides(path, upstream.url))
    try:
        yield f"http://127.0.0.1:{port}", path
    finally:
        await runner.cleanup()


async def calls_in_answer(s: aiohttp.ClientSession, base: str) -> int:
    body = {"model": "m", "messages": repeated_call_messages(1)}
    async with s.post(base + CHAT, json=body) as r:
        assert r.status == 200
        answer = await r.json()
    return len(answer["choices"][0]["message"].get("tool_calls") or [])


async def reload(s: aiohttp.ClientSession, base: str, headers: dict[str, str] = AUTH) -> tuple[int, Any]:
    async with s.post(base + "/loop-guard/reload", headers=headers) as r:
        return r.status, await r.json()


async def test_reload_endpoint_applies_a_valid_file_to_later_requests(
    upstream: FakeUpstream, proxy: tuple[str, Path]
) -> None:
    base, path = proxy
    upstream.handler = answer_with(three_identical())
    async with aiohttp.ClientSession() as s:
        assert await calls_in_answer(s, base) == 2
        path.write_text(PASSES)
        assert await reload(s, base) == (200, {"status": "reloaded"})
        assert await calls_in_answer(s, base) == 3


async def test_reload_endpoint_needs_the_admin_token(upstream: FakeUpstream, proxy: tuple[str, Path]) -> None:
    base, path = proxy
    upstream.handler = answer_with(three_identical())
    path.write_text(PASSES)
    async with aiohttp.ClientSession() as s:
        status, body = await reload(s, base, headers={})
        assert status == 401
        assert body["error"]["message"] == "missing or wrong admin token"
        assert await calls_in_answer(s, base) == 2  # not reloaded


REJECTED = [
    pytest.param(
        "admin_token: tok\nresponse: {max_identical_per_response: -1}\n",
        "response.max_identical_per_response: must be an integer >= 0 (0 = no limit)",
        id="invalid_value",
    ),
    pytest.param(
        "admin_token: tok\nguards: {repeat_remindr: {}}\n",
        "guards.repeat_remindr: unknown key (did you mean 'repeat_reminder'?)",
        id="unknown_key",
    ),
    pytest.param("admin_token: [tok\n", "<file>: ", id="not_yaml"),
    pytest.param(
        "admin_token: tok\nlisten: {max_connections: 7}\nresponse: {max_identical_per_response: 0}\n",
        "listen.max_connections: cannot change without a restart (changed: listen.max_connections); "
        "nothing reloaded",
        id="restart_only_key",
    ),
    pytest.param(
        "admin_token: tok\nprogress: {masks: ['\\d+ ms', '(\\w+\\s?)+$']}\n",
        f"progress.masks[1]: {NESTED_QUANTIFIERS}",
        id="nested_quantifiers",
    ),
    pytest.param(
        "admin_token: tok\nstate: {backend: 'redis://127.0.0.1:1/0'}\n",
        "state.backend: cannot change without a restart (changed: state.backend); nothing reloaded",
        id="state_backend",
    ),
]


@pytest.mark.parametrize(("text", "message"), REJECTED)
async def test_reload_endpoint_rejects_a_bad_file_naming_the_key_and_keeps_the_old_config(
    upstream: FakeUpstream, proxy: tuple[str, Path], text: str, message: str
) -> None:
    base, path = proxy
    upstream.handler = answer_with(three_identical())
    path.write_text(text)
    async with aiohttp.ClientSession() as s:
        status, body = await reload(s, base)
        assert status == 400
        assert body["error"]["type"] == "invalid_config"
        assert body["error"]["message"].startswith("loopguard: config not reloaded: " + message)
        assert await calls_in_answer(s, base) == 2  # the old config: still cut
        # the old admin token too: a rejected file changed nothing
        async with s.get(base + "/loop-guard", headers=AUTH) as r:
            assert r.status == 200


async def test_reload_refuses_an_alias_bomb_unexpanded_and_keeps_the_old_config(
    upstream: FakeUpstream, proxy: tuple[str, Path]
) -> None:
    base, path = proxy
    upstream.handler = answer_with(three_identical())
    path.write_text(bomb())  # 10^8 strings in about 300 bytes
    async with aiohttp.ClientSession() as s:
        started = time.perf_counter()
        status, body = await reload(s, base)
        assert time.perf_counter() - started < 2.0  # expanding it took 70 s and 1.2 GB
        assert status == 400
        assert body["error"]["message"] == (
            f"loopguard: config not reloaded: <file>: {path} expands to more than {MAX_NODES} YAML "
            "nodes through its aliases (an alias bomb?); refused unread"
        )
        assert await calls_in_answer(s, base) == 2  # the old config: still cut


def test_serve_refuses_an_alias_bomb_at_start(tmp_path: Path) -> None:
    path = tmp_path / "lg.yaml"
    path.write_text(bomb())
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPGUARD_")}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--config", str(path), "--port", str(free_port())],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        timeout=60,
    )
    assert time.perf_counter() - started < 30  # the interpreter's start; the refusal is instant
    assert done.returncode == 2
    assert done.stderr == (
        f"loopguard: invalid configuration: <file>: {path} expands to more than {MAX_NODES} YAML "
        "nodes through its aliases (an alias bomb?); refused unread\n"
    )


async def test_request_in_flight_finishes_under_the_config_it_started_with(
    upstream: FakeUpstream, proxy: tuple[str, Path]
) -> None:
    base, path = proxy
    gate, arrived = asyncio.Event(), asyncio.Event()
    upstream.handler = answer_with(three_identical(), gate, arrived)
    async with aiohttp.ClientSession() as s:
        held = asyncio.create_task(calls_in_answer(s, base))
        await asyncio.wait_for(arrived.wait(), 10)  # the request is at the upstream, unanswered
        path.write_text(PASSES)
        assert await reload(s, base) == (200, {"status": "reloaded"})
        upstream.handler = answer_with(three_identical())
        assert await calls_in_answer(s, base) == 3  # a new request: the new config
        gate.set()
        assert await held == 2  # the one in flight: cut under the old config


def test_restart_keys_name_every_changed_key_a_reload_cannot_apply() -> None:
    old = Config()
    new = dataclasses.replace(
        old,
        listen=dataclasses.replace(old.listen, port=5000),
        upstream=dataclasses.replace(old.upstream, url="http://other:1/v1"),
        response=dataclasses.replace(old.response, max_calls_per_response=3),
        admin_token="x",
    )
    assert restart_keys(old, new) == ["admin_token", "listen.port", "upstream.url"]
    assert restart_keys(old, dataclasses.replace(old, response=new.response)) == []


async def wait_for_event(stream: asyncio.StreamReader, event: str) -> dict[str, Any]:
    """The next JSON log line of ``event`` on ``stream`` (the proxy's stderr)."""
    while True:
        line = await asyncio.wait_for(stream.readline(), 20)
        assert line, f"the proxy exited before logging {event}"
        if line.startswith(b"{"):
            obj = orjson.loads(line)
            if obj.get("event") == event:
                return obj


async def test_sighup_reloads_the_real_server_and_logs_a_rejected_file(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    upstream.handler = answer_with(three_identical())
    path = tmp_path / "lg.yaml"
    path.write_text(CUTS)
    port = free_port()
    proc = await serve_process(upstream.url, port, path, stderr=asyncio.subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    assert proc.stderr is not None
    try:
        await wait_for_event(proc.stderr, "listening")
        async with aiohttp.ClientSession() as s:
            assert await calls_in_answer(s, base) == 2
            path.write_text("admin_token: tok\nresponse: {max_identical_per_response: -1}\n")
            os.kill(proc.pid, signal.SIGHUP)
            rejected = await wait_for_event(proc.stderr, "config_reload_rejected")
            assert rejected["via"] == "SIGHUP"
            assert rejected["key"] == "response.max_identical_per_response"
            assert rejected["error"] == (
                "response.max_identical_per_response: must be an integer >= 0 (0 = no limit)"
            )
            assert rejected["level"] == "warning"
            assert await calls_in_answer(s, base) == 2  # still the old config, still serving
            path.write_text(PASSES)
            os.kill(proc.pid, signal.SIGHUP)
            reloaded = await wait_for_event(proc.stderr, "config_reloaded")
            assert reloaded["via"] == "SIGHUP"
            assert await calls_in_answer(s, base) == 3
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
