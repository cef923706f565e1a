"""Run detection for ``recovery.collapse`` (:mod:`proxy.core.collapse`): which steps fold, at which
positions, with which note; and how the dialects' writers remove them
(:func:`proxy.dialects.edits.unfold`, :func:`proxy.dialects.edits.fold_items`)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.config import Config, build
from proxy.core.actions import Fold, Remind, Withhold
from proxy.core.collapse import NOTE, NOTE_WITHHELD, RULE, Collapse, breaks_prefix, folds, guidance, runs
from proxy.core.effects import progress_rules
from proxy.core.progress import compile_masks
from proxy.dialects import anthropic_messages, edits, openai_chat, openai_responses
from proxy.guards import build_guards
from proxy.request.response_store import Entry
from proxy.request.rewrite import decide_request
from tests.helpers.agent_steps import History
from tests.helpers.fakes import repeated_call_messages
from tests.helpers.responses_items import responses_body

CFG = build(Config, {})
GUARDS = build_guards(CFG.guards, *progress_rules(CFG.progress))

READ = ("read_file", {"path": "a.py"}, "x = 1")
OTHER = ("read_file", {"path": "b.py"}, "y = 2")


def _t(h: History) -> Any:
    return openai_chat.parse_request({"messages": h.messages})


@pytest.mark.parametrize(
    ("calls", "min_repeats", "want"),
    [
        ([READ] * 2, 3, []),  # one short of min_repeats
        ([READ] * 3, 3, [(0, 1, 2)]),
        ([READ] * 2, 2, [(0, 1)]),  # the smallest min_repeats
        ([READ] * 5, 3, [(0, 1, 2, 3, 4)]),
        ([OTHER, *[READ] * 3, OTHER], 3, [(1, 2, 3)]),  # exact steps, other calls around it
        ([READ] * 3 + [OTHER] * 3, 3, [(0, 1, 2), (3, 4, 5)]),  # two runs side by side
        ([READ, READ, OTHER, READ, READ], 3, []),  # another call breaks the run
        ([READ] * 4, 5, []),
    ],
    ids=["short", "three", "two-of-two", "five", "inside", "two-runs", "broken", "min-five"],
)
def test_runs_are_consecutive_identical_steps_of_at_least_min_repeats(
    calls: list[Any], min_repeats: int, want: list[tuple[int, ...]]
) -> None:
    assert runs(_t(History().steps(calls)), min_repeats) == want


def test_a_different_result_breaks_the_run_and_a_masked_one_does_not() -> None:
    changed = History().steps([READ, READ, ("read_file", {"path": "a.py"}, "x = 2"), READ, READ])
    assert runs(_t(changed), 3) == []
    masks = compile_masks([r"\d\d:\d\d:\d\d"])
    timed = History().steps([("date", {}, f"now 10:00:0{i}") for i in range(4)])
    assert runs(_t(timed), 3, masks) == [(0, 1, 2, 3)]
    assert runs(_t(timed), 3, compile_masks([])) == []  # unmasked, every result differs


def test_results_are_compared_with_the_first_steps_result() -> None:
    # each result differs from the one before by a masked span only, and from the first too
    masks = compile_masks([r"\d+ms"])
    h = History().steps([("ping", {}, f"pong {i}ms") for i in range(3)])
    assert runs(_t(h), 3, masks) == [(0, 1, 2)]
    assert runs(_t(h), 3, compile_masks([])) == []


def test_an_error_flag_or_other_arguments_break_the_run() -> None:
    h = History().steps([READ, READ, ("read_file", {"path": "a.py", "limit": 5}, "x = 1"), READ])
    assert runs(_t(h), 3) == []
    # every argument counts (no ignore_args): the note says it was the same call
    h = History().steps([READ, READ, ("read_file", {"path": "a.py", "description": "again"}, "x = 1")])
    assert runs(_t(h), 3) == []


def test_steps_with_parallel_calls_are_never_folded() -> None:
    h = History()
    for _ in range(4):
        h.step(READ, OTHER)
    assert runs(_t(h), 2) == []
    h = History().steps([READ, READ]).step(READ, READ).steps([READ])
    assert runs(_t(h), 3) == []  # the parallel step splits two runs of two


def test_a_step_with_text_or_a_user_message_between_is_not_folded() -> None:
    h = History().steps([READ]).step(READ, text="Let me read it again.").steps([READ, READ])
    assert runs(_t(h), 3) == []
    h = History().step(READ, text="   ").steps([READ, READ])  # whitespace says nothing
    assert runs(_t(h), 3) == [(0, 1, 2)]
    h = History().steps([READ, READ]).user("go on").steps([READ, READ])
    assert runs(_t(h), 3) == []


def test_a_call_without_its_result_ends_the_run_before_it() -> None:
    h = History().steps([READ] * 3 + [("read_file", {"path": "a.py"}, None)])
    assert runs(_t(h), 3) == [(0, 1, 2)]
    assert runs(_t(h), 4) == []


def test_waits_are_not_folded() -> None:
    poll = ("write_stdin", {"session_id": 7, "chars": ""}, "Process running with session ID 7\nOutput:\n")
    assert runs(_t(History().steps([poll] * 5)), 3) == []
    nap = ("bash", {"command": "sleep 30"}, "")
    assert runs(_t(History().steps([nap] * 5)), 3) == []
    # a poll whose process has exited is an ordinary repeat
    done = ("write_stdin", {"session_id": 7, "chars": ""}, "Process exited with code 0\nOutput:\n")
    assert runs(_t(History().steps([done] * 3)), 3) == [(0, 1, 2)]


def test_the_fold_names_the_positions_the_note_and_the_evidence() -> None:
    h = History().steps([OTHER, READ, READ, READ, READ])
    # messages: 0 user, 1-2 OTHER, 3-4, 5-6, 7-8, 9-10 READ
    (fold,) = folds(_t(h), Collapse(3, delivery="tool_suffix"))
    assert fold == Fold(
        after=4,
        start=5,
        stop=10,
        text=NOTE.format(count=4),
        rule=RULE,
        tool="read_file",
        count=4,
        limit=3,
        fresh=True,
        delivery="tool_suffix",
        steps=(1, 4),
    )
    assert "a.py" not in fold.text and "read_file" not in fold.text  # never quotes the call
    assert not breaks_prefix(fold)  # the run had three steps at the request before
    (at_three,) = folds(_t(History().steps([OTHER, READ, READ, READ])), Collapse(3))
    assert breaks_prefix(at_three)
    (old,) = folds(_t(History().steps([READ, READ, READ, OTHER])), Collapse(3))
    assert not old.fresh and not breaks_prefix(old)


def test_a_withheld_first_result_is_not_pointed_at() -> None:
    h = History().steps([READ] * 3)
    (fold,) = folds(_t(h), Collapse(3), withheld={2})
    assert fold.text == NOTE_WITHHELD.format(count=3)


def test_unfold_drops_what_the_guards_put_on_folded_steps_and_adds_the_note() -> None:
    fold = Fold(4, 5, 10, "note", RULE, "read_file", 4, 3, True)
    kept = Remind(4, "first", "repeat_reminder", "read_file", 2, 3, False)
    inside = Remind(8, "third", "repeat_reminder", "read_file", 3, 3, False)
    withheld = Withhold(10, "c5", "denied", "circuit_breaker", "read_file", 7, 6, True)
    before = Withhold(2, "c1", "denied", "circuit_breaker", "read_file", 7, 6, False)
    actions, found = edits.unfold([before, kept, inside, withheld, fold])
    assert found == (fold,)
    assert actions == [before, kept, Remind(4, "note", RULE, "read_file", 4, 3, True)]


def test_slotted_folds_remove_whole_messages_only() -> None:
    fold = Fold(2, 3, 4, "note", RULE, "read", 2, 2, True)
    Slot = anthropic_messages.Slot
    # 0 user, 1 assistant, 2 result, 3 assistant, 4 result
    layout = [Slot(0, None, "user"), Slot(1, None, "assistant"), Slot(2, 0, "result")]
    layout += [Slot(3, None, "assistant"), Slot(4, 0, "result")]
    assert edits.fold_items([fold], layout) == [Fold(2, 3, 4, "note", RULE, "read", 2, 2, True)]
    # the last result shares its message with the user's own text: not removed
    assert edits.fold_items([fold], [*layout, Slot(4, None, "user")]) == []


def test_a_chained_responses_request_is_not_folded_and_its_whole_body_is() -> None:
    """A request continuing ``previous_response_id``: the run is in the upstream's stored copy,
    which the proxy cannot change, so nothing folds; the same items in the body fold."""
    items = responses_body(repeated_call_messages(5))["input"]
    kept = orjson.dumps(items[:-1])
    entry = Entry((kept,), len(items) - 1, len(kept))
    chained = orjson.dumps({"model": "m", "previous_response_id": "resp_1", "input": items[-1:]})
    collapse = Collapse(3)
    d = decide_request(
        chained, {}, GUARDS, (), dialect=openai_responses, previous=lambda rid: entry, collapse=collapse
    )
    assert d.transcript is not None and len(d.transcript.calls) == 5
    assert not any(isinstance(a, Fold) for a in d.actions)
    whole = orjson.dumps({"model": "m", "input": items})
    d = decide_request(whole, {}, GUARDS, (), dialect=openai_responses, collapse=collapse)
    assert [a.count for a in d.actions if isinstance(a, Fold)] == [5]


def test_observed_folds_are_decided_and_change_no_byte() -> None:
    raw = orjson.dumps({"model": "m", "messages": History().steps([READ] * 4).messages})
    d = decide_request(raw, {}, GUARDS, (), collapse=Collapse(3), observed=frozenset({RULE}))
    (fold,) = [a for a in d.actions if isinstance(a, Fold)]
    assert fold.observed and fold.count == 4
    assert NOTE[:20].encode() not in d.body


THREE = Collapse(3)


def _sent(h: History, collapse: Collapse = THREE) -> list[dict[str, Any]]:
    raw = orjson.dumps({"model": "m", "messages": h.messages})
    return orjson.loads(decide_request(raw, {}, GUARDS, (), collapse=collapse).body)["messages"]


def test_withheld_results_and_reminders_of_folded_steps_vanish_with_them_and_the_note_tells_them() -> None:
    # 7 repeats: reminders after 3 and 5, the results of 6 (escalation) and 7 (circuit breaker)
    # withheld; all on folded steps: the upstream sees the first step and the note only, and the
    # note says what they told the model (so a later stop that cites them is true)
    h = History().steps([READ] * 7)
    told = (
        " Before this note, loopguard reminded you 2 times that this call was not getting anywhere"
        " and withheld 2 of its results. Do not make this call again: change your approach, or"
        " answer the user with what you know."
    )
    assert _sent(h) == [*h.messages[:3], {"role": "user", "content": NOTE.format(count=7) + told}]
    unfolded = _sent(h, Collapse(8))
    assert sum(m["role"] == "tool" and m["content"] != READ[2] for m in unfolded) == 2  # what vanished
    assert sum(m["role"] == "user" for m in unfolded) == 3


def test_a_run_whose_first_result_is_withheld_keeps_the_denial_and_does_not_point_at_it() -> None:
    # six reads (folded), a step with text (never folded), then a run of three from the 8th read,
    # whose result the circuit breaker withholds (the 7th and later duplicates); the guards'
    # reminder on that first step (the chain's 8th call) stays, the note after it
    h = History().steps([READ] * 6).step(READ, text="Reading it once more.").steps([READ] * 3)
    sent = _sent(h)
    told = (
        " Before this note, loopguard reminded you 2 times that this call was not getting anywhere"
        " and withheld one of its results. Do not make this call again: change your approach, or"
        " answer the user with what you know."
    )
    assert sent[:4] == [*h.messages[:3], {"role": "user", "content": NOTE.format(count=6) + told}]
    assert [m.get("tool_call_id") or m["tool_calls"][0]["id"] for m in sent[4:8]] == ["c7", "c7", "c8", "c8"]
    assert sent[7]["content"] != READ[2]  # withheld, and kept
    assert len(sent) == 9 and sent[8]["role"] == "user"
    assert sent[8]["content"].startswith("[loopguard]")
    # the 9th and 10th reads' results, withheld by the circuit breaker, went with their steps
    assert sent[8]["content"].endswith("\n\n" + NOTE_WITHHELD.format(count=3) + guidance(0, 2))


@pytest.mark.parametrize(
    ("reminded", "withheld", "text"),
    [
        (0, 0, ""),
        (
            1,
            0,
            " Before this note, loopguard reminded you once that this call was not getting anywhere."
            " Do not make this call again: change your approach, or answer the user with what you know.",
        ),
        (
            0,
            3,
            " Before this note, loopguard withheld 3 of its results."
            " Do not make this call again: change your approach, or answer the user with what you know.",
        ),
    ],
)
def test_the_note_tells_the_guidance_that_went_with_the_folded_steps(
    reminded: int, withheld: int, text: str
) -> None:
    assert guidance(reminded, withheld) == text
