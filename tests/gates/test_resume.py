"""Guards that resume from a kept state (:mod:`proxy.guards.resume`) decide exactly what
the whole-transcript run decides.

Every conversation is replayed a request at a time (the history before each assistant message, as
an agent sends it), in chat, Responses and Messages form: each request's transcript is evaluated
once over the whole transcript (:func:`proxy.guards.evaluate`) and once resumed from the previous
request's checkpoint (:func:`proxy.guards.resume.evaluate_from`); the actions must be equal, in
order. Under the shipped defaults, with every guard on, and with rules observed (escalation then
reads the observed reminders). The conversations: every loop fixture, every recorded real run
(``$LOOPGUARD_REALTRAJ``), and random ones from hypothesis.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings

from proxy.config import Config, build
from proxy.core.effects import progress_rules
from proxy.dialects import Dialect, anthropic_messages, openai_chat, openai_responses
from proxy.guards import Context, Guard, build_guards, evaluate
from proxy.guards.narration import Narration
from proxy.guards.resume import Checkpoint, cut, evaluate_from, resumable
from proxy.request.prefix_cache import PrefixCache
from proxy.request.rewrite import decide_request
from proxy.response.assemble import AssembledCall
from proxy.response.decide import deciders
from tests.helpers import messages_blocks, realtraj, responses_items
from tests.helpers.corpus import default_config, load_fixtures
from tests.unit.request.test_prefix_cache import _ends, conversations


def _config(every: bool, observe: Sequence[str] = ()) -> Config:
    raw = copy.deepcopy(default_config())
    for name, section in raw.get("guards", {}).items():
        if every and isinstance(section, dict) and "enabled" in section:
            section["enabled"] = True
        if name in observe:
            section["mode"] = "observe"
    return build(Config, raw)


def _guards(cfg: Config) -> tuple[Guard, ...]:
    p = cfg.progress
    return build_guards(cfg.guards, *progress_rules(p))


DEFAULTS = _guards(_config(False))
EVERY = _guards(_config(True))
SETUPS: dict[str, tuple[tuple[Guard, ...], frozenset[str]]] = {
    "defaults": (DEFAULTS, frozenset()),
    "every": (EVERY, frozenset()),
    "observed": (EVERY, frozenset({"repeat_reminder", "same_target"})),
}
MOST = {"loops": 200, "realtraj": 40}


def _bodies(messages: list[dict[str, Any]], tools: Any, wire: str, most: int) -> tuple[list[Any], Dialect]:
    ends = _ends(messages, most)
    if wire == "chat":
        extra = {"tools": tools} if tools else {}
        return [{"model": "m", "messages": messages[:i], **extra} for i in ends], openai_chat  # type: ignore[return-value]
    if wire == "responses":
        traced = responses_items.trace_items(messages)
        return [traced.body(i) for i in ends], openai_responses  # type: ignore[return-value]
    traced_m = messages_blocks.trace_blocks(messages)
    return [traced_m.body(i) for i in ends], anthropic_messages  # type: ignore[return-value]


def replay(
    bodies: Sequence[Any], dialect: Dialect, guards: tuple[Guard, ...], observed: frozenset[str]
) -> int:
    """Evaluate every request both ways, the checkpoints chained; assert equal. Returns how many
    requests resumed from a checkpoint."""
    kept: Checkpoint | None = None
    resumed = 0
    for i, body in enumerate(bodies):
        t = dialect.parse_request(body)
        ctx = Context(conversation="c")
        want = evaluate(t, guards, ctx, observed)
        got, made = evaluate_from(t, guards, ctx, observed, kept)
        resumed += kept is not None and kept.fits(guards, observed, cut(t))
        if got != want:
            pairs = enumerate(zip(got, want, strict=False))
            first = next((k for k, (a, b) in pairs if a != b), min(len(got), len(want)))
            pytest.fail(
                f"request {i} ({t.message_count} messages): resumed actions differ at {first}: "
                f"{got[first : first + 1]} vs {want[first : first + 1]} ({len(got)} vs {len(want)})"
            )
        kept = made
    return resumed


def _conversations() -> list[tuple[str, list[dict[str, Any]], Any]]:
    out = [(f"loops/{f['id']}", f["messages"], f.get("tools")) for f in load_fixtures()]
    out += [(f"realtraj/{r['id']}", r["messages"], r.get("tools")) for r in realtraj.load_runs()]
    return out


CONVERSATIONS = _conversations()


@pytest.mark.parametrize(("name", "messages", "tools"), CONVERSATIONS, ids=[c[0] for c in CONVERSATIONS])
@pytest.mark.parametrize("setup", list(SETUPS))
@pytest.mark.parametrize("wire", ["chat", "responses", "messages"])
def test_resumed_guards_decide_what_the_whole_run_decides(
    name: str, messages: list[dict[str, Any]], tools: Any, setup: str, wire: str
) -> None:
    if name.startswith("realtraj/") and wire != "chat" and setup != "defaults":
        pytest.skip("the real runs are replayed in every form under the defaults, in chat under all")
    guards, observed = SETUPS[setup]
    bodies, dialect = _bodies(messages, tools, wire, MOST[name.split("/")[0]])
    resumed = replay(bodies, dialect, guards, observed)
    steps = [dialect.parse_request(b).steps for b in bodies]
    # every request after the first with a step resumes
    first = next((k for k, s in enumerate(steps) if s), len(steps))
    assert resumed == max(0, len(bodies) - first - 1)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations())
def test_random_conversations_resume_to_the_same_actions(messages: list[dict[str, Any]]) -> None:
    for guards, observed in SETUPS.values():
        bodies, dialect = _bodies(messages, None, "chat", 10_000)
        replay(bodies, dialect, guards, observed)


def test_every_guard_but_narration_resumes() -> None:
    assert [g.name for g in EVERY if not resumable(g)] == [g.name for g in EVERY if isinstance(g, Narration)]


def test_a_checkpoint_fits_only_the_same_guards_observed_rules_and_a_later_cut() -> None:
    cp = Checkpoint(DEFAULTS, frozenset(), 10, tuple(None for _ in DEFAULTS), tuple(() for _ in DEFAULTS))
    assert cp.fits(DEFAULTS, frozenset(), 10)
    assert cp.fits(DEFAULTS, set(), 25)
    assert not cp.fits(DEFAULTS, frozenset(), 9)  # an earlier cut: a shorter or other history
    assert not cp.fits(DEFAULTS, frozenset(), None)
    assert not cp.fits(_guards(_config(False)), frozenset(), 10)  # a reload builds new guards
    assert not cp.fits(DEFAULTS, frozenset({"cycles"}), 10)


# --- the response-side stop judge resumes from the request's checkpoint -------------------------


def _answers(messages: list[dict[str, Any]]) -> list[tuple[int, list[AssembledCall], str]]:
    """Every assistant message with tool calls: (its index, its calls as the answer side
    assembles them, its text)."""
    out = []
    for i, m in enumerate(messages):
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = [
                AssembledCall(c.get("id"), c["function"]["name"], c["function"].get("arguments") or "")
                for c in m["tool_calls"]
            ]
            out.append((i, calls, m.get("content") if isinstance(m.get("content"), str) else ""))
    return out


JUDGE_SETUPS = {
    "defaults": _config(False),
    "every": _config(True),
    "observed": _config(True, observe=("repeat_reminder", "same_target")),
    "all observed": build(Config, {**copy.deepcopy(default_config()), "mode": "observe"}),
}


@pytest.mark.parametrize(("name", "messages", "tools"), CONVERSATIONS, ids=[c[0] for c in CONVERSATIONS])
@pytest.mark.parametrize("setup", list(JUDGE_SETUPS))
def test_the_stop_judge_resumed_from_the_request_stops_where_the_whole_run_stops(
    name: str, messages: list[dict[str, Any]], tools: Any, setup: str
) -> None:
    cfg = JUDGE_SETUPS[setup]
    guards = _guards(cfg)
    cache = PrefixCache(1 << 30)
    answers = _answers(messages)
    if name.startswith("realtraj/"):
        answers = answers[:: max(1, len(answers) // 40)]
    judged = stopped = 0
    for i, calls, text in answers:
        raw = orjson.dumps({"model": "m", "messages": messages[:i], **({"tools": tools} if tools else {})})
        decision = decide_request(
            raw,
            {"x-session-id": "s"},
            guards,
            ("x-session-id",),
            prefixes=cache,
            observed=cfg.observed_rules(),
        )
        if decision.transcript is None:
            continue
        ctx = Context(conversation=decision.conversation)
        resumed = deciders(decision.transcript, decision.actions, guards, ctx, cfg, decision.checkpoint)
        whole = deciders(decision.transcript, decision.actions, guards, ctx, cfg)
        for a, b in ((resumed.judge, whole.judge), (resumed.shadow_judge, whole.shadow_judge)):
            assert (a is None) == (b is None)
            if a is not None and b is not None:
                got, want = a(calls, text), b(calls, text)
                assert got == want, f"answer at message {i}: {got} vs {want}"
                judged += 1
                stopped += want is not None
    assert judged >= 1 or not answers
