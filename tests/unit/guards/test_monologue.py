"""monologue (DESIGN §6.5): the same assistant text in 3 assistant messages in a row, or text-only
replies each answered with the same harness message → reminder; the 4th → stop (response side)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.config import MonologueConfig, build
from proxy.core.actions import Remind
from proxy.dialects import openai_chat
from proxy.guards.monologue import Monologue
from tests.helpers.agent_steps import History
from tests.helpers.resume_check import assert_resumes
from tests.helpers.rule_helpers import transcript

SAME = "Let me check the configuration again."
HARNESS = "[ERROR] You did not use a tool in your previous response! Please retry with a tool use."


def guard(**settings: Any) -> Monologue:
    return Monologue(build(MonologueConfig, settings))


def with_calls(texts: list[str | None]) -> History:
    """Each message says its text and makes the same call, which returns the same result."""
    h = History()
    for text in texts:
        h.step(("read_file", {"path": "f.py"}, "x"), text=text)
    return h


def paging(texts: list[str], results: list[str]) -> History:
    """Each message says its text and pages on: the same call, a new result each time."""
    h = History()
    for text, result in zip(texts, results, strict=True):
        h.step(("scroll_down", {}, result), text=text)
    return h


def text_only(texts: list[str], answers: list[str], tools: bool = True) -> History:
    """Text-only replies, each answered by a user message; ``tools``: the conversation made one
    tool call first (positions then start at 3)."""
    h = History()
    if tools:
        h.step(("read_file", {"path": "a.py"}, "x"))
    for text, answer in zip(texts, answers, strict=False):
        h.say(text)
        h.user(answer)
    return h


@pytest.mark.parametrize(
    ("history", "settings", "expected"),
    [
        pytest.param(with_calls([SAME] * 3), {}, [(6, "user", 3)], id="same_text_with_calls_three_times"),
        pytest.param(with_calls([SAME] * 2), {}, [], id="twice_nothing"),
        pytest.param(with_calls([SAME] * 5), {}, [(6, "user", 3)], id="once_per_run"),
        pytest.param(
            with_calls([SAME, "  Let me check\nthe configuration   again. ", SAME]),
            {},
            [(6, "user", 3)],
            id="whitespace_normalized",
        ),
        pytest.param(with_calls([SAME, None, SAME, SAME]), {}, [], id="message_without_text_breaks_the_run"),
        pytest.param(with_calls([SAME, "Now the tests.", SAME]), {}, [], id="different_text_breaks_the_run"),
        pytest.param(
            paging([SAME] * 4, ["page 1", "page 2", "page 3", "page 4"]),
            {},
            [],
            id="same_narration_while_paging_is_progress",
        ),
        pytest.param(
            History()
            .step(("read_file", {"path": "a.py"}, "x"), text=SAME)
            .step(("read_file", {"path": "b.py"}, "y"), text=SAME)
            .step(("read_file", {"path": "c.py"}, "z"), text=SAME),
            {},
            [],
            id="same_narration_over_new_results_is_progress",
        ),
        pytest.param(
            History()
            .step(("read_file", {"path": "a.py"}, "x"), text=SAME)
            .step(("read_file", {"path": "b.py"}, "x"), text=SAME)
            .step(("read_file", {"path": "c.py"}, "x"), text=SAME),
            {},
            [(6, "user", 3)],
            id="same_narration_and_nothing_new_came_back",
        ),
        pytest.param(
            History()
            .step(("read_file", {"path": "a.py"}, "x"), text=SAME)
            .step(("grep", {"q": "a"}, "x"), text=SAME)
            .step(("read_file", {"path": "a.py"}, "x"), text=SAME),
            {},
            [],
            id="same_narration_over_other_tools_is_not_a_repeat",
        ),
        pytest.param(
            paging([SAME] * 3, ["page 1", "page 1", "page 1"]),
            {},
            [(6, "user", 3)],
            id="same_narration_and_the_same_page_again",
        ),
        pytest.param(with_calls([SAME] * 2), {"repeats": 2, "stop_at": 3}, [(4, "user", 2)], id="repeats_2"),
        pytest.param(
            text_only([SAME] * 3, [HARNESS] * 3), {}, [(8, "tool_suffix", 3)], id="same_text_only_reply"
        ),
        pytest.param(
            text_only(["I think it works.", "Done, I believe.", "It should be fine now."], [HARNESS] * 3),
            {},
            [(8, "tool_suffix", 3)],
            id="different_replies_same_harness_answer",
        ),
        pytest.param(
            text_only(["Chapter 1 …", "Chapter 2 …", "Chapter 3 …", "Chapter 4 …"], ["continue"] * 4, False),
            {},
            [],
            id="plain_chat_continue_is_never_a_monologue",
        ),
        pytest.param(text_only([SAME] * 4, [HARNESS] * 4, False), {}, [], id="no_tool_calls_at_all_nothing"),
        # a new request from the user is a boundary: answering each the same way is no monologue
        pytest.param(
            text_only(["Committed."] * 4, ["commit and continue"] * 4),
            {},
            [],
            id="the_same_reply_to_each_new_request",
        ),
        pytest.param(
            History()
            .step(("bash", {"command": "git status --short"}, ""), text=SAME)
            .user("Now the docs.")
            .step(("bash", {"command": "git status --short"}, ""), text=SAME)
            .user("Now the changelog.")
            .step(("bash", {"command": "git status --short"}, ""), text=SAME),
            {},
            [],
            id="the_same_step_after_each_new_request",
        ),
        pytest.param(
            History()
            .step(("bash", {"command": "git status --short"}, ""), text=SAME)
            .user("continue")
            .step(("bash", {"command": "git status --short"}, ""), text=SAME)
            .user("go on")
            .step(("bash", {"command": "git status --short"}, ""), text=SAME),
            {},
            [(8, "user", 3)],
            id="the_same_step_across_continuations",
        ),
        pytest.param(
            text_only(["a", "b", "c"], ["Please fix x.", "Now y.", "And z."]), {}, [], id="ordinary_chat"
        ),
    ],
)
def test_monologue(history: History, settings: dict[str, Any], expected: list[tuple[int, str, int]]) -> None:
    actions = guard(**settings)(transcript(history), None)
    assert [(a.after, a.delivery, a.count) for a in actions] == expected


def test_reminder_text_and_freshness() -> None:
    h = with_calls([SAME] * 3)
    (action,) = guard()(transcript(h), None)
    assert action == Remind(
        after=h.result_position(3),
        text=(
            "[loopguard] Your last 3 messages said exactly the same thing:\n"
            '  "Let me check the configuration again."\n'
            "Repeating it does not move the task forward. Look at what happened since you first wrote "
            "it and do something different, or tell the user plainly where you are stuck."
        ),
        rule="monologue",
        tool="",
        count=3,
        limit=3,
        fresh=True,
    )


def test_text_only_reminder_is_appended_to_the_answer() -> None:
    h = text_only(["a", "b", "c"], [HARNESS] * 3)
    (action,) = guard()(transcript(h), None)
    assert (action.after, action.fresh) == (8, True)
    assert action.text.startswith("[loopguard] Your last 3 replies got the same answer each time:\n")
    out = openai_chat.apply(orjson.dumps({"messages": h.messages}), [action])
    assert out is not None
    body = orjson.loads(out)
    assert len(body["messages"]) == len(h.messages)  # appended, never a second user message in a row
    assert body["messages"][8]["content"] == f"{HARNESS}\n\n{action.text}"
    h.say("d")
    (later,) = guard()(transcript(h), None)
    assert (later.after, later.fresh) == (8, False)


@pytest.mark.parametrize(
    ("history", "text", "expected"),
    [
        pytest.param(with_calls([SAME] * 3), SAME, 4, id="fourth"),
        pytest.param(with_calls([SAME] * 3), "Something else.", 1, id="different"),
        pytest.param(with_calls(["x", SAME, SAME]), f"  {SAME}\n", 3, id="normalized"),
        pytest.param(with_calls([SAME] * 3), "  ", 0, id="blank"),
        pytest.param(text_only([SAME] * 3, [HARNESS] * 3), SAME, 4, id="across_harness_answers"),
        pytest.param(text_only([SAME] * 3, [HARNESS] * 3, False), SAME, 0, id="no_tool_calls_never"),
    ],
)
def test_stop_count(history: History, text: str, expected: int) -> None:
    """A text-only answer after the history (``calls`` empty)."""
    h = transcript(history)
    tools = ("read_file",) if history.messages[-1].get("role") == "tool" else ()
    assert guard().stop_count(h, text, tools) == expected


def test_stop_count_of_an_answer_with_calls_compares_their_tools() -> None:
    h = transcript(with_calls([SAME] * 3))
    assert guard().stop_count(h, SAME, ["read_file"]) == 4
    assert guard().stop_count(h, SAME, ["grep"]) == 1
    assert guard().stop_count(h, SAME, ["read_file", "read_file"]) == 1
    assert guard().stop_count(h, SAME, []) == 1


@pytest.mark.parametrize(
    ("history", "settings", "expected"),
    [
        pytest.param(with_calls([SAME] * 3), {}, True, id="three_same_one_more_stops"),
        pytest.param(with_calls([SAME] * 2), {}, False, id="two_same"),
        pytest.param(with_calls(["a", "b", "c"]), {}, False, id="all_different"),
        pytest.param(with_calls([SAME] * 3), {"stop_at": 0}, False, id="stop_off"),
        pytest.param(text_only([SAME] * 3, [HARNESS] * 3), {}, True, id="text_only_across_answers"),
        pytest.param(text_only([SAME] * 3, [HARNESS] * 3, False), {}, False, id="plain_chat_never"),
        pytest.param(History(), {}, False, id="no_assistant_message"),
    ],
)
def test_stop_possible(history: History, settings: dict[str, Any], expected: bool) -> None:
    """Whether the stream guard must hold a text-only answer's finish for the monologue stop."""
    assert guard(**settings).stop_possible(transcript(history)) is expected


