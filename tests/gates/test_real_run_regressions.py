"""Wrong decisions once seen on real recorded runs (DESIGN §2.2), each pinned on the run and call
where it was seen (../shared/fixtures/realtraj or $LOOPGUARD_REALTRAJ; skipped, naming the path,
when absent): what the old rules did there, and that the default config no longer does it.

Related cases are pinned elsewhere: failure formats and rejection phrasings in
tests/unit/core/test_failures.py, loops across a harness message in tests/unit/core/test_episodes.py,
the escalation ladder on flask-4992 in tests/unit/guards/test_escalation.py, the runaway cut at the
3rd identical call of one answer by the corpus gate's T16. A `think` tool's only argument and
str_replace_editor's subcommands come from OpenHands runs that are not among the recorded ones;
their tests below rebuild the reported shapes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from proxy.config import Config
from proxy.core.actions import Action, Remind, Withhold
from proxy.core.effects import progress_rules
from proxy.core.progress import same_result
from proxy.core.transcript import Transcript
from proxy.core.volatile import DEFAULT_MASK_PATTERNS, DEFAULT_MASKS, compile_masks
from proxy.dialects import openai_chat
from proxy.guards import Context, build_guards, evaluate
from proxy.response.assemble import AssembledCall
from proxy.response.decide import StopJudge
from tests.helpers.agent_steps import History
from tests.helpers.rule_helpers import call_at, transcript

CFG = Config()
GUARDS = build_guards(CFG.guards, *progress_rules(CFG.progress))


def run(name: str) -> dict[str, Any]:
    env = os.environ.get("LOOPGUARD_REALTRAJ")
    base = Path(env) if env else Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "realtraj"
    path = base / f"{name}.json"
    if not path.exists():
        pytest.skip(f"real runs not found at {path} (set LOOPGUARD_REALTRAJ)")
    return json.loads(path.read_text())


def upto(name: str, call: int) -> Transcript:
    """The run's history up to and including the result of its call number ``call`` (1-based)."""
    messages = run(name)["messages"]
    n, end = 0, len(messages)
    for i, m in enumerate(messages):
        n += len(m.get("tool_calls") or [])
        if n >= call and m.get("role") == "assistant":
            end = i + 1 + len(m["tool_calls"])
            break
    return openai_chat.parse_request({"messages": messages[:end]})


def acts(t: Transcript) -> list[Action]:
    return evaluate(t, GUARDS, Context())


def at(t: Transcript, call: int, rule: str) -> list[Action]:
    return [a for a in acts(t) if a.rule == rule and call_at_t(t, a) == call]


def call_at_t(t: Transcript, a: Action) -> int:
    if isinstance(a, Withhold):
        return next(c.seq + 1 for c in t.calls if c.result is not None and c.result.position == a.position)
    assert isinstance(a, Remind)
    return max(c.seq + 1 for c in t.calls if c.result is not None and c.result.position <= a.after)


def test_rerunning_a_failed_command_after_an_edit_is_not_reminded() -> None:
    """coder-scikit-learn__scikit-learn-14894-4-tester, call 10: `python reproduce.py` failed at
    call 6, the agent edited sklearn/svm/base.py, then re-ran it (a new traceback). The old rule
    said "You made a call that failed the last time … The same call gives the same result"."""
    t = upto("coder-scikit-learn__scikit-learn-14894-4-tester", 10)
    assert t.calls[9].arguments == {"command": "python reproduce.py\n"}
    assert at(t, 10, "repeated_failure") == []
    assert [a for a in acts(t) if a.kind == "withhold"] == []


def test_a_restore_between_fix_attempts_is_never_withheld() -> None:
    """mini-lite_dev-marshmallow-code__marshmallow-1343 (resolved): `cp schema.py.backup
    schema.py` before each of many fix attempts; the old breaker withheld its 7th run (call 161)
    and the stop ended the turn at call 171."""
    name = "mini-lite_dev-marshmallow-code__marshmallow-1343"
    t = upto(name, 189)
    assert t.calls[160].arguments == {
        "command": "cp src/marshmallow/schema.py.backup src/marshmallow/schema.py"
    }
    assert [a for a in acts(t) if a.kind == "withhold"] == []
    # the answer that made call 161 (the 7th cp) is not stopped either
    t160 = upto(name, 160)
    judge = StopJudge(t160, acts(t160), GUARDS, Context(), CFG)
    tc = answer_with_call(name, 161)
    assert judge([AssembledCall(tc["id"], tc["function"]["name"], tc["function"]["arguments"])]) is None


