"""Harnesses whose history is text, and their format-error replies, without sockets: what is a
harness reply (:mod:`proxy.core.harness_replies`), the stop holding through one and its note
(:mod:`proxy.guards.stop_note`), smolagents' and fenced text actions read as calls
(:mod:`proxy.dialects.text_actions`), and chats with code samples left alone. The real agents:
``tests/agents/test_mini_swe_agent.py``, ``tests/agents/test_smolagents.py``."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from proxy.config import Config
from proxy.core.actions import Stop
from proxy.core.harness_replies import is_harness_reply
from proxy.dialects import openai_chat, text_actions
from proxy.edge.runtime import build_runtime
from proxy.guards import Context
from proxy.request.rewrite import decide_request
from proxy.response.decide import decide_json, deciders
from tests.helpers.fakes import completion, tool_call

MINI_TOOL_ERROR = (
    "Tool call error:\n\n<error>\nNo tool calls found in the response. Every response MUST include at "
    "least one tool call.\n</error>\n\nHere is general guidance on how to submit correct toolcalls:\n"
)
MINI_FORMAT_ERROR = (
    "Format error:\n\n<error>\nExpected exactly 1 action, found 0.\n</error>\n\nHere is general "
    "guidance on how to format your response:\n\nPlease always provide EXACTLY ONE action in triple "
    "backticks, found 0 actions."
)
SMOL_ERROR = (
    "Error:\nError while parsing tool call from model output: The model output does not contain any "
    "JSON blob.\nNow let's retry: take care not to repeat previous errors! If you have retried "
    "several times, try a completely different approach.\n"
)


@pytest.mark.parametrize(
    ("text", "harness"),
    [
        (MINI_TOOL_ERROR, True),
        (MINI_FORMAT_ERROR, True),
        (SMOL_ERROR, True),
        ("Error:\nError in code parsing:\nno code blob found", True),
        (
            "Your output was not formatted correctly. You must always include a discussion.",
            True,
        ),
        ("Your last output did not use any tool calls!\nPlease make sure your output includes one.", True),
        ("Your action could not be parsed properly: unexpected EOF.", True),
        ("[ERROR] You did not use a tool in your previous response!", True),
        ("No tool calls found in the response. Call a tool.", True),
        # a person's words, even about errors and formats
        ("continue", False),
        ("Format error in my table, please fix it", False),
        ("The tool call error is back, can you look?", False),
        ("Error: the tests still fail", False),
        ("Your output was great, now add tests", False),
        ("Observation: the build passes now", False),
        ("Please solve this issue: Tool call error:\nwhen the parser sees…", False),
    ],
)
def test_harness_reply_is_told_apart_from_a_persons_message(text: str, harness: bool) -> None:
    assert is_harness_reply(text) is harness


# --- the stop holds through a harness reply, a person's message starts afresh -------------------

CMD = json.dumps({"command": "cat app.txt"})


def looping_messages(n: int) -> list[dict[str, Any]]:
    """mini-swe-agent's history (tool calls): a task, then ``n`` identical ``bash`` calls."""
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Please solve this issue: print app.txt"},
    ]
    for i in range(n):
        msgs.append(
            {"role": "assistant", "content": f"Attempt {i}", "tool_calls": [tool_call("bash", CMD, f"c{i}")]}
        )
        msgs.append(
            {
                "role": "tool",
                "tool_call_id": f"c{i}",
                "content": "<returncode>1</returncode>\n<output>\nno\n</output>",
            }
        )
    return msgs


def decide(messages: list[dict[str, Any]], answer: dict[str, Any]) -> tuple[bytes, list[Any], list[Any]]:
    """One exchange through the request side and the JSON response side with the default
    config: (the body sent upstream, the request's actions, the answer's actions)."""
    cfg = Config()
    rt = build_runtime(cfg)
    raw = orjson.dumps(
        {"model": "m", "messages": messages, "tools": [{"type": "function", "function": {"name": "bash"}}]}
    )
    d = decide_request(raw, {}, rt.guards, cfg.conversation_key.headers)
    judges = deciders(d.transcript, d.actions, rt.guards, Context(), cfg, d.checkpoint)
    _, answered = decide_json(orjson.dumps(answer), judges.judge, judges.cfg)
    return d.body, list(d.actions), answered


AGAIN = completion([tool_call("bash", CMD, "again")])


@pytest.mark.parametrize(
    ("reply", "stopped"),
    [
        (MINI_TOOL_ERROR, True),  # the harness asks again: the stop holds
        ("continue", False),  # a person: a fresh turn, the call may run
        ("Tool call error? Please look at the log again.", False),  # a person quoting it
    ],
)
def test_stop_holds_through_a_harness_reply_but_not_a_persons_message(reply: str, stopped: bool) -> None:
    msgs = looping_messages(6)
    _, _, first = decide(msgs, AGAIN)
    assert [a.reason for a in first if isinstance(a, Stop)] == ["escalation"]
    _, _, answered = decide([*msgs, {"role": "user", "content": reply}], AGAIN)
    assert any(isinstance(a, Stop) for a in answered) is stopped


