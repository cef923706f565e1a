"""``loopguard demo``: watch the proxy catch a looping agent, with no model server at all.

Starts, in this process: a scripted model (an aiohttp app speaking OpenAI chat completions that
answers every request with the same ``read_file`` call, ``steps`` times, then a final answer), the
real loopguard server in front of it, and a small agent loop that runs the tool and sends the
history back through the proxy until the model answers without a tool call. After each step it
prints what the proxy changed on the way to the model (injected reminders, withheld results), found
by comparing what the agent sent with what the model received, and, when the proxy ends the turn
(the response-side stop), the final answer the agent got instead of the model's next call.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import textwrap
from typing import Any

import aiohttp
import orjson
import structlog
from aiohttp import web

from proxy.config import Config, ListenConfig
from proxy.edge.observe import configure_logging
from proxy.edge.serve import start

TOOL_RESULT = "port: 8080\nlog_level: debug\ndatabase_url: postgres://db:5432/app\n"
ARGS = '{"path": "config.yaml"}'
FINAL = "I read config.yaml several times; it looks fine, so the failure is elsewhere."


def _scripted_model(
    steps: int, seen: list[list[dict[str, Any]]], answers: list[dict[str, Any]]
) -> web.Application:
    async def chat(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        seen.append(body["messages"])
        n = sum(1 for m in body["messages"] if m.get("role") == "assistant")
        if n < steps:
            message: dict[str, Any] = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{n + 1}",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": ARGS},
                    }
                ],
            }
            finish = "tool_calls"
        else:
            message, finish = {"role": "assistant", "content": FINAL}, "stop"
        answers.append(message)
        return web.json_response(
            {
                "id": f"chatcmpl-demo-{n}",
                "object": "chat.completion",
                "created": 0,
                "model": "scripted-looper",
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


def changes(sent: list[dict[str, Any]], received: list[dict[str, Any]]) -> list[tuple[int, str, str]]:
    """What the proxy changed, as ``(position, kind, text)``: kind ``injected`` for messages the
    agent did not send, ``withheld`` / ``changed`` for tool results whose content differs."""
    out: list[tuple[int, str, str]] = []
    j = 0
    for pos, msg in enumerate(received):
        if j < len(sent) and msg == sent[j]:
            j += 1
        elif (
            j < len(sent)
            and msg.get("role") == "tool"
            and msg.get("tool_call_id") == sent[j].get("tool_call_id")
        ):
            content = str(msg.get("content"))
            original = str(sent[j].get("content"))
            kind = "changed" if content.startswith(original) else "withheld"
            out.append((pos, kind, content[len(original) :].strip() if kind == "changed" else content))
            j += 1
        else:
            out.append((pos, "injected", str(msg.get("content"))))
    return out


def _show(label: str, text: str) -> None:
    print(f"        {label}")
    for line in text.splitlines():
        print(textwrap.indent(textwrap.fill(line, 88) if line else "", "          | "))


def invoked_as(argv0: str) -> str:
    """The command to name in the demo's closing line, as the user ran loopguard: the path typed
    (``.venv/bin/loopguard``, or ``loopguard`` in an activated venv), else (``python -m proxy``)
    the README's ``.venv/bin/loopguard``, so the line works where the README's commands do."""
    return argv0 if os.path.basename(argv0) == "loopguard" else ".venv/bin/loopguard"


async def run_demo(cfg: Config, steps: int = 20) -> int:
    """Run the demo and print it. Returns the process exit code (0)."""
    seen: list[list[dict[str, Any]]] = []
    seen_answers: list[dict[str, Any]] = []
    model = web.AppRunner(_scripted_model(steps, seen, seen_answers), access_log=None)
    await model.setup()
    site = web.TCPSite(model, "127.0.0.1", 0)
    await site.start()
    model_url = f"http://127.0.0.1:{model.addresses[0][1]}/v1"
    cfg = dataclasses.replace(
        cfg,
        listen=ListenConfig(host="127.0.0.1", port=0),
        upstream=dataclasses.replace(cfg.upstream, url=model_url),
    )
    saved_logging = structlog.get_config()
    configure_logging("warning")  # the per-request log lines would drown the conversation
    runner, port = await start(cfg)
    proxy_url = f"http://127.0.0.1:{port}"
    print("loopguard demo: a scripted model that loops on one tool call, an agent, and the proxy")
    print(f"  scripted model  {model_url}")
    print(f"  loopguard       {proxy_url}/v1   (the agent's OPENAI_BASE_URL)\n")
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Use tools to inspect the repo."},
        {"role": "user", "content": "The app fails to start. Find out why."},
    ]
    print(f"user: {messages[1]['content']}")
    shown: set[tuple[int, str, str]] = set()
    try:
        async with aiohttp.ClientSession() as http:
            for step in range(1, steps + 2):
                async with http.post(
                    f"{proxy_url}/v1/chat/completions",
                    json={"model": "scripted-looper", "messages": messages},
                ) as resp:
                    answer = await resp.json()
                for pos, kind, text in changes(messages, seen[-1]):
                    if (pos, kind, text) in shown:
                        continue  # re-injected at the same position: already shown
                    shown.add((pos, kind, text))
                    if kind == "injected":
                        _show("loopguard injected (the model sees it; the agent's history does not):", text)
                    elif kind == "withheld":
                        _show("loopguard withheld that result; the model saw instead:", text)
                    else:
                        _show("loopguard appended to that result:", text)
                msg = answer["choices"][0]["message"]
                messages.append(msg)
                if not msg.get("tool_calls") and msg.get("content") != FINAL:
                    fn = seen_answers[-1]["tool_calls"][0]["function"]
                    print(f"step {step:<2} the model called {fn['name']} {fn['arguments']} again")
                    _show(
                        "loopguard ended the turn: the agent got this final answer, with no tool call:",
                        str(msg.get("content")),
                    )
                    break
                if not msg.get("tool_calls"):
                    print(f"assistant: {msg.get('content')}")
                    break
                for tc in msg["tool_calls"]:
                    fn = tc["function"]
                    print(f"step {step:<2} assistant calls {fn['name']} {fn['arguments']}")
                    messages.append({"role": "tool", "tool_call_id": tc["id"], "content": TOOL_RESULT})
            async with http.get(f"{proxy_url}/loop-guard") as resp:
                stats = await resp.json()
    finally:
        await runner.cleanup()
        await model.cleanup()
        structlog.configure(**saved_logging)
    print(f"\nGET /loop-guard: {orjson.dumps(stats).decode()}")
    command = invoked_as(sys.argv[0])
    print(f"Next: `{command} serve --upstream http://127.0.0.1:8080/v1` and point your agent at it.")
    return 0
