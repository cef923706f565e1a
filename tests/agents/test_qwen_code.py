"""The real Qwen Code CLI through loopguard to a scripted fake chat-completions server:
Qwen Code runs headless (:mod:`tests.helpers.qwen_code`), a TCP tap between Qwen Code and loopguard keeps
the bytes Qwen Code sent, the fake (:mod:`tests.helpers.fake_qwen_server`) keeps what reached it. Skipped
with an install hint when the pinned Qwen Code is not installed (``.ci/run`` installs it).

The model either answers the way a server without a tool-call parser does (the call as Qwen3-Coder
XML in ``content``, ``finish_reason: "stop"``) or, for the controls, with structured
``tool_calls``. Wire shapes and Qwen Code's own reactions: see :mod:`tests.helpers.qwen_code`.

- repair off (what users get today): the text call never runs, Qwen Code prints the markup as its
  answer and stops after one request.
- repair on (``response.repair_text_tool_calls``, the default): the call runs, and a repeated one
  is guarded like a structured one, with the same numbers.
- controls (structured calls; no repair needed): a repeated identical call is ended by Qwen Code's
  own guard at the 5th call, after loopguard's reminder reached the model; a period-2 cycle,
  which Qwen Code does not see, is ended by loopguard.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import ProxyFactory
from tests.helpers.fake_qwen_server import (
    Answer,
    FakeChat,
    alternating_reads,
    hermes_json,
    qwen3_coder_xml,
    read_then_answer,
    repeating_read,
)
from tests.helpers.fakes import FakeUpstream
from tests.helpers.qwen_code import OWN_LOOP_HALT, QwenRun, find_qwen, run_qwen
from tests.helpers.tcp_tap import Tap, tap

FINAL = "The file says hello."
A_TEXT = "hello from a\n"
B_TEXT = "hello from b\n"
#: What Qwen Code's read_file gives for a file it already read and that has not changed.
UNCHANGED = "[File a.txt unchanged since last read in this session"


def repair(on: bool) -> dict[str, Any]:
    """The loopguard config with the repair on or off."""
    return {"response": {"repair_text_tool_calls": on}}


@pytest.fixture
def qwen() -> str:
    return find_qwen()


@dataclasses.dataclass
class Session:
    run: QwenRun
    tap: Tap
    stats: dict[str, Any]
    fake: FakeChat

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return self.fake.bodies


async def qwen_session(
    qwen: str,
    upstream: FakeUpstream,
    make_proxy: ProxyFactory,
    work: Path,
    home: Path,
    fake: FakeChat,
    config: dict[str, Any] | None,
    prompt: str = "Read a.txt and tell me what it says.",
) -> Session:
    """One ``qwen -p`` in ``work`` through a tap and a fresh loopguard (``config``) to ``fake``."""
    upstream.handler = fake.handle
    base = await make_proxy(config)
    async with tap(int(base.rsplit(":", 1)[1])) as t:
        run = await run_qwen(qwen, f"http://127.0.0.1:{t.port}/v1", prompt, work, home)
    async with aiohttp.ClientSession() as s, s.get(f"{base}/loop-guard") as r:
        stats = await r.json()
    assert fake.errors == []
    return Session(run, t, stats, fake)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """The work dir Qwen Code runs in: ``a.txt`` and ``b.txt``."""
    w = tmp_path / "work"
    w.mkdir()
    (w / "a.txt").write_text(A_TEXT)
    (w / "b.txt").write_text(B_TEXT)
    return w


def tool_texts(body: dict[str, Any]) -> list[str]:
    """The text of every ``tool`` message (Qwen Code sends a list of text parts)."""
    out = []
    for m in body["messages"]:
        if m.get("role") == "tool":
            c = m["content"]
            out.append(c if isinstance(c, str) else "".join(p.get("text", "") for p in c))
    return out


def reminders(body: dict[str, Any]) -> list[str]:
    """The ``[loopguard]`` texts of user messages (the reminders loopguard inserts)."""
    out = []
    for m in body["messages"]:
        if m.get("role") != "user":
            continue
        c = m["content"]
        texts = [c] if isinstance(c, str) else [p.get("text", "") for p in c if isinstance(p, dict)]
        out += [t for t in texts if t.startswith("[loopguard]")]
    return out


def called(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The (name, arguments) of every structured call echoed back in the history."""
    return [
        (tc["function"]["name"], json.loads(tc["function"]["arguments"]))
        for m in body["messages"]
        if m.get("role") == "assistant"
        for tc in m.get("tool_calls") or []
    ]


