"""Tool calls written as text: the parser, the chat request side, and the repair of
answers in JSON and SSE (split at every byte boundary), without sockets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.config import Config, build, load_config
from proxy.core.actions import Cut, Remind, Repair, Stop, Withhold
from proxy.core.canonical import canonical_arguments
from proxy.dialects import openai_chat, openai_responses
from proxy.dialects.text_calls import find_calls, tool_responses
from proxy.guards import build_guards
from proxy.request.rewrite import decide_request
from proxy.response.decide import decide_json
from proxy.response.repair import Repairer, allowed_tools, for_request
from proxy.response.stream_guard import StreamGuard
from tests.helpers.quirks import BASE, chunk, stream

SCHEMA = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "limit": {"type": "integer"},
        "ratio": {"type": "number"},
        "force": {"type": "boolean"},
        "opts": {"type": "object"},
        "paths": {"type": "array"},
        "maybe": {"type": ["null", "integer"]},
    },
}
TOOLS = {"read": SCHEMA, "grep": {"type": "object", "properties": {"pattern": {"type": "string"}}}}

HERMES = '<tool_call>\n{"name": "read", "arguments": {"path": "a.py"}}\n</tool_call>'
XML = "<tool_call>\n<function=read>\n<parameter=path>\na.py\n</parameter>\n</function>\n</tool_call>"
BARE = "<function=read>\n<parameter=path>\na.py\n</parameter>\n</function>"
A_PY = [("read", {"path": "a.py"})]

# (case, text, tools, calls as (name, arguments), text before the first block); calls None = none
PARSE: list[tuple[str, str, Any, list[tuple[str, dict[str, Any]]] | None, str]] = [
    ("hermes", HERMES, TOOLS, A_PY, ""),
    ("hermes without newlines", HERMES.replace("\n", ""), TOOLS, A_PY, ""),
    ("hermes after text", "Let me look.\n" + HERMES, TOOLS, A_PY, "Let me look.\n"),
    (
        "hermes arguments as a JSON string holding an object",
        '<tool_call>\n{"name": "read", "arguments": "{\\"path\\": \\"a.py\\"}"}\n</tool_call>',
        TOOLS,
        A_PY,
        "",
    ),
    ("hermes arguments a list", '<tool_call>{"name": "read", "arguments": [1]}</tool_call>', TOOLS, None, ""),
    ("hermes arguments missing", '<tool_call>{"name": "read"}</tool_call>', TOOLS, None, ""),
    (
        "hermes invalid JSON",
        '<tool_call>\n{"name": "read", "arguments": {"path": }\n</tool_call>',
        TOOLS,
        None,
        "",
    ),
    (
        "hermes closing tag inside a string value",
        '<tool_call>{"name": "grep", "arguments": {"pattern": "</tool_call>"}}</tool_call>',
        TOOLS,
        [("grep", {"pattern": "</tool_call>"})],
        "",
    ),
    (
        "hermes parallel blocks",
        HERMES + "\n" + HERMES.replace("a.py", "b.py"),
        TOOLS,
        [("read", {"path": "a.py"}), ("read", {"path": "b.py"})],
        "",
    ),
    ("xml", XML, TOOLS, A_PY, ""),
    ("bare <function=", BARE, TOOLS, A_PY, ""),
    ("bare <function= and a stray </tool_call>", BARE + "\n</tool_call>", TOOLS, A_PY, ""),
    (
        "xml typed by the schema",
        "<tool_call>\n<function=read>\n<parameter=path>\n7\n</parameter>\n<parameter=limit>\n7\n</parameter>\n"
        "<parameter=ratio>\n0.5\n</parameter>\n<parameter=force>\nTrue\n</parameter>\n"
        '<parameter=opts>\n{"a": [1]}\n</parameter>\n<parameter=paths>\n["x", "y"]\n</parameter>\n'
        "<parameter=maybe>\nnull\n</parameter>\n</function>\n</tool_call>",
        TOOLS,
        [
            (
                "read",
                {
                    "path": "7",
                    "limit": 7,
                    "ratio": 0.5,
                    "force": True,
                    "opts": {"a": [1]},
                    "paths": ["x", "y"],
                    "maybe": None,
                },
            )
        ],
        "",
    ),
    (
        "xml value that does not convert stays the string",
        "<function=read>\n<parameter=limit>\nten\n</parameter>\n</function>",
        TOOLS,
        [("read", {"limit": "ten"})],
        "",
    ),
    (
        "xml untyped without tools: strings",
        "<function=read>\n<parameter=limit>\n7\n</parameter>\n</function>",
        None,
        [("read", {"limit": "7"})],
        "",
    ),
    (
        "xml multi-line value: one newline stripped each side",
        "<function=grep>\n<parameter=pattern>\n\ndef f():\n    return 1\n\n</parameter>\n</function>",
        TOOLS,
        [("grep", {"pattern": "\ndef f():\n    return 1\n"})],
        "",
    ),
    (
        "unicode values",
        '<tool_call>{"name": "read", "arguments": {"path": "résumé/日本.md"}}</tool_call>'
        + "<function=grep>\n<parameter=pattern>\nπ≈3 😀\n</parameter>\n</function>",
        TOOLS,
        [("read", {"path": "résumé/日本.md"}), ("grep", {"pattern": "π≈3 😀"})],
        "",
    ),
    ("mixed forms in parallel", HERMES + "\n" + BARE, TOOLS, A_PY * 2, ""),
    (
        "think block before the call",
        "<think>\nI should read.\n</think>\n\n" + XML,
        TOOLS,
        A_PY,
        "<think>\nI should read.\n</think>\n\n",
    ),
    ("call inside think", "<think>\n" + XML + "\n</think>\nNo tool needed.", TOOLS, None, ""),
    ("call before a pre-inserted </think>", XML + "\n</think>\nDone.", TOOLS, None, ""),
    (
        "call after a pre-inserted </think>",
        "reasoning\n</think>\n" + HERMES,
        TOOLS,
        A_PY,
        "reasoning\n</think>\n",
    ),
    ("unclosed think", "<think>\n" + XML, TOOLS, None, ""),
    ("code-fenced markup", "Example:\n```xml\n" + XML + "\n```\n", TOOLS, None, ""),
    ("tilde-fenced markup", "~~~\n" + HERMES + "\n~~~", TOOLS, None, ""),
    ("unclosed fence", "```\n" + HERMES, TOOLS, None, ""),
    ("a call after a closed fence", "```\nx\n```\n" + HERMES, TOOLS, A_PY, "```\nx\n```\n"),
    ("unknown tool", HERMES.replace('"read"', '"write"'), TOOLS, None, ""),
    ("unknown tool among known ones", HERMES + BARE.replace("=read", "=write"), TOOLS, None, ""),
    (
        "any well-formed name without tools",
        HERMES.replace('"read"', '"write"'),
        None,
        [("write", {"path": "a.py"})],
        "",
    ),
    ("incomplete block", XML[:-12], TOOLS, None, ""),
    ("missing </parameter>", "<function=read>\n<parameter=path>\na.py\n</function>", TOOLS, None, ""),
    (
        "duplicate parameter",
        "<function=read>\n<parameter=path>\na\n</parameter>\n<parameter=path>\nb\n</parameter>\n</function>",
        TOOLS,
        None,
        "",
    ),
    ("text after the calls", HERMES + "\nThat should do it.", TOOLS, None, ""),
    ("prose that mentions the tag", "Models write <tool_call> blocks when they call tools.", TOOLS, None, ""),
    ("prose mentioning a tag before a real block", "Use <function=NAME> here:\n" + HERMES, TOOLS, None, ""),
    ("no markup", "Just text.", TOOLS, None, ""),
    (
        "anyOf types (pydantic's Optional[int])",
        "<function=read>\n<parameter=limit>\n40\n</parameter>\n</function>",
        {"read": {"properties": {"limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}}},
        [("read", {"limit": 40})],
        "",
    ),
    (
        "CRLF around a value",
        "<function=read>\r\n<parameter=path>\r\na.py\r\n</parameter>\r\n</function>",
        TOOLS,
        A_PY,
        "",
    ),
]


@pytest.mark.parametrize(("case", "text", "tools", "want", "before"), PARSE, ids=[p[0] for p in PARSE])
def test_find_calls(case: str, text: str, tools: Any, want: Any, before: str) -> None:
    found = find_calls(text, tools)
    if want is None:
        assert found is None
        return
    assert found is not None
    assert [(c.name, c.arguments) for c in found.calls] == want
    assert found.text == before
    assert found.calls[0].start == len(before)
    assert found.calls[-1].end == len(text.rstrip())


def test_spans_cover_each_block() -> None:
    text = "Hi.\n" + HERMES + "\n\n" + XML
    found = find_calls(text, TOOLS)
    assert found is not None
    assert [text[c.start : c.end] for c in found.calls] == [HERMES, XML]
    assert [c.form for c in found.calls] == ["hermes", "xml"]


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("<tool_response>\nok\n</tool_response>", ["ok"]),
        ("<tool_response>\na\n</tool_response>\n<tool_response>\n\nb\n\n</tool_response>\n", ["a", "\nb\n"]),
        ("Here is what I got: <tool_response>\nok\n</tool_response>", None),
        ("<tool_response>\nok\n</tool_response> thanks", None),
        ("<tool_response>\nunclosed", None),
        ("plain", None),
    ],
)
def test_tool_responses(text: str, want: list[str] | None) -> None:
    assert tool_responses(text) == want


# --- the request side -----------------------------------------------------------------------------

CHAT_TOOLS = [{"type": "function", "function": {"name": n, "parameters": s}} for n, s in TOOLS.items()]


def hermes(name: str, args: dict[str, Any]) -> str:
    return "<tool_call>\n" + orjson.dumps({"name": name, "arguments": args}).decode() + "\n</tool_call>"


def xml(name: str, args: dict[str, Any]) -> str:
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def in_results(*results: str) -> dict[str, Any]:
    return {"role": "user", "content": "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)}


def test_text_calls_in_history_are_steps_like_structured_ones() -> None:
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "Reading.\n" + xml("read", {"path": "a.py", "limit": 3})},
        {"role": "tool", "content": "A"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "grep", "arguments": '{"pattern":"x"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "G"},
        {
            "role": "assistant",
            "content": hermes("read", {"path": "b.py"}) + "\n" + hermes("grep", {"pattern": "y"}),
        },
        in_results("B", "Error: no such pattern"),
    ]
    t = openai_chat.parse_request({"model": "m", "tools": CHAT_TOOLS, "messages": messages})
    assert [(c.name, canonical_arguments(c.arguments, c.arguments_raw), c.position) for c in t.calls] == [
        ("read", '{"limit":3,"path":"a.py"}', 1),
        ("grep", '{"pattern":"x"}', 3),
        ("read", '{"path":"b.py"}', 5),
        ("grep", '{"pattern":"y"}', 5),
    ]
    assert [(c.result.position, c.result.text, c.result.part) for c in t.calls if c.result] == [
        (2, "A", None),
        (4, "G", None),
        (6, "B", 0),
        (6, "Error: no such pattern", 1),
    ]
    assert [(s.position, s.calls, s.end) for s in t.steps] == [(1, (0,), 2), (3, (1,), 4), (5, (2, 3), 6)]
    assert t.user_positions == (0,)  # the results message is no user turn
    assert t.newest_step == 2
    assert [(s.position, s.text, s.has_calls) for s in t.said] == [
        (0, "go", False),
        (1, "Reading.\n", True),
        (3, "", True),
        (5, "", True),
    ]
    assert t.assistant_text_positions == (1,)


@pytest.mark.parametrize(
    "messages",
    [
        # a user pasting docs: prose with tags, not after a text step
        [
            {
                "role": "user",
                "content": "The format is " + hermes("read", {"path": "a"}) + " and results come as",
            }
        ],
        [{"role": "user", "content": "<tool_response>\nok\n</tool_response>"}],
        # an assistant quoting the format in a code fence, the user answering with a quoted result
        [
            {"role": "user", "content": "how do I call read?"},
            {"role": "assistant", "content": "Like this:\n```\n" + hermes("read", {"path": "a"}) + "\n```"},
            {"role": "user", "content": "<tool_response>\nok\n</tool_response>"},
        ],
        # the markup names a tool the request does not offer
        [{"role": "user", "content": "go"}, {"role": "assistant", "content": hermes("write", {"path": "a"})}],
        # text after the block
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": hermes("read", {"path": "a"}) + " then I'll grep."},
        ],
    ],
)
def test_prose_that_mentions_tags_is_no_call(messages: list[dict[str, Any]]) -> None:
    t = openai_chat.parse_request({"model": "m", "tools": CHAT_TOOLS, "messages": messages})
    assert t.calls == ()
    assert t.user_positions == tuple(i for i, m in enumerate(messages) if m["role"] == "user")


def test_a_results_message_with_other_text_is_a_user_turn() -> None:
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": hermes("read", {"path": "a"})},
        {"role": "user", "content": "<tool_response>\nok\n</tool_response>\nNow stop reading."},
    ]
    t = openai_chat.parse_request({"model": "m", "tools": CHAT_TOOLS, "messages": messages})
    assert [c.result for c in t.calls] == [None]
    assert t.user_positions == (0, 2)
    assert t.newest_step is None


def test_text_calls_without_tools_in_the_request() -> None:
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": xml("anything", {"a": 1})},
    ]
    t = openai_chat.parse_request({"model": "m", "messages": messages})
    assert [(c.name, c.arguments) for c in t.calls] == [("anything", {"a": "1"})]
    assert t.tools is None


#: the circuit breaker alone, withholding from the 3rd identical call
BREAKER = {
    "guards": {
        "circuit_breaker": {"progress_aware": False, "duplicate_limit": 2},
        **{
            g: {"enabled": False}
            for g in (
                "repeat_reminder",
                "recurrence",
                "cycles",
                "repeated_failure",
                "monologue",
                "echo_loop",
                "turn_guard",
                "escalation",
            )
        },
    }
}
REMINDER = {
    "guards": {
        **BREAKER["guards"],
        "circuit_breaker": {"enabled": False},
        "repeat_reminder": {"enabled": True, "progress_aware": False, "thresholds": [3]},
    }
}


def decide(messages: list[dict[str, Any]], config: dict[str, Any]) -> tuple[bytes, list[Any]]:
    cfg = build(Config, config)
    raw = orjson.dumps({"model": "m", "tools": CHAT_TOOLS, "messages": messages})
    d = decide_request(raw, {}, build_guards(cfg.guards), ())
    return d.body, [a for a in d.actions if a.fresh]


def looping(results: str, single: bool = False) -> list[dict[str, Any]]:
    """Three identical text steps: a grep, then read a.py (or only the read: ``single``)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for _ in range(3):
        grep = "" if single else hermes("grep", {"pattern": "x"})
        messages.append({"role": "assistant", "content": grep + hermes("read", {"path": "a.py"})})
        outs = ["same"] if single else ["g", "same"]
        if results == "user":
            messages.append(in_results(*outs))
        else:
            messages += [{"role": "tool", "content": o} for o in outs]
    return messages


