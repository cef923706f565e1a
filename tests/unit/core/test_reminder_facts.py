"""Reminder facts (DESIGN §2.2: every reminder's text is true): each checker of
:mod:`tests.helpers.reminder_facts` on small hand-written histories, a true and a false case per
reminder text with the exact violations, and the checkers reading the texts the guards write today
(a reworded template fails here first)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.helpers.reminder_facts import CHECKERS, check_reminder, checker_for


def _history(*calls: tuple[str, str, str], said: str | None = None, first: int = 1) -> list[dict[str, Any]]:
    """A user message, then one assistant message per (tool, arguments JSON, result); call ids
    are numbered from ``first``."""
    out: list[dict[str, Any]] = [{"role": "user", "content": "fix it"}]
    for n, (name, args, result) in enumerate(calls, first):
        call = {"id": f"c{n}", "type": "function", "function": {"name": name, "arguments": args}}
        out += [
            {"role": "assistant", "content": said, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": result},
        ]
    return out


def _replies(*pairs: tuple[str, str]) -> list[dict[str, Any]]:
    """One text-only assistant reply and the user message answering it per (reply, answer)."""
    return [
        m
        for reply, answer in pairs
        for m in ({"role": "assistant", "content": reply}, {"role": "user", "content": answer})
    ]


LS = ("bash", '{"command": "ls", "reason": "look"}', "a.py\nb.py\nlisted at 2026-11-30T02:37:55Z")
LS_AT = ("bash", '{"command": "ls"}', "a.py\nb.py\nlisted at 2026-11-30T02:38:01Z")  # masked: the same
LS_NEW = ("bash", '{"command": "ls"}', "a.py\nb.py\nc.py")
PWD = ("bash", '{"command": "pwd"}', "/repo")
READ = ("read_file", '{"path": "./t.py"}', "x = 1")
NAME_ERROR = "Traceback (most recent call last):\n  File \"t.py\", line 1\nNameError: name 'x' is not defined"
RUN = ("bash", '{"command": "python t.py"}', NAME_ERROR)
WRITE = ("write_file", '{"path": "t.py", "content": "x = 1"}', "wrote t.py")
REJECTED = ("bash", '{"command": "rm -rf build"}', "The user rejected this tool call.")
THINK = ("think", '{"thought": "why?"}', "ok")


def _replace(old: str, ok: bool) -> tuple[str, str, str]:
    """A ``str_replace`` edit of ``a.py`` (``old`` the text to replace), failed unless ``ok``."""
    args = orjson.dumps({"command": "str_replace", "path": "a.py", "old_str": old, "new_str": "y"}).decode()
    result = (
        "The file a.py has been edited."
        if ok
        else f"No replacement was performed, old_str `{old}` did not appear."
    )
    return ("str_replace_editor", args, result)


VIEW = ("str_replace_editor", '{"command": "view", "path": "a.py"}', "1\tx = 1")  # another subject


def _echo(command: str, output: str) -> tuple[str, str, str]:
    return ("bash", orjson.dumps({"command": command}).decode(), output)


DETAILED = (
    "[loopguard] You are repeating the same tool call without making progress.\n"
    "- tool: bash\n"
    "- consecutive_calls: {n}\n"
    "- arguments: {args}\n"
    "Do not call this tool with these exact arguments again. Use the results you already have, "
    "try a different approach, or tell the user what is blocking you."
)
GENTLE = (
    "[loopguard] You have made the same tool call several times in a row. Before calling it "
    "again, re-read its last result: if it did not give you what you need, change your approach "
    "or your arguments instead of repeating the call."
)
RECURRENCE = (
    "[loopguard] You keep coming back to the same tool call: bash with the same arguments, "
    "{n} times in your last {m} calls, and it returned the same result each time.\n"
    "- tool: bash\n"
    '- arguments: {{"command":"ls"}}\n'
    "Calling it again will not tell you anything new. Use the result you already have, or do "
    "something different."
)
MONOLOGUE = (
    "[loopguard] Your last 3 messages said exactly the same thing:\n"
    '  "Let me run the tests."\n'
    "Repeating it does not move the task forward. Look at what happened since you first wrote "
    "it and do something different, or tell the user plainly where you are stuck."
)
SAME_ANSWER = (
    "[loopguard] Your last 3 replies got the same answer each time:\n"
    '  "You did not use a tool. Use one."\n'
    "Replying the same way will get the same answer. Do what it asks, or say in one message "
    "what you cannot do and why."
)
REISSUE = (
    "[loopguard] You made the same call again, with the exact same arguments and nothing changed "
    "in between, and it {outcome} again with the same result as the last time.\n"
    "- tool: bash\n"
    "- arguments: {args}\n"
    "- result: {error}\n"
    "Repeating it unchanged will not give a different result. Change the arguments or the "
    "approach{respect}, or tell the user what is blocking you."
)
FAILING = (
    "[loopguard] {subject} has now failed {n} times in a row. The last error:\n"
    "  {error}\n"
    "Trying again the same way will fail the same way. Read the error and fix its cause first "
    "(re-check your assumptions about a.py), change your approach, or tell the user what is "
    "blocking you."
)
CYCLE = (
    "[loopguard] You are going in circles: the same {p} steps have now repeated 3 times in a row, "
    "and the last round gave the same results as the round before:\n{steps}\n"
    "Another round will end the same way. Stop and rethink: what did these results tell you, "
    "and what different step would get you further? If you are stuck, tell the user."
)
ECHO = (
    "[loopguard] Your last 3 calls ran the same bash command with only a quoted text changed, and "
    "each output just echoed that text back:\n"
    "- template: {template}\n"
    "Nothing new is coming back: each output is only the text you put in. Write the "
    "actual code or command the task needs, or tell the user what is blocking you."
)
SAME_TARGET = (
    "[loopguard] You called {subject} {n} times in a row, with different arguments each time, and "
    "it returned the same result each time.\n"
    "- tool: read_file\n"
    "- last arguments: {args}\n"
    "Changing the arguments this way does not change the result. Use the result you already "
    "have, do something different, or tell the user what is blocking you."
)

#: recovery.reminders plain and redirect (proxy.guards.wording)
STOP = "\nDo not make that call again: change your approach, or tell the user what is blocking you."
INSTEAD = (
    "\nWhat those calls returned is already above: use it instead of asking for it again. Tools you have "
    "not used since the user's last message: {names}. If you have what you need, answer the user now with "
    "what you know; if not, say what is blocking you."
)
PLAIN_REPEAT = (
    "[loopguard] You have made the same tool call {n} times in a row, and it returned the same result each "
    "time."
)
PLAIN_SAME_TARGET = (
    "[loopguard] You have made {n} calls in a row on the same tool and target, with arguments that changed, "
    "and "
    "they returned the same result each time. Changing the arguments this way does not change the result."
    + STOP
)
PLAIN_RECURRENCE = (
    "[loopguard] You keep coming back to the same tool call: {n} times in your last {m} calls, and it "
    "returned "
    "the same result each time. Calling it again will not tell you anything new." + STOP
)
PLAIN_FAILING = (
    "[loopguard] Your calls with one tool on one target have now failed {n} times in a row, the same way "
    "each "
    "time. Trying again the same way will fail the same way." + STOP
)
PLAIN_REISSUE = (
    "[loopguard] You made the same call again, with the exact same arguments and nothing changed in between, "
    "and it failed again with the same result as the last time. Repeating it unchanged will not give a "
    "different result." + STOP
)
PLAIN_CYCLE = (
    "[loopguard] You are going in circles: the same {p} steps have now repeated 3 times in a row, and the "
    "last "
    "round gave the same results as the round before. Another round will end the same way." + STOP
)
PLAIN_ECHO = (
    "[loopguard] Your last 3 calls ran the same command with only a quoted text changed, and each output "
    "just "
    "echoed that text back. Nothing new is coming back: each output is only the text you put in." + STOP
)


def _drift(note: str, result: str = "x = 1") -> tuple[str, str, str]:
    return ("read_file", orjson.dumps({"path": "t.py", "note": note}).decode(), result)


FAILED_EDIT = "str_replace_editor str_replace on a.py"
NO_REPLACEMENT = "No replacement was performed, old_str `{}` did not appear."


def _failed_the_same_way(n: int, last: str) -> str:
    from proxy.guards.same_target import FAILED_TEXT

    args = orjson.dumps({"command": "str_replace", "new_str": "y", "old_str": last, "path": "a.py"}).decode()
    return FAILED_TEXT.format(
        subject=FAILED_EDIT,
        count=n,
        error="No replacement was performed",
        tool="str_replace_editor",
        arguments=args,
    )


#: (checker, history, reminder text, violations): a true and a false case per registered text.
CASES = [
    (
        "same_target",  # one failure whose echo differs every time
        _history(PWD, _replace("a", False), _replace("b", False), _replace("c", False)),
        _failed_the_same_way(3, "c"),
        [],
    ),
    (
        "same_target",
        _history(_replace("a", False), _replace("b", ok=True), _replace("c", False)),
        _failed_the_same_way(3, "c"),
        ["failed the same way each time: call 2 of the last 3 did not fail that way"],
    ),
    (
        "same_target",
        _history(PWD, _drift("a"), _drift("b"), _drift("c")),
        SAME_TARGET.format(subject="read_file on t.py", n=3, args='{"note":"c","path":"t.py"}'),
        [],
    ),
    (
        "same_target",
        _history(_drift("a"), _drift("a"), PWD, _drift("a", "x = 2")),
        SAME_TARGET.format(subject="read_file on t.py", n=3, args='{"note":"b","path":"t.py"}'),
        [
            "3 times in a row: call 2 of the last 3 is not on read_file on t.py",
            'last arguments: the last call is read_file {"note":"a","path":"t.py"}',
            "the same result each time: the last 3 calls did not all return the same result",
        ],
    ),
    (
        "repeat_reminder_detailed",
        _history(PWD, LS, LS, LS_AT, LS, LS),
        DETAILED.format(n=5, args='{"command":"ls"}'),
        [],
    ),
    (
        "repeat_reminder_detailed",
        _history(LS, LS, LS_NEW, PWD),
        DETAILED.format(n=4, args='{"command":"ls"}'),
        [
            'arguments: the last 4 calls include other arguments: {"command":"pwd"}',
            "without making progress: the last 4 calls did not all return the same result",
        ],
    ),
    (
        "repeat_reminder_detailed",  # an argument preview stands for the arguments it starts
        _history(*[("bash", orjson.dumps({"command": "x" * 40}).decode(), "ok")] * 3),
        DETAILED.format(n=3, args='{"command":"xxxxx… (+37 more chars)'),
        [],
    ),
    (
        "repeat_reminder_detailed",
        _history(LS, LS),
        DETAILED.format(n=3, args='{"command":"ls"}'),
        ["consecutive_calls: 3: only 2 tool calls before it"],
    ),
    ("repeat_reminder_gentle", _history(PWD, LS, LS_AT, LS), GENTLE, []),
    (
        "repeat_reminder_gentle",
        _history(LS, LS_NEW, LS),
        GENTLE,
        ["re-read its last result: the last 3 calls did not all return the same result"],
    ),
    (
        "repeat_reminder_gentle",
        _history(LS, PWD, LS),
        GENTLE,
        ["the same tool call: the last 3 calls are not all the same call"],
    ),
    ("recurrence", _history(PWD, LS, PWD, LS_AT, PWD, LS), RECURRENCE.format(n=3, m=5), []),
    (
        "recurrence",
        _history(LS, PWD, LS_NEW, PWD, LS_NEW),
        RECURRENCE.format(n=3, m=5),
        ["the same result each time: those 3 calls did not all return the same result"],
    ),
    (
        "recurrence",
        _history(LS, PWD, PWD, LS),
        RECURRENCE.format(n=3, m=4),
        ["3 times: bash with these arguments is 2 of the last 4 calls"],
    ),
    (
        "monologue_same_text",  # the same tools, the same results (masked)
        _history(PWD, LS, LS_AT, LS, said="Let me  run the tests.\n"),
        MONOLOGUE,
        [],
    ),
    (
        "monologue_same_text",  # text-only messages
        [
            *_history(PWD),
            *_replies(*[("Let me run the tests.", "ok")] * 3),
        ],
        MONOLOGUE,
        [],
    ),
    (
        "monologue_same_text",
        [*_history(PWD, LS, said="Let me run the tests."), {"role": "assistant", "content": "Done?"}],
        MONOLOGUE,
        ["said exactly the same thing: message 3 of the last 3 says 'Done?'"],
    ),
    (
        "monologue_same_text",  # the same words while the results change: nothing repeats
        _history(LS, LS_NEW, LS, said="Let me run the tests."),
        MONOLOGUE,
        ["nothing new came back: messages 1 and 2 of the last 3 got other results"],
    ),
    (
        "monologue_same_text",
        _history(LS, READ, LS, said="Let me run the tests."),
        MONOLOGUE,
        ["nothing new came back: messages 1 and 2 of the last 3 called other tools"],
    ),
    (
        "monologue_same_answer",
        [
            *_history(PWD),
            *_replies(
                ("I am done.", "You did not use a tool. Use one."),
                ("Done.", "You did not use a tool.  Use one.\n"),
                ("I said, done.", "You did not use a tool. Use one."),
            ),
        ],
        SAME_ANSWER,
        [],
    ),
    (
        "monologue_same_answer",
        [
            *_history(PWD),
            *_replies(*[("Done.", "You did not use a tool. Use one.")] * 2),
            *_history(PWD, first=2)[1:],
            {"role": "user", "content": "You did not use a tool. Use one."},
        ],
        SAME_ANSWER,
        ["your last 3 replies: reply 3 of the last 3 called tools"],
    ),
    (
        "monologue_same_answer",
        [
            *_history(PWD),
            *_replies(
                ("I am done.", "You did not use a tool. Use one."),
                ("Done.", "Please use a tool."),
                ("I said, done.", "You did not use a tool. Use one."),
            ),
        ],
        SAME_ANSWER,
        ["got the same answer: the answer to reply 2 of the last 3 says 'Please use a tool.'"],
    ),
    (
        "reissued_failure",  # in between: a read, and a failed run of something else
        _history(RUN, READ, ("bash", '{"command": "python u.py"}', "Error: no u.py"), RUN),
        REISSUE.format(
            outcome="failed",
            args='{"command":"python t.py"}',
            error="Traceback (most recent call last):",
            respect="",
        ),
        [],
    ),
    (
        "reissued_failure",
        _history(REJECTED, PWD, REJECTED),
        REISSUE.format(
            outcome="was rejected by the user",
            args='{"command":"rm -rf build"}',
            error="The user rejected this tool call.",
            respect=" (the user rejected it: do what they asked instead)",
        ),
        [],
    ),
    (
        "reissued_failure",  # an edit in between, and a line the result does not hold
        _history(RUN, WRITE, RUN),
        REISSUE.format(
            outcome="failed",
            args='{"command":"python t.py"}',
            error="SyntaxError: invalid syntax",
            respect="",
        ),
        [
            'nothing changed in between: write_file {"content":"x = 1","path":"t.py"} may have changed it',
            "result: not in the previous call's result: SyntaxError: invalid syntax",
        ],
    ),
    (
        "reissued_failure",
        _history(REJECTED, PWD, ("bash", '{"command": "rm -rf build"}', "removed")),
        REISSUE.format(
            outcome="was rejected by the user",
            args='{"command":"rm -rf build"}',
            error="The user rejected this tool call.",
            respect=" (the user rejected it: do what they asked instead)",
        ),
        [
            "the same result as the last time: the two calls got different results",
            "was rejected by the user again: the last call's result is not a rejection",
        ],
    ),
    (
        "failing_run",  # other subjects in between (a view of the file, another file) do not count
        _history(
            _replace("a", ok=True),
            _replace("b", False),
            VIEW,
            READ,
            _replace("c", False),
            _replace("d", False),
        ),
        FAILING.format(subject=FAILED_EDIT, n=3, error=NO_REPLACEMENT.format("d")),
        [],
    ),
    (
        "failing_run",  # a success among the last three, and an error the last result does not hold
        _history(_replace("a", False), _replace("b", True), _replace("c", False), _replace("d", False)),
        FAILING.format(subject=FAILED_EDIT, n=3, error=NO_REPLACEMENT.format("c")),
        [
            f"failed 3 times in a row: call 1 of the last 3 on {FAILED_EDIT} did not fail",
            f"the last error: not in the last call's result: {NO_REPLACEMENT.format('c')}",
        ],
    ),
    (
        "failing_run",  # a user message starts a new turn
        [
            *_history(_replace("a", False), _replace("b", False)),
            {"role": "user", "content": "Keep going."},
            *_history(_replace("c", False), first=3)[1:],
        ],
        FAILING.format(subject=FAILED_EDIT, n=3, error=NO_REPLACEMENT.format("c")),
        [f"failed 3 times in a row: only 1 calls on {FAILED_EDIT} in this turn"],
    ),
    (
        "cycle",
        _history(PWD, RUN, READ, THINK, RUN, READ, THINK, RUN, READ, THINK),
        CYCLE.format(p=3, steps='  1. bash python t.py\n  2. read_file t.py\n  3. think {"thought":"why?"}'),
        [],
    ),
    (
        "cycle",
        _history(RUN, READ, RUN, READ, RUN, ("read_file", '{"path": "t.py"}', "x = 2")),
        CYCLE.format(p=2, steps="  1. bash python t.py\n  2. read_file u.py"),
        [
            "step 2: the last round's call 2 is read_file t.py",
            "the same results as the round before: step 2 got another result",
        ],
    ),
    (
        "echo",
        _history(
            PWD,
            _echo("echo 'hello world'", "hello world\n"),
            _echo("echo 'hi there'", "hi there\n"),
            _echo("echo 'bye now'", "bye now\n"),
        ),
        ECHO.format(template='{"command":"echo \'…\'"}'),
        [],
    ),
    (
        "echo",
        _history(
            _echo("echo 'hello world'", "hello world\n"),
            _echo("echo 'hello world'", "hello world\n"),
            _echo("cat 'a.txt'", "x = 1\n"),
        ),
        ECHO.format(template='{"command":"echo \'…\'"}'),
        [
            "only a quoted text changed: calls 1 and 2 of the last 3 are the same",
            "only a quoted text changed: the last 3 calls differ in more than a quoted text",
            "each output just echoed that text back: call 2 of the last 3 did not",
        ],
    ),
    # recovery.reminders: plain and redirect, checked as the quoting text about the last call
    ("plain_repeat", _history(PWD, PWD, PWD), PLAIN_REPEAT.format(n=3) + STOP, []),
    (
        "plain_repeat",
        _history(READ, PWD, PWD, PWD),
        PLAIN_REPEAT.format(n=3) + INSTEAD.format(names="edit"),
        [],
    ),
    (
        "plain_repeat",
        _history(READ, PWD, PWD, PWD),
        PLAIN_REPEAT.format(n=4) + INSTEAD.format(names="edit, read_file"),
        [
            "not used since the user's last message: read_file was",
            "tool: bash: the last 4 calls include read_file",
            'arguments: the last 4 calls include other arguments: {"path":"./t.py"}',
            "without making progress: the last 4 calls did not all return the same result",
        ],
    ),
    (
        "plain_same_target",
        _history(PWD, _drift("a"), _drift("b"), _drift("c")),
        PLAIN_SAME_TARGET.format(n=3),
        [],
    ),
    (
        "plain_same_target",
        _history(_drift("a"), _drift("a"), PWD, _drift("a", "x = 2")),
        PLAIN_SAME_TARGET.format(n=3),
        [
            "3 times in a row: call 2 of the last 3 is not on read_file on t.py",
            "the same result each time: the last 3 calls did not all return the same result",
        ],
    ),
    ("plain_recurrence", _history(PWD, LS, PWD, LS_AT, PWD, LS), PLAIN_RECURRENCE.format(n=3, m=5), []),
    (
        "plain_recurrence",
        _history(LS, PWD, LS_NEW, PWD, LS_NEW),
        PLAIN_RECURRENCE.format(n=3, m=5),
        ["the same result each time: those 3 calls did not all return the same result"],
    ),
    ("plain_failing", _history(RUN, RUN, RUN), PLAIN_FAILING.format(n=3), []),
    (
        "plain_failing",
        _history(RUN, ("bash", '{"command": "python t.py"}', "ok"), RUN),
        PLAIN_FAILING.format(n=3),
        ["failed 3 times in a row: call 2 of the last 3 on bash on python t.py did not fail"],
    ),
    ("plain_reissue", _history(RUN, RUN), PLAIN_REISSUE, []),
    (
        "plain_reissue",
        _history(RUN, WRITE, RUN),
        PLAIN_REISSUE,
        ['nothing changed in between: write_file {"content":"x = 1","path":"t.py"} may have changed it'],
    ),
    ("plain_cycle", _history(PWD, RUN, READ, RUN, READ, RUN, READ), PLAIN_CYCLE.format(p=2), []),
    (
        "plain_cycle",
        _history(RUN, READ, RUN, READ, RUN, ("read_file", '{"path": "t.py"}', "x = 2")),
        PLAIN_CYCLE.format(p=2),
        ["the same results as the round before: step 2 got another result"],
    ),
    (
        "plain_echo",
        _history(
            PWD,
            _echo("echo 'hello world'", "hello world\n"),
            _echo("echo 'hi there'", "hi there\n"),
            _echo("echo 'bye now'", "bye now\n"),
        ),
        PLAIN_ECHO,
        [],
    ),
    (
        "plain_echo",
        _history(
            _echo("echo 'hello world'", "hello world\n"),
            _echo("echo 'hello world'", "hello world\n"),
            _echo("echo 'bye now'", "bye now\n"),
        ),
        PLAIN_ECHO,
        [
            "only a quoted text changed: calls 1 and 2 of the last 3 are the same",
            "each output just echoed that text back: call 2 of the last 3 did not",
        ],
    ),
]


@pytest.mark.parametrize(("checker", "history", "text", "violations"), CASES)
def test_reminder_facts(
    checker: str, history: list[dict[str, Any]], text: str, violations: list[str]
) -> None:
    fn = checker_for(text)
    assert fn is not None and fn.__name__ == checker
    assert check_reminder(history, text) == violations


def test_every_registered_text_has_a_true_and_a_false_case() -> None:
    true = {c for c, _, _, v in CASES if not v}
    false = {c for c, _, _, v in CASES if v}
    names = {fn.__name__ for fn in CHECKERS.values()}
    assert true == false == names


def test_an_unknown_reminder_text_is_a_violation() -> None:
    text = "[loopguard] You are doing something no rule has a name for yet, again and again"
    assert check_reminder(_history(LS), text) == [f"no checker for: {text[:60]}"]
    assert check_reminder(_history(LS), "Please stop.") == ["no checker for: Please stop."]


def test_a_withheld_result_is_no_reminder() -> None:
    """A withheld result's text replaces the result (the gate reads it as a withhold, not as a
    reminder): no checker claims it."""
    from proxy.guards import circuit_breaker, cycles, escalation, turn_guard

    texts = [
        escalation.WITHHOLD_TEXT,
        cycles.WITHHOLD_TEXT,
        circuit_breaker.DUPLICATE_TEXT,
        circuit_breaker.CAP_TEXT,
        turn_guard.TRIP_TEXT,
        turn_guard.MUTED_TEXT,
    ]
    assert [checker_for(t) for t in texts] == [None] * len(texts)


def test_a_reminder_text_that_cannot_be_read_is_a_violation() -> None:
    text = "[loopguard] You are repeating the same tool call without making progress.\n- tool: bash\n"
    assert check_reminder(_history(LS), text) == [
        "cannot read the tool, consecutive_calls and arguments lines: "
        "[loopguard] You are repeating the same tool call without mak…"
    ]


def test_the_checkers_read_the_texts_the_proxy_writes_today() -> None:
    """The guards' own templates, formatted: each is dispatched to its checker and read (a
    reworded text fails here first: change its entry in tests/helpers/reminder_facts.py with it)."""
    from proxy.guards import (
        cycles,
        echo_loop,
        monologue,
        recurrence,
        repeat_reminder,
        repeated_failure,
        same_target,
    )

    history = _history(LS, LS, LS, LS, LS, said="Let me run the tests.")
    error = "NameError: name 'x' is not defined"
    texts = [
        (history, repeat_reminder.GENTLE_TEXT),
        (history, repeat_reminder.DETAILED_TEXT.format(tool="bash", count=5, arguments='{"command":"ls"}')),
        (history, recurrence.TEXT.format(tool="bash", count=5, span=5, arguments='{"command":"ls"}')),
        (history, monologue.SAME_TEXT.format(count=5, text="Let me run the tests.")),
        (
            [*_history(PWD), *_replies(*[("Done.", "Use a tool.")] * 3)],
            monologue.SAME_ANSWER.format(count=3, text="Use a tool."),
        ),
        (
            _history(RUN, RUN),
            repeated_failure.REISSUE_TEXT.format(
                outcome="failed", tool="bash", arguments='{"command":"python t.py"}', error=error, respect=""
            ),
        ),
        (
            _history(RUN, RUN, RUN),
            repeated_failure.FAILING_TEXT.format(
                subject="bash on python t.py", about=" about python t.py", count=3, error=error
            ),
        ),
        (
            _history(RUN, READ, RUN, READ, RUN, READ),
            cycles.REMIND_TEXT.format(period=2, count=3, steps="  1. bash python t.py\n  2. read_file t.py"),
        ),
        (
            _history(*[_echo(f"echo '{w}'", w) for w in ("one", "two", "three")]),
            echo_loop.TEXT.format(count=3, tool="bash", template='{"command":"echo \'…\'"}'),
        ),
        (
            _history(_drift("a"), _drift("b"), _drift("c")),
            same_target.TEXT.format(
                subject="read_file on t.py", count=3, tool="read_file", arguments='{"note":"c","path":"t.py"}'
            ),
        ),
        (
            _history(_replace("a", False), _replace("b", False), _replace("c", False)),
            _failed_the_same_way(3, "c"),
        ),
    ]
    assert [check_reminder(h, t) for h, t in texts] == [[]] * len(texts)
