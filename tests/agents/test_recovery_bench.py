"""The real-model recovery bench (``python -m bench.recovery``): its pure parts (loop figures, the
chat format's rendering and parsing), and two short episodes per arm of ``direct`` and ``default``
against the real llama-cpp-python server (marker ``realmodel``), so the bench cannot rot.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from bench.recovery import chat_format
from bench.recovery.agent import step_seed
from bench.recovery.llama import llama_available, llama_python
from bench.recovery.loops import Loop, broken, call_key, find_loop, loop_before
from bench.recovery.metrics import arm_summary, episode_figures
from bench.recovery.tasks import TASKS, make_repo, solved
from bench.recovery.tools import execute

A, B, C, D = 'read_file {"path":"a"}', 'run {"path":"t"}', "list_files {}", "write_file {}"


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ([A, A, A], Loop(0, 1, 3, frozenset({A}))),
        ([C, A, A, A, B], Loop(1, 1, 4, frozenset({A}))),
        ([A, B, A, B, A, B, A], Loop(0, 2, 7, frozenset({A, B}))),
        ([C, A, B, D, A, B, D, A, B, D], Loop(1, 3, 10, frozenset({A, B, D}))),
        ([A, A, B, B, A], None),
        ([A, B, A, B, A], None),
        (["", "", ""], None),
    ],
    ids=["same-call-3", "starts-later", "2-cycle", "3-cycle", "no-run-of-3", "cycle-twice", "no-calls"],
)
def test_find_loop_is_a_block_three_times_in_a_row(keys: list[str], expected: Loop | None) -> None:
    assert find_loop(keys) == expected


def test_call_key_canonicalises_the_arguments() -> None:
    assert call_key("read_file", '{ "path" : "a", "n": 1 }') == 'read_file {"n":1,"path":"a"}'
    assert call_key("run", "not json") == "run not json"


@pytest.mark.parametrize(
    ("keys", "results", "at", "expected"),
    [
        ([A, A, A, B], ["x", "x", "x", "y"], 3, True),  # a new call with a new result
        ([A, A, A, A], ["x", "x", "x", "x"], 3, False),  # repeated the looping call
        ([A, A, A, ""], ["x", "x", "x", ""], 3, False),  # stopped: no call
        ([A, B, A, B, C], ["x", "y", "x", "y", "z"], 4, True),
        ([C, A, A, C], ["z", "x", "x", "z"], 3, False),  # an old call with its old result
    ],
    ids=["new-call", "repeat", "stopped", "out-of-cycle", "old-pair-only"],
)
def test_broken_means_a_new_call_and_a_new_result(
    keys: list[str], results: list[str], at: int, expected: bool
) -> None:
    assert broken(keys, results, at) is expected


def test_loop_before_falls_back_to_calls_seen_twice() -> None:
    assert loop_before([C, A, A], 3) == frozenset({A})
    assert loop_before([A, A, A, B], 4) == frozenset({A})


TOOL = {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}


def test_chat_format_renders_tools_calls_and_results_as_turns() -> None:
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c", "function": {"name": "read_file", "arguments": '{"path": "a"}'}}],
        },
        {"role": "tool", "tool_call_id": "c", "content": 'it said "hi" & <b>'},
    ]
    prompt = chat_format.render(messages, chat_format.offered([TOOL], "auto"))
    assert prompt == (
        "<|im_start|>system\nS\n\n" + chat_format._INSTRUCTIONS + "\n"
        '- read_file:  Parameters: {"type": "object"}\n'
        "- answer: Answer the user in text and end your turn. Parameters: "
        + json.dumps(chat_format._ANSWER_SPEC["function"]["parameters"])
        + "<|im_end|>\n"
        "<|im_start|>user\nU<|im_end|>\n"
        '<|im_start|>assistant\n{"name": "read_file", "arguments": {"path": "a"}}<|im_end|>\n'
        '<|im_start|>tool\nit said "hi" & <b><|im_end|>\n'
        "<|im_start|>assistant\n"
    )


@pytest.mark.parametrize(
    ("choice", "names"),
    [
        ("auto", ["read_file", "answer"]),
        (None, ["read_file", "answer"]),
        ("required", ["read_file"]),
        ("none", []),
    ],
)
def test_chat_format_offers_the_answer_tool_unless_a_call_is_required(choice: Any, names: list[str]) -> None:
    assert [t["function"]["name"] for t in chat_format.offered([TOOL], choice)] == names


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"name": "read_file", "arguments": {"path": "a"}}', ("read_file", {"path": "a"})),
        ('{"name": "answer", "arguments": {"text": "done"}}', (None, "done")),
        ('{"name": "read_file", "argu', (None, '{"name": "read_file", "argu')),
    ],
    ids=["call", "answer", "cut"],
)
def test_chat_format_parses_a_call_an_answer_or_cut_text(text: str, expected: tuple[Any, Any]) -> None:
    assert chat_format.parse(text) == expected


def _step(seed: int, call: tuple[str, str] | None, result: str = "r", tokens: int = 10) -> dict[str, Any]:
    return {
        "seed": seed,
        "calls": [list(call)] if call else [],
        "results": [result] if call else [],
        "text": "",
        "prompt_tokens": tokens,
        "completion_tokens": 1,
        "finish": "",
        "error": "",
    }


def _episode(
    calls: list[tuple[str, str] | None], shas: list[str], actions: dict[int, list[Any]]
) -> dict[str, Any]:
    return {
        "steps": [_step(k, c) for k, c in enumerate(calls)],
        "upstream": [{"sha": s, "extends": True} for s in shas],
        "actions": [actions.get(k, []) for k in range(len(calls))],
        "solved": False,
        "max_steps": 6,
    }


LS, RD = ("list_files", "{}"), ("read_file", '{"path":"a"}')


def test_episode_figures_pair_the_first_intervention_with_the_direct_arm() -> None:
    direct = _episode([LS, LS, LS, RD, RD, RD], ["1", "2", "3", "4", "5", "6"], {})
    remind = [{"rule": "repeat_reminder", "kind": "remind", "tool": "list_files"}]
    stop = [{"rule": "stop", "kind": "stop", "tool": "list_files"}]
    arm = _episode([LS, LS, LS, LS, LS, None], ["1", "2", "3", "x", "y", "z"], {3: remind, 5: stop})
    f = episode_figures(arm, direct)
    assert {k: f[k] for k in ("looped", "loop_steps", "loop_tokens", "first_action", "rules")} == {
        "looped": True,
        "loop_steps": 5,
        "loop_tokens": 55,
        "first_action": 3,
        "rules": ["repeat_reminder/remind"],
    }
    assert (f["stopped"], f["broken"], f["identical_until"], f["paired"]) == (True, False, 3, True)
    # the direct arm moved on to read_file
    assert (f["primed"], f["unprimed"], f["primed_tool"]) == (True, False, True)
    d = episode_figures(direct, direct)
    assert (d["looped"], d["looped_to_cap"], d["primed"], d["acted"]) == (True, False, None, False)
    s = arm_summary([f, d])
    assert (s["looped"], s["primed"], s["compared"], s["stopped"], s["loop_steps"]) == (2, 1, 1, 1, 4.0)


def test_tools_really_run_in_the_repository(tmp_path: Path) -> None:
    task = TASKS[0]
    repo = make_repo(task, tmp_path)
    assert execute(repo, "list_files", "{}") == "README.md\ncalc.py\ntest.py"
    assert execute(repo, "read_file", '{"path": "calc.py"}') == task.files["calc.py"]
    assert (
        execute(repo, "read_file", '{"path": "../x"}')
        == "error: '../x' is not a file path inside the repository"
    )
    assert execute(repo, "run", '{"path": "test.py"}').endswith("\nAssertionError: -1\n")
    raising = "def add(a, b):\n    raise ValueError(a)\n"
    execute(repo, "write_file", json.dumps({"path": "calc.py", "content": raising}))
    failed = execute(repo, "run", '{"path": "test.py"}')
    # the temporary directory is left out: the same result in every arm's repository
    assert 'File "calc.py", line 2, in add' in failed and str(repo.resolve()) not in failed
    assert not solved(task, repo)
    fixed = task.files["calc.py"].replace("a - b", "a + b")
    assert execute(repo, "write_file", json.dumps({"path": "calc.py", "content": fixed})) == (
        f"wrote {len(fixed)} characters to calc.py"
    )
    assert execute(repo, "run", '{"path": "test.py"}') == "exit code 0\nOK: all tests passed\n"
    assert solved(task, repo)


SEED = 1000
STEPS = 8


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    if not llama_available(llama_python()):
        pytest.fail(
            "llama-cpp-python[server] is not installed: `pip install -e '.[test]'` installs it, "
            "or deselect these tests with -m 'not realmodel'"
        )
    from bench.recovery.runner import run_all

    work = tmp_path_factory.mktemp("recovery")
    return asyncio.run(
        run_all(["direct", "default"], episodes=2, seed=SEED, max_steps=STEPS, workdir=work, keep_repos=True)
    )


@pytest.mark.realmodel
def test_every_request_sends_its_step_seed_and_the_model_server_gets_it(bench_run: dict[str, Any]) -> None:
    for arm in ("direct", "default"):
        for rec in bench_run[arm]:
            want = [step_seed(SEED + rec["episode"], k) for k in range(len(rec["steps"]))]
            assert [s["seed"] for s in rec["steps"]] == want
            assert [u["seed"] for u in rec["upstream"]] == want
            assert rec["stream"] is (rec["episode"] == 1)


@pytest.mark.realmodel
def test_paired_arms_are_byte_identical_until_loopguards_first_action(bench_run: dict[str, Any]) -> None:
    for direct, arm in zip(bench_run["direct"], bench_run["default"], strict=True):
        f = episode_figures(arm, direct)
        assert arm["upstream"][0]["sha"] == direct["upstream"][0]["sha"]
        assert f["paired"] is True
        at = f["first_action"] if f["first_action"] is not None else len(arm["steps"])
        assert [s["calls"] for s in arm["steps"][:at]] == [s["calls"] for s in direct["steps"][:at]]


@pytest.mark.realmodel
def test_the_tools_really_ran_in_the_episodes_repositories(bench_run: dict[str, Any], tmp_path: Path) -> None:
    for rec in bench_run["direct"] + bench_run["default"]:
        task = next(t for t in TASKS if t.name == rec["task"])
        assert set(task.files) <= set(rec["files"])
        assert Path(rec["repo"], "test.py").is_file()
        replay = make_repo(task, tmp_path)
        for step in rec["steps"]:
            for (name, arguments), result in zip(step["calls"], step["results"], strict=True):
                assert execute(replay, name, arguments) == result


@pytest.mark.realmodel
def test_the_figures_of_the_seeded_run(bench_run: dict[str, Any]) -> None:
    direct = {r["episode"]: r for r in bench_run["direct"]}
    for rec in bench_run["direct"]:
        f = episode_figures(rec, rec)
        assert (f["acted"], f["extra_upstream"], f["prefix_breaks"], f["identical_until"]) == (
            False,
            0,
            0,
            None,
        )
        assert f["agent_requests"] == f["upstream_requests"] == len(rec["steps"])
    for rec in bench_run["default"]:
        f = episode_figures(rec, direct[rec["episode"]])
        assert rec["log_lines"] == len(rec["steps"])  # one loopguard log line per agent request
        assert f["extra_upstream"] == 0  # no re-sample or fallback in the defaults
        assert f["prefix_breaks"] == 0  # the default reminders keep every request's prefix
    # What SmolLM2-135M does with these seeds: every direct episode loops until the step cap; through
    # loopguard's defaults every one is reminded on its 4th request and stopped.
    figures = [episode_figures(r, r) for r in bench_run["direct"]]
    assert [(f["looped"], f["looped_to_cap"]) for f in figures] == [(True, True), (True, True)]
    figures = [episode_figures(r, direct[r["episode"]]) for r in bench_run["default"]]
    assert [(f["first_action"], f["rules"], f["stopped"]) for f in figures] == [
        (3, ["repeat_reminder/remind"], True),
        (3, ["repeat_reminder/remind"], True),
    ]


@pytest.mark.realmodel
def test_the_chat_format_samples_by_the_requests_seed(tmp_path: Path) -> None:
    """Same seed and messages: the same generation (the call id hashes the generated text), JSON
    and streamed alike; other seeds sample other generations."""
    from openai import OpenAI

    from bench.recovery.llama import MODEL_ALIAS, find_or_fetch_gguf, llama_server
    from bench.recovery.tools import TOOLS

    if not llama_available(llama_python()):
        pytest.fail("llama-cpp-python[server] is not installed")
    task = TASKS[0]
    messages = [{"role": "user", "content": task.prompt}]
    with llama_server(
        find_or_fetch_gguf(),
        llama_python(),
        chat_format=chat_format.FORMAT_NAME,
        log_path=tmp_path / "llama.log",
    ) as url:
        client = OpenAI(base_url=url, api_key="none", max_retries=0)
        kwargs: dict[str, Any] = {
            "model": MODEL_ALIAS,
            "messages": messages,
            "tools": TOOLS,
            "tool_choice": "required",  # always a call: its id hashes the generated text
            "temperature": 1.0,
        }

        def call_id(seed: int) -> str:
            msg = client.chat.completions.create(seed=seed, **kwargs).choices[0].message
            assert msg.tool_calls is not None and len(msg.tool_calls) == 1
            return msg.tool_calls[0].id

        def streamed_id(seed: int) -> str:
            chunks = list(client.chat.completions.create(seed=seed, stream=True, **kwargs))
            ids = [d.id for c in chunks for ch in c.choices for d in ch.delta.tool_calls or [] if d.id]
            assert chunks[-1].choices[0].finish_reason == "tool_calls" and chunks[-1].usage is not None
            return ids[0]

        first = call_id(1)
        assert call_id(1) == first == streamed_id(1)
        assert len({first, *(call_id(s) for s in range(2, 6))}) > 1
