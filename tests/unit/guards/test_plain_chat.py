"""Plain chat is never touched (DESIGN §2.2): a conversation without any tool call is
forwarded byte for byte and its answers are never stopped, whatever the user and the model say —
repeated user messages ("continue", "again") and repeated answers included. Property test over
the pure request and response sides the server runs (the end-to-end case through the real
server: tests/e2e/test_loop_rules_e2e.py::test_plain_chat_continue_is_never_stopped)."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.config import Config
from proxy.core.effects import progress_rules
from proxy.guards import Context, build_guards
from proxy.request.rewrite import decide_request
from proxy.response.decide import StopJudge, decide_json
from tests.helpers.fakes import completion

CFG = Config()
GUARDS = build_guards(CFG.guards, *progress_rules(CFG.progress))

_words = st.sampled_from(
    ["continue", "again", "go on", "the", "story", "chapter", "dragon", "castle", "Why?", "ok", "No", "more"]
)
_text = st.lists(_words, min_size=1, max_size=12).map(" ".join)
#: a user message: often one of a few repeated ones, as a person asking for more would type
_user = st.one_of(st.sampled_from(["continue", "Continue.", "go on", "again", "more please"]), _text)


@st.composite
def plain_chats(draw: st.DrawFn) -> list[dict[str, Any]]:
    """user, assistant, user, … ending on a user message; replies may repeat exactly; sometimes a
    system prompt and tools offered but never used."""
    n = draw(st.integers(min_value=1, max_value=12))
    same_reply = draw(st.booleans())
    reply = draw(_text)
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": "You are a storyteller."})
    for i in range(n):
        messages.append({"role": "user", "content": draw(_user)})
        if i < n - 1:
            messages.append({"role": "assistant", "content": reply if same_reply else draw(_text)})
    return messages


@settings(max_examples=300, deadline=None)
@given(plain_chats(), st.booleans(), st.booleans())
def test_plain_chat_is_never_rewritten_or_stopped(
    messages: list[dict[str, Any]], offer_tools: bool, same_answer: bool
) -> None:
    body: dict[str, Any] = {"model": "m", "messages": messages}
    if offer_tools:
        body["tools"] = [
            {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}
        ]
    raw = orjson.dumps(body)
    decision = decide_request(raw, {}, GUARDS, CFG.conversation_key.headers)
    assert (decision.body is raw, decision.actions, decision.changed) == (True, (), False)
    assert decision.transcript is not None
    ctx = Context()
    judge = StopJudge(decision.transcript, decision.actions, GUARDS, ctx, CFG)
    last_reply = next(
        (m["content"] for m in reversed(messages) if m["role"] == "assistant"), "Once upon a time"
    )
    answer = last_reply if same_answer else "Chapter two: the dragon wakes."
    assert judge([], answer) is None
    assert judge.on_text_only is False
    out, actions = decide_json(orjson.dumps(completion(content=answer)), judge, CFG)
    assert (out, actions) == (None, [])
