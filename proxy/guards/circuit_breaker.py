"""circuit_breaker: withhold the results of windowed duplicate calls and past a lifetime cap
(DESIGN §6.2).

Seed: dsh-circuit-breaker (duplicate limit 6 in a window of 200, cap 300 calls per agent).

Rules:
- Guarded calls: those matching ``only`` when it is set (it overrides ``exempt``), else every call
  not matching ``exempt``. Unguarded calls are invisible: they never count, never fill the window.
- Guarded calls are replayed in conversation order (parallel calls of one step in listed order).
  A call is denied
  - ``cap``: when ``max_calls_per_agent`` (> 0) executed calls precede it in the conversation
    (user messages do not reset this);
  - ``duplicate``: when ``duplicate_limit`` calls with its canonical key (DESIGN §5, with
    ``ignore_args`` dropped) are already among the last ``window`` executed calls.
  The cap is checked first, so once it is reached every later denial is of kind ``cap``.
- ``progress_aware``: a call whose key was seen before counts as a duplicate only when
  its result equals the previous result for that key after masking volatile spans
  (:mod:`proxy.core.progress`); a new result is progress: the call runs and is not counted (it does not
  enter the duplicate count; it still counts towards the lifetime cap). A call whose result has not
  arrived is judged by the previous pair. So only results identical to one the model already has
  are ever withheld as duplicates. A repeat counts only when nothing between it and the previous
  call with its key changed the situation (:mod:`proxy.core.effects`): a routine call repeated
  across a session full of edits (``cp x.orig x`` between fix attempts) is progress, not a loop.
  A result unlike every one of the last :data:`NOVEL_AMONG` different results for the key (a job
  polled with one command whose output moves on) also clears the key's duplicates counted so far:
  polling a build that advances every few polls is never withheld, while a loop that alternates
  between results it already had keeps counting (found by a new user's Claude Code tryout).
- ``ignore_args`` are dropped only while the call keeps another argument (a ``think`` tool whose
  one argument is ``thought`` is compared by it); ``ignore_sole_args`` drops them even then (the
  seed).
- Denied calls do not enter the window and do not count as executed. Every other guarded call is
  executed, *whether or not its result is in the request yet*: verdicts depend only on the sequence
  of calls, so a result arriving on a later request never changes the verdict of any call.
- A denial becomes a :class:`~proxy.core.actions.Withhold` of the call's tool result. A denied call whose
  result has not arrived yet gets no action (there is nothing to replace); it still stays out of
  the window.
- Evidence: ``count`` is the call's ordinal among the calls the rule compares, denied ones
  included (``duplicate``: guarded calls with the same key so far; ``cap``: all guarded calls so
  far); ``limit`` is ``duplicate_limit`` or ``max_calls_per_agent``; ``reason`` is the kind.
- Text: ``deny_message`` rendered with ``{tool}``, ``{count}``, ``{limit}``, ``{kind}``; when it is
  empty, :data:`DUPLICATE_TEXT` or :data:`CAP_TEXT`. The texts never claim the call did not run
  (the agent did run it: only its result is withheld from the model).
"""

from __future__ import annotations

from collections import Counter, deque

from proxy.config import CircuitBreakerConfig
from proxy.core.actions import Action, Withhold
from proxy.core.canonical import canonical_arguments
from proxy.core.effects import EpochCounter, Situations
from proxy.core.patterns import NamePatterns
from proxy.core.progress import RepeatJudge, same_result
from proxy.core.transcript import ToolResult, Transcript
from proxy.core.waits import is_wait
from proxy.guards.resume import unread

RULE = "circuit_breaker"
DUPLICATE = "duplicate"
CAP = "cap"
#: How many of a key's different results a new one is compared with (``progress_aware``).
NOVEL_AMONG = 8

DUPLICATE_TEXT = (
    "[loopguard] The result of this call is withheld: you have now called {tool} with these same "
    "arguments {count} times, and the limit is {limit}. Repeating it will not give you anything "
    "new. Stop making this call: use the results you already have, change your approach, or tell "
    "the user what is blocking you."
)

CAP_TEXT = (
    "[loopguard] The result of this call is withheld: this conversation has reached its limit of "
    "{limit} tool calls (this was call {count}). Stop calling tools: tell the user what you have "
    "done and found so far, what is left, and what you need from them."
)


