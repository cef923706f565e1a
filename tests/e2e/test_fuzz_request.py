"""Fuzzing the request side: random chat-completion bodies through
:func:`proxy.request.rewrite.decide_request`, the pure function the server runs on every chat request.

Bodies: messages of every role (and unknown ones), tool calls with arguments as JSON strings,
objects or invalid JSON, tool results, content as a string, an array of parts, null or missing,
unicode with astral characters and lone surrogates (written as JSON escapes, ``"\\udcff"``, as
Python's ``json.dumps`` does), numbers no float holds as written (``18446744073709551617``,
``1e400``, ``-0.0``, ``1.5e-300``), nesting up to 2,000 levels, unknown fields; serialized by a
small writer here with varied whitespace (compact, spaced, indented), ``ensure_ascii`` on or off
and escapes where none are needed (``"c\\u006fn\\u0074en\\u0074"``), which also records the byte
span of every message. A looping tail (the same call and result again and again) makes the guards
act often enough.

Properties:
- :func:`decide_request` never raises;
- no change: the body returned is the very ``raw`` object; when the body was not read, the reason
  (``unguarded``: counted by the server) is the true one;
- a change: the output is valid JSON (UTF-8, no ``NaN``/``Infinity``) and, read with Python's
  ``json`` (exact big integers, surrogates kept), equals the input with exactly the documented
  edits (:func:`expected_body`); every byte outside the edited messages is unchanged: the bytes
  before the first edited message, after the last one, and each untouched message's own bytes;
- values the guards never read (unknown fields, ``tools``, ``metadata``) change nothing: with
  them, the decision is the one made without them, however deep or odd they are;
- through the real server: the upstream receives exactly what :func:`decide_request` makes, the
  agent the upstream's bytes, and ``internal_errors``/``unguarded`` count what they should.

Known bugs found here are pinned at the end as strict xfails (and kept out of the strategies,
which say so where they leave them out). Settings: derandomized, bounded examples (the file runs
in well under 30 s; a failure's shrinking can take minutes).
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from proxy.config import Config, build
from proxy.core.actions import Action, Remind, Withhold
from proxy.core.effects import progress_rules
from proxy.edge.keys import STATS_KEY
from proxy.guards import build_guards
from proxy.request.rewrite import decide_request
from tests.helpers.proxy_server import serve


def _guards(cfg: Config) -> tuple[Any, ...]:
    return tuple(build_guards(cfg.guards, *progress_rules(cfg.progress)))


CFG = Config()
#: default guards; and the same with reminders appended to the tool result (``tool_suffix``)
GUARD_SETS = (
    _guards(CFG),
    _guards(build(Config, {"guards": {"repeat_reminder": {"inject_as": "tool_suffix"}}})),
)
HEADERS = CFG.conversation_key.headers

FUZZ = settings(
    derandomize=True,
    deadline=None,
    max_examples=150,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# --- a JSON writer with varied whitespace that records where each message is -------------------


@dataclass(frozen=True)
class Raw:
    """A JSON value written as this exact text (numbers no Python float or int round-trips as
    written, nesting too deep to build as objects)."""

    text: str


@dataclass(frozen=True)
class Style:
    ensure_ascii: bool
    indent: int | None  # None: one line
    item_sep: str  # "," or ", " (one line only)
    key_sep: str  # ":", ": " or " : "
    pad: str  # whitespace around the document
    escapes: bool = False  # "o", "s", "t" and "/" as escapes in every string: "r\u006fle", "\/"


_SURROGATE = re.compile("[\ud800-\udfff]")


_ESCAPES = {"o": "\\u006f", "s": "\\u0073", "t": "\\u0074", "/": "\\/"}


def _string(s: str, style: Style) -> bytes:
    if style.escapes:  # keys too: the proxy must find "content" written as "c\u006fn\u0074en\u0074"
        inner = "".join(_ESCAPES.get(c) or json.dumps(c, ensure_ascii=style.ensure_ascii)[1:-1] for c in s)
        text = f'"{inner}"'
    else:
        text = json.dumps(s, ensure_ascii=style.ensure_ascii)
    # a lone surrogate cannot be UTF-8: it is written as the escape Python's ensure_ascii uses
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text).encode()


def _dump(
    v: Any, style: Style, level: int, out: bytearray, spans: list[tuple[int, int]] | None = None
) -> None:
    if isinstance(v, Raw):
        out += v.text.encode()
    elif isinstance(v, str):
        out += _string(v, style)
    elif v is None or isinstance(v, (bool, int, float)):
        out += json.dumps(v).encode()
    elif isinstance(v, (list, dict)):
        opening, closing = (b"[", b"]") if isinstance(v, list) else (b"{", b"}")
        items = list(v.items()) if isinstance(v, dict) else list(v)
        out += opening
        if not items:
            out += closing
            return
        if style.indent is None:
            sep, before, after = style.item_sep.encode(), b"", b""
        else:
            inner = b"\n" + b" " * (style.indent * (level + 1))
            sep, before, after = b"," + inner, inner, b"\n" + b" " * (style.indent * level)
        out += before
        for i, item in enumerate(items):
            if i:
                out += sep
            start = len(out)
            if isinstance(v, dict):
                key, value = item
                out += _string(key, style) + style.key_sep.encode()
                _dump(value, style, level + 1, out)
            else:
                _dump(item, style, level + 1, out)
            if spans is not None:
                spans.append((start, len(out)))
        out += after + closing
    else:  # pragma: no cover - the strategies make nothing else
        raise TypeError(type(v))


def serialize(body: dict[str, Any], style: Style) -> tuple[bytes, list[tuple[int, int]]]:
    """``body`` as JSON bytes in ``style``, and the byte span of each element of its top-level
    ``messages`` list (empty when there is none)."""
    out = bytearray(style.pad.encode())
    spans: list[tuple[int, int]] = []
    items = list(body.items())
    out += b"{"
    if style.indent is None:
        sep, before, after = style.item_sep.encode(), b"", b""
    else:
        inner = b"\n" + b" " * style.indent
        sep, before, after = b"," + inner, inner, b"\n"
    out += before if items else b""
    for i, (key, value) in enumerate(items):
        if i:
            out += sep
        out += _string(key, style) + style.key_sep.encode()
        if key == "messages" and isinstance(value, list):
            _dump(value, style, 1, out, spans)
        else:
            _dump(value, style, 1, out)
    out += (after if items else b"") + b"}" + style.pad.encode()
    return bytes(out), spans


styles = st.builds(
    Style,
    ensure_ascii=st.booleans(),
    indent=st.sampled_from([None, None, 1, 2, 4]),
    item_sep=st.sampled_from([",", ", "]),
    key_sep=st.sampled_from([":", ": ", " : "]),
    pad=st.sampled_from(["", "", " ", "\n", " \r\n\t"]),
    escapes=st.integers(0, 4).map(lambda i: i == 0),
)


# --- reading bodies as Python's json does --------------------------------------------------------


@contextmanager
def _deep() -> Iterator[None]:
    """Room for 2,000 levels of nesting in ``json.loads`` and ``==``."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 20_000))
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def _refuse(name: str) -> Any:
    raise AssertionError(f"{name} is not JSON")


