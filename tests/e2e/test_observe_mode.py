"""Observe mode end to end: the real server in front of a fake model that loops.

With ``mode: observe`` the upstream receives exactly the bytes the agent sent and the agent
exactly the bytes the upstream answered (JSON and SSE), while every action is still decided,
logged (``"mode": "observe"`` in the request line), counted (``per_rule``, ``observed``,
``loopguard_actions_total{mode="observe"}``) and recorded in the incident log, the same actions
as enforce mode takes on the same requests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy.edge.observe import configure_logging
from tests.helpers.fake_responses import FakeResponses, function_call
from tests.helpers.fakes import FakeUpstream, completion, sse_events, tool_call
from tests.helpers.proxy_server import serve

CHAT = "/v1/chat/completions"
STEPS = 12


class LoopingModel:
    """Answers every request with one call (``read_file {"path": "app.py"}`` unless told; id by
    step) and keeps the exact bytes of every answer it sent."""

    def __init__(self, name: str = "read_file", arguments: str = '{"path": "app.py"}') -> None:
        self.sent: list[bytes] = []
        self.name = name
        self.arguments = arguments

    async def __call__(self, request: web.Request, body: bytes) -> web.StreamResponse:
        req = orjson.loads(body)
        n = sum(1 for m in req["messages"] if m.get("role") == "assistant")
        calls = [tool_call(self.name, self.arguments, f"call_{n + 1}")]
        if req.get("stream"):
            events = sse_events(calls)
            self.sent.append(b"".join(events))
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for e in events:
                await resp.write(e)
            await resp.write_eof()
            return resp
        raw = orjson.dumps(completion(calls))
        self.sent.append(raw)
        return web.Response(body=raw, content_type="application/json")


def answer_message(raw: bytes, stream: bool) -> dict[str, Any]:
    """The assistant message of an answer as the agent got it (SSE assembled the simple way)."""
    if not stream:
        return orjson.loads(raw)["choices"][0]["message"]
    content, calls = "", {}
    for line in raw.split(b"\n\n"):
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        delta = orjson.loads(line[6:])["choices"][0]["delta"]
        content += delta.get("content") or ""
        for tc in delta.get("tool_calls") or []:
            c = calls.setdefault(
                tc["index"], {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
            )
            c["id"] = tc.get("id") or c["id"]
            fn = tc.get("function") or {}
            c["function"]["name"] += fn.get("name") or ""
            c["function"]["arguments"] += fn.get("arguments") or ""
    msg: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
    return msg


async def run_agent(base: str, stream: bool, steps: int = STEPS) -> tuple[list[bytes], list[bytes]]:
    """A naive agent: runs every call it gets (the result is always the same), ``steps`` times or
    until an answer without calls. Returns the request bodies it sent and the answers it got."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the bug in app.py"},
    ]
    sent: list[bytes] = []
    got: list[bytes] = []
    async with aiohttp.ClientSession(auto_decompress=False) as s:
        for _ in range(steps):
            body = orjson.dumps({"model": "m", "messages": messages, "stream": stream})
            sent.append(body)
            async with s.post(f"{base}{CHAT}", data=body, headers={"Content-Type": "application/json"}) as r:
                assert r.status == 200
                raw = await r.read()
            got.append(raw)
            msg = answer_message(raw, stream)
            messages.append(msg)
            if not msg.get("tool_calls"):
                break
            for tc in msg["tool_calls"]:
                messages.append({"role": "tool", "tool_call_id": tc["id"], "content": "print('hi')\n"})
    return sent, got


def request_lines(err: str) -> list[dict[str, Any]]:
    lines = [orjson.loads(line) for line in err.splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == "request"]


def actions_of(lines: list[dict[str, Any]]) -> list[list[tuple[str, str, str]]]:
    """Per request, its fresh actions as (rule, kind, mode)."""
    return [[(a["rule"], a["kind"], a.get("mode", "enforce")) for a in line["actions"]] for line in lines]