def streamed(raw: bytes) -> tuple[str, list[str], list[str]]:
    """What one SSE answer says: its content, the names of its tool calls, its finish reasons."""
    content, names, finishes = "", [], []
    for event in raw.split(b"\n\n"):
        data = event.removeprefix(b"data: ")
        if not data or data == b"[DONE]":
            continue
        for choice in json.loads(data).get("choices") or []:
            delta = choice.get("delta") or {}
            content += delta.get("content") or ""
            names += [
                tc["function"]["name"]
                for tc in delta.get("tool_calls") or []
                if tc.get("function", {}).get("name")
            ]
            if choice.get("finish_reason"):
                finishes.append(choice["finish_reason"])
    return content, names, finishes


def paths(work: Path) -> tuple[str, str]:
    return str(work / "a.txt"), str(work / "b.txt")


def text_format(fake: FakeChat, fmt: str) -> FakeChat:
    """``fake`` with its text calls written as ``fmt``: ``xml`` (Qwen3-Coder, as built) or
    ``hermes`` (the same calls as hermes JSON blocks)."""
    if fmt == "xml":
        return fake
    inner = fake.script

    def script(n: int, body: dict[str, Any]) -> Answer:
        answer = inner(n, body)
        m = XML_CALL.fullmatch(answer.content or "")
        if not m:
            return answer
        return Answer(content=hermes_json(m["name"], {m["key"]: m["value"]}))

    fake.script = script
    return fake


XML_CALL = re.compile(
    r"<tool_call>\n<function=(?P<name>\w+)>\n<parameter=(?P<key>\w+)>\n(?P<value>.*)\n</parameter>\n"
    r"</function>\n</tool_call>"
)


# --- controls: structured calls (no repair involved) ---------------------------------------------


async def test_structured_read_runs_and_reaches_the_model_byte_identical(
    qwen: str, upstream: FakeUpstream, make_proxy: ProxyFactory, work: Path, tmp_path: Path
) -> None:
    """A model that reads a.txt once, then answers: what Qwen Code sent is what the fake got and
    what the fake answered is what Qwen Code got, byte for byte; the result is the file's text as
    a list of text parts (:mod:`tests.helpers.qwen_code`)."""
    a, _ = paths(work)
    fake = read_then_answer(a, text=False, final=FINAL)
    s = await qwen_session(qwen, upstream, make_proxy, work, tmp_path / "home", fake, None)
    assert (s.run.returncode, s.run.stdout) == (0, FINAL + "\n"), s.run.stderr
    assert len(s.bodies) == 2
    assert [body for _, body in s.tap.requests()] == [r.body for r in upstream.requests]
    assert [body for _, body in s.tap.responses()] == fake.answers
    assert (s.stats["guarded_requests"], s.stats["rewritten_requests"], s.stats["stops"]) == (2, 0, 0)
    first, second = s.bodies
    assert (first["stream"], first["stream_options"], first["max_tokens"]) == (
        True,
        {"include_usage": True},
        32000,
    )
    assert "read_file" in [t["function"]["name"] for t in first["tools"]]
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool"]
    assert called(second) == [("read_file", {"file_path": a})]
    assert second["messages"][3]["content"] == [{"type": "text", "text": A_TEXT}]


async def test_structured_same_call_is_ended_by_qwen_codes_own_guard_after_loopguards_reminder(
    qwen: str, upstream: FakeUpstream, make_proxy: ProxyFactory, work: Path, tmp_path: Path
) -> None:
    """The same read 20 times (structured): Qwen Code's always-on guard refuses the 5th identical
    call and exits 1 (4 calls ran, 5 requests). Loopguard's first reminder reached the model in
    the 5th request: the first read's result (the file) differs from the later ones (Qwen Code's
    "unchanged since last read" stub), so the no-progress chain starts at the 2nd call and reaches
    3 at the 4th. Loopguard's withhold (6th) and stop never come."""
    a, _ = paths(work)
    fake = repeating_read(a, text=False)
    s = await qwen_session(qwen, upstream, make_proxy, work, tmp_path / "home", fake, None)
    assert s.run.returncode == 1 and OWN_LOOP_HALT in s.run.stderr, s.run.stderr
    assert s.run.stdout == ""
    assert len(s.bodies) == 5
    results = tool_texts(s.bodies[-1])
    assert len(results) == 4  # calls ran
    assert results[0] == A_TEXT and all(r.startswith(UNCHANGED) for r in results[1:])
    assert [len(reminders(b)) for b in s.bodies] == [0, 0, 0, 0, 1]
    assert reminders(s.bodies[-1])[0].startswith(
        "[loopguard] You have made the same tool call several times in a row."
    )
    assert (s.stats["reminders_injected"], s.stats["results_withheld"], s.stats["stops"]) == (1, 0, 0)


