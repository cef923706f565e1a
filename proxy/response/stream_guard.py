"""Streamed answers, sans-I/O: upstream bytes in, agent bytes out.

One layer for every wire (DESIGN §2.1), in three parts:

- :class:`FramedGuard` (here): the SSE framing (:mod:`proxy.response.sse`), the states, the
  holding and release of events, and the byte accounting for fail-open, written once;
- a dialect's *decoder* (its subclass's ``_event``): what an event says, told to an
  :class:`~proxy.response.answer.AnswerState` per answer (text and reasoning deltas, calls started
  and complete, the finish), which runs the stop judge, the runaway rule and the degenerate-text
  check, also written once;
- the dialect's *encoder* (``_write`` and the endings): what a held event becomes after the
  decision, and the events that end a stopped or cut answer.

:class:`StreamGuard` is the chat-completions guard; the Responses API's is
:class:`proxy.response.responses_stream.ResponsesStreamGuard`. The edge (:mod:`proxy.edge.relay`)
writes whatever :meth:`FramedGuard.feed` returns and, when the output says ``abort``, closes the
upstream request at once. For chat completions:

- Events are forwarded as their exact upstream bytes, as soon as they are complete, except that
  **tool-call deltas are held** until the decision at the end of their choice (its
  ``finish_reason``, or ``[DONE]``/the end of the stream). To keep the byte order, every event after
  a held one is held too until the release; in practice that is only the finish chunk (content
  streams before calls). An event carrying both content and a call is held whole.
- At the decision (:mod:`proxy.response.decide`): nothing decided → the held bytes are released unchanged
  (so when nothing is decided the agent receives exactly the upstream bytes). **Stop** → the held
  call deltas are dropped, a content delta with the stop text is inserted before the finish chunk,
  whose ``finish_reason`` becomes ``"stop"``. **Runaway** → the calls are cut as soon as the
  first call beyond a limit is seen (abort): the kept calls are re-emitted whole (one delta each,
  indexes 0..n-1), then a finish chunk (``tool_calls``) and ``data: [DONE]``.
- **Degenerate text** in content or reasoning (:mod:`proxy.response.degenerate`) → abort: held call deltas
  of unfinished choices are dropped, and each unfinished choice gets a finish chunk with
  ``finish_reason: "length"``, then ``data: [DONE]``.
- A ``data:`` that is not a chat-completion chunk (``{"error": …}`` mid-stream, invalid JSON)
  releases everything held unchanged and turns the guard into plain passthrough for the rest.

Byte accounting for fail-open: ``received`` counts the bytes fed, ``settled`` those whose fate is
decided (forwarded, replaced or dropped). If anything here raises, the edge forwards the
``received - settled`` bytes it kept, unchanged, and relays the rest as is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proxy.config import Config
from proxy.core.actions import Action, Cut, Stop
from proxy.dialects import jsonbody
from proxy.dialects.text_calls import OPEN_TAGS, Found
from proxy.response.answer import AnswerState
from proxy.response.assemble import AssembledCall, CallAssembler
from proxy.response.decide import (
    REASONING_FIELDS,
    StopJudge,
)
from proxy.response.repair import CUT_SHORT, Repairer
from proxy.response.sse import SSEEvent, SSEFramer

DONE = b"data: [DONE]\n\n"
#: An event longer than this (bytes, unfinished) is not read: the guard forwards it and the rest of
#: the stream unread (an unterminated 200 MiB event is not buffered whole).
MAX_EVENT_BYTES = 16 * 1024 * 1024
_BASE_FIELDS = ("id", "object", "created", "model", "system_fingerprint")
_SCALARS = (str, int, float, bool, type(None))


@dataclass(frozen=True, slots=True)
class Output:
    """Bytes for the agent now; ``abort``: the response is complete, close the upstream."""

    data: bytes = b""
    abort: bool = False


@dataclass(slots=True)
class Held:
    """One event held for a decision (every wire's held events extend it): its bytes as they
    came (``raw``) and its decoded data (``obj``; None: no data, or not read)."""

    raw: bytes
    obj: dict[str, Any] | None = None


@dataclass(slots=True)
class _Held(Held):
    call_choices: frozenset[int] = frozenset()
    finish_choices: frozenset[int] = frozenset()
    #: per choice with content in this event: where that content starts in the choice's content
    text_at: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Choice:
    answer: AnswerState  # the choice's text and the decisions on it (proxy.response.answer)
    calls: CallAssembler = field(default_factory=CallAssembler)
    finished: bool = False
    upstream_finish: str | None = None  # the finish_reason the upstream sent
    pending: bool = False  # call deltas held, no decision yet
    # the decision
    drop_calls: bool = False
    finish_reason: str | None = None
    insert: list[bytes] = field(default_factory=list)
    # repair of calls written as text: the content so far, and whether it is held
    content: list[str] = field(default_factory=list)
    length: int = 0
    tail: str = ""  # the content's last characters, for an opening tag split across deltas
    text_hold: bool = False  # content held from a possible opening tag on
    tag_seen: bool = False  # a whole opening tag came: held to the finish
    drop_text: bool = False  # repaired: held content is replaced
    close_tail: str = ""  # the content's last characters, for a closing tag split across deltas
    so_far: tuple[Found, list[AssembledCall]] | None = None  # the complete text calls so far
    watch_runaway: bool = True  # the calls so far are read at each closing tag


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + jsonbody.dumps(obj) + b"\n\n"


def _meaningful(part: dict[str, Any]) -> bool:
    delta = part.get("delta")
    if isinstance(delta, dict) and any(v not in (None, "", [], {}) for v in delta.values()):
        return True
    return any(part.get(k) is not None for k in ("finish_reason", "logprobs"))


class FramedGuard:
    """What every streamed answer's guard shares (chat completions here, the Responses API in
    :mod:`proxy.response.responses_stream`): the SSE framing, the three states (``inspect``; ``pass``:
    plain passthrough; ``done``: aborted), the byte accounting for fail-open, :meth:`feed` and
    :meth:`release`. A subclass reads events in ``_event(ev, out)``, lets go of what it holds in
    ``_give_up(out)`` and decides what is still open at the end of the stream in
    ``_end_of_stream(out)``; all three write to ``out`` through :meth:`_emit` (or count what they
    replace in ``settled`` themselves).

    Holding is the same for every wire too: an event carrying tool-call parts is held, and so is
    every event after a held one, to keep the byte order (:meth:`_hold_or_emit`); once no answer
    is pending (``_pending()``), the held events go out in order through the dialect's encoder,
    ``_write(held, out)``, which writes each unchanged or as the decisions rewrote it
    (:meth:`_release`)."""

    __slots__ = (
        "_cfg",
        "_framer",
        "_held",
        "_judge",
        "_state",
        "actions",
        "complete",
        "received",
        "settled",
        "unread",
    )

    def __init__(self, cfg: Config, judge: StopJudge | None) -> None:
        self._cfg = cfg
        self._judge = judge
        self._framer = SSEFramer()
        self._held: list[Any] = []  # events held for a decision, in stream order
        self._state = "inspect"  # | "pass" (plain passthrough) | "done" (aborted)
        #: the fresh response-side actions taken so far
        self.actions: list[Action] = []
        self.received = 0
        self.settled = 0
        #: the stream said how it ended (its terminal event, an event the guard does not read,
        #: from then on it only relays, or the guard's own cut). False at the end of the upstream's
        #: body means the answer stopped short.
        self.complete = False
        #: why the rest of the stream went out unread (``too_large``), None: all of it was read
        self.unread: str | None = None

    @property
    def aborted(self) -> bool:
        return self._state == "done"

    def feed(self, chunk: bytes) -> Output:
        """Bytes from the upstream; returns what the agent gets now."""
        self.received += len(chunk)
        if self._state == "done":
            self.settled = self.received
            return Output()
        if self._state == "pass":
            self.settled += len(chunk)
            return Output(chunk)
        out = bytearray()
        for ev in self._framer.feed(chunk):
            if self._state == "inspect":
                self._event(ev, out)
            elif self._state == "pass":
                self._emit(ev.raw, out)
            if self._state == "done":
                self.settled = self.received
                return Output(bytes(out), abort=True)
        if self._state == "inspect" and self._framer.pending > MAX_EVENT_BYTES:
            self.complete = True  # not ours to judge any more
            self.unread = "too_large"
            self._give_up(out)  # an event too big to read: everything goes out unread from here
        if self._state == "pass":
            self._emit(self._framer.finish(), out)
        return Output(bytes(out))

    def finish(self) -> bytes:
        """The upstream ended the stream: decide what is still open, release everything."""
        if self._state == "done":
            return b""
        out = bytearray()
        for ev in self._framer.end() if self._state == "inspect" else ():
            self._event(ev, out)  # the last event, when a bare CR that was the last byte ended it
            if self._state == "done":
                self.settled = self.received
                return bytes(out)
        if self._state == "inspect":
            self._end_of_stream(out)
        self._emit(self._framer.finish(), out)
        self._state = "pass"
        return bytes(out)

    def release(self) -> bytes:
        """Everything held, unchanged (the upstream failed mid-stream); passthrough from here."""
        out = bytearray()
        if self._state != "done":
            self._give_up(out)
            self._emit(self._framer.finish(), out)
        return bytes(out)

    def _emit(self, raw: bytes, out: bytearray) -> None:
        out += raw
        self.settled += len(raw)

    def _hold_or_emit(self, held: Any, calls: bool, out: bytearray) -> None:
        """Hold ``held`` when it carries call parts (``calls``) or something is held already;
        else it goes out now."""
        if self._held or calls:
            self._held.append(held)
        else:
            self._write(held, out)

    def _release(self, out: bytearray) -> None:
        """Every held event, through the encoder, once no answer is pending."""
        if self._pending():
            return
        held, self._held = self._held, []
        for h in held:
            self._write(h, out)

    def _pending(self) -> bool:
        raise NotImplementedError

    def _write(self, held: Any, out: bytearray) -> None:
        raise NotImplementedError

    def _event(self, ev: SSEEvent, out: bytearray) -> None:
        raise NotImplementedError

    def _give_up(self, out: bytearray) -> None:
        raise NotImplementedError

    def _end_of_stream(self, out: bytearray) -> None:
        raise NotImplementedError


class DecidingGuard(FramedGuard):
    """A :class:`FramedGuard` whose wire decides the whole answer once, at its finishing event
    (Gemini :mod:`proxy.response.gemini_stream`, Messages :mod:`proxy.response.messages_stream`,
    Responses :mod:`proxy.response.responses_stream`): the calls read so far (``_calls``), the
    text and the decisions (``_answer``, :class:`proxy.response.answer.AnswerState`), and the
    decision the encoder ``_write`` applies to the held events: ``_drop`` (the calls whose events
    or parts are left out) and ``_stop`` (the stop the finishing event gets). ``_open``: a call's
    events are held and no decision is taken yet (what ``_pending`` says)."""

    __slots__ = ("_answer", "_calls", "_drop", "_open", "_stop")

    def __init__(self, cfg: Config, judge: StopJudge | None) -> None:
        super().__init__(cfg, judge)
        self._answer = AnswerState(cfg, judge)
        self._calls: list[AssembledCall] = []
        self._open = False
        self._drop: set[int] = set()
        self._stop: Stop | None = None

    def _end_of_stream(self, out: bytearray) -> None:
        """No finishing event came: nothing to decide on; everything goes out unchanged
        (``complete`` stays False)."""
        self._give_up(out)

    def _decide(self, out: bytearray) -> None:
        """The finishing event arrived (it is the last held event): a stop drops every call and
        adds the stop, a cut drops the calls from its count on, else everything goes out."""
        _, cut, stop = self._answer.decide(self._calls)
        if cut is not None:
            self.actions.append(cut)
        if stop is not None:
            self.actions.append(stop)
            self._settle(out, drop=set(range(len(self._calls))), stop=stop)
        else:
            self._settle(out, drop=set(range(cut.count, len(self._calls))) if cut else set())

    def _settle(self, out: bytearray, drop: set[int], stop: Stop | None = None) -> None:
        """The decision: release the held events (``_write`` leaves out those of the calls in
        ``drop`` and writes ``stop`` into the finishing event)."""
        self._drop, self._stop, self._open = drop, stop, False
        self._release(out)

    def _give_up(self, out: bytearray) -> None:
        self._settle(out, drop=set())  # everything held goes out unchanged
        self._state = "pass"

    def _pending(self) -> bool:
        return self._open

    def _relay_rest(self, raw: bytes, out: bytearray) -> None:
        """The stream ended, or is no longer ours to read (the upstream's error, not this
        wire's grammar): everything held goes out unchanged, then the event ``raw``, and the
        rest of the stream is relayed unread."""
        self.complete = True
        self._give_up(out)
        self._emit(raw, out)


def _partial_tag(text: str) -> bool:
    """``text`` ends in the start of an opening tag (``<``, ``<tool_``, ``<function``, …)."""
    start = text.rfind("<", max(0, len(text) - _TAG_MAX))
    return start >= 0 and any(t.startswith(text[start:]) for t in OPEN_TAGS)


_TAG_MAX = max(map(len, OPEN_TAGS))
_CLOSE_TAGS = ("</tool_call>", "</function>")


class StreamGuard(FramedGuard):
    """One streamed chat completion. ``repair``: the request's repair of calls written as text
    (:mod:`proxy.response.repair`; None = off): a choice without structured calls streams its
    content until a possible opening tag (``<tool_call>``, ``<function=``, or the start of one at
    the end of the content so far) appears; from there its events are held. A start that turns out
    to be no tag lets them go at once; a whole tag holds them to the choice's finish, where the
    content is repaired (the held content replaced by the rest of the text before the first block,
    then one ``tool_calls`` delta per call, and ``finish_reason: "tool_calls"``; the calls judged
    like any others) or released unchanged. Each time a block closes, the calls complete so far
    are read and the runaway rule applied, so a runaway written as text is cut as it streams (the
    kept calls repaired, the upstream closed), as structured calls are."""

    __slots__ = ("_base", "_choices", "_repair")

    def __init__(self, cfg: Config, judge: StopJudge | None, repair: Repairer | None = None) -> None:
        super().__init__(cfg, judge)
        self._choices: dict[int, _Choice] = {}
        self._base: dict[str, Any] | None = None
        self._repair = repair

    # --- events -----------------------------------------------------------------------------------

    def _event(self, ev: SSEEvent, out: bytearray) -> None:
        if ev.data is None:
            self._hold_or_emit(_Held(ev.raw), False, out)
            return
        if ev.data.strip() == "[DONE]":
            self.complete = True
            self._end_all(out)
            self._hold_or_emit(_Held(ev.raw), False, out)
            return
        try:
            obj = jsonbody.decode(ev.data)
        except jsonbody.Unreadable:
            obj = None
        if not isinstance(obj, dict) or not isinstance(obj.get("choices"), list):
            self.complete = True  # the upstream said something itself ({"error": …}); relay it
            self._give_up(out)  # {"error": …} or something unknown: stop reading
            self._emit(ev.raw, out)
            return
        if self._base is None:
            # copied into every chunk the guard writes: scalars only (a value no writer takes, one
            # nested ~1,000 levels deep, would break them all)
            base = {k: obj[k] for k in _BASE_FIELDS if k in obj and isinstance(obj[k], _SCALARS)}
            self._base = base | {"object": "chat.completion.chunk"}
        calls: set[int] = set()
        finished: set[int] = set()
        text_at: dict[int, int] = {}
        cut: Cut | None = None
        runaway: tuple[int, Cut] | None = None
        for part in obj["choices"]:
            if not isinstance(part, dict):
                continue
            ci = part.get("index")
            ci = ci if isinstance(ci, int) else 0
            ch = self._choice(ci)
            if ch.finished:
                continue
            delta = part.get("delta")
            delta = delta if isinstance(delta, dict) else {}
            content = delta.get("content")
            if self._repair is not None and isinstance(content, str) and content:
                text_at[ci] = ch.length
                ch.content.append(content)
                ch.length += len(content)
                if not ch.calls.calls:
                    was = ch.text_hold
                    self._watch(ch, content)
                    if ch.text_hold:
                        calls.add(ci)
                        ch.pending = True
                    elif was:
                        ch.pending = False  # a start of a tag that was none: what it held goes out
                    closed = ch.tag_seen and ch.watch_runaway and self._block_closed(ch, content)
                    if closed and runaway is None:
                        rc = self._text_runaway(ci, ch)
                        runaway = (ci, rc) if rc else None
            cut = cut or self._texts(ch, delta)
            tcs = delta.get("tool_calls")
            if (isinstance(tcs, list) and tcs) or isinstance(delta.get("function_call"), dict):
                calls.add(ci)
                ch.pending = True
                if ch.calls.add(delta) and runaway is None:  # a call started: the ones before are complete
                    rc = ch.answer.runaway(ch.calls.calls, len(ch.calls.calls) - 1)
                    runaway = (ci, rc) if rc else None
            if part.get("finish_reason") is not None:
                self.complete = True
                finished.add(ci)
                ch.finished = True
                ch.upstream_finish = part["finish_reason"]
                if not ch.pending and ch.answer.text_seen and getattr(self._judge, "on_text_only", False):
                    calls.add(ci)  # hold this finish: the judge may stop a text-only answer (monologue)
                    ch.pending = True
        held = _Held(ev.raw, obj, frozenset(calls), frozenset(finished), text_at)
        self._hold_or_emit(held, bool(calls), out)
        if runaway is not None:
            self._abort(out, runaway=runaway)
        elif cut is not None:
            self.actions.append(cut)
            self._abort(out)
        else:
            for ci in sorted(finished):
                self._decide(ci)
            self._release(out)  # also what a start of a tag that was none held (``released``)

    def _choice(self, ci: int) -> _Choice:
        ch = self._choices.get(ci)
        if ch is None:
            ch = self._choices[ci] = _Choice(AnswerState(self._cfg, self._judge))
            r = self._cfg.response
            ch.watch_runaway = bool(
                r.max_calls_per_response or r.max_identical_per_response or r.max_identical_reads_per_response
            )
        return ch

    @staticmethod
    def _texts(ch: _Choice, delta: dict[str, Any]) -> Cut | None:
        """The delta's content and reasoning fields, to the choice's answer; the first cut."""
        found: Cut | None = None
        for key in ("content", *REASONING_FIELDS):
            text = delta.get(key)
            if isinstance(text, str):
                # content held after a whole opening tag is calls to be (repeated blocks are no
                # degenerate text): the runaway rule judges them once repaired
                detect = key != "content" or not (ch.tag_seen and not ch.calls.calls)
                cut = ch.answer.text(text, reasoning=key != "content", detect=detect)
                found = found or cut
        return found

    @staticmethod
    def _block_closed(ch: _Choice, delta: str) -> bool:
        """A closing tag (``</tool_call>``, ``</function>``) ends in ``delta``."""
        window = ch.close_tail + delta
        ch.close_tail = window[-len(_CLOSE_TAGS[0]) :]
        return any(t in window for t in _CLOSE_TAGS)

    def _text_runaway(self, ci: int, ch: _Choice) -> Cut | None:
        """The runaway rule over the text calls complete so far (the text up to its last closing
        tag, when that parses), so that a runaway written as text is cut as it streams."""
        assert self._repair is not None
        text = "".join(ch.content)
        end = max(text.rfind(t) + len(t) if t in text else -1 for t in _CLOSE_TAGS)
        got = self._repair.calls(text[:end], ci) if end > 0 else None
        if got is None:
            # text up to a </tool_call> that does not parse will not parse later either (short of
            # that tag inside a JSON string): stop reading it as it streams, repair may still run
            ch.watch_runaway = not text.endswith(_CLOSE_TAGS[0], 0, end)
            return None
        ch.so_far = got
        return ch.answer.runaway(got[1], len(got[1]))

    @staticmethod
    def _watch(ch: _Choice, delta: str) -> None:
        """Hold the choice's content once a possible opening tag appears (class docstring)."""
        if ch.tag_seen:
            return
        window = ch.tail + delta
        if any(t in window for t in OPEN_TAGS):
            ch.tag_seen = ch.text_hold = True
            return
        ch.text_hold = _partial_tag(window)
        ch.tail = window[-_TAG_MAX:]

    # --- decisions --------------------------------------------------------------------------------

    def _decide(self, ci: int, cut: Cut | None = None, finish: str = "tool_calls") -> None:
        """The end of choice ``ci``'s calls: runaway, then stop; fills its replacement."""
        ch = self._choices[ci]
        if not ch.pending:
            return
        ch.pending = False
        if (
            ch.text_hold
            and not ch.calls.calls
            and ch.upstream_finish not in CUT_SHORT  # cut short: never repaired
            and self._repaired(ci, ch, cut)
        ):
            return
        kept, cut, stop = ch.answer.decide(ch.calls.calls, cut)
        if cut is not None:
            self.actions.append(cut)
        if stop is not None:
            self.actions.append(stop)
            ch.drop_calls = True
            ch.finish_reason = "stop"
            ch.insert = [self._content_chunk(ci, ch, stop)]
        elif cut is not None:
            ch.drop_calls = True
            ch.finish_reason = finish
            ch.insert = [self._call_chunk(ci, k, c) for k, c in enumerate(kept)]

    def _repaired(self, ci: int, ch: _Choice, cut: Cut | None = None) -> bool:
        """Repair choice ``ci``'s held content when it holds calls; False when it does not.
        ``cut``: the runaway cut that ends it mid-stream (over the calls complete so far)."""
        assert self._repair is not None
        got = ch.so_far if cut is not None else self._repair.calls("".join(ch.content), ci)
        if got is None:
            return False
        found, calls = got
        held_from = min((h.text_at[ci] for h in self._held if ci in h.text_at), default=ch.length)
        text = found.text.rstrip()
        rest = text[held_from:]
        kept, cut, stop = ch.answer.decide(calls, cut, text=text)
        self.actions.append(self._repair.action(found))
        if cut is not None:
            self.actions.append(cut)
        ch.drop_calls = ch.drop_text = True
        if stop is not None:
            self.actions.append(stop)
            ch.finish_reason = "stop"
            ch.insert = [self._chunk(ci, {"content": f"{rest}\n\n{stop.text}" if text else stop.text})]
        else:
            ch.finish_reason = "tool_calls"
            ch.insert = [self._chunk(ci, {"content": rest})] if rest else []
            ch.insert += [self._call_chunk(ci, k, c) for k, c in enumerate(kept)]
        return True

    def _end_of_stream(self, out: bytearray) -> None:
        self._end_all(out)

    def _end_all(self, out: bytearray) -> None:
        """``[DONE]`` or the end of the stream: decide every open choice, release, and finish the
        replaced choices that never sent a ``finish_reason``."""
        for ci in sorted(self._choices):
            self._decide(ci)
        self._release(out)
        self._finish_open(out, None)

    def _abort(self, out: bytearray, runaway: tuple[int, Cut] | None = None) -> None:
        for ci, ch in sorted(self._choices.items()):
            if runaway is not None and ci == runaway[0]:
                self._decide(ci, runaway[1])
            elif ch.finished:
                self._decide(ci)  # finished in this very event
            else:
                ch.pending = False
                ch.drop_calls = True
                ch.finish_reason = "length"
                ch.insert = []
        self._release(out)
        self._finish_open(out, "length")
        out += DONE
        self._state = "done"
        self.complete = True

    def _finish_open(self, out: bytearray, default: str | None) -> None:
        for ci, ch in sorted(self._choices.items()):
            if ch.finished:
                continue
            reason = ch.finish_reason or default
            if ch.insert or reason:
                out += b"".join(ch.insert)
                ch.insert = []
                if reason:
                    out += self._chunk(ci, {}, reason)
                ch.finished = True

    def _give_up(self, out: bytearray) -> None:
        for ch in self._choices.values():
            ch.pending = False  # undecided calls go out unchanged
        self._release(out)
        self._state = "pass"

    # --- output -----------------------------------------------------------------------------------

    def _pending(self) -> bool:
        return any(ch.pending for ch in self._choices.values())

    def _write(self, held: _Held, out: bytearray) -> None:
        """The encoder: a held event as the decisions left it (:meth:`_render`)."""
        out += self._render(held)
        self.settled += len(held.raw)

    def _render(self, h: _Held) -> bytes:
        if h.obj is None:
            return h.raw
        touched = {
            ci for ci in h.call_choices | h.finish_choices | h.text_at.keys() if self._choices[ci].drop_calls
        }
        if not touched:
            return h.raw
        prefix = b""
        parts: list[Any] = []
        for part in h.obj["choices"]:
            ci = part.get("index") if isinstance(part, dict) else None
            ci = ci if isinstance(ci, int) else 0
            if not isinstance(part, dict) or ci not in touched:
                parts.append(part)
                continue
            ch = self._choices[ci]
            delta = part.get("delta") if isinstance(part.get("delta"), dict) else {}
            kept = {k: v for k, v in delta.items() if k not in ("tool_calls", "function_call")}
            if ch.drop_text and ci in h.text_at:
                kept.pop("content", None)
            part = {**part, "delta": kept}
            if ci in h.finish_choices:
                prefix += b"".join(ch.insert)
                ch.insert = []
                if ch.finish_reason:
                    part["finish_reason"] = ch.finish_reason
            if _meaningful(part):
                parts.append(part)
        obj = {**h.obj, "choices": parts}
        if not parts and set(obj) <= {*_BASE_FIELDS, "choices"}:
            return prefix
        return prefix + sse(obj)

    def _chunk(self, ci: int, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": ci, "delta": delta, "finish_reason": finish}
        return sse({**(self._base or {}), "choices": [choice]})

    def _content_chunk(self, ci: int, ch: _Choice, stop: Stop) -> bytes:
        text = f"\n\n{stop.text}" if ch.answer.text_seen else stop.text
        return self._chunk(ci, {"content": text})

    def _call_chunk(self, ci: int, k: int, call: AssembledCall) -> bytes:
        tc: dict[str, Any] = {"index": k}
        if call.id is not None:
            tc["id"] = call.id
        tc["type"] = "function"
        tc["function"] = {"name": call.name, "arguments": call.arguments_json()}
        return self._chunk(ci, {"tool_calls": [tc]})