def test_withhold_replaces_only_the_text_inside_its_tool_response() -> None:
    messages = looping("user")
    body, actions = decide(messages, BREAKER)
    withheld = [a for a in actions if isinstance(a, Withhold)]
    assert [(a.position, a.part, a.tool) for a in withheld] == [(6, 0, "grep"), (6, 1, "read")]
    sent = orjson.loads(body)["messages"]
    assert sent[:6] == messages[:6]
    parts = tool_responses(sent[6]["content"])
    assert parts is not None and [p.startswith("[loopguard]") for p in parts] == [True, True]
    assert (
        sent[6]["content"]
        == f"<tool_response>\n{parts[0]}\n</tool_response>\n<tool_response>\n{parts[1]}\n</tool_response>"
    )


def test_withhold_of_one_block_keeps_the_other() -> None:
    messages = looping("user")
    messages[2] = in_results("g1", "same")  # grep's results differ: only read's is withheld
    messages[4] = in_results("g2", "same")
    messages[6] = in_results("g3", "same")
    messages[1]["content"] = hermes("grep", {"pattern": "1"}) + hermes("read", {"path": "a.py"})
    messages[3]["content"] = hermes("grep", {"pattern": "2"}) + hermes("read", {"path": "a.py"})
    body, actions = decide(messages, BREAKER)
    assert [(a.position, a.part) for a in actions if isinstance(a, Withhold)] == [(6, 1)]
    content = orjson.loads(body)["messages"][6]["content"]
    assert content.startswith("<tool_response>\ng3\n</tool_response>\n<tool_response>\n[loopguard]")
    assert content.endswith("\n</tool_response>")


