"""The per-conversation prefix cache: decisions and upstream bytes are the same with the
cache on, off, and cleared at any point.

Every conversation is replayed request by request (the history before each assistant message,
as the corpus gate does) through :func:`proxy.request.rewrite.decide_request` four ways: no cache,
one cache for the whole replay, one cleared at random points, and one whose budget holds a single
small entry (evictions). Every request must give byte-identical upstream bodies, identical actions
and an identical transcript. The conversations: every loop fixture (:mod:`tests.helpers.corpus`), every
recorded real run (:mod:`tests.helpers.realtraj`, ``$LOOPGUARD_REALTRAJ``), each as chat, as Responses input
items (:mod:`tests.helpers.responses_items`), as Messages content blocks
(:mod:`tests.helpers.messages_blocks`) and
as chat with its calls written as text (:mod:`tests.helpers.text_form`: hermes, XML, XML with
``<tool_response>`` user messages), and random conversations from hypothesis, serialized with
random whitespace. A conversation whose offered ``tools`` change between requests (text calls are
read against them) decides as without the cache too.
"""

from __future__ import annotations

import gc
import json
import random
import tracemalloc
from collections.abc import Sequence
from typing import Any

import aiohttp
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.config import Config, build
from proxy.core.actions import Fold
from proxy.core.collapse import Collapse
from proxy.core.effects import progress_rules
from proxy.dialects import Dialect, anthropic_messages, edits, jsonbody, openai_chat, openai_responses
from proxy.errors import ConfigError
from proxy.guards import Guard, build_guards
from proxy.request import prefix_cache
from proxy.request.conversation import key_digest
from proxy.request.locate import Located, locate
from proxy.request.prefix_cache import Prefix, PrefixCache
from proxy.request.read import Read, read
from proxy.request.rewrite import RequestDecision, decide_request
from tests.helpers import messages_blocks, realtraj, responses_items, text_form
from tests.helpers.corpus import default_config, load_fixtures
from tests.helpers.fakes import FakeUpstream

CFG: Config = build(Config, default_config())
GUARDS: tuple[Guard, ...] = build_guards(CFG.guards, *progress_rules(CFG.progress))
HEADERS = {"x-session-id": "s1"}
NAMES = ("x-session-id",)
#: requests per replayed conversation at most (evenly spread, the last always among them): every
#: request of a loop fixture, a sample of a recorded run (their guards cost seconds per replay)
MAX_REQUESTS = {"loops": 64, "realtraj": 10}


def _decide(
    raw: bytes, dialect: Dialect, cache: PrefixCache | None, collapse: Collapse | None = None
) -> RequestDecision:
    return decide_request(raw, HEADERS, GUARDS, NAMES, dialect=dialect, prefixes=cache, collapse=collapse)


def _same(a: RequestDecision, b: RequestDecision, where: str) -> None:
    assert a.body == b.body, f"{where}: upstream bytes differ"
    assert a.actions == b.actions, f"{where}: actions differ"
    assert a.transcript == b.transcript, f"{where}: transcripts differ"
    if a.transcript is not None and b.transcript is not None:  # not compared by ==
        assert a.transcript.tools == b.transcript.tools, f"{where}: offered tools differ"
        assert a.transcript.tool_choice == b.transcript.tool_choice, f"{where}: tool_choice differs"
    assert (a.changed, a.conversation, a.unguarded) == (b.changed, b.conversation, b.unguarded), where


def replay(
    bodies: Sequence[bytes], dialect: Dialect, seed: int, collapse: Collapse | None = None
) -> PrefixCache:
    """Decide every body in order with no cache (the reference), one cache, one cleared at random
    points and one with a tiny budget; assert all agree. Returns the shared cache (for its stats).
    ``collapse``: fold runs of identical steps too (``recovery.collapse``)."""
    rng = random.Random(seed)
    shared = PrefixCache(1 << 30)
    cleared = PrefixCache(1 << 30)
    tiny = PrefixCache(4096)
    for i, raw in enumerate(bodies):
        want = _decide(raw, dialect, None, collapse)
        if rng.random() < 0.3:
            cleared.clear()
        for name, cache in (("shared", shared), ("cleared", cleared), ("tiny", tiny)):
            _same(_decide(raw, dialect, cache, collapse), want, f"request {i}, cache {name}")
    return shared


