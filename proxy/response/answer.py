"""One answer as the response side judges it, whatever its wire (DESIGN §2.1): the text and the tool
calls a dialect's decoder reads out of the upstream's events, and the decisions on them.

A stream guard (:mod:`proxy.response.stream_guard` for chat completions, one per choice;
:mod:`proxy.response.responses_stream` for the Responses API) decodes its events and tells an
:class:`AnswerState` what they said, in three neutral messages:

- :meth:`AnswerState.text`: a text delta (``reasoning`` or the answer's content); returns the
  degenerate-text :class:`~proxy.core.actions.Cut` the moment the text degenerates (:mod:`degenerate`);
- :meth:`AnswerState.runaway`: the calls so far (:class:`~proxy.response.assemble.AssembledCall`, in
  order) and how many of them are complete; returns the runaway cut the moment a call goes past
  ``response.max_calls_per_response``, ``max_identical_per_response`` (calls that may change
  state) or ``max_identical_reads_per_response`` (read-only calls,
  :func:`~proxy.response.decide.runaway_cut`);
- :meth:`AnswerState.decide`: the answer's calls are all in (its finish); returns the calls kept, the
  runaway cut and the :class:`~proxy.core.actions.Stop` of the stop judge.

What the guard then holds, drops and writes is its dialect's own (the encoders). No I/O here.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.config import Config
from proxy.core.actions import Cut, Stop
from proxy.response.assemble import AssembledCall
from proxy.response.decide import DEGENERATE_RULE, StopJudge, effects_of, runaway_cut
from proxy.response.degenerate import RepetitionDetector


class AnswerState:
    """One answer (one chat choice, one Responses response). ``text_seen``: content came (not
    reasoning); ``said``: the content so far; ``complete``: calls known to be complete."""

    __slots__ = ("_cfg", "_content", "_judge", "_reasoning", "_text", "complete", "text_seen")

    def __init__(self, cfg: Config, judge: StopJudge | None) -> None:
        self._cfg = cfg
        self._judge = judge
        dcfg = cfg.response.degenerate_text
        self._content = RepetitionDetector(dcfg) if dcfg.enabled else None
        self._reasoning = RepetitionDetector(dcfg) if dcfg.enabled else None
        self._text: list[str] = []
        self.text_seen = False
        self.complete = 0

    @property
    def said(self) -> str:
        return "".join(self._text)

    def text(self, delta: str, reasoning: bool = False, detect: bool = True) -> Cut | None:
        """A text delta. Returns the degenerate-text cut (not yet recorded anywhere) when the
        text now ends in one span repeated ``degenerate_text.min_repeats`` times, else None.
        ``detect=False``: the delta is not read for degenerate text (held tool calls written as
        text, :mod:`proxy.response.repair`)."""
        if not delta:
            return None
        if not reasoning:
            self.text_seen = True
            self._text.append(delta)
        if not detect:
            return None
        detector = self._reasoning if reasoning else self._content
        rep = detector.feed(delta) if detector is not None else None
        if rep is None:
            return None
        limit = self._cfg.response.degenerate_text.min_repeats
        return Cut(DEGENERATE_RULE, "", rep.repeats, limit, "reasoning" if reasoning else "content")

    def runaway(self, calls: Sequence[AssembledCall], complete: int) -> Cut | None:
        """The runaway rule once ``complete`` of ``calls`` are complete (never fewer than
        before); None when it is off or nothing is past a limit."""
        cfg = self._cfg.response
        if not (
            cfg.max_calls_per_response
            or cfg.max_identical_per_response
            or cfg.max_identical_reads_per_response
        ):
            return None
        self.complete = max(self.complete, complete)
        return runaway_cut(calls, cfg, self.complete, effects_of(self._cfg.progress))

    def decide(
        self, calls: Sequence[AssembledCall], cut: Cut | None = None, text: str | None = None
    ) -> tuple[Sequence[AssembledCall], Cut | None, Stop | None]:
        """All of the answer's calls are in: (the calls kept, the runaway cut over all of them
        unless ``cut`` is given, the stop judge's Stop on the kept calls and the text: ``text``,
        or the content seen). The judge is asked when calls are kept or the answer is text only."""
        if cut is None:
            cut = self.runaway(calls, len(calls))
        kept = calls[: cut.count] if cut else calls
        text_only = not calls and self.text_seen
        said = self.said if text is None else text
        stop = self._judge(kept, said) if self._judge is not None and (kept or text_only) else None
        return kept, cut, stop
