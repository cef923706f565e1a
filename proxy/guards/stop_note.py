"""stop_note: after a stop, the harness's format-error reply tells the model why.

loopguard ends a looping turn by answering with its stop text and no tool call
(:class:`proxy.response.decide.StopJudge`). A chat client shows that text and waits for the
user; a harness that wants a tool call in every answer (mini-swe-agent, smolagents, SWE-agent)
drops the answer instead and replies "Tool call error: no tool calls found" as a user message
(:mod:`proxy.core.harness_replies`), so the model never reads why. The stop holds through such replies
(they start no turn), and this rule puts the reason where the model reads it: appended to the
harness's reply, the one message of that exchange the harness keeps in its history.

Rules (pure; re-derived on every request, so the note is re-injected in place):
- For each user message that is a harness reply, the turn it belongs to starts at the last user
  message before it that is not one. When that turn already holds ``after`` (the
  ``stop.after_ignored_denials``) withheld results before the reply, or (``ladder``: the
  escalation ladder stops) one withheld by the ladder, the stop condition held when the harness's
  previous answer came back (the stop judge's two conditions): a call in it that would be
  withheld again was replaced by the stop. The note is appended to the reply's text
  (``delivery: tool_suffix``, so no second user message in a row) and names the tool of the last
  withheld result. Only right after that result (no call between it and the reply, other
  harness replies aside): a reply after calls that ran since then follows no stop.
- The note says what holds whatever that answer was: calls that repeat it are not run. It never
  fires without withheld results, nor on a person's message.

``reads_prior``: it counts the withheld results of the guards before it; ``withholds = False``:
the stop judge does not ask it.
"""

from __future__ import annotations

import bisect

from proxy.config import Config
from proxy.core.actions import Action, Remind, Withhold
from proxy.core.harness_replies import is_harness_reply
from proxy.core.transcript import Transcript
from proxy.guards.escalation import RULE as ESCALATION
from proxy.guards.wording import QUOTE, Style, speak

RULE = "stop_note"

TEXT = (
    "[loopguard] Stopped: the model kept calling {tool} without getting anywhere ({denials} "
    "withheld {results}), so loopguard ended its turn; a reply that makes such a call again is "
    "replaced by this stop and the call is not run. Do not call {tool} for this again: use the "
    "results you already have, try a different approach, or finish and say what is blocking you."
)
#: ``recovery.reminders: plain | redirect`` (:mod:`proxy.guards.wording`): without the tool's name.
PLAIN_TEXT = (
    "[loopguard] Stopped: the model kept making calls that got nowhere ({denials} withheld {results}), so "
    "loopguard ended its turn; a reply that makes such a call again is replaced by this stop and the call "
    "is not run."
)
PLAIN_CLOSE = (
    "Do not make that call again: use the results you already have, try a different approach, or finish "
    "and say what is blocking you."
)


def stop_note_for(cfg: Config) -> StopNote | None:
    """The :class:`StopNote` of ``cfg``: None when the stop is not enforced (no stop, no note:
    what it says would not be true)."""
    if "stop" in cfg.observed_rules():
        return None
    ladder = cfg.guards.escalation.enabled and cfg.guards.escalation.stop
    after = cfg.stop.after_ignored_denials
    return StopNote(after, ladder, cfg.recovery.reminders) if after > 0 or ladder else None


class StopNote:
    """Guard callable: ``StopNote(after, ladder)(transcript, ctx) -> list[Remind]``; ``after``: the
    stop ladder's ``stop.after_ignored_denials`` (0: off), ``ladder``: the escalation ladder's
    withheld result stops. Reads ``ctx.prior`` (the withheld results)."""

    __slots__ = ("_after", "_ladder", "_style")

    name = RULE
    reads_prior = True
    withholds = False

    def __init__(self, after: int, ladder: bool = False, style: Style = QUOTE) -> None:
        self._after = after
        self._ladder = ladder
        self._style = style

    def __call__(self, transcript: Transcript, ctx: object = None) -> list[Action]:
        # the user messages and whether each is a harness reply: without a reply there is no
        # note, whatever was withheld (re-derived on every request, so this is read first: a
        # long history holds a withheld result per loop and one or two user messages)
        users = [(said, is_harness_reply(said.text)) for said in transcript.said if said.role == "user"]
        if not any(reply for _, reply in users):
            return []
        by_position: dict[int, Withhold] = {}  # one result withheld by several guards counts once
        for a in getattr(ctx, "prior", ()):
            if isinstance(a, Withhold) and not a.observed:
                by_position.setdefault(a.position, a)
        withheld = [by_position[p] for p in sorted(by_position)]
        if not withheld:
            return []
        positions = [a.position for a in withheld]
        calls = [c.position for c in transcript.calls]
        out: list[Action] = []
        start = -1  # the current turn's first message (a person's, or -1)
        for said, reply in users:
            if not reply:
                start = said.position
                continue
            lo = bisect.bisect_right(positions, start)
            hi = bisect.bisect_left(positions, said.position)
            laddered = self._ladder and any(w.rule == ESCALATION for w in withheld[lo:hi])
            if not laddered and not 0 < self._after <= hi - lo:
                continue
            last = withheld[hi - 1]
            k = bisect.bisect_right(calls, last.position)
            if k < len(calls) and calls[k] < said.position:
                continue  # a call ran after that withheld result: the answer was no stop
            results = "result" if hi - lo == 1 else "results"
            # the call whose result was withheld: the last one before that result with its id
            tc = transcript.calls
            call = next((tc[j] for j in range(k - 1, -1, -1) if tc[j].call_id == last.call_id), None)
            if self._style != QUOTE and call is not None:
                plain = PLAIN_TEXT.format(denials=hi - lo, results=results)
                text = speak(self._style, plain, transcript, call, PLAIN_CLOSE)
            else:
                text = TEXT.format(tool=last.tool, denials=hi - lo, results=results)
            out.append(
                Remind(
                    after=said.position,
                    text=text,
                    rule=RULE,
                    tool=last.tool,
                    count=hi - lo,
                    limit=self._after or None,
                    fresh=said.position == transcript.message_count - 1,
                    delivery="tool_suffix",
                )
            )
        return out