def _picked(n: int, most: int) -> list[int]:
    """Up to ``most`` request ends among 1..n, evenly spread, n always included."""
    if n <= most:
        return list(range(1, n + 1))
    return sorted({1 + (n - 1) * k // (most - 1) for k in range(most)})


def _ends(messages: list[dict[str, Any]], most: int) -> list[int]:
    """Where the requests end: before each assistant message, and the whole conversation."""
    ends = [i for i, m in enumerate(messages) if m.get("role") == "assistant"] + [len(messages)]
    return [ends[k - 1] for k in _picked(len(ends), most)]


def chat_requests(messages: list[dict[str, Any]], tools: Any, most: int) -> list[bytes]:
    extra = {"tools": tools} if tools else {}
    return [orjson.dumps({"model": "m", "messages": messages[:i], **extra}) for i in _ends(messages, most)]


def text_requests(messages: list[dict[str, Any]], tools: Any, most: int, wire: str) -> list[bytes]:
    """The chat requests with every call written as text (:data:`tests.helpers.corpus.WIRES` ``hermes``,
    ``xml``, ``xml_user``: :class:`tests.helpers.text_form.TextForm`)."""
    form = text_form.TextForm(
        messages, "hermes" if wire == "hermes" else "xml", "user" if wire == "xml_user" else "tool"
    )
    extra = {"tools": tools} if tools else {}
    return [orjson.dumps({"model": "m", "messages": form.before(i), **extra}) for i in _ends(messages, most)]


def responses_requests(messages: list[dict[str, Any]], most: int) -> list[bytes]:
    traced = responses_items.trace_items(messages)
    return [orjson.dumps(traced.body(i)) for i in _ends(messages, most)]


def messages_requests(messages: list[dict[str, Any]], most: int) -> list[bytes]:
    traced = messages_blocks.trace_blocks(messages)
    return [orjson.dumps(traced.body(i)) for i in _ends(messages, most)]


#: Padding that makes a replayed body at least :data:`prefix_cache.FAST_MIN` bytes, so its
#: requests take the fast path (:func:`proxy.request.locate.locate` found by bytes).
PAD = "pad " * (prefix_cache.FAST_MIN // 4)


def _padded(bodies: list[bytes], how: str) -> list[bytes]:
    """``bodies`` with :data:`PAD` before their history (``head``: a ``metadata`` member first)
    or appended to the first item's text content (``first``; a first item without a string
    content gets the head padding)."""
    out = []
    for raw in bodies:
        body = orjson.loads(raw)
        member = "input" if "input" in body else "messages"
        first = body[member][0] if body.get(member) else None
        if how == "first" and isinstance(first, dict) and isinstance(first.get("content"), str):
            body[member] = [{**first, "content": first["content"] + PAD}, *body[member][1:]]
        elif how != "none":
            body = {"metadata": {"pad": PAD}, **body}
        out.append(orjson.dumps(body))
    return out


def _conversations() -> list[tuple[str, list[dict[str, Any]], Any]]:
    out = [(f"loops/{f['id']}", f["messages"], f.get("tools")) for f in load_fixtures()]
    out += [(f"realtraj/{r['id']}", r["messages"], r.get("tools")) for r in realtraj.load_runs()]
    return out


CONVERSATIONS = _conversations()


@pytest.mark.parametrize(("name", "messages", "tools"), CONVERSATIONS, ids=[c[0] for c in CONVERSATIONS])
@pytest.mark.parametrize("wire", ["chat", "responses", "messages", "hermes", "xml", "xml_user"])
def test_every_fixture_decides_the_same_with_the_cache_on_off_and_cleared(
    name: str, messages: list[dict[str, Any]], tools: Any, wire: str
) -> None:
    most = MAX_REQUESTS[name.split("/")[0]]
    if wire == "chat":
        bodies, dialect = chat_requests(messages, tools, most), openai_chat
    elif wire in ("hermes", "xml", "xml_user"):
        bodies, dialect = text_requests(messages, tools, most, wire), openai_chat
    elif wire == "responses":
        bodies, dialect = responses_requests(messages, most), openai_responses
    else:
        bodies, dialect = messages_requests(messages, most), anthropic_messages
    pad = ("none", "head", "first")[CONVERSATIONS.index((name, messages, tools)) % 3]
    bodies = _padded(bodies, pad)
    cache = replay(bodies, dialect, seed=len(name))  # type: ignore[arg-type]
    if wire in ("hermes", "xml", "xml_user"):  # the text form reads every call the chat form has
        text, chat = (
            _decide(b, openai_chat, None).transcript
            for b in (bodies[-1], chat_requests(messages, tools, most)[-1])
        )
        assert text is not None and chat is not None
        # (names only: XML values are typed by the offered schemas, strings where none is offered)
        assert [c.name for c in text.calls] == [c.name for c in chat.calls]
    # each request after the first extends the one before: all of them resume the kept prefix
    assert (cache.stats.hits, cache.stats.misses) == (len(bodies) - 1, 1)
    # padded past FAST_MIN, every one of them without decoding the kept history
    # (unpadded: only a body past FAST_MIN can, a real run's long history)
    if pad != "none":
        assert cache.stats.fast_hits == len(bodies) - 1
    else:
        assert cache.stats.fast_hits <= sum(len(b) >= prefix_cache.FAST_MIN for b in bodies[1:])


#: ``recovery.collapse`` on, with the shipped masks (its smallest run)
COLLAPSE = Collapse(2, progress_rules(CFG.progress)[0])
#: loop fixtures whose requests fold, per wire (filled by the test below, checked after it)
FOLDED: dict[str, int] = {}


@pytest.mark.parametrize(
    ("name", "messages", "tools"),
    [c for c in CONVERSATIONS if c[0].startswith("loops/")],
    ids=[c[0] for c in CONVERSATIONS if c[0].startswith("loops/")],
)
@pytest.mark.parametrize("wire", ["chat", "responses", "messages"])
def test_every_fixture_folds_the_same_with_the_cache_on_off_and_cleared(
    name: str, messages: list[dict[str, Any]], tools: Any, wire: str
) -> None:
    """With ``recovery.collapse`` on, the folded bodies are the same with the cache on, off and
    cleared (a request with a fold keeps no edits; the next one writes its edits in full)."""
    most = MAX_REQUESTS["loops"]
    if wire == "chat":
        bodies, dialect = chat_requests(messages, tools, most), openai_chat
    elif wire == "responses":
        bodies, dialect = responses_requests(messages, most), openai_responses
    else:
        bodies, dialect = messages_requests(messages, most), anthropic_messages
    pad = ("none", "head", "first")[len(name) % 3]
    bodies = _padded(bodies, pad)
    replay(bodies, dialect, seed=len(name), collapse=COLLAPSE)  # type: ignore[arg-type]
    folded = sum(
        any(isinstance(a, Fold) for a in _decide(b, dialect, None, COLLAPSE).actions) for b in bodies
    )  # type: ignore[arg-type]
    FOLDED[wire] = FOLDED.get(wire, 0) + folded


def test_the_fixtures_fold() -> None:
    """The test above compared folded bodies, not only unfolded ones (it ran first)."""
    if FOLDED:
        assert all(n > 0 for n in FOLDED.values()), FOLDED


def test_the_fixtures_are_there() -> None:
    names = [c[0] for c in CONVERSATIONS]
    assert sum(n.startswith("loops/") for n in names) >= 10
    if realtraj.runs_dir().is_dir():  # third-party data next to the clone (.ci/run sets the variable)
        assert sum(n.startswith("realtraj/") for n in names) >= 20


# --- random conversations -------------------------------------------------------------------

_TEXT = st.sampled_from(["", "ok", "FAILED tests/x.py", "exit code 1", "same output", 'é\u2028\\"x'])
_NAME = st.sampled_from(["bash", "read_file", "grep"])
_ARGS = st.sampled_from(['{"command":"pytest -x"}', '{"path":"a.py"}', "{bad json", '{"path": "a.py"}'])


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A chat conversation: system, user, then steps of calls and results, a repeated call
    likely, with stray user and assistant text between them."""
    out: list[dict[str, Any]] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
    for k in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(["step", "step", "step", "user", "text"]))
        if kind == "user":
            out.append({"role": "user", "content": draw(_TEXT)})
        elif kind == "text":
            out.append({"role": "assistant", "content": draw(_TEXT)})
        else:
            n = draw(st.integers(1, 2))
            calls = [
                {
                    "id": f"c{k}_{j}",
                    "type": "function",
                    "function": {"name": draw(_NAME), "arguments": draw(_ARGS)},
                }
                for j in range(n)
            ]
            out.append({"role": "assistant", "content": None, "tool_calls": calls})
            out += [{"role": "tool", "tool_call_id": c["id"], "content": draw(_TEXT)} for c in calls]
    return out


def _spaced(body: dict[str, Any], indent: int | None) -> bytes:
    """``body`` as JSON with the standard library's spacing (``indent`` None: its default
    ``", "`` and ``": "`` separators)."""
    return json.dumps(body, indent=indent, ensure_ascii=False).encode()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=conversations(),
    wire=st.sampled_from(["chat", "responses", "messages"]),
    spacing=st.sampled_from(["orjson", "default", "indent"]),
    seed=st.integers(0, 1000),
    folding=st.booleans(),
)
def test_random_conversations_decide_the_same_with_the_cache_on_off_and_cleared(
    messages: list[dict[str, Any]], wire: str, spacing: str, seed: int, folding: bool
) -> None:
    ends = range(1, len(messages) + 1)  # every length: requests that end on a call without its result too
    if wire == "chat":
        dicts = [{"model": "m", "messages": messages[:i]} for i in ends]
        dialect: Any = openai_chat
    elif wire == "responses":
        traced = responses_items.trace_items(messages)
        dicts, dialect = [traced.body(i) for i in ends], openai_responses
    else:
        blocks = messages_blocks.trace_blocks(messages)
        dicts, dialect = [blocks.body(i) for i in ends], anthropic_messages
    rng = random.Random(seed)
    bodies = []
    for d in dicts:  # the spacing may change between requests: a miss, never a wrong hit
        style = spacing if rng.random() < 0.8 else rng.choice(["orjson", "default", "indent"])
        bodies.append(orjson.dumps(d) if style == "orjson" else _spaced(d, 1 if style == "indent" else None))
    collapse = COLLAPSE if folding else None
    replay(bodies, dialect, seed, collapse)
    if folding:  # a folded body is JSON, and holds its first step and the note
        for raw in bodies:
            decision = _decide(raw, dialect, None, collapse)
            sent = orjson.loads(decision.body)
            if any(isinstance(a, Fold) for a in decision.actions):
                assert "the same arguments" in orjson.dumps(sent).decode()


# --- what a hit and a miss are --------------------------------------------------------------


def _chat(messages: list[dict[str, Any]], **extra: Any) -> bytes:
    return orjson.dumps({"model": "m", "messages": messages, **extra})


STEP = [
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "a", "function": {"name": "bash", "arguments": "{}"}}],
    },
    {"role": "tool", "tool_call_id": "a", "content": "FAILED"},
]
BASE = [{"role": "user", "content": "go"}, *STEP]


@pytest.mark.parametrize(
    ("second", "hits", "misses"),
    [
        (_chat([*BASE, *STEP]), 1, 1),  # grows by a step: resumes
        (_chat(BASE), 1, 1),  # the same history again: resumes with nothing new
        (_chat(BASE[:1]), 0, 2),  # shorter (compacted): read in full
        (_chat([{"role": "user", "content": "go!"}, *STEP, *STEP]), 0, 2),  # an edited message
        (json.dumps({"model": "m", "messages": [*BASE, *STEP]}).encode(), 0, 2),  # other spacing
        (_chat([*BASE, *STEP], stream=True), 1, 1),  # other members change: still the same history
        (orjson.dumps({"messages": [*BASE, *STEP], "model": "m"}), 1, 1),  # members reordered around it
    ],
    ids=["grown", "same", "shorter", "edited", "spacing", "other-members", "reordered"],
)
def test_a_request_resumes_only_when_its_history_starts_with_the_kept_bytes(
    second: bytes, hits: int, misses: int
) -> None:
    cache = PrefixCache(1 << 20)
    _same(_decide(_chat(BASE), openai_chat, cache), _decide(_chat(BASE), openai_chat, None), "first")
    _same(_decide(second, openai_chat, cache), _decide(second, openai_chat, None), "second")
    assert (cache.stats.hits, cache.stats.misses) == (hits, misses)


def _read(raw: bytes) -> Read:
    """The read stage of a chat body decoded whole with the prefix cache on, nothing kept yet."""
    located = locate(raw, openai_chat, history=True)  # type: ignore[arg-type]
    assert isinstance(located, Located)
    return read(raw, openai_chat, located)  # type: ignore[arg-type]


def test_messages_given_twice_are_read_in_full_and_never_kept() -> None:
    raw = (
        b'{"messages":'
        + orjson.dumps(BASE)
        + b',"model":"m","messages":'
        + orjson.dumps([*BASE, *STEP])
        + b"}"
    )
    body = orjson.loads(raw)
    found = _read(raw)
    transcript, spans = found.transcript, found.spans
    assert transcript == openai_chat.parse_request(body)
    assert spans is None
    assert found.entry is None


@pytest.mark.parametrize(
    "raw",
    [b'{"model":"m","messages":[]}', b'{"model":"m","messages":"hi"}', b'{"model":"m"}', b'{"messages":[1]}'],
    ids=["empty", "string", "missing", "not-an-object"],
)
def test_bodies_without_a_history_of_objects_decide_as_without_the_cache(raw: bytes) -> None:
    cache = PrefixCache(1 << 20)
    _same(_decide(raw, openai_chat, cache), _decide(raw, openai_chat, None), "once")
    _same(_decide(raw, openai_chat, cache), _decide(raw, openai_chat, None), "twice")
    assert cache.stats.entries == 0


def test_the_kept_entry_holds_the_history_bytes_and_spans_from_its_bracket() -> None:
    raw = b'{"model":"m", "messages": [ {"role":"user","content":"go"} ,{"role":"user","content":"x"}] }'
    cache = PrefixCache(1 << 20)
    found = _read(raw)
    cache.keep(openai_chat.PATH_SUFFIX, "k", found.entry, hit=found.hit)
    entry = cache.get(openai_chat.PATH_SUFFIX, "k")
    assert entry is not None
    assert entry.items == b'[ {"role":"user","content":"go"} ,{"role":"user","content":"x"}'
    assert entry.spans == ((2, 32), (34, 63))
    # no call: the bytes twice, two items, no tools (``null``, 8 times), the head and the first
    # user message (its JSON), and the body's other 29 bytes (its items are a view of it)
    assert isinstance(entry.items, memoryview)
    assert len(raw) - 63 == 29
    first = len(b'{"role":"user","content":"go"}')
    assert entry.size == 2 * 63 + 2 * 384 + 8 * len(b"null") + 26 + first + 29
    assert cache.snapshot() == {
        "hits": 0,
        "misses": 1,
        "fast_hits": 0,
        "evictions": 0,
        "bytes": entry.size,
        "entries": 1,
        "edit_hits": 0,
        "max_bytes": 1 << 20,
    }


MIB = 1 << 20


@pytest.mark.parametrize(
    ("extra", "view"),
    [
        ({}, True),  # nothing but the history: a view of the body, its few other bytes counted
        ({"metadata": {"note": "m" * MIB}}, False),  # 1 MiB after the history: the history copied
        ({"system": "s" * MIB}, False),  # a Messages-style system prompt after it
        ({"prompt_cache_key": "k" * MIB}, False),  # a 1 MiB key after it (the key is kept hashed)
    ],
    ids=["history-only", "metadata-after", "system-after", "cache-key-after"],
)
def test_an_entry_keeps_only_what_it_counts(extra: dict[str, Any], view: bool) -> None:
    # a history of a few KiB: what the entry keeps of the body is its history, or, as a view,
    # the whole body, and then the whole body is counted
    history = [{"role": "user", "content": "go " * 1000}, *STEP, *STEP]
    tracemalloc.start()
    try:
        raw = jsonbody.kept(_chat(history, **extra))  # its own size, as the server reads a body
        found = _read(raw)
        entry = found.entry
        assert entry is not None
        start = raw.index(b"[")
        end = start + len(orjson.dumps(history)) - 1  # through its last item, not the "]"
        assert bytes(entry.items) == raw[start:end]
        assert isinstance(entry.items, memoryview) is view
        # the fingerprint's items: the first user message and the first call's message
        first = len(orjson.dumps(history[0])) + len(orjson.dumps(history[1]))
        counted = prefix_cache.entry_size(end - start, 2, 5, len(b"null")) + start + first
        assert entry.size == counted + (len(raw) - (end - start) if view else 0)
        size = entry.size
        # what it holds once its request is gone: no more than it counts
        del raw, found
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        del entry
        gc.collect()
        held = before - tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert size < 64 * 1024 or view  # a few KiB of history, whatever follows it
    assert 0 < held <= size


def _entry(size: int) -> Prefix:
    return Prefix(b"[", (), None, size)


def test_the_least_recently_used_entries_go_first_once_the_budget_is_passed() -> None:
    cache = PrefixCache(100)
    cache.put("d", "a", _entry(40))
    cache.put("d", "b", _entry(40))
    assert cache.get("d", "a") is not None  # a is now the most recent
    cache.put("d", "c", _entry(40))
    assert [k for k in ("a", "b", "c") if cache.get("d", k) is not None] == ["a", "c"]
    assert (cache.stats.evictions, cache.stats.bytes, cache.stats.entries) == (1, 80, 2)
    cache.put("d", "a", _entry(10))  # replacing counts the new size only
    assert cache.stats.bytes == 50
    cache.put("d", "big", _entry(101))  # larger than the budget alone: not kept, nothing dropped
    assert (cache.get("d", "big"), cache.stats.evictions, cache.stats.entries) == (None, 1, 2)
    cache.clear()
    assert (cache.stats.bytes, cache.stats.entries, cache.stats.evictions) == (0, 0, 1)


def test_a_budget_of_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        PrefixCache(0)


# --- the server -----------------------------------------------------------------------------


async def _session(base: str) -> tuple[dict[str, Any], str, bytes]:
    """Five requests of one growing looping conversation (a session header keys it); the stats
    snapshot and the metrics text after them, and the last body sent."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Read app.py"}]
    raw = b""
    async with aiohttp.ClientSession(headers={"x-session-id": "s1"}) as http:
        for _ in range(5):
            raw = json.dumps({"model": "m", "messages": messages}).encode()
            post = http.post(
                f"{base}/v1/chat/completions", data=raw, headers={"content-type": "application/json"}
            )
            async with post as r:
                msg = (await r.json())["choices"][0]["message"]
            messages.append(msg)
            for tc in msg["tool_calls"]:
                messages.append({"role": "tool", "tool_call_id": tc["id"], "content": "print('hi')"})
        async with http.get(f"{base}/loop-guard") as r:
            snapshot = await r.json()
        async with http.get(f"{base}/loop-guard/metrics") as r:
            text = await r.text()
    return snapshot, text, raw


