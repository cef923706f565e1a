"""A small builder of OpenAI chat histories, step by step (each step: calls and their results), for
the guard, rule and progress tests that need a conversation but no wire."""

from __future__ import annotations

from typing import Any

import orjson

Call = tuple[str, "dict[str, Any] | str", "str | None"]


class History:
    """``History().step(("bash", {"command": "ls"}, "a.py")).user("go on").messages``.

    Each call gets the id ``c<n>`` (n counts calls from 1); a result of None leaves the call
    without a tool message (its results have not arrived)."""

    def __init__(self, prompt: str = "Fix the bug in fix.py") -> None:
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
        self.calls = 0

    def step(self, *calls: Call, text: str | None = None) -> History:
        wire, results = [], []
        for name, args, result in calls:
            self.calls += 1
            cid = f"c{self.calls}"
            arguments = args if isinstance(args, str) else orjson.dumps(args).decode()
            wire.append({"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}})
            if result is not None:
                results.append({"role": "tool", "tool_call_id": cid, "content": result})
        self.messages.append({"role": "assistant", "content": text, "tool_calls": wire})
        self.messages.extend(results)
        return self

    def steps(self, calls: list[Call]) -> History:
        """One step per call."""
        for c in calls:
            self.step(c)
        return self

    def user(self, text: str = "keep going") -> History:
        self.messages.append({"role": "user", "content": text})
        return self

    def say(self, text: str) -> History:
        self.messages.append({"role": "assistant", "content": text})
        return self

    def body(self) -> bytes:
        return orjson.dumps({"model": "m", "messages": self.messages})

    def result_position(self, call: int) -> int:
        """Message index of the tool result of call number ``call`` (1-based)."""
        cid = f"c{call}"
        return next(i for i, m in enumerate(self.messages) if m.get("tool_call_id") == cid)
