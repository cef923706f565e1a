"""Reminder facts (DESIGN §2.2: every reminder's text is true of the transcript): is what a reminder
says true of the conversation before it?

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
  (:func:`proxy.core.canonical.canonical_arguments`, the default ``ignore_args``); a shown argument
  preview ``…… (+N more chars)`` matches arguments that start with it and are N characters longer;
- "the same result" is :func:`proxy.core.progress.same_text` with :data:`proxy.core.volatile.DEFAULT_MASKS`
  (volatile spans masked); a call without a result never has the same result;
- a result "failed" when the default :class:`proxy.core.failures.FailureRule` says so (with the
  protocol error flag when the tool message carries ``"is_error": true``, the member
  :mod:`tests.helpers.native_wires` keeps from a Messages ``tool_result``; else none), and "was
  rejected by the user" when a :data:`proxy.config.DEFAULT_REJECTION_PATTERNS` pattern is
  found at its edges (:func:`proxy.core.failures.edge_text`);
- "this turn" is the calls after the history's last user message (a harness's messages count);
- what a call is "on" is its :class:`proxy.core.targets.TargetRule` target (a path without its leading
  ``./``) after its :func:`proxy.core.targets.subcommand`, and it "only reads" when
  :meth:`proxy.core.effects.EffectRule.may_change` says it cannot change anything;
- a quoted line "is in" a result when it (the shown part of a preview) occurs in the result's text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.config import DEFAULT_IGNORE_ARGS, DEFAULT_REJECTION_PATTERNS, EchoLoopConfig
from proxy.core import agents
from proxy.core.canonical import canonical_arguments, parse_arguments
from proxy.core.effects import EffectRule
from proxy.core.failures import FailureRule, edge_text
from proxy.core.progress import same_text
from proxy.core.targets import TargetRule, path_key, subcommand
from proxy.core.transcript import ToolResult
from proxy.core.volatile import DEFAULT_MASKS

Message = dict[str, Any]
#: ``checker(history, text) -> violations``.
Checker = Callable[[Sequence[Message], str], list[str]]
#: How many identical calls in a row the gentle repeat reminder stands for ("several").
GENTLE_RUN = 3


@dataclass(frozen=True)
class Call:
    """One tool call of a history: tool ``name``, canonical ``arguments``, ``result`` text, the
    ``raw`` arguments as sent, the index ``at`` of the assistant message that made it and the
    result's protocol error flag ``is_error`` (True, or None: the text decides)."""

    name: str
    arguments: str
    result: str | None
    raw: Any = None
    at: int = -1
    is_error: bool | None = None

    @property
    def parsed(self) -> Any:
        return parse_arguments(self.raw)


def text_of(content: Any) -> str:
    """A message content's text (a string, or the text parts of an array joined by newlines)."""
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else ""


def calls_of(history: Sequence[Message]) -> list[Call]:
    """The tool calls of ``history`` in order, each with its result."""
    calls: list[list[Any]] = []  # [name, arguments, result, raw, at, is_error]
    pending: dict[str, list[list[Any]]] = {}
    legacy: list[Any] | None = None
    for at, m in enumerate(history):
        role = m.get("role")
        if role == "assistant":
            for tc in m.get("tool_calls") or []:
                fn = tc.get("function") or {}
                raw = fn.get("arguments")
                call = [str(fn.get("name")), canonical(raw), None, raw, at, None]
                calls.append(call)
                pending.setdefault(str(tc.get("id")), []).append(call)
            fc = m.get("function_call")
            if not m.get("tool_calls") and isinstance(fc, dict):
                raw = fc.get("arguments")
                legacy = [str(fc.get("name")), canonical(raw), None, raw, at, None]
                calls.append(legacy)
        elif role == "tool":
            waiting = pending.get(str(m.get("tool_call_id"))) or []
            if waiting:
                call = waiting.pop(0)
                call[2] = text_of(m.get("content"))
                call[5] = True if m.get("is_error") is True else None
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