async def test_the_server_resumes_each_request_and_counts_it_in_stats_and_metrics(
    upstream: FakeUpstream, make_proxy: Any
) -> None:
    on = await make_proxy()
    snapshot, text, last = await _session(on)
    sent_on = [r.body for r in upstream.requests]
    upstream.requests.clear()
    off = await make_proxy({"prefix_cache": {"max_bytes_mb": 0}})
    snapshot_off, text_off, _ = await _session(off)
    assert [r.body for r in upstream.requests] == sent_on  # the same bytes upstream either way
    assert sum(b"[loopguard]" in b for b in sent_on) >= 1  # and the guards acted on them
    kept = snapshot["prefix_cache"]
    # the first request (a user message, no call, no tools) has nothing to guard and is not
    # kept (proxy.request.plain): the second misses, the three after it resume
    assert snapshot["nothing_to_guard"] == 1
    assert (kept["hits"], kept["misses"], kept["evictions"], kept["entries"]) == (3, 1, 0, 1)
    assert kept["max_bytes"] == 24 * 1024 * 1024
    # the last history from its "[" through its last message ("]}" after it), 2 KB per call and
    # 384 bytes per message (twice the bytes: the decoded texts), the checkpoint, and the edits
    # the last request made before its last step: one reminder (its bytes, one edit, one action)
    assert kept["fast_hits"] == 0  # small bodies: decoded whole
    local = PrefixCache(1 << 30)
    _decide(last, openai_chat, local)
    entry = local.get(openai_chat.PATH_SUFFIX, key_digest("s1"))
    assert entry is not None and entry.edits is not None and entry.checkpoint is not None
    assert (len(entry.edits.edits), len(entry.edits.actions)) == (1, 1)
    reminder = entry.edits.edits[0][3]
    assert reminder.startswith(b',{"role":"user","content":"[loopguard]')
    assert entry.edits.size == 2 * edits.EDIT_BYTES + len(reminder)
    history = len(last) - last.index(b"[") - 2
    assert entry.size > 2 * history + 4 * 2048 + 9 * 384 + entry.edits.size
    assert kept["bytes"] == entry.size  # the server kept what a fresh read of the last request keeps
    assert "loopguard_prefix_cache_hits_total 3.0" in text
    assert "loopguard_prefix_cache_misses_total 1.0" in text
    assert "loopguard_prefix_cache_fast_hits_total 0.0" in text  # small bodies
    assert "loopguard_prefix_cache_entries 1.0" in text
    # the fourth request reminds (the third read of app.py), the fifth again: it reuses that edit
    assert kept["edit_hits"] == 1
    assert "loopguard_prefix_cache_edit_hits_total 1.0" in text
    assert "prefix_cache" not in snapshot_off
    assert "loopguard_prefix_cache" not in text_off


