"""A llama-cpp-python chat completion handler that can drive an agent loop with a small model.

llama-cpp-python's stock ``chatml-function-calling`` format renders tool results without their
content, HTML-escapes quotes, cannot answer in text under ``tool_choice: auto`` and drops the
request's ``seed``. This handler (registered as :data:`FORMAT_NAME` by
:mod:`bench.recovery.llama_main`, inside the server process) instead:

- renders ChatML (SmolLM2's template): one system turn holding the request's system text and the
  offered tools (name, description, parameters), then every message as its own turn with its
  content: an assistant's tool calls as the JSON object the model writes, a ``tool`` message as a
  ``tool`` turn with the result text;
- constrains the output with a grammar (a JSON schema: one of ``{"name": <tool>, "arguments":
  <that tool's parameters>}``) to exactly one tool call; under ``tool_choice`` other than
  ``"required"`` or a named tool, the pseudo-tool :data:`ANSWER_TOOL` (``{"text": string}``) is
  offered too, and choosing it is returned as a plain text answer (``content``, no ``tool_calls``,
  ``finish_reason: "stop"``);
- returns OpenAI-shaped answers: ``message.tool_calls`` (one call, ``finish_reason:
  "tool_calls"``) in JSON, and for ``stream: true`` the same answer as chunks (role, the call's
  id and name, its arguments in pieces of :data:`STREAM_PIECE_CHARS` characters, then the finish
  chunk carrying ``usage``). The stream is cut from the finished generation (the call's name is
  only known once the grammar has produced it), so it carries no timing information;
- passes the request's ``seed`` (and its sampling settings: ``temperature``, ``top_p``,
  ``top_k``, ``min_p``, ``repeat_penalty``, ``presence_penalty``, ``frequency_penalty``,
  ``max_tokens``) to sampling, so a request with the same seed and the same messages gets the same
  answer. A call's id is derived from the prompt and the generated text, so identical requests get
  identical answers byte for byte (but for ``id``/``created`` of the completion itself).

Imports only the standard library and ``llama_cpp`` (it runs inside the server).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Iterator
from typing import Any

#: The name the handler is registered under (the server's ``--chat_format``).
FORMAT_NAME = "loopguard-bench-tools"
#: The pseudo-tool a text answer is written as; never returned as a tool call.
ANSWER_TOOL = "answer"
#: Characters of a call's arguments per streamed delta.
STREAM_PIECE_CHARS = 16
#: Default cap on generated tokens when the request sets no ``max_tokens``.
DEFAULT_MAX_TOKENS = 384

_INSTRUCTIONS = (
    "You can use these tools. Reply with exactly one JSON object "
    '{"name": <tool name>, "arguments": {...}} and nothing else.'
)
_ANSWER_SPEC = {
    "type": "function",
    "function": {
        "name": ANSWER_TOOL,
        "description": "Answer the user in text and end your turn.",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    },
}


def _text(content: Any) -> str:
    """A message's content as text: a string as is, text parts joined, anything else empty."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _call_text(name: str, arguments: Any) -> str:
    """A tool call written the way the model writes it (the grammar's JSON object)."""
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            arguments = json.loads(arguments)
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


def offered(tools: list[dict[str, Any]] | None, tool_choice: Any) -> list[dict[str, Any]]:
    """The tool specs the model may choose from: the request's function tools (only the named one
    under a named ``tool_choice``), plus :data:`ANSWER_TOOL` unless a call is required; an empty
    list (no tools, or ``tool_choice: "none"``) means a free text answer."""
    specs = [t for t in tools or [] if t.get("type") == "function"]
    if tool_choice == "none" or not specs:
        return []
    if isinstance(tool_choice, dict):
        want = (tool_choice.get("function") or {}).get("name")
        return [t for t in specs if t["function"]["name"] == want]
    if tool_choice == "required":
        return specs
    return [*specs, _ANSWER_SPEC]


def render(messages: list[dict[str, Any]], specs: list[dict[str, Any]]) -> str:
    """The ChatML prompt (ending with an open assistant turn) for ``messages`` with ``specs``
    described in the system turn (appended to the first system message, or a system turn of its
    own before the first message)."""
    tool_lines = [
        f"- {f['name']}: {f.get('description', '')} Parameters: "
        + json.dumps(f.get("parameters", {}), ensure_ascii=False)
        for f in (t["function"] for t in specs)
    ]
    tools_text = "\n".join([_INSTRUCTIONS, *tool_lines]) if specs else ""
    out: list[str] = []
    placed = not tools_text
    for m in messages:
        role = m.get("role", "user")
        body = _text(m.get("content"))
        if role in ("system", "developer") and not placed:
            body, placed = f"{body}\n\n{tools_text}", True
        elif not placed:
            out.append(f"<|im_start|>system\n{tools_text}<|im_end|>\n")
            placed = True
        if role == "assistant" and m.get("tool_calls"):
            calls = [
                _call_text(c["function"]["name"], c["function"].get("arguments", "{}"))
                for c in m["tool_calls"]
            ]
            body = "\n".join(([body] if body else []) + calls)
        if role in ("developer",):
            role = "system"
        out.append(f"<|im_start|>{role}\n{body}<|im_end|>\n")
    if not placed:
        out.append(f"<|im_start|>system\n{tools_text}<|im_end|>\n")
    out.append("<|im_start|>assistant\n")
    return "".join(out)