async def test_structured_cycle_is_ended_by_loopguard(
    qwen: str, upstream: FakeUpstream, make_proxy: ProxyFactory, work: Path, tmp_path: Path
) -> None:
    """Reads of a.txt and b.txt in turn (structured), a loop Qwen Code's default guards do not
    see: loopguard's cycle reminder (7th request), recurrence reminders (8th, 9th), withheld
    results (9th, 10th), then its stop as the 10th answer, which Qwen Code prints and exits 0 on:
    9 calls ran."""
    fake = alternating_reads(paths(work), text=False)
    s = await qwen_session(qwen, upstream, make_proxy, work, tmp_path / "home", fake, None)
    assert s.run.returncode == 0, s.run.stderr
    assert s.run.stdout.startswith("[loopguard] Stopped: the model kept calling read_file"), s.run.stdout
    assert len(s.bodies) == 10
    results = tool_texts(s.bodies[-1])
    assert len(results) == 9  # calls ran
    assert [len(reminders(b)) for b in s.bodies] == [0, 0, 0, 0, 0, 0, 1, 2, 3, 3]
    assert reminders(s.bodies[-1])[0].startswith("[loopguard] You are going in circles")
    withheld = "[loopguard] The result of this call is withheld: it continues a cycle of 2 steps"
    assert [r.startswith(withheld) for r in results] == [False] * 7 + [True] * 2
    assert (s.stats["results_withheld"], s.stats["stops"]) == (2, 1)
    # none of it is in what Qwen Code sent: the edits are loopguard's alone
    sent = [json.loads(body) for _, body in s.tap.requests()]
    assert not any(reminders(b) for b in sent)
    assert not any(t.startswith("[loopguard]") for b in sent for t in tool_texts(b))


async def test_structured_cycle_without_loopguard_runs_to_the_models_limit(
    qwen: str, upstream: FakeUpstream, work: Path, tmp_path: Path
) -> None:
    """The same cycle straight to the fake (no loopguard): Qwen Code runs all 30 calls the model
    asks for and prints the model's "Giving up." (its own guard sees no 5 identical calls in a
    row; its alternating-pattern detector is off by default)."""
    fake = alternating_reads(paths(work), text=False, times=30)
    upstream.handler = fake.handle
    run = await run_qwen(qwen, upstream.url, "Read a.txt and tell me what it says.", work, tmp_path / "home")
    assert fake.errors == []
    assert (run.returncode, run.stdout) == (0, "Giving up.\n"), run.stderr
    assert len(fake.bodies) == 31
    assert len(tool_texts(fake.bodies[-1])) == 30  # calls ran
    assert not any(reminders(b) for b in fake.bodies)


# --- repair off: what users get today ------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["xml", "hermes"])
async def test_text_call_without_repair_never_runs(
    qwen: str, upstream: FakeUpstream, make_proxy: ProxyFactory, work: Path, tmp_path: Path, fmt: str
) -> None:
    """A server without a tool parser, repair off (``repair_text_tool_calls: false``; a loopguard
    without the key has no repair): the model's read arrives as markup in ``content``, loopguard
    passes the answer through byte for byte, Qwen Code takes it as the final answer, prints the
    markup and exits 0 after one request. The file is never read and the model never hears
    back; the 19 more calls it would make never happen."""
    a, _ = paths(work)
    fake = text_format(repeating_read(a, text=True), fmt)
    s = await qwen_session(qwen, upstream, make_proxy, work, tmp_path / "home", fake, repair(False))
    markup = {
        "xml": qwen3_coder_xml("read_file", {"file_path": a}),
        "hermes": hermes_json("read_file", {"file_path": a}),
    }
    assert (s.run.returncode, s.run.stdout) == (0, markup[fmt] + "\n"), s.run.stderr
    assert len(s.bodies) == 1
    assert [body for _, body in s.tap.responses()] == fake.answers
    assert streamed(fake.answers[0]) == (markup[fmt], [], ["stop"])
    assert (s.stats["guarded_requests"], s.stats["rewritten_requests"], s.stats["stops"]) == (1, 0, 0)
    assert s.stats.get("responses_repaired", 0) == 0