async def test_the_server_counts_a_conversation_with_a_mib_of_metadata_as_its_history(
    upstream: FakeUpstream, make_proxy: Any
) -> None:
    # 1 MiB of metadata after a small looping history: the server keeps the history, not the
    # body, and counts exactly what a read of the same body keeps
    base = await make_proxy()
    raw = _chat([*BASE, *STEP, *STEP], metadata={"note": "m" * MIB})
    async with aiohttp.ClientSession() as http:
        headers = {"content-type": "application/json"}
        async with http.post(f"{base}/v1/chat/completions", data=raw, headers=headers) as r:
            assert r.status == 200
        async with http.get(f"{base}/loop-guard") as r:
            kept = (await r.json())["prefix_cache"]
    local = PrefixCache(1 << 30)
    _decide(raw, openai_chat, local)
    assert kept["entries"] == local.stats.entries == 1
    assert kept["bytes"] == local.stats.bytes < 64 * 1024


@pytest.mark.parametrize(("value", "ok"), [(0, True), (0.5, True), (128, True), (-1, False)])
def test_a_negative_budget_is_refused_at_start_naming_the_key(value: float, ok: bool) -> None:
    if ok:
        assert build(Config, {"prefix_cache": {"max_bytes_mb": value}}).prefix_cache.max_bytes == int(
            value * 1048576
        )
        return
    with pytest.raises(ConfigError, match=r"prefix_cache\.max_bytes_mb"):
        build(Config, {"prefix_cache": {"max_bytes_mb": value}})


