"""How the model-facing texts speak of a looping call (``recovery.reminders``, DESIGN §2.2:
interventions must not feed the loop).

- ``quote`` (the default): each rule's own text, which names the looping call's tool and shows
  its arguments or target (the seeds' texts, kept byte for byte);
- ``plain``: the rule's plain text (kept next to its quoting one, in the rule's module): neither
  the looping call's tool nor its arguments nor its target, only what is true of the transcript
  ("you have made the same tool call 3 times in a row, and it returned the same result each
  time"), then :data:`PLAIN_CLOSE` or the rule's own closing line;
- ``redirect``: the plain text with its closing line replaced by what to do instead
  (:func:`instead`): the result already in hand, the offered tools this turn has not used, or an
  answer to the user.

Everything here is a pure function of the transcript up to the call the text is about (the offered
tool set is the request's), so a text re-derived on a later request is byte-identical and the
upstream's prefix cache stays valid. A template the user wrote (``deny_message``) is used as written.
Measured on a real local model by ``bench/recovery``: a reminder quoting the looping call made a
weak model repeat it.
"""

from __future__ import annotations

from typing import Literal

from proxy.core.transcript import ToolCall, Transcript

Style = Literal["quote", "plain", "redirect"]
QUOTE: Style = "quote"
PLAIN: Style = "plain"
REDIRECT: Style = "redirect"

#: The closing line of a plain text when the rule has none of its own.
PLAIN_CLOSE = "Do not make that call again: change your approach, or tell the user what is blocking you."
#: How many untried tools :func:`instead` names at most (in the order the request offered them).
UNTRIED_NAMES = 5

IN_HAND = "What those calls returned is already above: use it instead of asking for it again."
UNTRIED = "Tools you have not used since the user's last message: {names}."
ANSWER = (
    "If you have what you need, answer the user now with what you know; if not, say what is blocking you."
)


def untried(transcript: Transcript, call: ToolCall) -> list[str]:
    """The tools ``transcript`` offered that no call of ``call``'s turn up to and including
    ``call`` used, in the order offered, at most :data:`UNTRIED_NAMES`; empty when the request
    offered none (or the dialect does not say)."""
    if not transcript.tools:
        return []
    calls = transcript.calls
    used = set()
    k = call.seq
    while k >= 0 and calls[k].turn == call.turn:  # a turn's calls are consecutive: only its own read
        used.add(calls[k].name)
        k -= 1
    return [name for name in transcript.tools if name not in used][:UNTRIED_NAMES]


def instead(transcript: Transcript, call: ToolCall) -> str:
    """``redirect``'s closing lines for a text about ``call``: the result in hand, the offered
    tools not used this turn (when the request says which it offered and some are left), and
    answering the user. Never names ``call``'s own tool (it was used, so it is not untried)."""
    names = untried(transcript, call)
    lines = [IN_HAND]
    if names:
        lines.append(UNTRIED.format(names=", ".join(names)))
    lines.append(ANSWER)
    return " ".join(lines)


def speak(style: Style, plain: str, transcript: Transcript, call: ToolCall, close: str = PLAIN_CLOSE) -> str:
    """The text of a rule in ``style`` (``plain`` or ``redirect``; ``quote`` is the rule's own
    text, never built here): ``plain`` (the rule's facts, ending in a full stop), then ``close``
    (plain) or :func:`instead` (redirect), on the next line."""
    tail = instead(transcript, call) if style == REDIRECT else close
    return f"{plain}\n{tail}"
