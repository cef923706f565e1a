"""Drive a tiny real model into a tool-call loop (probe / reusable agent loop).

Usage::

    python tests/helpers/realmodel_probe.py BASE_URL [--stream] [--steps N] [--tool-choice MODE]

``BASE_URL`` is an OpenAI base URL such as ``http://127.0.0.1:8000/v1``
(a ``llama_cpp.server`` started by ``tests/helpers/llama_server.py``, or a loopguard
proxy in front of one). Each step prints the tool call(s) the model made and
how long the request took; the exit status is 0 if the longest run of
identical consecutive tool calls reached ``--min-run`` (default 5).

The agent loop (:func:`run_agent`) is importable for tests. Everything it
sends is fixed (prompts, tools, tool results, ``temperature=0``, ``seed``),
so against SmolLM2-135M-Instruct Q4_1 under ``chatml-function-calling`` it
is deterministic.

Server quirks the loop works around (llama-cpp-python 0.3.x,
``chatml-function-calling``):

* ``tool_choice="auto"`` with ``stream=True``: as soon as the model picks a
  tool the server raises "Automatic streaming tool choice is not supported"
  *after* sending ``200 text/event-stream`` headers, so the client gets an
  empty stream (no events, no ``[DONE]``). The default here is therefore a
  *named* tool choice, which streams fine and is deterministic;
* ``tool_choice="required"`` answers HTTP 500;
* an assistant message with ``content: null`` is rejected with HTTP 422 and
  one without a ``content`` key with HTTP 500, so the loop sends
  ``content: ""`` alongside ``tool_calls``;
* ``role: "tool"`` messages are accepted but not rendered into the prompt:
  the model never sees tool results, only its own previous calls;
* in ``auto`` mode ``max_tokens`` is not applied to tool arguments (only the
  grammar and ``n_ctx`` bound them); in named mode it is.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

#: Model name to send; llama_cpp.server serves its single model under any name,
#: ``tests/helpers/llama_server.py`` registers this alias.
MODEL = "smollm2-135m-instruct"

SYSTEM_PROMPT = (
    "You are a coding agent working in a git repository. "
    "Always use the read_file tool to look at files before answering."
)
USER_PROMPT = "What does the file config.yaml contain?"

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file from the repository and return its content.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {
                        "type": "string",
                        "description": "Relative file path.",
                        # An enum keeps the arguments clean: llama_cpp.server
                        # HTML-escapes earlier arguments when it renders the
                        # history ('"' -> '&#34;'), and with a free string the
                        # model copies and compounds the escapes. The order
                        # matters: this one gives 10/10 identical calls.
                        "enum": ["README.md", "config.yaml", "main.py"],
                    },
                },
                "required": ["path"],
            },
        },
    },
]

#: Fixed result returned for every tool call, whatever the arguments.
TOOL_RESULT = "error: file not found"

#: Sampling parameters sent with every request.
REQUEST_PARAMS: dict[str, Any] = {
    "temperature": 0.0,
    "seed": 42,
    "max_tokens": 48,
}

#: ``tool_choice`` values by mode. ``named`` works streaming and not.
TOOL_CHOICES: dict[str, Any] = {
    "named": {"type": "function", "function": {"name": "read_file"}},
    "auto": "auto",
}


@dataclass
class ToolCall:
    """One tool call as assembled from a response or a stream."""

    id: str
    name: str
    arguments: str

    @property
    def key(self) -> tuple[str, str]:
        """(name, arguments) — what makes two calls 'identical'."""
        return (self.name, self.arguments)


@dataclass
class Step:
    """Outcome of one agent step (one chat-completions request)."""

    index: int
    tool_calls: list[ToolCall]
    content: str | None
    finish_reason: str | None
    latency_s: float
    """Wall time of the request, in seconds (until the stream ended)."""
    first_chunk_s: float | None = None
    """Streaming only: seconds until the first chunk arrived."""
    chunks: int = 0
    """Streaming only: number of chunks received."""
    raw_deltas: list[dict[str, Any]] = field(default_factory=list)


def _accumulate_stream(stream: Any, step: Step, t0: float) -> None:
    """Fold a chat-completions stream into ``step``.

    llama-cpp-python repeats ``id``, ``type`` and the full ``function.name``
    in *every* tool-call delta, so names are taken, not concatenated; only
    ``arguments`` fragments are appended.
    """
    calls: dict[int, ToolCall] = {}
    content: list[str] = []
    for chunk in stream:
        step.chunks += 1
        if step.first_chunk_s is None:
            step.first_chunk_s = time.perf_counter() - t0
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        if delta.content:
            content.append(delta.content)
        for tc in delta.tool_calls or []:
            step.raw_deltas.append(tc.model_dump(exclude_none=True))
            call = calls.setdefault(tc.index, ToolCall(id="", name="", arguments=""))
            if tc.id:
                call.id = tc.id
            if tc.function is not None:
                if tc.function.name:
                    call.name = tc.function.name
                if tc.function.arguments:
                    call.arguments += tc.function.arguments
        if choice.finish_reason is not None:
            step.finish_reason = choice.finish_reason
    step.tool_calls = [calls[i] for i in sorted(calls)]
    step.content = "".join(content) if content else None


def run_agent(
    client: Any,
    *,
    stream: bool = False,
    steps: int = 10,
    tool_choice: str = "named",
    model: str = MODEL,
    on_step: Any = None,
) -> list[Step]:
    """Run the fixed agent loop for up to ``steps`` requests.

    Every tool call gets :data:`TOOL_RESULT` as its result. The loop stops
    early if the model answers without a tool call.

    Args:
        client: an ``openai.OpenAI`` client pointed at the server or proxy.
        stream: use streaming chat completions.
        steps: maximum number of requests.
        tool_choice: key into :data:`TOOL_CHOICES` (``named`` or ``auto``).
        model: model name to send.
        on_step: optional callback ``f(step)`` after each step.

    Returns:
        One :class:`Step` per request made.
    """
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": USER_PROMPT},
    ]
    results: list[Step] = []
    for i in range(1, steps + 1):
        t0 = time.perf_counter()
        kwargs: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "tools": TOOLS,
            "tool_choice": TOOL_CHOICES[tool_choice],
            **REQUEST_PARAMS,
        }
        step = Step(index=i, tool_calls=[], content=None, finish_reason=None, latency_s=0.0)
        if stream:
            _accumulate_stream(client.chat.completions.create(stream=True, **kwargs), step, t0)
        else:
            resp = client.chat.completions.create(**kwargs)
            choice = resp.choices[0]
            step.finish_reason = choice.finish_reason
            step.content = choice.message.content
            step.tool_calls = [
                ToolCall(id=tc.id, name=tc.function.name, arguments=tc.function.arguments)
                for tc in choice.message.tool_calls or []
            ]
        step.latency_s = time.perf_counter() - t0
        results.append(step)
        if on_step is not None:
            on_step(step)
        if not step.tool_calls:
            break
        messages.append(
            {
                "role": "assistant",
                "content": "",  # null is rejected with 422 by llama_cpp.server
                "tool_calls": [
                    {
                        "id": tc.id,
                        "type": "function",
                        "function": {"name": tc.name, "arguments": tc.arguments},
                    }
                    for tc in step.tool_calls
                ],
            }
        )
        for tc in step.tool_calls:
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": TOOL_RESULT})
    return results


def longest_identical_run(steps: list[Step]) -> tuple[int, tuple[str, str] | None]:
    """Longest run of consecutive steps whose tool calls are all identical.

    A step counts toward a run if it made exactly one tool call and that
    call's (name, arguments) equals the previous step's.

    Returns:
        (run length in steps, the repeated (name, arguments) or None).
    """
    best, best_key = 0, None
    run, key = 0, None
    for step in steps:
        k = step.tool_calls[0].key if len(step.tool_calls) == 1 else None
        if k is not None and k == key:
            run += 1
        else:
            run, key = (1, k) if k is not None else (0, None)
        if run > best:
            best, best_key = run, key
    return best, best_key


def _print_step(step: Step) -> None:
    calls = "; ".join(f"{c.name} {c.arguments}" for c in step.tool_calls) or "-"
    extra = ""
    if step.first_chunk_s is not None:
        extra = f" first_chunk={step.first_chunk_s:.2f}s chunks={step.chunks}"
    text = f" content={step.content!r}" if step.content else ""
    print(
        f"step {step.index:2d}: {calls}{text} finish={step.finish_reason} "
        f"latency={step.latency_s:.2f}s{extra}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the process exit status."""
    import openai

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base_url", help="OpenAI base URL, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--stream", action="store_true", help="use streaming requests")
    parser.add_argument("--steps", type=int, default=10, help="max requests (default 10)")
    parser.add_argument(
        "--tool-choice",
        choices=sorted(TOOL_CHOICES),
        default="named",
        help="named (default; streams) or auto (non-streaming only)",
    )
    parser.add_argument("--min-run", type=int, default=5, help="run length for exit 0")
    parser.add_argument("--deltas", action="store_true", help="dump raw tool-call deltas")
    args = parser.parse_args(argv)

    client = openai.OpenAI(base_url=args.base_url, api_key="sk-unused", max_retries=0)
    t0 = time.perf_counter()
    steps = run_agent(
        client,
        stream=args.stream,
        steps=args.steps,
        tool_choice=args.tool_choice,
        on_step=_print_step,
    )
    total = time.perf_counter() - t0
    if args.deltas:
        for step in steps:
            for d in step.raw_deltas:
                print(f"  step {step.index} delta: {json.dumps(d)}")
    run, key = longest_identical_run(steps)
    print(f"longest identical run: {run} x {key} ({len(steps)} steps, {total:.2f}s total)")
    return 0 if run >= args.min_run else 1


if __name__ == "__main__":
    sys.exit(main())
