"""Loop fixtures with their calls written as text, for the corpus gate.

A fixture's chat messages become what an agent talking to a server without a tool parser (or an
agent in an XML mode) sends: every assistant message's ``tool_calls`` are written into its
``content`` after its text (one line break between), as hermes blocks (``<tool_call>{"name": …,
"arguments": …}</tool_call>``) or Qwen3-Coder XML (``<tool_call><function=…><parameter=…>``;
a string value as it is, any other value as its JSON), one block per call, in order. Their results
come back as ``tool`` messages without ids (in call order), or, for ``xml_user``, as one ``user``
message per step holding one ``<tool_response>`` block per result. The upstream's answers are the
same messages in text form (so the proxy's repair turns them back into calls for the agent), and
what reached the upstream is read back as the fixture's chat messages (:meth:`TextForm.back`),
so that the corpus harness's reading and call numbers are the chat replay's.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.dialects.text_calls import tool_responses

_CLOSE = "</tool_response>"


def _arguments(raw: Any) -> dict[str, Any]:
    value = orjson.loads(raw) if isinstance(raw, str) else raw
    return value if isinstance(value, dict) else {}


def block(form: str, name: str, raw: Any) -> str:
    """One call in ``form`` (``hermes`` or ``xml``)."""
    args = _arguments(raw)
    if form == "hermes":
        return "<tool_call>\n" + orjson.dumps({"name": name, "arguments": args}).decode() + "\n</tool_call>"
    params = "".join(
        f"<parameter={k}>\n{v if isinstance(v, str) else orjson.dumps(v).decode()}\n</parameter>\n"
        for k, v in args.items()
    )
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def as_text(form: str, message: dict[str, Any]) -> dict[str, Any]:
    """An assistant message with its calls written into its content."""
    calls = message.get("tool_calls") or []
    if not calls:
        return message
    text = message.get("content") if isinstance(message.get("content"), str) else ""
    blocks = "\n".join(block(form, tc["function"]["name"], tc["function"].get("arguments")) for tc in calls)
    return {"role": "assistant", "content": f"{text}\n{blocks}" if text else blocks}


class TextForm:
    """One fixture in text form: ``sent`` the messages, ``origin[k]`` the fixture indexes that
    text-form message ``k`` stands for."""

    def __init__(self, messages: list[dict[str, Any]], form: str, results: str) -> None:
        self.messages = messages
        self.sent: list[dict[str, Any]] = []
        self.origin: list[list[int]] = []
        self.results: set[int] = set()  # the results messages among ``sent``
        k = 0
        while k < len(messages):
            m = messages[k]
            if m.get("role") == "assistant" and m.get("tool_calls"):
                self.sent.append(as_text(form, m))
                self.origin.append([k])
                j = k + 1
                while j < len(messages) and messages[j].get("role") == "tool":
                    j += 1
                if results == "user" and j > k + 1:
                    blocks = "\n".join(
                        f"<tool_response>\n{r['content']}\n{_CLOSE}" for r in messages[k + 1 : j]
                    )
                    self.results.add(len(self.sent))
                    self.sent.append({"role": "user", "content": blocks})
                    self.origin.append(list(range(k + 1, j)))
                else:
                    for t in range(k + 1, j):
                        self.sent.append({"role": "tool", "content": messages[t]["content"]})
                        self.origin.append([t])
                k = j
                continue
            self.sent.append(m)
            self.origin.append([k])
            k += 1

    def before(self, i: int) -> list[dict[str, Any]]:
        """The text form of ``messages[:i]``."""
        return [m for m, o in zip(self.sent, self.origin, strict=True) if o[-1] < i]

    def back(self, i: int, arrived: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """What reached the upstream for request ``i``, as the fixture's chat messages: each
        text-form message as the one(s) it stands for, with the content that arrived (a results
        message split into its tool messages; text after its last block appended to the last),
        and every inserted message as it came."""
        sent = self.before(i)
        out: list[dict[str, Any]] = []
        k = 0
        for a in arrived:
            s = sent[k] if k < len(sent) else None
            if s is None or not _same(a, s, k in self.results):
                out.append(a)
                continue
            origin = self.origin[k]
            k += 1
            if s.get("role") == "tool":
                out.append({**self.messages[origin[0]], "content": a.get("content")})
            elif k - 1 in self.results:
                content = a.get("content") if isinstance(a.get("content"), str) else ""
                end = content.rfind(_CLOSE) + len(_CLOSE)
                results = tool_responses(content[:end]) or []
                for n, t in enumerate(origin):
                    text = results[n] if n < len(results) else ""
                    if n == len(origin) - 1:
                        text += content[end:]
                    out.append({**self.messages[t], "content": text})
            elif s.get("role") == "user":
                out.append({**self.messages[origin[0]], "content": a.get("content")})
            else:
                out.append(self.messages[origin[0]])
        return out


def _same(a: dict[str, Any], s: dict[str, Any], results: bool) -> bool:
    """``a`` is text-form message ``s`` as it arrived (a result's content may differ, a text may
    be appended to a user message)."""
    if a == s:
        return True
    if a.get("role") != s.get("role"):
        return False
    if s.get("role") == "tool":
        return True
    content = a.get("content")
    if not isinstance(content, str):
        return False
    if results:
        return content.startswith("<tool_response>")
    before = s.get("content")
    return isinstance(before, str) and bool(before) and content.startswith(before)