_FAILURES = FailureRule()
_REJECTIONS = tuple(re.compile(p, re.MULTILINE) for p in DEFAULT_REJECTION_PATTERNS)
_EFFECTS = EffectRule()
_TARGETS = TargetRule()
_SPACE = re.compile(r"\s+")


def same_result(a: Call, b: Call) -> bool:
    """Both calls have a result, and they are the same after masking."""
    return a.result is not None and b.result is not None and same_text(a.result, b.result, DEFAULT_MASKS)


def failed(call: Call) -> bool:
    """The call's result is a failure by the default failure rule (and its error flag)."""
    return call.result is not None and _FAILURES(ToolResult(0, call.result, is_error=call.is_error)) is True


def rejected(call: Call) -> bool:
    """The call's result is a user's rejection (a default rejection pattern at its edges)."""
    if call.result is None:
        return False
    edges = edge_text(call.result)
    return any(r.search(edges) for r in _REJECTIONS)


def quoted_in(claim: str, result: str | None) -> bool:
    """Quoted line ``claim`` (``…… (+N more chars)`` when cut) appears in ``result``; a result with
    nothing but whitespace is quoted ``(empty result)``."""
    if result is None:
        return False
    if claim == "(empty result)" and not result.strip():
        return True
    m = _PREVIEW.fullmatch(claim)
    return (m[1] if m else claim) in result


def preview(text: str, limit: int) -> str:
    """How a reminder shows ``text``: its first ``limit`` characters, then ``… (+N more chars)``."""
    return text if len(text) <= limit else f"{text[:limit]}… (+{len(text) - limit} more chars)"


def normalized(content: Any) -> str:
    """A message content's text with whitespace runs read as one space, trimmed."""
    return _SPACE.sub(" ", text_of(content)).strip()


def text_only(message: Message) -> bool:
    """An assistant message without tool calls."""
    return not message.get("tool_calls") and not isinstance(message.get("function_call"), dict)


def this_turn(history: Sequence[Message], calls: Sequence[Call]) -> list[Call]:
    """The calls after the last user message of ``history`` (harness messages included)."""
    users = [k for k, m in enumerate(history) if m.get("role") == "user"]
    start = users[-1] if users else -1
    return [c for c in calls if c.at > start]


def target_of(call: Call) -> str | None:
    """What ``call`` acts on (:class:`proxy.core.targets.TargetRule`): a command as it is, a path
    without a leading ``./``; None when it has no target."""
    target = _TARGETS(call.name, call.parsed)
    if target is None:
        return None
    return target.value if target.is_command else path_key(target.value)


def with_subcommand(call: Call) -> str:
    """The tool name, then the subcommand of a multiplexed tool (``str_replace_editor view``)."""
    sub = subcommand(call.parsed)
    return f"{call.name} {sub}" if sub else call.name


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
    r"result each time\.\n- tool: (?P=tool)\n- arguments: (?P<arguments>.*?)\nCalling it again"
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


def monologue_same_text(history: Sequence[Message], text: str) -> list[str]:
    """The last N assistant messages have the quoted text (whitespace runs read as one space), and
    nothing new came back in between: each pair in a row is text-only, or both called the same
    tools in order and got the same results."""
    m = _MONOLOGUE.match(text)
    if m is None:
        return [f"cannot read the count and the quoted text: {shown(text)}"]
    n, said = int(m["count"]), m["text"]
    replies = [k for k, msg in enumerate(history) if msg.get("role") == "assistant"]
    if len(replies) < n:
        return [f"your last {n} messages: only {len(replies)} assistant messages before it"]
    last = replies[-n:]
    for k, at in enumerate(last, 1):
        own = normalized(history[at].get("content"))
        if not own or not matches_preview(said, own):
            return [f"said exactly the same thing: message {k} of the last {n} says {shown(own)!r}"]
    calls = calls_of(history)
    for k in range(1, n):
        a = [c for c in calls if c.at == last[k - 1]]
        b = [c for c in calls if c.at == last[k]]
        if [c.name for c in a] != [c.name for c in b]:
            return [f"nothing new came back: messages {k} and {k + 1} of the last {n} called other tools"]
        if not all(same_result(x, y) for x, y in zip(a, b, strict=True)):
            return [f"nothing new came back: messages {k} and {k + 1} of the last {n} got other results"]
    return []