@pytest.mark.parametrize(
    ("history", "expected"),
    [
        pytest.param(text_only(["a", "b", "c"], [HARNESS] * 3), 3, id="three_pairs"),
        pytest.param(
            text_only(["a", "b", "c"], ["go on", HARNESS, HARNESS]), 2, id="different_answer_breaks"
        ),
        pytest.param(
            text_only(["a"], [HARNESS]).step(("ls", {}, "x")).say("b").user(HARNESS), 1, id="calls_break"
        ),
        pytest.param(with_calls([SAME] * 3), 0, id="ends_with_tool_results"),
        pytest.param(text_only(["a", "b"], [HARNESS] * 2).say("c"), 0, id="ends_with_the_reply"),
        pytest.param(text_only(["a", "b", "c"], [HARNESS] * 3, False), 0, id="plain_chat_none"),
    ],
)
def test_answer_run(history: History, expected: int) -> None:
    assert guard().answer_run(transcript(history)) == expected


SPLITS = {
    "same_text_with_calls": (with_calls([SAME] * 4), [(6, "user", 3)]),
    "same_text_only_reply_waits_for_its_answer": (
        text_only([SAME] * 3, [HARNESS] * 3),
        [(8, "tool_suffix", 3)],
    ),
    "same_answer_to_different_replies": (
        text_only(["a", "b", "c", "d"], [HARNESS] * 4),
        [(8, "tool_suffix", 3)],
    ),
    "a_reply_nothing_answered_yet": (text_only(["a", "b", "c"], [HARNESS] * 2), []),
    "text_then_the_same_text_with_calls": (
        text_only([SAME, SAME], [HARNESS] * 2).step(("read_file", {"path": "a.py"}, "x"), text=SAME),
        [],
    ),
}


