"""recovery.reminders (proxy.guards.wording): the exact text of every rule that speaks of a
looping call, in each style, from the config through build_guards. quote keeps the rules' own
texts; plain names neither the looping call's tool nor its arguments or target; redirect closes
with what to do instead, from the transcript (the result in hand, the offered tools not used this
turn, an answer to the user)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.config import Config, build
from proxy.core.actions import Action, Remind, Withhold
from proxy.core.transcript import Transcript
from proxy.dialects.openai_chat import parse_request
from proxy.guards import Context, build_guards, evaluate
from proxy.guards.stop_note import stop_note_for
from proxy.guards.wording import UNTRIED_NAMES, instead, untried
from tests.helpers.reminder_facts import check_reminder

RULES = (
    "repeat_reminder",
    "circuit_breaker",
    "turn_guard",
    "recurrence",
    "cycles",
    "repeated_failure",
    "monologue",
    "echo_loop",
    "same_target",
    "waiting",
    "escalation",
)
TOOLS = ("read_file", "edit_file", "bash", "list_dir")

Call = tuple[str, dict[str, Any], str]


def body(*spec: Call | str, tools: tuple[str, ...] = TOOLS) -> dict[str, Any]:
    """A chat request: a user prompt, then one step per (tool, arguments, result), a str item a
    user message."""
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "fix the tests"}]
    for n, item in enumerate(spec):
        if isinstance(item, str):
            msgs.append({"role": "user", "content": item})
            continue
        name, args, result = item
        cid = f"call_{n}"
        fn = {"name": name, "arguments": json.dumps(args)}
        msgs.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": cid, "type": "function", "function": fn}],
            }
        )
        msgs.append({"role": "tool", "tool_call_id": cid, "content": result})
    offered = [{"type": "function", "function": {"name": t, "parameters": {"type": "object"}}} for t in tools]
    return {"model": "m", "messages": msgs, "tools": offered}


def only(style: str, *rules: str, **settings: dict[str, Any]) -> Config:
    """The config with only ``rules`` enabled (with ``settings`` per rule) and ``style``."""
    guards = {r: {"enabled": r in rules, **settings.get(r, {})} for r in RULES}
    return build(Config, {"guards": guards, "recovery": {"reminders": style}})


def texts(cfg: Config, request: dict[str, Any], rule: str) -> list[tuple[str, int, str]]:
    """(kind, call number 1-based, text) of every action of ``rule``."""
    transcript = parse_request(request)
    guards = build_guards(cfg.guards, style=cfg.recovery.reminders)
    actions = evaluate(transcript, guards, Context())
    return [_row(transcript, a) for a in actions if a.rule == rule]


def _row(t: Transcript, a: Action) -> tuple[str, int, str]:
    if isinstance(a, Withhold):
        seq = next(c.seq for c in t.calls if c.call_id == a.call_id)
        return "withhold", seq + 1, a.text
    assert isinstance(a, Remind)
    return "remind", (a.call or 0) + 1, a.text


READ = ("read_file", {"path": "a.py"}, "def f():\n    return 1\n")


SCENARIOS: dict[str, tuple[tuple[str, ...], dict[str, Any], tuple[Call | str, ...], str]] = {
    "repeat_reminder": (("repeat_reminder",), {}, (READ,) * 5, "repeat_reminder"),
    "same_target": (
        ("same_target",),
        {},
        tuple(("read_file", {"path": "a.py", "limit": n}, "def f():\n    return 1\n") for n in (10, 20, 30)),
        "same_target",
    ),
    "cycles": (("cycles",), {}, (READ, ("bash", {"command": "pytest -q"}, "1 failed")) * 4, "cycles"),
    "recurrence": (
        ("recurrence",),
        {},
        (READ, ("list_dir", {"path": "."}, "a.py"), READ, ("bash", {"command": "ls"}, "a.py"), READ),
        "recurrence",
    ),
    "failing": (
        ("repeated_failure",),
        {},
        tuple(("edit_file", {"path": "a.py", "old": f"x{n}"}, "Error: old text not found") for n in range(3)),
        "repeated_failure",
    ),
    "reissue": (
        ("repeated_failure",),
        {},
        (("bash", {"command": "make"}, "Error: build failed"),) * 2,
        "repeated_failure",
    ),
    "echo_loop": (
        ("echo_loop",),
        {},
        tuple(("bash", {"command": f"echo '{w}'"}, w) for w in ("hello world", "foo bar", "baz qux")),
        "echo_loop",
    ),
    "escalation": (("repeat_reminder", "escalation"), {}, (READ,) * 6, "escalation"),
    "circuit_breaker": (("circuit_breaker",), {}, (READ,) * 7, "circuit_breaker"),
    "turn_same_call": (("turn_guard",), {}, (READ,) * 4, "turn_guard"),
    "turn_same_target": (
        ("turn_guard",),
        {"turn_guard": {"max_same_call": 0}},
        tuple(("read_file", {"path": "a.py", "limit": n}, f"line {n}") for n in range(6)),
        "turn_guard",
    ),
}

#: redirect's closing lines, with the offered tools the turn has not used (in offered order)
IN_HAND = "What those calls returned is already above: use it instead of asking for it again. "
ANSWER = (
    " If you have what you need, answer the user now with what you know; if not, say what is blocking you."
)


def redirect(*names: str) -> str:
    return f"{IN_HAND}Tools you have not used since the user's last message: {', '.join(names)}.{ANSWER}"


GENTLE = (
    "[loopguard] You have made the same tool call several times in a row. Before calling it again, re-read "
    "its "
    "last result: if it did not give you what you need, change your approach or your arguments instead of "
    "repeating the call."
)
REPEAT = (
    "[loopguard] You have made the same tool call {n} times in a row, and it returned the same result each "
    "time.\n"
)
CYCLE = (
    "[loopguard] You are going in circles: the same 2 steps have now repeated 3 times in a row, and the last "
    "round gave the same results as the round before"
)
CYCLE_WITHHELD = (
    "[loopguard] The result of this call is withheld: it continues a cycle of 2 steps that you have now "
    "repeated 4 times, and the last round gave the same results as the round before.\n"
)
SAME_TARGET = (
    "[loopguard] You have made 3 calls in a row on the same tool and target, with arguments that changed, "
    "and "
    "they returned the same result each time. Changing the arguments this way does not change the result.\n"
)
RECURRENCE = (
    "[loopguard] You keep coming back to the same tool call: 3 times in your last 5 calls, and it returned "
    "the same result each time. Calling it again will not tell you anything new.\n"
)
FAILING = (
    "[loopguard] Your calls with one tool on one target have now failed 3 times in a row, the same way each "
    "time. Trying again the same way will fail the same way.\n"
)
REISSUE = (
    "[loopguard] You made the same call again, with the exact same arguments and nothing changed in between, "
    "and it failed again with the same result as the last time."
)
ECHO = (
    "[loopguard] Your last 3 calls ran the same {tool}command with only a quoted text changed, and each "
    "output "
    "just echoed that text back"
)
ESCALATION = (
    "[loopguard] The result of this call is withheld: you were reminded 2 times that {about} were not "
    "getting "
    "anywhere, and this call got the same result as an earlier one."
)
DUPLICATE = (
    "[loopguard] The result of this call is withheld: you have now {made} 7 times, and the limit is 6."
)
TRIP = (
    " The limit is {limits}. Stop calling tools now and answer the user in plain text: say what you tried, "
    "where you are stuck, and what the user must decide or provide before you go on."
)
MUTED = (
    "[loopguard] Result withheld: over the limit of 3 identical calls per turn again. Stop calling tools and "
    "answer the user."
)
SAME_CALL_TRIP = (
    "[loopguard] The result of this call is withheld: you have now made this same call 3 times in this turn."
)
SAME_TARGET_TRIP = (
    "[loopguard] The result of this call is withheld: this is call 6 on the same target in this turn."
)

EXPECTED: dict[tuple[str, str], list[tuple[str, int, str]]] = {
    ("repeat_reminder", "quote"): [
        ("remind", 3, GENTLE),
        (
            "remind",
            5,
            "[loopguard] You are repeating the same tool call without making progress.\n- tool: read_file\n"
            '- consecutive_calls: 5\n- arguments: {"path":"a.py"}\nDo not call this tool with these exact '
            "arguments again. Use the results you already have, try a different approach, or tell the user "
            "what "
            "is blocking you.",
        ),
    ],
    ("repeat_reminder", "plain"): [
        (
            "remind",
            n,
            REPEAT.format(n=n) + "Do not make that call again: change your approach, or tell the user "
            "what is blocking you.",
        )
        for n in (3, 5)
    ],
    ("repeat_reminder", "redirect"): [
        ("remind", n, REPEAT.format(n=n) + redirect("edit_file", "bash", "list_dir")) for n in (3, 5)
    ],
    ("same_target", "quote"): [
        (
            "remind",
            3,
            "[loopguard] You called read_file on a.py 3 times in a row, with different arguments each time, "
            "and it "
            "returned the same result each time.\n- tool: read_file\n"
            '- last arguments: {"limit":30,"path":"a.py"}\nChanging the arguments this way does not '
            "change the result. Use the result you already have, do something different, or tell the user "
            "what is blocking you.",
        )
    ],
    ("same_target", "plain"): [
        (
            "remind",
            3,
            SAME_TARGET + "Use the result you already have, do something different, or tell the user "
            "what is blocking you.",
        )
    ],
    ("same_target", "redirect"): [("remind", 3, SAME_TARGET + redirect("edit_file", "bash", "list_dir"))],
    ("cycles", "quote"): [
        (
            "remind",
            6,
            CYCLE
            + ":\n  1. read_file a.py\n  2. bash pytest -q\nAnother round will end the same way. Stop and "
            "rethink: what did these results tell you, and what different step would get you further? If "
            "you are "
            "stuck, tell the user.",
        ),
        (
            "withhold",
            8,
            "[loopguard] The result of this call is withheld: it continues a cycle of 2 steps (read_file → "
            "bash) "
            "that you have now repeated 4 times without a different outcome. Break the cycle: use the "
            "results you "
            "already have, try a different approach, or tell the user what is blocking you.",
        ),
    ],
    ("cycles", "plain"): [
        (
            "remind",
            6,
            CYCLE
            + ". Another round will end the same way.\nStop and rethink: what did these results tell you, "
            "and what different step would get you further? If you are stuck, tell the user.",
        ),
        (
            "withhold",
            8,
            CYCLE_WITHHELD
            + "Break the cycle: try a different approach, or tell the user what is blocking you.",
        ),
    ],
    ("cycles", "redirect"): [
        ("remind", 6, CYCLE + ". Another round will end the same way.\n" + redirect("edit_file", "list_dir")),
        ("withhold", 8, CYCLE_WITHHELD + redirect("edit_file", "list_dir")),
    ],
    ("recurrence", "quote"): [
        (
            "remind",
            5,
            "[loopguard] You keep coming back to the same tool call: read_file with the same arguments, 3 "
            "times in "
            "your last 5 calls, and it returned the same result each time.\n- tool: read_file\n"
            '- arguments: {"path":"a.py"}\nCalling it again will not tell you anything new. Use the result '
            "you already have, or do something different.",
        )
    ],
    ("recurrence", "plain"): [
        ("remind", 5, RECURRENCE + "Use the result you already have, or do something different.")
    ],
    ("recurrence", "redirect"): [("remind", 5, RECURRENCE + redirect("edit_file"))],
    ("failing", "quote"): [
        (
            "remind",
            3,
            "[loopguard] edit_file on a.py has now failed 3 times in a row. The last error:\n  Error: old "
            "text not "
            "found\nTrying again the same way will fail the same way. Read the error and fix its cause first "
            "(re-check your assumptions about a.py), change your approach, or tell the user what is "
            "blocking you.",
        )
    ],
    ("failing", "plain"): [
        (
            "remind",
            3,
            FAILING
            + "Read the error and fix its cause first (re-check your assumptions), change your approach, "
            "or tell the user what is blocking you.",
        )
    ],
    ("failing", "redirect"): [("remind", 3, FAILING + redirect("read_file", "bash", "list_dir"))],
    ("reissue", "quote"): [
        (
            "remind",
            2,
            REISSUE + '\n- tool: bash\n- arguments: {"command":"make"}\n- result: Error: build failed\n'
            "Repeating it unchanged will not give a different result. Change the arguments or the approach, "
            "or "
            "tell the user what is blocking you.",
        )
    ],
    ("reissue", "plain"): [
        (
            "remind",
            2,
            REISSUE
            + " Repeating it unchanged will not give a different result.\nChange the arguments or the "
            "approach, or tell the user what is blocking you.",
        )
    ],
    ("reissue", "redirect"): [
        (
            "remind",
            2,
            REISSUE
            + " Repeating it unchanged will not give a different result.\n"
            + redirect("read_file", "edit_file", "list_dir"),
        )
    ],
    ("echo_loop", "quote"): [
        (
            "remind",
            3,
            ECHO.format(tool="bash ")
            + ':\n- template: {"command":"echo \'…\'"}\nNothing new is coming back: '
            "each output is only the text you put in. Write the actual code or command the task needs, or "
            "tell the "
            "user what is blocking you.",
        )
    ],
    ("echo_loop", "plain"): [
        (
            "remind",
            3,
            ECHO.format(tool="")
            + ". Nothing new is coming back: each output is only the text you put in.\nWrite "
            "the actual code or command the task needs, or tell the user what is blocking you.",
        )
    ],
    ("echo_loop", "redirect"): [
        (
            "remind",
            3,
            ECHO.format(tool="")
            + ". Nothing new is coming back: each output is only the text you put in.\n"
            + redirect("read_file", "edit_file", "list_dir"),
        )
    ],
    ("escalation", "quote"): [
        (
            "withhold",
            6,
            ESCALATION.format(about="your calls to read_file on a.py")
            + " Stop calling read_file for this: use "
            "the results you already have, try a different approach, or tell the user what is blocking you.",
        )
    ],
    ("escalation", "plain"): [
        (
            "withhold",
            6,
            ESCALATION.format(about="these calls")
            + "\nStop making this call: try a different approach, or tell "
            "the user what is blocking you.",
        )
    ],
    ("escalation", "redirect"): [
        (
            "withhold",
            6,
            ESCALATION.format(about="these calls") + "\n" + redirect("edit_file", "bash", "list_dir"),
        )
    ],
    ("circuit_breaker", "quote"): [
        (
            "withhold",
            7,
            DUPLICATE.format(made="called read_file with these same arguments")
            + " Repeating it will not give "
            "you anything new. Stop making this call: use the results you already have, change your "
            "approach, or "
            "tell the user what is blocking you.",
        )
    ],
    ("circuit_breaker", "plain"): [
        (
            "withhold",
            7,
            DUPLICATE.format(made="made this same call")
            + " Repeating it will not give you anything new.\nStop "
            "making this call: use the results you already have, change your approach, or tell the user "
            "what is "
            "blocking you.",
        )
    ],
    ("circuit_breaker", "redirect"): [
        (
            "withhold",
            7,
            DUPLICATE.format(made="made this same call")
            + " Repeating it will not give you anything new.\n"
            + redirect("edit_file", "bash", "list_dir"),
        )
    ],
    ("turn_same_call", "quote"): [
        (
            "withhold",
            3,
            "[loopguard] The result of this call is withheld: this is call 3 of read_file with these same "
            "arguments in this turn." + TRIP.format(limits="3 identical calls per turn (max_same_call)"),
        ),
        ("withhold", 4, MUTED),
    ],
    ("turn_same_target", "quote"): [
        (
            "withhold",
            6,
            "[loopguard] The result of this call is withheld: this is call 6 on a.py in this turn."
            + TRIP.format(limits="6 calls on the same target per turn (max_same_target)"),
        )
    ],
}
# the turn guard's texts already say what to do instead (answer the user): redirect is plain
for _style in ("plain", "redirect"):
    EXPECTED[("turn_same_call", _style)] = [
        ("withhold", 3, SAME_CALL_TRIP + TRIP.format(limits="3 identical calls per turn (max_same_call)")),
        ("withhold", 4, MUTED),
    ]
    EXPECTED[("turn_same_target", _style)] = [
        (
            "withhold",
            6,
            SAME_TARGET_TRIP + TRIP.format(limits="6 calls on the same target per turn (max_same_target)"),
        )
    ]


@pytest.mark.parametrize(("name", "style"), sorted(EXPECTED))
def test_each_rule_speaks_in_each_style_exactly(name: str, style: str) -> None:
    rules, settings, spec, rule = SCENARIOS[name]
    assert texts(only(style, *rules, **settings), body(*spec), rule) == EXPECTED[(name, style)]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_styles_act_at_the_same_calls(name: str) -> None:
    rules, settings, spec, rule = SCENARIOS[name]
    by_style = {
        style: [(kind, call) for kind, call, _ in texts(only(style, *rules, **settings), body(*spec), rule)]
        for style in ("quote", "plain", "redirect")
    }
    assert by_style["quote"]
    assert by_style["plain"] == by_style["quote"] == by_style["redirect"]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
@pytest.mark.parametrize("style", ["plain", "redirect"])
def test_plain_texts_never_show_the_looping_calls_fields(name: str, style: str) -> None:
    rules, settings, spec, rule = SCENARIOS[name]
    for _, call, text in texts(only(style, *rules, **settings), body(*spec), rule):
        looping = spec[call - 1]
        assert not isinstance(looping, str)
        assert looping[0] not in text  # its tool (redirect names only the tools not used)
        assert "- tool:" not in text and "- arguments:" not in text and "a.py" not in text
        # nor any of its arguments' values (long enough not to be a word of the text)
        assert not [v for v in looping[1].values() if isinstance(v, str) and len(v) > 4 and v in text]


def test_a_deny_message_the_user_wrote_is_used_as_written() -> None:
    settings = {"circuit_breaker": {"deny_message": "No more {tool} ({count}/{limit})."}}
    for style in ("quote", "plain", "redirect"):
        got = texts(only(style, "circuit_breaker", **settings), body(*(READ,) * 7), "circuit_breaker")
        assert got == [("withhold", 7, "No more read_file (7/6).")]


def test_redirect_without_offered_tools_says_only_the_result_and_the_answer() -> None:
    got = texts(only("redirect", "repeat_reminder"), body(*(READ,) * 3, tools=()), "repeat_reminder")
    assert got == [("remind", 3, REPEAT.format(n=3) + IN_HAND + ANSWER.lstrip())]


def test_redirect_names_at_most_five_untried_tools_in_offered_order() -> None:
    offered = ("read_file", *(f"t{k}" for k in range(8)))
    got = texts(only("redirect", "repeat_reminder"), body(*(READ,) * 3, tools=offered), "repeat_reminder")
    assert UNTRIED_NAMES == 5
    assert got == [("remind", 3, REPEAT.format(n=3) + redirect("t0", "t1", "t2", "t3", "t4"))]


def test_redirect_counts_only_the_tools_used_since_the_last_user_message() -> None:
    listed = ("list_dir", {"path": "."}, "a.py")
    transcript = parse_request(body(listed, "go on", *(READ,) * 3))
    call = transcript.calls[-1]
    assert untried(transcript, call) == ["edit_file", "bash", "list_dir"]
    # an earlier call's text does not change when later calls use more tools (the prefix cache)
    later = parse_request(body(listed, "go on", *(READ,) * 3, ("bash", {"command": "ls"}, "a.py")))
    assert instead(later, later.calls[3]) == instead(transcript, call)


def test_a_rejected_reissue_says_to_do_what_the_user_asked() -> None:
    rejected = ("bash", {"command": "make"}, "The user doesn't want to proceed with this tool use.")
    got = texts(only("plain", "repeated_failure"), body(rejected, rejected), "repeated_failure")
    assert got == [
        (
            "remind",
            2,
            "[loopguard] You made the same call again, with the exact same arguments and nothing changed in "
            "between, and it was rejected by the user again with the same result as the last time. "
            "Repeating it "
            "unchanged will not give a different result. The user rejected it: do what they asked instead.\n"
            "Change the arguments or the approach, or tell the user what is blocking you.",
        )
    ]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
@pytest.mark.parametrize("style", ["plain", "redirect"])
def test_every_plain_reminder_is_true_of_the_history_before_it(name: str, style: str) -> None:
    """The facts checker of the gates (tests/helpers/reminder_facts.py) reads the plain texts too."""
    rules, settings, spec, rule = SCENARIOS[name]
    request = body(*spec)
    transcript = parse_request(request)
    actions = evaluate(
        transcript, build_guards(only(style, *rules, **settings).guards, style=style), Context()
    )
    reminders = [a for a in actions if isinstance(a, Remind) and a.rule == rule]
    for a in reminders:
        assert check_reminder(request["messages"][: a.after + 1], a.text) == []


def test_an_untrue_plain_reminder_is_caught() -> None:
    """The plain texts' claims, checked: not the same result, a tool said untried that was used."""
    text = texts(only("redirect", "repeat_reminder"), body(*(READ,) * 3), "repeat_reminder")[0][2]
    other = ("read_file", {"path": "a.py"}, "def f():\n    return 2\n")
    history = body(READ, READ, other)["messages"]
    assert check_reminder(history, text) == [
        "without making progress: the last 3 calls did not all return the same result"
    ]
    history = body(("bash", {"command": "ls"}, "a.py"), READ, READ, READ)["messages"]
    assert check_reminder(history, text) == ["not used since the user's last message: bash was"]


