"""narration: ask a silently working agent to tell the user where it is (DESIGN §6.3).

Part of ``guards.turn_guard``'s configuration (``narrate_after_ms``, ``narrate_every_ms``), but a
rule of its own: it reads time, which the history does not carry. Times come from
``Context.now_ms`` and the conversation's remembered state (``Context.state``, :mod:`proxy.core.state`):
when the proxy first saw the current turn, when it first saw each assistant text of the turn,
and where it already injected narration reminders. The guard only reads; the server commits
new marks after the request (:func:`marks`).

Rules:
- *Silence* runs from the later of the turn's start and the turn's last assistant text (an
  assistant message with non-blank content, tool calls or not), each at the time the proxy first
  saw it. A turn or text seen for the first time in this request was seen *now*.
- A *fresh* reminder goes after the newest step's tool results when that step has its results,
  silence has lasted at least ``narrate_after_ms``, and no narration reminder of this turn is
  more recent than ``narrate_every_ms``. At most one per step: a retried request re-emits the
  stored one instead of adding another.
- Every stored mark whose position still ends a step answered by the same call id is re-emitted
  in place (not fresh), so the upstream's prefix cache stays valid. Without state (unknown
  conversation, or after a restart) there is nothing to re-emit and silence starts now.
"""

from __future__ import annotations

from collections.abc import Iterable

from proxy.config import TurnGuardConfig
from proxy.core.actions import Action, Remind
from proxy.core.state import NarrationMark, turn_start
from proxy.core.transcript import Transcript

RULE = "narration"

TEXT = (
    "[loopguard] You have been working for {duration} without a word to the user. Before your "
    "next tool call, tell the user in a sentence or two what you have done so far and what you "
    "will do next."
)


def duration(ms: int) -> str:
    """``ms`` in words, rounded down: ``3 minutes``, ``1 minute``, ``45 seconds``."""
    minutes, seconds = divmod(max(ms, 0) // 1000, 60)
    if minutes:
        return f"{minutes} minute{'s' if minutes != 1 else ''}"
    return f"{seconds} second{'s' if seconds != 1 else ''}"


def render(silent_ms: int) -> str:
    """The reminder text for ``silent_ms`` of silence (the same mark always renders the same)."""
    return TEXT.format(duration=duration(silent_ms))


def _ends(transcript: Transcript) -> dict[int, tuple[str | None, str]]:
    """Step end position → (call id, tool) of the call whose result sits there."""
    out: dict[int, tuple[str | None, str]] = {}
    for step in transcript.steps:
        if step.end is None:
            continue
        for seq in step.calls:
            call = transcript.calls[seq]
            if call.result is not None and call.result.position == step.end:
                out[step.end] = (call.call_id, call.name)
    return out


class Narration:
    """Guard callable: ``Narration(cfg)(transcript, ctx) -> list[Remind]``."""

    __slots__ = ("_after", "_every")

    name = RULE
    #: only reminds: the response-side stop check need not ask it (proxy.response.decide.StopJudge)
    withholds = False

    def __init__(self, cfg: TurnGuardConfig) -> None:
        self._after = cfg.narrate_after_ms
        self._every = cfg.narrate_every_ms

    def _remind(self, after: int, tool: str, silent_ms: int, fresh: bool) -> Remind:
        return Remind(
            after=after,
            text=render(silent_ms),
            rule=RULE,
            tool=tool,
            count=silent_ms // 1000,
            limit=self._after // 1000,
            fresh=fresh,
        )

    def __call__(self, transcript: Transcript, ctx: object = None) -> list[Action]:
        now = getattr(ctx, "now_ms", 0)
        state = getattr(ctx, "state", None)
        ends = _ends(transcript)
        actions: list[Action] = []
        start = turn_start(transcript)
        last_mark: int | None = None
        narrated = set()
        for mark in state.narrations if state is not None else ():
            found = ends.get(mark.after)
            if found is None or found[0] != mark.call_id:
                continue
            actions.append(self._remind(mark.after, found[1], mark.silent_ms, False))
            narrated.add(mark.after)
            if mark.after > start:
                last_mark = mark.at_ms if last_mark is None else max(last_mark, mark.at_ms)

        if self._after <= 0 or transcript.newest_step is None:
            return actions
        end = transcript.steps[transcript.newest_step].end
        if end is None or end in narrated or end not in ends:
            return actions
        since = now
        if state is not None:
            since = state.turns.get(start, now)
            texts = [p for p in transcript.assistant_text_positions if p > start]
            if texts:
                since = max(since, state.texts.get(texts[-1], now))
        silent = now - since
        if silent < self._after or (last_mark is not None and now - last_mark < self._every):
            return actions
        actions.append(self._remind(end, ends[end][1], silent, True))
        return actions


def marks(actions: Iterable[Action], transcript: Transcript, now_ms: int) -> list[NarrationMark]:
    """The fresh narration reminders among ``actions`` as marks to remember (for the server to
    commit with :func:`proxy.core.state.observe`)."""
    ends = _ends(transcript)
    return [
        NarrationMark(a.after, ends[a.after][0], now_ms, a.count * 1000)
        for a in actions
        if isinstance(a, Remind) and a.rule == RULE and a.fresh and a.after in ends
    ]
