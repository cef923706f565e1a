"""The real Gemini CLI through loopguard to a scripted fake Gemini API (:mod:`tests.helpers.fake_gemini`):
Gemini CLI runs headless (:mod:`tests.helpers.gemini_cli`), a TCP tap between it and loopguard keeps the
bytes it sent and got, the fake keeps what reached it; some runs go straight to the fake, to pin
what Gemini CLI does on its own. Skipped with an install hint when the pinned Gemini CLI is not
installed (``.ci/run`` installs it).

What Gemini CLI 0.61.0 sends (measured against the fake): every model request is ``POST
/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse`` with ``x-goog-api-key``,
``x-goog-api-client: google-genai-sdk/…``, ``User-Agent: GeminiCLI-tui/0.61.0/gemini-2.5-pro …``;
body keys ``contents``, ``systemInstruction``, ``tools`` (one tool of 16
``functionDeclarations`` with ``parametersJsonSchema``), ``generationConfig``. ``contents[0]`` is
a user content holding the session context (date, OS, directories) then the prompt; each step is
a ``model`` content whose ``functionCall`` parts carry the CLI's own ``id``
(``{name}_{ms}_{n}``) and ``thoughtSignature: "skip_thought_signature_validator"``, and a user
content of ``functionResponse`` parts with the same ``id``, ``name`` and ``response: {"output":
…}`` (a shell result: ``<untrusted_context>\\nOutput: …\\nProcess Group PGID: <n>\\n
</untrusted_context>``; the PGID changes on every run, :data:`proxy.core.volatile.DEFAULT_MASKS`
masks it).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import ProxyFactory
from tests.helpers.fake_gemini import FakeGemini, Part, call, text
from tests.helpers.fakes import FakeUpstream
from tests.helpers.gemini_cli import FAKE_KEY, GEMINI_VERSION, GeminiRun, find_gemini, run_gemini, version_of
from tests.helpers.tcp_tap import Tap, http_messages, tap

PROMPT = "Show me app.txt."
FINAL = "All done: app.txt says hello."
#: The looping command: one line appended to runs.log per run (how many times the CLI really ran
#: it), the same output every time.
LOOP_CMD = "echo run >> runs.log; cat app.txt"
#: The fake gives up after this many tool calls (a hard stop when nothing ends the loop).
LIMIT = 30
STREAM_PATH = "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"


@pytest.fixture
def gemini() -> str:
    return find_gemini()


@pytest.fixture
def work(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    (path / "app.txt").write_text("hello app\n")
    return path


def root_of(url: str) -> str:
    """``http://h:p/v1`` → ``http://h:p`` (the SDK appends ``/v1beta/models/…`` itself)."""
    return url.removesuffix("/v1")