def test_withhold_of_a_text_call_answered_by_tool_messages() -> None:
    messages = looping("tool")
    body, actions = decide(messages, BREAKER)
    assert [(a.position, a.part) for a in actions if isinstance(a, Withhold)] == [(8, None), (9, None)]
    sent = orjson.loads(body)["messages"]
    assert sent[:8] == messages[:8]
    assert sent[8]["content"].startswith("[loopguard]") and sent[9]["content"].startswith("[loopguard]")


@pytest.mark.parametrize("results", ["user", "tool"])
def test_reminder_after_text_results_is_a_user_message_after_them(results: str) -> None:
    messages = looping(results, single=True)
    body, actions = decide(messages, REMINDER)
    assert [type(a) for a in actions] == [Remind]
    sent = orjson.loads(body)["messages"]
    assert sent[: len(messages)] == messages
    assert len(sent) == len(messages) + 1
    assert sent[-1]["role"] == "user" and sent[-1]["content"].startswith("[loopguard]")


def test_reminder_as_tool_suffix_goes_after_the_last_tool_response() -> None:
    config = {
        **REMINDER,
        "guards": {
            **REMINDER["guards"],
            "repeat_reminder": {**REMINDER["guards"]["repeat_reminder"], "inject_as": "tool_suffix"},
        },
    }
    messages = looping("user", single=True)
    body, _ = decide(messages, config)
    sent = orjson.loads(body)["messages"]
    assert len(sent) == len(messages)
    before = messages[-1]["content"]
    assert sent[-1]["content"].startswith(before + "\n\n[loopguard]")


