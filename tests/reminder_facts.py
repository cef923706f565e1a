"""Reminder facts (issue 10): is what a reminder says true of the conversation before it?

:func:`check_reminder` takes ``history`` (the messages the agent sent in that request, up to the
reminder's position: OpenAI chat format, the message a reminder was appended to included as the
agent sent it) and one reminder ``text``; it returns the violations, one string each (empty = every
claim is true). The checker is chosen by the reminder's opening words from :data:`CHECKERS`, one
small function per rule text (the texts of ``proxy/guards/*.py``). A text no checker knows is a
violation (``no checker for: …``), so a new or reworded reminder cannot slip through unchecked:
when a text changes, change or add its entry here.

What the claims are checked against:

- calls are the history's tool calls in order (every call of every assistant message, legacy
  ``function_call`` too), each with its result (the tool message answering it, ``None`` if none);
- "the same call" is the same tool and canonical arguments
  (:func:`proxy.canonical.canonical_arguments`, the default ``ignore_args``); a shown argument
  preview ``…… (+N more chars)`` matches arguments that start with it and are N characters longer;
- "the same result" is :func:`proxy.progress.same_text` with :data:`proxy.volatile.DEFAULT_MASKS`
  (volatile spans masked); a call without a result never has the same result.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.canonical import canonical_arguments, parse_arguments
from proxy.config import DEFAULT_IGNORE_ARGS
from proxy.progress import same_text
from proxy.volatile import DEFAULT_MASKS

Message = dict[str, Any]
#: ``checker(history, text) -> violations``.
Checker = Callable[[Sequence[Message], str], list[str]]
#: How many identical calls in a row the gentle repeat reminder stands for ("several").
GENTLE_RUN = 3


@dataclass(frozen=True)
class Call:
    """One tool call of a history: tool ``name``, canonical ``arguments``, ``result`` text."""

    name: str
    arguments: str
    result: str | None


def text_of(content: Any) -> str:
    """A message content's text (a string, or the text parts of an array joined by newlines)."""
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else ""


def calls_of(history: Sequence[Message]) -> list[Call]:
    """The tool calls of ``history`` in order, each with its result."""
    calls: list[list[Any]] = []  # [name, arguments, result]
    pending: dict[str, list[list[Any]]] = {}
    legacy: list[Any] | None = None
    for m in history:
        role = m.get("role")
        if role == "assistant":
            for tc in m.get("tool_calls") or []:
                fn = tc.get("function") or {}
                raw = fn.get("arguments")
                call = [str(fn.get("name")), canonical(raw), None]
                calls.append(call)
                pending.setdefault(str(tc.get("id")), []).append(call)
            fc = m.get("function_call")
            if not m.get("tool_calls") and isinstance(fc, dict):
                legacy = [str(fc.get("name")), canonical(fc.get("arguments")), None]
                calls.append(legacy)
        elif role == "tool":
            waiting = pending.get(str(m.get("tool_call_id"))) or []
            if waiting:
                waiting.pop(0)[2] = text_of(m.get("content"))
        elif role == "function" and legacy is not None:
            legacy[2], legacy = text_of(m.get("content")), None
    return [Call(*c) for c in calls]


def canonical(raw: Any) -> str:
    return canonical_arguments(parse_arguments(raw), raw, DEFAULT_IGNORE_ARGS)


def shown(text: str, limit: int = 60) -> str:
    """``text`` for a violation message: at most ``limit`` characters."""
    return text if len(text) <= limit else text[:limit] + "…"


_PREVIEW = re.compile(r"(?s)(.*)… \(\+(\d+) more chars\)")


def matches_preview(claim: str, actual: str) -> bool:
    """``claim`` shows ``actual``: equal, or its first characters and how many more there are."""
    if claim == actual:
        return True
    m = _PREVIEW.fullmatch(claim)
    return bool(m) and actual.startswith(m[1]) and len(actual) == len(m[1]) + int(m[2])


def same_results(calls: Sequence[Call]) -> bool:
    """Every call has a result, and they are all the same after masking."""
    if any(c.result is None for c in calls):
        return False
    results = [c.result or "" for c in calls]
    return all(same_text(results[0], r, DEFAULT_MASKS) for r in results[1:])


# --- one checker per reminder text ------------------------------------------------------------------

_DETAILED = re.compile(
    r"(?s)\[loopguard\] You are repeating the same tool call without making progress\.\n"
    r"- tool: (?P<tool>[^\n]*)\n- consecutive_calls: (?P<count>\d+)\n- arguments: (?P<arguments>.*?)\n"
    r"Do not call this tool"
)