class CircuitBreaker:
    """Guard callable: ``CircuitBreaker(cfg)(transcript, ctx) -> list[Withhold]``."""

    __slots__ = ("_cfg", "_exempt", "_ignore", "_only", "_situations", "_texts")

    name = RULE

    def __init__(self, cfg: CircuitBreakerConfig, situations: Situations | None = None) -> None:
        self._cfg = cfg
        self._situations = situations or Situations()
        self._exempt = NamePatterns(cfg.exempt)
        self._only = NamePatterns(cfg.only)
        self._ignore = frozenset(cfg.ignore_args)
        self._texts = {
            DUPLICATE: cfg.deny_message or DUPLICATE_TEXT,
            CAP: cfg.deny_message or CAP_TEXT,
        }

    def guarded(self, name: str) -> bool:
        if self._only:
            return self._only.matches(name)
        return not self._exempt.matches(name)

    def begin(self) -> BreakerState:
        """The state before any call (:mod:`proxy.guards.resume`)."""
        epochs = self._situations.epoch_counter() if self._cfg.progress_aware else None
        judge = RepeatJudge(self._situations.masks, epochs) if epochs is not None else None
        return BreakerState(judge, epochs)

    def __call__(self, transcript: Transcript, ctx: object = None) -> list[Action]:
        return self.advance(self.begin(), transcript, ctx, transcript.message_count)

    def advance(self, state: BreakerState, transcript: Transcript, ctx: object, upto: int) -> list[Action]:
        """Read the calls before message position ``upto`` that ``state`` has not read
        (:mod:`proxy.guards.resume`); the withholds decided for them."""
        cfg = self._cfg
        cap = cfg.max_calls_per_agent
        keep_sole = not cfg.ignore_sole_args
        masks = self._situations.masks
        s = state
        judge, in_window, seen, distinct = s.judge, s.in_window, s.seen, s.distinct
        actions: list[Action] = []
        calls = transcript.calls
        for call in unread(s, calls, upto):
            if not self.guarded(call.name):  # unguarded calls are ignored entirely: no situation
                continue
            if is_wait(call):  # waiting is not looping (proxy.core.waits): never counted nor denied,
                if judge is not None and s.epochs is not None:  # but time passed
                    s.epochs.add(call)
                    s.guarded += 1
                continue
            key = (
                call.name,
                canonical_arguments(call.arguments, call.arguments_raw, self._ignore, keep_sole),
            )
            index = s.guarded
            s.guarded += 1
            if judge is not None and s.epochs is not None:
                s.epochs.add(call)
            # progress: the key was seen before, but the result is new or the situation changed
            # in between (a first call never is)
            progress = judge is not None and not judge.repeats(key, call.result, index) and key in seen
            if judge is not None and call.result is not None and not call.result.pending:
                kept = distinct.get(key, ())
                if not any(same_result(r, call.result, masks) for r in kept):
                    distinct[key] = (*kept, call.result)[-NOVEL_AMONG:]
                    if progress and in_window[key]:  # a result never seen: the count starts again
                        s.window = deque(None if k == key else k for k in s.window)
                        in_window[key] = 0
            if not progress:
                seen[key] += 1
            if cap and s.executed >= cap:
                kind, count, limit = CAP, s.guarded, cap
            elif not progress and in_window[key] >= cfg.duplicate_limit:
                kind, count, limit = DUPLICATE, seen[key], cfg.duplicate_limit
            else:
                s.executed += 1
                window = s.window
                window.append(None if progress else key)  # a progress call takes a slot, uncounted
                if not progress:
                    in_window[key] += 1
                if len(window) > cfg.window and (old := window.popleft()) is not None:
                    in_window[old] -= 1
                continue
            if call.result is None:
                continue
            actions.append(
                Withhold(
                    position=call.result.position,
                    part=call.result.part,
                    call_id=call.call_id,
                    text=self._texts[kind].format(tool=call.name, count=count, limit=limit, kind=kind),
                    rule=RULE,
                    tool=call.name,
                    count=count,
                    limit=limit,
                    fresh=transcript.is_fresh(call.step),
                    reason=kind,
                )
            )
        return actions


class BreakerState:
    """What :class:`CircuitBreaker` has read: the next call (``next``, an index into
    ``transcript.calls``), the guarded calls read (``guarded``) and those executed
    (``executed``), the ``window`` of executed keys (None: a progress call's slot) with their
    counts (``in_window``), the non-progress calls per key (``seen``), each key's last different
    results (``distinct``, at most :data:`NOVEL_AMONG`, oldest first; tuples, so a copy shares
    them) and, progress-aware, the judge with its situation counter. Mutable; :meth:`copy` is
    independent."""

    __slots__ = (
        "distinct",
        "epochs",
        "executed",
        "guarded",
        "in_window",
        "judge",
        "next",
        "seen",
        "window",
    )

    def __init__(self, judge: RepeatJudge | None, epochs: EpochCounter | None) -> None:
        self.judge = judge
        self.epochs = epochs
        self.next = 0
        self.guarded = 0
        self.executed = 0
        self.window: deque[tuple[str, str] | None] = deque()
        self.in_window: Counter[tuple[str, str]] = Counter()
        self.seen: Counter[tuple[str, str]] = Counter()
        self.distinct: dict[tuple[str, str], tuple[ToolResult, ...]] = {}

    def copy(self) -> BreakerState:
        epochs = self.epochs.copy() if self.epochs is not None else None
        out = BreakerState(self.judge.copy(epochs) if self.judge is not None else None, epochs)
        out.next, out.guarded, out.executed = self.next, self.guarded, self.executed
        out.window = deque(self.window)
        out.in_window = Counter(self.in_window)
        out.seen = Counter(self.seen)
        out.distinct = dict(self.distinct)
        return out