def pyload(raw: bytes) -> Any:
    """Strict JSON: UTF-8, no ``NaN``/``Infinity`` literals; big integers exact, surrogates kept."""
    with _deep():
        return json.loads(raw.decode("utf-8"), parse_constant=_refuse)


def _append_text(content: Any, text: str) -> Any:
    if isinstance(content, list):
        return [*content, {"type": "text", "text": text}]
    if isinstance(content, str) and content:
        return f"{content}\n\n{text}"
    return text


def expected_body(body: dict[str, Any], actions: tuple[Action, ...]) -> dict[str, Any]:
    """``body`` with the documented edits (proxy.dialects.openai_chat.apply): withheld results'
    content becomes the first withholding action's text; reminders for one position are joined by a
    blank line and become one user message inserted after it, or are appended to its content
    (``tool_suffix``, after a withhold's text)."""
    messages = body["messages"]
    n = len(messages)
    done: set[int] = set()
    for a in actions:
        if isinstance(a, Withhold) and 0 <= a.position < n and a.position not in done:
            messages[a.position]["content"] = a.text
            done.add(a.position)
    grouped: dict[int, list[Remind]] = {}
    for a in actions:
        if isinstance(a, Remind) and 0 <= a.after < n:
            grouped.setdefault(a.after, []).append(a)
    for after in sorted(grouped, reverse=True):
        group = grouped[after]
        text = "\n\n".join(r.text for r in group)
        if group[0].delivery == "tool_suffix":
            messages[after]["content"] = _append_text(messages[after].get("content"), text)
        else:
            messages.insert(after + 1, {"role": "user", "content": text})
    return body