_SAME_ANSWER = re.compile(
    r'(?s)\[loopguard\] Your last (?P<count>\d+) replies got the same answer each time:\n  "(?P<text>.*)"\n'
    r"Replying the same way"
)


def monologue_same_answer(history: Sequence[Message], text: str) -> list[str]:
    """The last N assistant messages are text-only replies, each answered right away by a user
    message with the quoted text (whitespace runs read as one space)."""
    m = _SAME_ANSWER.match(text)
    if m is None:
        return [f"cannot read the count and the quoted answer: {shown(text)}"]
    n, answer = int(m["count"]), m["text"]
    replies = [k for k, msg in enumerate(history) if msg.get("role") == "assistant"]
    if len(replies) < n:
        return [f"your last {n} replies: only {len(replies)} assistant messages before it"]
    for k, at in enumerate(replies[-n:], 1):
        if not text_only(history[at]):
            return [f"your last {n} replies: reply {k} of the last {n} called tools"]
        nxt = history[at + 1] if at + 1 < len(history) else None
        if nxt is None or nxt.get("role") != "user":
            return [f"got the same answer: reply {k} of the last {n} was not answered by a user message"]
        own = normalized(nxt.get("content"))
        if not own or not matches_preview(answer, own):
            return [f"got the same answer: the answer to reply {k} of the last {n} says {shown(own)!r}"]
    return []


_REISSUE = re.compile(
    r"(?s)\[loopguard\] You made the same call again, with the exact same arguments and nothing "
    r"changed in between, and it (?P<outcome>failed|was rejected by the user) again with the same "
    r"result as the last time\.\n- tool: (?P<tool>[^\n]*)\n- arguments: (?P<arguments>.*?)\n"
    r"- result: (?P<error>[^\n]*)\nRepeating it unchanged"
)


def _unchanging(call: Call, before: Sequence[Call]) -> bool:
    """``call`` cannot have changed the situation: it repeats an earlier call (tool, arguments)
    with the same result, or it failed or was rejected, or it only reads."""
    if failed(call) or rejected(call):
        return True
    if any((c.name, c.arguments) == (call.name, call.arguments) and same_result(c, call) for c in before):
        return True
    return not _EFFECTS.may_change(call.name, call.parsed)


def reissued_failure(history: Sequence[Message], text: str) -> list[str]:
    """The last call is tool X with arguments A; the previous call with that tool and arguments
    got the same result, which failed (or was a user's rejection) and holds the quoted line; no
    call in between could have changed anything (each failed, only read, or repeated an earlier
    call with its result)."""
    m = _REISSUE.match(text)
    if m is None:
        return [f"cannot read the tool, arguments and result lines: {shown(text)}"]
    tool, args, error = m["tool"], m["arguments"], m["error"]
    rejection = m["outcome"] != "failed"
    calls = calls_of(history)
    if not calls:
        return ["the same call again: no tool calls before it"]
    last = calls[-1]
    out = []
    if last.name != tool:
        out.append(f"tool: {tool}: the last call is {last.name}")
    if not matches_preview(args, last.arguments):
        out.append(f"arguments: the last call has other arguments: {shown(last.arguments)}")
    key = (last.name, last.arguments)
    k = next((k for k in range(len(calls) - 2, -1, -1) if (calls[k].name, calls[k].arguments) == key), None)
    if k is None:
        return [*out, "the same call again: no earlier call with the same tool and arguments"]
    prev = calls[k]
    if not same_result(prev, last):
        out.append("the same result as the last time: the two calls got different results")
    outcome = m["outcome"]
    bad, what = (rejected, "rejection") if rejection else (failed, "failure")
    if not bad(prev):
        out.append(f"{outcome}: the previous call's result is not a {what}")
    if not bad(last):
        out.append(f"{outcome} again: the last call's result is not a {what}")
    changed = next((c for j, c in enumerate(calls[k + 1 : -1], k + 1) if not _unchanging(c, calls[:j])), None)
    if changed is not None:
        call = f"{changed.name} {shown(changed.arguments)}"
        out.append(f"nothing changed in between: {call} may have changed it")
    if not quoted_in(error, prev.result):
        out.append(f"result: not in the previous call's result: {shown(error)}")
    return out


