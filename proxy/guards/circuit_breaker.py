"""circuit_breaker: withhold the results of windowed duplicate calls, past a volume cap, and of
calls that bring nothing new in a runaway (DESIGN §6.2, §2.2).

Seed: dsh-circuit-breaker (duplicate limit 6 in a window of 200, cap 300 calls per agent, over the
whole conversation: ``config/profiles/dsh-circuit-breaker.yaml`` keeps exactly that).

Rules:
- Guarded calls: those matching ``only`` when it is set (it overrides ``exempt``), else every call
  not matching ``exempt``. Unguarded calls are invisible: they never count, never fill the window.
- ``scope``: what every count below runs over. ``episode`` (the default): the calls since the
  user's last new request (:mod:`proxy.core.episodes`: a continuation, a compaction summary or a
  harness's format-error reply is none); at every new request the duplicate window, the counts,
  the volume cap and the waste window start afresh, so a routine ``git status --short`` run after
  each of a hundred "commit and continue" prompts is never a duplicate. ``conversation``: over the
  whole conversation, user messages never reset anything (the seed).
- Guarded calls are replayed in conversation order (parallel calls of one step in listed order).
  A call is denied
  - ``cap``: when ``max_calls_per_agent`` (> 0) executed calls precede it in the scope;
  - ``duplicate``: when ``duplicate_limit`` calls with its canonical key (DESIGN §5, with
    ``ignore_args`` dropped) are already among the last ``window`` executed calls;
  - ``waste``: when it brings nothing new and, with it, at least ``waste_limit`` of the scope's
    last ``waste_window`` calls brought nothing new (the waste cap: a runaway is told by what its
    calls bring, not by how many there are). A call brings nothing new when it changed nothing
    (:mod:`proxy.core.effects`; a novel successful edit or command is new) and its result is one the
    scope already got, with nothing in between that changed the situation: the same as its key's
    previous result (masked, :mod:`proxy.core.progress`; progress-aware), or the very same text
    (and error flag) the same tool returned for any arguments.
    A call whose result is not known (the response side's look-ahead) is denied when the scope's
    last calls already reached the limit. Waits (:mod:`proxy.core.waits`) never enter the window.
  Checked in that order (cap, duplicate, waste): a denial has one kind.
- ``progress_aware``: a call whose key was seen before counts as a duplicate only when
  its result equals the previous result for that key after masking volatile spans
  (:mod:`proxy.core.progress`); a new result is progress: the call runs and is not counted (it does not
  enter the duplicate count; it still counts towards the volume cap). A call whose result has not
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
- Denied calls do not enter the duplicate window and do not count as executed (they do enter the
  waste window: what they got was nothing new). Every other guarded call is executed, *whether or
  not its result is in the request yet*: verdicts depend only on the sequence of calls, so a
  result arriving on a later request never changes the verdict of any call.
- A denial becomes a :class:`~proxy.core.actions.Withhold` of the call's tool result. A denied call whose
  result has not arrived yet gets no action (there is nothing to replace); it still stays out of
  the window.
- Evidence: ``count`` is the call's ordinal among the calls the rule compares, denied ones
  included (``duplicate``: guarded calls with the same key in the scope so far; ``cap``: guarded
  calls in the scope so far; ``waste``: the calls among the last ``waste_window`` that brought
  nothing new); ``limit`` is ``duplicate_limit``, ``max_calls_per_agent`` or ``waste_window``;
  ``reason`` is the kind.
- Text: ``deny_message`` rendered with ``{tool}``, ``{count}``, ``{limit}``, ``{kind}``; when it is
  empty, :data:`DUPLICATE_TEXT`, :data:`CAP_TEXT` (:data:`EPISODE_CAP_TEXT` in episode scope) or
  :data:`WASTE_TEXT`. The texts never claim the call did not run (the agent did run it: only its
  result is withheld from the model).
"""

from __future__ import annotations

