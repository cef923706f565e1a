"""The official openai SDK as an unmodified agent loop, shared by the end-to-end tests."""

from __future__ import annotations

from typing import Any

import aiohttp
from openai import AsyncOpenAI, LengthFinishReasonError


async def turn(
    client: AsyncOpenAI, messages: list[dict[str, Any]], stream: bool
) -> tuple[dict[str, Any], str]:
    """One model turn through the SDK, as an agent records it: (message, finish_reason)."""
    if not stream:
        resp = await client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
        choice = resp.choices[0]
        return choice.message.model_dump(exclude_none=True), str(choice.finish_reason)
    async with client.chat.completions.stream(model="m", messages=messages) as s:  # type: ignore[arg-type]
        try:
            final = await s.get_final_completion()
        except LengthFinishReasonError as exc:  # the SDK's helper refuses to "parse" a cut answer
            final = exc.completion
    choice = final.choices[0]
    msg = choice.message.model_dump(exclude_none=True, exclude={"parsed"})
    for tc_ in msg.get("tool_calls") or []:
        tc_["function"].pop("parsed_arguments", None)
    return msg, str(choice.finish_reason)


async def agent_loop(
    client: AsyncOpenAI,
    stream: bool,
    max_steps: int = 30,
    messages: list[dict[str, Any]] | None = None,
    *,
    result: str = "print('hi')",
    prompt: str = "Read app.py",
) -> tuple[list[dict[str, Any]], int, str]:
    """Run the tool loop until the model answers without a call or ``max_steps`` model turns;
    returns the history, the number of model turns and the last finish_reason."""
    messages = messages if messages is not None else [{"role": "user", "content": prompt}]
    finish = ""
    for step in range(1, max_steps + 1):
        msg, finish = await turn(client, messages, stream)
        messages.append(msg)
        if not msg.get("tool_calls"):
            return messages, step, finish
        for call in msg["tool_calls"]:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return messages, max_steps, finish


async def snapshot(base: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(base + "/loop-guard") as r:
        return await r.json()