def test_mixed_structured_and_text_calls_are_one_sequence() -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for k in range(3):
        if k % 2:
            tc = {
                "id": f"c{k}",
                "type": "function",
                "function": {"name": "read", "arguments": '{"path": "a.py"}'},
            }
            messages += [
                {"role": "assistant", "content": None, "tool_calls": [tc]},
                {"role": "tool", "tool_call_id": f"c{k}", "content": "same"},
            ]
        else:
            messages += [{"role": "assistant", "content": xml("read", {"path": "a.py"})}, in_results("same")]
    body, actions = decide(messages, BREAKER)
    assert [(a.position, a.part) for a in actions if isinstance(a, Withhold)] == [(6, 0)]
    assert orjson.loads(body)["messages"][6]["content"].startswith("<tool_response>\n[loopguard]")


# --- the response side: JSON ----------------------------------------------------------------------

REPAIR = Repairer(TOOLS, b"request body")
CFG = Config()
#: ``read`` configured as state-changing: identical read-only calls are left to the call limit, so
#: the identical-call runaway of repaired calls is pinned on calls that count
WRITES = build(Config, {"progress": {"state_changing_tools": ["read"]}})


def completion(content: Any, **message: Any) -> bytes:
    return orjson.dumps(
        {
            **{k: v for k, v in BASE.items() if k != "object"},
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content, **message},
                    "finish_reason": "stop",
                }
            ],
        }
    )


def repaired(content: Any, calls: list[tuple[str, str]], choice: int = 0) -> bytes:
    tool_calls = [
        {"id": REPAIR.call_id(choice, k), "type": "function", "function": {"name": n, "arguments": a}}
        for k, (n, a) in enumerate(calls)
    ]
    return orjson.dumps(
        {
            **{k: v for k, v in BASE.items() if k != "object"},
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content, "tool_calls": tool_calls},
                    "finish_reason": "tool_calls",
                }
            ],
        }
    )