def repeat_reminder_detailed(history: Sequence[Message], text: str) -> list[str]:
    """The last N calls are tool X with arguments A, and returned the same result (no progress)."""
    m = _DETAILED.match(text)
    if m is None:
        return [f"cannot read the tool, consecutive_calls and arguments lines: {shown(text)}"]
    tool, n, args = m["tool"], int(m["count"]), m["arguments"]
    calls = calls_of(history)
    if len(calls) < n:
        return [f"consecutive_calls: {n}: only {len(calls)} tool calls before it"]
    last = calls[-n:]
    out = []
    other = next((c for c in last if c.name != tool), None)
    if other is not None:
        out.append(f"tool: {tool}: the last {n} calls include {other.name}")
    wrong = next((c for c in last if not matches_preview(args, c.arguments)), None)
    if wrong is not None:
        out.append(f"arguments: the last {n} calls include other arguments: {shown(wrong.arguments)}")
    if not same_results(last):
        out.append(f"without making progress: the last {n} calls did not all return the same result")
    return out


_GENTLE = "[loopguard] You have made the same tool call several times in a row."


def repeat_reminder_gentle(history: Sequence[Message], text: str) -> list[str]:
    """The last 3 calls are one call (tool and arguments) and returned the same result."""
    calls = calls_of(history)
    n = GENTLE_RUN
    if len(calls) < n:
        return [f"several times in a row: only {len(calls)} tool calls before it"]
    last = calls[-n:]
    if len({(c.name, c.arguments) for c in last}) > 1:
        return [f"the same tool call: the last {n} calls are not all the same call"]
    if not same_results(last):
        return [f"re-read its last result: the last {n} calls did not all return the same result"]
    return []


_RECURRENCE = re.compile(
    r"(?s)\[loopguard\] You keep coming back to the same tool call: (?P<tool>.+?) with the same "
    r"arguments, (?P<count>\d+) times in your last (?P<span>\d+) calls, and it returned the same "
    r"result each time\.\n.*?- arguments: (?P<arguments>.*?)\nCalling it again"
)


def recurrence(history: Sequence[Message], text: str) -> list[str]:
    """Tool X with arguments A is N of the last M calls, and returned the same result each time."""
    m = _RECURRENCE.match(text)
    if m is None:
        return [f"cannot read the tool, counts and arguments: {shown(text)}"]
    tool, n, span, args = m["tool"], int(m["count"]), int(m["span"]), m["arguments"]
    calls = calls_of(history)
    if len(calls) < span:
        return [f"in your last {span} calls: only {len(calls)} tool calls before it"]
    hits = [c for c in calls[-span:] if c.name == tool and matches_preview(args, c.arguments)]
    if len(hits) != n:
        return [f"{n} times: {tool} with these arguments is {len(hits)} of the last {span} calls"]
    if not same_results(hits):
        return [f"the same result each time: those {n} calls did not all return the same result"]
    return []


_MONOLOGUE = re.compile(
    r'(?s)\[loopguard\] Your last (?P<count>\d+) messages said exactly the same thing:\n  "(?P<text>.*)"\n'
    r"Repeating it"
)
_SPACE = re.compile(r"\s+")


def monologue_same_text(history: Sequence[Message], text: str) -> list[str]:
    """The last N assistant messages have the quoted text (whitespace runs read as one space)."""
    m = _MONOLOGUE.match(text)
    if m is None:
        return [f"cannot read the count and the quoted text: {shown(text)}"]
    n, said = int(m["count"]), m["text"]
    replies = [msg for msg in history if msg.get("role") == "assistant"]
    if len(replies) < n:
        return [f"your last {n} messages: only {len(replies)} assistant messages before it"]
    for k, reply in enumerate(replies[-n:], 1):
        own = _SPACE.sub(" ", text_of(reply.get("content"))).strip()
        if not own or not matches_preview(said, own):
            return [f"said exactly the same thing: message {k} of the last {n} says {shown(own)!r}"]
    return []


#: Opening words of each reminder text (a regular expression matched at the text's start) → its
#: checker. The first entry that matches is used.
CHECKERS: dict[str, Checker] = {
    r"\[loopguard\] You are repeating the same tool call without making progress\.": repeat_reminder_detailed,
    re.escape(_GENTLE): repeat_reminder_gentle,
    r"\[loopguard\] You keep coming back to the same tool call: ": recurrence,
    r"\[loopguard\] Your last \d+ messages said exactly the same thing:": monologue_same_text,
}


def checker_for(text: str) -> Checker | None:
    """The checker registered for ``text``'s opening words, if any."""
    return next((fn for opening, fn in CHECKERS.items() if re.match(opening, text)), None)


def check_reminder(history: Sequence[Message], text: str) -> list[str]:
    """The violations of what reminder ``text`` says about ``history`` (empty: all true)."""
    fn = checker_for(text)
    if fn is None:
        return [f"no checker for: {text[:60]}"]
    return fn(history, text)
