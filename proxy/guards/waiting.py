"""waiting: one reminder after a long wait, measured in time, never a withhold or a stop
(DESIGN §2.2: waiting on a running process is not looping; time, not the count of polls, bounds
a wait).

What a wait is, how long a call waited and whether a poll brought output: :mod:`proxy.core.waits`.
The other rules leave waits alone (a wait changes the situation, :mod:`proxy.core.effects`, and is
transparent to their counts); this rule is the only one that looks at them.

Rules, per episode (a turn that only a new request starts, :mod:`proxy.core.episodes`):
- **A process wait** is on one process (:func:`proxy.core.waits.poll_of`, :func:`proxy.core.waits.started`):
  from the call whose result says it left the process running, through every poll whose result
  says it is still running. Its *quiet time* is the sum of :func:`proxy.core.waits.waited_ms` of those
  calls since the last one whose result brought output (new output is the process moving on: the
  quiet time starts again after it). A poll whose result says the process exited (or anything
  but running) ends the wait.
- **A sleep wait** is the run of sleep calls (``sleep 60 && echo …``) with nothing in between
  that may change state (:class:`proxy.core.effects.EffectRule`; read-only status checks between
  the sleeps do not end it); its quiet time is the sum of the sleeps.
- A reminder goes after the step of the call whose quiet time reaches ``remind_after_ms``, and
  again each time it reaches twice the previous mark (30 min, 1 h, 2 h, …, at the default): a
  process that runs for hours without a word gets a handful of reminders, never a block. The
  times are those the conversation reports (Codex's ``Wall time``, a blocking ``TaskOutput``'s
  ``timeout``, a sleep's duration), so the decision is a pure function of the history and a
  reminder is re-injected at the same place on every later request. A wait whose calls report no
  time (Claude Code's non-blocking ``TaskOutput``, ``BashOutput``) is never reminded.
- The reminder names no call (``Remind.call`` None: a reminder about time), so the escalation
  ladder never counts it towards a withhold.
"""

from __future__ import annotations

from proxy.config import WaitingConfig
from proxy.core.actions import Action, Delivery, Remind
from proxy.core.effects import Situations
from proxy.core.episodes import EpisodeCounter
from proxy.core.transcript import ToolCall, Transcript
from proxy.core.waits import POLLS, has_output, is_wait, poll_of, says_running, sleep_ms, started, waited_ms
from proxy.guards.narration import duration
from proxy.guards.resume import unread
from proxy.guards.turns import known, remind_after_step

RULE = "waiting"

PROCESS_TEXT = (
    "[loopguard] You have waited {duration} on {subject} without any new output from it "
    "(by the wall times its results report, over {checks} checks), and its last result says it "
    "is still running. If it should have finished by now, find out why (what it is doing, "
    "whether it waits for input or hangs), stop it, or tell the user; if it is just slow, keep "
    "waiting. This is only a reminder: loopguard does not block waiting."
)

SLEEP_TEXT = (
    "[loopguard] You have waited {duration} in {checks} sleep commands with nothing changed in "
    "between. If what you are waiting for should have finished by now, check on it or tell the "
    "user; if it is just slow, keep waiting. This is only a reminder: loopguard does not block "
    "waiting."
)


def subject(key: str) -> str:
    """How a reminder names the process of a wait key (:func:`proxy.core.waits.poll_of`)."""
    kind, _, pid = key.partition(":")
    return f"process {pid}" if kind == "session" else f"background task {pid}"


class Waiting:
    """Guard callable: ``Waiting(cfg)(transcript, ctx) -> list[Remind]``."""

    __slots__ = ("_cfg", "_delivery", "_situations")

    name = RULE
    #: only reminds: the response-side stop check need not ask it (proxy.response.decide.StopJudge)
    withholds = False

    def __init__(
        self, cfg: WaitingConfig, delivery: Delivery = "user", situations: Situations | None = None
    ) -> None:
        self._cfg = cfg
        self._delivery = delivery
        self._situations = situations or Situations()

    def begin(self) -> WaitingState:
        """The state before any call (:mod:`proxy.guards.resume`)."""
        return WaitingState(self._situations.episode_counter())

    def __call__(self, transcript: Transcript, ctx: object = None) -> list[Action]:
        return self.advance(self.begin(), transcript, ctx, transcript.message_count)

    def advance(self, state: WaitingState, transcript: Transcript, ctx: object, upto: int) -> list[Action]:
        """Read the calls before message position ``upto`` that ``state`` has not read
        (:mod:`proxy.guards.resume`); the reminders decided for them."""
        first = self._cfg.remind_after_ms
        actions: list[Action] = []
        s = state
        for call in unread(s, transcript.calls, upto):
            episode = s.episodes.of(transcript, call.position)
            if episode != s.episode:  # a new request: the user has seen where things are
                s.episode, s.spans = episode, {}
            poll = poll_of(call)
            key = poll or started(call)
            if key is not None:
                if not known(call.result):
                    continue
                if not says_running(call.result):  # exited, or not a wait: the wait is over
                    s.spans.pop(key, None)
                    continue
                if poll is None and call.name in POLLS:  # input written to it: not quiet
                    s.spans[key] = (0, 0, first)
                    continue
                text = PROCESS_TEXT
            elif sleep_ms(call) is not None and is_wait(call):
                if not known(call.result):
                    continue
                key, text = "sleep", SLEEP_TEXT
            else:
                if "sleep" in s.spans and not is_wait(call) and self._situations.effects(call):
                    del s.spans["sleep"]  # something may have changed: not one sleep wait any more
                continue
            quiet, checks, mark = s.spans.get(key, (0, 0, first))
            if key != "sleep" and has_output(call.result):
                s.spans[key] = (0, 0, first)  # the process moved on: the quiet time starts again
                continue
            quiet, checks = quiet + waited_ms(call), checks + 1
            remind = first > 0 and quiet >= mark
            while mark > 0 and quiet >= mark:
                mark *= 2
            s.spans[key] = (quiet, checks, mark)
            if remind:
                action = self._remind(transcript, call, text, key, quiet, checks)
                if action is not None:
                    actions.append(action)
        return actions

    def _remind(
        self, transcript: Transcript, call: ToolCall, text: str, key: str, quiet: int, checks: int
    ) -> Remind | None:
        return remind_after_step(
            transcript,
            call,
            text.format(duration=duration(quiet), subject=subject(key), checks=checks),
            RULE,
            quiet // 1000,
            self._cfg.remind_after_ms // 1000,
            self._delivery,
            about_call=False,
        )


class WaitingState:
    """What :class:`Waiting` has read: the next call (``next``), the episode counter and current
    ``episode``, and per wait key (a process, or ``"sleep"``) its quiet time in ms, its checks
    since the last output and the next reminder mark in ms (``spans``; tuples, so a copy shares
    them). Mutable; :meth:`copy` is independent."""

    __slots__ = ("episode", "episodes", "next", "spans")

    def __init__(self, episodes: EpisodeCounter) -> None:
        self.episodes = episodes
        self.next = 0
        self.episode = -1
        self.spans: dict[str, tuple[int, int, int]] = {}

    def copy(self) -> WaitingState:
        out = WaitingState(self.episodes.copy())
        out.next, out.episode = self.next, self.episode
        out.spans = dict(self.spans)
        return out
