"""Smoke: the official openai SDK as an unmodified agent loop gets reminders at 3, 5, 8 (with the
escalation ladder off: on, it ends the loop at the 7th call, tests/unit/guards/test_escalation.py)."""

from __future__ import annotations

from openai import AsyncOpenAI

from tests.helpers.fakes import FakeUpstream


async def test_sdk_loop_gets_reminders_at_3_5_8(upstream: FakeUpstream, make_proxy) -> None:
    base = await make_proxy({"guards": {"escalation": {"enabled": False}}})
    client = AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test")
    messages: list[dict] = [{"role": "user", "content": "Read app.py"}]
    for _ in range(9):
        resp = await client.chat.completions.create(model="m", messages=messages)
        msg = resp.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        for tc in msg.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": "print('hi')"})
    reminders = [
        [i for i, m in enumerate(r.json()["messages"]) if m["role"] == "user" and i > 0]
        for r in upstream.requests
    ]
    assert reminders[3] == [7]
    assert reminders[8] == [7, 12, 19]
    await client.close()