@pytest.mark.parametrize("wire", ["chat", "responses", "messages"])
def test_a_kept_prefix_resumed_twice_gives_each_continuation_its_own_transcript(wire: str) -> None:
    # A pending call in the kept prefix gets its result in the first continuation only: resuming
    # must never change the kept state (a branch: the agent retried the step another way).
    pending = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "a", "function": {"name": "bash", "arguments": "{}"}}],
        },
    ]
    first = [*pending, {"role": "tool", "tool_call_id": "a", "content": "FAILED"}]
    second = [*pending, {"role": "user", "content": "stop"}]
    if wire == "chat":
        dialect: Any = openai_chat
        bodies = [_chat(m) for m in (pending, first, second)]
    elif wire == "responses":
        dialect = openai_responses
        bodies = [orjson.dumps(responses_items.responses_body(m)) for m in (pending, first, second)]
    else:
        dialect = anthropic_messages
        bodies = [orjson.dumps(messages_blocks.messages_body(m)) for m in (pending, first, second)]
    cache = PrefixCache(1 << 20)
    _decide(bodies[0], dialect, cache)
    kept = cache.get(dialect.PATH_SUFFIX, key_digest("s1"))
    assert kept is not None
    _same(_decide(bodies[1], dialect, cache), _decide(bodies[1], dialect, None), "first continuation")
    cache.put(dialect.PATH_SUFFIX, key_digest("s1"), kept)  # the kept prefix again
    _same(_decide(bodies[2], dialect, cache), _decide(bodies[2], dialect, None), "second continuation")
    assert cache.stats.hits == 2


