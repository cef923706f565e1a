"""Request bodies and canned responses for the benchmark (deterministic, no I/O).

Every body is a *looping* agent conversation (OpenAI chat completions, tool calls as JSON strings,
tool results as strings), so the loopguard arm with the default guards injects reminders and
withholds results on every request, the way it does for a real stuck agent. All arms get exactly
the same bytes.

- :func:`small_body`: system + user + 7 identical ``bash`` calls with short results (~4 KB):
  reminders after calls 3 and 5, call 7 withheld (fresh on every request).
- :func:`chat_body`: a plain chat (no tools offered, no calls): nothing for the guards to read
  (answered with :data:`CHAT_COMPLETION`, text).
- :func:`history_body`: a long session of about 3.4 KB per tool call (``read_file``, ``grep``,
  ``bash``, ``edit_file`` with code-like results), where every 40 calls the agent gets stuck for 8
  identical test runs; it ends inside such a loop, so every request carries a fresh reminder and a
  fresh denial plus all the re-derived ones. 1 MiB is about 300 calls.
- :func:`memory_body`: request ``j`` of conversation ``c`` (distinct conversations by their first
  messages) of a small looping agent, for the bounded-state test and the soak (``bench/soak.py``).
- :func:`plain_body`: request ``j`` of conversation ``c`` of an agent that makes progress (every
  call and result new): nothing for the guards to do, for the soak.
"""

from __future__ import annotations

import random
from typing import Any

import orjson

MODEL = "fake-model"

#: The workloads the bench runs on every arm.
SIZES = {"10KB": 10 * 1024, "100KB": 100 * 1024, "1MB": 1024 * 1024, "5MB": 5 * 1024 * 1024}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": desc,
            "parameters": {
                "type": "object",
                "properties": {p: {"type": "string", "description": f"The {p}."} for p in params},
                "required": params[:1],
            },
        },
    }
    for name, desc, params in [
        ("read_file", "Read a file from the workspace and return its content.", ["path"]),
        ("grep", "Search files for a regular expression.", ["pattern", "path"]),
        ("bash", "Run a shell command; returns its output and exit code.", ["command", "description"]),
        ("edit_file", "Replace one string in a file.", ["path", "old_string", "new_string"]),
    ]
]

SYSTEM = (
    "You are a coding agent working in a repository. Use the tools to inspect and change files, "
    "run the tests, and report to the user when you are done or blocked."
)

_WORDS = [
    "self",
    "value",
    "result",
    "config",
    "path",
    "items",
    "index",
    "request",
    "response",
    "handler",
    "error",
    "data",
    "buffer",
    "count",
    "limit",
    "window",
    "tool",
    "call",
    "message",
    "return",
    "import",
    "async",
    "await",
    "def",
    "class",
    "for",
    "in",
    "if",
    "else",
    "raise",
    "None",
    "True",
    "False",
    "len",
    "list",
    "dict",
    "str",
    "int",
    "bytes",
    "json",
    "yaml",
    "parse",
    "load",
    "dump",
]


def _code(rng: random.Random, nbytes: int) -> str:
    """Code-like text of about ``nbytes`` characters."""
    lines: list[str] = []
    size = 0
    while size < nbytes:
        indent = "    " * rng.randint(0, 3)
        line = indent + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 10)))
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


def _call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": orjson.dumps(args).decode()},
    }


def _step(call_id: str, name: str, args: dict[str, Any], result: str) -> list[dict[str, Any]]:
    return [
        {"role": "assistant", "content": None, "tool_calls": [_call(call_id, name, args)]},
        {"role": "tool", "tool_call_id": call_id, "content": result},
    ]


def _body(messages: list[dict[str, Any]], stream: bool) -> bytes:
    body: dict[str, Any] = {"model": MODEL, "messages": messages, "tools": TOOLS, "stream": stream}
    return orjson.dumps(body)