_FAILING = re.compile(
    r"(?s)\[loopguard\] (?P<subject>.+?) has now failed (?P<count>\d+) times in a row\. The last error:\n"
    r"  (?P<error>[^\n]*)\nTrying again the same way"
)


def _subject_of(call: Call) -> str:
    """How the failing-run text names what ``call`` is on: ``tool[ sub][ on target]`` (a target
    that is the tool's own name, SWE-agent's ``edit``, is not shown)."""
    where = target_of(call)
    shown_target = preview(where, 120) if where else ""
    if shown_target and shown_target != call.name:
        return f"{with_subcommand(call)} on {shown_target}"
    return with_subcommand(call)


def failing_run(history: Sequence[Message], text: str) -> list[str]:
    """In this turn (after the last user message), the last N calls on the subject (tool,
    subcommand, target) all failed, and the last of them holds the quoted error line."""
    m = _FAILING.match(text)
    if m is None:
        return [f"cannot read the subject, count and error: {shown(text)}"]
    subject, n, error = m["subject"], int(m["count"]), m["error"]
    on = [c for c in this_turn(history, calls_of(history)) if _subject_of(c) == subject]
    if len(on) < n:
        return [f"failed {n} times in a row: only {len(on)} calls on {shown(subject)} in this turn"]
    out = []
    ok = next((k for k, c in enumerate(on[-n:], 1) if not failed(c)), None)
    if ok is not None:
        out.append(f"failed {n} times in a row: call {ok} of the last {n} on {shown(subject)} did not fail")
    if not quoted_in(error, on[-1].result):
        out.append(f"the last error: not in the last call's result: {shown(error)}")
    return out


_CYCLE = re.compile(
    r"(?s)\[loopguard\] You are going in circles: the same (?P<period>\d+) steps have now repeated "
    r"(?P<count>\d+) times in a row, and the last round gave the same results as the round before:\n"
    r"(?P<steps>.*?)\nAnother round"
)
_STEP = re.compile(r"  (\d+)\. (.*)")


def step_of(call: Call) -> str:
    """A cycle step: the call's target (after its subcommand), or its canonical arguments (all of
    them) when it has none."""
    where = target_of(call)
    if where is None:
        return canonical_arguments(call.parsed, call.raw)
    sub = subcommand(call.parsed)
    return f"{sub} {where}" if sub else where


def cycle(history: Sequence[Message], text: str) -> list[str]:
    """The last P*N calls are P steps (tool and target) repeated N times, the listed steps in
    order; each call of the last round got the same result as the call one round before."""
    m = _CYCLE.match(text)
    if m is None:
        return [f"cannot read the period, count and steps: {shown(text)}"]
    p, n = int(m["period"]), int(m["count"])
    lines = [_STEP.fullmatch(line) for line in m["steps"].split("\n")]
    if any(x is None for x in lines) or [int(x[1]) for x in lines if x] != list(range(1, len(lines) + 1)):
        return [f"cannot read the steps: {shown(m['steps'])}"]
    calls = calls_of(history)
    if len(calls) < p * n:
        return [f"repeated {n} times: only {len(calls)} tool calls before it"]
    window = calls[-p * n :]
    out = []
    if any(window[j].name != window[j - p].name for j in range(p, len(window))):
        out.append(f"repeated {n} times in a row: the last {p * n} calls' tools do not repeat every {p}")
    elif any(step_of(window[j]) != step_of(window[j - p]) for j in range(p, len(window))):
        out.append(f"repeated {n} times in a row: the last {p * n} calls' targets do not repeat every {p}")
    steps = [x[2] for x in lines if x]
    if len(steps) != p:
        out.append(f"the same {p} steps: {len(steps)} steps listed")
    for k, (said, call) in enumerate(zip(steps, window[-p:], strict=False), 1):
        name, _, where = said.partition(" ")
        if name != call.name or not matches_preview(where, preview(step_of(call), 120)):
            out.append(f"step {k}: the last round's call {k} is {call.name} {shown(step_of(call))}")
    rounds = zip(window[-2 * p : -p], window[-p:], strict=True)
    differ = next((k for k, (a, b) in enumerate(rounds, 1) if not same_result(a, b)), None)
    if differ is not None:
        out.append(f"the same results as the round before: step {differ} got another result")
    return out