def edits(actions: tuple[Action, ...], n: int) -> tuple[set[int], set[int]]:
    """(messages whose content is edited, messages after which a user message is inserted)."""
    edited = {a.position for a in actions if isinstance(a, Withhold) and 0 <= a.position < n}
    grouped: dict[int, Remind] = {}
    for a in actions:
        if isinstance(a, Remind) and 0 <= a.after < n:
            grouped.setdefault(a.after, a)
    edited |= {p for p, r in grouped.items() if r.delivery == "tool_suffix"}
    inserted = {p for p, r in grouped.items() if r.delivery != "tool_suffix"}
    return edited, inserted


def _check_unguarded(raw: bytes, reason: str) -> None:
    """An unread body must be what its reason says: not JSON, nested past the decoders, or JSON
    that is not a chat request (an object whose ``messages`` is a list of objects)."""
    try:
        body = pyload(raw)
    except (ValueError, AssertionError):  # not strict JSON (AssertionError: NaN/Infinity)
        assert reason in ("not_json", "nesting"), reason
        return
    if reason == "not_chat":
        messages = body.get("messages") if isinstance(body, dict) else None
        assert not (isinstance(messages, list) and all(isinstance(m, dict) for m in messages))
    else:
        assert reason == "nesting", f"valid JSON refused as {reason}"
        assert b"[" * 900 in raw or b'{"a":' * 900 in raw or b'[{"k":' * 450 in raw


def check_decision(raw: bytes, spans: list[tuple[int, int]], guards: tuple[Any, ...]) -> Any:
    """Run decide_request on ``raw`` and check every property; returns the decision."""
    decision = decide_request(raw, {}, guards, HEADERS)
    if not decision.changed:
        assert decision.body is raw
        if decision.transcript is not None:  # no action dropped: each one's position is not there
            edited, inserted = edits(decision.actions, decision.transcript.message_count)
            assert not edited and not inserted, "actions that apply were not written"
        if decision.unguarded is not None:  # said why, and only when it is so
            assert decision.actions == ()
            _check_unguarded(raw, decision.unguarded)
        return decision
    out = decision.body
    assert decision.actions
    got = pyload(out)  # valid JSON
    body = pyload(raw)
    assert isinstance(body, dict)
    n = len(body["messages"])
    assert len(spans) == n
    with _deep():
        assert got == expected_body(body, decision.actions)
    edited, inserted = edits(decision.actions, n)
    assert edited or inserted
    first = min([spans[p][0] for p in edited] + [spans[p][1] for p in inserted])
    last = max([spans[p][1] for p in edited | inserted])
    assert out[:first] == raw[:first], "bytes before the first edited message changed"
    assert out.endswith(raw[last:]), "bytes after the last edited message changed"
    cursor = first
    for p, (a, b) in enumerate(spans):
        if p in edited or b <= first:
            continue
        found = out.find(raw[a:b], cursor)
        assert found >= 0, f"untouched message {p} not byte-identical in the output"
        cursor = found + (b - a)
    return decision


# --- strategies ------------------------------------------------------------------------------

_chars = st.one_of(
    st.characters(codec="utf-8"),
    st.sampled_from(["\udcff", "\ud800", "\udbff", "\udc00", "\ud83d", "\ude00"]),  # lone surrogates
    st.sampled_from(["😀", "𝄞", "\U0010ffff", "\x00", "\x1f", "\u2028", '"', "\\", "/", "\ufeff", "é", "日"]),
)
weird_text = st.text(_chars, max_size=24)
#: text orjson reads (no surrogates): the part of a body the guards read, where it must be read
plain_text = st.text(st.characters(codec="utf-8"), max_size=24)