def small_body(stream: bool = False) -> bytes:
    """A short looping conversation (~4 KB)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "The build is red. Make the tests pass."},
    ]
    for i in range(1, 8):
        messages += _step(
            f"call_s{i}",
            "bash",
            {"command": "npm test", "description": f"Run the tests (try {i})"},
            "FAIL src/app.test.js\n  ● app › starts\n    TypeError: cannot read 'port' of undefined\n"
            "Tests: 1 failed, 41 passed, 42 total\nexit code 1",
        )
    return _body(messages, stream)


def chat_body(stream: bool = False) -> bytes:
    """A plain chat request (~1 KB): a system prompt and a short exchange with a person, no tools
    offered and no tool call anywhere, the way a chat UI sends it."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant. Answer briefly and precisely."},
        {"role": "user", "content": "What does a reverse proxy do, in two sentences?"},
        {
            "role": "assistant",
            "content": "A reverse proxy receives requests on behalf of one or more servers and "
            "forwards them, returning the servers' answers as its own. It is used for load "
            "balancing, caching, TLS termination and inspecting or filtering traffic.",
        },
        {"role": "user", "content": "And how is that different from a forward proxy? Keep it short."},
    ]
    body: dict[str, Any] = {"model": MODEL, "messages": messages, "stream": stream}
    return orjson.dumps(body)


def _work_call(rng: random.Random, k: int) -> tuple[str, dict[str, Any], str]:
    kind = k % 4
    if kind == 0:
        return "read_file", {"path": f"src/pkg{k % 17}/module_{k}.py"}, _code(rng, 4400)
    if kind == 1:
        hits = "\n".join(
            f"src/pkg{rng.randint(0, 16)}/module_{rng.randint(0, 999)}.py:{rng.randint(1, 900)}: "
            + _code(rng, 60).replace("\n", " ")
            for _ in range(50)
        )
        return "grep", {"pattern": f"def handler_{k}\\b", "path": "src"}, hits
    if kind == 2:
        return (
            "bash",
            {"command": f"python -m pytest tests/test_mod{k}.py -q", "description": "Run one test file"},
            _code(rng, 3000) + "\n3 passed in 0.41s",
        )
    old = _code(rng, 200)
    return (
        "edit_file",
        {"path": f"src/pkg{k % 17}/module_{k}.py", "old_string": old, "new_string": old + "\n    pass"},
        "The file was edited.",
    )


def _size(step: list[dict[str, Any]]) -> int:
    return sum(len(orjson.dumps(m)) + 1 for m in step)