async def _run(upstream: FakeUpstream, config: dict[str, Any], stream: bool, capsys: Any) -> dict[str, Any]:
    model = LoopingModel()
    upstream.handler = model
    configure_logging("info")
    capsys.readouterr()
    async with serve(config, upstream.url) as (base, _app), aiohttp.ClientSession() as s:
        sent, got = await run_agent(base, stream)
        async with s.get(f"{base}/loop-guard") as r:
            stats = await r.json()
        async with s.get(f"{base}/loop-guard/metrics") as r:
            metrics = await r.text()
    lines = request_lines(capsys.readouterr().err)
    return {"model": model, "sent": sent, "got": got, "stats": stats, "metrics": metrics, "lines": lines}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_observe_mode_changes_no_byte_yet_logs_counts_and_records_what_enforce_does(
    upstream: FakeUpstream, tmp_path: Path, stream: bool, capsys: Any
) -> None:
    incidents = tmp_path / "incidents.jsonl"
    config = {"mode": "observe", "guards": {"circuit_breaker": {"incident_log": str(incidents)}}}
    run = await _run(upstream, config, stream, capsys)

    # nothing changed: every body upstream is the agent's, every answer the model's, byte for byte
    assert len(run["sent"]) == STEPS
    assert [r.body for r in upstream.requests] == run["sent"]
    assert run["got"] == run["model"].sent
    # ... yet the actions were decided: the same as enforce mode on the same requests, up to the
    # request enforce mode stopped (after which its agent's history differs)
    observed = actions_of(run["lines"])
    assert len(observed) == STEPS
    assert all(mode == "observe" for acts in observed for (_, _, mode) in acts)
    upstream.requests.clear()
    enforced = actions_of((await _run(upstream, {}, stream, capsys))["lines"])
    stop_at = next(i for i, acts in enumerate(enforced) if any(k == "stop" for (_, k, _) in acts))
    assert [[(r, k) for (r, k, _) in a] for a in observed[: stop_at + 1]] == [
        [(r, k) for (r, k, _) in a] for a in enforced[: stop_at + 1]
    ]
    remind, withhold = ("repeat_reminder", "remind"), ("circuit_breaker", "withhold")
    ladder, stop = ("escalation", "withhold"), ("stop", "stop")
    assert [[(r, k) for (r, k, _) in a] for a in observed] == [
        [], [], [], [remind], [], [remind], [ladder, stop], [withhold, ladder, stop],
        [remind, withhold, ladder, stop], [withhold, ladder, stop], [withhold, ladder, stop],
        [withhold, ladder, stop],
    ]  # fmt: skip
    flat = [(r, k) for acts in observed for (r, k, _) in acts]
    assert ("repeat_reminder", "remind") in flat
    assert ("circuit_breaker", "withhold") in flat
    assert ("stop", "stop") in flat
    # counted: per_rule counts every decision, the applied counters none, "observed" per kind
    stats = run["stats"]
    assert stats["rewritten_requests"] == 0
    assert (stats["reminders_injected"], stats["results_withheld"], stats["stops"]) == (0, 0, 0)
    total = sum(len(a) for a in observed)
    assert sum(stats["per_rule"].values()) == total
    assert stats["observed_per_rule"] == stats["per_rule"]
    assert stats["observed"]["remind"] == sum(1 for r, k in flat if k == "remind")
    assert stats["observed"]["withhold"] == sum(1 for r, k in flat if k == "withhold")
    assert stats["observed"]["stop"] == sum(1 for r, k in flat if k == "stop")
    assert 'loopguard_actions_total{kind="remind",mode="observe",rule="repeat_reminder"}' in run["metrics"]
    assert 'mode="enforce"' not in run["metrics"]
    # recorded: one incident per kind, marked observed
    records = [orjson.loads(line) for line in incidents.read_bytes().splitlines()]
    assert [(r["kind"], r["mode"]) for r in records] == [("stop", "observe"), ("duplicate", "observe")]
    assert [(i["kind"], i["mode"]) for i in stats["incidents"]] == [
        ("stop", "observe"),
        ("duplicate", "observe"),
    ]


async def test_one_guard_observed_the_others_enforced(upstream: FakeUpstream, capsys: Any) -> None:
    """``guards.repeat_reminder.mode: observe``: its reminders are logged as observed and never
    reach the upstream, while the circuit breaker still withholds (applied)."""
    config = {"guards": {"repeat_reminder": {"mode": "observe"}}, "stop": {"after_ignored_denials": 0}}
    run = await _run(upstream, config, False, capsys)
    acts = [a for line in actions_of(run["lines"]) for a in line]
    assert {m for (r, _, m) in acts if r == "repeat_reminder"} == {"observe"}
    assert {m for (r, _, m) in acts if r != "repeat_reminder"} == {"enforce"}
    assert ("circuit_breaker", "withhold", "enforce") in acts
    assert run["stats"]["observed_per_rule"] == {"repeat_reminder": 3}
    bodies = [r.json() for r in upstream.requests]
    texts = [str(m.get("content")) for b in bodies for m in b["messages"]]
    assert not any("called read_file" in t and "in a row" in t for t in texts if t.startswith("[loopguard]"))
    assert any("withheld" in t for t in texts)


@pytest.mark.parametrize(
    ("config", "observed"),
    [
        (
            {"mode": "observe"},
            "circuit_breaker collapse cycles degenerate_text echo_loop escalation monologue "
            "narration recurrence repair_text_tool_calls repeat_reminder repeated_failure runaway "
            "same_target stop turn_guard waiting",
        ),
        ({"guards": {"cycles": {"mode": "observe"}}}, "cycles"),
        ({"guards": {"turn_guard": {"mode": "observe"}}}, "narration turn_guard"),
        ({"stop": {"mode": "observe"}}, "stop"),
        ({"response": {"mode": "observe"}}, "degenerate_text repair_text_tool_calls runaway"),
        ({}, ""),
    ],
)
def test_observed_rules_per_section(config: dict[str, Any], observed: str) -> None:
    from proxy.config import Config, build

    assert " ".join(sorted(build(Config, config).observed_rules())) == observed


