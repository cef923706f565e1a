"""Gemini answers the response side used to pass unread, no sockets: the JSON-array stream
(``:streamGenerateContent`` without ``alt=sse``) read element by element
(:mod:`proxy.response.json_array`, :class:`proxy.response.gemini_stream.GeminiArrayGuard`), answers
with several candidates counted as unread, and Vertex AI's streamed function-call arguments
(``partialArgs``, ``willContinue``) read as the one call they make."""

from __future__ import annotations

import itertools
import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.config import Config, build
from proxy.response.gemini_stream import (
    CANDIDATES,
    GeminiArrayGuard,
    GeminiStreamGuard,
    _Calls,
    _path,
    decide_json_answer,
)
from proxy.response.json_array import JSONArrayFramer
from tests.helpers.fake_gemini import WRITE_40, fragments
from tests.unit.response.test_gemini_answer import (
    CFG,
    LOOP,
    OTHER,
    STOP,
    TWO,
    USAGE,
    WRITE,
    Judge,
    event,
    with_limits,
)


def element(ev: bytes) -> bytes:
    """The object of an SSE event, as an element of the JSON-array form."""
    return ev.removeprefix(b"data: ").strip()


def array(events: list[bytes], sep: bytes = b"\n,\r\n") -> bytes:
    """The JSON-array form of a stream, as Google writes it (``[{…}\\n,\\r\\n{…}\\n]``)."""
    return b"[" + sep.join(element(e) for e in events) + b"\n]"


def run_array(raw: bytes, judge: Any, cfg: Any = CFG, split: int = 7) -> tuple[bytes, GeminiArrayGuard, bool]:
    guard = GeminiArrayGuard(cfg, judge)
    out = bytearray()
    for i in range(0, len(raw), split):
        o = guard.feed(raw[i : i + split])
        out += o.data
        if o.abort:
            return bytes(out), guard, True
    return bytes(out + guard.finish()), guard, False


def parts_of(answer: bytes) -> list[tuple[list[Any], Any]]:
    """Each element of an array answer as (its parts, finishReason)."""
    out = []
    for obj in orjson.loads(answer):
        cand = obj["candidates"][0]
        out.append(((cand.get("content") or {}).get("parts") or [], cand.get("finishReason")))
    return out


LOOPING = [event([{"text": "Again."}]), event([LOOP]), event([], "STOP")]
#: nothing decides: no cut is on, and the judge stops nothing
OFF = build(
    Config,
    {
        "response": {
            "max_calls_per_response": 0,
            "max_identical_per_response": 0,
            "max_identical_reads_per_response": 0,
            "degenerate_text": {"enabled": False},
        }
    },
)


# --- the framer ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("split", [1, 2, 3, 5, 64, 100_000])
def test_the_array_framer_gives_each_element_with_its_exact_bytes(split: int) -> None:
    tricky = {"candidates": [{"content": {"parts": [{"text": 'a "}" ] \\" {[ é \\\\'}]}, "index": 0}]}
    raw = b'  [{"a": 1}\n,\r\n' + orjson.dumps(tricky) + b' , {"b": [1, {"c": "}"}]}\n]\n'
    framer = JSONArrayFramer()
    events = []
    for i in range(0, len(raw), split):
        events += framer.feed(raw[i : i + split])
    tail = framer.finish()
    assert b"".join(e.raw for e in events) + tail == raw
    assert [json.loads(e.data or "") for e in events] == [{"a": 1}, tricky, {"b": [1, {"c": "}"}]}]
    assert tail == b"\n]\n"


@pytest.mark.parametrize(
    "raw",
    [b'{"a": 1}', b"[1, 2]", b'[{"a": 1}] x', b'[{"a": 1} {"b": 2}]'],
    ids=["no_array", "not_objects", "text_after", "no_comma"],
)
def test_the_array_framer_hands_what_is_no_array_on_as_is(raw: bytes) -> None:
    framer = JSONArrayFramer()
    events = framer.feed(raw)
    assert b"".join(e.raw for e in events) + framer.finish() == raw
    assert events[-1].data == ""  # no JSON reader takes it: the guard relays the rest