JSON_CASES = [
    ("xml", XML, None, [("read", '{"path":"a.py"}')], "xml"),
    (
        "hermes after text",
        "I'll read it.\n\n" + HERMES,
        "I'll read it.",
        [("read", '{"path":"a.py"}')],
        "hermes",
    ),
    (
        "parallel, mixed forms",
        HERMES + "\n" + BARE.replace("a.py", "b.py") + "\n</tool_call>",
        None,
        [("read", '{"path":"a.py"}'), ("read", '{"path":"b.py"}')],
        "mixed",
    ),
    (
        "think first",
        "<think>\nhm\n</think>\n\n" + XML,
        "<think>\nhm\n</think>",
        [("read", '{"path":"a.py"}')],
        "xml",
    ),
    ("unicode", xml("grep", {"pattern": "日本 😀"}), None, [("grep", '{"pattern":"日本 😀"}')], "xml"),
]


@pytest.mark.parametrize(
    ("case", "content", "text", "calls", "form"), JSON_CASES, ids=[c[0] for c in JSON_CASES]
)
def test_json_answer_is_repaired(
    case: str, content: str, text: str | None, calls: list[tuple[str, str]], form: str
) -> None:
    new, actions = decide_json(completion(content), None, CFG, REPAIR)
    assert new == repaired(text, calls)
    assert actions == [Repair("repair_text_tool_calls", calls[0][0], len(calls), form)]


@pytest.mark.parametrize(
    "content",
    [
        "<think>\n" + XML + "\n</think>\nNo call.",
        "```\n" + XML + "\n```",
        XML.replace("=read", "=write"),
        HERMES.replace('"a.py"}', '"a.py"'),
        XML[:-1],
        "Just text.",
    ],
    ids=["inside think", "code fence", "unknown tool", "invalid JSON", "incomplete", "text"],
)
def test_json_answer_that_is_not_repaired_is_forwarded_as_it_came(content: str) -> None:
    assert decide_json(completion(content), None, CFG, REPAIR) == (None, [])


def test_json_repair_off_forwards_the_text() -> None:
    assert decide_json(completion(XML), None, CFG, None) == (None, [])


