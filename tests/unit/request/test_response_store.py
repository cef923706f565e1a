"""The Responses API's ``previous_response_id`` chains, no sockets: the bounded store
(count, bytes, age with an injected clock; exact evictions), the repair items for answers
loopguard rewrote, the chained request's edits, and a looping conversation sent as a chain getting
the same actions at the same calls, and the upstream the same history, as the full-input form."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from proxy.config import Config, ResponsesStoreConfig, build
from proxy.core.actions import Remind, Withhold
from proxy.core.effects import progress_rules
from proxy.dialects import openai_responses
from proxy.dialects.openai_responses import Answer, answer_of, apply_chained
from proxy.errors import ConfigError
from proxy.guards import Context, build_guards
from proxy.request.response_store import (
    NOT_RUN_TEXT,
    UNKNOWN_PREVIOUS,
    Chain,
    Entry,
    ResponseStore,
    chain_of,
    entry_of,
    repair_items,
    store_key,
)
from proxy.request.rewrite import decide_request
from proxy.response.decide import StopJudge
from proxy.response.responses_stream import decide_json_answer
from tests.helpers.fakes import repeated_call_messages
from tests.helpers.responses_items import response_object, responses_body

CFG = Config()
GUARDS = build_guards(CFG.guards, *progress_rules(CFG.progress))
MB = 1024 * 1024


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def entry(size: int) -> Entry:
    """An entry of one segment of ``size`` (>= 2) bytes of its own."""
    return Entry((b"[" + b" " * (size - 2) + b"]",), 0, size)


def store(clock: Clock | None = None, **cfg: Any) -> ResponseStore:
    return ResponseStore(build(ResponsesStoreConfig, cfg, "responses_store"), clock or Clock())


# --- the store's bounds -------------------------------------------------------------------------------

# Each step: ("put", id, size) → whether kept; ("get", id) → whether found; ("at", seconds) moves
# the clock. ``held``: the ids kept at the end, least recently used first; ``evicted``: how many
# entries a bound dropped.
BOUNDS = [
    pytest.param(
        {"max_entries": 2},
        [("put", "a", 10, True), ("put", "b", 10, True), ("put", "c", 10, True)],
        ["b", "c"],
        1,
        id="count_drops_the_oldest",
    ),
    pytest.param(
        {"max_entries": 2},
        [("put", "a", 10, True), ("put", "b", 10, True), ("get", "a", True), ("put", "c", 10, True)],
        ["a", "c"],
        1,
        id="count_drops_the_least_recently_used",
    ),
    pytest.param(
        {"max_entries": 2},
        [("put", "a", 10, True), ("put", "a", 20, True), ("put", "b", 10, True)],
        ["a", "b"],
        0,
        id="same_id_replaces",
    ),
    pytest.param(
        {"max_bytes_mb": 100 / MB},
        [("put", "a", 40, True), ("put", "b", 40, True), ("put", "c", 40, True)],
        ["b", "c"],
        1,
        id="bytes_drop_the_oldest",
    ),
    pytest.param(
        {"max_bytes_mb": 100 / MB},
        [("put", "a", 40, True), ("put", "b", 40, True), ("put", "c", 100, True)],
        ["c"],
        2,
        id="bytes_drop_as_many_as_needed",
    ),
    pytest.param(
        {"max_bytes_mb": 100 / MB},
        [("put", "a", 40, True), ("put", "b", 101, False), ("put", "a", 101, False)],
        [],
        0,
        id="an_entry_larger_than_the_budget_is_not_kept_and_drops_its_old_one",
    ),
    pytest.param(
        {"max_bytes_mb": None, "max_entries": 3},
        [("put", "a", 10 * MB, True), ("put", "b", 10 * MB, True)],
        ["a", "b"],
        0,
        id="null_bytes_no_limit",
    ),
    pytest.param(
        {"max_age_s": 10},
        [("put", "a", 2, True), ("at", 5), ("put", "b", 2, True), ("at", 11), ("get", "a", False)],
        ["b"],
        1,
        id="age_since_stored",
    ),
    pytest.param(
        {"max_age_s": 10},
        [("put", "a", 2, True), ("at", 9), ("get", "a", True), ("at", 18), ("get", "a", True)],
        ["a"],
        0,
        id="a_use_restarts_the_age",
    ),
    pytest.param(
        {"max_age_s": 10},
        [("put", "a", 2, True), ("at", 10), ("get", "a", True), ("at", 20.5), ("put", "b", 2, True)],
        ["b"],
        1,
        id="expired_entries_go_at_the_next_put",
    ),
    pytest.param(
        {"max_age_s": None},
        [("put", "a", 2, True), ("at", 10**9), ("get", "a", True)],
        ["a"],
        0,
        id="null_age_no_limit",
    ),
    pytest.param(
        {"max_entries": 0},
        [("put", "a", 2, False), ("get", "a", False)],
        [],
        0,
        id="zero_entries_keeps_none",
    ),
]


@pytest.mark.parametrize(("cfg", "steps", "held", "evicted"), BOUNDS)
def test_store_bounds(
    cfg: dict[str, Any], steps: list[tuple[Any, ...]], held: list[str], evicted: int
) -> None:
    clock = Clock()
    s = store(clock, **cfg)
    start = clock.t
    for step in steps:
        if step[0] == "put":
            assert s.put(step[1], entry(step[2])) is step[3], step
        elif step[0] == "get":
            assert (s.get(step[1]) is not None) is step[2], step
        else:
            clock.t = start + step[1]
    assert s.ids() == held
    assert s.evicted == evicted
    assert s.size == sum(e.size for e in (s.get(i) for i in held) if e is not None)


def test_the_entries_of_one_chain_share_their_bytes() -> None:
    """Each response of a chain holds the segments of the one before it: they count once, so a
    chain of ten responses holds the bytes of its newest one. Dropping one of its older responses
    frees nothing; the chain's bytes go with its newest response."""
    s = store(max_bytes_mb=400 / MB)
    for k in range(10):
        before = s.get(f"r{k - 1}") if k else None
        request = chain_of(before, [{"i": k}], f"r{k - 1}" if k else None, True)
        assert s.after_answer(request, Answer(f"r{k}", "completed", ({"o": k},)))
    newest = s.get("r9")
    assert newest is not None and newest.count == 20
    assert s.size == newest.size == sum(len(seg) for seg in newest.segments) == 180
    assert s.put("x", entry(200))  # 380 bytes: everything fits
    assert (len(s), s.size, s.evicted) == (11, 380, 0)
    assert s.put("y", entry(100))  # 480: r0..r8 go (freeing nothing), then r9 (180)
    assert (s.ids(), s.size, s.evicted) == (["x", "y"], 300, 10)


