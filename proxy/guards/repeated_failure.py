"""repeated_failure (DESIGN §6.5): failing the same way again — advisory.

Rules, per turn (calls after a user message):
- **Failing on one target**: a tool on one target (:mod:`proxy.core.targets`; a call without a target
  is on the tool itself) whose last ``failures`` (3) calls in the turn all failed the same way
  (:mod:`proxy.core.failures`, the ``turn_guard.failure_patterns``; the same error line, masked:
  the line quoted below); the arguments may differ (a truncated edit retried with a different
  tail). A success of that tool on that target resets the run; calls on other targets in between
  do not. A failure with another error starts the run again at 1: an agent whose attempts fail
  each in a new way is finding things out (a burst of different failures it is already leaving),
  and the text's claim that trying again the same way will fail the same way would not hold.
  The reminder fires once, when the run reaches ``failures``, and quotes the error's first line:
  the first line at the result's edges that a failure pattern matches, else its first non-blank
  line. A call that is an exact repeat of a failed call gets none (the re-issue reminder below,
  and ``repeat_reminder``, cover it).
- **Re-issuing a failed call** (``reissue``): a call identical (tool and canonical arguments,
  ``ignore_args`` dropped) to the previous such call in the turn, whose result failed or was a
  user rejection (``rejection_patterns``, searched in the result's edges), that got the same
  result again (masked, :mod:`proxy.core.progress`) with nothing in between that changed the
  situation (:mod:`proxy.core.effects`) → a reminder at the first such occurrence (not again while
  the failures of that exact call go on; ``count`` is the call's number in that run).
  Re-running a failed command after an edit is exactly what an agent should do: it is never
  reminded, and the text only claims what held: same arguments, nothing
  changed, the same result.
- A multiplexed tool's subcommand is part of what a call is on (:func:`proxy.core.targets.subcommand`):
  a successful ``str_replace_editor view`` of a file does not reset the failures of the
  ``str_replace`` edits on it.
- One reminder per call (the re-issue text wins), after the call's step.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.config import RepeatedFailureConfig
from proxy.core.actions import Action, Delivery
from proxy.core.canonical import canonical_arguments
from proxy.core.effects import EpochCounter, Situations
from proxy.core.episodes import EpisodeCounter
from proxy.core.failures import (
    DEFAULT_FAILURE_PATTERNS,
    FailureRule,
    RejectionRule,
    compile_pattern,
    edge_text,
)
from proxy.core.memo import Memo
from proxy.core.progress import RepeatJudge, mask
from proxy.core.targets import TargetRule, call_on
from proxy.core.transcript import ToolCall, ToolResult, Transcript
from proxy.guards.repeat_reminder import preview
from proxy.guards.resume import unread
from proxy.guards.turns import call_memo, memoized, remind_after_step
from proxy.guards.wording import QUOTE, Style, speak

RULE = "repeated_failure"
ARGUMENTS_PREVIEW_CHARS = 300

FAILING_TEXT = (
    "[loopguard] {subject} has now failed {count} times in a row. The last error:\n"
    "  {error}\n"
    "Trying again the same way will fail the same way. Read the error and fix its cause first "
    "(re-check your assumptions{about}), change your approach, or tell the user what is blocking "
    "you."
)
REISSUE_TEXT = (
    "[loopguard] You made the same call again, with the exact same arguments and nothing changed "
    "in between, and it {outcome} again with the same result as the last time.\n"
    "- tool: {tool}\n"
    "- arguments: {arguments}\n"
    "- result: {error}\n"
    "Repeating it unchanged will not give a different result. Change the arguments or the "
    "approach{respect}, or tell the user what is blocking you."
)
#: ``recovery.reminders: plain | redirect`` (:mod:`proxy.guards.wording`): no tool, target,
#: arguments or error quoted (an error line may echo the arguments).
PLAIN_FAILING_TEXT = (
    "[loopguard] Your calls with one tool on one target have now failed {count} times in a row, "
    "the same way each time. Trying again the same way will fail the same way."
)
PLAIN_FAILING_CLOSE = (
    "Read the error and fix its cause first (re-check your assumptions), change your approach, or "
    "tell the user what is blocking you."
)
PLAIN_REISSUE_TEXT = (
    "[loopguard] You made the same call again, with the exact same arguments and nothing changed "
    "in between, and it {outcome} again with the same result as the last time. Repeating it "
    "unchanged will not give a different result.{respect}"
)
PLAIN_REISSUE_CLOSE = "Change the arguments or the approach, or tell the user what is blocking you."
PLAIN_RESPECT = " The user rejected it: do what they asked instead."


class RepeatedFailure:
    """Guard callable: ``RepeatedFailure(cfg)(transcript, ctx) -> list[Remind]``."""

    __slots__ = (
        "_cfg",
        "_delivery",
        "_failures",
        "_ignore",
        "_memo",
        "_patterns",
        "_rejections",
        "_situations",
        "_style",
        "_targets",
    )

    name = RULE
    #: only reminds: the response-side stop check need not ask it (proxy.response.decide.StopJudge)
    withholds = False

    def __init__(
        self,
        cfg: RepeatedFailureConfig,
        delivery: Delivery = "user",
        targets: TargetRule | None = None,
        failure_patterns: tuple[str, ...] = DEFAULT_FAILURE_PATTERNS,
        situations: Situations | None = None,
        style: Style = QUOTE,
    ) -> None:
        self._style = style
        self._situations = situations or Situations()
        self._memo: Memo[tuple[str, str], tuple[str, str | None]] = call_memo()
        self._cfg = cfg
        self._delivery = delivery
        self._targets = targets or TargetRule()
        self._failures = FailureRule(failure_patterns)
        self._patterns = tuple(compile_pattern(p) for p in failure_patterns)
        self._rejections = RejectionRule(cfg.rejection_patterns)
        self._ignore = frozenset(cfg.ignore_args)

    def rejected(self, result: ToolResult | None) -> bool:
        """The result says the user rejected the call (``rejection_patterns``, memoized)."""
        return self._rejections(result)

    def _on(self, call: ToolCall) -> tuple[str, str | None]:
        """(tool, target) of ``call``; the target None when it has none (memoized per tool and
        arguments string)."""
        return memoized(self._memo, call, self._on_uncached)

    def _on_uncached(self, call: ToolCall) -> tuple[str, str | None]:
        return call_on(self._targets, call.name, call.arguments, call.arguments_raw)

    def _bad(self, call: ToolCall) -> tuple[bool, bool]:
        """(its result failed or was rejected, it was rejected) — only asked of calls repeated."""
        if self._failures(call.result) is True:
            return True, False
        rejected = self.rejected(call.result)
        return rejected, rejected

    def error_line(self, result: ToolResult | None) -> str:
        """The line to quote: the first edge line a failure pattern matches, else the first
        non-blank line of the result."""
        if result is None:
            return ""
        lines = [ln.strip() for ln in edge_text(result.text).splitlines() if ln.strip()]
        for line in lines:
            if any(p.search(line) for p in self._patterns):
                return preview(line, self._cfg.error_preview_chars)
        return preview(lines[0], self._cfg.error_preview_chars) if lines else "(empty result)"

    def begin(self) -> FailureState:
        """The state before any call (:mod:`proxy.guards.resume`)."""
        epochs = self._situations.epoch_counter() if self._cfg.reissue else None
        return FailureState(
            self._situations.episode_counter(), epochs, RepeatJudge(self._situations.masks, epochs)
        )

    def __call__(self, transcript: Transcript, ctx: object = None) -> list[Action]:
        return self.advance(self.begin(), transcript, ctx, transcript.message_count)

    def _failed(
        self, s: FailureState, calls: Sequence[ToolCall], call: ToolCall, on: tuple[str, str | None]
    ) -> bool | None:
        """Whether ``call`` failed, classified only once its tool/target has ``failures`` calls
        in the turn (fewer cannot reach the run): the calls before that are kept by ``seq`` in
        ``s.waiting`` and classified (into ``s.runs``) when the count is reached. None for a
        call not classified (or without a result)."""
        cfg = self._cfg
        if not cfg.failures:
            return None
        n = s.counts[on] = s.counts.get(on, 0) + 1
        if n < cfg.failures:
            s.waiting[on] = (*s.waiting.get(on, ()), call.seq)  # tuples: a state copy shares them
            return None
        for seq in s.waiting.pop(on, ()):
            earlier = self._failures(calls[seq].result)
            if earlier is True:
                self._count_failure(s, on, calls[seq].result)
            elif earlier is False:
                s.runs[on] = 0
        return self._failures(call.result)

    def _count_failure(self, s: FailureState, on: tuple[str, str | None], result: ToolResult | None) -> None:
        """One more failure on ``on``: the run goes on when it failed the same way as the one
        before (its error line, masked), else it starts again at 1."""
        error = mask(self.error_line(result), self._situations.masks)
        same = s.runs.get(on, 0) > 0 and s.errors.get(on) == error
        s.runs[on] = s.runs[on] + 1 if same else 1
        s.errors = {**s.errors, on: error}

    def advance(self, state: FailureState, transcript: Transcript, ctx: object, upto: int) -> list[Action]:
        """Read the calls before message position ``upto`` that ``state`` has not read
        (:mod:`proxy.guards.resume`); the reminders decided for them."""
        cfg = self._cfg
        actions: list[Action] = []
        calls = transcript.calls
        s = state
        for call in unread(s, calls, upto):
            if s.epochs is not None:
                s.epochs.add(call)
            turn = s.episodes.of(transcript, call.position)
            if turn != s.turn:  # a new turn: its runs start over
                s.turn = turn
                s.judge = RepeatJudge(self._situations.masks, s.epochs)
                s.runs, s.last, s.counts, s.waiting, s.errors = {}, {}, {}, {}, {}
            on = self._on(call)
            where = on[1]
            failed = self._failed(s, calls, call, on)
            if failed is True:
                self._count_failure(s, on, call.result)
            elif failed is False:
                s.runs[on] = 0
            key = (call.name, canonical_arguments(call.arguments, call.arguments_raw, self._ignore))
            entry = s.last.get(key)
            before = calls[entry[0]] if entry is not None else None
            # (the previous call with the key failed or was rejected, it was rejected)
            prev = self._bad(before) if before is not None else None
            run = entry[1] + 1 if entry is not None and prev is not None and prev[0] else 1
            reminded = entry is not None and entry[2] and run > 1
            same = s.judge.repeats(key, call.result, call.seq) if cfg.reissue else False
            text = None
            count = 0
            limit = cfg.failures
            style = self._style
            if cfg.reissue and prev is not None and prev[0] and same and not reminded:
                assert before is not None
                outcome = "was rejected by the user" if prev[1] else "failed"
                respect = " (the user rejected it: do what they asked instead)" if prev[1] else ""
                if style != QUOTE:
                    plain = PLAIN_REISSUE_TEXT.format(
                        outcome=outcome, respect=PLAIN_RESPECT if prev[1] else ""
                    )
                    text = speak(style, plain, transcript, call, PLAIN_REISSUE_CLOSE)
                else:
                    text = REISSUE_TEXT.format(
                        outcome=outcome,
                        tool=call.name,
                        arguments=preview(key[1], ARGUMENTS_PREVIEW_CHARS),
                        error=self.error_line(before.result),
                        respect=respect,
                    )
                count, limit = run, 2
                reminded = True
            elif cfg.failures and failed is True and s.runs[on] == cfg.failures and not (prev and prev[0]):
                count = s.runs[on]
                if style != QUOTE:
                    plain = PLAIN_FAILING_TEXT.format(count=count)
                    text = speak(style, plain, transcript, call, PLAIN_FAILING_CLOSE)
                else:
                    target = preview(where, 120) if where else ""
                    on_target = target and target != call.name  # SWE-agent's "edit" is its own target
                    text = FAILING_TEXT.format(
                        subject=f"{on[0]} on {target}" if on_target else on[0],
                        about=f" about {target}" if on_target else "",
                        count=count,
                        error=self.error_line(call.result),
                    )
            s.last[key] = (call.seq, run, reminded)
            if text is None:
                continue
            action = remind_after_step(transcript, call, text, RULE, count, limit, self._delivery)
            if action is not None:
                actions.append(action)
        return actions


class FailureState:
    """What :class:`RepeatedFailure` has read: the next call (``next``, a ``seq``), the episode
    counter and, with ``reissue``, the situation counter; and of the current turn (``turn``, its
    episode): the ``judge`` of repeats, per tool/target (``on``) its run of failures (``runs``)
    and the error line of the last one (``errors``),
    its calls so far (``counts``) and the calls not classified yet (``waiting``, by ``seq``), and
    per call key (tool, canonical arguments) its last call (``seq``), the length of its run of
    bad results and whether that run was reminded (``last``). Mutable; :meth:`copy` is
    independent."""

    __slots__ = ("counts", "episodes", "epochs", "errors", "judge", "last", "next", "runs", "turn", "waiting")

    def __init__(self, episodes: EpisodeCounter, epochs: EpochCounter | None, judge: RepeatJudge) -> None:
        self.episodes = episodes
        self.epochs = epochs
        self.judge = judge
        self.next = 0
        self.turn = -1
        self.runs: dict[tuple[str, str | None], int] = {}
        self.counts: dict[tuple[str, str | None], int] = {}
        self.waiting: dict[tuple[str, str | None], tuple[int, ...]] = {}
        self.last: dict[tuple[str, str], tuple[int, int, bool]] = {}
        #: per tool/target, the masked error line of its last failure (replaced, never changed in
        #: place: a copy shares it)
        self.errors: dict[tuple[str, str | None], str] = {}

    def copy(self) -> FailureState:
        epochs = self.epochs.copy() if self.epochs is not None else None
        out = FailureState(self.episodes.copy(), epochs, self.judge.copy(epochs))
        out.next, out.turn = self.next, self.turn
        out.runs, out.counts, out.last = dict(self.runs), dict(self.counts), dict(self.last)
        out.waiting, out.errors = dict(self.waiting), self.errors
        return out
