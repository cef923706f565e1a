"""Corpus gate: every loop fixture is acted on in time, no legit fixture is blocked.

Replays each fixture of ``tests/fixtures/loops`` (or ``$LOOPGUARD_LOOP_FIXTURES``) through the real
server with the shipped default config (:mod:`tests.helpers.corpus`). Run with ``-s`` to see the table.
Nothing is skipped or special-cased: every fixture found is replayed and judged by the same rule.
"""

from __future__ import annotations

from typing import Any

import pytest

from proxy.dialects import openai_chat
from tests.helpers import gemini_contents, messages_blocks
from tests.helpers.corpus import (
    WIRES,
    Observation,
    Replay,
    Verdict,
    compare,
    judge,
    load_fixtures,
    replay,
    table,
)
from tests.helpers.responses_items import back_to_messages, trace_items

FIXTURES = load_fixtures()
#: The default-config replays of :data:`FIXTURES` per (stream, dialect), made once per session.
_REPLAYS: dict[tuple[bool, str], list[Replay]] = {}


async def _all(stream: bool, dialect: str = "chat") -> list[Replay]:
    if (stream, dialect) not in _REPLAYS:
        _REPLAYS[stream, dialect] = [await replay(fx, None, stream, dialect) for fx in FIXTURES]
    return _REPLAYS[stream, dialect]


def test_fixtures_found() -> None:
    assert FIXTURES, "no loop fixtures found"
    assert {fx["kind"] for fx in FIXTURES} <= {"loop", "legit"}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_corpus_gate(stream: bool) -> None:
    replays = await _all(stream)
    print(f"\ncorpus gate ({'sse' if stream else 'json'}), default config:\n{table(replays)}")
    failures = [f"{r.fixture['id']}: {judge(r).reason}" for r in replays if not judge(r).ok]
    assert not failures, "; ".join(failures)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_responses_form_acts_at_the_same_calls_as_chat_form(stream: bool) -> None:
    """Every fixture converted to Responses items and replayed on ``POST /v1/responses``
    (answers as ``response`` objects / events) gets the same actions at the same calls, by the
    same rules, as in chat form: the two tables agree row by row, and so does every action."""
    chat = await _all(stream)
    responses = await _all(stream, "responses")
    print(f"\ncorpus gate ({'sse' if stream else 'json'}), Responses form:\n{table(responses)}")
    differences = compare(chat, responses)
    assert not differences, f"{len(differences)} of {len(FIXTURES)} fixtures differ:\n" + "\n".join(
        differences
    )


