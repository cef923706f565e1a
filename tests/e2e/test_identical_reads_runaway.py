"""Identical read-only calls in one answer, through the real server in every dialect, JSON and SSE.

A model stuck emitting the same read (``get_weather {"city": "Shanghai"}`` 21 times in one answer,
until ``finish_reason: length``, as reported against vLLM) is a runaway: the answer is cut right
before the 5th identical read (``response.max_identical_reads_per_response``: 4), the agent gets
the first four calls and the answer's own finish, and the upstream is closed. A few parallel
copies of one read are harmless (redacted Claude Code transcripts hold four identical parallel
``Read``s): four pass byte for byte. Each answer is built by the corpus wires
(:data:`tests.helpers.corpus.WIRES`: Chat Completions, Responses, Messages, the Gemini API), so it is
the shape each API sends.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.config import Config, ListenConfig, build
from proxy.edge.serve import start
from tests.helpers.corpus import WIRES, FakeModel, default_config
from tests.helpers.sdk_agent import snapshot

DIALECTS = ["chat", "responses", "messages", "gemini"]
WEATHER = '{"city": "Shanghai"}'
READ = '{"file_path": "REDACTED.ts"}'


def answer_of(name: str, arguments: str, n: int) -> dict[str, Any]:
    """One assistant message with ``n`` identical calls ``call_0`` … ``call_{n-1}``."""
    calls = [
        {"id": f"call_{k}", "type": "function", "function": {"name": name, "arguments": arguments}}
        for k in range(n)
    ]
    return {"role": "assistant", "content": None, "tool_calls": calls}


def fixture_of(name: str, arguments: str, n: int) -> dict[str, Any]:
    tools = [{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "What's the weather like?"}, answer_of(name, arguments, n)]
    return {"id": "one-answer", "messages": messages, "tools": tools}


def _events(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for frame in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        data = b"\n".join(line[5:].strip() for line in frame.split(b"\n") if line.startswith(b"data:"))
        if data and data != b"[DONE]":
            out.append(orjson.loads(data))
    return out


def received(dialect: str, raw: bytes, stream: bool) -> tuple[list[tuple[Any, str, Any]], Any]:
    """(id, name, arguments) of every call the agent received, and the answer's finish: the chat
    ``finish_reason``, the Responses ``status``, the Messages ``stop_reason``, the Gemini
    ``finishReason``."""
    objs = _events(raw) if stream else [orjson.loads(raw)]
    calls: list[tuple[Any, str, Any]] = []
    finish: Any = None
    if dialect == "chat":
        if not stream:
            choice = objs[0]["choices"][0]
            calls = [
                (c["id"], c["function"]["name"], c["function"]["arguments"])
                for c in choice["message"]["tool_calls"]
            ]
            return calls, choice["finish_reason"]
        by_index: dict[int, list[Any]] = {}
        for obj in objs:
            for choice in obj.get("choices") or []:
                for tc in choice["delta"].get("tool_calls") or []:
                    entry = by_index.setdefault(tc["index"], [None, "", ""])
                    entry[0] = tc.get("id") or entry[0]
                    entry[1] += (tc.get("function") or {}).get("name") or ""
                    entry[2] += (tc.get("function") or {}).get("arguments") or ""
                finish = choice.get("finish_reason") or finish
        return [tuple(by_index[k]) for k in sorted(by_index)], finish
    if dialect == "responses":
        if stream:
            items = [o["item"] for o in objs if o.get("type") == "response.output_item.done"]
            finish = next(o["response"]["status"] for o in objs if o.get("type") == "response.completed")
        else:
            items, finish = objs[0]["output"], objs[0]["status"]
        return [
            (i["call_id"], i["name"], i["arguments"]) for i in items if i["type"] == "function_call"
        ], finish
    if dialect == "messages":
        if not stream:
            blocks = objs[0]["content"]
            return [(b["id"], b["name"], json.dumps(b["input"])) for b in blocks], objs[0]["stop_reason"]
        open_blocks: dict[int, list[Any]] = {}
        for obj in objs:
            if obj["type"] == "content_block_start" and obj["content_block"]["type"] == "tool_use":
                block = obj["content_block"]
                open_blocks[obj["index"]] = [block["id"], block["name"], ""]
            elif obj["type"] == "content_block_delta" and obj["delta"]["type"] == "input_json_delta":
                open_blocks[obj["index"]][2] += obj["delta"]["partial_json"]
            elif obj["type"] == "message_delta":
                finish = obj["delta"]["stop_reason"]
        return [
            (i, n, json.dumps(json.loads(a))) for i, n, a in (open_blocks[k] for k in sorted(open_blocks))
        ], finish
    for obj in objs:
        cand = obj["candidates"][0]
        for part in (cand.get("content") or {}).get("parts") or []:
            if "functionCall" in part:
                fc = part["functionCall"]
                calls.append((fc.get("id"), fc["name"], json.dumps(fc["args"])))
        finish = cand.get("finishReason") or finish
    return calls, finish


async def through_the_server(
    dialect: str, fixture: dict[str, Any], stream: bool
) -> tuple[bytes, bytes, dict[str, Any]]:
    """(what the upstream sent, what the agent received, ``GET /loop-guard``) for the fixture's
    answer, through a fresh proxy with the shipped default config."""
    wire = WIRES[dialect](fixture)
    cfg = build(Config, default_config())
    async with FakeModel() as model:
        cfg = dataclasses.replace(
            cfg,
            listen=ListenConfig(host="127.0.0.1", port=0),
            upstream=dataclasses.replace(cfg.upstream, url=model.url),
            admin_token=None,
        )
        runner, port = await start(cfg)
        try:
            base = f"http://127.0.0.1:{port}"
            model.reply = wire.answer(1, fixture["messages"][1], stream)
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    f"{base}{wire.url_path(stream)}",
                    data=orjson.dumps(wire.request(1, stream)),
                    headers={"Content-Type": "application/json"},
                ) as resp,
            ):
                assert resp.status == 200
                raw = await resp.read()
            snap = await snapshot(base)
        finally:
            await runner.cleanup()
    sent = model.reply if isinstance(model.reply, bytes) else b"".join(model.reply or [])
    return sent, raw, snap


#: What each API says an answer with calls finished with (kept by the cut).
FINISH = {"chat": "tool_calls", "responses": "completed", "messages": "tool_use", "gemini": "STOP"}


def expected_calls(dialect: str, name: str, arguments: str, n: int) -> list[tuple[Any, str, Any]]:
    """The first ``n`` calls as the agent reads them (the Gemini API sends no call ids)."""
    return [(None if dialect == "gemini" else f"call_{k}", name, arguments) for k in range(n)]


#: The last event of a cut stream, as the proxy writes it (the finish the answer would have had).
CUT_STREAM_END: dict[str, Any] = {
    "chat": {
        "id": "chatcmpl-corpus",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "m",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
    },
    "messages": {"type": "message_stop"},
    "gemini": {
        "candidates": [{"finishReason": "STOP", "index": 0}],
        "modelVersion": "corpus-model",
        "responseId": "corpus-response",
    },
}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_21_identical_weather_reads_in_one_answer_are_cut_to_4(dialect: str, stream: bool) -> None:
    fixture = fixture_of("get_weather", WEATHER, 21)
    _, raw, snap = await through_the_server(dialect, fixture, stream)
    assert received(dialect, raw, stream) == (
        expected_calls(dialect, "get_weather", WEATHER, 4),
        FINISH[dialect],
    )
    assert (snap["responses_cut"], snap["per_rule"], snap["internal_errors"]) == (1, {"runaway": 1}, 0)
    if stream and dialect == "responses":
        last = _events(raw)[-1]
        assert (last["type"], last["sequence_number"], len(last["response"]["output"])) == (
            "response.completed",
            22,
            4,
        )
    elif stream:
        assert _events(raw)[-1] == CUT_STREAM_END[dialect]


@pytest.mark.parametrize(("n", "kept"), [(5, 4), (20, 4)], ids=["5_cut_to_4", "20_cut_to_4"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_the_5th_identical_read_is_the_first_cut(dialect: str, stream: bool, n: int, kept: int) -> None:
    fixture = fixture_of("Read", READ, n)
    _, raw, snap = await through_the_server(dialect, fixture, stream)
    assert received(dialect, raw, stream) == (expected_calls(dialect, "Read", READ, kept), FINISH[dialect])
    assert (snap["responses_cut"], snap["per_rule"]) == (1, {"runaway": 1})


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_4_identical_parallel_reads_pass_byte_for_byte(dialect: str, stream: bool) -> None:
    fixture = fixture_of("Read", READ, 4)
    sent, raw, snap = await through_the_server(dialect, fixture, stream)
    assert raw == sent
    assert received(dialect, raw, stream) == (expected_calls(dialect, "Read", READ, 4), FINISH[dialect])
    assert (snap["responses_cut"], snap["per_rule"]) == (0, {})