_ECHO = re.compile(
    r"(?s)\[loopguard\] Your last (?P<count>\d+) calls ran the same (?P<tool>.+?) command with only a "
    r"quoted text changed, and each output just echoed that text back:\n- template: (?P<template>.*?)\n"
    r"Nothing new is coming back"
)
_LITERAL = re.compile(r"'([^'\n]*)'|\"([^\"\n]*)\"")
#: Quoted texts shorter than this are not "a quoted text" (the echo rule's default).
MIN_LITERAL = EchoLoopConfig().min_literal_chars


def _unquoted(value: Any, found: list[str]) -> Any:
    """``value`` with every quoted text in its strings replaced by ``'…'``; the texts go to
    ``found``."""
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            found.append(m[1] if m[1] is not None else m[2])
            return "'\u2026'"

        return _LITERAL.sub(sub, value)
    if isinstance(value, list):
        return [_unquoted(v, found) for v in value]
    if isinstance(value, dict):
        return {k: _unquoted(v, found) for k, v in value.items()}
    return value


def echo(history: Sequence[Message], text: str) -> list[str]:
    """The last N calls are tool X, each with other arguments than the one before but the same
    ones once every quoted text is replaced (the template shown), and each output holds a quoted
    text the call before did not have and is otherwise the previous output (masked)."""
    m = _ECHO.match(text)
    if m is None:
        return [f"cannot read the count, tool and template: {shown(text)}"]
    n, tool, template = int(m["count"]), m["tool"], m["template"]
    calls = calls_of(history)
    if len(calls) < n:
        return [f"your last {n} calls: only {len(calls)} tool calls before it"]
    last = calls[-n:]
    other = next((c for c in last if c.name != tool), None)
    if other is not None:
        return [f"the same {tool} command: the last {n} calls include {other.name}"]
    exact = [canonical_arguments(c.parsed, c.raw) for c in last]
    quoted: list[list[str]] = [[] for _ in last]
    shapes = [
        canonical_arguments(_unquoted(c.parsed, q), None) if isinstance(c.parsed, dict | list) else x
        for c, q, x in zip(last, quoted, exact, strict=True)
    ]
    texts = [{t for t in q if len(t) >= MIN_LITERAL} for q in quoted]
    out = []
    same = next((k for k in range(1, n) if exact[k] == exact[k - 1]), None)
    if same is not None:
        out.append(f"only a quoted text changed: calls {same} and {same + 1} of the last {n} are the same")
    if len(set(shapes)) > 1:
        out.append(f"only a quoted text changed: the last {n} calls differ in more than a quoted text")
    elif not matches_preview(template, shapes[0]):
        out.append(f"template: the calls' template is {shown(shapes[0])}")

    def rest(k: int) -> str:
        result = last[k].result or ""
        for t in sorted(texts[k], key=len, reverse=True):
            result = result.replace(t, "")
        return result

    for k in range(1, n):
        new = texts[k] - texts[k - 1]
        result = last[k].result
        echoed = result is not None and any(t in result for t in new)
        if not echoed or last[k - 1].result is None or not same_text(rest(k), rest(k - 1), DEFAULT_MASKS):
            out.append(f"each output just echoed that text back: call {k + 1} of the last {n} did not")
            break
    return out