def answer_with_call(name: str, call: int) -> dict[str, Any]:
    """The wire tool call number ``call`` (1-based) of the run."""
    calls = [tc for m in run(name)["messages"] for tc in m.get("tool_calls") or []]
    return calls[call - 1]


def test_the_same_narration_while_paging_is_not_a_monologue() -> None:
    """coder-django__django-13315-3-programmer, calls 19-28: `scroll_down` ten times, each page new,
    each with the same sentence; the old rule reminded and then stopped the turn at call 27."""
    t = upto("coder-django__django-13315-3-programmer", 28)
    assert [c.name for c in t.calls[18:28]] == ["scroll_down"] * 10
    assert [a for a in acts(t) if a.rule == "monologue"] == []
    said = [s.text for s in t.said if s.role == "assistant"][-1]
    judge = StopJudge(t, acts(t), GUARDS, Context(), CFG)
    assert judge([AssembledCall("c29", "scroll_down", '{"command": "scroll_down\\n"}')], said) is None


def test_a_think_tool_is_compared_by_its_only_argument() -> None:
    """OpenHands' `think` tool has one argument, `thought` (an ignore_args name): every call used
    to look identical, and the 7th was withheld."""
    h = History().steps(
        [
            ("think", {"thought": f"Step {i}: check the {w} next."}, "Your thought has been logged.")
            for i, w in enumerate(["parser", "lexer", "tests", "docs", "cli", "api", "db", "ui"])
        ]
    )
    assert [a for a in acts(transcript(h)) if a.kind in ("withhold", "remind")] == []


def test_a_successful_view_does_not_reset_the_failing_edits_on_a_file() -> None:
    """OpenHands' `str_replace_editor` multiplexes view / str_replace / create under one name: a
    `view` between failed `str_replace` edits of one file is another thing done to it, so three
    failed edits are three failures in a row on `str_replace_editor str_replace`."""
    fail = "ERROR:\nNo replacement was performed, old_str `def f(a)` did not appear verbatim in /repo/a.py."
    view = (
        "str_replace_editor",
        {"command": "view", "path": "/repo/a.py"},
        "     1\tdef f(x):\n     2\t    return x",
    )
    steps = []
    for i in range(3):
        steps += [
            view,
            (
                "str_replace_editor",
                {
                    "command": "str_replace",
                    "path": "/repo/a.py",
                    "old_str": f"def f(a){' ' * i}",
                    "new_str": "y",
                },
                fail,
            ),
        ]
    h = History().steps(steps)
    t = transcript(h)
    reminders = [(call_at(t, a), a.text.split("\n")[0]) for a in acts(t) if a.rule == "repeated_failure"]
    assert reminders == [
        (
            6,
            "[loopguard] str_replace_editor str_replace on /repo/a.py has now failed 3 times in a row. "
            "The last error:",
        )
    ]


def test_the_same_error_with_shifted_line_numbers_is_the_same_result() -> None:
    """coder-django__django-16408-1-reproducer, calls 54 and 56: `python reproduce.py` after an edit
    that moved the code: the same error, only the traceback's line numbers differ. Compared as
    different before (each run looked like progress), the same now; the edit between them is
    still a change of situation, so no rule calls the re-run a loop."""
    t = upto("coder-django__django-16408-1-reproducer", 56)
    a, b = t.calls[53].result, t.calls[55].result
    assert a is not None and b is not None and a.text != b.text
    old = compile_masks(DEFAULT_MASK_PATTERNS[:7])  # the masks before line numbers and counts
    assert (same_result(a, b, old), same_result(a, b, DEFAULT_MASKS)) == (False, True)
    assert [x for x in acts(t) if x.kind == "withhold"] == []