async def test_an_enforced_stop_counts_only_applied_withholds(upstream: FakeUpstream, capsys: Any) -> None:
    """Circuit breaker observed, stop enforced: no result was withheld from the model, so the
    denials stop never fires for real; the stop enforcing both would make is reported observed,
    and no byte changes."""
    config = {"guards": {"circuit_breaker": {"mode": "observe"}, "escalation": {"enabled": False}}}
    run = await _run(upstream, config, False, capsys)
    assert len(run["sent"]) == STEPS  # never stopped
    assert not any(b"result of this call is withheld" in r.body for r in upstream.requests)
    acts = [a for line in actions_of(run["lines"]) for a in line]
    assert {m for (r, _, m) in acts if r in ("circuit_breaker", "stop")} == {"observe"}
    assert ("stop", "stop", "observe") in acts
    assert run["stats"]["stops"] == 0


async def test_an_enforced_ladder_never_counts_observed_reminders(
    upstream: FakeUpstream, capsys: Any
) -> None:
    """Every reminder rule observed, the escalation ladder enforced: the model was given no
    reminder, so the ladder (which withholds "after 2 reminders") never acts."""
    observe = {"mode": "observe"}
    reminders = ("repeat_reminder", "recurrence", "cycles", "repeated_failure", "monologue", "echo_loop")
    config = {
        "guards": {
            **{g: dict(observe) for g in (*reminders, "same_target")},
            "circuit_breaker": {"enabled": False},
        }
    }
    run = await _run(upstream, config, False, capsys)
    acts = [a for line in actions_of(run["lines"]) for a in line]
    assert ("repeat_reminder", "remind", "observe") in acts
    assert not [a for a in acts if a[0] == "escalation"]
    assert [r.body for r in upstream.requests] == run["sent"]
    # with the reminders enforced, the same ladder acts
    upstream.requests.clear()
    enforced = await _run(upstream, {"guards": {"circuit_breaker": {"enabled": False}}}, False, capsys)
    assert ("escalation", "withhold", "enforce") in [
        a for line in actions_of(enforced["lines"]) for a in line
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_observe_mode_on_the_responses_api(
    upstream: FakeUpstream, stream: bool, capsys: Any, tmp_path: Path
) -> None:
    """The Responses dialect, whole input every request: byte-identical both ways, actions
    observed; its capture replays to the same request-side actions (Responses answers are not
    captured, so the stops are not replayed)."""
    from proxy.cli.replay import load, replay
    from proxy.config import Config, build

    capture = tmp_path / "capture.jsonl"
    config = {"mode": "observe", "capture": {"path": str(capture)}}
    fake = FakeResponses(lambda n, body: [function_call("read_file", '{"path": "app.py"}', f"call_{n + 1}")])
    upstream.handler = fake.handle
    configure_logging("info")
    capsys.readouterr()
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "Fix the bug in app.py"}]
    sent: list[bytes] = []
    got: list[bytes] = []
    async with serve(config, upstream.url) as (base, _app), aiohttp.ClientSession() as s:
        for _ in range(STEPS):
            body = orjson.dumps({"model": "m", "input": items, "stream": stream})
            sent.append(body)
            async with s.post(
                f"{base}/v1/responses", data=body, headers={"Content-Type": "application/json"}
            ) as r:
                assert r.status == 200
                got.append(await r.read())
            call = {"type": "function_call", "call_id": f"call_{len(sent)}", "name": "read_file",
                    "arguments": '{"path": "app.py"}'}  # fmt: skip
            items = [
                *items,
                call,
                {"type": "function_call_output", "call_id": call["call_id"], "output": "x"},
            ]
    assert [r.body for r in upstream.requests] == sent
    assert got == fake.answers
    per_request = actions_of(request_lines(capsys.readouterr().err))
    acts = [a for line in per_request for a in line]
    assert ("circuit_breaker", "withhold", "observe") in acts
    assert ("stop", "stop", "observe") in acts
    assert {m for (_, _, m) in acts} == {"observe"}
    (conv,) = load([capture])
    result = replay(conv, build(Config, config))
    replayed: list[list[tuple[str, str, str]]] = [[] for _ in per_request]
    for a in result.acts:
        replayed[a.exchange].append((a.rule, a.kind, a.mode))
    assert [sorted(r) for r in replayed] == [
        sorted(a for a in line if a[0] != "stop") for line in per_request
    ]