def history_messages(target_bytes: int, seed: int = 1) -> list[dict[str, Any]]:
    """Messages of a long looping session of about ``target_bytes`` once encoded (within ~4 KB).

    Blocks of 32 varied calls and 8 identical test runs, then a final loop of 8 identical calls
    (its results sized to fit small targets), so the newest step always gets a reminder and a
    denial."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Refactor the request handlers and keep the test suite green."},
    ]
    size = _size(messages) + len(orjson.dumps(TOOLS)) + 64
    tail_result = max(200, min(1500, target_bytes // 24))
    k = 0
    loops = 0

    def loop_step(i: int, result: str) -> list[dict[str, Any]]:
        args = {
            "command": f"python -m pytest tests/test_handlers.py -x -k loop{loops}",
            "description": f"Run the failing test again (attempt {i})",
        }
        return _step(f"call_{k + i}", "bash", args, result)

    failing_tail = _code(rng, tail_result) + "\nFAILED tests/test_handlers.py::test_retry\nexit code 1"
    budget = target_bytes - sum(_size(loop_step(i, failing_tail)) for i in range(1, 9)) - 8
    misses = 0
    while misses < 8:
        in_block = k % 40
        if in_block < 32:
            name, args, result = _work_call(rng, k)
            step = _step(f"call_{k}", name, args, result)
        else:
            if in_block == 32:
                loops += 1
                failing = _code(rng, 1500) + "\nFAILED tests/test_handlers.py::test_retry\nexit code 1"
            step = loop_step(0, failing)
        k += 1
        if size + _size(step) > budget:
            misses += 1
            continue
        messages += step
        size += _size(step)
    loops += 1
    for i in range(1, 9):
        messages += loop_step(i, failing_tail)
    return messages


def history_body(target_bytes: int, stream: bool = False, seed: int = 1) -> bytes:
    """A looping agent session of about ``target_bytes``."""
    return _body(history_messages(target_bytes, seed), stream)


def session_bodies(start_bytes: int, end_bytes: int, requests: int, seed: int = 1) -> list[bytes]:
    """An agent session: one conversation growing from about ``start_bytes`` to about
    ``end_bytes`` in ``requests`` requests, each the previous one plus the next steps of the
    session (its history cut at the step boundary nearest an even byte spacing; at least one
    step more than the previous request). The history is :func:`history_messages` of
    ``end_bytes``."""
    messages = history_messages(end_bytes, seed)
    sizes: list[int] = []  # bytes of messages[:i+1]
    total = 0
    for m in messages:
        total += len(orjson.dumps(m)) + 1
        sizes.append(total)
    ends = [i + 1 for i, m in enumerate(messages) if m.get("role") == "tool"]
    cuts: list[int] = []
    for k in range(requests):
        want = start_bytes + (end_bytes - start_bytes) * k // max(1, requests - 1)
        end = next((e for e in ends if sizes[e - 1] >= want and (not cuts or e > cuts[-1])), None)
        if end is None:
            break
        cuts.append(end)
    return [_body(messages[:end], False) for end in cuts]


def count_calls(body: bytes) -> int:
    return sum(len(m.get("tool_calls") or []) for m in orjson.loads(body)["messages"])


def memory_body(conversation: int, request: int, stream: bool = False) -> bytes:
    """Request ``request`` (1-based) of conversation ``conversation``: a looping agent that has
    made ``request + 2`` identical calls (reminders from request 1, denials from request 5)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"{SYSTEM} Session {conversation}."},
        {"role": "user", "content": f"Task {conversation}: find out why the service {conversation} fails."},
    ]
    result = f"service-{conversation}: connection refused (127.0.0.1:5432)\n" * 20
    for i in range(1, request + 3):
        messages += _step(
            f"call_m{conversation}_{i}",
            "bash",
            {"command": f"systemctl status svc-{conversation}", "description": f"check {i}"},
            result,
        )
    return _body(messages, stream)


def plain_body(conversation: int, request: int, stream: bool = False) -> bytes:
    """Request ``request`` (1-based) of conversation ``conversation`` of an agent that is getting
    somewhere: ``request - 1`` different calls (files read, searched, edited, tested), each with a
    result of its own, so no guard has anything to say. Request 1 is a plain chat (no calls yet)."""
    rng = random.Random(conversation)  # request j's history is request j-1's plus one step
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"{SYSTEM} Workspace {conversation}."},
        {"role": "user", "content": f"Task {conversation}: add a --verbose flag to the CLI."},
    ]
    for k in range(1, request):
        name, args, result = _work_call(rng, conversation * 100 + k)
        messages += _step(f"call_p{conversation}_{k}", name, args, result[:1200])
    return _body(messages, stream)


# --- canned upstream responses --------------------------------------------------------------------

COMPLETION = orjson.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1700000000,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        _call("call_next", "bash", {"command": "npm test", "description": "again"})
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 20, "total_tokens": 1020},
    }
)

#: The answer to a request that offers no tools (the plain chat workload): text, no calls.
CHAT_COMPLETION = orjson.dumps(
    {
        "id": "chatcmpl-bench-chat",
        "object": "chat.completion",
        "created": 1700000000,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "A forward proxy acts for the clients (it hides them from the "
                    "servers); a reverse proxy acts for the servers (it hides them from the clients).",
                },
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150},
    }
)

#: Number of SSE events in a streamed answer (the last one is ``data: [DONE]``) and their pacing.
SSE_EVENTS = 64
SSE_INTERVAL_S = 0.005


def sse_events() -> list[bytes]:
    """The streamed answer: 64 events (role, 61 content deltas, finish, ``[DONE]``)."""
    base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1700000000, "model": MODEL}

    def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
        obj = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    out = [event({"role": "assistant", "content": ""})]
    out += [event({"content": f"token{i} "}) for i in range(SSE_EVENTS - 3)]
    out.append(event({}, "stop"))
    out.append(b"data: [DONE]\n\n")
    assert len(out) == SSE_EVENTS
    return out