# --- repair on (the default) ---------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["xml", "hermes"])
async def test_repaired_text_call_runs_in_qwen_code(
    qwen: str, upstream: FakeUpstream, make_proxy: ProxyFactory, work: Path, tmp_path: Path, fmt: str
) -> None:
    """The same markup with repair on (the default): Qwen Code gets a structured ``read_file``
    call (``finish_reason: "tool_calls"``, no markup left in the content), runs it, and the file's
    text reaches the model in the next request; then the model's answer is the final one."""
    a, _ = paths(work)
    fake = text_format(read_then_answer(a, text=True, final=FINAL), fmt)
    s = await qwen_session(qwen, upstream, make_proxy, work, tmp_path / "home", fake, repair(True))
    assert (s.run.returncode, s.run.stdout) == (0, FINAL + "\n"), s.run.stderr
    assert len(s.bodies) == 2
    got = s.tap.responses()[0][1]
    content, names, finishes = streamed(got)
    assert (names, finishes) == (["read_file"], ["tool_calls"])
    assert "<tool_call>" not in content and "<function=" not in content
    assert called(s.bodies[1]) == [("read_file", {"file_path": a})]
    assert tool_texts(s.bodies[1]) == [A_TEXT]
    assert (s.stats["responses_repaired"], s.stats["text_calls_repaired"]) == (1, 1)


async def test_repaired_same_call_is_guarded_like_a_structured_one(
    qwen: str, upstream: FakeUpstream, make_proxy: ProxyFactory, work: Path, tmp_path: Path
) -> None:
    """The same read 20 times as text, repair on: the same run as the structured control —
    loopguard's reminder in the 5th request, then Qwen Code's own guard refuses the 5th
    (repaired) call: 4 calls ran, exit 1."""
    a, _ = paths(work)
    fake = repeating_read(a, text=True)
    s = await qwen_session(qwen, upstream, make_proxy, work, tmp_path / "home", fake, repair(True))
    assert s.run.returncode == 1 and OWN_LOOP_HALT in s.run.stderr, s.run.stderr
    assert len(s.bodies) == 5
    results = tool_texts(s.bodies[-1])
    assert len(results) == 4  # calls ran
    assert results[0] == A_TEXT and all(r.startswith(UNCHANGED) for r in results[1:])
    assert [len(reminders(b)) for b in s.bodies] == [0, 0, 0, 0, 1]
    # every answer was repaired, the 5th too (Qwen Code then refused to run it)
    assert (s.stats["responses_repaired"], s.stats["reminders_injected"], s.stats["stops"]) == (5, 1, 0)


async def test_repaired_cycle_is_ended_by_loopguard(
    qwen: str, upstream: FakeUpstream, make_proxy: ProxyFactory, work: Path, tmp_path: Path
) -> None:
    """Reads of a.txt and b.txt in turn as text, repair on: the same run as the structured
    control — reminders, two withheld results, loopguard's stop as the 10th answer (its stop
    text, not repaired markup): 9 calls ran, exit 0."""
    fake = alternating_reads(paths(work), text=True)
    s = await qwen_session(qwen, upstream, make_proxy, work, tmp_path / "home", fake, repair(True))
    assert s.run.returncode == 0, s.run.stderr
    assert s.run.stdout.startswith("[loopguard] Stopped: the model kept calling read_file"), s.run.stdout
    assert len(s.bodies) == 10
    results = tool_texts(s.bodies[-1])
    assert len(results) == 9  # calls ran
    assert [len(reminders(b)) for b in s.bodies] == [0, 0, 0, 0, 0, 0, 1, 2, 3, 3]
    withheld = "[loopguard] The result of this call is withheld: it continues a cycle of 2 steps"
    assert [r.startswith(withheld) for r in results] == [False] * 7 + [True] * 2
    # the 10th answer counts as repaired too: repaired first, then replaced by the stop
    assert (s.stats["responses_repaired"], s.stats["results_withheld"], s.stats["stops"]) == (10, 2, 1)