def test_json_structured_calls_are_never_repaired() -> None:
    tc = [{"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}]
    assert decide_json(completion(XML, tool_calls=tc), None, CFG, REPAIR) == (None, [])


class Judge:
    def __init__(self, verdict: Stop | None) -> None:
        self.verdict = verdict
        self.asked: list[tuple[list[tuple[str | None, str, str]], str]] = []

    def __call__(self, calls: Any, text: str = "") -> Stop | None:
        self.asked.append(([(c.id, c.name, c.arguments_json()) for c in calls], text))
        return self.verdict


STOP = Stop(text="[loopguard] Stopped.", rule="stop", tool="read", count=9, limit=2, reason="denials")


def test_json_repaired_calls_go_to_the_stop_judge() -> None:
    judge = Judge(STOP)
    new, actions = decide_json(completion("Reading.\n" + XML), judge, CFG, REPAIR)  # type: ignore[arg-type]
    assert judge.asked == [([(REPAIR.call_id(0, 0), "read", '{"path":"a.py"}')], "Reading.")]
    assert [a.kind for a in actions] == ["repair", "stop"]
    msg = orjson.loads(new)["choices"][0]
    assert msg == {
        "index": 0,
        "message": {"role": "assistant", "content": "Reading.\n\n[loopguard] Stopped."},
        "finish_reason": "stop",
    }


def test_json_repaired_calls_go_through_the_runaway_rule() -> None:
    new, actions = decide_json(completion(HERMES * 4), None, WRITES, REPAIR)
    assert [a.kind for a in actions] == ["repair", "cut"]
    assert isinstance(actions[1], Cut) and actions[1].count == 2
    assert [tc["id"] for tc in orjson.loads(new)["choices"][0]["message"]["tool_calls"]] == [
        REPAIR.call_id(0, 0),
        REPAIR.call_id(0, 1),
    ]


def test_ids_are_unique_and_depend_on_the_request() -> None:
    other = Repairer(TOOLS, b"another body")
    ids = {REPAIR.call_id(c, k) for c in range(3) for k in range(5)} | {other.call_id(0, 0)}
    assert len(ids) == 16
    assert all(i.startswith("call_lg") and len(i) == 31 for i in ids)
    assert REPAIR.call_id(0, 0) == Repairer(TOOLS, b"request body").call_id(0, 0)


# --- the response side: SSE -----------------------------------------------------------------------


def run(
    raw: bytes, step: int, repair: Repairer | None = REPAIR, judge: Any = None, cfg: Config = CFG
) -> tuple[bytes, StreamGuard]:
    """``raw`` fed ``step`` bytes at a time."""
    guard = StreamGuard(cfg, judge, repair)
    out = b""
    for i in range(0, len(raw), step):
        out += guard.feed(raw[i : i + step]).data
    return out + guard.finish(), guard


def splits(raw: bytes, repair: Repairer | None = REPAIR) -> list[tuple[int, bytes, StreamGuard]]:
    """``raw`` fed in two reads split at every byte boundary, and one byte at a time (``-1``)."""
    out = []
    for i in range(len(raw) + 1):
        guard = StreamGuard(CFG, None, repair)
        data = guard.feed(raw[:i]).data + guard.feed(raw[i:]).data + guard.finish()
        out.append((i, data, guard))
    return [*out, (-1, *run(raw, 1, repair))]


def content_stream(*pieces: str, finish: str = "stop") -> bytes:
    return stream(
        chunk({"role": "assistant", "content": ""}),
        *(chunk({"content": p}) for p in pieces),
        chunk({}, finish),
    )


def repaired_stream(sent: list[str], rest: str, calls: list[tuple[str, str]]) -> bytes:
    """What the agent gets: the content that streamed before the hold, the rest of the text,
    one tool_calls delta per call, the finish (the guard writes compact JSON)."""
    out = stream(
        chunk({"role": "assistant", "content": ""}), *(chunk({"content": p}) for p in sent), done=False
    )

    def compact(obj: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    if rest:
        out += compact(chunk({"content": rest}))
    for k, (n, a) in enumerate(calls):
        tc = {
            "index": k,
            "id": REPAIR.call_id(0, k),
            "type": "function",
            "function": {"name": n, "arguments": a},
        }
        out += compact(chunk({"tool_calls": [tc]}))
    return out + compact(chunk({}, "tool_calls")) + b"data: [DONE]\n\n"


SSE_REPAIRED = [
    (
        "tag split across deltas",
        [
            "I will ",
            "read.\n<tool_",
            "call>\n<function=read>\n<parameter=path>\na.py\n</parameter>\n</function>\n</tool_call>",
        ],
        ["I will "],
        "read.",
        [("read", '{"path":"a.py"}')],
    ),
    ("hermes in one delta", [HERMES], [], "", [("read", '{"path":"a.py"}')]),
    (
        "bare function, its opening tag one character a delta",
        [*"<function=read>", BARE[len("<function=read>") :]],
        [],
        "",
        [("read", '{"path":"a.py"}')],
    ),
    (
        "parallel after text, a '<' that was no tag before",
        ["a < b, so", " I read.\n", HERMES, "\n", HERMES.replace("a.py", "b.py")],
        ["a < b, so", " I read.\n"],
        "",
        [("read", '{"path":"a.py"}'), ("read", '{"path":"b.py"}')],
    ),
]


@pytest.mark.parametrize(
    ("case", "pieces", "sent", "rest", "calls"), SSE_REPAIRED, ids=[c[0] for c in SSE_REPAIRED]
)
def test_sse_answer_is_repaired_at_every_split(
    case: str, pieces: list[str], sent: list[str], rest: str, calls: list[tuple[str, str]]
) -> None:
    raw = content_stream(*pieces)
    want = repaired_stream(sent, rest, calls)
    for at, out, guard in splits(raw):
        assert out == want, at
        assert [a.kind for a in guard.actions] == ["repair"]
        assert guard.received == guard.settled == len(raw)


SSE_UNCHANGED = [
    ("inside think", ["<think>\n", XML, "\n</think>\n", "No call."]),
    ("code fence", ["```\n", XML, "\n```"]),
    ("unknown tool", [XML.replace("=read", "=write")]),
    ("invalid JSON", [HERMES.replace('"a.py"}', '"a.py"')]),
    ("incomplete", [XML[:-5]]),
    ("text after", [HERMES, " done"]),
    ("a start of a tag that is none", ["x <tool", "box> y", " <func", "tion", "al>"]),
]


@pytest.mark.parametrize(("case", "pieces"), SSE_UNCHANGED, ids=[c[0] for c in SSE_UNCHANGED])
def test_sse_answer_that_is_not_repaired_is_released_byte_for_byte(case: str, pieces: list[str]) -> None:
    raw = content_stream(*pieces)
    for at, out, guard in splits(raw):
        assert out == raw, at
        assert guard.actions == []


def test_sse_content_streams_until_a_possible_tag_and_is_released_when_it_is_none() -> None:
    events = [
        chunk({"content": "see "}),
        chunk({"content": "<tool_"}),
        chunk({"content": "box>"}),
        chunk({"content": "!"}),
    ]
    raw = [stream(e, done=False) for e in events]
    guard = StreamGuard(CFG, None, REPAIR)
    assert [guard.feed(r).data for r in raw] == [raw[0], b"", raw[1] + raw[2], raw[3]]


def test_sse_repair_off_is_byte_identical() -> None:
    raw = content_stream("I will read.\n", XML)
    for step in (1, 7, len(raw)):
        assert run(raw, step, repair=None)[0] == raw


def test_sse_reasoning_content_is_never_repaired() -> None:
    raw = stream(
        chunk({"role": "assistant", "reasoning_content": XML}), chunk({"content": "Done."}), chunk({}, "stop")
    )
    out, guard = run(raw, 1)
    assert out == raw and guard.actions == []


def test_sse_repaired_calls_go_to_the_stop_judge() -> None:
    judge = Judge(STOP)
    raw = content_stream("Reading.\n", XML)
    out, guard = run(raw, 5, judge=judge)
    assert judge.asked == [([(REPAIR.call_id(0, 0), "read", '{"path":"a.py"}')], "Reading.")]
    assert [a.kind for a in guard.actions] == ["repair", "stop"]
    first = stream(chunk({"role": "assistant", "content": ""}), chunk({"content": "Reading.\n"}), done=False)
    tail = b"data: " + orjson.dumps(chunk({"content": "\n\n[loopguard] Stopped."})) + b"\n\n"
    tail += b"data: " + orjson.dumps(chunk({}, "stop")) + b"\n\n" + b"data: [DONE]\n\n"
    assert out == first + tail


def test_sse_repaired_calls_go_through_the_runaway_rule() -> None:
    out, guard = run(content_stream(HERMES * 3), 9, cfg=WRITES)
    assert [a.kind for a in guard.actions] == ["repair", "cut"]
    assert out.count(b'"tool_calls":[{') == 2
    assert out.endswith(b'"finish_reason":"tool_calls"}]}\n\n' + b"data: [DONE]\n\n")


def test_sse_structured_calls_are_never_repaired() -> None:
    tc = {"index": 0, "id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}
    raw = stream(
        chunk({"role": "assistant", "content": ""}),
        chunk({"tool_calls": [tc]}),
        chunk({"content": HERMES}),
        chunk({}, "tool_calls"),
    )
    out, guard = run(raw, 3)
    assert out == raw and guard.actions == []


# --- the Responses API's request side -------------------------------------------------------------


def test_responses_reads_text_calls_in_assistant_message_items_and_withholds_one_block() -> None:
    cfg = build(Config, BREAKER)
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "go"}]
    for _ in range(3):
        items.append(
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": hermes("read", {"path": "a.py"})}],
            }
        )
        items.append(
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": in_results("same")["content"]}],
            }
        )
    tools = [{"type": "function", "name": n, "parameters": s} for n, s in TOOLS.items()]
    raw = orjson.dumps({"model": "m", "tools": tools, "input": items})
    d = decide_request(raw, {}, build_guards(cfg.guards), (), dialect=openai_responses)
    assert d.transcript is not None
    assert [(c.name, c.position, c.result.position if c.result else None) for c in d.transcript.calls] == [
        ("read", 1, 2),
        ("read", 3, 4),
        ("read", 5, 6),
    ]
    assert d.transcript.user_positions == (0,)
    assert [(a.position, a.part) for a in d.actions if isinstance(a, Withhold) and a.fresh] == [(6, 0)]
    sent = orjson.loads(d.body)["input"]
    assert sent[:6] == items[:6]
    assert sent[6]["content"].startswith("<tool_response>\n[loopguard]")
    assert sent[6]["content"].endswith("\n</tool_response>")


