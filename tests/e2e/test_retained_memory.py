"""A guarded request leaves nothing for the cycle collector (memory bounded by what is live).

The server raises the collector's thresholds (:data:`proxy.edge.serve.GC_THRESHOLDS`), so a full
collection is rare: anything a request leaves in a reference cycle stays until then. A cycle
holding a request's state (a local function of the cycles guard that called itself, an upstream
read error whose traceback held the frames of the relay, with the body among their locals)
kept about three times each body alive: 60 guarded requests of 4 MiB grew the proxy to
780-850 MiB where plain chat of the same bytes stayed at 69 MiB.

Each test runs the real server in this process, sends a guarded request (a loop the repeat
reminder answers; a longer one that is withheld and stopped; then the same conversation grown by
a step, resumed from the prefix cache) with the automatic collector off, and counts what a
collection then finds unreachable: nothing, in every dialect, JSON and SSE. The only objects
excepted are the classes the standard library's ``email`` header registry makes for each
``Content-Type`` aiohttp parses (a class per call, a cycle of a class and its ``__mro__``; they
hold no request data).
"""

from __future__ import annotations

import gc
import types
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from bench.retained import answer, body, path
from tests.helpers.fakes import FakeUpstream

DIALECTS = ["chat", "responses", "messages", "gemini"]
RESULT_BYTES = 96 * 1024


def _email_classes(garbage: list[Any]) -> set[int]:
    """The ids of the ``email.headerregistry`` classes in ``garbage`` and of what only they hold."""
    ids = {id(o) for o in garbage}
    out: set[int] = set()
    todo = [o for o in garbage if isinstance(o, type) and o.__module__ == "email.headerregistry"]
    while todo:
        o = todo.pop()
        if id(o) in out:
            continue
        out.add(id(o))
        todo += [r for r in gc.get_referents(o) if id(r) in ids and not isinstance(r, type)]
    return out


def _named(o: Any) -> str:
    if isinstance(o, types.FunctionType):
        return f"function {o.__module__}.{o.__qualname__}"
    if isinstance(o, types.FrameType):
        return f"frame {o.f_code.co_filename}:{o.f_code.co_name}"
    return f"{type(o).__module__}.{type(o).__qualname__}"


class Unreachable:
    """The collector off while a request runs; :meth:`count` then names what a collection finds
    unreachable (the ``email`` header classes excepted), one entry per object."""

    def __enter__(self) -> Unreachable:
        gc.collect()
        gc.disable()
        return self

    def count(self) -> list[str]:
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            garbage = list(gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        skip = _email_classes(garbage)
        names = sorted(_named(o) for o in garbage if id(o) not in skip)
        del garbage
        gc.collect()  # what was saved, freed for good
        return names

    def __exit__(self, *exc: object) -> None:
        gc.enable()


@pytest.fixture
def collector() -> Iterator[type[Unreachable]]:
    yield Unreachable
    gc.enable()


def answering(dialect: str) -> Any:
    async def handler(request: web.Request, raw: bytes) -> web.StreamResponse:
        stream = "alt=sse" in request.query_string or b'"stream":true' in raw
        content_type, data = answer(dialect, stream)
        return web.Response(body=data, content_type=content_type)

    return handler


async def _post(s: aiohttp.ClientSession, base: str, dialect: str, stream: bool, raw: bytes) -> bytes:
    headers = {"content-type": "application/json"}
    async with s.post(base + path(dialect, stream), data=raw, headers=headers) as r:
        assert r.status == 200
        return await r.read()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_a_guarded_request_leaves_no_garbage(
    upstream: FakeUpstream, make_proxy: Any, collector: type[Unreachable], dialect: str, stream: bool
) -> None:
    upstream.handler = answering(dialect)
    base = await make_proxy()
    extra = {"store": True} if dialect == "responses" else None  # the response store keeps it
    async with aiohttp.ClientSession() as s:
        await _post(s, base, dialect, stream, body(dialect, RESULT_BYTES, stream, 0))  # imports, caches
        with collector() as c:
            # three identical calls: a reminder
            await _post(s, base, dialect, stream, body(dialect, RESULT_BYTES, stream, 1, extra=extra))
            assert b"[loopguard]" in upstream.requests[-1].body
            assert c.count() == []
            # fourteen: results withheld, and the answer repeating the call stopped
            per = RESULT_BYTES // 14  # bytes of each result
            raw = body(dialect, per * 14, stream, 2, calls=14, extra=extra)
            out = await _post(s, base, dialect, stream, raw)
            assert b"[loopguard]" in out
            assert c.count() == []
            # the same conversation a step later: resumed from the prefix cache
            raw = body(dialect, per * 15, stream, 2, calls=15, extra=extra)
            await _post(s, base, dialect, stream, raw)
            assert c.count() == []
    async with aiohttp.ClientSession() as s, s.get(base + "/loop-guard") as r:
        kept = (await r.json())["prefix_cache"]
    assert kept["hits"] >= 1


def dying(dialect: str) -> Any:
    """An upstream that sends half of its streamed answer and closes the connection."""

    async def handler(request: web.Request, raw: bytes) -> web.StreamResponse:
        content_type, data = answer(dialect, True)
        response = web.StreamResponse(headers={"Content-Type": content_type})
        await response.prepare(request)
        await response.write(data[: len(data) // 2])
        assert request.transport is not None
        request.transport.close()
        return response

    return handler


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_an_upstream_dying_mid_stream_leaves_no_request_state_in_a_cycle(
    upstream: FakeUpstream, make_proxy: Any, collector: type[Unreachable], dialect: str
) -> None:
    # aiohttp's reader keeps the read error it raised, and the error's traceback the frames it
    # came through: the relay's, with the request's body and state among their locals, until
    # the proxy drops the traceback. aiohttp's own objects (the reader, the closed socket) still
    # form a cycle of their own: small, and none of the request's.
    upstream.handler = dying(dialect)
    base = await make_proxy()
    async with aiohttp.ClientSession() as s:
        with collector() as c:
            raw = body(dialect, RESULT_BYTES, True, 1)
            with pytest.raises(aiohttp.ClientPayloadError):
                await _post(s, base, dialect, True, raw)
            ours = [n for n in c.count() if n.startswith("proxy.") or "/proxy/" in n or " proxy." in n]
    assert ours == []