# --- the offered tools are part of what a kept prefix holds -----------------------------------


def _tool(name: str, properties: dict[str, Any] | None = None) -> dict[str, Any]:
    params = {"type": "object", "properties": properties or {}}
    return {"type": "function", "function": {"name": name, "parameters": params}}


#: One step of calls written as text, its result a ``<tool_response>`` user message (Qwen form).
TEXT_STEP = [
    {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "bash", "arguments": {"command": "pytest -x"}}\n</tool_call>',
    },
    {"role": "user", "content": "<tool_response>\nFAILED tests/x.py\n</tool_response>"},
]


def _text_chat(steps: int, tools: list[dict[str, Any]] | None) -> bytes:
    extra: dict[str, Any] = {"tools": tools} if tools is not None else {}
    return _chat([{"role": "user", "content": "go"}, *TEXT_STEP * steps], **extra)


def test_a_conversation_whose_offered_tools_change_decides_as_without_the_cache() -> None:
    # Text calls are calls only for offered names: the same history is 0 or n calls depending on
    # the tools, so a kept prefix is resumed only by a request offering exactly its tools.
    bash, other = [_tool("bash")], [_tool("read_file")]
    requests = [  # (steps, tools, calls the reference reads, hit)
        (2, bash, 2, False),
        (3, other, 0, False),  # bash not offered: its blocks are text, their results user turns
        (4, bash, 4, False),
        (5, None, 5, False),  # no tools: any well-formed name is a call
        (6, bash, 6, False),
        (7, bash, 7, True),  # the same tools again: resumes
    ]
    cache = PrefixCache(1 << 20)
    seen: list[tuple[int, tuple[str, ...]]] = []
    for n, (steps, tools, calls, hit) in enumerate(requests):
        raw = _text_chat(steps, tools)
        hits = cache.stats.hits
        want = _decide(raw, openai_chat, None)
        got = _decide(raw, openai_chat, cache)
        _same(got, want, f"request {n}")
        assert got.body == want.body
        assert cache.stats.hits - hits == int(hit), f"request {n}"
        assert want.transcript is not None
        seen.append((len(want.transcript.calls), tuple(sorted({a.rule for a in want.actions}))))
        assert seen[-1][0] == calls, f"request {n}"
    # the tools decide the actions too (so a resumed state read against other tools would show)
    assert seen == [
        (2, ()),
        (0, ()),
        (4, ("repeat_reminder",)),
        (5, ("repeat_reminder",)),
        (6, ("escalation", "repeat_reminder")),
        (7, ("circuit_breaker", "escalation", "repeat_reminder")),
    ]
    assert (cache.stats.hits, cache.stats.misses) == (1, 5)


