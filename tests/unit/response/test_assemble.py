"""Tool-call delta assembly (proxy.response.assemble): every server quirk of
:mod:`tests.helpers.quirks` as its own fixture."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.response.assemble import AssembledCall, CallAssembler
from proxy.response.sse import SSEFramer
from tests.helpers.quirks import QUIRKS, Quirk


def reads(raw: bytes, size: int) -> list[bytes]:
    return [raw[i : i + size] for i in range(0, len(raw), size)]


def assemble(chunks: list[bytes]) -> tuple[list[AssembledCall], list[str | None]]:
    """Frame ``chunks``, feed every choice-0 delta to one assembler; returns the calls and the
    finish reasons seen."""
    framer = SSEFramer()
    asm = CallAssembler()
    finishes: list[str | None] = []
    for chunk in chunks:
        for ev in framer.feed(chunk):
            if ev.data is None or ev.data == "[DONE]":
                continue
            obj = orjson.loads(ev.data)
            for part in obj.get("choices") or []:
                asm.add(part.get("delta") or {})
                if part.get("finish_reason"):
                    finishes.append(part["finish_reason"])
    return asm.calls, finishes


def as_tuples(calls: list[AssembledCall]) -> list[tuple[str | None, str, str]]:
    return [(c.id, c.name, c.arguments_json()) for c in calls]


@pytest.mark.parametrize("quirk", QUIRKS, ids=[q.name for q in QUIRKS])
@pytest.mark.parametrize("read_size", [1, 3, 7, 1 << 20], ids=["1B", "3B", "7B", "whole"])
def test_quirk_assembles_into_the_right_calls(quirk: Quirk, read_size: int) -> None:
    calls, finishes = assemble(reads(quirk.raw, read_size))
    assert as_tuples(calls) == quirk.expected
    assert finishes == ([quirk.finish] if quirk.finish else [])


def test_split_inside_a_multibyte_character() -> None:
    raw = next(q for q in QUIRKS if q.name == "multibyte_utf8_arguments").raw
    cut = raw.index("本".encode()) + 1
    calls, _ = assemble([raw[:cut], raw[cut:]])
    assert as_tuples(calls)[0][2] == '{"path": "日本/é.txt", "text": "héllo 日本語"}'


def add_all(deltas: list[dict[str, Any]]) -> list[tuple[str | None, str, Any]]:
    asm = CallAssembler()
    for d in deltas:
        asm.add(d)
    return [(c.id, c.name, c.arguments) for c in asm.calls]


def fn(index: int | None = 0, id: str | None = None, **function: Any) -> dict[str, Any]:
    tc: dict[str, Any] = {"function": function}
    if index is not None:
        tc["index"] = index
    if id is not None:
        tc["id"] = id
    return {"tool_calls": [tc]}


@pytest.mark.parametrize(
    ("deltas", "expected"),
    [
        pytest.param(
            [fn(id="a", name="read_file"), fn(name="read_file"), fn(name="read_file")],
            [("a", "read_file", "")],
            id="name_repeated_is_kept_once",
        ),
        pytest.param(
            [fn(id="a", name="read"), fn(name="_file")], [("a", "read_file", "")], id="name_fragments_joined"
        ),
        pytest.param(
            [fn(id="a", name="re"), fn(name="read_file")],
            [("a", "read_file", "")],
            id="cumulative_name_replaces",
        ),
        pytest.param([fn(id="a", name="x"), fn(name="")], [("a", "x", "")], id="empty_name_ignored"),
        pytest.param(
            [fn(id="a", name="x", arguments={"k": 1}), fn(arguments={"k": 2})],
            [("a", "x", {"k": 2})],
            id="a_later_object_replaces",
        ),
        pytest.param(
            [fn(id="a", name="x", arguments={"k": 1}), fn(arguments="")],
            [("a", "x", {"k": 1})],
            id="empty_string_after_object_keeps_object",
        ),
        pytest.param([fn(id="a", name="x", arguments=None)], [("a", "x", "")], id="null_arguments"),
        pytest.param(
            [fn(None, name="x", arguments="{}"), fn(None, arguments="")],
            [(None, "x", "{}")],
            id="no_index_no_id_continues_newest",
        ),
        pytest.param(
            [fn(0, "a", name="x"), fn(0, "b", name="y"), fn(0, "a", arguments="{}")],
            [("a", "x", "{}"), ("b", "y", "")],
            id="index_0_known_id_goes_back_to_its_call",
        ),
        pytest.param(
            [
                {"function_call": {"name": "legacy", "arguments": '{"a"'}},
                {"function_call": {"arguments": ": 1}"}},
            ],
            [(None, "legacy", '{"a": 1}')],
            id="legacy_function_call",
        ),
        pytest.param(
            [{"tool_calls": None}, {"tool_calls": ["junk", 3]}, {"content": "hi"}], [], id="junk_ignored"
        ),
    ],
)
def test_merge_rules(deltas: list[dict[str, Any]], expected: list[tuple[str | None, str, Any]]) -> None:
    assert add_all(deltas) == expected


def test_add_reports_started_calls() -> None:
    asm = CallAssembler()
    assert asm.add(fn(0, "a", name="x")) == 1
    assert asm.add(fn(0, arguments="{}")) == 0
    assert asm.add({"tool_calls": [{"index": 1, "id": "b"}, {"index": 2, "id": "c"}]}) == 2


def test_a_function_call_mirroring_tool_calls_is_not_a_second_call() -> None:
    """llama-cpp-python (0.3.x, named tool choice) sends each call twice in one delta: as
    ``tool_calls`` and as the legacy ``function_call``; that is one call (as a JSON answer reads)."""
    a = CallAssembler()
    fn = {"name": "read_file", "arguments": '{"path": "a"}'}
    started = a.add(
        {
            "tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": fn}],
            "function_call": fn,
        }
    )
    assert started == 1
    assert [(c.id, c.name, c.arguments) for c in a.calls] == [("call_1", "read_file", '{"path": "a"}')]
    assert a.add({"function_call": {"arguments": "x"}}) == 0
    assert a.calls[0].arguments == '{"path": "a"}'
