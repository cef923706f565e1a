"""The server's per-conversation memory around the request-side decision (DESIGN §1.2: time
is one of the few things that needs state, and the turn guard and narration read it).

The glue between :mod:`proxy.core.state` (the bounded store) and the guards that need it, kept out of
the server's request handler:

- before the guards run, :meth:`Memory.state_for` gives ``decide_request`` a read-only lookup of
  the conversation's snapshot (for ``Context.state``);
- after they ran, :meth:`Memory.commit` stores what this request showed: first-seen times, the
  fresh narration reminders and the turn guard's ledger of the current turn;
- :meth:`Memory.view` is the JSON of ``GET /loop-guard?conversation=KEY``.

Only conversations the turn guard sees are remembered: with ``guards.turn_guard.enabled: false``
nothing is stored and every lookup is None.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from proxy.core.clock import iso_utc
from proxy.core.state import ConversationState, StateStore, observe
from proxy.dialects import jsonbody
from proxy.guards import Guard
from proxy.guards.narration import marks
from proxy.guards.turn_guard import LIMIT_KEYS, TurnGuard
from proxy.request.rewrite import RequestDecision


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class Memory:
    """``Memory(guards)``: remembers conversations when ``guards`` include a turn guard.

    ``clock``: the time in ms since the epoch for the server's decisions (wall clock; tests
    replace it)."""

    __slots__ = ("_turn", "clock", "store")

    def __init__(
        self,
        guards: Sequence[Guard],
        store: StateStore | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self._turn = next((g for g in guards if isinstance(g, TurnGuard)), None)
        self.store = store if store is not None else StateStore()
        self.clock: Callable[[], int] = clock or wall_clock_ms

    @property
    def enabled(self) -> bool:
        return self._turn is not None

    def state_for(self, now_ms: int) -> Callable[[str], ConversationState | None] | None:
        """The lookup to pass to ``decide_request`` (None when nothing is remembered)."""
        if self._turn is None:
            return None
        store = self.store
        return lambda key: store.get(key, now_ms)

    def commit(self, decision: RequestDecision, now_ms: int) -> None:
        """Remember what the request behind ``decision`` showed, at ``now_ms``."""
        if self._turn is None or decision.transcript is None or not decision.conversation:
            return
        transcript = decision.transcript
        key = decision.conversation
        new = observe(
            self.store.get(key, now_ms),
            transcript,
            now_ms,
            marks(decision.actions, transcript, now_ms),
            jsonbody.kept(orjson.dumps(self._turn.ledger(transcript).summary())),  # stored: own size
        )
        self.store.put(key, new)

    def view(self, key: str, now_ms: int) -> dict[str, Any] | None:
        """The ledger of ``key``'s current turn as of its most recent request, with narration
        timing; None when the conversation is unknown, expired, or nothing is remembered."""
        if self._turn is None:
            return None
        state = self.store.get(key, now_ms)
        if state is None or state.ledger is None:
            return None
        cfg = self._turn.config
        start = max(state.turns) if state.turns else -1
        started = state.turns.get(start, state.seen_ms)
        silent_since = max([started, *state.texts.values()])
        recent = [m for m in state.narrations if m.after > start]
        last = recent[-1] if recent else None
        return {
            "conversation": key,
            "last_request": iso_utc(state.seen_ms),
            **orjson.loads(state.ledger),
            "limits": {name: getattr(cfg, name) for name in LIMIT_KEYS.values()},
            "narration": {
                "turn_started": iso_utc(started),
                "silent_since": iso_utc(silent_since),
                "reminders": len(recent),
                "last": None
                if last is None
                else {"time": iso_utc(last.at_ms), "after": last.after, "silent_s": last.silent_ms // 1000},
            },
        }
