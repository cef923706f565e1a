"""Streamed tool-call responses as real servers send them, one fixture per quirk
(missing indexes, repeated ids, arguments sent as objects: DESIGN §6.4).

Each :class:`Quirk` is the exact upstream bytes of one streamed chat completion and the calls an
agent must end up with, as ``(id, name, arguments)`` (arguments as the JSON text the agent runs;
an object sent by the server is shown serialized). Used by the assembler tests, the stream-guard
tests and the byte-exact passthrough tests through the real proxy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

BASE = {"id": "chatcmpl-q", "object": "chat.completion.chunk", "created": 1700000000, "model": "m"}


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {**BASE, "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}], **extra}


def ev(obj: Any, eol: bytes = b"\n", sep: bytes = b" ") -> bytes:
    data = obj if isinstance(obj, bytes) else orjson.dumps(obj)
    return b"data:" + sep + data + eol + eol


def stream(*objs: Any, eol: bytes = b"\n", sep: bytes = b" ", done: bool = True) -> bytes:
    out = b"".join(ev(o, eol, sep) for o in objs)
    return out + (b"data:" + sep + b"[DONE]" + eol + eol if done else b"")


def tc(
    index: int | None = 0,
    id: str | None = None,
    name: str | None = None,
    arguments: Any = None,
    type_: bool = False,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if index is not None:
        out["index"] = index
    if id is not None:
        out["id"] = id
    if type_:
        out["type"] = "function"
    fn: dict[str, Any] = {}
    if name is not None:
        fn["name"] = name
    if arguments is not None:
        fn["arguments"] = arguments
    if fn:
        out["function"] = fn
    return out


def calls(*items: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": list(items)}


ROLE = {"role": "assistant", "content": None}
ARGS = '{"path": "app.py"}'


@dataclass(frozen=True)
class Quirk:
    name: str
    source: str
    raw: bytes
    expected: list[tuple[str | None, str, str]]
    finish: str = "tool_calls"


QUIRKS = [
    Quirk(
        "openai_fragments",
        "OpenAI, vLLM: id and name in the first delta, arguments in fragments",
        stream(
            chunk(ROLE),
            chunk(calls(tc(0, "call_a", "read_file", "", type_=True))),
            chunk(calls(tc(0, arguments='{"pa'))),
            chunk(calls(tc(0, arguments='th": "app.py"}'))),
            chunk(finish="tool_calls"),
        ),
        [("call_a", "read_file", ARGS)],
    ),
    Quirk(
        "whole_call_in_one_delta",
        "llama.cpp, Ollama: the whole call in one delta",
        stream(
            chunk(ROLE),
            chunk(calls(tc(0, "call_a", "read_file", ARGS, type_=True))),
            chunk(finish="tool_calls"),
        ),
        [("call_a", "read_file", ARGS)],
    ),
    Quirk(
        "missing_index",
        "servers that omit index: a new id starts a call, fragments without id continue it",
        stream(
            chunk(ROLE),
            chunk(calls(tc(None, "call_a", "read_file", "", type_=True))),
            chunk(calls(tc(None, arguments=ARGS))),
            chunk(calls(tc(None, "call_b", "grep", '{"q": "x"}', type_=True))),
            chunk(finish="tool_calls"),
        ),
        [("call_a", "read_file", ARGS), ("call_b", "grep", '{"q": "x"}')],
    ),
    Quirk(
        "parallel_calls_all_index_0",
        "Ollama: every parallel call with index 0 but its own id",
        stream(
            chunk(ROLE),
            chunk(calls(tc(0, "call_a", "read_file", ARGS, type_=True))),
            chunk(calls(tc(0, "call_b", "read_file", '{"path": "b.py"}', type_=True))),
            chunk(calls(tc(0, "call_c", "grep", '{"q": "x"}', type_=True))),
            chunk(finish="tool_calls"),
        ),
        [
            ("call_a", "read_file", ARGS),
            ("call_b", "read_file", '{"path": "b.py"}'),
            ("call_c", "grep", '{"q": "x"}'),
        ],
    ),
    Quirk(
        "id_repeated_on_every_fragment",
        "old SGLang: the id on every fragment",
        stream(
            chunk(ROLE),
            chunk(calls(tc(0, "call_a", "read_file", "", type_=True))),
            chunk(calls(tc(0, "call_a", arguments='{"path": '))),
            chunk(calls(tc(0, "call_a", arguments='"app.py"}'))),
            chunk(calls(tc(1, "call_b", "grep", "", type_=True))),
            chunk(calls(tc(1, "call_b", arguments='{"q": "x"}'))),
            chunk(finish="tool_calls"),
        ),
        [("call_a", "read_file", ARGS), ("call_b", "grep", '{"q": "x"}')],
    ),
    Quirk(
        "name_repeated_in_every_delta",
        "old llama.cpp: the name in every delta (must not become readreadread)",
        stream(
            chunk(ROLE),
            chunk(calls(tc(0, "call_a", "read", '{"pa', type_=True))),
            chunk(calls(tc(0, name="read", arguments='th": '))),
            chunk(calls(tc(0, name="read", arguments='"app.py"}'))),
            chunk(finish="tool_calls"),
        ),
        [("call_a", "read", ARGS)],
    ),
    Quirk(
        "empty_name_in_later_fragments",
        'LM Studio: name "" in the fragments after the first',
        stream(
            chunk(ROLE),
            chunk(calls(tc(0, "call_a", "read_file", "", type_=True))),
            chunk(calls(tc(0, name="", arguments='{"path": '))),
            chunk(calls(tc(0, name="", arguments='"app.py"}'))),
            chunk(finish="tool_calls"),
        ),
        [("call_a", "read_file", ARGS)],
    ),
    Quirk(
        "arguments_as_object",
        "servers that send arguments as a JSON object",
        stream(
            chunk(ROLE),
            chunk(calls(tc(0, "call_a", "read_file", {"path": "app.py"}, type_=True))),
            chunk(finish="tool_calls"),
        ),
        [("call_a", "read_file", '{"path":"app.py"}')],
    ),
    Quirk(
        "no_parameters",
        'no-parameter tools: arguments "" or absent',
        stream(
            chunk(ROLE),
            chunk(calls(tc(0, "call_a", "list_files", "", type_=True))),
            chunk(calls(tc(1, "call_b", "git_status", type_=True))),
            chunk(finish="tool_calls"),
        ),
        [("call_a", "list_files", ""), ("call_b", "git_status", "")],
    ),
    Quirk(
        "calls_then_finish_stop",
        "servers that end a tool-call answer with finish_reason stop",
        stream(
            chunk(ROLE),
            chunk(calls(tc(0, "call_a", "read_file", ARGS, type_=True))),
            chunk(finish="stop"),
        ),
        [("call_a", "read_file", ARGS)],
        finish="stop",
    ),
    Quirk(
        "usage_chunk_with_no_choices",
        "stream_options.include_usage: a last chunk with choices []",
        stream(
            chunk(ROLE),
            chunk(calls(tc(0, "call_a", "read_file", ARGS, type_=True))),
            chunk(finish="tool_calls"),
            {
                **BASE,
                "choices": [],
                "usage": {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14},
            },
        ),
        [("call_a", "read_file", ARGS)],
    ),
    Quirk(
        "sse_comments",
        "keep-alive and OpenRouter comments between events",
        b": OPENROUTER PROCESSING\n\n"
        + ev(chunk(ROLE))
        + b": keep-alive\n\n"
        + ev(chunk(calls(tc(0, "call_a", "read_file", "", type_=True))))
        + b": OPENROUTER PROCESSING\n\n"
        + ev(chunk(calls(tc(0, arguments=ARGS))))
        + ev(chunk(finish="tool_calls"))
        + b"data: [DONE]\n\n",
        [("call_a", "read_file", ARGS)],
    ),
    Quirk(
        "crlf_line_endings",
        "CRLF line endings",
        stream(
            chunk(ROLE),
            chunk(calls(tc(0, "call_a", "read_file", "", type_=True))),
            chunk(calls(tc(0, arguments=ARGS))),
            chunk(finish="tool_calls"),
            eol=b"\r\n",
        ),
        [("call_a", "read_file", ARGS)],
    ),
    Quirk(
        "data_without_space",
        "data: without the space",
        stream(
            chunk(ROLE),
            chunk(calls(tc(0, "call_a", "read_file", ARGS, type_=True))),
            chunk(finish="tool_calls"),
            sep=b"",
        ),
        [("call_a", "read_file", ARGS)],
    ),
    Quirk(
        "multibyte_utf8_arguments",
        "non-ASCII arguments (the tests split reads inside a multi-byte character)",
        stream(
            chunk(ROLE),
            chunk(calls(tc(0, "call_a", "write_file", '{"path": "日本/é.txt", ', type_=True))),
            chunk(calls(tc(0, arguments='"text": "héllo 日本語"}'))),
            chunk(finish="tool_calls"),
        ),
        [("call_a", "write_file", '{"path": "日本/é.txt", "text": "héllo 日本語"}')],
    ),
    Quirk(
        "error_mid_stream",
        'data: {"error": …} after part of a call (the stream ends there)',
        stream(
            chunk(ROLE),
            chunk(calls(tc(0, "call_a", "read_file", '{"pa', type_=True))),
            {"error": {"message": "model crashed", "type": "server_error", "code": 500}},
            done=False,
        ),
        [("call_a", "read_file", '{"pa')],
        finish="",
    ),
]

BY_NAME = {q.name: q for q in QUIRKS}
