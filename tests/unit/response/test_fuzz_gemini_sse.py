"""Fuzzing the Gemini answer side: random ``alt=sse`` streams of ``GenerateContentResponse`` events
through :class:`proxy.response.gemini_stream.GeminiStreamGuard`, split at random points into reads,
as the relay feeds it.

Streams: text and thought parts (unicode, astral characters), ``functionCall`` parts (one or two
per event, with or without ``id``), events without candidates (``promptFeedback``, usage only),
``finishReason`` on the last event (or none: a stream cut short), comments (``: ping``), CRLF or
LF event ends, ``data:`` with or without its space, non-JSON data and ``{"error": …}`` events.

Properties:

- feeding never raises, whatever the stream and the reads;
- nothing decided (no judge, limits off): the agent gets exactly the upstream bytes, a prefix of
  them at any time, and nothing is held once the stream ended (``received == settled``);
- a stop of a stream that finishes and is all Gemini events (with a call or some text: an empty
  answer is not judged): the output is the same whatever the read boundaries, starts with the
  exact upstream bytes before the first held event, every event parses, no ``functionCall`` is
  left and the last event carries the stop text and ``finishReason: "STOP"``.

Settings: derandomized, bounded examples.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.config import Config, build
from proxy.core.actions import Stop
from proxy.response.gemini_stream import GeminiStreamGuard

FUZZ = settings(
    derandomize=True,
    deadline=None,
    max_examples=150,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
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
STOP = Stop(text="[loopguard] Stopped.", rule="stop", tool="f", count=9, limit=2)

texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
calls = st.builds(
    lambda name, arg, cid: {
        "functionCall": {"name": name, "args": {"a": arg}, **({"id": cid} if cid else {})}
    },
    st.sampled_from(["read_file", "run_shell_command"]),
    texts,
    st.sampled_from([None, "c1", "c2"]),
)
parts = st.one_of(
    st.builds(lambda t: {"text": t}, texts),
    st.builds(lambda t: {"text": t, "thought": True}, texts),
    calls,
)


def _event(obj: Any, end: bytes, space: bool) -> bytes:
    return b"data:" + (b" " if space else b"") + json.dumps(obj).encode() + end


@st.composite
def streams(draw: Any, finished: bool | None = None, gemini_only: bool = False) -> list[bytes]:
    """One answer's events (the module docstring's mix); ``finished``: the last event carries
    ``finishReason`` (None: either); ``gemini_only``: no comment, error or non-JSON event."""
    end = draw(st.sampled_from([b"\r\n\r\n", b"\n\n"]))
    out: list[bytes] = []
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["parts", "parts", "parts", "feedback", "comment", "bad", "error"]))
        space = draw(st.booleans())
        if kind == "parts":
            cand = {
                "content": {"role": "model", "parts": draw(st.lists(parts, min_size=1, max_size=2))},
                "index": 0,
            }
            out.append(_event({"candidates": [cand], "modelVersion": "m"}, end, space))
        elif kind == "feedback":
            out.append(_event({"promptFeedback": {"blockReason": "SAFETY"}}, end, space))
        elif gemini_only:
            continue
        elif kind == "comment":
            out.append(b": ping" + end)
        elif kind == "bad":
            out.append(b"data: {not json" + end)
        else:
            out.append(_event({"error": {"code": 503, "message": "overloaded"}}, end, space))
    if finished if finished is not None else draw(st.booleans()):
        cand = {"content": {"role": "model", "parts": draw(st.lists(parts, max_size=2))}, "index": 0}
        cand["finishReason"] = "STOP"
        out.append(_event({"candidates": [cand], "usageMetadata": {"totalTokenCount": 3}}, end, True))
    return out


def feed(raw: bytes, cuts: list[int], guard: GeminiStreamGuard) -> tuple[bytes, list[bytes]]:
    """``raw`` fed in reads split at ``cuts``; (the agent's bytes, what it had after each read)."""
    bounds = sorted({min(c, len(raw)) for c in cuts} | {0, len(raw)})
    out = bytearray()
    seen = []
    for a, b in itertools.pairwise(bounds):
        o = guard.feed(raw[a:b])
        out += o.data
        seen.append(bytes(out))
        if o.abort:
            return bytes(out), seen
    out += guard.finish()
    return bytes(out), seen


class StopAll:
    def __call__(self, calls: Any, text: str = "") -> Stop | None:
        return STOP


@FUZZ
@given(streams(), st.lists(st.integers(0, 2000), max_size=8))
def test_nothing_decided_gives_exactly_the_upstream_bytes(events: list[bytes], cuts: list[int]) -> None:
    raw = b"".join(events)
    guard = GeminiStreamGuard(OFF, None)
    out, seen = feed(raw, cuts, guard)
    assert out == raw
    assert all(raw.startswith(s) for s in seen)
    assert guard.received == guard.settled == len(raw)
    assert guard.actions == []


@FUZZ
@given(streams(finished=True, gemini_only=True), st.lists(st.integers(0, 2000), max_size=8))
def test_a_stop_gives_the_same_valid_events_whatever_the_reads(events: list[bytes], cuts: list[int]) -> None:
    raw = b"".join(events)
    whole, _ = feed(raw, [], GeminiStreamGuard(OFF, StopAll()))
    split, _ = feed(raw, cuts, GeminiStreamGuard(OFF, StopAll()))
    assert split == whole
    said = [
        p
        for ev in events
        for c in json.loads(ev.split(b":", 1)[1]).get("candidates", [])
        for p in c["content"]["parts"]
        if "functionCall" in p or (p["text"] and not p.get("thought"))
    ]
    if not said:  # no call and no text: the judge is not asked
        assert whole == raw
        return
    first_call = next((k for k, ev in enumerate(events) if b'"functionCall"' in ev), len(events) - 1)
    assert whole.startswith(b"".join(events[:first_call]))
    frames = [f for f in whole.replace(b"\r\n", b"\n").split(b"\n\n") if f]
    objs = [json.loads(f.split(b":", 1)[1]) for f in frames]
    assert all(
        "functionCall" not in p for o in objs for c in o.get("candidates", []) for p in c["content"]["parts"]
    )
    last = objs[-1]["candidates"][0]
    assert last["finishReason"] == "STOP"
    assert last["content"]["parts"][-1]["text"].endswith("[loopguard] Stopped.")