def schema(specs: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON schema of one answer: ``{"name": const, "arguments": parameters}`` per tool."""
    one = [
        {
            "type": "object",
            "properties": {
                "name": {"const": f["name"]},
                "arguments": f.get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
        }
        for f in (t["function"] for t in specs)
    ]
    return one[0] if len(one) == 1 else {"anyOf": one}


def parse(text: str) -> tuple[str | None, dict[str, Any] | str]:
    """``(name, arguments)`` of a generated call, or ``(None, text)`` when ``text`` is not one
    (cut by ``max_tokens``); an :data:`ANSWER_TOOL` call comes back as ``(None, its text)``."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None, text
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None, text
    args = obj.get("arguments")
    args = args if isinstance(args, dict) else {}
    if obj["name"] == ANSWER_TOOL:
        return None, str(args.get("text", ""))
    return obj["name"], args


def call_id(prompt: str, generated: str) -> str:
    """A deterministic call id: the same prompt and output give the same id in every run."""
    return "call_" + hashlib.sha256((prompt + "\x00" + generated).encode()).hexdigest()[:16]


def _message(name: str | None, args: Any, cid: str) -> tuple[dict[str, Any], str]:
    """The OpenAI assistant message and finish reason for a parsed answer."""
    if name is None:
        return {"role": "assistant", "content": str(args)}, "stop"
    call = {
        "id": cid,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
    }
    return {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"


def _chunks(
    base: dict[str, Any], message: dict[str, Any], finish: str, usage: dict[str, int]
) -> Iterator[dict[str, Any]]:
    """The streamed form of ``message``: role, content or call (arguments in pieces), finish."""

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        out = {
            **base,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
        }
        if finish_reason is not None:
            out["usage"] = usage
        return out

    yield chunk({"role": "assistant", "content": None})
    if message.get("tool_calls"):
        call = message["tool_calls"][0]
        yield chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["function"]["name"], "arguments": ""},
                    }
                ]
            }
        )
        args = call["function"]["arguments"]
        for i in range(0, len(args), STREAM_PIECE_CHARS):
            piece = args[i : i + STREAM_PIECE_CHARS]
            yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
    else:
        text = message.get("content") or ""
        for i in range(0, len(text), STREAM_PIECE_CHARS):
            yield chunk({"content": text[i : i + STREAM_PIECE_CHARS]})
    yield chunk({}, finish)


def handler(
    *,
    llama: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    tool_choice: Any = None,
    temperature: float = 0.2,
    top_p: float = 0.95,
    top_k: int = 40,
    min_p: float = 0.05,
    stream: bool = False,
    seed: int | None = None,
    max_tokens: int | None = None,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    repeat_penalty: float = 1.1,
    model: str | None = None,
    **_: Any,
) -> dict[str, Any] | Iterator[dict[str, Any]]:
    """The :class:`llama_cpp.llama_chat_format.LlamaChatCompletionHandler`: see the module text.

    Returns a ``chat.completion`` dict, or (``stream``) an iterator of ``chat.completion.chunk``
    dicts. Token counts in ``usage`` are the model's tokens."""
    from llama_cpp.llama_grammar import LlamaGrammar

    specs = offered(tools, tool_choice)
    prompt = render(messages, specs)
    grammar = LlamaGrammar.from_json_schema(json.dumps(schema(specs)), verbose=False) if specs else None
    result = llama.create_completion(
        prompt=prompt,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        seed=seed,
        max_tokens=max_tokens or DEFAULT_MAX_TOKENS,
        presence_penalty=presence_penalty or 0.0,
        frequency_penalty=frequency_penalty or 0.0,
        repeat_penalty=repeat_penalty,
        stop=["<|im_end|>"],
        grammar=grammar,
        stream=False,
    )
    generated = result["choices"][0]["text"]
    if specs:
        name, args = parse(generated)
    else:
        name, args = None, generated
    message, finish = _message(name, args, call_id(prompt, generated))
    if result["choices"][0].get("finish_reason") == "length" and name is None:
        finish = "length"
    usage = dict(result["usage"])
    base = {"id": "chatcmpl-" + call_id(prompt, generated)[5:], "created": int(time.time())}
    base["model"] = model or result.get("model", "")
    if stream:
        return _chunks(base, message, finish, usage)
    return {
        **base,
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": usage,
    }
