"""Per-conversation memory for what a history cannot tell: time (DESIGN §1.2, §4, §6.3).

Decisions are a pure function of the history, except narration, which needs to know *when* the
proxy first saw a turn and an assistant text, and where it already injected narration reminders.
This module holds that, keyed by the conversation key (DESIGN §4):

- :class:`ConversationState`: an immutable snapshot of one conversation. The server reads it
  before the guards run and hands it to them in ``Context.state``; guards never write.
- :func:`observe`: the pure successor of a snapshot after one request (the current turn's
  first-seen time, the first-seen time of the turn's last assistant text, new narration marks,
  the turn-guard ledger summary for ``GET /loop-guard?conversation=``).
- :class:`StateStore`: the bounded in-memory store. Limits: at most :data:`MAX_CONVERSATIONS`
  conversations and :data:`MAX_BYTES` in all (:func:`state_size`; the ledger names call targets
  an agent chooses and can be large), least recently used dropped first (a conversation alone
  over the budget is not kept), and :data:`TTL_MS` since a conversation's last request; keys
  are fixed-size digests (:func:`proxy.request.conversation.key_digest`). Per conversation, the
  first-seen times of the newest :data:`MAX_TURNS` turns and the newest :data:`MAX_NARRATIONS`
  narration marks (older marks are no longer re-injected; 32 marks are over two hours of silent
  work at the default 240 s). Measured: a conversation costs about 3 KB, at most about 10 KB
  with all 32 marks, so a full store stays around 30 MB and under 100 MB.

Nothing here survives a restart: narration timing then starts over, and narration reminders
injected before the restart are not re-injected (the upstream's prefix cache is invalidated once
for that conversation). Every other decision is unaffected. Times are ms since the epoch, always
passed in by the caller (tests inject a clock). Not thread-safe: the server uses it from its event
loop only, reading and committing without awaiting in between.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from proxy.core.transcript import Transcript

MAX_CONVERSATIONS = 10_000
TTL_MS = 24 * 60 * 60 * 1000
MAX_TURNS = 16
MAX_NARRATIONS = 32
#: The bytes :func:`state_size` may count over all conversations held.
MAX_BYTES = 64 * 1024 * 1024
#: What :func:`state_size` counts for a conversation's containers (its dataclass, dicts and the
#: store's entry), and for each of its times and narration marks: bytes, a rough estimate of
#: CPython's share (the measured 3 KB a conversation costs is mostly its ledger).
ENTRY_OVERHEAD = 600
TIME_BYTES = 120
MARK_BYTES = 200


@dataclass(frozen=True, slots=True)
class NarrationMark:
    """A narration reminder injected after message ``after`` (the last tool result of a step,
    answering call ``call_id``), at ``at_ms``, reporting ``silent_ms`` of silence."""

    after: int
    call_id: str | None
    at_ms: int
    silent_ms: int


@dataclass(frozen=True, slots=True)
class ConversationState:
    """What the proxy remembers of one conversation. Read-only by convention: :func:`observe`
    builds a new one instead of changing this one.

    ``turns``: turn start position (index of the user message; -1 before the first) → first-seen
    ms. ``texts``: position of the current turn's last assistant text → first-seen ms (earlier
    texts no longer matter: silence runs from the last one).
    ``narrations``: injected narration reminders, oldest first. ``ledger``: the turn guard's
    summary of the current turn as compact JSON (bytes are a tenth of the size of the dicts).
    ``seen_ms``: time of the last request."""

    turns: Mapping[int, int] = field(default_factory=dict)
    texts: Mapping[int, int] = field(default_factory=dict)
    narrations: tuple[NarrationMark, ...] = ()
    ledger: bytes | None = None
    seen_ms: int = 0


def turn_start(transcript: Transcript) -> int:
    """Position of the user message that starts the current turn, -1 when there is none."""
    return transcript.user_positions[-1] if transcript.user_positions else -1


def observe(
    prev: ConversationState | None,
    transcript: Transcript,
    now_ms: int,
    marks: Iterable[NarrationMark] = (),
    ledger: bytes | None = None,
) -> ConversationState:
    """The state after a request carrying ``transcript`` at ``now_ms``: first-seen times kept
    where known and set to ``now_ms`` where new, ``marks`` appended, ``ledger`` replaced."""
    prev = prev or ConversationState()
    start = turn_start(transcript)
    turns = dict(prev.turns)
    turns.setdefault(start, now_ms)
    if len(turns) > MAX_TURNS:
        turns = {p: turns[p] for p in sorted(turns)[-MAX_TURNS:]}
    last_text = transcript.assistant_text_positions[-1] if transcript.assistant_text_positions else -1
    texts = {last_text: prev.texts.get(last_text, now_ms)} if last_text > start else {}
    narrations = (*prev.narrations, *marks)[-MAX_NARRATIONS:]
    return ConversationState(turns, texts, narrations, ledger, now_ms)


def state_size(key: str, state: ConversationState) -> int:
    """The bytes one conversation is counted for in :class:`StateStore`: its key, its ledger,
    :data:`ENTRY_OVERHEAD`, :data:`TIME_BYTES` per first-seen time and :data:`MARK_BYTES` per
    narration mark (an estimate of what CPython holds for it)."""
    ledger = len(state.ledger) if state.ledger is not None else 0
    times = len(state.turns) + len(state.texts)
    return ENTRY_OVERHEAD + len(key) + ledger + TIME_BYTES * times + MARK_BYTES * len(state.narrations)


class StateStore:
    """Bounded LRU + TTL map from conversation key to :class:`ConversationState`: at most
    ``max_conversations`` of them and ``max_bytes`` (:func:`state_size`) in all."""

    __slots__ = ("_bytes", "_items", "max_bytes", "max_conversations", "ttl_ms")

    def __init__(
        self, max_conversations: int = MAX_CONVERSATIONS, ttl_ms: int = TTL_MS, max_bytes: int = MAX_BYTES
    ) -> None:
        self.max_conversations = max_conversations
        self.ttl_ms = ttl_ms
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, tuple[ConversationState, int]] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def size(self) -> int:
        """The bytes counted (:func:`state_size`) for the conversations held."""
        return self._bytes

    def _drop(self, key: str) -> None:
        _, size = self._items.pop(key)
        self._bytes -= size

    def _expired(self, state: ConversationState, now_ms: int) -> bool:
        return now_ms - state.seen_ms > self.ttl_ms

    def get(self, key: str, now_ms: int) -> ConversationState | None:
        """The state of ``key``, or None when unknown or expired (an expired one is dropped)."""
        held = self._items.get(key)
        if held is None:
            return None
        if self._expired(held[0], now_ms):
            self._drop(key)
            return None
        self._items.move_to_end(key)
        return held[0]

    def put(self, key: str, state: ConversationState) -> None:
        """Store ``state`` (its ``seen_ms`` is the time of the request) and drop the least
        recently used conversations beyond the count and byte limits, and expired ones at the
        old end. A conversation alone over ``max_bytes`` is not kept (and its older state goes)."""
        if key in self._items:
            self._drop(key)
        size = state_size(key, state)
        if size > self.max_bytes:
            return
        self._items[key] = (state, size)
        self._bytes += size
        while len(self._items) > self.max_conversations or self._bytes > self.max_bytes:
            self._drop(next(iter(self._items)))
        while self._items:
            oldest_key, (oldest, _) = next(iter(self._items.items()))
            if not self._expired(oldest, state.seen_ms):
                break
            self._drop(oldest_key)