from collections import Counter, deque

from proxy.config import CircuitBreakerConfig
from proxy.core.actions import Action, Withhold
from proxy.core.canonical import canonical_arguments
from proxy.core.effects import EpochCounter, Situations
from proxy.core.episodes import EpisodeCounter
from proxy.core.patterns import NamePatterns
from proxy.core.progress import RepeatJudge, same_result
from proxy.core.transcript import ToolCall, ToolResult, Transcript
from proxy.core.waits import is_wait
from proxy.guards.resume import unread
from proxy.guards.wording import QUOTE, Style, speak

RULE = "circuit_breaker"
DUPLICATE = "duplicate"
CAP = "cap"
WASTE = "waste"
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

EPISODE_CAP_TEXT = (
    "[loopguard] The result of this call is withheld: you have reached the limit of {limit} tool "
    "calls for the user's last request (this was call {count}). Stop calling tools: tell the user "
    "what you have done and found so far, what is left, and what you need from them."
)

#: ``recovery.reminders: plain | redirect`` (:mod:`proxy.guards.wording`): the duplicate denial
#: without the tool's name (the cap and waste texts name no call: the same in every style).
PLAIN_DUPLICATE_TEXT = (
    "[loopguard] The result of this call is withheld: you have now made this same call {count} "
    "times, and the limit is {limit}. Repeating it will not give you anything new."
)
PLAIN_DUPLICATE_CLOSE = (
    "Stop making this call: use the results you already have, change your approach, or tell the "
    "user what is blocking you."
)

WASTE_TEXT = (
    "[loopguard] The result of this call is withheld: it gave you nothing you did not already have, "
    "and neither did {count} of your last {limit} tool calls (the same results again, with nothing "
    "changed in between). You are going round in circles. Stop calling tools: tell the user what you "
    "have found, what is blocking you, and what you need from them."
)