# --- the JSON-array stream through the guard -----------------------------------------------------------


@pytest.mark.parametrize("split", [1, 3, 7, 1000])
def test_an_array_answer_nothing_decides_on_goes_out_byte_for_byte(split: int) -> None:
    raw = array([event([{"text": "Look."}]), event([OTHER]), event([], "STOP")])
    out, guard, aborted = run_array(raw, Judge(None), split=split)
    assert (out, aborted, guard.complete, guard.unread) == (raw, False, True, None)


def test_a_looping_array_answer_is_stopped_and_stays_one_array() -> None:
    out, guard, aborted = run_array(array(LOOPING), Judge(STOP))
    assert ([a.kind for a in guard.actions], aborted) == (["stop"], False)
    assert parts_of(out) == [
        ([{"text": "Again."}], None),
        ([{"text": "\n\n[loopguard] Stopped."}], "STOP"),
    ]
    assert out.startswith(b"[" + element(LOOPING[0]))


def test_a_stop_of_a_call_in_the_first_element_keeps_the_bracket() -> None:
    out, _, _ = run_array(array([event([LOOP]), event([], "STOP")]), Judge(STOP))
    assert parts_of(out) == [([{"text": "[loopguard] Stopped."}], "STOP")]


def test_a_runaway_in_an_array_is_cut_and_the_array_closed() -> None:
    cfg = with_limits(max_identical_per_response=2)
    raw = array([event([WRITE]), event([WRITE]), event([WRITE]), event([WRITE]), event([], "STOP")])
    out, guard, aborted = run_array(raw, Judge(None), cfg)
    assert aborted and [(a.rule, a.count) for a in guard.actions] == [("runaway", 2)]
    assert parts_of(out) == [([WRITE], None), ([WRITE], None), ([], "STOP")]


def test_an_array_without_finish_but_closed_is_whole() -> None:
    feedback = b'[{"promptFeedback": {"blockReason": "SAFETY"}}]'
    out, guard, _ = run_array(feedback, Judge(STOP))
    assert (out, guard.complete, guard.actions) == (feedback, True, [])
    cut = array(LOOPING[:2])[:-2]  # the upstream went away before the end
    out, guard, _ = run_array(cut, Judge(STOP))
    assert (out, guard.complete) == (cut, False)


def test_an_error_element_releases_everything_unchanged() -> None:
    error = b'data: {"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}}\r\n\r\n'
    raw = array([event([{"text": "Hi."}]), event([LOOP]), error])
    out, guard, _ = run_array(raw, Judge(STOP))
    assert (out, guard.actions, guard.unread) == (raw, [], None)


# --- several candidates: counted, not read ---------------------------------------------------------------

INDEX_1 = b'data: {"candidates":[{"content":{"parts":[]},"index":1}]}\r\n\r\n'


@pytest.mark.parametrize("other", [TWO, INDEX_1], ids=["two_candidates", "index_1"])
def test_an_answer_with_another_candidate_is_relayed_and_counted(other: bytes) -> None:
    events = [event([{"text": "Hi."}]), event([LOOP]), other, event([], "STOP")]
    guard = GeminiStreamGuard(CFG, Judge(STOP))
    out = guard.feed(b"".join(events)).data + guard.finish()
    assert (out, guard.actions, guard.unread) == (b"".join(events), [], CANDIDATES)
    out, aguard, _ = run_array(array(events), Judge(STOP))
    assert (out, aguard.actions, aguard.unread) == (array(events), [], CANDIDATES)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (element(TWO), CANDIDATES),
        (element(INDEX_1), CANDIDATES),
        (b'{"promptFeedback":{"blockReason":"SAFETY"}}', None),
        (b'{"error":{"code":429,"message":"quota","status":"RESOURCE_EXHAUSTED"}}', None),
        (b"{not json", None),
    ],
)
def test_a_json_answer_with_another_candidate_is_left_alone_and_counted(
    raw: bytes, reason: str | None
) -> None:
    assert decide_json_answer(raw, Judge(STOP), CFG) == (None, [], reason)


