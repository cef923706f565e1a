"""echo_loop (fixture T3): the same command template re-run with only quoted literals
changed, while its output just echoes them back — advisory.

Rules, per episode (a turn that only a new request starts, :mod:`proxy.core.episodes`):
- A call's *template* is its tool name and canonical arguments with every quoted literal inside
  a string argument (``'…'`` or ``"…"`` on one line) replaced by a placeholder. Its *literals*
  are those quoted texts of at least ``min_literal_chars`` characters.
- A call *echoes* when its arguments differ from the previous call's but its template is the
  same, at least one of its literals that the previous call did not have appears in its
  result, and its result with its literals removed equals the previous call's result with that
  call's literals removed (both masked, :mod:`proxy.core.progress`): the output carries nothing but
  the changed literal. ``cat "a.py"`` then ``cat "b.py"`` do not echo (file contents are new), nor
  do ``touch "a"``, ``touch "b"`` (nothing echoed), nor a poll with the same arguments.
- Consecutive echoing calls form a chain (the first call of the template counts as 1); a
  reminder fires when it reaches ``repeats`` (3).
"""

from __future__ import annotations

import re
from typing import Any

from proxy.config import EchoLoopConfig
from proxy.core.actions import Action, Delivery
from proxy.core.canonical import canonical_arguments
from proxy.core.effects import Situations
from proxy.core.episodes import EpisodeCounter
from proxy.core.memo import Memo
from proxy.core.progress import mask
from proxy.core.transcript import ToolCall, Transcript
from proxy.core.waits import is_wait
from proxy.guards.repeat_reminder import preview
from proxy.guards.resume import unread
from proxy.guards.turns import call_memo, known, memoized, remind_after_step
from proxy.guards.wording import QUOTE, Style, speak

RULE = "echo_loop"
PREVIEW_CHARS = 300
_LITERAL = re.compile(r"'([^'\n]*)'|\"([^\"\n]*)\"")
PLACEHOLDER = "'\u2026'"

TEXT = (
    "[loopguard] Your last {count} calls ran the same {tool} command with only a quoted text "
    "changed, and each output just echoed that text back:\n"
    "- template: {template}\n"
    "Nothing new is coming back: each output is only the text you put in. Write the "
    "actual code or command the task needs, or tell the user what is blocking you."
)
#: ``recovery.reminders: plain | redirect`` (:mod:`proxy.guards.wording`): neither the tool nor the
#: template.
PLAIN_TEXT = (
    "[loopguard] Your last {count} calls ran the same command with only a quoted text changed, and "
    "each output just echoed that text back. Nothing new is coming back: each output is only the "
    "text you put in."
)
PLAIN_CLOSE = "Write the actual code or command the task needs, or tell the user what is blocking you."


def _literals(value: Any, out: list[str]) -> Any:
    """``value`` with quoted literals in its strings masked; the literals appended to ``out``."""
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            out.append(m.group(1) if m.group(1) is not None else m.group(2))
            return PLACEHOLDER

        return _LITERAL.sub(sub, value)
    if isinstance(value, list):
        return [_literals(v, out) for v in value]
    if isinstance(value, dict):
        return {k: _literals(v, out) for k, v in value.items()}
    return value