_SAME_TARGET = re.compile(
    r"(?s)\[loopguard\] You called (?P<subject>.+?) (?P<count>\d+) times in a row, with different "
    r"arguments each time, and it (?:returned the same result each time\.|failed the same way each "
    r"time:\n  (?P<error>[^\n]*))\n- tool: (?P<tool>[^\n]*)\n"
    r"- last arguments: (?P<arguments>.*?)\nChanging the arguments"
)


def same_target(history: Sequence[Message], text: str) -> list[str]:
    """The last N calls are all on the subject (tool, subcommand, target), the last one with the
    shown arguments; their arguments are not all the same (the text says "different arguments"
    — checked as: not all one call); their results are all the same after masking, or ("failed
    the same way") each one failed and has the quoted failure shape of its tool
    (:func:`proxy.core.agents.failure_shape`, the part its tool echoes back left out)."""
    m = _SAME_TARGET.match(text)
    if m is None:
        return [f"cannot read the subject, count and arguments: {shown(text)}"]
    subject, n, tool, args = m["subject"], int(m["count"]), m["tool"], m["arguments"]
    calls = calls_of(history)
    if len(calls) < n:
        return [f"{n} times in a row: only {len(calls)} tool calls before it"]
    last = calls[-n:]
    out = []
    off = next((k for k, c in enumerate(last, 1) if _subject_of(c) != subject), None)
    if off is not None:
        out.append(f"{n} times in a row: call {off} of the last {n} is not on {shown(subject)}")
    if last[-1].name != tool or not matches_preview(args, last[-1].arguments):
        out.append(f"last arguments: the last call is {last[-1].name} {shown(last[-1].arguments)}")
    if len({c.arguments for c in last}) == 1:
        out.append(f"with different arguments: the last {n} calls are one call")
    if m["error"] is not None:
        rule = FailureRule()
        off = next(
            (
                k
                for k, c in enumerate(last, 1)
                if c.result is None
                or not (c.is_error or rule.failed_text(c.result))
                or not matches_preview(m["error"], agents.failure_shape(c.name, c.result) or "")
            ),
            None,
        )
        if off is not None:
            out.append(f"failed the same way each time: call {off} of the last {n} did not fail that way")
    elif not same_results(last):
        out.append(f"the same result each time: the last {n} calls did not all return the same result")
    return out


# --- recovery.reminders: plain and redirect ------------------------------------------------------
# A plain text claims what its quoting text claims about the history's last call, without naming it:
# each is checked as the quoting text that names the last call (its tool, arguments, target, error
# line) would be. redirect's closing lines are checked on their own: the tools it says were not used
# since the user's last message were not.

_REDIRECT = re.compile(
    r"(?s)\nWhat those calls returned is already above: use it instead of asking for it again\."
    r"(?: Tools you have not used since the user's last message: (?P<names>[^\n]*?)\.)? If you have what "
    r"you need, answer the user now with what you know; if not, say what is blocking you\.$"
)


def _first_line(result: str | None) -> str:
    lines = [ln.strip() for ln in (result or "").splitlines() if ln.strip()]
    return lines[0] if lines else "(empty result)"


def _as_quoted(
    history: Sequence[Message],
    text: str,
    quote: Callable[[Call, re.Match[str]], str],
    plain: re.Pattern[str],
    check: Checker,
) -> list[str]:
    """Check plain ``text`` (read by ``plain``) as the quoting text ``quote`` writes for the
    history's last call; redirect's closing lines checked too."""
    out = []
    m = _REDIRECT.search(text)
    if m is not None:
        calls = calls_of(history)
        used = {c.name for c in this_turn(history, calls)}
        said = [n for n in (m["names"] or "").split(", ") if n]
        out += [f"not used since the user's last message: {n} was" for n in said if n in used]
    p = plain.match(text)
    if p is None:
        return [*out, f"cannot read the plain text: {shown(text)}"]
    calls = calls_of(history)
    if not calls:
        return [*out, "no tool calls before it"]
    return [*out, *check(history, quote(calls[-1], p))]


