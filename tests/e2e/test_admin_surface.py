"""The proxy's own routes under ``/loop-guard``, through the real server: a reload can never drop
or change ``admin_token`` (an emptied file, a duplicate key), nothing under ``/loop-guard`` is
forwarded upstream (a near-miss path would carry the admin token there), and without a token the
routes that show conversations answer loopback peers only (a proxy bound to 0.0.0.0 in a
container must not show its incidents to the network), said once at start."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.config import load_config
from proxy.edge.serve import start
from proxy.request.conversation import key_digest
from tests.e2e.test_hot_reload import AUTH, reload, with_overrides
from tests.e2e.test_shutdown import free_port
from tests.helpers.fakes import FakeUpstream, repeated_call_messages
from tests.helpers.proxy_server import proxy_config, serve_process

CHAT = "/v1/chat/completions"
TOKEN_FILE = "admin_token: tok\n"


@pytest.fixture
async def from_file(upstream: FakeUpstream, tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    """The real server started from a file holding ``admin_token: tok``; its URL and the file."""
    path = tmp_path / "lg.yaml"
    path.write_text(TOKEN_FILE)
    runner, port = await start(with_overrides(path, upstream.url), lambda: with_overrides(path, upstream.url))
    try:
        yield f"http://127.0.0.1:{port}", path
    finally:
        await runner.cleanup()


async def status_of(s: aiohttp.ClientSession, method: str, url: str, headers: dict[str, str]) -> int:
    async with s.request(method, url, headers=headers) as r:
        await r.read()
        return r.status


# --- a reload never drops or changes admin_token ------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            "", "<file>: {path} holds no settings (empty); write {{}} for all defaults", id="emptied"
        ),
        pytest.param(
            "# nothing\n",
            "<file>: {path} holds no settings (empty); write {{}} for all defaults",
            id="comments",
        ),
        pytest.param(
            "admin_token: tok\nadmin_token: other\n",
            "admin_token: appears twice (lines 1 and 2); keep one",
            id="duplicate_key",
        ),
        pytest.param(
            "admin_token: other\n",
            "admin_token: cannot change without a restart (changed: admin_token); nothing reloaded",
            id="changed_token",
        ),
        pytest.param(
            "{}\n",
            "admin_token: cannot change without a restart (changed: admin_token); nothing reloaded",
            id="token_removed",
        ),
    ],
)
async def test_a_reload_that_would_drop_or_change_the_admin_token_is_rejected_and_the_token_stays(
    from_file: tuple[str, Path], text: str, message: str
) -> None:
    base, path = from_file
    path.write_text(text)
    async with aiohttp.ClientSession() as s:
        status, body = await reload(s, base)
        assert (status, body["error"]["message"]) == (
            400,
            "loopguard: config not reloaded: " + message.format(path=path),
        )
        for route in ("/loop-guard", "/loop-guard/healthz", "/loop-guard/metrics"):
            assert await status_of(s, "GET", base + route, {}) == 401, route
            assert await status_of(s, "GET", base + route, AUTH) == 200, route
        assert await status_of(s, "POST", base + "/loop-guard/reload", {}) == 401


# --- nothing under /loop-guard goes upstream -----------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "status", "allow"),
    [
        pytest.param("GET", "/loop-guard/metrics/", 404, None, id="metrics_trailing_slash"),
        pytest.param("GET", "/loop-guard/", 404, None, id="stats_trailing_slash"),
        pytest.param("GET", "/loop-guard/metric", 404, None, id="typo"),
        pytest.param("GET", "/loop-guard/reload", 405, "POST", id="reload_by_get"),
        pytest.param("POST", "/loop-guard", 405, "GET, HEAD", id="stats_by_post"),
        pytest.param("DELETE", "/loop-guard/healthz", 405, "GET, HEAD", id="healthz_by_delete"),
        pytest.param("GET", "//loop-guard/metrics", 404, None, id="doubled_slash"),
        pytest.param("GET", "/loop-guard/x/y?q=1", 404, None, id="deeper"),
    ],
)
@pytest.mark.parametrize("token", [None, "tok"], ids=["no_token", "token"])
async def test_a_near_miss_admin_path_is_answered_by_the_proxy_and_never_forwarded(
    upstream: FakeUpstream,
    make_proxy: Any,
    method: str,
    path: str,
    status: int,
    allow: str | None,
    token: str | None,
) -> None:
    base = await make_proxy({"admin_token": token})
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, base + path, headers={"Authorization": "Bearer tok"}) as r,
    ):
        got = (r.status, r.headers.get("Allow"), (await r.json())["error"]["type"])
    assert got == (status, allow, "not_found" if status == 404 else "method_not_allowed")
    assert upstream.requests == []


@pytest.mark.parametrize(
    "target",
    [
        pytest.param("/./loop-guard/metrics", id="dot_segment"),
        pytest.param("/v1/../loop-guard/metrics", id="dot_dot_segment"),
        pytest.param("/v1/%2e%2e/loop-guard/metrics", id="escaped_dot_dot"),
        pytest.param("/%2E/loop-guard/metrics", id="escaped_dot"),
        pytest.param("/Loop-Guard/metrics", id="mixed_case"),
        pytest.param("/LOOP-GUARD", id="upper_case"),
        pytest.param("/loop-guard\\metrics", id="backslash"),
        pytest.param("/loop-guard%5Cmetrics", id="escaped_backslash"),
        pytest.param("/loop-guard%20/metrics", id="escaped_space"),
        pytest.param("/loop-guard%09", id="escaped_tab"),
        pytest.param("/loop-guard%252fmetrics", id="double_escaped_slash"),
        pytest.param("/loop-guard;x/metrics", id="path_parameter"),
        pytest.param("http://agent.example/./loop-guard/metrics", id="absolute_form"),
    ],
)
@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_any_spelling_of_the_admin_path_is_the_proxys_and_never_carries_the_token_upstream(
    upstream: FakeUpstream, make_proxy: Any, target: str, method: str
) -> None:
    """What is the proxy's is decided on the normalised target (dot segments resolved, case
    folded, backslashes as slashes, escapes decoded): an upstream that reads the target that way
    would otherwise answer ``/loop-guard`` with the admin token in hand. Sent on a raw socket:
    an HTTP client would resolve the dots itself."""
    base = await make_proxy({"admin_token": "tok"})
    reader, writer = await asyncio.open_connection("127.0.0.1", int(base.rsplit(":", 1)[1]))
    writer.write(
        f"{method} {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok\r\n"
        "Content-Length: 2\r\nConnection: close\r\n\r\n{}".encode()
    )
    got = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 404 "), got
    assert orjson.loads(body)["error"]["type"] == "not_found"
    assert upstream.requests == []


async def test_paths_beside_the_admin_prefix_are_still_forwarded(
    upstream: FakeUpstream, make_proxy: Any
) -> None:
    base = await make_proxy()
    async with aiohttp.ClientSession() as s:
        for path in (
            "/loop-guardx",
            "/v1/loop-guard/metrics",
            "/loop-guard-x/metrics",
            "/v1/x/../loop-guard",
        ):
            async with s.get(base + path) as r:
                assert r.status == 200, path
    assert [r.path_qs for r in upstream.requests] == [
        "/loop-guardx",
        "/v1/loop-guard/metrics",
        "/loop-guard-x/metrics",
        "/v1/loop-guard",  # the client resolved the dots: /v1/loop-guard is the upstream's
    ]


# --- without a token: loopback peers only -----------------------------------------------------------


def outside_address() -> str | None:
    """An address of this host that is not loopback (a peer connecting to it is not loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the route's address
        except OSError:
            return None
        address = str(s.getsockname()[0])
    return None if address.startswith("127.") else address


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        pytest.param(
            None,
            {
                "/loop-guard": 403,
                "/loop-guard?conversation=c": 403,
                "/loop-guard/reload": 403,
                "/loop-guard/healthz": 200,
                "/loop-guard/metrics": 200,
            },
            id="no_token_refuses_the_conversation_routes",
        ),
        pytest.param(
            "tok",
            {
                "/loop-guard": 200,
                "/loop-guard?conversation=c": 404,
                "/loop-guard/reload": 400,
                "/loop-guard/healthz": 200,
                "/loop-guard/metrics": 200,
            },
            id="the_token_opens_them_anywhere",
        ),
    ],
)
async def test_without_a_token_the_conversation_routes_answer_loopback_peers_only(
    upstream: FakeUpstream, token: str | None, expected: dict[str, int]
) -> None:
    outside = outside_address()
    if outside is None:
        pytest.skip("this host has no address besides loopback")
    cfg = proxy_config({"admin_token": token, "guards": {"turn_guard": {"enabled": True}}}, upstream.url)
    cfg = dataclasses.replace(cfg, listen=dataclasses.replace(cfg.listen, host="0.0.0.0"))
    runner, port = await start(cfg)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with aiohttp.ClientSession() as s:
            # the same proxy from loopback: everything answers
            async with s.get(f"http://127.0.0.1:{port}/loop-guard", headers=headers) as r:
                assert r.status == 200
            got = {}
            for route in expected:
                method = "POST" if route.endswith("reload") else "GET"
                async with s.request(method, f"http://{outside}:{port}{route}", headers=headers) as r:
                    got[route] = r.status
                    if r.status == 403:
                        body = await r.json()
                        assert body["error"] == {
                            "message": "loopguard: without admin_token this route answers loopback "
                            "clients only; set admin_token",
                            "type": "forbidden",
                            "code": 403,
                        }
                        assert b"incidents" not in orjson.dumps(body)
    finally:
        await runner.cleanup()
    assert got == expected