def test_defaults() -> None:
    cfg = Config().responses_store
    assert (cfg.max_entries, cfg.max_bytes_mb, cfg.max_age_s) == (1024, 64.0, 21600.0)
    assert ResponseStore().max_bytes == 64 * MB


@pytest.mark.parametrize(
    ("key", "value"),
    [("max_entries", -1), ("max_bytes_mb", 0), ("max_bytes_mb", -2), ("max_age_s", 0), ("max_entries", 1.5)],
)
def test_bad_values_name_the_key(key: str, value: Any) -> None:
    with pytest.raises(ConfigError) as e:
        build(Config, {"responses_store": {key: value}})
    assert f"responses_store.{key}" in str(e.value)


def test_unknown_ids_are_reported_once_per_chain() -> None:
    s = store()
    assert s.note_unknown("resp_x") is True
    assert s.note_unknown("resp_x") is False  # a retry of the same request
    s.after_answer(Chain(previous="resp_x", lost=True), Answer("resp_y", "completed", ()))
    assert s.note_unknown("resp_y") is False  # the chain goes on: counted, not logged
    assert s.note_unknown("resp_z") is True
    assert len(s) == 0


def test_store_false_requests_are_not_kept() -> None:
    s = store()
    answer = Answer("resp_1", "completed", ())
    assert s.after_answer(Chain(keep=False), answer) is False
    assert s.after_answer(Chain(keep=True), answer) is True
    assert s.ids() == ["resp_1"]


# --- answers ------------------------------------------------------------------------------------------


def fc(cid: str, kind: str = "function_call") -> dict[str, Any]:
    member = "arguments" if kind == "function_call" else "input"
    return {"id": f"fc_{cid}", "type": kind, "status": "completed", "call_id": cid, "name": "f", member: "{}"}