NUMBERS = [
    "18446744073709551617",
    "-18446744073709551617",
    "1" + "0" * 400,
    "1e400",
    "-1e400",
    "1E+400",
    "-0.0",
    "-0",
    "1.5e-300",
    "1e-400",
    "0.1",
    "1E+2",
    "2.50",
    "1.0",
    "123456789012345678901234567890.5",
    "3.141592653589793238462643383279502884",
]
BIG_INTS = ("18446744073709551617", "-18446744073709551617")
raw_numbers = st.sampled_from(NUMBERS).map(Raw)


@functools.cache
def nested(max_depth: int, big: bool = True) -> st.SearchStrategy[Raw]:
    def build_nest(args: tuple[int, int, str]) -> Raw:
        depth, kind, leaf = args
        if kind == 0:
            return Raw("[" * depth + leaf + "]" * depth)
        if kind == 1:
            return Raw('{"a":' * depth + leaf + "}" * depth)
        return Raw('[{"k":' * (depth // 2) + leaf + "}]" * (depth // 2))

    deep = [d for d in (500, 1023, 1024, 1025, 2000) if d <= max_depth]
    depths = st.integers(1, max_depth) | st.sampled_from(deep) if deep else st.integers(1, max_depth)
    return st.tuples(
        depths, st.integers(0, 2), st.sampled_from(["0", *(BIG_INTS if big else ()), '"\\udcff"', "1e400"])
    ).map(build_nest)


def nested_raw(depth: int) -> Raw:
    return Raw("[" * depth + "0" + "]" * depth)


@functools.cache  # built once: building a recursive strategy costs more than drawing from it
def junk(text: st.SearchStrategy[str], max_depth: int, big: bool = True) -> st.SearchStrategy[Any]:
    """Any JSON value; ``big``: with integers past 64 bits (orjson reads them as floats, the
    standard library exactly)."""
    leaf = st.one_of(
        st.none(),
        st.booleans(),
        st.integers() if big else st.integers(-(2**63), 2**64 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        text,
        raw_numbers if big else st.sampled_from([n for n in NUMBERS if n not in BIG_INTS]).map(Raw),
        nested(max_depth, big),
    )
    return st.recursive(
        leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(text, c, max_size=3), max_leaves=6
    )


def _arguments_string(value: Any) -> str:
    out = bytearray()
    _dump(value, Style(False, None, ",", ":", ""), 0, out)
    return out.decode()


MISSING: Any = object()
NAMES = ["read_file", "bash", "grep", "edit_file", "search", ""]
IDS = ["call_1", "call_2", "call_3", "c", ""]


#: arguments nested deeper than this make the guards raise (RecursionError from about 493 levels:
#: test_known_bug_arguments_nested_500_levels_deep): kept out until fixed
ARGUMENTS_DEPTH = 400


@st.composite
def arguments(draw: st.DrawFn, text: st.SearchStrategy[str], max_depth: int, big: bool = True) -> Any:
    value = draw(junk(text, min(max_depth, ARGUMENTS_DEPTH), big))
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return value  # an object (or anything) instead of a string
    if kind == 1:
        return draw(st.sampled_from(["", "{", '{"path": ', "null", "[1,", "{'a': 1}", "not json"]))
    if kind == 2:
        return MISSING
    return _arguments_string(value)


@st.composite
def tool_calls(draw: st.DrawFn, text: st.SearchStrategy[str], max_depth: int, big: bool = True) -> Any:
    out: list[Any] = []
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.integers(0, 9))
        if kind == 0:
            out.append(draw(junk(text, max_depth, big)))  # not a call at all
            continue
        fn: dict[str, Any] = {"name": draw(st.one_of(st.sampled_from(NAMES), text))}
        args = draw(arguments(text, max_depth, big))
        if args is not MISSING:
            fn["arguments"] = args
        call: dict[str, Any] = {"id": draw(st.one_of(st.sampled_from(IDS), text)), "type": "function"}
        call["function"] = fn if kind != 1 else draw(junk(text, max_depth, big))
        out.append(call)
    return out


@st.composite
def contents(draw: st.DrawFn, text: st.SearchStrategy[str], max_depth: int, big: bool = True) -> Any:
    kind = draw(st.integers(0, 6))
    if kind <= 2:
        return draw(text)
    if kind == 3:
        parts = st.one_of(
            st.builds(lambda t: {"type": "text", "text": t}, text),
            st.just({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}),
            junk(text, max_depth, big),
        )
        return draw(st.lists(parts, max_size=3))
    if kind == 4:
        return None
    if kind == 5:
        return MISSING
    return draw(junk(text, max_depth, big))


@st.composite
def messages(
    draw: st.DrawFn, text: st.SearchStrategy[str], max_depth: int, big: bool = True
) -> dict[str, Any]:
    role = draw(
        st.sampled_from(["system", "developer", "user", "assistant", "tool", "function", "critic", None])
    )
    msg: dict[str, Any] = {}
    if role is not None:
        msg["role"] = role
    content = draw(contents(text, max_depth, big))
    if content is not MISSING:
        msg["content"] = content
    if role == "assistant":
        kind = draw(st.integers(0, 3))
        if kind == 1:
            msg["tool_calls"] = draw(tool_calls(text, max_depth, big))
        elif kind == 2:
            fn: dict[str, Any] = {"name": draw(st.sampled_from(NAMES))}
            args = draw(arguments(text, max_depth, big))
            if args is not MISSING:
                fn["arguments"] = args
            msg["function_call"] = fn
    if role == "tool" and draw(st.booleans()):
        msg["tool_call_id"] = draw(st.one_of(st.sampled_from(IDS), text))
    if role in ("tool", "function") and draw(st.booleans()):
        msg["name"] = draw(st.sampled_from(NAMES))
    return msg


@st.composite
def loop_tail(draw: st.DrawFn, text: st.SearchStrategy[str], odd: bool = False) -> list[dict[str, Any]]:
    """A user prompt and ``n`` steps making the same call with the same result: the guards act."""
    n = draw(st.integers(0, 9))
    if n == 0:
        return []
    name = draw(
        st.sampled_from(["read_file", "bash", "read_\udcff", "日本😀"] if odd else ["read_file", "bash"])
    )
    args = draw(
        st.sampled_from(
            ['{"path": "app.py"}', '{"command":"ls"}', '{"path":"\\u00e9.py", "n": 1.0}']
            + (['{"path": "\\udcff", "n": 18446744073709551617}', '{"n": 1e400}'] if odd else [])
        )
    )
    # the result as the model got it each time: a string, text parts, null, no content at all
    shape = draw(st.integers(0, 5))
    result = draw(text)
    content: Any = {0: [{"type": "text", "text": result}], 1: None, 2: MISSING}.get(shape, result)
    texts = draw(st.sampled_from([None, "Let me look.", ""]))
    out: list[dict[str, Any]] = [{"role": "user", "content": "Fix the bug in app.py"}]
    for i in range(1, n + 1):
        cid = f"loop_{i}"
        call = {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
        out.append({"role": "assistant", "content": texts, "tool_calls": [call]})
        if i < n or draw(st.booleans()):
            res = {"role": "tool", "tool_call_id": cid, "content": content}
            if content is MISSING:
                del res["content"]
            out.append(res)
    return out


def _shuffled(draw: st.DrawFn, items: list[tuple[str, Any]]) -> dict[str, Any]:
    return dict(draw(st.permutations(items)) if items else [])


@st.composite
def bodies(draw: st.DrawFn) -> dict[str, Any]:
    """Anything: every message may hold odd text, numbers and nesting."""
    text, depth = weird_text, 2000
    msgs = draw(st.lists(messages(text, depth), max_size=6))
    msgs += draw(loop_tail(text, odd=True))
    msgs += draw(st.lists(messages(text, depth), max_size=2))
    for m in msgs:
        if draw(st.integers(0, 7)) == 0:
            # not "type": a tool message's "type" nested ~1,000 deep crashes the edit (see
            # test_known_bug_a_deep_type_member_on_an_edited_message)
            m[draw(st.sampled_from(["x_meta", "cache_control", "reasoning_content"]))] = draw(
                junk(text, depth)
            )
    items: list[tuple[str, Any]] = [("model", draw(text)), ("messages", msgs)]
    for key in draw(
        st.lists(st.sampled_from(["stream", "tools", "temperature", "seed", "metadata", "n"]), unique=True)
    ):
        items.append((key, draw(junk(text, depth))))
    return _shuffled(draw, items)


@dataclass(frozen=True)
class Pair:
    """A body with odd values where the guards never read (``extra``) and the same without."""

    extra: dict[str, Any]
    clean: dict[str, Any]


@st.composite
def pairs(draw: st.DrawFn) -> Pair:
    text = plain_text
    msgs = draw(st.lists(messages(text, 50, big=False), max_size=5)) + draw(loop_tail(text))
    extra_msgs = []
    for m in msgs:
        m2 = dict(m)
        if draw(st.integers(0, 2)) == 0:
            # odd values in unknown message fields; nesting kept below the stdlib decoder's limit
            # (a message nested deeper than any decoder reads makes the body unreadable, on purpose)
            m2[draw(st.sampled_from(["x_meta", "cache_control", "annotations"]))] = draw(
                junk(weird_text, 200)
            )
            m2 = _shuffled(draw, list(m2.items()))
        extra_msgs.append(m2)
    base: list[tuple[str, Any]] = [("model", "m"), ("stream", draw(st.booleans()))]
    extra: list[tuple[str, Any]] = [
        (key, draw(junk(weird_text, 2000)))
        for key in draw(
            st.lists(st.sampled_from(["tools", "metadata", "seed", "temperature", "logit_bias"]), unique=True)
        )
    ]
    return Pair(
        extra=_shuffled(draw, [*base, ("messages", extra_msgs), *extra]),
        clean=dict([*base, ("messages", msgs)]),
    )


# --- properties ------------------------------------------------------------------------------


@FUZZ
@given(bodies(), styles, st.sampled_from(GUARD_SETS))
def test_random_bodies(body: dict[str, Any], style: Style, guards: tuple[Any, ...]) -> None:
    raw, spans = serialize(body, style)
    check_decision(raw, spans, guards)


def _pinned_loop(odd: bool) -> list[dict[str, Any]]:
    """A looping conversation (reminders and withheld results) whose unknown fields carry, when
    ``odd``, big integers, 1e400, -0.0, 1.5e-300 and a lone surrogate."""

    def extra(value: Any) -> dict[str, Any]:
        return {"x_meta": value} if odd else {}

    out: list[dict[str, Any]] = [
        {"role": "system", "content": "sys 😀", **extra(Raw("18446744073709551617"))},
        {"role": "user", "content": "hi", **extra([Raw("1e400"), Raw("-0.0"), Raw("1.5e-300"), "\udcff"])},
    ]
    for i in range(1, 8):
        fn = {"name": "read_file", "arguments": '{"path": "a"}'}
        out.append({"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}", "function": fn}]})
        out.append({"role": "tool", "tool_call_id": f"c{i}", "content": "same", **extra(Raw("2.50"))})
    return out


@settings(FUZZ, max_examples=80)
@example(
    Pair(
        extra={"model": "m", "messages": _pinned_loop(True), "seed": Raw("18446744073709551617")},
        clean={"model": "m", "messages": _pinned_loop(False)},
    ),
    Style(True, None, ",", ":", ""),
)
@example(
    Pair(
        extra={"model": "m", "tools": nested_raw(2000), "messages": _pinned_loop(False)},
        clean={"model": "m", "messages": _pinned_loop(False)},
    ),
    Style(False, 2, ",", ": ", "\n"),
)
@given(pairs(), styles)
def test_fields_the_guards_never_read_change_nothing(pair: Pair, style: Style) -> None:
    raw, spans = serialize(pair.extra, style)
    clean, _ = serialize(pair.clean, Style(False, None, ",", ":", ""))
    for guards in GUARD_SETS:
        want = decide_request(clean, {}, guards, HEADERS)
        got = check_decision(raw, spans, guards)
        assert (got.actions, got.changed, got.conversation) == (want.actions, want.changed, want.conversation)


not_chat = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(
        [
            b"",
            b"null",
            b"[]",
            b"{}",
            b'"x"',
            b"1e400",
            b'{"messages": {}}',
            b'{"messages": [1]}',
            b'{"messages": [{"role": "user", "content": NaN}]}',
            b'{"messages": [{"role": "user", "content": Infinity}]}',
            b'{"messages": [], "x": 1,}',
            # (not b"\xef\xbb\xbf{}": see test_known_bug_a_body_with_a_bom)
            b'{"messages": [{"role": "tool"}]}',
            b'{"messages": [{"role": "user", "content": "\\ud800"}]',
        ]
    ),
    st.builds(lambda d: b"[" * d + b"]" * d, st.integers(1, 3000)),
    st.builds(lambda d: b'{"messages": [' + b"[" * d + b"]" * d + b"]}", st.integers(1, 3000)),
    st.builds(lambda b: b + b"garbage", st.just(orjson.dumps({"model": "m", "messages": []}))),
)