class EchoLoop:
    """Guard callable: ``EchoLoop(cfg)(transcript, ctx) -> list[Remind]``."""

    __slots__ = ("_cfg", "_delivery", "_masks", "_memo", "_situations", "_style")

    name = RULE
    #: only reminds: the response-side stop check need not ask it (proxy.response.decide.StopJudge)
    withholds = False

    def __init__(
        self,
        cfg: EchoLoopConfig,
        delivery: Delivery = "user",
        situations: Situations | None = None,
        style: Style = QUOTE,
    ) -> None:
        self._style = style
        self._situations = situations or Situations()
        self._cfg = cfg
        self._delivery = delivery
        self._masks = self._situations.masks
        self._memo: Memo[tuple[str, str], tuple[str, str, frozenset[str]]] = call_memo()

    def shape(self, call: ToolCall) -> tuple[str, str, frozenset[str]]:
        """Exact canonical arguments, template, literals of ``call`` (memoized per tool and
        arguments string)."""
        return memoized(self._memo, call, self._shape)

    def _shape(self, call: ToolCall) -> tuple[str, str, frozenset[str]]:
        exact = canonical_arguments(call.arguments, call.arguments_raw)
        found: list[str] = []
        if isinstance(call.arguments, dict | list):
            masked = _literals(call.arguments, found)
            template = canonical_arguments(masked, None)
        else:
            template = exact
        lits = frozenset(x for x in found if len(x) >= self._cfg.min_literal_chars)
        return exact, template, lits

    def residue(self, call: ToolCall, lits: frozenset[str]) -> str | None:
        if not known(call.result):
            return None
        assert call.result is not None
        text = call.result.text
        for lit in sorted(lits, key=len, reverse=True):
            text = text.replace(lit, "")
        return mask(text, self._masks)

    def begin(self) -> EchoState:
        """The state before any call (:mod:`proxy.guards.resume`)."""
        return EchoState(self._situations.episode_counter())

    def __call__(self, transcript: Transcript, ctx: object = None) -> list[Action]:
        return self.advance(self.begin(), transcript, ctx, transcript.message_count)

    def advance(self, state: EchoState, transcript: Transcript, ctx: object, upto: int) -> list[Action]:
        """Read the calls before message position ``upto`` that ``state`` has not read
        (:mod:`proxy.guards.resume`); the reminders decided for them."""
        cfg = self._cfg
        actions: list[Action] = []
        calls = transcript.calls
        s = state
        # the previous call's shape and residue (masking is the costly part: at most once per call)
        prev = self.shape(calls[s.prev]) if s.prev is not None else None
        prev_rest: str | _Unset | None = UNSET
        for call in unread(s, calls, upto):
            if is_wait(call):  # waiting is not looping (proxy.core.waits): transparent here
                continue
            episode = s.episodes.of(transcript, call.position)
            if episode != s.episode:  # a new episode: no previous call, the chain starts over
                s.episode, s.prev, prev = episode, None, None
            exact, template, lits = self.shape(call)
            echoes = False
            rest: str | _Unset | None = UNSET
            if s.prev is not None and prev is not None:
                before = calls[s.prev]
                if (before.name, prev[1]) == (call.name, template) and prev[0] != exact:
                    new = lits - prev[2]
                    text = call.result.text if known(call.result) and call.result is not None else ""
                    if new and any(lit in text for lit in new):
                        rest = self.residue(call, lits)
                        if rest is not None:
                            if isinstance(prev_rest, _Unset):
                                prev_rest = self.residue(before, prev[2])
                            echoes = rest == prev_rest
            s.chain = s.chain + 1 if echoes else 1
            s.prev, prev, prev_rest = call.seq, (exact, template, lits), rest
            if s.chain != cfg.repeats:
                continue
            chain = s.chain
            if self._style != QUOTE:
                msg = speak(self._style, PLAIN_TEXT.format(count=chain), transcript, call, PLAIN_CLOSE)
            else:
                msg = TEXT.format(count=chain, tool=call.name, template=preview(template, PREVIEW_CHARS))
            action = remind_after_step(transcript, call, msg, RULE, chain, cfg.repeats, self._delivery)
            if action is not None:
                actions.append(action)
        return actions


class _Unset:
    """The type of :data:`UNSET`: a residue not computed yet."""

    __slots__ = ()


UNSET = _Unset()


class EchoState:
    """What :class:`EchoLoop` has read: the next call (``next``, a ``seq``), the episode counter,
    the open episode (``episode``), its previous call (``prev``: its ``seq``, None before its
    first; its shape and residue are computed again when needed, the same) and the echo chain
    (``chain``). Mutable; :meth:`copy` is independent."""

    __slots__ = ("chain", "episode", "episodes", "next", "prev")

    def __init__(self, episodes: EpisodeCounter) -> None:
        self.episodes = episodes
        self.next = 0
        self.episode = -1
        self.prev: int | None = None
        self.chain = 0

    def copy(self) -> EchoState:
        """An independent copy."""
        out = EchoState(self.episodes.copy())
        out.next, out.episode, out.prev, out.chain = self.next, self.episode, self.prev, self.chain
        return out
