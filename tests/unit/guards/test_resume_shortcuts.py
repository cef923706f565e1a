"""What a resumed guard run skips, and that it decides the same: the same history sent again
(the checkpoint kept as it is), the states after the whole transcript for the stop judge (the
answer's step read alone, its new actions only), and the passes that a long history made costly
(the stop note without a harness reply, the escalation ladder's near-miss test, the applied
actions with no rule observed, an item's kind read from its bytes)."""

from __future__ import annotations

import dataclasses
import difflib

from proxy.config import Config
from proxy.core.actions import Remind, Withhold, applied
from proxy.core.canonical import parse_arguments
from proxy.core.effects import Situations
from proxy.core.transcript import ToolCall
from proxy.dialects import openai_chat
from proxy.dialects.edits import _string
from proxy.guards import Context, build_guards, evaluate
from proxy.guards.escalation import SIMILAR, similar
from proxy.guards.resume import evaluate_from, evaluate_resumed
from proxy.guards.stop_note import StopNote, stop_note_for
from proxy.response.assemble import AssembledCall
from proxy.response.decide import StopJudge, turn_start, with_pending_step
from tests.helpers.fakes import repeated_call_messages

CFG = Config()
GUARDS = build_guards(CFG.guards, stop_note=stop_note_for(CFG))
LOOP = openai_chat.parse_request({"messages": repeated_call_messages(7)})
ANSWER = [AssembledCall("call_8", "read_file", '{"path": "app.py"}')]


def test_the_same_history_again_keeps_its_checkpoint_and_decides_the_same() -> None:
    first = evaluate_resumed(LOOP, GUARDS, Context(), end=True)
    again = evaluate_resumed(LOOP, GUARDS, Context(), checkpoint=first.checkpoint, end=True)
    assert first.checkpoint is not None and first.checkpoint.cut == 13
    assert again.checkpoint is first.checkpoint  # nothing between the cuts: kept as it is
    assert again.actions == first.actions == evaluate(LOOP, GUARDS, Context())
    assert [type(a).__name__ for a in again.actions] == [
        "Remind",
        "Remind",
        "Withhold",
        "Withhold",
        "Withhold",
    ]


def test_the_end_checkpoint_is_after_the_whole_transcript() -> None:
    done = evaluate_resumed(LOOP, GUARDS, Context(), end=True)
    assert done.end is not None and done.end.cut == LOOP.message_count == 15
    assert evaluate_resumed(LOOP, GUARDS, Context()).end is None  # only when asked for
    assert [len(a) for a in done.end.actions] == [2, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0]


def test_the_judge_resumed_after_the_whole_request_reads_the_answer_alone() -> None:
    done = evaluate_resumed(LOOP, GUARDS, Context(), end=True)
    assert done.end is not None
    extended, pending = with_pending_step(LOOP, ANSWER)
    asked = [g for g in GUARDS if getattr(g, "withholds", True)]
    prior = tuple(a for a in done.actions if isinstance(a, Remind))
    ctx = Context(prior=prior)
    new, kept = evaluate_from(
        extended, asked, ctx, frozenset(), done.end.narrowed(asked), keep=False, new_only=True
    )
    whole = evaluate(extended, asked, ctx)
    assert kept is None and pending == {16}
    assert [(a.rule, a.position) for a in new] == [("circuit_breaker", 16), ("escalation", 16)]
    assert [a for a in whole if isinstance(a, Withhold) and a.position in pending] == new
    resumed = StopJudge(LOOP, done.actions, GUARDS, Context(), CFG, done.end)(ANSWER)
    assert resumed == StopJudge(LOOP, done.actions, GUARDS, Context(), CFG)(ANSWER)
    assert resumed is not None and (resumed.reason, resumed.count, resumed.limit) == ("escalation", 2, 2)


def test_no_stop_note_without_a_harness_reply_however_much_was_withheld() -> None:
    many = openai_chat.parse_request({"messages": repeated_call_messages(40)})
    prior = tuple(evaluate(many, GUARDS[:-1], Context()))
    assert sum(isinstance(a, Withhold) for a in prior) == 69
    assert StopNote(2, True)(many, Context(prior=prior)) == []
    reply = {"role": "user", "content": "Tool call error:\n\nNo tool calls found in the response."}
    replied = openai_chat.parse_request({"messages": [*repeated_call_messages(40), reply]})
    notes = StopNote(2, True)(replied, Context(prior=tuple(evaluate(replied, GUARDS[:-1], Context()))))
    assert [(n.after, n.count, n.delivery) for n in notes] == [(81, 35, "tool_suffix")]