def _shape(call: Call) -> str:
    return agents.failure_shape(call.name, call.result or "") or ""


def _template(call: Call) -> str:
    if isinstance(call.parsed, dict | list):
        return canonical_arguments(_unquoted(call.parsed, []), None)
    return canonical_arguments(call.parsed, call.raw)


def _previous_result(history: Sequence[Message], call: Call) -> str | None:
    calls = calls_of(history)
    before = [c for c in calls[:-1] if (c.name, c.arguments) == (call.name, call.arguments)]
    return before[-1].result if before else call.result


#: kind → (the plain text's pattern, the quoting text it stands for (of the last call and the
#: match; None: built by its own checker), the quoting text's checker)
_PLAIN: dict[str, tuple[re.Pattern[str], Callable[..., str] | None, Checker]] = {
    "repeat": (
        re.compile(
            r"\[loopguard\] You have made the same tool call (?P<n>\d+) times in a row, and it returned the "
            r"same result each time\.\n"
        ),
        lambda c, m: (
            f"[loopguard] You are repeating the same tool call without making progress.\n- tool: {c.name}\n"
            f"- consecutive_calls: {m['n']}\n- arguments: {c.arguments}\nDo not call this tool"
        ),
        repeat_reminder_detailed,
    ),
    "same_target": (
        re.compile(
            r"\[loopguard\] You have made (?P<n>\d+) calls in a row on the same tool and target, with "
            r"arguments "
            r"that changed, and they (?P<how>returned the same result|failed the same way) each time\."
        ),
        lambda c, m: (
            f"[loopguard] You called {_subject_of(c)} {m['n']} times in a row, with different arguments "
            "each time, "
            + (
                "and it returned the same result each time."
                if m["how"].startswith("returned")
                else f"and it failed the same way each time:\n  {_shape(c)}"
            )
            + f"\n- tool: {c.name}\n- last arguments: {c.arguments}\nChanging the arguments"
        ),
        same_target,
    ),
    "recurrence": (
        re.compile(
            r"\[loopguard\] You keep coming back to the same tool call: (?P<n>\d+) times in your last "
            r"(?P<span>\d+) calls, and it returned the same result each time\."
        ),
        lambda c, m: (
            f"[loopguard] You keep coming back to the same tool call: {c.name} with the same arguments, "
            f"{m['n']} times in your last {m['span']} calls, and it returned the same result each time.\n"
            f"- tool: {c.name}\n- arguments: {c.arguments}\nCalling it again"
        ),
        recurrence,
    ),
    "failing": (
        re.compile(
            r"\[loopguard\] Your calls with one tool on one target have now failed (?P<n>\d+) times in a "
            r"row, the same way each time\."
        ),
        lambda c, m: (
            f"[loopguard] {_subject_of(c)} has now failed {m['n']} times in a row. The last error:\n"
            f"  {_first_line(c.result)}\nTrying again the same way"
        ),
        failing_run,
    ),
    "cycle": (
        re.compile(
            r"\[loopguard\] You are going in circles: the same (?P<p>\d+) steps have now repeated "
            r"(?P<n>\d+) times "
            r"in a row, and the last round gave the same results as the round before\. Another round"
        ),
        None,  # needs the last round's calls: built in _plain_cycle
        cycle,
    ),
    "echo": (
        re.compile(
            r"\[loopguard\] Your last (?P<n>\d+) calls ran the same command with only a quoted text changed, "
            r"and each output just echoed that text back\."
        ),
        lambda c, m: (
            f"[loopguard] Your last {m['n']} calls ran the same {c.name} command with only a quoted text "
            "changed, and each output just echoed that text back:\n"
            f"- template: {_template(c)}\nNothing new is coming back"
        ),
        echo,
    ),
}


