"""Actions a harness writes into its history as text, and their results: pure parsing, no I/O.

Some harnesses send the model's calls back as plain assistant text and the results as user
messages; read as a chat, every result would be a new user turn and no call would ever repeat.
Two families are read here (:class:`proxy.dialects.fold.FoldState` pairs them):

- **smolagents** (``ToolCallingAgent``, ``ActionStep.to_messages``): each step's calls as an
  assistant message ending in ``Calling tools:\\n[{'id': …, 'type': 'function', 'function':
  {'name': …, 'arguments': {…}}}, …]`` (the Python ``repr`` of a list of dicts, read with
  :func:`ast.literal_eval`: literals only, never evaluated as code; any text before it is what the
  model said), then one user message with the results: ``Observation:\\n…`` or, when the call
  failed, ``Call id: <id>\\nError:\\n…``. :func:`calling_tools`, :func:`smolagents_result`.
- **fenced actions** (mini-swe-agent's text mode: ```` ```mswea_bash_command ```` blocks;
  SWE-agent's thought-action format: a ```` ``` ```` block after the discussion): an assistant
  message with exactly one fenced block, and nothing after it but whitespace, is an action *only
  when the harness answers it with a result message*: the next message is a user message in a
  shape only a harness writes, whole, every time (its template): ``<returncode>N</returncode>``
  on a line of its own followed by the ``<output>`` / ``<warning>`` element (mini's
  ``observation_template``, after an optional ``<exception>…</exception>``), ``OBSERVATION:`` on
  a line of its own (SWE-agent's ``next_step_template``, ``OBSERVATION:\\n{{observation}}``), or
  ending in SWE-agent 0.x's ``(Open file: …)\\n(Current directory: …)\\nbash-$``.
  :func:`fenced_action`, :func:`action_result`. A person's words are never read as a result, so
  never withheld: a ReAct-style note (``Observation: it printed nothing.``, ``<returncode>0</returncode>
  is what I got``) is not in those shapes, and a code sample followed by it stays a chat (and ends
  the reading of fenced actions in that conversation). The pairing is decided per action (an
  action without its result is text). The answer to a request is read the same way only when
  the history already shows the harness executing such actions (:func:`answer_action`).

A fenced action is a call named by the block's info string (``mswea_bash_command``, ``bash``;
``bash`` when there is none) with ``{"command": <the block's text>}``, the convention of the
SWE-agent runs in the real-runs fixtures.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

CALLING = "Calling tools:"
#: The ``text`` mark of a step read from each form (:class:`proxy.dialects.fold.FoldState`).
SMOLAGENTS = "smolagents"
FENCED = "fenced"
_FENCE_OPEN = re.compile(r"^ {0,3}(`{3,}|~{3,})[ \t]*([A-Za-z0-9_.+-]*)[ \t]*$", re.MULTILINE)
_INFO = re.compile(r"[A-Za-z0-9_.+-]{1,64}\Z")
#: mini's observation template: the return code on its own line, then the output (or, when it is
#: too long, the warning first)
_RESULT = re.compile(
    r"(?:<exception>.*?</exception>\s*)?<returncode>-?\d+</returncode>[ \t]*\r?\n<(?:output|warning)>",
    re.DOTALL,
)
#: SWE-agent's next-step template: the heading on a line of its own (a person's ReAct-style note,
#: "Observation: it passed", is not it)
_OBSERVATION = re.compile(r"OBSERVATION:[ \t]*(?:\r?\n|\Z)")
#: SWE-agent 0.x's next-step template: the observation, then its state lines and prompt
_SWE_PROMPT = re.compile(r"\(Open file: [^\n]*\)\r?\n\(Current directory: [^\n]*\)\r?\nbash-\$\s*\Z")
_SMOL_ERROR = re.compile(r"Call id: [^\n]*\r?\nError:")
#: Results beyond this size are still results; the literal_eval of a "Calling tools" list is
#: bounded, so a huge text is never parsed (a real step's calls are a few KB).
_MAX_REPR = 1_000_000


@dataclass(frozen=True, slots=True)
class TextAction:
    """One action read from text: ``call_id`` (smolagents' id, else None), ``name``,
    ``arguments`` (a dict, or the raw string smolagents kept), ``text``: what the message said
    before its actions; ``form``: ``"smolagents"`` or ``"fenced"``."""

    call_id: str | None
    name: str
    arguments: Any
    text: str
    form: str


def calling_tools(text: str) -> list[TextAction] | None:
    """The calls of a smolagents assistant message (module docstring), None when ``text`` is not
    one: no ``Calling tools:`` line, or what follows it is not a list of call dicts."""
    at = text.rfind(CALLING)
    if at < 0 or (at > 0 and text[at - 1] != "\n"):
        return None
    rest = text[at + len(CALLING) :].strip()
    if not rest.startswith("[") or len(rest) > _MAX_REPR:
        return None
    try:
        listed = ast.literal_eval(rest)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(listed, list) or not listed:
        return None
    said = text[:at].strip()
    out: list[TextAction] = []
    for entry in listed:
        fn = entry.get("function") if isinstance(entry, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            return None
        cid = entry.get("id")
        args = fn.get("arguments")
        out.append(TextAction(cid if isinstance(cid, str) else None, name, args, said, SMOLAGENTS))
    return out


def smolagents_result(text: str) -> bool:
    """True when a user message is a smolagents step's results (``Observation:`` or a failed
    call's ``Call id: …\\nError:``)."""
    stripped = text.lstrip()
    return stripped.startswith("Observation:") or bool(_SMOL_ERROR.match(stripped))


def fenced_action(text: str) -> TextAction | None:
    """The one fenced block ending ``text`` as an action candidate (module docstring), None when
    the text has no fenced block, more than one, or anything but whitespace after it."""
    opens = list(_FENCE_OPEN.finditer(text))
    if not opens:
        return None
    first = opens[0]
    mark = first.group(1)
    close = re.compile(r"^ {0,3}" + re.escape(mark[0]) + "{" + str(len(mark)) + r",}[ \t]*$", re.MULTILINE)
    end = close.search(text, first.end())
    if end is None or text[end.end() :].strip():
        return None
    body = text[first.end() : end.start()]
    body = body[1:] if body.startswith("\n") else body
    body = body[:-1] if body.endswith("\n") else body
    if _FENCE_OPEN.search(body) or not body.strip():
        return None  # a second block inside, or nothing to run
    info = first.group(2)
    name = info if info and _INFO.match(info) else "bash"
    return TextAction(None, name, {"command": body}, text[: first.start()].strip(), FENCED)


def action_result(text: str) -> str | None:
    """The result shape of a user message answering a fenced action (``"returncode"``,
    ``"observation"`` or ``"prompt"``), None when it has none."""
    stripped = text.lstrip()
    if _RESULT.match(stripped):
        return "returncode"
    if _OBSERVATION.match(stripped):
        return "observation"
    if _SWE_PROMPT.search(text[-2048:]):
        return "prompt"
    return None


def answer_action(text: str, shapes: frozenset[str]) -> TextAction | None:
    """The fenced action of an answer's text when the request's history shows the harness
    executing fenced actions (``shapes``: the result shapes seen there, non-empty), else None."""
    if not shapes:
        return None
    return fenced_action(text)
