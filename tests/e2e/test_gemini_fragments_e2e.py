"""Vertex AI's streamed function-call arguments through the real server: the fragments of one call
(``functionCall`` parts with ``partialArgs`` and ``willContinue``, Vertex AI's
``streamFunctionCallArguments``) are one call, in the SSE stream, the JSON-array stream and a JSON
answer. Before: 40 fragments of one ``write_file`` were taken for 40 identical calls and cut after
2 (``response.max_identical_per_response``)."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from tests.conftest import ProxyFactory
from tests.e2e.test_unguarded_responses import GEMINI_LOOPING, GEMINI_PATHS, candidate, data, gemini_answer
from tests.helpers.fake_gemini import WRITE_40, fragments
from tests.helpers.fakes import FakeUpstream
from tests.helpers.gemini_contents import gemini_body

FRESH = orjson.dumps(gemini_body([{"role": "user", "content": "Write app.py."}]))


def fixed(answer: bytes, ctype: str) -> Any:
    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.Response(body=answer, headers={"Content-Type": ctype})

    return handler


async def post(base: str, path: str, body: bytes) -> tuple[bytes, dict[str, Any]]:
    async with aiohttp.ClientSession() as s:
        async with s.post(base + path, data=body, headers={"Content-Type": "application/json"}) as r:
            assert r.status == 200
            got = await r.read()
        async with s.get(f"{base}/loop-guard") as r:
            stats = await r.json()
    return got, stats


@pytest.mark.parametrize("form", list(GEMINI_PATHS))
async def test_forty_fragments_of_one_write_pass_as_one_call(
    upstream: FakeUpstream, make_proxy: ProxyFactory, form: str
) -> None:
    events = [data(candidate(0, [{"text": "Writing app.py."}]))]
    events += [data(candidate(0, [part])) for part in WRITE_40]
    events.append(data(candidate(0, [], "STOP")))
    answer, ctype = gemini_answer(form, events)
    upstream.handler = fixed(answer, ctype)
    base = await make_proxy()
    got, stats = await post(base, GEMINI_PATHS[form], FRESH)
    assert got == answer  # every fragment through, byte for byte
    assert (stats["per_rule"], stats["unguarded_responses"]) == ({}, {})


@pytest.mark.parametrize("form", list(GEMINI_PATHS))
async def test_a_looping_call_in_fragments_is_stopped_as_the_whole_call_would_be(
    upstream: FakeUpstream, make_proxy: ProxyFactory, form: str
) -> None:
    """The history made ``read_file {"path": "app.py"}`` eight times; the answer makes it again in
    fragments (``"app"`` then ``".py"``): assembled, it is that call, and it is stopped."""
    parts = fragments("read_file", "$.path", ["app", ".py"])
    events = [data(candidate(0, [part])) for part in parts] + [data(candidate(0, [], "STOP"))]
    answer, ctype = gemini_answer(form, events)
    upstream.handler = fixed(answer, ctype)
    base = await make_proxy({"guards": {"escalation": {"enabled": False}}})
    got, stats = await post(base, GEMINI_PATHS[form], GEMINI_LOOPING)
    assert b"functionCall" not in got and b"[loopguard] Stopped" in got
    assert stats["stops"] == 1