# --- Vertex AI's streamed function-call arguments ---------------------------------------------------------


def test_fragments_of_one_call_are_one_call() -> None:
    read = _Calls()
    indexes = [read.feed(p["functionCall"]) for p in WRITE_40]
    assert len(WRITE_40) == 40 and indexes == [0] * 40
    assert [(c.name, json.loads(c.arguments)) for c in read.calls] == [
        ("write_file", {"path": "app.py", "content": "".join(f"line {i}\n" for i in range(37))})
    ]
    assert read.complete == 1


@pytest.mark.parametrize(
    ("partial", "args"),
    [
        (
            [
                {"jsonPath": "$.location", "stringValue": "Boston", "willContinue": True},
                {"jsonPath": "$.location", "stringValue": ", MA"},
                {"jsonPath": "$.brightness", "numberValue": 50},
            ],
            {"location": "Boston, MA", "brightness": 50},
        ),
        (
            [
                {"jsonPath": "$.edits[0].old", "stringValue": "a"},
                {"jsonPath": "$.edits[1].old", "stringValue": "b"},
                {"jsonPath": "$.nested.flag", "boolValue": False},
                {"jsonPath": "$['odd key']", "stringValue": "x"},
                {"jsonPath": "$.note", "nullValue": None},
            ],
            {"edits": [{"old": "a"}, {"old": "b"}], "nested": {"flag": False}, "odd key": "x", "note": None},
        ),
        # a string without willContinue is the whole value; one with it goes on
        (
            [{"jsonPath": "$.a", "stringValue": "x"}, {"jsonPath": "$.a", "stringValue": "y"}],
            {"a": "y"},
        ),
        # a path it does not read is kept as its own member; a huge index builds nothing
        (
            [{"jsonPath": "$..a", "stringValue": "x"}, {"jsonPath": "$.a[100000000]", "numberValue": 1}],
            {"$..a": "x"},
        ),
    ],
)
def test_partial_arguments_assemble_by_their_paths(partial: list[Any], args: dict[str, Any]) -> None:
    read = _Calls()
    read.feed({"name": "f", "partialArgs": partial[:1], "willContinue": True})
    for arg in partial[1:]:
        read.feed({"partialArgs": [arg], "willContinue": True})
    read.feed({})
    assert [json.loads(c.arguments) for c in read.calls] == [args]


@pytest.mark.parametrize(
    ("path", "steps"),
    [
        ("$.a.b", ["a", "b"]),
        ("$.files[2].path", ["files", 2, "path"]),
        ('$["x y"][0]', ["x y", 0]),
        ("a.b", None),
        ("$", None),
        ("$.a[-1]", None),
    ],
)
def test_json_paths(path: str, steps: list[Any] | None) -> None:
    assert _path(path) == steps


def test_two_fragmented_calls_and_a_whole_one_are_three_calls() -> None:
    read = _Calls()
    first = fragments("read_file", "$.path", ["a", ".py"])
    second = fragments("read_file", "$.path", ["b.py"])
    got = [read.feed(p["functionCall"]) for p in [*first, LOOP, *second]]
    assert got == [0] * len(first) + [1] + [2] * len(second)
    assert [(c.name, c.arguments) for c in read.calls] == [
        ("read_file", '{"path":"a.py"}'),
        ("read_file", '{"path":"app.py"}'),
        ("read_file", '{"path":"b.py"}'),
    ]