@settings(FUZZ, max_examples=100)
@given(not_chat)
def test_bodies_that_are_not_chat_requests_pass_unchanged(raw: bytes) -> None:
    decision = decide_request(raw, {}, GUARD_SETS[0], HEADERS)
    assert decision.body is raw
    assert decision.changed is False
    assert decision.actions == ()
    if decision.unguarded is None:  # read: then it is a chat request
        assert decision.transcript is not None
    else:  # counted (unguarded_requests{reason}), for the reason it gives
        _check_unguarded(raw, decision.unguarded)


# --- through the real server -----------------------------------------------------------------

#: the upstream's answer, with number text a re-serialization would change
ANSWER = (
    b'{"id": "chatcmpl-fuzz", "object": "chat.completion", "created": 1700000000, "model": "m",\n'
    b' "choices": [{"index": 0, "message": {"role": "assistant", "content": "fuzz answer 7f3a \\u00e9"},'
    b' "finish_reason": "stop"}],\n'
    b' "usage": {"prompt_tokens": 18446744073709551617, "completion_tokens": 1.0, "total_tokens": 2E0}}\n'
)


async def _through_the_server(raws: list[bytes]) -> None:
    received: list[bytes] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        received.append(await request.read())
        return web.Response(body=ANSWER, content_type="application/json")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    want: list[bytes] = []
    fail_opens = 0
    unguarded: Counter[str] = Counter()
    try:
        async with serve(None, f"http://127.0.0.1:{runner.addresses[0][1]}/v1") as (base, proxy):
            async with aiohttp.ClientSession() as session:
                for i, raw in enumerate(raws):
                    headers = {"x-session-id": f"fuzz-{i}"}
                    try:
                        decision = decide_request(raw, headers, GUARD_SETS[0], HEADERS)
                        want.append(decision.body)
                        if decision.unguarded:
                            unguarded[decision.unguarded] += 1
                    except Exception:
                        want.append(raw)  # the server fails open: the original bytes
                        fail_opens += 1
                    url = f"{base}/v1/chat/completions"
                    async with session.post(
                        url, data=raw, headers={**headers, "Content-Type": "application/json"}
                    ) as r:
                        assert r.status == 200
                        assert await r.read() == ANSWER  # the agent gets the upstream's bytes
            stats = proxy[STATS_KEY]
            assert received == want  # the upstream gets exactly what decide_request makes
            assert stats.internal_errors == fail_opens
            assert dict(getattr(stats, "unguarded", {})) == dict(unguarded)
            assert stats.guarded_requests == len(raws) - sum(unguarded.values())
    finally:
        await runner.cleanup()