def msg(text: str, mid: str = "msg_1") -> dict[str, Any]:
    return {
        "id": mid,
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


REASONING = {"id": "rs_1", "type": "reasoning", "summary": []}


def test_answer_of_needs_an_id_a_kept_status_and_an_output_list() -> None:
    assert answer_of(response_object([fc("c1")])) == Answer("resp_1", "completed", (fc("c1"),))
    assert answer_of(response_object([], status="incomplete")) is not None
    for status in ("failed", "queued", "in_progress"):
        assert answer_of(response_object([], status=status)) is None
    assert answer_of({"status": "completed", "output": []}) is None
    assert answer_of({"id": "r", "status": "completed"}) is None


@pytest.mark.parametrize(
    ("upstream", "agent", "repair"),
    [
        pytest.param([fc("c1")], None, [], id="unchanged"),
        pytest.param(
            [REASONING, msg("Again."), fc("c1")],
            [REASONING, msg("Again.\n\n[loopguard] Stopped.", "msg_loopguard_1")],
            [
                {"type": "function_call_output", "call_id": "c1", "output": NOT_RUN_TEXT},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [
                        {"type": "output_text", "text": "Again.\n\n[loopguard] Stopped.", "annotations": []}
                    ],
                },
            ],
            id="stop",
        ),
        pytest.param(
            [fc("c0"), fc("c1"), fc("c2", "custom_tool_call"), fc("c3")],
            [fc("c0"), fc("c1")],
            [
                {"type": "custom_tool_call_output", "call_id": "c2", "output": NOT_RUN_TEXT},
                {"type": "function_call_output", "call_id": "c3", "output": NOT_RUN_TEXT},
            ],
            id="runaway_cut",
        ),
    ],
)
def test_repair_items(upstream: list[Any], agent: list[Any] | None, repair: list[Any]) -> None:
    answer = Answer(
        "r",
        "completed",
        tuple(agent if agent is not None else upstream),
        None if agent is None else tuple(upstream),
    )
    assert repair_items(answer) == repair
    e = entry_of(Chain((b'[{"role":"user","content":"go"}]',), 1, 31, keep=True), answer)
    assert e.count == 1 + len(answer.output)
    assert e.items() == [{"role": "user", "content": "go"}, *answer.output]
    assert e.size == 31 + len(orjson.dumps(list(answer.output)))
    assert (json.loads(e.repair) if e.repair else [], e.repair_count) == (repair, len(repair))


# --- a chained request's edits ------------------------------------------------------------------------


def remind(after: int) -> Remind:
    return Remind(after=after, text="R", rule="t", tool="x", count=3, limit=3, fresh=True)


def withhold(position: int) -> Withhold:
    return Withhold(
        position=position, call_id="c", text="D", rule="t", tool="x", count=7, limit=6, fresh=True
    )


OUT = b'{"type":"function_call_output","call_id":"c9","output":"r"}'
REPAIR = b'[{"type":"function_call_output","call_id":"c8","output":"N"}]'


@pytest.mark.parametrize(
    ("raw", "actions", "repair", "want"),
    [
        pytest.param(
            b'{"input":[' + OUT + b"]}", [withhold(1), remind(1)], b"", None, id="kept_part_not_again"
        ),
        pytest.param(
            b'{"input":[' + OUT + b"]}",
            [withhold(2), remind(2), remind(10)],
            b"",
            b'{"input":[{"type":"function_call_output","call_id":"c9","output":"D"},'
            b'{"type":"message","role":"user","content":[{"type":"input_text","text":"R"}]}]}',
            id="new_part_shifted",
        ),
        pytest.param(
            b'{"input":[' + OUT + b"]}",
            [withhold(2)],
            REPAIR,
            b'{"input":[' + REPAIR[1:-1] + b',{"type":"function_call_output","call_id":"c9","output":"D"}]}',
            id="repair_first_then_edits",
        ),
        pytest.param(b'{"input": [ ]}', [], REPAIR, b'{"input": [' + REPAIR[1:-1] + b" ]}", id="empty_list"),
        pytest.param(
            b'{"model":"m","input":"go on","store":true}',
            [],
            REPAIR,
            b'{"model":"m","input":['
            + REPAIR[1:-1]
            + b',{"type":"message","role":"user","content":"go on"}],'
            b'"store":true}',
            id="string_input_becomes_a_list",
        ),
        pytest.param(b'{"model":"m"}', [], REPAIR, b'{"input":' + REPAIR + b',"model":"m"}', id="no_input"),
    ],
)
def test_apply_chained(raw: bytes, actions: list[Any], repair: bytes, want: bytes | None) -> None:
    # the kept part holds 2 items; the request's first input item is position 2 of the chain
    assert apply_chained(raw, actions, orjson.loads(raw), 2, repair) == want
    assert apply_chained(raw, actions, None, 2, repair) == want


