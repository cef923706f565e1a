"""The OpenAI Agents SDK as an unmodified agent: an ``Agent`` with one function tool on
its default Responses model (``OpenAIResponsesModel`` over an ``AsyncOpenAI`` client whose
``base_url`` is loopguard), run by ``Runner.run`` / ``Runner.run_streamed`` against a scripted fake
Responses server whose model repeats the same call. By default the SDK sends its whole history
on every turn (no ``previous_response_id``); with ``auto_previous_response_id=True`` it chains
responses and sends only the new items. Either way the model is shown loopguard's reminders and
withheld results, and the run ends with loopguard's stop text as its final output."""

from __future__ import annotations

from typing import Any

import pytest
from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

from tests.conftest import ProxyFactory
from tests.helpers.fake_responses import FakeResponses, function_call
from tests.helpers.fakes import FakeUpstream

set_tracing_disabled(True)  # no traces sent anywhere

RESULT = "print('hi')"


def repeating_model(n: int, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Calls ``read_file`` on app.py, every time."""
    return [function_call("read_file", '{"path": "app.py"}')]


def agent_for(base: str, executions: list[str]) -> tuple[Agent[Any], AsyncOpenAI]:
    client = AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0)

    @function_tool
    def read_file(path: str) -> str:
        """Read a file of the project."""
        executions.append(path)
        return RESULT

    agent = Agent(
        name="coder",
        instructions="You fix bugs. Use the tools.",
        tools=[read_file],
        model=OpenAIResponsesModel(model="gpt-4.1", openai_client=client),
    )
    return agent, client


def shown(histories: list[list[dict[str, Any]]]) -> tuple[int, int]:
    """Reminders and withheld results in the last history the model saw."""
    last = histories[-1]
    reminders = sum(
        1
        for i in last
        if i.get("role") == "user"
        and not isinstance(i.get("content"), str)
        and i["content"][0]["text"].startswith("[loopguard]")
    )
    withheld = sum(
        1
        for i in last
        if i.get("type") == "function_call_output"
        and str(i.get("output")).startswith("[loopguard] The result")
    )
    return reminders, withheld


@pytest.mark.parametrize("chained", [False, True], ids=["full_input", "previous_response_id"])
@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_streamed"])
async def test_agents_sdk_loop_ends_with_loopguards_stop(
    upstream: FakeUpstream, make_proxy: ProxyFactory, stream: bool, chained: bool
) -> None:
    fake = FakeResponses(repeating_model, stateful=True)
    upstream.handler = fake.handle
    base = await make_proxy()
    executions: list[str] = []
    agent, client = agent_for(base, executions)
    try:
        if stream:
            result: Any = Runner.run_streamed(
                agent, "Fix the bug in app.py", max_turns=20, auto_previous_response_id=chained
            )
            async for _ in result.stream_events():
                pass
        else:
            result = await Runner.run(
                agent, "Fix the bug in app.py", max_turns=20, auto_previous_response_id=chained
            )
    finally:
        await client.close()
    assert executions == ["app.py"] * 6  # the 7th call was never run
    assert str(result.final_output).startswith("[loopguard] Stopped: the model kept calling read_file")
    assert all(b.get("stream") is (True if stream else None) for b in fake.bodies)
    chain = [b.get("previous_response_id") is not None for b in fake.bodies]
    assert chain == ([False] + [True] * 6 if chained else [False] * 7)
    if chained:  # only the new item each time (plus loopguard's reminders after calls 3 and 5)
        assert [len(b["input"]) for b in fake.bodies] == [1, 1, 1, 2, 1, 2, 1]
    assert shown(fake.histories) == (2, 1)