@pytest.mark.parametrize("form", ["sse", "array"])
def test_forty_fragments_of_one_write_are_not_a_runaway(form: str) -> None:
    """Before: 40 identical calls, cut after 2 (``max_identical_per_response``). Now: one call,
    every byte through, and the judge asked about that one call."""
    events = [event([{"text": "Writing."}]), *(event([p]) for p in WRITE_40), event([], "STOP")]
    judge = Judge(None)
    if form == "sse":
        raw = b"".join(events)
        guard: GeminiStreamGuard = GeminiStreamGuard(CFG, judge)
        out = bytearray()
        for i in range(0, len(raw), 11):
            out += guard.feed(raw[i : i + 11]).data
        out += guard.finish()
        aborted = False
    else:
        raw = array(events)
        out, guard, aborted = run_array(raw, judge)  # type: ignore[assignment]
    assert (bytes(out), aborted, guard.actions) == (raw, False, [])
    content = "".join(f"line {i}\n" for i in range(37))
    assert judge.seen == [
        (
            [(None, "write_file", json.dumps({"path": "app.py", "content": content}, separators=(",", ":")))],
            "Writing.",
        )
    ]


def test_a_stop_drops_every_fragment_of_the_call() -> None:
    events = [*(event([p]) for p in fragments("read_file", "$.path", ["app", ".py"])), event([], "STOP")]
    guard = GeminiStreamGuard(CFG, Judge(STOP))
    out = guard.feed(b"".join(events)).data + guard.finish()
    assert b"functionCall" not in out and b"[loopguard] Stopped." in out
    assert [a.kind for a in guard.actions] == ["stop"]


def test_fragments_in_a_json_answer_are_one_call() -> None:
    cand = {"content": {"role": "model", "parts": WRITE_40}, "finishReason": "STOP", "index": 0}
    raw = orjson.dumps({"candidates": [cand], "usageMetadata": USAGE})
    judge = Judge(None)
    assert decide_json_answer(raw, judge, with_limits(max_identical_per_response=2)) == (None, [], None)
    assert [name for name, _ in ((c[1], c[2]) for c in judge.seen[0][0])] == ["write_file"]


# --- fuzz: random arrays, random reads ------------------------------------------------------------------

_texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=10)
_parts = st.one_of(
    st.builds(lambda t: {"text": t}, _texts),
    st.builds(lambda t: {"functionCall": {"name": "read_file", "args": {"path": t}}}, _texts),
    st.builds(
        lambda t: {
            "functionCall": {"partialArgs": [{"jsonPath": "$.p", "stringValue": t}], "willContinue": True}
        },
        _texts,
    ),
    st.just({"functionCall": {"name": "write_file", "willContinue": True}}),
    st.just({"functionCall": {}}),
)


@settings(derandomize=True, deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.lists(_parts, min_size=0, max_size=3), min_size=1, max_size=8),
    st.booleans(),
    st.sampled_from([b",", b"\n,\r\n", b" , "]),
    st.lists(st.integers(1, 40), min_size=1, max_size=6),
)
def test_any_array_answer_stays_one_valid_array(
    events_parts: list[list[Any]], finish: bool, sep: bytes, reads: list[int]
) -> None:
    """Whatever the elements and the reads: nothing decided, the agent gets the upstream's bytes;
    stopped, the agent gets one valid array whose last element is the stop and no call."""
    events = [event(parts) for parts in events_parts]
    if finish:
        events.append(event([], "STOP"))
    raw = array(events, sep)
    for judge, cfg in ((Judge(None), OFF), (Judge(STOP), CFG)):
        guard = GeminiArrayGuard(cfg, judge)
        out = bytearray()
        at = 0
        for size in itertools.cycle(reads):
            if at >= len(raw):
                break
            o = guard.feed(raw[at : at + size])
            out += o.data
            at += size
            if o.abort:
                break
        if not guard.aborted:
            out += guard.finish()
        if cfg is OFF:
            assert bytes(out) == raw
            continue
        elements = orjson.loads(bytes(out))  # one valid array, always
        if finish and any(p for p in events_parts) and judge.seen:
            assert b"functionCall" not in out
            assert elements[-1]["candidates"][0]["finishReason"] == "STOP"