def _plain_checker(kind: str) -> Checker:
    plain, quote, check = _PLAIN[kind]
    assert quote is not None

    def checker(history: Sequence[Message], text: str) -> list[str]:
        return _as_quoted(history, text, quote, plain, check)

    checker.__name__ = f"plain_{kind}"
    return checker


def plain_cycle(history: Sequence[Message], text: str) -> list[str]:
    """A plain cycle text, checked as the quoting one that lists the last round's calls."""
    plain, _, check = _PLAIN["cycle"]
    m = plain.match(text)
    calls = calls_of(history)
    if m is None or len(calls) < int(m["p"]):
        return [f"cannot read the plain cycle text: {shown(text)}"]
    last = calls[-int(m["p"]) :]
    steps = "\n".join(f"  {k}. {c.name} {preview(step_of(c), 120)}" for k, c in enumerate(last, 1))

    def quote(_: Call, p: re.Match[str]) -> str:
        return (
            f"[loopguard] You are going in circles: the same {p['p']} steps have now repeated {p['n']} "
            "times in a "
            f"row, and the last round gave the same results as the round before:\n{steps}\nAnother round"
        )

    return _as_quoted(history, text, quote, plain, check)


def plain_reissue(history: Sequence[Message], text: str) -> list[str]:
    """A plain re-issue text, checked as the quoting one about the last call (its result line the
    first line of the previous such call's result)."""
    plain = re.compile(
        r"\[loopguard\] You made the same call again, with the exact same arguments and nothing changed in "
        r"between, and it (?P<outcome>failed|was rejected by the user) again with the same result as the "
        r"last "
        r"time\. Repeating it unchanged"
    )

    def quote(c: Call, m: re.Match[str]) -> str:
        return (
            "[loopguard] You made the same call again, with the exact same arguments and nothing changed in "
            f"between, and it {m['outcome']} again with the same result as the last time.\n- tool: {c.name}\n"
            f"- arguments: {c.arguments}\n- result: {_first_line(_previous_result(history, c))}\n"
            "Repeating it unchanged"
        )

    return _as_quoted(history, text, quote, plain, reissued_failure)


#: Opening words of each reminder text (a regular expression matched at the text's start) → its
#: checker. The first entry that matches is used.
CHECKERS: dict[str, Checker] = {
    # plain and redirect (recovery.reminders) before the quoting texts whose openings they share
    r"\[loopguard\] You have made the same tool call \d+ times in a row": _plain_checker("repeat"),
    r"\[loopguard\] You have made \d+ calls in a row on the same tool and target": _plain_checker(
        "same_target"
    ),
    r"\[loopguard\] You keep coming back to the same tool call: \d+ times": _plain_checker("recurrence"),
    r"\[loopguard\] Your calls with one tool on one target have now failed": _plain_checker("failing"),
    r"\[loopguard\] You are going in circles: [^\n]*? the round before\. Another round": plain_cycle,
    r"\[loopguard\] Your last \d+ calls ran the same command with only a quoted text changed": _plain_checker(
        "echo"
    ),
    r"\[loopguard\] You made the same call again, [^\n]*? the last time\. Repeating it": plain_reissue,
    r"\[loopguard\] You are repeating the same tool call without making progress\.": repeat_reminder_detailed,
    re.escape(_GENTLE): repeat_reminder_gentle,
    r"\[loopguard\] You keep coming back to the same tool call: ": recurrence,
    r"\[loopguard\] Your last \d+ messages said exactly the same thing:": monologue_same_text,
    r"\[loopguard\] Your last \d+ replies got the same answer each time:": monologue_same_answer,
    r"\[loopguard\] You made the same call again, with the exact same arguments": reissued_failure,
    r"\[loopguard\] .+? has now failed \d+ times in a row\. The last error:": failing_run,
    r"\[loopguard\] You are going in circles: ": cycle,
    r"\[loopguard\] Your last \d+ calls ran the same .+? command with only a quoted text changed": echo,
    r"\[loopguard\] You called .+? \d+ times in a row, with different arguments each time": same_target,
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