class CircuitBreaker:
    """Guard callable: ``CircuitBreaker(cfg)(transcript, ctx) -> list[Withhold]``."""

    __slots__ = ("_cfg", "_exempt", "_ignore", "_only", "_plain", "_situations", "_texts")

    name = RULE

    def __init__(
        self, cfg: CircuitBreakerConfig, situations: Situations | None = None, style: Style = QUOTE
    ) -> None:
        self._cfg = cfg
        # the duplicate denial's style; a deny_message the user wrote is used as written
        self._plain: Style | None = style if style != QUOTE and not cfg.deny_message else None
        self._situations = situations or Situations()
        self._exempt = NamePatterns(cfg.exempt)
        self._only = NamePatterns(cfg.only)
        self._ignore = frozenset(cfg.ignore_args)
        self._texts = {
            DUPLICATE: cfg.deny_message or DUPLICATE_TEXT,
            CAP: cfg.deny_message or (EPISODE_CAP_TEXT if cfg.scope == "episode" else CAP_TEXT),
            WASTE: cfg.deny_message or WASTE_TEXT,
        }

    def guarded(self, name: str) -> bool:
        if self._only:
            return self._only.matches(name)
        return not self._exempt.matches(name)

    def begin(self) -> BreakerState:
        """The state before any call (:mod:`proxy.guards.resume`)."""
        cfg = self._cfg
        epochs = self._situations.epoch_counter() if cfg.progress_aware or cfg.waste_window else None
        judge = RepeatJudge(self._situations.masks, epochs) if cfg.progress_aware else None
        episodes = self._situations.episode_counter() if cfg.scope == "episode" else None
        return BreakerState(judge, epochs, episodes)

    def __call__(self, transcript: Transcript, ctx: object = None) -> list[Action]:
        return self.advance(self.begin(), transcript, ctx, transcript.message_count)

    def advance(self, state: BreakerState, transcript: Transcript, ctx: object, upto: int) -> list[Action]:
        """Read the calls before message position ``upto`` that ``state`` has not read
        (:mod:`proxy.guards.resume`); the withholds decided for them."""
        cfg = self._cfg
        cap = cfg.max_calls_per_agent
        waste_window, waste_limit = cfg.waste_window, cfg.waste_limit
        keep_sole = not cfg.ignore_sole_args
        masks = self._situations.masks
        s = state
        judge = s.judge
        actions: list[Action] = []
        calls = transcript.calls
        for call in unread(s, calls, upto):
            if not self.guarded(call.name):  # unguarded calls are ignored entirely: no situation
                continue
            if s.episodes is not None and s.episodes.of(transcript, call.position) != s.episode:
                s.new_scope(s.episodes.k)  # a new request from the user: every count starts afresh
            if is_wait(call):  # waiting is not looping (proxy.core.waits): never counted nor denied,
                if s.epochs is not None:  # but time passed
                    s.epochs.add(call)
                    s.guarded += 1
                continue
            key = (
                call.name,
                canonical_arguments(call.arguments, call.arguments_raw, self._ignore, keep_sole),
            )
            index = s.guarded
            s.guarded += 1
            s.in_scope += 1
            if s.epochs is not None:
                s.epochs.add(call)
            # progress: the key was seen before, but the result is new or the situation changed
            # in between (a first call never is)
            repeat = judge is not None and judge.repeats(key, call.result, index) and key in s.seen
            progress = judge is not None and not repeat and key in s.seen
            known = call.result is not None and not call.result.pending
            if judge is not None and known:
                assert call.result is not None
                kept = s.distinct.get(key, ())
                if not any(same_result(r, call.result, masks) for r in kept):
                    s.distinct[key] = (*kept, call.result)[-NOVEL_AMONG:]
                    if progress and s.in_window[key]:  # a result never seen: the count starts again
                        s.window = deque(None if k == key else k for k in s.window)
                        s.in_window[key] = 0
            if not progress:
                s.seen[key] += 1
            wasted = self._waste(s, call, index, repeat) if waste_window else None
            if cap and s.executed >= cap:
                kind, count, limit = CAP, s.in_scope, cap
            elif not progress and s.in_window[key] >= cfg.duplicate_limit:
                kind, count, limit = DUPLICATE, s.seen[key], cfg.duplicate_limit
            elif waste_window and wasted is not False and s.wasted >= waste_limit:
                # wasted None: a result not known yet, after calls that reached the limit
                kind, count, limit = WASTE, s.wasted, waste_window
            else:
                s.executed += 1
                window = s.window
                window.append(None if progress else key)  # a progress call takes a slot, uncounted
                if not progress:
                    s.in_window[key] += 1
                if len(window) > cfg.window and (old := window.popleft()) is not None:
                    s.in_window[old] -= 1
                continue
            if call.result is None:
                continue
            if kind == DUPLICATE and self._plain is not None:
                plain = PLAIN_DUPLICATE_TEXT.format(count=count, limit=limit)
                text = speak(self._plain, plain, transcript, call, PLAIN_DUPLICATE_CLOSE)
            else:
                text = self._texts[kind].format(tool=call.name, count=count, limit=limit, kind=kind)
            actions.append(
                Withhold(
                    position=call.result.position,
                    part=call.result.part,
                    call_id=call.call_id,
                    text=text,
                    rule=RULE,
                    tool=call.name,
                    count=count,
                    limit=limit,
                    fresh=transcript.is_fresh(call.step),
                    reason=kind,
                )
            )
        return actions

    def _waste(self, s: BreakerState, call: ToolCall, index: int, repeat: bool) -> bool | None:
        """Whether ``call`` (guarded, not a wait, the ``index``-th added to ``s.epochs``; ``repeat``:
        the judge found it repeating the scope's previous call with its key) brought nothing new,
        entered into the waste window; None (and not entered) when its result is not known.

        Nothing new: the call changed nothing, and either it repeats its key's previous call (the
        same result masked, nothing changed in between) or the scope got this very result from
        this tool before with nothing changed since. Results of other arguments are compared as
        they are, not masked: a result is read once, kept by reference, and compared by its
        (cached) hash, so a long history costs no masking of every result."""
        result = call.result
        if result is None or result.pending:
            return None
        assert s.epochs is not None
        before, after = s.epochs.before[index], s.epochs.after[index]
        got = (call.name, result.is_error, result.text)
        last = s.results.get(got)
        wasted = after == before and (repeat or last == before)
        if last != after:
            if not s.own_results:
                s.results, s.own_results = dict(s.results), True
            s.results[got] = after
        s.waste.append(wasted)
        s.wasted += wasted
        if len(s.waste) > self._cfg.waste_window:
            s.wasted -= s.waste.popleft()
        return wasted