@pytest.mark.parametrize(("history", "expected"), list(SPLITS.values()), ids=list(SPLITS))
def test_advanced_in_two_parts_anywhere_gives_the_whole_run(
    history: History, expected: list[tuple[int, str, int]]
) -> None:
    """Resumable: the state after any message position, advanced (or a copy of it) over the rest,
    decides what the whole-transcript call decides."""
    whole = assert_resumes(guard(), transcript(history))
    assert [(a.after, a.delivery, a.count) for a in whole] == expected


def test_a_text_only_reply_is_decided_when_the_message_after_it_is_read() -> None:
    g = guard()
    t = transcript(text_only(["a", "b", "c"], [HARNESS] * 3))
    state = g.begin()
    assert g.advance(state, t, None, 8) == []  # the third reply (7) is read, its answer (8) not
    assert [(a.after, a.count) for a in g.advance(state, t, None, 9)] == [(8, 3)]


def test_a_new_request_is_never_the_start_of_a_stop() -> None:
    """Four text-only replies, each answered by the same new request: nothing to stop; the same
    with a harness's reply is the same-answer stop."""
    asked = transcript(text_only(["Committed."] * 3, ["commit and continue"] * 3))
    assert (guard().answer_run(asked), guard().stop_possible(asked)) == (0, False)
    assert guard().stop_count(asked, "Committed.") == 1
    harness = transcript(text_only(["Committed."] * 3, [HARNESS] * 3))
    assert (guard().answer_run(harness), guard().stop_possible(harness)) == (3, True)