@pytest.mark.parametrize(
    ("style", "tail"),
    [
        (
            "quote",
            "[loopguard] Stopped: the model kept calling read_file without getting anywhere (2 withheld "
            "results), so loopguard ended its turn; a reply that makes such a call again is replaced by "
            "this stop "
            "and the call is not run. Do not call read_file for this again: use the results you already "
            "have, try "
            "a different approach, or finish and say what is blocking you.",
        ),
        (
            "plain",
            "[loopguard] Stopped: the model kept making calls that got nowhere (2 withheld results), so "
            "loopguard "
            "ended its turn; a reply that makes such a call again is replaced by this stop and the call is "
            "not "
            "run.\nDo not make that call again: use the results you already have, try a different approach, "
            "or "
            "finish and say what is blocking you.",
        ),
        (
            "redirect",
            "[loopguard] Stopped: the model kept making calls that got nowhere (2 withheld results), so "
            "loopguard "
            "ended its turn; a reply that makes such a call again is replaced by this stop and the call is "
            "not "
            "run.\n" + redirect("edit_file", "bash", "list_dir"),
        ),
    ],
)
def test_the_stop_note_on_a_harness_reply_speaks_in_each_style(style: str, tail: str) -> None:
    """The note a harness's "no tool calls" reply gets after a stop (the model reads it) names the
    looping tool only in quote."""
    request = body(*(READ,) * 7)
    request["messages"].append(
        {"role": "user", "content": "Tool call error:\n\nNo tool calls found in the response."}
    )
    cfg = only(style, "repeat_reminder", "circuit_breaker", "escalation")
    guards = build_guards(cfg.guards, stop_note=stop_note_for(cfg), style=cfg.recovery.reminders)
    notes = [a for a in evaluate(parse_request(request), guards, Context()) if a.rule == "stop_note"]
    assert [(n.after, n.text) for n in notes] == [(15, tail)]