@settings(FUZZ, max_examples=20)
@given(
    st.lists(
        st.one_of(st.tuples(bodies(), styles).map(lambda t: serialize(*t)[0]), not_chat),
        min_size=1,
        max_size=3,
    )
)
def test_through_the_real_server(raws: list[bytes]) -> None:
    asyncio.run(_through_the_server(raws))


# --- bugs found here (at c865bfe): fixed ones pinned as plain tests, the open one as a strict xfail ---


def _looping_body() -> dict[str, Any]:
    return {"model": "m", "messages": _pinned_loop(False)}


def test_a_body_with_a_bom_is_not_json() -> None:
    """A UTF-8 BOM before a looping body (found here: the stdlib fallback used to skip it, then
    finding the members started at the BOM, a fail-open): JSON has no BOM (RFC 8259 §8.1), so the
    body goes unchanged, counted as ``not_json``."""
    raw = b"\xef\xbb\xbf" + orjson.dumps(_looping_body())
    decision = decide_request(raw, {}, GUARD_SETS[0], HEADERS)
    assert (decision.body is raw, decision.actions, decision.unguarded) == (True, (), "not_json")


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32"])
def test_a_body_not_in_utf8_is_not_json(encoding: str) -> None:
    """JSON is UTF-8 (RFC 8259 §8.1); a UTF-16 or UTF-32 body is not JSON to the proxy and must
    pass unchanged (unguarded ``not_json``), but the stdlib fallback decodes it and the splice
    then reads UTF-16 bytes as UTF-8 offsets: AttributeError, a fail-open."""
    raw = json.dumps(_looping_body()).encode(encoding)
    decision = decide_request(raw, {}, GUARD_SETS[0], HEADERS)
    assert (decision.body is raw, decision.actions, decision.unguarded) == (True, (), "not_json")


