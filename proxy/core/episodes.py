"""Episodes: the turns a loop detector counts in.

A user message normally starts a new turn, and rules that count per turn start afresh. But not
every user message is a new request: a context-compaction summary, a short "continue" / "No" /
"try again", or a harness's "Tool call error" message arrive as user messages while the agent goes
on with the same work, and a loop goes on across them. An *episode* is a turn that only a *new
request* starts: a user message that is not a continuation.

- A user message is a **continuation** when its whole text (trimmed) matches one of the
  ``progress.continuation_patterns`` (:data:`DEFAULT_CONTINUATION_PATTERNS`: short replies that
  ask for nothing new, compaction summaries, harness format errors), with ``re.fullmatch``: a
  pattern that matches only the start of a message does not make it a continuation ("Please
  use a tool to check config.yaml once more, I just fixed it." is a new request, though it
  starts as a harness's "Please use a tool."). A pattern for a long text (a compaction summary)
  names its opening and takes the rest with ``(?s)…\b.*``.
- A harness's format-error reply (:mod:`proxy.core.harness_replies`) is always a continuation,
  whatever the patterns say: it is the harness asking again, not a person.
- :func:`episodes` numbers each call's episode. The progress-aware loop rules (repeat_reminder's
  chain, recurrence, cycles, repeated_failure, same_target, echo_loop) count per episode, so the
  same calls with the same results on both sides of a "continue" are one loop; a new result on
  the far side is still progress, as always. What the *user* must be able to reset stays per
  turn: the stop ladder (withheld results in the turn, the escalation ladder) and turn_guard's
  ledger restart at every user message, so "continue" after a stop is a fresh start.

Pure; the last computation is remembered (every rule of one request asks for the same calls).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from proxy.config.defaults import DEFAULT_CONTINUATION_PATTERNS
from proxy.core.harness_replies import is_harness_reply
from proxy.core.transcript import Transcript


class ContinuationRule:
    """``ContinuationRule(patterns)(text) -> bool``: the user message ``text`` continues the work.
    Raises :class:`re.error` for a pattern that is not a regular expression (the config names the
    key)."""

    __slots__ = ("_compiled", "patterns")

    def __init__(self, patterns: Sequence[str] = DEFAULT_CONTINUATION_PATTERNS) -> None:
        self.patterns = tuple(patterns)
        self._compiled = tuple(re.compile(p) for p in self.patterns)

    def __call__(self, text: str) -> bool:
        stripped = text.strip()
        return is_harness_reply(stripped) or any(p.fullmatch(stripped) for p in self._compiled)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ContinuationRule) and other.patterns == self.patterns

    def __hash__(self) -> int:
        return hash(self.patterns)


_last: tuple[object, ContinuationRule, tuple[int, ...]] | None = None


def episodes(transcript: Transcript, rule: ContinuationRule) -> tuple[int, ...]:
    """Per call of ``transcript`` (by ``seq``), its episode number: how many user messages before
    it were new requests (not continuations). Without the user messages' texts (a dialect that
    gives no ``said``) every user message is a new request."""
    global _last
    if _last is not None and _last[0] is transcript.calls and _last[1] == rule:
        return _last[2]
    said = {s.position: s.text for s in transcript.said if s.role == "user"}
    new_requests = [pos for pos in transcript.user_positions if pos not in said or not rule(said[pos])]
    out: list[int] = []
    k = 0
    for call in transcript.calls:
        while k < len(new_requests) and new_requests[k] < call.position:
            k += 1
        out.append(k)
    result = tuple(out)
    _last = (transcript.calls, rule, result)
    return result


class EpisodeCounter:
    """:func:`episodes` one call at a time: :meth:`of` the calls in conversation order
    gives each its episode, reading only the user messages before it that it has not read yet.
    Mutable; :meth:`copy` is independent. Gives exactly what :func:`episodes` gives."""

    __slots__ = ("_rule", "_said", "_users", "k")

    def __init__(self, rule: ContinuationRule) -> None:
        self._rule = rule
        self._users = 0  # user messages read (index into transcript.user_positions)
        self._said = 0  # index into transcript.said, for the texts of those messages
        self.k = 0  # new requests among them

    def of(self, transcript: Transcript, position: int) -> int:
        """The episode of a call (or anything) at message ``position``, no earlier than the last
        asked."""
        users = transcript.user_positions
        said = transcript.said
        while self._users < len(users) and users[self._users] < position:
            pos = users[self._users]
            while self._said < len(said) and said[self._said].position < pos:
                self._said += 1
            text = None  # the last user text said at that position, as episodes() reads it
            j = self._said
            while j < len(said) and said[j].position == pos:
                if said[j].role == "user":
                    text = said[j].text
                j += 1
            if text is None or not self._rule(text):
                self.k += 1
            self._users += 1
        return self.k

    def copy(self) -> EpisodeCounter:
        out = EpisodeCounter(self._rule)
        out._users, out._said, out.k = self._users, self._said, self.k
        return out
