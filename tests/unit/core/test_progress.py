"""Progress-aware repeats (DESIGN §6.5): masks, result comparison, the judge, the three guards, config,
and the false-positive guard rails (pinned through the pure pipeline and the real server)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.config import Config, build, load_config
from proxy.core.actions import Action, Remind, Stop, Withhold
from proxy.core.progress import (
    DEFAULT_MASK_PATTERNS,
    DEFAULT_MASKS,
    MASK,
    RepeatJudge,
    compile_masks,
    mask,
    same_result,
)
from proxy.core.transcript import ToolResult
from proxy.errors import ConfigError
from proxy.guards import Context, build_guards
from proxy.guards.circuit_breaker import RULE as BREAKER
from proxy.guards.repeat_reminder import RULE as REMINDER
from proxy.guards.turn_guard import RULE as TURN
from proxy.request.rewrite import decide_request
from proxy.response.assemble import AssembledCall
from proxy.response.decide import StopJudge
from tests.conftest import ProxyFactory
from tests.helpers.agent_steps import History
from tests.helpers.fakes import FakeUpstream

#: The rules that count repeats (the ones progress awareness changes).
REPEAT_RULES = (REMINDER, BREAKER, TURN)


def r(text: str, is_error: bool | None = None, pending: bool = False) -> ToolResult:
    return ToolResult(0, text, is_error, pending)


# --- masks --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("at 2026-11-30T02:37:55.123Z done", f"at {MASK} done"),
        ("on 2026-11-30 02:37:55+01:00", f"on {MASK}"),
        ("date 2026-11-30", f"date {MASK}"),
        ("id 123e4567-e89b-12d3-a456-426614174000.", f"id {MASK}."),
        ("[02:37:55] tick", f"[{MASK}] tick"),
        ("at 2:37 PM", f"at {MASK}"),
        ("ran in 0.53s", f"ran in {MASK}"),
        ("took 12 ms, 1.5 seconds, 250µs", f"took {MASK}, {MASK}, {MASK}"),
        ("commit 3f2a9c1d merged", f"commit {MASK} merged"),
        ("container 0x7ffd3a", f"container {MASK}"),
        ("started pid 4242", f"started {MASK}"),
        ("PID: 17 exited", f"{MASK} exited"),
        ("Output: hello\nProcess Group PGID: 16299", f"Output: hello\nProcess Group {MASK}"),
        # line numbers and counts that shift when a file is edited
        ("[File: /app/config.py (90 lines total)]", f"[File: /app/config.py ({MASK} lines total)]"),
        ("(216 more lines above)", f"({MASK} more lines above)"),
        ('  File "reproduce.py", line 19, in <module>', f'  File "reproduce.py", line {MASK}, in <module>'),
        (
            "SyntaxError: invalid syntax (models.py, line 88)",
            f"SyntaxError: invalid syntax (models.py, line {MASK})",
        ),
        (
            "IndentationError: expected an indented block after 'for' statement on line 879",
            f"IndentationError: expected an indented block after 'for' statement on line {MASK}",
        ),
        (
            "x.py:12:5: E999 IndentationError: unexpected indent",
            f"x.py:{MASK}:5: E999 IndentationError: unexpected indent",
        ),
    ],
)
def test_default_masks_hide_volatile_spans(text: str, masked: str) -> None:
    assert mask(text, DEFAULT_MASKS) == masked


@pytest.mark.parametrize(
    "text",
    [
        "4 passed, 1 failed",  # counts are what progress is made of
        "total_bytes: 8192",
        "status: running 40%",
        "deadbeef and facade are words",  # hex-looking words without digits
        "line 1234567 of the log",  # long decimal numbers are not hex ids
        "src/errors.py:10: class ErrorHandler",
        "processing line 1200 of 5000",  # a bare line number can be progress
        "217:        rather configuration defaults.",  # a numbered file line (SWE-agent's viewer)
    ],
)
def test_default_masks_keep_meaningful_text(text: str) -> None:
    assert mask(text, DEFAULT_MASKS) == text


TB = (
    "Traceback (most recent call last):\n"
    '  File "x.py", line {line}, in <module>\n'
    "NameError: name '{name}' is not defined"
)


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        pytest.param(
            TB.format(line=19, name="y"),
            TB.format(line=21, name="y"),
            True,
            id="same_error_moved_down_two_lines",
        ),
        pytest.param(
            "[File: a.py (90 lines total)]\nERRORS:\n- E999 IndentationError: unexpected indent",
            "[File: a.py (91 lines total)]\nERRORS:\n- E999 IndentationError: unexpected indent",
            True,
            id="same_lint_error_one_line_longer_file",
        ),
        pytest.param(
            TB.format(line=19, name="y"),
            TB.format(line=19, name="z"),
            False,
            id="a_different_error_is_progress",
        ),
        pytest.param(
            "[File: a.py (90 lines total)]\n88:    return x\n89:",
            "[File: a.py (91 lines total)]\n88:    return y\n89:",
            False,
            id="different_code_is_progress",
        ),
        pytest.param("processing line 1200", "processing line 1300", False, id="a_job_moving_on_is_progress"),
    ],
)
def test_line_number_noise_is_not_progress_but_content_is(a: str, b: str, same: bool) -> None:
    """Two errors alternating with only line numbers changing are the same
    results; any change in what a line says is a new result."""
    assert same_result(r(a), r(b), DEFAULT_MASKS) is same


def test_same_result_after_masking_and_never_for_unknown_results() -> None:
    assert same_result(r("ok at 10:00:01"), r("ok at 10:00:09"), DEFAULT_MASKS)
    assert not same_result(r("3 passed"), r("4 passed"), DEFAULT_MASKS)
    assert not same_result(r("x", is_error=True), r("x", is_error=False), DEFAULT_MASKS)
    assert not same_result(None, r("x"), DEFAULT_MASKS)
    assert not same_result(r("", pending=True), r(""), DEFAULT_MASKS)
    assert not same_result(r("ok at 10:00:01"), r("ok at 10:00:09"), compile_masks([]))


def test_judge_first_is_not_a_repeat_new_result_is_progress_pending_judged_by_previous_pair() -> None:
    j = RepeatJudge()
    assert [j.repeats("k", r(t)) for t in ["a", "a", "b"]] == [False, True, False]
    assert j.repeats("k", None) is False  # previous pair (a → b) was progress
    j = RepeatJudge()
    assert [j.repeats("k", r(t)) for t in ["a", "a"]] == [False, True]
    assert j.repeats("k", r("", pending=True)) is True  # previous pair was a repeat
    j = RepeatJudge()
    j.repeats("k", r("a"))
    assert j.repeats("k", None) is True  # second call, nothing shows progress
    assert j.repeats("other", r("a")) is False  # keys are separate


# --- config -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("masks", "key"),
    [
        (["("], "progress.masks[0]"),
        (["ok", "(?i)x"], "progress.masks[1]"),  # a global flag cannot be combined
        (["a*"], "progress.masks[0]"),  # matches the empty string
        ([""], "progress.masks[0]"),
    ],
)
def test_bad_masks_fail_naming_the_key(masks: list[str], key: str) -> None:
    with pytest.raises(ConfigError) as e:
        build(Config, {"progress": {"masks": masks}})
    assert e.value.key == key


def test_no_masks_means_byte_identical_results() -> None:
    cfg = build(Config, {"progress": {"masks": []}})
    assert compile_masks(cfg.progress.masks).regex is None


@pytest.mark.parametrize("profile", ["dsh-repeat-tool-guard", "dsh-circuit-breaker", "dsh-loop-guard"])
def test_seed_profiles_compare_arguments_only(profile: str) -> None:
    g = load_config(f"config/profiles/{profile}.yaml").guards
    enabled = [c for c in (g.repeat_reminder, g.circuit_breaker, g.turn_guard) if c.enabled]
    assert enabled and not any(c.progress_aware for c in enabled)


# --- the pipeline -------------------------------------------------------------------------------


def decide(h: History, config: dict[str, Any] | None = None) -> list[Action]:
    cfg = build(Config, config or {})
    guards = build_guards(cfg.guards, compile_masks(cfg.progress.masks))
    return list(decide_request(h.body(), {}, guards, ()).actions)


def repeat_actions(actions: list[Action]) -> list[tuple[str, str]]:
    """Actions of the rules that count repeats (turn_guard: its ``same_call`` limit only; its
    per-target limit counts calls on a file whatever they return)."""
    return [
        (a.rule, a.kind)
        for a in actions
        if a.rule in REPEAT_RULES
        and not (isinstance(a, Withhold) and a.rule == TURN and a.reason != "same_call")
    ]


def blocking(actions: list[Action]) -> list[Action]:
    return [a for a in actions if isinstance(a, Withhold | Stop)]


def poll(h: History, results: list[str], name: str = "job_status", args: Any = None) -> History:
    return h.steps([(name, args if args is not None else {"id": "42"}, res) for res in results])


TURN_ON = {"guards": {"turn_guard": {"enabled": True, "narrate_after_ms": 0}}}


@pytest.mark.parametrize("config", [None, TURN_ON], ids=["default", "turn_guard_on"])
def test_polling_a_job_whose_status_changes_is_never_a_repeat(config: Any) -> None:
    results = [f"[2026-11-30T02:{i:02d}:00Z] job 42: running, {10 * i}% done" for i in range(1, 10)]
    actions = decide(poll(History(), [*results, "job 42: finished, 3 tests failed"]), config)
    assert repeat_actions(actions) == []
    assert blocking(actions) == []


def test_polling_that_stops_changing_is_a_repeat_again_timestamps_masked() -> None:
    """Progress, then the same status (only the clock moves): the chain counts from the first
    unchanged result, so the reminder comes at the 3rd identical (masked) result."""
    results = ["running 10%", "running 20%", *[f"running 30% (checked at 02:0{i}:00)" for i in range(5)]]
    h = poll(History(), results)
    actions = [a for a in decide(h) if a.rule == REMINDER]
    assert [(a.count, a.after) for a in actions] == [(3, h.result_position(5)), (5, h.result_position(7))]


def test_progress_aware_off_counts_arguments_only() -> None:
    results = [f"running {10 * i}%" for i in range(1, 8)]
    off = {"guards": {n: {"progress_aware": False} for n in ("repeat_reminder", "circuit_breaker")}}
    actions = decide(poll(History(), results), off)
    assert [(a.rule, a.count) for a in actions if a.rule in REPEAT_RULES] == [
        (REMINDER, 3),
        (REMINDER, 5),
        (BREAKER, 7),
    ]


def test_paging_with_an_offset_argument() -> None:
    h = History().steps(
        [("read_output", {"session": "pty1", "offset": 8192 * i}, f"chunk {i}\n" * 50) for i in range(12)]
    )
    assert repeat_actions(decide(h, TURN_ON)) == []
    assert blocking(decide(h)) == []


def test_paging_without_a_cursor_while_the_output_grows() -> None:
    h = History().steps(
        [
            ("read_output", {"session": "pty1"}, f"{'x' * 80}\n[total_bytes: {8192 * (i + 1)}]")
            for i in range(25)
        ]
    )
    assert repeat_actions(decide(h)) == []
    assert blocking(decide(h)) == []


def test_reading_a_file_again_after_editing_it() -> None:
    h = History()
    for i in range(4):
        h.step(("read_file", {"path": "app.py"}, f"def f():\n    return {i}\n"))
        h.step(
            ("edit_file", {"path": "app.py", "old": f"return {i}", "new": f"return {i + 1}"}, "Edited app.py")
        )
    h.step(("read_file", {"path": "app.py"}, "def f():\n    return 4\n"))
    assert repeat_actions(decide(h, TURN_ON)) == []
    assert blocking(decide(h)) == []


def test_a_batch_of_different_files() -> None:
    files = [f"src/module_{i}.py" for i in range(8)]
    h = History().step(*[("read_file", {"path": p}, f"# {p}\n") for p in files])
    h.steps([("read_file", {"path": p}, f"# {p}\n") for p in files])  # and once more, one per step
    assert repeat_actions(decide(h)) == []
    assert blocking(decide(h)) == []


def test_the_same_call_after_a_user_message_that_changes_the_situation() -> None:
    """Two identical failing runs, the user fixes the cause, the same run passes: no reminder (the
    chain restarts at the user message) and nothing withheld; and after six identical failing
    runs, the same call with a new result is not withheld by the breaker (it is progress)."""
    fail = "FAILED tests/test_db.py::test_connect - ConnectionRefusedError"
    h = History().steps([("run_tests", {}, fail)] * 2).user("I started the database, try again")
    h.steps([("run_tests", {}, "12 passed in 0.84s")] * 2)
    assert repeat_actions(decide(h)) == []
    h = History().steps([("run_tests", {}, fail)] * 6).user("The database is up now.")
    h.step(("run_tests", {}, "12 passed in 0.84s"))
    assert [a for a in decide(h) if a.rule == BREAKER] == []


def test_an_unchanged_result_after_six_is_withheld_only_results_the_model_already_has() -> None:
    h = History().steps([("run_tests", {}, f"1 failed in 0.{i}s") for i in range(1, 9)])
    withheld = [a for a in decide(h) if isinstance(a, Withhold) and a.rule == BREAKER]
    assert [(a.rule, a.count) for a in withheld] == [(BREAKER, 7), (BREAKER, 8)]
    # the escalation ladder withholds from call 6: reminded at 3 and 5, the same result again
    ladder = [a for a in decide(h) if isinstance(a, Withhold) and a.rule == "escalation"]
    assert [(a.position, a.count) for a in ladder] == [(h.result_position(k), 2) for k in (6, 7, 8)]


# --- the response side: a call without a result is judged by the previous pair -------------------


def stop_for(h: History) -> Stop | None:
    cfg = Config()
    from proxy.dialects import openai_chat

    t = openai_chat.parse_request(orjson.loads(h.body()))
    guards = build_guards(cfg.guards, compile_masks(cfg.progress.masks))
    ctx = Context()
    from proxy.guards import evaluate

    judge = StopJudge(t, evaluate(t, guards, ctx), guards, ctx, cfg)
    return judge([AssembledCall("next", "job_status", '{"id": "42"}')])


def test_the_next_poll_is_not_stopped_while_polls_make_progress() -> None:
    """Eight identical polls with two withheld results would stop the turn — unless the last
    pair was progress."""
    same = poll(History(), ["running 30%"] * 9)
    assert stop_for(same) is not None
    moving = poll(History(), ["running 30%"] * 8 + ["running 40%"])
    assert stop_for(moving) is None


# --- through the real server --------------------------------------------------------------------


async def test_real_server_forwards_a_polling_conversation_byte_for_byte(
    upstream: FakeUpstream, make_proxy: ProxyFactory
) -> None:
    import aiohttp

    from tests.helpers.fakes import completion

    async def answer(request: Any, body: bytes) -> Any:
        from aiohttp import web

        return web.json_response(completion(content="done"))

    upstream.handler = answer
    base = await make_proxy()
    outputs = [f"PASSED test_{i} ({0.1 * i:.2f}s)\n[pid 4242] {i}/9 done" for i in range(1, 10)]
    h = History().step(("execute_bash", {"command": "pytest -q"}, "started"))
    h = poll(h, outputs, "execute_bash", {"command": ""})
    body = h.body()
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            f"{base}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        ) as resp,
    ):
        assert resp.status == 200
        await resp.read()
    assert upstream.requests[-1].body == body


def test_remind_after_position_is_fresh_only_for_the_newest_step() -> None:
    h = poll(History(), ["same"] * 3)
    (a,) = [a for a in decide(h) if isinstance(a, Remind)]
    assert a.fresh and a.rule == REMINDER


def test_masks_apply_line_by_line_and_memoized_verdicts_agree() -> None:
    from proxy.core.progress import _memo, same_text

    assert mask("pid\n42", DEFAULT_MASKS) == "pid\n42"  # a span never crosses a line break
    assert not same_text("a\n10:00", "a\n10:01\n", DEFAULT_MASKS)  # a line more is different
    a = "\n".join(f"[10:00:{i:02d}] step {i}" for i in range(50))
    b = "\n".join(f"[11:30:{i:02d}] step {i}" for i in range(50))
    c = b.replace("step 49", "step 50")
    for _ in range(2):  # computed, then from the memo
        assert same_text(a, b, DEFAULT_MASKS)
        assert not same_text(a, c, DEFAULT_MASKS)
    assert _memo


def test_default_masks_compile_with_a_prefilter_that_changes_nothing() -> None:
    plain = compile_masks([*DEFAULT_MASK_PATTERNS, "(?!)"])  # not the default list: no prefilter
    text = (
        "2026-11-30T02:37:55Z pid 42 took 0.5s id 3f2a9c1d at 12:03 PM uuid 123e4567-e89b-12d3-a456-4266141"
    )
    assert DEFAULT_MASKS.regex is not None and plain.regex is not None
    assert DEFAULT_MASKS.regex.pattern != plain.regex.pattern
    assert mask(text, DEFAULT_MASKS) == mask(text, plain)
    assert mask(text, DEFAULT_MASKS) == mask(text, DEFAULT_MASKS)  # memoized, same answer