def test_a_deep_type_member_on_an_edited_message_is_edited() -> None:
    """A tool result with a ``type`` member nested 990 levels (orjson reads the body: under 1,024)
    is withheld (found here: edits._kind decoded ``type`` with json.loads, past Python's recursion
    limit); only string kinds are read now."""
    deep = b"[" * 990 + b"]" * 990
    raw = orjson.dumps(_looping_body()).replace(b'{"role":"tool"', b'{"type":' + deep + b',"role":"tool"')
    decision = decide_request(raw, {}, GUARD_SETS[0], HEADERS)
    assert decision.changed


@pytest.mark.xfail(strict=True, reason="orjson reads an integer past 64 bits as a float, json exactly")
def test_known_bug_the_conversation_key_depends_on_the_decoder() -> None:
    """The fingerprint key serializes the first system/user content as decoded: an integer past
    64 bits there is a float when orjson read the body and an int when a later value (a lone
    surrogate, 1e400) sent the whole body to the standard library, so one conversation gets two
    keys (DESIGN §4: "the same conversation keeps its key as it grows")."""
    first = b'{"model":"m","messages":[{"role":"system","content":[18446744073709551617]},'
    plain = first + b'{"role":"user","content":"hi"}]}'
    grown = first + b'{"role":"user","content":"hi"},{"role":"user","content":"\\udcff"}]}'
    keys = {decide_request(raw, {}, GUARD_SETS[0], HEADERS).conversation for raw in (plain, grown)}
    assert len(keys) == 1


@pytest.mark.parametrize("form", ["string", "object"])
@pytest.mark.parametrize("depth", [500, 1000])
def test_arguments_nested_500_levels_deep_go_unguarded_as_nesting(depth: int, form: str) -> None:
    """Arguments nested from about 493 levels (as a JSON string or an object; orjson reads up to
    1,024): canonical._normalize recurses two frames a level (RecursionError, though its docstring
    says it never raises), and with that caught echo_loop's walk raises next (from ~600). The
    server fails open and counts it; the loop in the conversation goes unguarded."""
    deep = "[" * depth + "]" * depth
    body = _looping_body()
    for m in body["messages"]:
        for tc in m.get("tool_calls") or []:
            tc["function"]["arguments"] = deep if form == "string" else Raw(deep)
    raw, _ = serialize(body, Style(False, None, ",", ":", ""))
    decision = decide_request(raw, {}, GUARD_SETS[0], HEADERS)
    assert (decision.body is raw, decision.actions, decision.unguarded) == (True, (), "nesting")