# --- a looping conversation sent as a chain -----------------------------------------------------------


def full_items(n: int) -> tuple[str | None, list[dict[str, Any]]]:
    body = responses_body(repeated_call_messages(n))
    return body.get("instructions"), body["input"]


def chain_request(k: int, items: list[dict[str, Any]], prev: str | None, **extra: Any) -> bytes:
    """Request ``k`` (1-based) of the chain form: the user message, then one call output each."""
    new = [items[0]] if k == 1 else [items[2 * k - 2]]
    body: dict[str, Any] = {"model": "m", "input": new, **extra}
    if prev is not None:
        body["previous_response_id"] = prev
    return json.dumps(body).encode()


def decide(raw: bytes, s: ResponseStore | None) -> Any:
    lookup = s.get if s is not None else None
    return decide_request(raw, {}, GUARDS, (), dialect=openai_responses, previous=lookup)


def where(a: Any) -> tuple[str, str, int, bool]:
    return (a.rule, a.kind, getattr(a, "position", getattr(a, "after", -1)), a.fresh)


#: The actions on the 7th request (7 identical calls made and answered), as pinned in chat and
#: full-input Responses form (tests/unit/dialects/test_openai_responses.py).
SEVENTH = [
    ("repeat_reminder", "remind", 6, False),
    ("repeat_reminder", "remind", 10, False),
    ("circuit_breaker", "withhold", 14, True),
    ("escalation", "withhold", 12, False),
    ("escalation", "withhold", 14, True),
]


def test_a_chained_loop_gets_the_same_actions_and_the_upstream_the_same_history() -> None:
    n = 8
    _, items = full_items(n)
    s = store()
    upstream: list[Any] = []  # what the upstream holds of the chain (what it was sent + its answers)
    prev = None
    per_request = []
    for k in range(1, n + 1):
        full_raw = json.dumps({"model": "m", "input": items[: 2 * k - 1]}).encode()
        full = decide(full_raw, None)
        chained = decide(chain_request(k, items, prev), s)
        assert chained.unguarded is None
        assert [where(a) for a in chained.actions] == [where(a) for a in full.actions]
        assert chained.conversation == full.conversation  # the key of the whole chain
        assert chained.transcript == full.transcript
        sent = json.loads(chained.body)["input"]
        assert [*upstream, *sent] == json.loads(full.body)["input"]  # the model sees the same
        per_request.append([where(a) for a in chained.actions if a.fresh])
        answer = [items[2 * k - 1]]  # the model calls again
        upstream += [*sent, *answer]
        assert chained.chain is not None and chained.chain.keep
        assert s.after_answer(chained.chain, Answer(f"resp_{k}", "completed", tuple(answer)))
        prev = f"resp_{k}"
        if k == 8:  # 7 calls made and answered
            assert [where(a) for a in chained.actions] == SEVENTH
    # the fresh actions, request by request (request k follows the (k-1)-th call): the 3rd and
    # 5th identical calls reminded, the 6th and 7th results withheld
    assert per_request == [
        [],
        [],
        [],
        [("repeat_reminder", "remind", 6, True)],
        [],
        [("repeat_reminder", "remind", 10, True)],
        [("escalation", "withhold", 12, True)],
        [("circuit_breaker", "withhold", 14, True), ("escalation", "withhold", 14, True)],
    ]


def test_chain_with_store_false_is_guarded_but_not_kept() -> None:
    _, items = full_items(2)
    s = store()
    d = decide(chain_request(1, items, None, store=False), s)
    assert d.chain is not None and not d.chain.keep
    s.after_answer(d.chain, Answer("resp_1", "completed", (items[1],)))
    assert len(s) == 0


def test_unknown_previous_id_is_forwarded_unguarded() -> None:
    _, items = full_items(7)
    raw = chain_request(7, items, "resp_gone")
    for s in (store(), None):
        d = decide(raw, s)
        assert (d.body is raw, d.actions, d.changed, d.unguarded) == (True, (), False, UNKNOWN_PREVIOUS)
        assert d.chain == Chain(previous="resp_gone", lost=True)