def _call(seq: int, arguments: str) -> ToolCall:
    return ToolCall(seq, seq, 0, 1 + 2 * seq, None, "bash", arguments, parse_arguments(arguments))


def _ratio_gate(x: str, y: str) -> bool:
    """The escalation ladder's test as it was: difflib's three ratios in turn."""
    matcher = difflib.SequenceMatcher(None, x, y, autojunk=False)
    return all(r() >= SIMILAR for r in (matcher.real_quick_ratio, matcher.quick_ratio, matcher.ratio))


def test_the_near_miss_test_gives_difflib_s_answer() -> None:
    pairs = [
        (
            '{"command":"npm test","description":"Run the tests (try 7)"}',
            '{"command":"npm test","description":"again"}',
        ),
        ('{"path":"src/app.py"}', '{"path":"src/app.py "}'),
        ('{"path":"a"}', '{"path":"a/very/long/other/path/entirely.py"}'),
        ('{"q":"abc"}', '{"q":"xyz"}'),
        ('{"q":"abcdef"}', '{"q":"fedcba"}'),
    ]
    got = [similar(_call(0, x), _call(1, y)) for x, y in pairs]
    assert got == [_ratio_gate(x, y) for x, y in pairs] == [False, True, False, False, False]


def test_applied_actions_with_no_rule_observed_are_the_actions() -> None:
    actions = evaluate(LOOP, GUARDS, Context())
    assert applied(actions, frozenset()) == tuple(actions)
    assert applied(actions) == tuple(actions)
    marked = [dataclasses.replace(a, observed=True) if a.rule == "circuit_breaker" else a for a in actions]
    assert len(applied(marked, frozenset({"circuit_breaker"}))) == 4


def test_an_item_kind_is_read_from_its_bytes() -> None:
    assert _string(b'"tool"') == "tool"
    assert _string(b'"caf\xc3\xa9"') == "café"
    assert _string(b'"a\\u00e9\\n"') == "aé\n"
    assert _string(b'"\\ud800"') == "\ud800"  # a lone surrogate: the standard library's reading


def test_the_stop_ladder_turn_is_found_past_many_assistant_messages() -> None:
    messages = [{"role": "system", "content": "s"}, *repeated_call_messages(30)]
    messages.append({"role": "user", "content": "Tool call error:\n\nNo tool calls found in the response."})
    t = openai_chat.parse_request({"messages": messages})
    assert t.user_positions == (1, 62)
    assert turn_start(t) == 1  # the harness's reply starts no turn
    assert turn_start(openai_chat.parse_request({"messages": repeated_call_messages(30)})) == 0


def test_a_situation_counter_copy_shares_until_either_adds() -> None:
    edits = openai_chat.parse_request(
        {
            "messages": [
                {"role": "user", "content": "go"},
                *[
                    m
                    for i in range(6)
                    for m in (
                        {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {
                                    "id": f"c{i}",
                                    "type": "function",
                                    "function": {
                                        "name": "bash",
                                        "arguments": f'{{"command": "touch f{i % 2}"}}',
                                    },
                                }
                            ],
                        },
                        {"role": "tool", "tool_call_id": f"c{i}", "content": f"done {i}"},
                    )
                ],
            ]
        }
    )
    calls = edits.calls
    whole = Situations().epoch_counter()
    for c in calls:
        whole.add(c)
    a = Situations().epoch_counter()
    for c in calls[:3]:
        a.add(c)
    b = a.copy()
    assert b.before is a.before  # shared, not copied
    for c in calls[3:]:
        a.add(c)
    c2 = b.copy()
    for c in calls[3:]:
        b.add(c)  # past what ``a`` added to the shared numbers: its own from here
    assert b.before is not a.before and c2.count == 3
    for counter in (a, b):
        assert counter.count == 6
        assert counter.before[:6] == whole.before and counter.after[:6] == whole.after
    assert whole.before == [0, 1, 2, 3, 4, 5] and whole.after == [1, 2, 3, 4, 5, 6]
