"""The streamed response side without sockets (proxy.response.stream_guard): byte-exact passthrough,
held tool-call deltas, stop replacement, runaway and degenerate cuts, fail-open accounting."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from proxy.config import Config, build
from proxy.core.actions import Cut, Stop
from proxy.response.assemble import AssembledCall, CallAssembler
from proxy.response.sse import SSEFramer
from proxy.response.stream_guard import StreamGuard
from tests.helpers.quirks import ARGS, QUIRKS, ROLE, Quirk, calls, chunk, ev, stream, tc

STOP = Stop(text="[loopguard] Stopped.", rule="stop", tool="read_file", count=9, limit=2, reason="denials")


class Judge:
    """A stand-in for proxy.response.decide.StopJudge: records what it was asked, answers ``verdict``."""

    def __init__(self, verdict: Stop | None = None) -> None:
        self.verdict = verdict
        self.asked: list[list[tuple[str | None, str, str]]] = []

    def __call__(self, calls: Sequence[AssembledCall], text: str = "") -> Stop | None:
        self.asked.append([(c.id, c.name, c.arguments_json()) for c in calls])
        return self.verdict


def run(
    raw: bytes, read: int = 1 << 20, judge: Any = None, cfg: Config | None = None
) -> tuple[bytes, StreamGuard, list[bool]]:
    guard = StreamGuard(cfg or Config(), judge)
    out = b""
    aborts = []
    for i in range(0, len(raw), read):
        o = guard.feed(raw[i : i + read])
        out += o.data
        aborts.append(o.abort)
        assert guard.received - guard.settled >= 0
        if o.abort:
            break
    else:
        out += guard.finish()
    return out, guard, aborts


@dataclass
class Seen:
    """What an agent makes of a stream."""

    content: str = ""
    calls: list[tuple[str | None, str, str]] = field(default_factory=list)
    finish: list[str] = field(default_factory=list)
    done: bool = False
    roles: list[str] = field(default_factory=list)


def agent_view(raw: bytes) -> Seen:
    seen = Seen()
    asm = CallAssembler()
    framer = SSEFramer()
    for e in framer.feed(raw):
        if e.data is None:
            continue
        if e.data == "[DONE]":
            seen.done = True
            continue
        obj = orjson.loads(e.data)
        for part in obj.get("choices") or []:
            delta = part.get("delta") or {}
            seen.content += delta.get("content") or ""
            if delta.get("role"):
                seen.roles.append(delta["role"])
            asm.add(delta)
            if part.get("finish_reason"):
                seen.finish.append(part["finish_reason"])
    seen.calls = [(c.id, c.name, c.arguments_json()) for c in asm.calls]
    return seen


# --- passthrough ------------------------------------------------------------------------------------


@pytest.mark.parametrize("quirk", QUIRKS, ids=[q.name for q in QUIRKS])
@pytest.mark.parametrize("read", [1, 5, 1 << 20], ids=["1B", "5B", "whole"])
def test_nothing_decided_gives_exactly_the_upstream_bytes(quirk: Quirk, read: int) -> None:
    judge = Judge(None)
    out, guard, _ = run(quirk.raw, read, judge)
    assert out == quirk.raw
    assert guard.actions == []
    assert guard.received == guard.settled == len(quirk.raw)
    if quirk.name != "error_mid_stream":
        assert judge.asked == [quirk.expected]  # the judge saw the right calls
    else:
        assert judge.asked == []  # the error stops the reading; nothing is decided


def test_content_passes_at_once_and_only_call_deltas_are_held() -> None:
    events = [
        ev(chunk(ROLE)),
        ev(chunk({"content": "Let me look."})),
        b": keep-alive\n\n",
        ev(chunk(calls(tc(0, "call_a", "read_file", "", type_=True)))),
        ev(chunk(calls(tc(0, arguments=ARGS)))),
        ev(chunk(finish="tool_calls")),
        b"data: [DONE]\n\n",
    ]
    guard = StreamGuard(Config(), Judge(None))
    outs = [guard.feed(e).data for e in events]
    assert outs[:3] == events[:3]  # role, content and comment: immediately
    assert outs[3:5] == [b"", b""]  # call deltas: held
    assert outs[5] == b"".join(events[3:6])  # released unchanged at the finish chunk
    assert outs[6] == events[6]
    assert guard.received - guard.settled == 0


def test_pending_bytes_are_accounted_while_held() -> None:
    head = ev(chunk(ROLE))
    held = ev(chunk(calls(tc(0, "call_a", "read_file", ARGS, type_=True))))
    partial = b'data: {"id":'
    guard = StreamGuard(Config(), None)
    assert guard.feed(head + held + partial).data == head
    assert guard.received - guard.settled == len(held + partial)


# --- stop -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("quirk", [q for q in QUIRKS if q.finish], ids=[q.name for q in QUIRKS if q.finish])
@pytest.mark.parametrize("read", [3, 1 << 20], ids=["3B", "whole"])
def test_stop_replaces_the_calls_with_the_stop_text(quirk: Quirk, read: int) -> None:
    judge = Judge(STOP)
    out, guard, aborts = run(quirk.raw, read, judge)
    assert not any(aborts)  # a stop waits for the end of the choice: nothing to abort
    assert judge.asked == [quirk.expected]
    seen = agent_view(out)
    assert seen.calls == []
    assert seen.content == STOP.text
    assert seen.finish == ["stop"]
    assert seen.done
    assert seen.roles == ["assistant"]
    assert guard.actions == [STOP]
    assert b"usage" in out if "usage" in quirk.name else True


def test_stop_keeps_the_content_before_the_calls_and_separates_the_text() -> None:
    raw = stream(
        chunk(ROLE),
        chunk({"content": "Reading it again."}),
        chunk(calls(tc(0, "call_a", "read_file", ARGS, type_=True))),
        chunk(finish="tool_calls"),
    )
    seen = agent_view(run(raw, 1 << 20, Judge(STOP))[0])
    assert seen.content == "Reading it again.\n\n" + STOP.text
    assert (seen.calls, seen.finish) == ([], ["stop"])


def test_stop_when_the_stream_has_no_finish_reason() -> None:
    raw = stream(chunk(ROLE), chunk(calls(tc(0, "call_a", "read_file", ARGS, type_=True))))
    seen = agent_view(run(raw, 1 << 20, Judge(STOP))[0])
    assert (seen.content, seen.calls, seen.finish, seen.done) == (STOP.text, [], ["stop"], True)


def test_stop_replacement_events() -> None:
    raw = stream(
        chunk(ROLE),
        chunk(calls(tc(0, "call_a", "read_file", ARGS, type_=True))),
        chunk(finish="tool_calls"),
    )
    out, _, _ = run(raw, 1 << 20, Judge(STOP))
    events = SSEFramer().feed(out)
    assert events[0].raw == ev(chunk(ROLE))
    assert orjson.loads(events[1].data)["choices"] == [
        {"index": 0, "delta": {"content": "[loopguard] Stopped."}, "finish_reason": None}
    ]
    assert orjson.loads(events[2].data)["choices"] == [{"index": 0, "delta": {}, "finish_reason": "stop"}]
    assert events[3].raw == b"data: [DONE]\n\n"
    assert len(events) == 4


# --- runaway ----------------------------------------------------------------------------------------


def identical_calls_stream(n: int, name: str = "write_file") -> list[bytes]:
    """``n`` identical calls streamed in three deltas each (``write_file`` may change state)."""
    out = [ev(chunk(ROLE))]
    for i in range(n):
        out.append(ev(chunk(calls(tc(i, f"call_{i}", name, "", type_=True)))))
        out.append(ev(chunk(calls(tc(i, arguments='{"path": ')))))
        out.append(ev(chunk(calls(tc(i, arguments='"app.py"}')))))
    out.append(ev(chunk(finish="tool_calls")))
    out.append(b"data: [DONE]\n\n")
    return out


def test_300_identical_calls_cut_to_2_as_soon_as_the_3rd_is_complete() -> None:
    events = identical_calls_stream(300)
    guard = StreamGuard(Config(), Judge(None))
    out = b""
    fed = 0
    for e in events:
        fed += 1
        o = guard.feed(e)
        out += o.data
        if o.abort:
            break
    assert fed == 1 + 3 * 3 + 1  # the first delta of call 4 shows call 3 is complete
    seen = agent_view(out)
    assert seen.calls == [(f"call_{i}", "write_file", ARGS) for i in range(2)]
    assert (seen.finish, seen.done) == (["tool_calls"], True)
    assert guard.actions == [Cut("runaway", "write_file", 2, 2, "identical")]
    assert guard.feed(b"more bytes").data == b""  # after the cut, nothing more goes out


@pytest.mark.parametrize(
    ("name", "n", "kept", "cut", "abort"),
    [
        pytest.param("read_file", 3, 3, None, False, id="3_identical_read_file_not_cut"),
        pytest.param("Read", 4, 4, None, False, id="4_identical_Read_not_cut"),
        pytest.param("grep", 3, 3, None, False, id="3_identical_grep_not_cut"),
        # the 5th call is complete only at the finish: the stream ends there, nothing to close
        pytest.param(
            "Read", 5, 4, Cut("runaway", "Read", 4, 4, "identical"), False, id="5_identical_Read_cut_at_4"
        ),
        # the 5th call is complete when the 6th starts: the upstream is closed there
        pytest.param(
            "read_file",
            300,
            4,
            Cut("runaway", "read_file", 4, 4, "identical"),
            True,
            id="300_read_file_cut_at_4",
        ),
        pytest.param(
            "write_file",
            3,
            2,
            Cut("runaway", "write_file", 2, 2, "identical"),
            False,
            id="3_write_file_cut_at_2",
        ),
    ],
)
def test_streamed_identical_reads_are_cut_past_four(
    name: str, n: int, kept: int, cut: Cut | None, abort: bool
) -> None:
    out, guard, aborts = run(b"".join(identical_calls_stream(n, name)))
    seen = agent_view(out)
    assert seen.calls == [(f"call_{i}", name, ARGS) for i in range(kept)]
    assert aborts == [abort]
    assert (seen.finish, guard.actions) == (["tool_calls"], [cut] if cut else [])


def test_more_than_32_calls_cut_at_the_33rd() -> None:
    events = [ev(chunk(ROLE))]
    for i in range(40):
        events.append(ev(chunk(calls(tc(i, f"c{i}", "grep", f'{{"q": "{i}"}}', type_=True)))))
    guard = StreamGuard(Config(), None)
    out = b""
    for e in events:
        o = guard.feed(e)
        out += o.data
        if o.abort:
            break
    seen = agent_view(out)
    assert [c[0] for c in seen.calls] == [f"c{i}" for i in range(32)]
    assert seen.finish == ["tool_calls"]
    assert guard.actions == [Cut("runaway", "grep", 32, 32, "calls")]


def test_runaway_then_stop_on_the_kept_calls() -> None:
    judge = Judge(STOP)
    out, guard, aborts = run(b"".join(identical_calls_stream(10)), 1 << 20, judge)
    assert aborts == [True]
    assert judge.asked == [[(f"call_{i}", "write_file", ARGS) for i in range(2)]]
    seen = agent_view(out)
    assert (seen.calls, seen.content, seen.finish) == ([], STOP.text, ["stop"])
    assert [a.kind for a in guard.actions] == ["cut", "stop"]


def test_identical_calls_at_the_end_of_the_stream_are_cut_without_abort() -> None:
    raw = stream(
        chunk(ROLE),
        *(chunk(calls(tc(i, f"c{i}", "write_file", ARGS, type_=True))) for i in range(3)),
        chunk(finish="tool_calls"),
    )
    out, guard, aborts = run(raw, 1 << 20, None)
    assert aborts == [False]
    assert guard.actions == [Cut("runaway", "write_file", 2, 2, "identical")]
    seen = agent_view(out)
    assert [c[0] for c in seen.calls] == ["c0", "c1"]
    assert seen.finish == ["tool_calls"]


def test_runaway_off() -> None:
    cfg = build(
        Config,
        {
            "response": {
                "max_calls_per_response": 0,
                "max_identical_per_response": 0,
                "max_identical_reads_per_response": 0,
            }
        },
    )
    raw = b"".join(identical_calls_stream(50))
    out, guard, _ = run(raw, 1 << 20, None, cfg)
    assert (out, guard.actions) == (raw, [])


# --- degenerate text --------------------------------------------------------------------------------


def test_degenerate_content_ends_the_stream_with_length() -> None:
    events = [ev(chunk(ROLE))] + [ev(chunk({"content": "I will check the file again. "})) for _ in range(200)]
    guard = StreamGuard(Config(), None)
    out = b""
    fed = 0
    for e in events:
        fed += 1
        o = guard.feed(e)
        out += o.data
        if o.abort:
            break
    assert fed < 20
    seen = agent_view(out)
    assert seen.content.startswith("I will check the file again. " * 10)
    assert (seen.finish, seen.done) == (["length"], True)
    (cut,) = guard.actions
    assert (cut.rule, cut.reason, cut.applied) == ("degenerate_text", "content", True)


def test_degenerate_reasoning_drops_held_calls() -> None:
    events = [
        ev(chunk(ROLE)),
        ev(chunk(calls(tc(0, "c0", "read_file", ARGS, type_=True)))),
        *[ev(chunk({"reasoning_content": "Hmm, wait. "})) for _ in range(40)],
    ]
    out, guard, aborts = run(b"".join(events), 1 << 20, Judge(None))
    assert aborts == [True]
    seen = agent_view(out)
    assert (seen.calls, seen.finish, seen.done) == ([], ["length"], True)
    assert guard.actions[0].reason == "reasoning"


def test_legitimate_long_answer_streams_untouched() -> None:
    from tests.unit.response.test_degenerate import LEGIT

    raw = stream(
        chunk(ROLE),
        *(chunk({"content": LEGIT[i : i + 7]}) for i in range(0, len(LEGIT), 7)),
        chunk(finish="stop"),
    )
    out, guard, aborts = run(raw, 64, None)
    assert out == raw
    assert not any(aborts) and guard.actions == []


# --- other cases ------------------------------------------------------------------------------------


def test_two_choices_are_decided_separately() -> None:
    def part(i: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"index": i, "delta": delta, "finish_reason": finish}

    base = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    raw = stream(
        {**base, "choices": [part(0, ROLE), part(1, ROLE)]},
        {**base, "choices": [part(0, calls(tc(0, "a", "read_file", ARGS, type_=True)))]},
        {**base, "choices": [part(1, calls(tc(0, "b", "grep", "{}", type_=True)))]},
        {**base, "choices": [part(0, {}, "tool_calls")]},
        {**base, "choices": [part(1, {}, "tool_calls")]},
    )

    class OnlyReadFile(Judge):
        def __call__(self, calls: Sequence[AssembledCall], text: str = "") -> Stop | None:
            super().__call__(calls)
            return STOP if calls[0].name == "read_file" else None

    out, _, _ = run(raw, 1 << 20, OnlyReadFile())
    per_choice: dict[int, dict[str, Any]] = {}
    for e in SSEFramer().feed(out):
        if e.data and e.data != "[DONE]":
            for p in orjson.loads(e.data)["choices"]:
                c = per_choice.setdefault(p["index"], {"content": "", "calls": 0, "finish": None})
                c["content"] += p["delta"].get("content") or ""
                c["calls"] += len(p["delta"].get("tool_calls") or [])
                c["finish"] = p["finish_reason"] or c["finish"]
    assert per_choice == {
        0: {"content": STOP.text, "calls": 0, "finish": "stop"},
        1: {"content": "", "calls": 1, "finish": "tool_calls"},
    }


def test_non_json_data_turns_the_guard_into_passthrough() -> None:
    raw = (
        ev(chunk(ROLE))
        + ev(chunk(calls(tc(0, "a", "x", "{}", type_=True))))
        + b"data: not json\n\n"
        + b"data: tail"
    )
    out, guard, _ = run(raw, 4, Judge(STOP))
    assert out == raw
    assert guard.actions == []


def test_release_gives_back_everything_held_unchanged() -> None:
    head = ev(chunk(ROLE))
    held = ev(chunk(calls(tc(0, "a", "x", "{}", type_=True)))) + b"data: {partial"
    guard = StreamGuard(Config(), Judge(STOP))
    assert guard.feed(head + held).data == head
    assert guard.release() == held


@pytest.mark.parametrize(
    ("raw", "complete"),
    [
        pytest.param(
            stream(chunk(ROLE), chunk({"content": "hi"}), chunk(finish="stop")), True, id="finish_and_done"
        ),
        pytest.param(
            stream(chunk({"content": "hi"}), chunk(finish="stop"), done=False), True, id="finish_no_done"
        ),
        pytest.param(stream(chunk({"content": "hi"})), True, id="done_no_finish"),
        pytest.param(stream(chunk(ROLE), chunk({"content": "hi"}), done=False), False, id="neither"),
        pytest.param(b"", False, id="empty_stream"),
        pytest.param(b": keep-alive\n\n", False, id="only_a_comment"),
        pytest.param(
            stream({"error": {"message": "overloaded"}}, done=False), True, id="upstream_error_event"
        ),
    ],
)
def test_complete_says_whether_the_stream_said_how_it_ended(raw: bytes, complete: bool) -> None:
    """The relay ends a stream that stopped short with the error event."""
    out, guard, _ = run(raw)
    assert (out, guard.complete) == (raw, complete)


def test_a_cut_is_complete() -> None:
    _, guard, aborts = run(b"".join(identical_calls_stream(10)))
    assert (aborts[-1], guard.complete) == (True, True)


def test_an_event_past_the_size_limit_goes_out_unread(monkeypatch: pytest.MonkeyPatch) -> None:
    """An event that grows past MAX_EVENT_BYTES is not buffered: what was held
    and the event itself go out as they came, and so does the rest of the stream."""
    from proxy.response import stream_guard

    monkeypatch.setattr(stream_guard, "MAX_EVENT_BYTES", 1024)
    head = stream(chunk(ROLE), chunk(calls(tc(0, "c1", "read_file", "", type_=True))), done=False)
    huge = b"data: " + orjson.dumps(chunk({"content": "x" * 5000})) + b"\n\n"
    rest = stream(chunk(finish="tool_calls"))
    guard = StreamGuard(Config(), None)
    got = b"".join(guard.feed((head + huge)[i : i + 700]).data for i in range(0, len(head + huge), 700))
    assert got == head + huge  # nothing held back: the held call went out with the big event
    assert guard.feed(rest).data == rest  # passthrough from here
    assert (guard.complete, guard.actions, guard.received - guard.settled) == (True, [], 0)
