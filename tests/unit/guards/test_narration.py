"""Narration (DESIGN §6.3) and the per-conversation state behind it (proxy.core.state, proxy.request.memory).

Requests go through the same pure pipeline the server runs (decide_request with the remembered
state, then Memory.commit) with an injected clock: no sockets, no sleeping."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.config import Config, build
from proxy.core.actions import Remind
from proxy.core.state import (
    MAX_NARRATIONS,
    MAX_TURNS,
    ConversationState,
    NarrationMark,
    StateStore,
    observe,
)
from proxy.dialects.openai_chat import parse_request
from proxy.guards import Context, build_guards
from proxy.guards.narration import Narration, duration, render
from proxy.request.conversation import key_digest
from proxy.request.memory import Memory
from proxy.request.rewrite import RequestDecision, decide_request
from tests.helpers.agent_steps import History
from tests.helpers.fakes import only_guard

T0 = 1_700_000_000_000  # the clock's epoch in these tests
S = 1000  # one second in ms


class Agent:
    """One conversation through the request pipeline, at chosen times (seconds after T0)."""

    def __init__(self, memory: Memory | None = None, **settings: Any) -> None:
        cfg = build(Config, only_guard("turn_guard", **settings))
        self.guards = build_guards(cfg.guards)
        self.memory = memory or Memory(self.guards)
        self.history = History()
        self.n = 0

    def send(self, at_s: float) -> RequestDecision:
        now = T0 + int(at_s * S)
        d = decide_request(
            self.history.body(),
            {"x-session-id": "s1"},
            self.guards,
            ("x-session-id",),
            now_ms=now,
            state_for=self.memory.state_for(now),
        )
        self.memory.commit(d, now)
        return d

    def work(self, at_s: float, text: str | None = None) -> RequestDecision:
        """The agent makes one more (distinct, successful) call and sends its result."""
        self.n += 1
        self.history.step(("read_file", {"path": f"src/m{self.n}.py"}, "ok"), text=text)
        return self.send(at_s)


def narrations(d: RequestDecision) -> list[Remind]:
    return [a for a in d.actions if isinstance(a, Remind) and a.rule == "narration"]


def fresh(d: RequestDecision) -> list[Remind]:
    return [a for a in narrations(d) if a.fresh]


def sent(d: RequestDecision) -> list[dict[str, Any]]:
    return orjson.loads(d.body)["messages"]


TEXT_3_MIN = (
    "[loopguard] You have been working for 3 minutes without a word to the user. Before your next "
    "tool call, tell the user in a sentence or two what you have done so far and what you will do next."
)


# --- the default times, to the second (DESIGN §6.3) -----------------------------------------------


def test_fires_at_exactly_180_s_of_silence_not_at_179() -> None:
    agent = Agent()
    agent.send(0)  # the user's prompt: the turn starts now
    assert narrations(agent.work(60)) == []
    assert narrations(agent.work(179)) == []
    d = agent.work(180)
    (r,) = narrations(d)
    end = agent.history.result_position(3)
    assert (r.after, r.fresh, r.text, r.count, r.limit, r.tool) == (
        end,
        True,
        TEXT_3_MIN,
        180,
        180,
        "read_file",
    )
    assert sent(d)[end + 1] == {"role": "user", "content": TEXT_3_MIN}
    assert len(sent(d)) == len(agent.history.messages) + 1


def test_not_again_before_240_s_since_the_previous_reminder() -> None:
    agent = Agent()
    agent.send(0)
    assert len(fresh(agent.work(180))) == 1
    assert fresh(agent.work(300)) == []
    assert fresh(agent.work(419)) == []
    d = agent.work(420)
    (r,) = fresh(d)
    assert r.text == render(420 * S)
    assert "working for 7 minutes" in r.text


def test_not_when_the_agent_spoke_10_s_ago() -> None:
    agent = Agent()
    agent.send(0)
    agent.work(170)
    # 200 s into the turn, but the text is first seen now: no reminder now, nor 10 s later
    assert narrations(agent.work(200, text="Found the bug in m2.py; fixing it now.")) == []
    assert narrations(agent.work(210)) == []
    assert narrations(agent.work(379)) == []
    (r,) = narrations(agent.work(380))  # 180 s after the text
    assert r.count == 180


def test_reinjected_at_the_same_position_on_later_requests() -> None:
    agent = Agent()
    agent.send(0)
    first = agent.work(180)
    end = agent.history.result_position(1)
    before = sent(first)
    for t in (200, 230, 260):
        d = agent.work(t)
        (r,) = narrations(d)
        assert (r.after, r.fresh, r.text) == (end, False, TEXT_3_MIN)
        assert sent(d)[: len(before)] == before  # each request extends the previous one
        before = sent(d)
    assert [m["content"] for m in before if m["role"] == "user"] == ["Fix the bug in fix.py", TEXT_3_MIN]


# --- timing details ---------------------------------------------------------------------------------


def test_a_retried_request_gets_the_same_bytes_and_no_second_reminder() -> None:
    agent = Agent()
    agent.send(0)
    d1 = agent.work(200)
    d2 = agent.send(205)  # the same history again
    assert d1.body == d2.body
    assert [a.fresh for a in narrations(d2)] == [False]
    assert len(agent.memory.store.get(key_digest("s1"), T0 + 205 * S).narrations) == 1


def test_a_new_user_message_restarts_the_silence_and_the_interval() -> None:
    agent = Agent()
    agent.send(0)
    assert len(fresh(agent.work(180))) == 1
    agent.history.user("also update the docs")
    agent.send(190)
    assert fresh(agent.work(300)) == []  # 110 s into the new turn
    (r,) = fresh(agent.work(370))  # 180 s into it; the old turn's reminder does not delay it
    assert r.count == 180
    assert len(narrations(agent.work(380))) == 2  # both re-injected


def test_restart_forgets_timing_and_earlier_reminders() -> None:
    agent = Agent()
    agent.send(0)
    assert len(fresh(agent.work(180))) == 1
    agent.memory = Memory(agent.guards)  # a restarted proxy
    assert narrations(agent.work(200)) == []  # first seen now: silence starts over
    assert narrations(agent.work(379)) == []
    assert len(fresh(agent.work(380))) == 1


def test_custom_times() -> None:
    agent = Agent(narrate_after_ms=5000, narrate_every_ms=0)
    agent.send(0)
    assert fresh(agent.work(4.999)) == []
    (r,) = fresh(agent.work(5))
    assert "working for 5 seconds" in r.text
    assert len(fresh(agent.work(5.001))) == 1  # every 0 ms: every new step once silence has lasted


def test_narration_off_with_zero() -> None:
    agent = Agent(narrate_after_ms=0)
    agent.send(0)
    assert narrations(agent.work(10_000)) == []
    assert not any(isinstance(g, Narration) for g in agent.guards)


def test_no_reminder_without_results_of_the_newest_step() -> None:
    agent = Agent()
    agent.send(0)
    agent.history.step(("read_file", {"path": "x"}, None))
    assert narrations(agent.send(500)) == []


def test_turn_guard_off_remembers_nothing() -> None:
    guards = build_guards(Config().guards)
    memory = Memory(guards)
    assert memory.state_for(T0) is None
    d = decide_request(History().steps([("read_file", {"path": "a"}, "ok")]).body(), {}, guards, ())
    memory.commit(d, T0)
    assert len(memory.store) == 0
    assert memory.view(d.conversation, T0) is None


def test_stored_marks_are_only_reinjected_where_the_same_call_still_answers() -> None:
    h = History().steps([("read_file", {"path": "a"}, "ok"), ("read_file", {"path": "b"}, "ok")])
    t = parse_request({"messages": h.messages})
    end = h.result_position(1)
    marks = (NarrationMark(end, "c1", T0, 200 * S), NarrationMark(end + 2, "other-id", T0, 200 * S))
    state = ConversationState(turns={0: T0}, narrations=marks, seen_ms=T0)
    guard = Narration(build(Config, only_guard("turn_guard")).guards.turn_guard)
    actions = guard(t, Context("k", T0 + 10 * S, state))
    assert [(a.after, a.fresh) for a in actions] == [(end, False)]


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0 seconds"),
        (1_000, "1 second"),
        (59_999, "59 seconds"),
        (60_000, "1 minute"),
        (185_000, "3 minutes"),
    ],
)
def test_duration_in_words(ms: int, text: str) -> None:
    assert duration(ms) == text


# --- the state store ----------------------------------------------------------------------------------


def test_observe_keeps_first_seen_times() -> None:
    h = History().steps([("read_file", {"path": "a"}, "ok")])
    s1 = observe(None, parse_request({"messages": h.messages}), 100)
    h.say("done with a").user("now b")
    s2 = observe(s1, parse_request({"messages": h.messages}), 200)
    h.step(("read_file", {"path": "b"}, "ok"), text="reading b")
    s3 = observe(s2, parse_request({"messages": h.messages}), 300)
    s4 = observe(s3, parse_request({"messages": h.messages}), 400)
    h.step(("read_file", {"path": "c"}, "ok"), text="reading c")
    s5 = observe(s4, parse_request({"messages": h.messages}), 500)
    assert s1.turns == {0: 100} and s1.texts == {}
    assert s2.turns == {0: 100, 4: 200} and s2.texts == {}  # "done with a" belongs to turn 1
    assert s3.turns == {0: 100, 4: 200} and s3.texts == {5: 300}
    assert s4.texts == {5: 300}  # first seen at 300, still
    assert s5.texts == {7: 500}  # only the last text matters


def test_observe_bounds_turns_and_marks() -> None:
    state = ConversationState()
    h = History()
    for i in range(MAX_TURNS + 4):
        h.user(f"turn {i}")
        state = observe(state, parse_request({"messages": h.messages}), i)
    assert sorted(state.turns) == list(range(4 + 1, MAX_TURNS + 4 + 1))
    marks = [NarrationMark(i, None, i, 0) for i in range(MAX_NARRATIONS + 3)]
    state = observe(state, parse_request({"messages": h.messages}), 0, marks)
    assert [m.after for m in state.narrations] == list(range(3, MAX_NARRATIONS + 3))


def test_store_drops_the_least_recently_used_beyond_its_size() -> None:
    store = StateStore(max_conversations=2, ttl_ms=10**9)
    for key in ("a", "b"):
        store.put(key, ConversationState(seen_ms=1))
    assert store.get("a", 2) is not None  # "a" is now the most recently used
    store.put("c", ConversationState(seen_ms=3))
    assert (store.get("a", 4) is not None, store.get("b", 4), store.get("c", 4) is not None) == (
        True,
        None,
        True,
    )
    assert len(store) == 2


def test_store_forgets_after_the_ttl() -> None:
    store = StateStore(ttl_ms=1000)
    store.put("a", ConversationState(seen_ms=0))
    store.put("b", ConversationState(seen_ms=500))
    assert store.get("a", 1000) is not None  # exactly the TTL: still there
    assert store.get("a", 1001) is None
    assert len(store) == 1
    store.put("c", ConversationState(seen_ms=1501))  # puts sweep expired ones at the old end
    assert len(store) == 1


def test_store_defaults_are_the_documented_limits() -> None:
    store = StateStore()
    assert (store.max_conversations, store.ttl_ms) == (10_000, 24 * 60 * 60 * 1000)
