"""The request side's fast path (:mod:`proxy.request.prefix_cache`) with real agents:
Codex CLI, Claude Code and Qwen Code each run the same looping session through loopguard twice,
once with the default config (the prefix cache on) and once with ``prefix_cache.max_bytes_mb: 0``
(off), against a scripted fake model that repeats one shell command printing ~20 KB (the same
every time), so the agent's request bodies pass :data:`proxy.request.prefix_cache.FAST_MIN`
(64 KiB) after a step or two. The fakes' ids are numbered by request, so the model's side of both
runs is the same.

Each test asserts:

1. the bodies that reached the model are the same in both runs, request by request. Two runs of
   an agent differ in the agent's own ids and clocks, cache or not; each agent's ``*_VOLATILE``
   list names exactly the fields replaced before comparing (nothing else is touched; Qwen Code
   needs none). Then, with nothing replaced, each run's own requests (the bytes the tap kept,
   with their headers) are sent again in order through a fresh loopguard with the cache the
   other way round, to a fake answering what the run's fake answered: the model gets the run's
   bodies byte for byte and the stats count the same actions.
2. the cache-on run resumed every request after the first (``hits`` = requests − 1), by the fast
   path for every one of them of 64 KiB or more (``fast_hits``); the exact counters are pinned.
3. the loop was acted on the same way in both runs: the same reminders, withheld results and
   stop (loopguard's counters), the same number of times the agent ran the command, the same
   exit.

Claude Code moves its ``cache_control`` marker to the newest message on every request, so the
previous request's last message never reappears byte for byte: its requests resume one message
earlier (found by this test: before that, Claude Code never resumed). A one-block content list it
moved away from becomes a plain string, which makes its second request a miss.

The harnesses, their skip conditions and wire shapes: :mod:`tests.helpers.codex_cli`,
:mod:`tests.helpers.claude_code`, :mod:`tests.helpers.qwen_code`.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from proxy.request.prefix_cache import FAST_MIN
from tests.conftest import ProxyFactory
from tests.helpers.claude_code import find_claude, run_claude
from tests.helpers.codex_cli import find_codex, run_codex
from tests.helpers.fake_messages import FakeMessages, text, tool_use
from tests.helpers.fake_qwen_server import Answer, FakeChat, offered_parameters
from tests.helpers.fake_responses import FakeResponses, function_call, message, reasoning
from tests.helpers.fakes import FakeUpstream, tool_call
from tests.helpers.qwen_code import OWN_LOOP_HALT, find_qwen, run_qwen
from tests.helpers.tcp_tap import tap

#: The looping command: one line appended to runs.log per run (how many times the agent really ran
#: it), then 400 lines, 20,800 bytes, the same every time (below Claude Code's ~30 KB limit, past
#: which it saves the output to a randomly named file and sends a preview naming it).
LOOP_CMD = "echo run >> runs.log; seq -f 'line %05g of the big output of the looping command' 1 400"
#: The fake gives up after this many requests (a hard stop when nothing ends the loop).
#: Qwen Code's shell tool sometimes sends ``Output: (empty)`` for a command that printed and exited
#: at once (seen in 2 of 4 runs of :data:`LOOP_CMD`, at a different step each time: its own race,
#: before loopguard sees the request); waiting before the exit makes the output arrive first.
QWEN_CMD = LOOP_CMD + "; sleep 0.3"
LIMIT = 12
CACHE_OFF: dict[str, Any] = {"prefix_cache": {"max_bytes_mb": 0}}
#: loopguard's counters of what it did about the loop.
ACTED = ("guarded_requests", "rewritten_requests", "reminders_injected", "results_withheld", "stops")

Volatile = list[tuple[bytes, bytes]]


@dataclass
class Run:
    """One agent session through one loopguard: the requests the agent sent (the tap's (head,
    body)), the bodies that reached the fake (raw), the fake's answers (bytes, one per request),
    loopguard's stats, how many times the command ran, the agent's exit."""

    sent: list[tuple[bytes, bytes]]
    got: list[bytes]
    answers: list[bytes]
    stats: dict[str, Any]
    runs: int
    returncode: int | None
    stdout: str
    stderr: str


#: ``launch(base_url, work, home)`` runs the agent, returning its run (``returncode`` etc.).
Launch = Callable[[str, Path, Path], Awaitable[Any]]


async def stats_of(base: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(f"{base}/loop-guard") as r:
        return await r.json()


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A work root whose path has the same length on every machine and every run: the agents
    write their working directory into each request and the tests pin the requests' sizes, which
    pytest's own ``tmp_path`` (``…/pytest-<N>/…``, N growing run after run) would shift."""
    root = Path(tempfile.mkdtemp(prefix="loopguard-fast-path-", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


async def session(
    upstream: FakeUpstream,
    make_proxy: ProxyFactory,
    tmp_path: Path,
    fake: Any,
    config: dict[str, Any] | None,
    launch: Launch,
    suffix: str,
) -> Run:
    """One run of ``launch`` through a tap and a fresh loopguard (``config``) to ``fake``; the
    base URL is the tap's root plus ``suffix``. The work dir and home are the same paths in every
    run (emptied first), so the paths the agent writes into its requests are the same."""
    work, home = tmp_path / "work", tmp_path / "home"
    for d in (work, home):
        shutil.rmtree(d, ignore_errors=True)
    work.mkdir()
    upstream.handler = fake.handle
    first = len(upstream.requests)
    base = await make_proxy(config)
    async with tap(int(base.rsplit(":", 1)[1])) as t:
        done = await launch(f"http://127.0.0.1:{t.port}{suffix}", work, home)
    log = work / "runs.log"
    count = len(log.read_text().splitlines()) if log.exists() else 0
    got = [r.body for r in upstream.requests[first:]]
    return Run(t.requests(), got, list(fake.answers), await stats_of(base), count, *_exit(done))


def _exit(done: Any) -> tuple[int | None, str, str]:
    return done.returncode, done.stdout, done.stderr


#: Request headers not sent again on a replay (the client library writes its own).
HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection"}


async def replay(
    upstream: FakeUpstream, make_proxy: ProxyFactory, run: Run, config: dict[str, Any] | None
) -> Run:
    """``run``'s requests (method, path, headers, body exactly as the agent sent them) sent again
    in order through a fresh loopguard (``config``) to a fake answering each with ``run``'s
    answer to it (SSE or JSON, as the bytes say)."""
    answers = iter(run.answers)

    async def handle(request: web.Request, raw: bytes) -> web.StreamResponse:
        data = next(answers)
        kind = "text/event-stream" if data.startswith((b"event:", b"data:")) else "application/json"
        return web.Response(body=data, headers={"Content-Type": kind})

    upstream.handler = handle
    first = len(upstream.requests)
    base = await make_proxy(config)
    async with aiohttp.ClientSession(auto_decompress=False) as s:
        for head, body in run.sent:
            method, path, _ = head.split(b"\r\n", 1)[0].decode().split(" ", 2)
            headers = {}
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.decode().partition(":")
                if name.strip().lower() not in HOP_HEADERS:
                    headers[name.strip()] = value.strip()
            async with s.request(method, base + path, data=body, headers=headers) as r:
                await r.read()
    got = [r.body for r in upstream.requests[first:]]
    return Run(run.sent, got, run.answers, await stats_of(base), 0, None, "", "")


def normalised(bodies: list[bytes], volatile: Volatile) -> list[bytes]:
    """``bodies`` with every match of each (pattern, replacement) of ``volatile`` replaced."""
    out = []
    for b in bodies:
        for pattern, repl in volatile:
            b = re.sub(pattern, repl, b)
        out.append(b)
    return out


def first_difference(a: bytes, b: bytes) -> str:
    """Where two bodies first differ, with 80 bytes either side."""
    i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return (
        f"at byte {i} of {len(a)}/{len(b)}: {a[max(0, i - 80) : i + 80]!r} vs {b[max(0, i - 80) : i + 80]!r}"
    )


def assert_same_bodies(a: list[bytes], b: list[bytes]) -> None:
    assert len(a) == len(b), (len(a), len(b))
    for n, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x == y, f"request {n}: {first_difference(x, y)}"


def acted(stats: dict[str, Any]) -> dict[str, int]:
    return {k: stats[k] for k in (*ACTED, "internal_errors")}


def assert_sizes(run: Run, first: int, growth: list[int]) -> None:
    """The request sizes: the first within 64 bytes of ``first`` (the agents write today's date,
    a day name of 6 to 9 letters, into their prompts), each next one exactly ``growth`` larger."""
    got = sizes(run)
    assert abs(got[0] - first) <= 64, got
    assert [b - a for a, b in itertools.pairwise(got)] == growth, got


async def same_both_ways(
    upstream: FakeUpstream,
    make_proxy: ProxyFactory,
    tmp_path: Path,
    fake: Callable[[], Any],
    launch: Launch,
    volatile: Volatile,
    suffix: str = "/v1",
) -> tuple[Run, Run]:
    """The agent's session with the cache on, then off: asserts 1 and 3 of the module docstring
    (same bodies after ``volatile``, the same with nothing replaced on a replay each way, the
    same actions); returns (on, off)."""
    on = await session(upstream, make_proxy, tmp_path, fake(), None, launch, suffix)
    off = await session(upstream, make_proxy, tmp_path, fake(), CACHE_OFF, launch, suffix)
    # what the agent sent differs only in the volatile fields, and so does what the model got
    assert_same_bodies(
        normalised([b for _, b in on.sent], volatile), normalised([b for _, b in off.sent], volatile)
    )
    assert_same_bodies(normalised(on.got, volatile), normalised(off.got, volatile))
    # the same requests, byte for byte, through the cache the other way round
    for run, other in ((on, CACHE_OFF), (off, None)):
        again = await replay(upstream, make_proxy, run, other)
        assert_same_bodies(again.got, run.got)
        assert acted(again.stats) == acted(run.stats)
        if other is None:  # the cache-off run's bytes resume as often as the cache-on run's did
            assert cache_counts(again) == cache_counts(on)
    assert acted(on.stats) == acted(off.stats)
    assert on.stats["internal_errors"] == 0
    assert (on.runs, on.returncode) == (off.runs, off.returncode), (on.stderr, off.stderr)
    assert "prefix_cache" not in off.stats
    return on, off


def sizes(run: Run) -> list[int]:
    return [len(b) for _, b in run.sent]


def cache_counts(run: Run) -> tuple[int, int, int, int, int]:
    """(hits, misses, fast_hits, edit_hits, evictions) of the run's prefix cache."""
    p = run.stats["prefix_cache"]
    return p["hits"], p["misses"], p["fast_hits"], p["edit_hits"], p["evictions"]


def assert_resumed(run: Run) -> None:
    """Every request after the first resumed, the ones of 64 KiB or more by the fast path."""
    hits, misses, fast, _, evictions = cache_counts(run)
    big = sum(1 for n in sizes(run)[1:] if n >= FAST_MIN)
    assert (hits, misses, fast, evictions) == (len(run.sent) - 1, 1, big, 0), (sizes(run), run.stats)
    assert fast >= 1


# --- Codex CLI ------------------------------------------------------------------------------------

_UUID = rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_JSON_STRING = rb'"(?:[^"\\]|\\.)*"'
#: Codex's own nondeterminism (Codex 0.171.0): the ids of its input items (``msg_<uuid>`` for
#: the prompt messages, ``fco_<uuid>`` for each ``function_call_output``), ``prompt_cache_key``
#: (the session id), ``client_metadata`` (session, turn, window and installation ids, its keys in
#: a different order on every request), and in each output wrapper the chunk id and wall time.
CODEX_VOLATILE: Volatile = [
    (rb'"id":"(msg|fco)_' + _UUID + rb'"', rb'"id":"\1_<uuid>"'),
    (rb'"prompt_cache_key":"' + _UUID + rb'"', rb'"prompt_cache_key":"<uuid>"'),
    (rb'"client_metadata":\{(?:' + _JSON_STRING + rb"|[^{}\"])*\}", rb'"client_metadata":{}'),
    (rb"Chunk ID: [0-9a-f]{6}\\n", rb"Chunk ID: <id>\\n"),
    (rb"Wall time: \d+\.\d{4} seconds", rb"Wall time: <t> seconds"),
]


def codex_fake() -> FakeResponses:
    """The model repeats one ``exec_command`` (after a reasoning item) until request
    :data:`LIMIT`; ids by request number."""

    def script(n: int, body: dict[str, Any]) -> list[dict[str, Any]]:
        if n >= LIMIT:
            return [{**message("Giving up."), "id": f"msg_{n:04d}"}]
        think = {**reasoning(), "id": f"rs_{n:04d}", "encrypted_content": f"gAAAA{n:08d}"}
        call = function_call("exec_command", json.dumps({"cmd": LOOP_CMD}))
        return [think, {**call, "id": f"fc_{n:04d}", "call_id": f"call_{n:04d}"}]

    return FakeResponses(script)


async def test_codex_session_takes_the_fast_path_and_reaches_the_model_as_without_the_cache(
    upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """Codex truncates the 20 KB output to ~10.8 KB, so its 7 bodies grow 40,417 → 105,511
    bytes, the 4th on past 64 KiB; loopguard's stop ends the session at the 7th answer."""
    codex = find_codex()

    def launch(url: str, work: Path, home: Path) -> Awaitable[Any]:
        return run_codex(codex, url, "Print a greeting.", work, home)

    on, _ = await same_both_ways(upstream, make_proxy, tmp_path, codex_fake, launch, CODEX_VOLATILE)
    assert_sizes(on, 40417, [10849] * 6)
    assert_resumed(on)
    assert cache_counts(on) == (6, 1, 4, 3, 0)
    assert (len(on.got), on.runs, on.returncode) == (7, 6, 0)
    assert (on.stats["reminders_injected"], on.stats["results_withheld"], on.stats["stops"]) == (2, 1, 1)
    assert "[loopguard] Stopped: the model kept calling exec_command" in on.stdout


# --- Claude Code ----------------------------------------------------------------------------------

#: Claude Code's own nondeterminism (2.1.332): ``metadata.user_id``, a JSON string of its device
#: id (new in every fresh config dir), account and session ids.
CLAUDE_VOLATILE: Volatile = [(rb'"user_id":' + _JSON_STRING, rb'"user_id":"<ids>"')]


def claude_fake() -> FakeMessages:
    """The model repeats one Bash call until request :data:`LIMIT`; ids by request number."""

    def script(n: int, body: dict[str, Any]) -> list[dict[str, Any]]:
        if n >= LIMIT:
            return [text("Giving up.")]
        return [
            tool_use("Bash", {"command": LOOP_CMD, "description": "Show the output"}, f"toolu_fast{n:06d}")
        ]

    return FakeMessages(script, side=(lambda body: "tools" not in body, lambda body: [text("A title")]))


def claude_launch(claude: str) -> Launch:
    def launch(url: str, work: Path, home: Path) -> Awaitable[Any]:
        return run_claude(claude, url, "Show me the big output.", work, home)

    return launch


async def test_claude_code_session_reaches_the_model_as_without_the_cache(
    upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """7 bodies, 49,287 → 178,704 bytes (the 2nd on past 64 KiB); loopguard's stop ends the
    session at the 7th answer (the cache counts: the next test)."""
    launch = claude_launch(find_claude())
    on, _ = await same_both_ways(upstream, make_proxy, tmp_path, claude_fake, launch, CLAUDE_VOLATILE, "")
    assert_sizes(on, 49287, [21520, 21545, 21545, 21545, 21742, 21520])
    assert (len(on.got), on.runs, on.returncode) == (7, 6, 0)
    assert (on.stats["reminders_injected"], on.stats["results_withheld"], on.stats["stops"]) == (2, 1, 1)


async def test_claude_code_session_takes_the_fast_path(
    upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """Claude Code rewrites its previous last message on every request (``cache_control`` moves
    to the newest block): each request resumes one message earlier than the kept history ends
    (:func:`proxy.request.locate.point`). The second request misses: Claude Code turns its
    first system note's one-block content list into a string then (a changed early message)."""
    on = await session(upstream, make_proxy, tmp_path, claude_fake(), None, claude_launch(find_claude()), "")
    assert len(on.got) == 7
    hits, misses, fast, _, evictions = cache_counts(on)
    assert (hits, misses, fast, evictions) == (5, 2, 5, 0), (sizes(on), on.stats)


# --- Qwen Code ------------------------------------------------------------------------------------

#: Qwen Code 0.24.4 sends the same bytes in both runs: nothing to replace.
QWEN_VOLATILE: Volatile = []


def qwen_fake() -> FakeChat:
    """The model repeats one structured ``run_shell_command`` until request :data:`LIMIT`; ids
    by request number. A request not offering the tool records an error and gets a text."""
    fake = FakeChat(lambda n, body: Answer(content="Giving up."))

    def script(n: int, body: dict[str, Any]) -> Answer:
        if n >= LIMIT:
            return Answer(content="Giving up.")
        params = offered_parameters(body, "run_shell_command")
        if params is None or "command" not in params:
            fake.errors.append(f"run_shell_command(command) not offered: {params}")
            return Answer(content="fake: run_shell_command not offered")
        return Answer(
            tool_calls=[tool_call("run_shell_command", json.dumps({"command": QWEN_CMD}), f"call_{n}")]
        )

    fake.script = script
    return fake


async def test_qwen_code_session_takes_the_fast_path_and_reaches_the_model_as_without_the_cache(
    upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """5 bodies, 71,138 → 158,102 bytes (all past 64 KiB: the first a miss, the other 4 fast
    hits); Qwen Code's own guard ends the run at its 5th identical call (exit 1), after
    loopguard's reminder."""
    qwen = find_qwen()
    fakes: list[FakeChat] = []

    def fake() -> FakeChat:
        fakes.append(qwen_fake())
        return fakes[-1]

    def launch(url: str, work: Path, home: Path) -> Awaitable[Any]:
        return run_qwen(qwen, url, "Show me the big output.", work, home)

    on, off = await same_both_ways(upstream, make_proxy, tmp_path, fake, launch, QWEN_VOLATILE)
    assert [f.errors for f in fakes] == [[], []]
    assert [b for _, b in on.sent] == [b for _, b in off.sent]  # the agent's own bytes: no noise
    assert_sizes(on, 71138, [21741] * 4)
    assert_resumed(on)
    assert cache_counts(on) == (4, 1, 4, 1, 0)
    assert (len(on.got), on.runs, on.returncode) == (5, 4, 1)
    assert OWN_LOOP_HALT in on.stderr
    assert (on.stats["reminders_injected"], on.stats["results_withheld"], on.stats["stops"]) == (1, 0, 0)
