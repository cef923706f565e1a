"""Tool calls written as text in an assistant message: pure parsing, no I/O.

A local Qwen server whose tool parser misses a call (no or the wrong ``--tool-call-parser`` in
vLLM, SGLang without one, llama.cpp without ``--jinja``, a call emitted inside ``<think>``) sends
it as markup in ``content``; agents in XML modes send the same shapes back in history. The
formats, as the models' chat templates write them and vLLM's ``hermes`` / ``qwen3_coder`` tool
parsers, SGLang's ``qwen25`` / ``qwen3_coder`` detectors and llama.cpp's chat parsers read them:

- **hermes** (Hermes, Qwen2.5, Qwen3): ``<tool_call>\\n{"name": "read", "arguments": {"path":
  "a.py"}}\\n</tool_call>``. ``arguments`` is an object; a JSON *string* holding an object (some
  fine-tunes double-encode) is accepted too and decoded, anything else (a list, a number, a
  missing ``arguments``) is no call. Other members are ignored. The JSON ends where the decoder
  says it ends, so a ``</tool_call>`` inside a string value does not end the block.
- **xml** (Qwen3-Coder, Qwen3.5): ``<tool_call>\\n<function=read>\\n<parameter=path>\\na.py\\n
  </parameter>\\n</function>\\n</tool_call>``. A value is the raw text up to the next
  ``</parameter>``, one leading and one trailing newline (``\\n`` or ``\\r\\n``) stripped. With
  the request's ``tools``, a value is typed by the parameter's JSON-schema ``type`` (``integer``,
  ``number``, ``boolean``, ``object``, ``array``, ``null``; a list of types, or the types of the
  ``anyOf`` / ``oneOf`` branches, is tried in order, ``string`` first wins); a
  value that does not convert stays the string (as vLLM does); untyped parameters stay strings.
  The bare ``<function=…>…</function>`` without ``<tool_call>`` is accepted, and so is a stray
  ``</tool_call>`` after a block.
- Parallel calls are repeated blocks, whitespace between them.

Never a call:

- reasoning: a ``<think>…</think>`` region, or everything before the first ``</think>`` when the
  text has no ``<think>`` before it (templates that pre-insert the opening tag), or everything
  after an unclosed ``<think>``;
- markup inside a fenced code block (a line opening with ````` ``` ````` or ``~~~``, up to three
  spaces of indent, closed by a line of at least as many of the same character; an unclosed
  fence runs to the end).

All or nothing: :func:`find_calls` returns calls only when the first opening tag outside those
regions starts a run of complete, well-formed blocks (valid JSON, known tool names when tools
are known, no duplicate parameter) with nothing but whitespace (and stray ``</tool_call>``) between
and after them. One block that does not parse, an incomplete block, text after the calls: the
whole message stays text, never a partial or guessed set of calls.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: The opening tags a call block starts with (what the stream guard watches for).
OPEN_TAGS = ("<tool_call>", "<function=")
_OPEN = "<tool_call>"
_CLOSE = "</tool_call>"
_FUNC_CLOSE = "</function>"
_PARAM_CLOSE = "</parameter>"
#: Tool names as the OpenAI API takes them, plus ``.`` and ``:`` (MCP-style names).
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}\Z")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})", re.MULTILINE)
_WS = re.compile(r"\s*")
_BLOCK_START = re.compile(r"<tool_call>|<function=")
_RESPONSE = re.compile(r"<tool_response>(.*?)</tool_response>", re.DOTALL)
_DECODER = json.JSONDecoder()


@dataclass(frozen=True, slots=True)
class TextCall:
    """One call found in text. ``arguments``: the decoded object; ``start``/``end``: its block's
    character span in the text (``end`` exclusive, a stray ``</tool_call>`` after it included);
    ``form``: ``"hermes"`` or ``"xml"``."""

    name: str
    arguments: dict[str, Any]
    start: int
    end: int
    form: str


@dataclass(frozen=True, slots=True)
class Found:
    """The calls of one text, in order, and ``text``: everything before the first block."""

    calls: tuple[TextCall, ...]
    text: str


def _excluded(text: str) -> list[tuple[int, int]]:
    """Character spans that are never calls: reasoning and fenced code (module docstring)."""
    spans: list[tuple[int, int]] = []
    first_close = text.find("</think>")
    first_open = text.find("<think>")
    pos = 0
    if first_close >= 0 and (first_open < 0 or first_open > first_close):
        spans.append((0, first_close + len("</think>")))
        pos = first_close + len("</think>")
    while True:
        o = text.find("<think>", pos)
        if o < 0:
            break
        c = text.find("</think>", o)
        if c < 0:
            spans.append((o, len(text)))
            break
        spans.append((o, c + len("</think>")))
        pos = c + len("</think>")
    fence: str | None = None
    fence_start = 0
    for m in _FENCE.finditer(text):
        mark = m.group(1)
        if fence is None:
            fence, fence_start = mark, m.start()
        elif mark[0] == fence[0] and len(mark) >= len(fence):
            line_end = text.find("\n", m.end())
            spans.append((fence_start, len(text) if line_end < 0 else line_end))
            fence = None
    if fence is not None:
        spans.append((fence_start, len(text)))
    return spans


def _inside(i: int, spans: list[tuple[int, int]]) -> bool:
    return any(s <= i < e for s, e in spans)


def _skip_ws(text: str, i: int) -> int:
    m = _WS.match(text, i)
    return m.end() if m else i


def _schema_types(tools: Mapping[str, Any] | None, name: str, param: str) -> list[str]:
    """The JSON-schema types of one parameter (empty: untyped)."""
    if not tools:
        return []
    schema = tools.get(name)
    props = schema.get("properties") if isinstance(schema, dict) else None
    prop = props.get(param) if isinstance(props, dict) else None
    return _types_of(prop)


def _types_of(schema: Any) -> list[str]:
    """The types a JSON schema admits: its ``type`` (a name or a list), else those of each
    ``anyOf`` / ``oneOf`` branch in order (pydantic writes ``Optional[int]`` as ``{"anyOf":
    [{"type": "integer"}, {"type": "null"}]}``); empty when untyped."""
    if not isinstance(schema, dict):
        return []
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    out: list[str] = []
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list):
            out += [t for b in branches for t in _types_of(b) if t not in out]
    return out


_MISSING: Any = object()


def _convert(value: str, types: list[str]) -> Any:
    """A raw parameter value typed by its schema types (the first that converts), else the string."""
    for kind in types:
        if kind == "string":
            return value
        s = value.strip()
        if kind == "boolean" and s.lower() in ("true", "false"):
            return s.lower() == "true"
        if kind == "null" and s.lower() in ("null", "none"):
            return None
        if kind in ("integer", "number", "object", "array"):
            try:
                decoded = json.loads(s)
            except ValueError:
                continue
            if kind == "integer" and isinstance(decoded, int) and not isinstance(decoded, bool):
                return decoded
            if kind == "integer" and isinstance(decoded, float) and decoded.is_integer():
                return int(decoded)
            if kind == "number" and isinstance(decoded, int | float) and not isinstance(decoded, bool):
                return decoded
            if kind == "object" and isinstance(decoded, dict):
                return decoded
            if kind == "array" and isinstance(decoded, list):
                return decoded
    return value


def _known(name: str, tools: Mapping[str, Any] | None) -> bool:
    return bool(_NAME.match(name)) and (not tools or name in tools)


def _hermes(text: str, i: int, tools: Mapping[str, Any] | None) -> tuple[str, dict[str, Any], int] | None:
    """A JSON block whose body starts at ``i`` (after ``<tool_call>``): (name, arguments, end)."""
    j = _skip_ws(text, i)
    try:
        obj, k = _DECODER.raw_decode(text, j)
    except ValueError:
        return None
    k = _skip_ws(text, k)
    if not text.startswith(_CLOSE, k) or not isinstance(obj, dict):
        return None
    name, args = obj.get("name"), obj.get("arguments", _MISSING)
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(name, str) or not isinstance(args, dict) or not _known(name, tools):
        return None
    return name, args, k + len(_CLOSE)


def _function(text: str, i: int, tools: Mapping[str, Any] | None) -> tuple[str, dict[str, Any], int] | None:
    """A ``<function=NAME>`` block starting at ``i``: (name, arguments, end after ``</function>``)."""
    head = i + len("<function=")
    gt = text.find(">", head)
    if gt < 0:
        return None
    name = text[head:gt].strip()
    if not _known(name, tools):
        return None
    args: dict[str, Any] = {}
    k = gt + 1
    while True:
        k = _skip_ws(text, k)
        if text.startswith(_FUNC_CLOSE, k):
            return name, args, k + len(_FUNC_CLOSE)
        if not text.startswith("<parameter=", k):
            return None
        pgt = text.find(">", k)
        close = text.find(_PARAM_CLOSE, pgt + 1) if pgt >= 0 else -1
        if close < 0:
            return None
        param = text[k + len("<parameter=") : pgt].strip()
        if not param or "<" in param or "\n" in param or param in args:
            return None
        value = text[pgt + 1 : close]
        value = value[2:] if value.startswith("\r\n") else value[1:] if value.startswith("\n") else value
        value = value[:-2] if value.endswith("\r\n") else value[:-1] if value.endswith("\n") else value
        args[param] = _convert(value, _schema_types(tools, name, param))
        k = close + len(_PARAM_CLOSE)


def _block(text: str, i: int, tools: Mapping[str, Any] | None) -> TextCall | None:
    """The block starting at ``i`` (an opening tag), or None when it is not complete and well formed."""
    if text.startswith(_OPEN, i):
        j = _skip_ws(text, i + len(_OPEN))
        if text.startswith("<function=", j):
            found = _function(text, j, tools)
            if found is None:
                return None
            k = _skip_ws(text, found[2])
            if not text.startswith(_CLOSE, k):
                return None
            return TextCall(found[0], found[1], i, k + len(_CLOSE), "xml")
        hermes = _hermes(text, i + len(_OPEN), tools)
        return None if hermes is None else TextCall(hermes[0], hermes[1], i, hermes[2], "hermes")
    found = _function(text, i, tools)
    if found is None:
        return None
    end = found[2]
    k = _skip_ws(text, end)
    if text.startswith(_CLOSE, k):  # a stray closing tag
        end = k + len(_CLOSE)
    return TextCall(found[0], found[1], i, end, "xml")


def first_open(text: str) -> int | None:
    """Index of the first opening tag outside reasoning and fenced code, or None."""
    spans = _excluded(text)
    for m in _BLOCK_START.finditer(text):
        if not _inside(m.start(), spans):
            return m.start()
    return None


def find_calls(text: str, tools: Mapping[str, Any] | None = None) -> Found | None:
    """The calls written in ``text`` (an assistant message's content), or None.

    ``tools``: the request's offered tools, name → parameters JSON schema; when given (non-empty)
    only those names are calls and parameters are typed by their schema. Rules: module docstring.
    """
    start = first_open(text)
    if start is None:
        return None
    calls: list[TextCall] = []
    i = start
    while True:
        call = _block(text, i, tools)
        if call is None:
            return None
        calls.append(call)
        i = _skip_ws(text, call.end)
        while text.startswith(_CLOSE, i):  # stray closing tags between and after blocks
            i = _skip_ws(text, i + len(_CLOSE))
        if i >= len(text):
            return Found(tuple(calls), text[:start])
        if not text.startswith(OPEN_TAGS, i):
            return None


def tool_responses(text: str) -> list[str] | None:
    """The results of a user message made only of ``<tool_response>…</tool_response>`` blocks
    (whitespace between them), each with one leading and one trailing newline stripped, in
    order; None when the text holds anything else (then it is what a user said)."""
    out: list[str] = []
    pos = 0
    for m in _RESPONSE.finditer(text):
        if text[pos : m.start()].strip():
            return None
        value = m.group(1)
        value = value[1:] if value.startswith("\n") else value
        out.append(value[:-1] if value.endswith("\n") else value)
        pos = m.end()
    if not out or text[pos:].strip():
        return None
    return out


def response_spans(text: str) -> list[tuple[int, int]]:
    """The inner spans (after the stripped newlines) of each ``<tool_response>`` block of ``text``."""
    spans: list[tuple[int, int]] = []
    for m in _RESPONSE.finditer(text):
        s, e = m.span(1)
        if text.startswith("\n", s) and e > s:
            s += 1
        if e > s and text[e - 1] == "\n":
            e -= 1
        spans.append((s, e))
    return spans


def _flat(tools: list[Any]) -> list[Any]:
    """Chat and Responses tools as they are; a Gemini tool's ``functionDeclarations`` each as one
    tool (``parametersJsonSchema``, what Gemini CLI sends, read as ``parameters``)."""
    out: list[Any] = []
    for t in tools:
        declared = t.get("functionDeclarations") if isinstance(t, dict) else None
        if not isinstance(declared, list):
            out.append(t)
            continue
        for d in declared:
            if isinstance(d, dict) and "parameters" not in d and "parametersJsonSchema" in d:
                d = {**d, "parameters": d["parametersJsonSchema"]}
            out.append(d)
    return out


def offered_tools(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The request's ``tools`` as name → parameters schema (chat ``{"type": "function", "function":
    {...}}``, the Responses API's flat ``{"type": "function", "name": …}`` and the Gemini API's
    ``{"functionDeclarations": [{"name", "parametersJsonSchema" or "parameters"}, …]}``), None when
    it offers none. A tool without a schema maps to ``{}``."""
    tools = body.get("tools")
    if not isinstance(tools, list):
        return None
    out: dict[str, Any] = {}
    for t in _flat(tools):
        if not isinstance(t, dict):
            continue
        fn = t.get("function") if isinstance(t.get("function"), dict) else t
        name = fn.get("name")
        if isinstance(name, str) and name:
            params = fn.get("parameters")
            out[name] = params if isinstance(params, dict) else {}
    return out or None