def test_a_stopped_answer_is_kept_as_the_agent_got_it_and_repaired_for_the_upstream() -> None:
    """The 7th identical call is answered with loopguard's stop (as in the demo); the user goes on
    from that response: the guards read the stop message (as in full-input form), the upstream
    gets the missing output of the call it made and the stop message first."""
    _, items = full_items(8)
    s = store()
    prev = None
    for k in range(1, 9):
        d = decide(chain_request(k, items, prev), s)
        call = dict(items[2 * k - 1], id=f"fc_{k}", status="completed")
        obj = response_object([call], rid=f"resp_{k}")
        judge = StopJudge(d.transcript, d.actions, GUARDS, Context(conversation=d.conversation), CFG)
        new, actions, answer = decide_json_answer(orjson.dumps(obj), judge, CFG)
        assert answer is not None and d.chain is not None
        s.after_answer(d.chain, answer)
        prev = f"resp_{k}"
        if new is not None:
            break
    assert (k, [a.kind for a in actions]) == (7, ["stop"])
    stopped = json.loads(new)["output"]
    assert answer.output == tuple(stopped) and answer.upstream == (call,)
    assert repair_items(answer)[0]["call_id"] == "call_7"
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go on"}]}
    raw = json.dumps({"model": "m", "previous_response_id": prev, "input": [user]}).encode()
    d = decide(raw, s)
    assert d.unguarded is None and d.changed
    assert d.transcript is not None and d.transcript.said[-2].text == stopped[0]["content"][0]["text"]
    assert json.loads(d.body)["input"] == [
        {"type": "function_call_output", "call_id": "call_7", "output": NOT_RUN_TEXT},
        {"type": "message", "role": "assistant", "content": stopped[0]["content"]},
        user,
    ]
    full = [*items[:13], *stopped, user]  # the same conversation in full-input form
    fd = decide(json.dumps({"model": "m", "input": full}).encode(), None)
    assert d.transcript == fd.transcript
    assert [where(a) for a in d.actions] == [where(a) for a in fd.actions]
    assert not any(a.fresh for a in d.actions)  # a new turn: nothing new to say


def test_chain_history_is_a_request_body_of_the_whole_chain() -> None:
    """What :func:`proxy.response.decide.earlier_stops` reads for a chained request (incident records)."""
    chain = Chain((b'[{"a":1}]', b"[]", b'[{"b":2},{"c":3}]'), 3, 0, "resp_1", True)
    assert orjson.loads(chain.history()) == {"input": [{"a": 1}, {"b": 2}, {"c": 3}]}
    assert orjson.loads(Chain().history()) == {"input": []}


# --- the key: one credential's responses, wherever the credential is -------------------------------


@pytest.mark.parametrize(
    ("a", "b"),
    [
        pytest.param(({"authorization": "Bearer a"}, ""), ({"authorization": "Bearer b"}, ""), id="bearer"),
        pytest.param(({"x-goog-api-key": "a"}, ""), ({"x-goog-api-key": "b"}, ""), id="google_header"),
        pytest.param(
            ({"ocp-apim-subscription-key": "a"}, ""),
            ({"ocp-apim-subscription-key": "b"}, ""),
            id="apim_header",
        ),
        pytest.param(({"cookie": "s=a"}, ""), ({"cookie": "s=b"}, ""), id="cookie"),
        pytest.param(({}, "api-key=a"), ({}, "api-key=b"), id="query_api_key"),
        pytest.param(({}, "key=a"), ({}, ""), id="query_key_or_none"),
        pytest.param(({"api-key": "x"}, ""), ({}, "api-key=x"), id="same_value_header_or_query"),
        pytest.param(({"authorization": "k"}, "q"), ({"authorization": "kq"}, ""), id="length_prefixed"),
    ],
)
def test_another_credential_in_a_header_or_the_query_gives_another_key(
    a: tuple[dict[str, str], str], b: tuple[dict[str, str], str]
) -> None:
    assert store_key(a[0], "resp_1", a[1]) != store_key(b[0], "resp_1", b[1])
    assert store_key(a[0], "resp_1", a[1]) == store_key(dict(a[0]), "resp_1", a[1])


def test_the_key_is_a_fixed_size_digest_without_the_credential() -> None:
    key = store_key({"authorization": "Bearer sk-secret"}, "resp_1", "key=AIza-secret")
    assert len(key) == 34 and key.startswith("r-") and "secret" not in key