@pytest.mark.parametrize(("text", "warned"), [("{}\n", True), (TOKEN_FILE, False)], ids=["no_token", "token"])
async def test_the_start_says_once_when_the_admin_routes_are_loopback_only(
    upstream: FakeUpstream, tmp_path: Path, text: str, warned: bool
) -> None:
    path = tmp_path / "lg.yaml"
    path.write_text(text)
    proc = await serve_process(upstream.url, free_port(), path, stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stderr is not None
        lines: list[dict[str, Any]] = []
        while not any(x.get("event") == "listening" for x in lines):
            lines.append(orjson.loads(await asyncio.wait_for(proc.stderr.readline(), 20)))
        proc.terminate()
        rest = (await asyncio.wait_for(proc.stderr.read(), 20)).decode()
        lines += [orjson.loads(x) for x in rest.splitlines() if x.startswith("{")]
        await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
    warnings = [x for x in lines if x.get("event") == "admin_loopback_only"]
    expected = [
        {
            "routes": ["/loop-guard", "/loop-guard/reload"],
            "note": "admin_token is not set: these routes answer loopback clients only (403 to others); "
            "set admin_token to reach them from elsewhere (a container's published port included)",
            "event": "admin_loopback_only",
            "level": "warning",
        }
    ]
    assert [{k: v for k, v in w.items() if k != "timestamp"} for w in warnings] == (
        expected if warned else []
    )
    assert load_config(path).admin_token == (None if warned else "tok")


async def test_from_loopback_the_ledger_answers_by_the_key_or_its_logged_digest(
    upstream: FakeUpstream, make_proxy: Any
) -> None:
    base = await make_proxy({"guards": {"turn_guard": {"enabled": True}}})
    digest = key_digest("sess-9")
    async with aiohttp.ClientSession() as s:
        body = {"model": "m", "messages": repeated_call_messages(1)}
        async with s.post(base + CHAT, json=body, headers={"x-session-id": "sess-9"}) as r:
            assert r.status == 200
        for query in ("sess-9", digest):
            async with s.get(base + f"/loop-guard?conversation={query}") as r:
                assert (r.status, (await r.json())["conversation"]) == (200, digest)