def test_offered_tools_with_the_same_names_and_other_schemas_are_not_resumed() -> None:
    # An XML parameter's value is typed by the offered schema: "5" as a string, 5 as an integer.
    step = [
        {
            "role": "assistant",
            "content": "<tool_call>\n<function=sleep>\n<parameter=seconds>\n5\n</parameter>\n"
            "</function>\n</tool_call>",
        },
        {"role": "tool", "content": "slept"},
    ]
    history = [{"role": "user", "content": "wait"}, *step]
    as_int = [_tool("sleep", {"seconds": {"type": "integer"}})]
    as_str = [_tool("sleep", {"seconds": {"type": "string"}})]
    cache = PrefixCache(1 << 20)
    for n, (messages, tools, value) in enumerate(
        [(history, as_int, 5), ([*history, *step], as_str, "5"), ([*history, *step, *step], as_str, "5")]
    ):
        raw = _chat(messages, tools=tools, tool_choice="auto")
        want = _decide(raw, openai_chat, None)
        _same(_decide(raw, openai_chat, cache), want, f"request {n}")
        assert want.transcript is not None
        assert [c.arguments for c in want.transcript.calls] == [{"seconds": value}] * (n + 1)
        assert want.transcript.tool_choice == "auto"
    assert (cache.stats.hits, cache.stats.misses) == (1, 2)


@pytest.mark.parametrize("wire", ["chat", "responses"])
def test_tool_choice_is_the_current_requests_on_a_resumed_prefix(wire: str) -> None:
    cache = PrefixCache(1 << 20)
    dialect: Any = openai_chat if wire == "chat" else openai_responses
    for n, choice in enumerate(["auto", "none", None]):
        messages = [{"role": "user", "content": "go"}, *STEP * (n + 1)]
        extra: dict[str, Any] = {"tool_choice": choice} if choice is not None else {}
        if wire == "chat":
            raw = _chat(messages, tools=[_tool("bash")], **extra)
        else:
            raw = orjson.dumps(
                {**responses_items.responses_body(messages), "tools": [_tool("bash")], **extra}
            )
        got = _decide(raw, dialect, cache)
        _same(got, _decide(raw, dialect, None), f"request {n}")
        assert got.transcript is not None
        assert got.transcript.tool_choice == choice
        assert got.transcript.tools == {"bash": {"type": "object", "properties": {}}}
    assert (cache.stats.hits, cache.stats.misses) == (2, 1)
