"""The agent: an ``openai``-SDK tool loop, as small as an unmodified agent is.

Each step sends the whole history with :data:`bench.recovery.tools.TOOLS`, runs the calls of the
answer in the task's repository and appends their results; the episode ends when an answer has no
call (a text answer, or a turn loopguard stopped), after ``max_steps`` steps, or on an HTTP error.
Step ``k`` (from 0) of an episode with seed ``s`` sends ``seed = step_seed(s, k)``, so two arms
that send the same history at step ``k`` sample the same answer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import openai
from openai import AsyncOpenAI

from bench.recovery.tools import TOOLS, execute

SYSTEM_PROMPT = (
    "You are a coding agent working in a small Python repository. Read the code, fix the bug "
    "with write_file, and run test.py to check your fix. When test.py passes, answer with a "
    "short summary."
)
#: Sampling temperature of every request (> 0, so the seed decides the sample).
TEMPERATURE = 1.0
#: Cap on generated tokens per step.
MAX_TOKENS = 256
#: ``tool_choice`` of every request.
TOOL_CHOICE = "auto"


def step_seed(episode_seed: int, step: int) -> int:
    """The ``seed`` sent at ``step`` (from 0) of the episode seeded ``episode_seed``."""
    return (episode_seed * 1000 + step) % 2**31


@dataclass
class Step:
    """One request of the agent and what came of it.

    ``calls``: the answer's calls as ``[name, arguments JSON]``; ``results``: their results, in
    order; ``text``: the answer's text; ``prompt_tokens``/``completion_tokens``: the answer's
    ``usage`` (0 when absent); ``finish``: its finish reason; ``error``: an HTTP error's text."""

    seed: int
    calls: list[list[str]] = field(default_factory=list)
    results: list[str] = field(default_factory=list)
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish: str = ""
    error: str = ""


async def _ask(client: AsyncOpenAI, kwargs: dict[str, Any], stream: bool, step: Step) -> None:
    """One request, JSON or streamed, read into ``step`` (calls, text, usage, finish)."""
    if not stream:
        resp = await client.chat.completions.create(**kwargs)
        choice = resp.choices[0]
        step.text = choice.message.content or ""
        step.calls = [[c.function.name, c.function.arguments] for c in choice.message.tool_calls or []]
        step.finish = choice.finish_reason or ""
        if resp.usage:
            step.prompt_tokens, step.completion_tokens = (
                resp.usage.prompt_tokens,
                resp.usage.completion_tokens,
            )
        return
    calls: dict[int, list[str]] = {}
    async for chunk in await client.chat.completions.create(stream=True, **kwargs):
        if chunk.usage:
            step.prompt_tokens, step.completion_tokens = (
                chunk.usage.prompt_tokens,
                chunk.usage.completion_tokens,
            )
        for choice in chunk.choices:
            step.text += choice.delta.content or ""
            for d in choice.delta.tool_calls or []:
                c = calls.setdefault(d.index, ["", ""])
                if d.function and d.function.name and not c[0]:
                    c[0] = d.function.name
                c[1] += (d.function.arguments or "") if d.function else ""
            step.finish = choice.finish_reason or step.finish
    step.calls = [calls[i] for i in sorted(calls)]


async def run_episode(
    client: AsyncOpenAI,
    model: str,
    repo: Path,
    prompt: str,
    episode_seed: int,
    *,
    stream: bool,
    max_steps: int,
) -> list[dict[str, Any]]:
    """Run one episode in ``repo``; the steps as dicts (:class:`Step`'s fields)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": prompt},
    ]
    steps: list[Step] = []
    for k in range(max_steps):
        step = Step(seed=step_seed(episode_seed, k))
        steps.append(step)
        kwargs = {
            "model": model,
            "messages": messages,
            "tools": TOOLS,
            "tool_choice": TOOL_CHOICE,
            "temperature": TEMPERATURE,
            "max_tokens": MAX_TOKENS,
            "seed": step.seed,
        }
        try:
            await _ask(client, kwargs, stream, step)
        except openai.APIError as exc:
            step.error = f"{type(exc).__name__}: {exc}"[:300]
            break
        if not step.calls:
            break
        ids = [f"call_{k}_{i}" for i in range(len(step.calls))]
        messages.append(
            {
                "role": "assistant",
                "content": step.text,  # llama-cpp-python's server rejects null content
                "tool_calls": [
                    {"id": cid, "type": "function", "function": {"name": n, "arguments": a}}
                    for cid, (n, a) in zip(ids, step.calls, strict=True)
                ],
            }
        )
        for cid, (name, arguments) in zip(ids, step.calls, strict=True):
            result = execute(repo, name, arguments)
            step.results.append(result)
            messages.append({"role": "tool", "tool_call_id": cid, "content": result})
    return [asdict(s) for s in steps]