async def stats_of(base: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(f"{base}/loop-guard") as r:
        return await r.json()


def runs(workdir: Path) -> int:
    log = workdir / "runs.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def shell(command: str) -> Part:
    return call("run_shell_command", {"command": command})


def looping_fake(part: Part, limit: int = LIMIT) -> FakeGemini:
    """A model that repeats one call until request ``limit``, which it answers with a text."""

    def script(n: int, body: dict[str, Any]) -> list[Part]:
        return [part] if n < limit else [text("Giving up.")]

    return FakeGemini(script)


def responses(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every ``functionResponse`` of the request, in order."""
    return [
        p["functionResponse"]
        for c in body["contents"]
        if c.get("role") == "user"
        for p in c["parts"]
        if "functionResponse" in p
    ]


def reminders(body: dict[str, Any]) -> list[str]:
    """The ``[loopguard]`` texts of user contents' text parts (the reminders loopguard adds)."""
    return [
        p["text"]
        for c in body["contents"]
        if c.get("role") == "user"
        for p in c["parts"]
        if isinstance(p.get("text"), str) and p["text"].startswith("[loopguard]")
    ]


async def direct_session(
    gemini: str, upstream: FakeUpstream, tmp_path: Path, work: Path, fake: FakeGemini, **kw: Any
) -> GeminiRun:
    """One ``gemini -p`` straight to ``fake`` (no loopguard)."""
    upstream.handler = fake.handle
    return await run_gemini(gemini, root_of(upstream.url), PROMPT, work, tmp_path / "home", **kw)


async def proxied_session(
    gemini: str,
    upstream: FakeUpstream,
    make_proxy: ProxyFactory,
    tmp_path: Path,
    work: Path,
    fake: FakeGemini,
    config: dict[str, Any] | None = None,
    **kw: Any,
) -> tuple[GeminiRun, Tap, dict[str, Any]]:
    """One ``gemini -p`` through a tap and a fresh loopguard to ``fake``: (run, tap, stats)."""
    upstream.handler = fake.handle
    base = await make_proxy(config)
    async with tap(int(base.rsplit(":", 1)[1])) as t:
        run = await run_gemini(gemini, f"http://127.0.0.1:{t.port}", PROMPT, work, tmp_path / "home", **kw)
    return run, t, await stats_of(base)


def head_fields(head: bytes) -> dict[bytes, bytes]:
    fields = {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        fields[name.strip().lower()] = value.strip()
    return fields


def exchanges(t: Tap) -> list[tuple[bytes, bytes]]:
    """(request body, response body) of every HTTP exchange that passed the tap."""
    return [
        (req, resp)
        for c in t.connections
        for (_, req), (_, resp) in zip(
            http_messages(bytes(c.sent)), http_messages(bytes(c.received)), strict=True
        )
    ]


#: What Gemini CLI prints when loopguard stops an exact repeat of :data:`LOOP_CMD` (the stop text,
#: as the answer's text).
STOP_TEXT = (
    "[loopguard] Stopped: the model kept calling run_shell_command after 2 reminders and a withheld "
    "result that said it was not getting anywhere, so loopguard ended its turn here; that last call "
    "was not run. Send a message to continue.\n"
)


# --- Gemini CLI on its own ----------------------------------------------------------------------------


def test_the_pinned_version_is_the_one_found(gemini: str) -> None:
    assert version_of(gemini) == GEMINI_VERSION


async def test_its_own_loop_detection_ends_an_exact_repeat_at_the_5th_call_printing_nothing(
    gemini: str, upstream: FakeUpstream, tmp_path: Path, work: Path
) -> None:
    """Straight to the fake, with its defaults: Gemini CLI's own loop detection sees the 5th
    identical call in a row, does not run it and ends the run: exit 0, nothing on stdout (the
    user is not told why); 4 runs, 6 requests (the answers after the 4th call and the loop)."""
    fake = looping_fake(shell(LOOP_CMD))
    run = await direct_session(gemini, upstream, tmp_path, work, fake)
    assert (run.returncode, run.stdout, runs(work), len(fake.bodies)) == (0, "", 4, 6)
    assert [r.path_qs for r in fake.requests] == [STREAM_PATH] * 6
    assert fake.side_bodies == []


async def test_with_its_loop_detection_off_every_repeated_call_runs(
    gemini: str, upstream: FakeUpstream, tmp_path: Path, work: Path
) -> None:
    """``model.disableLoopDetection``: a model that repeats one shell call 30 times, straight to
    the fake: all 30 run, 31 requests, the final text printed."""
    fake = looping_fake(shell(LOOP_CMD))
    run = await direct_session(gemini, upstream, tmp_path, work, fake, loop_detection=False)
    assert (run.returncode, run.stdout, runs(work), len(fake.bodies)) == (0, "Giving up.\n", LIMIT, LIMIT + 1)
    got = responses(fake.bodies[-1])
    assert len(got) == LIMIT
    assert all(
        re.fullmatch(
            r"<untrusted_context>\nOutput: hello app\nProcess Group PGID: \d+\n</untrusted_context>",
            r["response"]["output"],
        )
        for r in got
    )
    assert not reminders(fake.bodies[-1])


# --- through loopguard ------------------------------------------------------------------------------


async def test_the_exact_repeat_loop_ends_at_the_7th_call_with_the_stop_text_printed(
    gemini: str, upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path, work: Path
) -> None:
    """The same model through loopguard (the CLI's own detection off, so loopguard is what ends
    it): reminders after the 3rd and 5th call, the 6th call's result withheld (``{"error":
    <denial>}``), the 7th call replaced by the stop text: Gemini CLI runs 6, prints the stop text
    as the answer and exits 0 on its own."""
    fake = looping_fake(shell(LOOP_CMD))
    run, t, stats = await proxied_session(
        gemini, upstream, make_proxy, tmp_path, work, fake, loop_detection=False
    )
    assert (run.returncode, run.stdout, runs(work), len(fake.bodies)) == (0, STOP_TEXT, 6, 7)
    assert stats["per_rule"] == {"escalation": 1, "repeat_reminder": 2, "stop": 1}
    assert (stats["stops"], stats["internal_errors"]) == (1, 0)
    last = fake.bodies[-1]
    got = [r["response"] for r in responses(last)]
    assert [list(r) for r in got] == [["output"]] * 5 + [["error"]]
    assert got[-1]["error"].startswith(
        "[loopguard] The result of this call is withheld: you were reminded 2 times"
    )
    assert [len(reminders(b)) for b in fake.bodies] == [0, 0, 0, 1, 1, 2, 2]
    # the reminders are user contents of one text part right after the results they follow
    roles = [(c["role"], [next(iter(p)) for p in c["parts"]]) for c in last["contents"]]
    step = [("model", ["functionCall"]), ("user", ["functionResponse"])]
    reminder = [("user", ["text"])]
    assert roles[1:] == step * 3 + reminder + step * 2 + reminder + step
    # the agent got the stop as a text-only answer
    answer = exchanges(t)[-1][1]
    assert b"functionCall" not in answer
    assert answer.count(b'"finishReason":"STOP"') == 1


async def test_with_its_own_detection_on_the_cli_still_ends_an_exact_repeat_first(
    gemini: str, upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path, work: Path
) -> None:
    """With the CLI's defaults through loopguard: loopguard reminds after the 3rd call and the
    CLI's detection ends the run at the 5th, as without loopguard (4 runs, nothing printed)."""
    fake = looping_fake(shell(LOOP_CMD))
    run, _, stats = await proxied_session(gemini, upstream, make_proxy, tmp_path, work, fake)
    assert (run.returncode, run.stdout, runs(work), len(fake.bodies)) == (0, "", 4, 6)
    assert stats["per_rule"] == {"repeat_reminder": 1}


async def test_a_cycle_its_own_detection_misses_ends_with_the_stop_text_printed(
    gemini: str, upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path, work: Path
) -> None:
    """A model alternating two calls (the shell command and a read of app.txt) is no loop to the
    CLI's detection (it counts identical calls in a row): through loopguard, with the CLI's
    defaults, reminders from the 5th call, the 8th and 9th results withheld, the 10th call
    replaced by the stop text, which the CLI prints (5 shell runs, 10 requests)."""

    def script(n: int, body: dict[str, Any]) -> list[Part]:
        if n >= LIMIT:
            return [text("Giving up.")]
        return [shell(LOOP_CMD)] if n % 2 == 0 else [call("read_file", {"file_path": "app.txt"})]

    fake = FakeGemini(script)
    run, _, stats = await proxied_session(gemini, upstream, make_proxy, tmp_path, work, fake)
    stop = (
        "[loopguard] Stopped: the model kept calling read_file (5 times) and ignored 2 withheld "
        "results, so loopguard ended its turn here; that last call was not run. Send a message to "
        "continue.\n"
    )
    assert (run.returncode, run.stdout, runs(work), len(fake.bodies)) == (0, stop, 5, 10)
    assert stats["per_rule"] == {"cycles": 3, "recurrence": 2, "stop": 1}
    assert [list(r["response"]) for r in responses(fake.bodies[-1])] == [["output"]] * 7 + [["error"]] * 2


async def test_a_healthy_session_reaches_the_model_byte_identical(
    gemini: str, upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path, work: Path
) -> None:
    """Two different reads, a successful edit, a passing command, then a text: no action, every
    byte Gemini CLI sent reaches the fake and every byte the fake answered reaches the CLI; the
    ``x-goog-api-key`` and SDK headers pass untouched; the edit and the command really ran."""
    (work / "b.txt").write_text("second file\n")

    def script(n: int, body: dict[str, Any]) -> list[Part]:
        steps: list[list[Part]] = [
            [text("Reading both files."), call("read_file", {"file_path": "app.txt"})],
            [call("read_file", {"file_path": "b.txt"})],
            [
                call(
                    "replace",
                    {
                        "file_path": str(work / "app.txt"),
                        "instruction": "Say hi instead of hello.",
                        "old_string": "hello app",
                        "new_string": "hi app",
                    },
                )
            ],
            [shell("echo run >> runs.log; grep -c hi app.txt")],
        ]
        return steps[n] if n < len(steps) else [text(FINAL)]

    fake = FakeGemini(script)
    run, t, stats = await proxied_session(gemini, upstream, make_proxy, tmp_path, work, fake)
    assert (run.returncode, run.stdout, runs(work)) == (0, f"Reading both files.\n{FINAL}\n", 1), run.stderr
    assert (work / "app.txt").read_text() == "hi app\n"
    sent = t.requests()
    assert [h.split(b" ")[:2] for h, _ in sent] == [[b"POST", STREAM_PATH.encode()]] * 5
    assert [body for _, body in sent] == [r.body for r in upstream.requests]
    assert [body for _, body in t.responses()] == fake.answers
    for (head, _), got in zip(sent, upstream.requests, strict=True):
        fields = head_fields(head)
        lower = {k.lower().encode(): v.encode() for k, v in got.headers.items()}
        for name in (b"x-goog-api-key", b"x-goog-api-client", b"user-agent"):
            assert lower[name] == fields[name]
    assert fields[b"x-goog-api-key"] == FAKE_KEY.encode()
    assert (stats["rewritten_requests"], stats["stops"], stats["internal_errors"]) == (0, 0, 0)
    assert stats["per_rule"] == {}
    last = fake.bodies[-1]
    outputs = [r["response"] for r in responses(last)]
    assert outputs[:2] == [{"output": "hello app\n"}, {"output": "second file\n"}]
    assert "error" not in outputs[2] and list(outputs[3]) == ["output"]
    assert outputs[3]["output"].startswith("<untrusted_context>\nOutput: 1\n")


async def test_twenty_identical_reads_in_one_answer_reach_the_cli_as_four(
    gemini: str, upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path, work: Path
) -> None:
    """A model stuck emitting the same read in one answer (20 identical ``read_file`` calls, then
    a text on the next request): through loopguard the CLI gets the first 4
    (``response.max_identical_reads_per_response``), runs them and sends 4 results; the answer it
    printed is the model's own."""

    def script(n: int, body: dict[str, Any]) -> list[Part]:
        if n == 0:
            return [call("read_file", {"file_path": str(work / "app.txt")}) for _ in range(20)]
        return [text(FINAL)]

    fake = FakeGemini(script)
    run, _, stats = await proxied_session(
        gemini, upstream, make_proxy, tmp_path, work, fake, loop_detection=False
    )
    assert (run.returncode, run.stdout, len(fake.bodies)) == (0, FINAL + "\n", 2)
    sent = [
        p
        for c in fake.bodies[1]["contents"]
        if c["role"] == "model"
        for p in c["parts"]
        if "functionCall" in p
    ]
    assert [(p["functionCall"]["name"], p["functionCall"]["args"]) for p in sent] == [
        ("read_file", {"file_path": str(work / "app.txt")})
    ] * 4
    assert [r["name"] for r in responses(fake.bodies[1])] == ["read_file"] * 4
    # the request side may remind about the four identical results (its rules, not pinned here)
    assert (stats["responses_cut"], stats["per_rule"]["runaway"], stats["internal_errors"]) == (1, 1, 0)


async def test_deliver_error_makes_gemini_p_exit_1_with_the_error_and_no_retry(
    gemini: str, upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path, work: Path
) -> None:
    """``stop.deliver: error``: the 7th answer (streamed, held since a stop was possible) becomes
    an HTTP 400 (``INVALID_ARGUMENT``, ErrorInfo reason ``LOOP_DETECTED``). Gemini CLI sends it
    once, prints nothing on stdout and the error body inside a stack trace on stderr, and exits 1:
    7 requests, 6 runs, 1 stop."""
    fake = looping_fake(shell(LOOP_CMD))
    run, _, stats = await proxied_session(
        gemini,
        upstream,
        make_proxy,
        tmp_path,
        work,
        fake,
        {"stop": {"deliver": "error"}},
        loop_detection=False,
    )
    assert (run.returncode, run.stdout, runs(work), len(fake.bodies)) == (1, "", 6, 7), run.stderr
    want = '_ApiError: {"error":{"code":400,"message":"[loopguard] Stopped: the model kept calling run_shell'
    assert want in run.stderr, run.stderr
    assert '"reason":"LOOP_DETECTED"' in run.stderr
    assert (stats["stops"], [i["kind"] for i in stats["incidents"]]) == (1, ["stop"])