def test_sse_a_runaway_written_as_text_is_cut_as_it_streams() -> None:
    """Five identical blocks, one a delta: the 3rd identical call is a runaway the moment its block
    closes (max_identical_per_response 2); the upstream is closed there, the agent gets 2 calls."""
    events = [
        chunk({"role": "assistant", "content": ""}),
        *(chunk({"content": HERMES + "\n"}) for _ in range(5)),
    ]
    raw = [stream(e, done=False) for e in [*events, chunk({}, "stop")]]
    guard = StreamGuard(WRITES, None, REPAIR)
    outs = []
    for r in raw:
        o = guard.feed(r)
        outs.append((o.data, o.abort))
        if o.abort:
            break
    assert [abort for _, abort in outs] == [False, False, False, True]
    assert [a.kind for a in guard.actions] == ["repair", "cut"]
    assert isinstance(guard.actions[1], Cut) and (guard.actions[1].count, guard.actions[1].reason) == (
        2,
        "identical",
    )

    def compact(obj: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    calls = [
        compact(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": k,
                            "id": REPAIR.call_id(0, k),
                            "type": "function",
                            "function": {"name": "read", "arguments": '{"path":"a.py"}'},
                        }
                    ]
                }
            )
        )
        for k in range(2)
    ]
    assert (
        b"".join(d for d, _ in outs)
        == raw[0] + b"".join(calls) + compact(chunk({}, "tool_calls")) + b"data: [DONE]\n\n"
    )


# --- properties over random markup ----------------------------------------------------------------

FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "<function=read>",
    "<function=write>",
    "</function>",
    "<parameter=path>",
    "</parameter>",
    "<think>",
    "</think>",
    "```",
    "\n",
    " ",
    "a.py",
    '{"name": "read", "arguments": {"path": "a.py"}}',
    '{"name": "grep", "arguments": {}}',
    "<",
    "<tool_",
    "<func",
    "text",
    "é😀",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=24))
def test_find_calls_never_raises_and_its_spans_are_in_order(pieces: list[str]) -> None:
    text = "".join(pieces)
    found = find_calls(text, TOOLS)
    if found is None:
        return
    assert text.startswith(found.text)
    ends = [len(found.text)]
    for c in found.calls:
        assert c.start >= ends[-1] and c.end > c.start
        assert set(text[ends[-1] : c.start].split()) <= {"</tool_call>"}  # whitespace, stray tags
        assert c.name in TOOLS
        ends.append(c.end)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=16), st.lists(st.integers(0, 4000), max_size=4))
