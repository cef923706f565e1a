"""escalation (issue 10, defect 11; DESIGN §2.2): reminders the model ignores lead somewhere.

Rules, per episode (:mod:`proxy.episodes`: the calls after a new request; a "continue" or a
compaction summary does not start one, because the loop rules whose reminders the ladder counts go
on counting across them — a user who types "continue" after a stop while the model keeps looping
sees its next stale call withheld and the one after stopped again; a new request starts from the
bottom of the ladder):
- A reminder *about* a call (``Remind.call``; every rule's reminders after a step name the call
  that brought them, reminders about text or time name none) counts for what that call is on:
  its tool (with a multiplexed tool's subcommand) and target
  (:func:`proxy.targets.call_on`; a call without a target is on its tool). Reminders are counted
  once per place (two rules reminding after one step are one message to the model), and only the
  ones the model had read before a call (placed before it) count for it.
- After ``after_reminders`` (2) reminders about one tool and target in the episode, the next call
  to that tool on that target whose result is *nothing new* — equal (masked,
  :mod:`proxy.progress`) to the result of an earlier call on it in the episode — has its result
  withheld. A new result is
  progress and passes: the ladder stops only what keeps failing to move. A new result also sets
  the count back: only reminders placed after the last new result on that target count (a job
  polled with one command, whose output moves on every few polls, gets its "same result"
  reminders between the moves, and is never withheld; found by a new user's Claude Code tryout,
  issue 12). A call whose result is
  not known yet (the response side's look-ahead) counts as nothing new only when the previous call
  on that target got nothing new and this one repeats it with at most small changes to its
  arguments (canonical arguments at least :data:`SIMILAR` alike, :class:`difflib.SequenceMatcher`
  ratio over their first :data:`SIMILAR_CHARS` characters): a drifting repeat, not a new approach
  (a rewritten edit of the same file is a new approach and is not stopped).
- This is what ends loops whose arguments drift (a small model's escaping noise, reminder text
  echoed into the arguments), which exact-match rules never see as repeats: the reminders of the
  target-based rules (repeated failures, cycles) still come, and the ladder acts on them.
- The response side (:class:`proxy.response.decide.StopJudge`) ends the turn when, with ``stop``, an
  answer's call would be withheld by this rule again after it already withheld one in the turn
  (since the last user message of any kind: "continue" gives the model one more chance).
"""

from __future__ import annotations

import bisect
import difflib
from collections import defaultdict
from collections.abc import Sequence

from proxy.actions import Action, Remind, Withhold
from proxy.canonical import canonical_arguments
from proxy.effects import Situations
from proxy.guards.turns import known, memoized, turns
from proxy.ops.config import EscalationConfig
from proxy.progress import same_result
from proxy.targets import TargetRule, call_on
from proxy.transcript import ToolCall, ToolResult, Transcript

RULE = "escalation"
#: How alike (difflib ratio) a pending call's arguments must be to the last stale call's.
SIMILAR = 0.8
SIMILAR_CHARS = 2000

WITHHOLD_TEXT = (
    "[loopguard] The result of this call is withheld: you were reminded {count} times that your "
    "calls to {subject} were not getting anywhere, and this call got the same result as an "
    "earlier one. Stop calling {tool} for this: use the results you already have, "
    "try a different approach, or tell the user what is blocking you."
)


def similar(a: ToolCall, b: ToolCall) -> bool:
    """True when ``b`` repeats ``a`` with at most small changes to its arguments."""
    x = canonical_arguments(a.arguments, a.arguments_raw)[:SIMILAR_CHARS]
    y = canonical_arguments(b.arguments, b.arguments_raw)[:SIMILAR_CHARS]
    if x == y:
        return True
    matcher = difflib.SequenceMatcher(None, x, y, autojunk=False)
    return all(r() >= SIMILAR for r in (matcher.real_quick_ratio, matcher.quick_ratio, matcher.ratio))