def test_stop_note_is_appended_to_the_harness_reply_only() -> None:
    msgs = [*looping_messages(6), {"role": "user", "content": MINI_TOOL_ERROR}]
    body, actions, _ = decide(msgs, AGAIN)
    notes = [a for a in actions if a.rule == "stop_note"]
    assert [(a.after, a.tool, a.count, a.delivery, a.fresh) for a in notes] == [
        (14, "bash", 3, "tool_suffix", True)
    ]
    sent = orjson.loads(body)["messages"]
    # no message of its own: the note is in the reply (the reminders before it are other rules')
    assert [i for i, m in enumerate(sent) if "[loopguard] Stopped" in str(m["content"])] == [len(sent) - 1]
    assert sent[-1]["content"] == (
        MINI_TOOL_ERROR + "\n\n[loopguard] Stopped: the model kept calling bash without getting anywhere (3 "
        "withheld results), so loopguard ended its turn; a reply that makes such a call again is replaced "
        "by this stop and the call is not run. Do not call bash for this again: use the results you "
        "already have, try a different approach, or finish and say what is blocking you."
    )
    # a person's message gets none, and one after it starts a new turn: no note on the next reply
    person = [*looping_messages(6), {"role": "user", "content": "continue"}]
    assert [a for a in decide(person, AGAIN)[1] if a.rule == "stop_note"] == []
    later = [*person, *looping_messages(1)[2:], {"role": "user", "content": MINI_TOOL_ERROR}]
    assert [a for a in decide(later, AGAIN)[1] if a.rule == "stop_note"] == []
    # nor does a reply after a call that ran since the withheld results (no stop came before it)
    other = {
        "role": "assistant",
        "content": None,
        "tool_calls": [tool_call("bash", '{"command": "ls"}', "ls")],
    }
    moved = [*looping_messages(6), other, {"role": "tool", "tool_call_id": "ls", "content": "a.txt"}]
    assert [
        a
        for a in decide([*moved, {"role": "user", "content": MINI_TOOL_ERROR}], AGAIN)[1]
        if a.rule == "stop_note"
    ] == []
    # two replies in a row right after the withheld result: both get it
    two = [
        *looping_messages(6),
        {"role": "user", "content": MINI_TOOL_ERROR},
        {"role": "user", "content": MINI_TOOL_ERROR},
    ]
    assert [a.after for a in decide(two, AGAIN)[1] if a.rule == "stop_note"] == [14, 15]


# --- smolagents' text history -----------------------------------------------------------------

SMOL_CALL = (
    "\nCalling tools:\n[{'id': 'call_0', 'type': 'function', 'function': {'name': 'python_interpreter', "
    "'arguments': {'code': \"print('hi')\"}}}]"
)


def smol_messages(
    n: int, observation: str = "Observation:\nStdout:\nhi\n\nOutput: None"
) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": [{"type": "text", "text": "You are an expert assistant."}]},
        {"role": "user", "content": [{"type": "text", "text": "New task:\nSay hi."}]},
    ]
    for _ in range(n):
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": SMOL_CALL}]})
        msgs.append({"role": "user", "content": [{"type": "text", "text": observation}]})
    return msgs


def test_smolagents_calling_tools_and_observations_are_calls_and_results() -> None:
    t = openai_chat.parse_request({"messages": smol_messages(3)})
    assert [(c.call_id, c.name, c.arguments, c.position) for c in t.calls] == [
        ("call_0", "python_interpreter", {"code": "print('hi')"}, p) for p in (2, 4, 6)
    ]
    assert [c.result.text[:12] for c in t.calls if c.result] == ["Observation:"] * 3
    assert t.user_positions == (1,)  # observations are no user turns
    assert t.newest_step == 2


@pytest.mark.parametrize(
    "text",
    [
        "Calling tools:\n[{'id': 'x', 'function': {'arguments': {}}}]",  # no name
        "Calling tools:\n[__import__('os').system('id')]",  # not a literal: never evaluated
        "Calling tools:\nnot a list",
        "I was calling tools: [1, 2]",
    ],
)
def test_text_that_is_no_smolagents_step_has_no_calls(text: str) -> None:
    assert text_actions.calling_tools(text) is None


# --- fenced actions ---------------------------------------------------------------------------


def fenced_messages(
    n: int, result: str = "<returncode>0</returncode>\n<output>\nhello\n</output>"
) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Please solve this issue: print app.txt"}]
    for i in range(n):
        msgs.append({"role": "assistant", "content": f"Try {i}.\n\n```mswea_bash_command\ncat app.txt\n```"})
        msgs.append({"role": "user", "content": result})
    return msgs