class BreakerState:
    """What :class:`CircuitBreaker` has read: the next call (``next``, an index into
    ``transcript.calls``), the guarded calls read (``guarded``, the index of the situation
    counter), and of the current scope (``episode``, its number; the whole conversation in
    conversation scope): its guarded calls (``in_scope``) and those executed (``executed``), the
    ``window`` of executed keys (None: a progress call's slot) with their counts
    (``in_window``), the non-progress calls per key (``seen``), each key's last different results
    (``distinct``, at most :data:`NOVEL_AMONG`, oldest first; tuples, so a copy shares them), the
    waste window (``waste``: per recent call, it brought nothing new; ``wasted`` how many did) and
    per result got (tool, error flag, text) the situation number after it was last got
    (``results``; shared by copies until one changes it). Progress-aware, the judge; with either,
    the situation counter; in episode scope, the episode counter. Mutable; :meth:`copy` is
    independent."""

    __slots__ = (
        "distinct",
        "episode",
        "episodes",
        "epochs",
        "executed",
        "guarded",
        "in_scope",
        "in_window",
        "judge",
        "next",
        "own_results",
        "results",
        "seen",
        "waste",
        "wasted",
        "window",
    )

    def __init__(
        self, judge: RepeatJudge | None, epochs: EpochCounter | None, episodes: EpisodeCounter | None = None
    ) -> None:
        self.judge = judge
        self.epochs = epochs
        self.episodes = episodes
        self.next = 0
        self.guarded = 0
        self._empty(0)

    def new_scope(self, episode: int) -> None:
        """Start the scope ``episode`` afresh: nothing counted in it yet, no earlier call to
        compare with."""
        self._empty(episode)
        if self.judge is not None:
            self.judge.forget()

    def _empty(self, episode: int) -> None:
        self.episode = episode
        self.in_scope = 0
        self.executed = 0
        self.window: deque[tuple[str, str] | None] = deque()
        self.in_window: Counter[tuple[str, str]] = Counter()
        self.seen: Counter[tuple[str, str]] = Counter()
        self.distinct: dict[tuple[str, str], tuple[ToolResult, ...]] = {}
        self.waste: deque[bool] = deque()
        self.wasted = 0
        self.results: dict[tuple[str, bool, str], int] = {}
        self.own_results = True

    def copy(self) -> BreakerState:
        epochs = self.epochs.copy() if self.epochs is not None else None
        episodes = self.episodes.copy() if self.episodes is not None else None
        out = BreakerState(self.judge.copy(epochs) if self.judge is not None else None, epochs, episodes)
        out.next, out.guarded, out.executed = self.next, self.guarded, self.executed
        out.episode, out.in_scope = self.episode, self.in_scope
        out.window = deque(self.window)
        out.in_window = Counter(self.in_window)
        out.seen = Counter(self.seen)
        out.distinct = dict(self.distinct)
        out.waste, out.wasted = deque(self.waste), self.wasted
        out.results, out.own_results = self.results, False
        self.own_results = False  # shared from now on: either copies it before changing it
        return out