# --- the fake itself (no Qwen Code needed) ---------------------------------------------------------


def read_file_tool() -> dict[str, Any]:
    props = {"file_path": {"type": "string"}, "offset": {"type": ["integer", "null"]}}
    return {"type": "function", "function": {"name": "read_file", "parameters": {"properties": props}}}


@pytest.mark.parametrize("stream", [True, False])
async def test_fake_answers_a_text_call_as_a_server_without_a_tool_parser(
    upstream: FakeUpstream, stream: bool
) -> None:
    """The fake's text call: Qwen3-Coder XML in ``content``, ``finish_reason: "stop"``, no
    ``tool_calls``; streamed in 8-character deltas with the usage chunk when asked for."""
    fake = repeating_read("/w/a.txt", text=True, times=1)
    upstream.handler = fake.handle
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [read_file_tool()]}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    async with aiohttp.ClientSession() as s, s.post(f"{upstream.url}/chat/completions", json=body) as r:
        raw = await r.read()
    xml = (
        "<tool_call>\n<function=read_file>\n<parameter=file_path>\n/w/a.txt\n"
        "</parameter>\n</function>\n</tool_call>"
    )
    assert fake.answers == [raw] and fake.errors == []
    if stream:
        assert streamed(raw) == (xml, [], ["stop"])
        events = raw.split(b"\n\n")
        assert events[-3:] == [events[-3], b"data: [DONE]", b""]
        assert json.loads(events[-3].removeprefix(b"data: "))["choices"] == []
        assert all(
            len(json.loads(e[6:])["choices"][0]["delta"].get("content") or "") <= 8 for e in events[1:-4]
        )
    else:
        choice = json.loads(raw)["choices"][0]
        assert (choice["message"]["content"], choice["finish_reason"]) == (xml, "stop")
        assert "tool_calls" not in choice["message"]


async def test_fake_refuses_to_call_a_tool_the_request_does_not_offer(upstream: FakeUpstream) -> None:
    """A request without ``read_file`` (or without its ``file_path`` parameter): the fake records
    the miss and answers text naming it, so a renamed tool fails the test."""
    fake = repeating_read("/w/a.txt", text=True)
    upstream.handler = fake.handle
    renamed = {
        "type": "function",
        "function": {"name": "read_file", "parameters": {"properties": {"path": {}}}},
    }
    async with aiohttp.ClientSession() as s:
        for tools in ([], [renamed]):
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools}
            async with s.post(f"{upstream.url}/chat/completions", json=body) as r:
                content = (await r.json())["choices"][0]["message"]["content"]
            assert content.startswith("fake: tool read_file with parameters ['file_path'] not offered")
    assert fake.errors == [
        "tool read_file with parameters ['file_path'] not offered (offered: None)",
        "tool read_file with parameters ['file_path'] not offered (offered: {'path'})",
    ]


def test_hermes_block_is_the_same_call_as_json() -> None:
    assert hermes_json("read_file", {"file_path": "/w/a.txt"}) == (
        '<tool_call>\n{"name":"read_file","arguments":{"file_path":"/w/a.txt"}}\n</tool_call>'
    )


async def test_deliver_error_makes_qwen_p_exit_1_with_the_stop_text_and_no_retry(
    qwen: str, upstream: FakeUpstream, make_proxy: ProxyFactory, work: Path, tmp_path: Path
) -> None:
    """The structured cycle above with ``stop.deliver: error``: the 10th answer becomes an HTTP
    400 (``invalid_request_error``, code ``loop_detected``); Qwen Code sends it once, prints
    ``[API Error: 400 [loopguard] Stopped: …]`` on stderr, nothing on stdout, and exits 1."""
    fake = alternating_reads(paths(work), text=False)
    s = await qwen_session(
        qwen, upstream, make_proxy, work, tmp_path / "home", fake, {"stop": {"deliver": "error"}}
    )
    assert (s.run.returncode, s.run.stdout, len(s.bodies)) == (1, "", 10), s.run.stderr
    want = "[API Error: 400 [loopguard] Stopped: the model kept calling read_file (5 times) and ignored 2"
    assert want in s.run.stderr, s.run.stderr
    assert (s.stats["stops"], [i["kind"] for i in s.stats["incidents"]]) == (1, ["stop"])