@pytest.mark.parametrize(
    "result",
    [
        "<returncode>0</returncode>\n<output>\nhello\n</output>",
        "<exception>timeout</exception>\n<returncode>-1</returncode>\n<warning>\nThe output was too long.",
        "OBSERVATION:\nhello",
        "hello\n(Open file: /repo/app.py)\n(Current directory: /repo)\nbash-$",
    ],
)
def test_fenced_actions_answered_by_results_are_calls(result: str) -> None:
    t = openai_chat.parse_request({"messages": fenced_messages(3, result)})
    assert [(c.name, c.arguments, c.position, c.result.position if c.result else None) for c in t.calls] == [
        ("mswea_bash_command", {"command": "cat app.txt"}, p, p + 1) for p in (1, 3, 5)
    ]
    assert t.user_positions == (0,)
    assert [s.text for s in t.said if s.role == "assistant"] == ["Try 0.", "Try 1.", "Try 2."]


@pytest.mark.parametrize(
    ("text", "shape"),
    [
        ("<returncode>0</returncode>\n<output>\nhello\n</output>", "returncode"),
        (
            "<returncode>2</returncode>\r\n<warning>\nThe output of your last command was too long.",
            "returncode",
        ),
        ("OBSERVATION:\nhello", "observation"),
        ("OBSERVATION:", "observation"),
        ("x\n(Open file: n/a)\n(Current directory: /repo)\nbash-$", "prompt"),
        # a person's words: ReAct-style notes, a return code quoted in prose
        ("Observation: it printed nothing.", None),
        ("Observation:\nit printed nothing.", None),
        ("OBSERVATION: it printed nothing.", None),
        ("<returncode>0</returncode> is what I got, what next?", None),
        ("<returncode>0</returncode>\nREADME.md", None),
    ],
)
def test_only_a_harness_template_is_a_result_shape(text: str, shape: str | None) -> None:
    assert text_actions.action_result(text) == shape


def test_a_persons_react_notes_after_the_same_code_sample_are_never_calls() -> None:
    """A person who answers each fenced sample with an ``Observation:`` note: no call is read, so
    no reminder and no withheld message, and the bytes pass untouched."""
    msgs = fenced_messages(8, "Observation: it printed nothing, same as before.")
    t = openai_chat.parse_request({"messages": msgs})
    assert (t.calls, t.user_positions) == ((), tuple(range(0, 17, 2)))
    cfg = Config()
    rt = build_runtime(cfg)
    raw = orjson.dumps({"model": "m", "messages": msgs})
    d = decide_request(raw, {}, rt.guards, cfg.conversation_key.headers)
    assert d.body is raw and d.actions == ()


CHAT_WITH_CODE = [
    {"role": "user", "content": "How do I list files in a directory?"},
    {"role": "assistant", "content": "Use `ls`:\n\n```bash\nls -la\n```"},
    {"role": "user", "content": "And only the hidden ones?"},
    {"role": "assistant", "content": "```bash\nls -la\n```"},
    {"role": "user", "content": "<returncode>0</returncode> is what I got, what next?"},
    {"role": "assistant", "content": "```bash\nls -la\n```"},
    {"role": "user", "content": "Observation: it printed nothing."},
    {"role": "assistant", "content": "Then try:\n\n```bash\nls -la\n```"},
    {"role": "user", "content": "again please"},
]


def test_chat_with_code_samples_has_no_calls_and_its_bytes_pass_untouched() -> None:
    t = openai_chat.parse_request({"messages": CHAT_WITH_CODE})
    assert (t.calls, t.user_positions, t.action_shapes) == ((), (0, 2, 4, 6, 8), frozenset())
    cfg = Config()
    rt = build_runtime(cfg)
    raw = orjson.dumps({"model": "m", "messages": CHAT_WITH_CODE})
    d = decide_request(raw, {}, rt.guards, cfg.conversation_key.headers)
    assert d.body is raw and d.actions == ()
    judges = deciders(d.transcript, d.actions, rt.guards, Context(), cfg, d.checkpoint)
    answer = orjson.dumps(completion(content="Run:\n\n```bash\nls -la\n```"))
    assert decide_json(answer, judges.judge, judges.cfg) == (None, [])


def test_fenced_answer_of_a_looping_harness_is_replaced_by_the_stop() -> None:
    """mini text mode: the 7th identical action is stopped; its fenced block is gone from the
    answer (the harness finds no action to run)."""
    cfg = Config()
    rt = build_runtime(cfg)
    raw = orjson.dumps({"model": "m", "messages": fenced_messages(6)})
    d = decide_request(raw, {}, rt.guards, cfg.conversation_key.headers)
    assert d.transcript is not None and d.transcript.action_shapes == frozenset({"returncode"})
    judges = deciders(d.transcript, d.actions, rt.guards, Context(), cfg, d.checkpoint)
    answer = orjson.dumps(completion(content="Try 6.\n\n```mswea_bash_command\ncat app.txt\n```"))
    body, actions = decide_json(answer, judges.judge, judges.cfg)
    assert [(a.rule, a.reason) for a in actions] == [("stop", "escalation")]
    assert body is not None
    content = orjson.loads(body)["choices"][0]["message"]["content"]
    assert (
        content.startswith("[loopguard] Stopped: the model kept calling mswea_bash_command")
        and "```" not in content
    )