class Escalation:
    """Guard callable: ``Escalation(cfg)(transcript, ctx) -> list[Withhold]``; reads
    ``ctx.prior`` (the reminders decided before it)."""

    __slots__ = ("_cfg", "_memo", "_situations", "_targets")

    name = RULE
    reads_prior = True

    def __init__(
        self,
        cfg: EscalationConfig,
        targets: TargetRule | None = None,
        situations: Situations | None = None,
    ) -> None:
        self._cfg = cfg
        self._targets = targets or TargetRule()
        self._situations = situations or Situations()
        self._memo: dict[tuple[str, str], tuple[str, str | None]] = {}

    @property
    def config(self) -> EscalationConfig:
        return self._cfg

    def on(self, call: ToolCall) -> tuple[str, str | None]:
        """What ``call`` is on (memoized per tool and arguments string)."""
        return memoized(self._memo, call, lambda c: call_on(self._targets, c.name, c.arguments))

    def __call__(self, transcript: Transcript, ctx: object = None) -> list[Action]:
        prior = getattr(ctx, "prior", ())
        calls = transcript.calls
        group = self._situations.episodes(transcript)
        # (episode, on) -> sorted positions of the reminders about calls on it
        places: dict[tuple[int, tuple[str, str | None]], set[int]] = defaultdict(set)
        for action in prior:
            if (
                isinstance(action, Remind)
                and action.call is not None
                and action.rule != RULE
                and 0 <= action.call < len(calls)
            ):
                about = calls[action.call]
                places[(group[about.seq], self.on(about))].add(action.after)
        if not places:
            return []
        reminded = {key: sorted(v) for key, v in places.items()}
        reminded_in = {episode for episode, _ in reminded}
        actions: list[Action] = []
        for episode_calls in turns(calls, group):
            if group[episode_calls[0].seq] in reminded_in:
                actions.extend(self._turn(transcript, episode_calls, reminded, group))
        return actions

    def _turn(
        self,
        transcript: Transcript,
        calls: Sequence[ToolCall],
        reminded: dict[tuple[int, tuple[str, str | None]], list[int]],
        group: Sequence[int],
    ) -> list[Action]:
        masks = self._situations.masks
        results: dict[tuple[str, str | None], list[ToolResult]] = defaultdict(list)
        last_stale: dict[tuple[str, str | None], ToolCall | None] = {}  # the last call on it, if stale
        moved: dict[tuple[str, str | None], int] = {}  # where its last new result is
        actions: list[Action] = []
        for call in calls:
            on = self.on(call)
            seen = results[on]
            positions = reminded.get((group[call.seq], on))
            if positions is None:  # never reminded about: only its results are needed later
                if known(call.result):
                    assert call.result is not None
                    seen.append(call.result)
                continue
            if known(call.result):
                assert call.result is not None
                stale = any(same_result(r, call.result, masks) for r in seen)
                seen.append(call.result)
            else:
                previous = last_stale.get(on)
                stale = previous is not None and similar(previous, call)
            last_stale[on] = call if stale else None
            if not stale and call.result is not None:
                moved[on] = call.result.position
            if not stale or call.result is None:
                continue
            # reminders read before it, and after the last new result on it (progress)
            count = bisect.bisect_left(positions, call.position) - bisect.bisect_left(
                positions, moved.get(on, -1)
            )
            if count < self._cfg.after_reminders:
                continue
            tool, target = on
            subject = f"{tool} on {target}" if target and target != tool else tool
            actions.append(
                Withhold(
                    position=call.result.position,
                    part=call.result.part,
                    call_id=call.call_id,
                    text=WITHHOLD_TEXT.format(count=count, subject=subject, tool=call.name),
                    rule=RULE,
                    tool=call.name,
                    count=count,
                    limit=self._cfg.after_reminders,
                    fresh=transcript.is_fresh(call.step),
                    reason="reminders",
                )
            )
        return actions