@pytest.mark.parametrize("form", ["hermes", "xml", "xml_user"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_text_form_acts_at_the_same_calls_as_structured_form(stream: bool, form: str) -> None:
    """Every fixture with its calls written as text (hermes blocks, or Qwen3-Coder XML;
    results as tool messages, or for ``xml_user`` as ``<tool_response>`` user messages), the
    answers too, gets the same actions at the same calls, by the same rules, as in structured
    form: the request side reads the text calls, and the agent receives the answers' calls
    repaired, judged like structured ones."""
    chat = await _all(stream)
    text = await _all(stream, form)
    print(f"\ncorpus gate ({'sse' if stream else 'json'}), {form} text form:\n{table(text)}")
    differences = compare(chat, text)
    assert not differences, f"{len(differences)} of {len(FIXTURES)} fixtures differ:\n" + "\n".join(
        differences
    )


@pytest.mark.parametrize("form", ["hermes", "xml", "xml_user"])
@pytest.mark.parametrize("fx", FIXTURES, ids=[str(fx["id"]) for fx in FIXTURES])
def test_text_form_reads_back_as_the_fixture(fx: dict[str, Any], form: str) -> None:
    """With nothing changed on the way, every request in text form reads back as the chat
    messages it came from, and the chat dialect reads the same calls and results from it."""
    wire = WIRES[form](fx)
    messages = fx["messages"]
    asked = [i for i, m in enumerate(messages) if m["role"] == "assistant"] + [len(messages)]
    for i in asked:  # the requests the replay sends: before each assistant message, and after all
        sent = wire.request(i, False)
        assert wire.arrived(i, sent) == messages[:i]
        structured = openai_chat.parse_request({**sent, "messages": messages[:i]})
        written = openai_chat.parse_request(sent)
        assert [(c.name, c.position >= 0, c.result is not None) for c in written.calls] == [
            (c.name, True, c.result is not None) for c in structured.calls
        ]
        assert written.newest_step == structured.newest_step


@pytest.mark.parametrize("fx", FIXTURES, ids=[str(fx["id"]) for fx in FIXTURES])
def test_responses_form_reads_back_as_the_fixture(fx: dict[str, Any]) -> None:
    """With nothing changed on the way, every request in Responses form reads back as the chat
    messages it came from (the reading the comparison relies on)."""
    messages = fx["messages"]
    traced = trace_items(messages)
    for i in range(len(messages) + 1):
        assert back_to_messages(messages, traced, i, traced.body(i)) == messages[:i]


def _fixture(steps: list[list[tuple[str, str, str]]], kind: str = "loop") -> dict[str, object]:
    """A fixture: one assistant message per entry of ``steps``, each a list of (tool, arguments,
    result)."""
    messages: list[dict[str, object]] = [{"role": "user", "content": "go"}]
    n = 0
    for calls in steps:
        wire, results = [], []
        for name, args, result in calls:
            n += 1
            wire.append({"id": f"c{n}", "type": "function", "function": {"name": name, "arguments": args}})
            results.append({"role": "tool", "tool_call_id": f"c{n}", "content": result})
        messages += [{"role": "assistant", "content": None, "tool_calls": wire}, *results]
    return {"id": "X1", "kind": kind, "messages": messages, "expect": {"intervene_by_call": 3}}


#: The harness tests pin every number they depend on, so that changes to the shipped defaults
#: cannot move their expectations: two guards (the seeds' rules), the stop and the runaway limits.
SEED = {
    "guards": {
        "repeat_reminder": {"progress_aware": False, "thresholds": [3, 5, 8]},
        "circuit_breaker": {"progress_aware": False, "duplicate_limit": 6},
        **{
            g: {"enabled": False}
            for g in (
                "recurrence",
                "cycles",
                "repeated_failure",
                "monologue",
                "echo_loop",
                "turn_guard",
                "escalation",
            )
        },
    },
    "stop": {"after_ignored_denials": 2},
    "response": {"max_calls_per_response": 32, "max_identical_per_response": 4},
}


def _with(config: dict[str, object], guard: str, **settings: object) -> dict[str, object]:
    guards = dict(config["guards"])  # type: ignore[call-overload]
    guards[guard] = {**guards[guard], **settings}
    return {**config, "guards": guards}


@pytest.mark.parametrize("dialect", ["chat", "responses", "gemini"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_harness_maps_what_the_proxy_did_to_call_numbers(stream: bool, dialect: str) -> None:
    """Ten identical calls, one per message: reminders at calls 3, 5, 8 (after their results),
    withholds from call 7, a stop of the 9th call (two withheld results ignored)."""
    fx = _fixture([[("read_file", '{"path": "a"}', "same")]] * 10)
    r = await replay(fx, SEED, stream, dialect)
    got = sorted((o.call, o.kind, o.rules) for o in r.observations)
    assert got == [
        (3, "remind", ("repeat_reminder",)),
        (5, "remind", ("repeat_reminder",)),
        (7, "withhold", ("circuit_breaker",)),
        (8, "remind", ("repeat_reminder",)),
        (8, "withhold", ("circuit_breaker",)),
        (9, "stop", ("stop",)),
        (9, "withhold", ("circuit_breaker",)),
        (10, "stop", ("stop",)),
        (10, "withhold", ("circuit_breaker",)),
    ]


@pytest.mark.parametrize("dialect", ["chat", "responses", "gemini"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_reminder_after_a_step_of_several_calls_counts_at_its_last_call(
    stream: bool, dialect: str
) -> None:
    """Six identical parallel writes in one message: the runaway cut drops call 5 on (the first call
    the agent did not get); the reminders after the step (gentle at 3, detailed at 5) count at call
    6, the step's last call: the agent ran all six before the model read them."""
    fx = _fixture([[("write_file", '{"path": "a"}', "same")] * 6])
    r = await replay(fx, SEED, stream, dialect)
    assert [(o.call, o.kind, o.message, o.side, o.rules) for o in r.observations] == [
        (5, "cut", 1, "response", ("runaway",)),
        (6, "remind", 8, "request", ("repeat_reminder",)),
    ]
    assert [(m.call, m.upto, m.text.split(".")[0]) for m in r.reminders] == [
        (6, 8, "[loopguard] You have made the same tool call several times in a row"),
        (6, 8, "[loopguard] You are repeating the same tool call without making progress"),
    ]
    assert judge(r) == Verdict(False, "by call 3", "late (call 5)")
    in_time = Replay({**fx, "expect": {"intervene_by_call": 5}}, stream, r.observations)
    assert judge(in_time) == Verdict(True, "by call 5", "ok")


@pytest.mark.parametrize("dialect", ["chat", "responses", "gemini"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_appended_reminders_count_at_the_steps_last_call_withholds_at_their_own(
    stream: bool, dialect: str
) -> None:
    """``tool_suffix`` delivery, steps of two calls (read_file, then ls, untracked and exempt) whose
    results come back in reverse order, so the step's last result is read_file's: a reminder
    appended to it counts at the step's last call (ls), a withhold at read_file's own call; the
    reminder appended to a denial text is a reminder too."""
    config = _with(SEED, "repeat_reminder", inject_as="tool_suffix", exclude=["ls"])
    config = _with(config, "circuit_breaker", exempt=["ls"])
    fx = _fixture([[("read_file", '{"path": "a"}', "same"), ("ls", "{}", "x")]] * 8)
    messages = fx["messages"]
    for k, m in enumerate(list(messages)):
        if m["role"] == "assistant":  # type: ignore[index]
            messages[k + 1], messages[k + 2] = messages[k + 2], messages[k + 1]  # type: ignore[index]
    r = await replay(fx, config, stream, dialect)
    assert [(o.call, o.kind, o.rules) for o in r.observations] == [
        (6, "remind", ("repeat_reminder",)),  # read_file's 3rd call is call 5
        (10, "remind", ("repeat_reminder",)),  # its 5th is call 9
        (13, "withhold", ("circuit_breaker",)),  # its 7th
        (15, "withhold", ("circuit_breaker",)),  # its 8th ...
        (16, "remind", ("repeat_reminder",)),  # ... and the reminder appended to that denial
    ]
    # history before each reminder: up to the result it was appended to (read_file's, listed last)
    assert [(m.call, m.upto, m.message) for m in r.reminders] == [(6, 10, 10), (10, 16, 16), (16, 25, 25)]
    assert [m.text.split("\n")[0] for m in r.reminders][1:] == [
        "[loopguard] You are repeating the same tool call without making progress."
    ] * 2
    assert "- consecutive_calls: 8" in r.reminders[2].text


@pytest.mark.parametrize("dialect", ["chat", "responses", "gemini"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_harness_reads_legacy_function_calls(stream: bool, dialect: str) -> None:
    """As ten identical tool calls: a withheld ``function`` message is a withhold at its call."""
    messages: list[dict[str, object]] = [{"role": "user", "content": "go"}]
    for _ in range(10):
        fc = {"name": "get_weather", "arguments": '{"city": "Tokyo"}'}
        messages += [
            {"role": "assistant", "content": None, "function_call": fc},
            {"role": "function", "name": "get_weather", "content": "sunny"},
        ]
    fx = {"id": "X2", "kind": "loop", "messages": messages, "expect": {"intervene_by_call": 3}}
    r = await replay(fx, SEED, stream, dialect)
    assert sorted((o.call, o.kind) for o in r.observations) == [
        (3, "remind"),
        (5, "remind"),
        (7, "withhold"),
        (8, "remind"),
        (8, "withhold"),
        (9, "stop"),
        (9, "withhold"),
        (10, "stop"),
        (10, "withhold"),
    ]


@pytest.mark.parametrize("dialect", ["chat", "responses", "gemini"])
async def test_a_degenerate_text_cut_is_a_block_on_a_legit_fixture(dialect: str) -> None:
    messages = [
        {"role": "user", "content": "write"},
        {"role": "assistant", "content": "ok " + "la la " * 600},
    ]
    fx = {"id": "X3", "kind": "legit", "messages": messages, "expect": {"no_block": True}}
    r = await replay(fx, None, True, dialect)
    assert [(o.call, o.kind, o.rules) for o in r.observations] == [(1, "cut", ("degenerate_text",))]
    assert not judge(r).ok


def _every_form(repeats: int = 2) -> dict[str, Any]:
    """A looping fixture (read_file a, again and again) written in every chat form the Responses
    converter must carry over: assistant text with a step of two calls whose results come back
    in reverse order, content parts (user, tool), calls and tool messages without ids, the legacy
    ``function_call`` / ``function`` pair, arguments as an object."""
    read = {"name": "read_file", "arguments": '{"path": "a"}'}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": [{"type": "text", "text": "fix the bug"}]},
    ]
    for r in range(repeats):
        messages += [
            {
                "role": "assistant",
                "content": "Reading it.",
                "tool_calls": [
                    {"id": f"a{r}", "type": "function", "function": read},
                    {"id": f"b{r}", "type": "function", "function": {"name": "ls", "arguments": "{}"}},
                ],
            },
            {"role": "tool", "tool_call_id": f"b{r}", "content": "a b"},
            {"role": "tool", "tool_call_id": f"a{r}", "content": [{"type": "text", "text": "same"}]},
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "Once more."}],
                "tool_calls": [
                    {"type": "function", "function": read},
                    {"type": "function", "function": {"name": "ls", "arguments": "{}"}},
                ],
            },
            {"role": "tool", "content": "same"},
            {"role": "tool", "content": "a b"},
            {"role": "assistant", "content": None, "function_call": read},
            {"role": "function", "name": "read_file", "content": "same"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{r}",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": {"path": "a"}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"c{r}", "content": "same"},
        ]
    return {"id": "X4", "kind": "loop", "messages": messages, "expect": {"intervene_by_call": 3}}


def test_every_chat_form_is_converted_to_responses_items() -> None:
    traced = trace_items(_every_form(1)["messages"])
    assert traced.instructions == "You are a coding agent."
    assert [(it["type"], it.get("role") or it.get("call_id")) for it in traced.items] == [
        ("message", "user"),
        ("message", "assistant"),  # the text comes before its calls
        ("function_call", "a0"),
        ("function_call", "b0"),
        ("function_call_output", "b0"),
        ("function_call_output", "a0"),
        ("message", "assistant"),
        ("function_call", "lg_call_3"),  # no id: its number in the conversation
        ("function_call", "lg_call_4"),
        ("function_call_output", "lg_call_3"),  # no id: the oldest waiting call
        ("function_call_output", "lg_call_4"),
        ("function_call", "lg_call_5"),  # legacy function_call
        ("function_call_output", "lg_call_5"),  # its function message
        ("function_call", "c0"),
        ("function_call_output", "c0"),
    ]
    assert traced.origin == [1, 2, 2, 2, 3, 4, 5, 5, 5, 6, 7, 8, 9, 10, 11]
    assert traced.items[0]["content"] == [{"type": "input_text", "text": "fix the bug"}]
    assert traced.items[5]["output"] == [{"type": "input_text", "text": "same"}]
    assert traced.items[13]["arguments"] == '{"path": "a"}'


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("delivery", ["message", "tool_suffix", "default"])
async def test_every_chat_form_acts_alike_in_responses_form(stream: bool, delivery: str) -> None:
    """The fixture of every chat form replayed in both dialects: the same actions at the same
    calls (reminders, withholds, stops), with the seed guards (reminders as messages or appended
    to results) and with the shipped default config."""
    config: dict[str, Any] | None = None
    if delivery != "default":
        config = _with(
            SEED, "repeat_reminder", exclude=["ls"], inject_as="user" if delivery == "message" else delivery
        )
        config = _with(config, "circuit_breaker", exempt=["ls"])
    fx = _every_form(3)
    chat = await replay(fx, config, stream)
    responses = await replay(fx, config, stream, "responses")
    assert {o.kind for o in chat.observations} >= ({"remind", "withhold", "stop"} if config else {"remind"})
    assert not compare([chat], [responses])
    assert [(m.call, m.upto, m.text) for m in responses.reminders] == [
        (m.call, m.upto, m.text) for m in chat.reminders
    ]


def test_compare_lists_each_fixture_that_differs_with_both_outcomes() -> None:
    fx = {"id": "X5", "kind": "loop", "messages": [], "expect": {"intervene_by_call": 3}}
    other = {**fx, "id": "X6"}
    remind = Observation("remind", 3, 4, "request", ("repeat_reminder",))
    late = Observation("remind", 5, 8, "request", ("repeat_reminder",))
    chat = [Replay(fx, False, [remind]), Replay(other, False, [remind])]
    responses = [
        Replay(fx, False, [late], dialect="responses"),
        Replay(other, False, [remind], dialect="responses"),
    ]
    assert compare(chat, responses) == [
        "X5:\n"
        "  chat: by call 3 | call 3 repeat_reminder remind | - | PASS | all: call 3 repeat_reminder remind\n"
        "  responses: by call 3 | call 5 repeat_reminder remind | - | FAIL (late (call 5)) | all: call 5"
        " repeat_reminder remind"
    ]
    assert compare(chat, chat) == []


# --- Anthropic Messages form ---------------------------------------------------------------------


def request_side(r: Replay) -> tuple[list[tuple[int, str, tuple[str, ...]]], list[tuple[int, int, str]], int]:
    """What the proxy did to a replay's requests: every request-side observation ``(call, kind,
    rules)``, every reminder text ``(call, upto, text)`` the model received, and the internal
    errors."""
    acts = sorted((o.call, o.kind, o.rules) for o in r.observations if o.side == "request")
    return acts, [(m.call, m.upto, m.text) for m in r.reminders], r.internal_errors


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_messages_form_gets_the_same_request_side_actions_as_chat_form(stream: bool) -> None:
    """Every fixture converted to Messages form (a run of tool messages is one user message of
    ``tool_result`` blocks) and replayed on ``POST /v1/messages`` (answers as Messages ``message``
    objects / events): the same reminders and withholds at the same calls, by the same rules,
    with the same reminder texts at the same places, and no internal error."""
    chat = await _all(stream)
    messages = await _all(stream, "messages")
    print(f"\ncorpus gate ({'sse' if stream else 'json'}), Messages form:\n{table(messages)}")
    differ = [
        f"{a.fixture['id']}:\n  chat: {request_side(a)}\n  messages: {request_side(b)}"
        for a, b in zip(chat, messages, strict=True)
        if request_side(a) != request_side(b)
    ]
    assert not differ, f"{len(differ)} of {len(FIXTURES)} fixtures differ:\n" + "\n".join(differ)
    assert sum(len(request_side(r)[0]) for r in messages) > len(FIXTURES)  # it acted: a real comparison


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_messages_form_acts_at_the_same_calls_as_chat_form(stream: bool) -> None:
    """Every fixture in Messages form gets the same actions at the same calls as in
    chat form, the answer side's included (the two tables agree row by row)."""
    differences = compare(await _all(stream), await _all(stream, "messages"))
    assert not differences, f"{len(differences)} of {len(FIXTURES)} fixtures differ:\n" + "\n".join(
        differences
    )


@pytest.mark.parametrize("fx", FIXTURES, ids=[str(fx["id"]) for fx in FIXTURES])
def test_messages_form_reads_back_as_the_fixture(fx: dict[str, Any]) -> None:
    """With nothing changed on the way, every request in Messages form reads back as the chat
    messages it came from (the reading the comparison relies on)."""
    messages = fx["messages"]
    traced = messages_blocks.trace_blocks(messages)
    for i in range(len(messages) + 1):
        assert messages_blocks.back_to_messages(messages, traced, i, traced.body(i)) == messages[:i]


def test_every_chat_form_is_converted_to_messages_blocks() -> None:
    traced = messages_blocks.trace_blocks(_every_form(1)["messages"])
    assert traced.system == "You are a coding agent."
    shape = [
        (m["role"], [(b["type"], b.get("id") or b.get("tool_use_id")) for b in m["content"]])
        for m in traced.messages
    ]
    assert shape == [
        ("user", [("text", None)]),
        ("assistant", [("text", None), ("tool_use", "a0"), ("tool_use", "b0")]),
        ("user", [("tool_result", "b0"), ("tool_result", "a0")]),  # a run of results: one message
        ("assistant", [("text", None), ("tool_use", "toolu_lg_3"), ("tool_use", "toolu_lg_4")]),
        ("user", [("tool_result", "toolu_lg_3"), ("tool_result", "toolu_lg_4")]),  # no id: the oldest
        ("assistant", [("tool_use", "toolu_lg_5")]),  # legacy function_call
        ("user", [("tool_result", "toolu_lg_5")]),
        ("assistant", [("tool_use", "c0")]),
        ("user", [("tool_result", "c0")]),
    ]
    assert traced.units == [[1], [2], [3, 4], [5], [6, 7], [8], [9], [10], [11]]
    assert traced.messages[2]["content"][1]["content"] == [{"type": "text", "text": "same"}]
    assert traced.messages[7]["content"][0]["input"] == {"path": "a"}  # arguments as an object
    assert traced.messages[1]["content"][1]["input"] == {"path": "a"}  # a JSON string decoded


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("delivery", ["message", "tool_suffix", "default"])
async def test_every_chat_form_gets_the_same_request_side_actions_in_messages_form(
    stream: bool, delivery: str
) -> None:
    """The fixture of every chat form replayed in both dialects: the same reminders and withholds
    at the same calls, with the seed guards (reminders as text blocks or appended to results)
    and with the shipped default config."""
    config: dict[str, Any] | None = None
    if delivery != "default":
        config = _with(
            SEED, "repeat_reminder", exclude=["ls"], inject_as="user" if delivery == "message" else delivery
        )
        config = _with(config, "circuit_breaker", exempt=["ls"])
    fx = _every_form(3)
    chat = await replay(fx, config, stream)
    messages = await replay(fx, config, stream, "messages")
    assert {o.kind for o in messages.observations} >= ({"remind", "withhold"} if config else {"remind"})
    assert request_side(messages) == request_side(chat)


# --- Gemini API form ----------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_gemini_form_acts_at_the_same_calls_as_chat_form(stream: bool) -> None:
    """Every fixture converted to Gemini contents as Gemini CLI sends them (calls without ids in
    the API's answers, results paired by name and order) and replayed on
    ``:generateContent`` / ``:streamGenerateContent?alt=sse`` (answers as
    ``GenerateContentResponse`` objects / events): the same actions at the same calls, by the same
    rules, as in chat form, the answer side's included, and no internal error."""
    chat = await _all(stream)
    got = await _all(stream, "gemini")
    print(f"\ncorpus gate ({'sse' if stream else 'json'}), Gemini form:\n{table(got)}")
    differences = compare(chat, got)
    assert not differences, f"{len(differences)} of {len(FIXTURES)} fixtures differ:\n" + "\n".join(
        differences
    )
    assert [request_side(r)[1] for r in got] == [request_side(r)[1] for r in chat]  # the same texts
    assert sum(len(request_side(r)[0]) for r in got) > len(FIXTURES)  # it acted: a real comparison


@pytest.mark.parametrize("fx", FIXTURES, ids=[str(fx["id"]) for fx in FIXTURES])
def test_gemini_form_reads_back_as_the_fixture(fx: dict[str, Any]) -> None:
    """With nothing changed on the way, every request in Gemini form reads back as the chat
    messages it came from (the reading the comparison relies on)."""
    messages = fx["messages"]
    traced = gemini_contents.trace_contents(messages)
    for i in range(len(messages) + 1):
        assert gemini_contents.back_to_messages(messages, traced, i, traced.body(i)) == messages[:i]


def test_every_chat_form_is_converted_to_gemini_contents() -> None:
    traced = gemini_contents.trace_contents(_every_form(1)["messages"])
    assert traced.system == "You are a coding agent."
    shape = [
        (
            c["role"],
            [(k, p[k].get("name") if isinstance(p[k], dict) else p[k]) for p in c["parts"] for k in p],
        )
        for c in traced.contents
    ]
    assert shape == [
        ("user", [("text", "fix the bug")]),
        ("model", [("text", "Reading it."), ("functionCall", "read_file"), ("functionCall", "ls")]),
        ("user", [("functionResponse", "ls"), ("functionResponse", "read_file")]),  # paired by id
        ("model", [("text", "Once more."), ("functionCall", "read_file"), ("functionCall", "ls")]),
        ("user", [("functionResponse", "read_file"), ("functionResponse", "ls")]),  # no id: in order
        ("model", [("functionCall", "read_file")]),  # legacy function_call
        ("user", [("functionResponse", "read_file")]),
        ("model", [("functionCall", "read_file")]),
        ("user", [("functionResponse", "read_file")]),
    ]
    assert traced.units == [[1], [2], [3, 4], [5], [6, 7], [8], [9], [10], [11]]
    assert traced.contents[2]["parts"][1]["functionResponse"]["response"] == {"output": "same"}
    assert traced.contents[7]["parts"][0]["functionCall"]["args"] == {"path": "a"}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("delivery", ["message", "tool_suffix", "default"])
async def test_every_chat_form_acts_alike_in_gemini_form(stream: bool, delivery: str) -> None:
    """The fixture of every chat form replayed in both dialects: the same actions at the same
    calls (reminders, withholds, stops), with the seed guards (reminders as user contents or
    appended to results' ``output``) and with the shipped default config."""
    config: dict[str, Any] | None = None
    if delivery != "default":
        config = _with(
            SEED, "repeat_reminder", exclude=["ls"], inject_as="user" if delivery == "message" else delivery
        )
        config = _with(config, "circuit_breaker", exempt=["ls"])
    fx = _every_form(3)
    chat = await replay(fx, config, stream)
    got = await replay(fx, config, stream, "gemini")
    assert {o.kind for o in got.observations} >= ({"remind", "withhold", "stop"} if config else {"remind"})
    assert not compare([chat], [got])
    assert [(m.call, m.upto, m.text) for m in got.reminders] == [
        (m.call, m.upto, m.text) for m in chat.reminders
    ]
