"""Harness format-error replies: user messages a harness writes, not a person.

An agent harness that finds no usable action in the model's answer (loopguard's stop is one:
text, no tool call) does not end the run: it answers with a user message of its own that says
the answer was malformed, and asks the model again. That message is not a new request from a
person; the stop ladder (:class:`proxy.response.decide.StopJudge`) and the episodes
(:mod:`proxy.core.episodes`) go on through it, so a stop holds until the harness gives up (mini-swe-agent
exits after three such replies in a row), while a person's message, whatever it says, still
starts a new turn.

A reply is recognised by its *shape*, anchored at the start of the text (:data:`SHAPES`, searched
with ``re.match`` on the stripped text): a heading line of its own naming an error about the
answer's form (``Tool call error:``, ``Format error:``, … then a line break), or one of the fixed
sentences harnesses open with. Sources, as the harnesses write them:

- mini-swe-agent 2.x, tool calls (``format_error_template``): ``Tool call error:\\n\\n<error>\\nNo
  tool calls found in the response. …``; text mode: ``Format error:\\n\\n<error>\\n…``.
- smolagents (``ActionStep.to_messages``): ``Error:\\nError while parsing tool call from model
  output: …\\nNow let's retry: …`` (``CodeAgent``: ``Error:\\nError in code parsing:\\n…``; with
  ``Call id: …`` first when the answer had calls: then it is that call's failed result,
  :mod:`proxy.dialects.text_actions`).
- SWE-agent: ``Your output was not formatted correctly. …``, ``Your last output did not use any
  tool calls!``, ``Your action could not be parsed properly. …``.
- others seen in harness prompts: ``[ERROR] You did not use a tool …``, ``No tool calls found …``.

A person's prose does not open with those lines ("Format error in my table, fix it" has no line
break after the heading; "the tool call error is back" does not start with it).
"""

from __future__ import annotations

import re

#: What a harness's format-error reply starts with (module docstring).
SHAPES: tuple[str, ...] = (
    # a heading on a line of its own: "Tool call error:\n\n<error>…", "Format error:\n…"
    r"(?i)(?:tool[ _-]?call|function[ _-]?call|format(?:ting)?|pars(?:e|ing)|action|output format)"
    r" error *:? *\r?\n",
    # smolagents: a parse failure of an answer without calls (ToolCallingAgent) or code (CodeAgent)
    r"Error: *\r?\nError (?:while parsing tool call from model output|in code parsing)\b",
    # SWE-agent's format-error templates
    r"(?i)your (?:last )?(?:output|response|action) (?:was not formatted correctly|did not use any tool"
    r" calls?|could not be parsed)",
    # fixed openings of other harnesses' replies
    r"(?i)\[?error\]? *:? *you did not use a tool\b",
    r"(?i)no tool calls? (?:was |were )?found in (?:the|your) (?:response|output|message|reply)\b",
)

_COMPILED = tuple(re.compile(p) for p in SHAPES)


def is_harness_reply(text: str) -> bool:
    """True when the user message ``text`` has the shape of a harness's format-error reply."""
    stripped = text.lstrip()
    return any(p.match(stripped) for p in _COMPILED)