def test_sse_releases_unchanged_whatever_does_not_parse(pieces: list[str], cuts: list[int]) -> None:
    """Random markup streamed one fragment a delta, read in random splits: when the whole content
    holds no calls the agent gets exactly the upstream bytes; when it does, one repair."""
    raw = content_stream(*pieces) if pieces else content_stream("x")
    bounds = sorted({min(c, len(raw)) for c in cuts})
    guard = StreamGuard(CFG, None, REPAIR)
    out = b""
    last = 0
    for b in [*bounds, len(raw)]:
        out += guard.feed(raw[last:b]).data
        last = b
    out += guard.finish()
    found = find_calls("".join(pieces), TOOLS)
    if found is None:
        assert out == raw
        assert guard.actions == []
    else:
        assert [a.kind for a in guard.actions][:1] == ["repair"]
        assert b'"finish_reason":"tool_calls"' in out or b'"finish_reason":"stop"' in out


def test_prose_about_the_formats_under_the_shipped_defaults_takes_no_action() -> None:
    """A user pasting the formats' docs again and again, an assistant answering with examples in
    code fences and in prose (text after the block): no call is read, no action taken."""
    cfg = load_config(Path(__file__).resolve().parents[3] / "config" / "loopguard.yaml")
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You help with tool formats."}]
    for k in range(8):
        messages.append(
            {
                "role": "user",
                "content": f"Question {k}: models write {HERMES} and results come as "
                "<tool_response>\nok\n</tool_response>. Why?",
            }
        )
        messages.append(
            {
                "role": "assistant",
                "content": f"Answer {k}:\n```\n{XML}\n```\nor inline: {HERMES} is one call.",
            }
        )
        messages.append(in_results("quoted result"))
    raw = orjson.dumps({"model": "m", "tools": CHAT_TOOLS, "messages": messages})
    d = decide_request(raw, {}, build_guards(cfg.guards), ())
    assert d.transcript is not None and d.transcript.calls == ()
    assert d.actions == ()
    assert d.body is raw


def test_sse_with_runaway_limits_off_text_calls_are_not_read_as_they_stream() -> None:
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
    raw = content_stream(*[HERMES] * 4)
    guard = StreamGuard(cfg, None, REPAIR)
    out = guard.feed(raw).data + guard.finish()
    assert [a.kind for a in guard.actions] == ["repair"]
    assert all(ch.so_far is None for ch in guard._choices.values())
    assert out.count(b'"tool_calls":[{') == 4


def test_sse_a_block_that_does_not_parse_stops_the_reading_as_it_streams_not_the_release() -> None:
    bad = HERMES.replace('"read"', '"write"')
    raw = content_stream(bad, HERMES, HERMES)
    guard = StreamGuard(CFG, None, REPAIR)
    out = guard.feed(raw).data + guard.finish()
    assert [ch.watch_runaway for ch in guard._choices.values()] == [False]
    assert out == raw and guard.actions == []


# --- what the request asked for: tool_choice, and answers cut short --------------------------------


@pytest.mark.parametrize(
    ("tool_choice", "want"),
    [
        (None, ["grep", "read"]),
        ("auto", ["grep", "read"]),
        ("required", ["grep", "read"]),
        ("none", None),
        ({"type": "function", "function": {"name": "grep"}}, ["grep"]),
        ({"type": "function", "name": "grep"}, ["grep"]),  # the Responses API's flat form
        ({"type": "function", "function": {"name": "write"}}, None),  # not offered
    ],
    ids=["absent", "auto", "required", "none", "forced", "forced flat", "forced unknown"],
)
def test_tool_choice_limits_what_is_repaired(tool_choice: Any, want: list[str] | None) -> None:
    got = allowed_tools(TOOLS, tool_choice)
    assert (sorted(got) if got is not None else None) == want


@pytest.mark.parametrize(
    ("tool_choice", "repaired_to"),
    [("auto", "read"), ("none", None), ({"type": "function", "function": {"name": "grep"}}, None)],
    ids=["auto", "none: the agent asked for text", "forced another tool"],
)
def test_a_request_that_refused_the_tool_gets_the_text(tool_choice: Any, repaired_to: str | None) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "go"}], "tools": CHAT_TOOLS}
    raw = orjson.dumps({**body, "tool_choice": tool_choice})
    fix = for_request(CFG, openai_chat.parse_request(orjson.loads(raw)), raw)
    new, actions = decide_json(completion(XML), None, CFG, fix)
    assert [a.tool for a in actions] == ([repaired_to] if repaired_to else [])
    assert (new is None) is (repaired_to is None)


@pytest.mark.parametrize("finish", ["length", "content_filter"])
def test_an_answer_cut_short_is_never_repaired(finish: str) -> None:
    raw = completion(XML).replace(b'"finish_reason":"stop"', f'"finish_reason":"{finish}"'.encode())
    assert decide_json(raw, None, CFG, REPAIR) == (None, [])
    sse = content_stream("I'll read it.\n\n", XML, finish=finish)
    for at, out, guard in splits(sse):
        assert out == sse, at
        assert guard.actions == [], at
