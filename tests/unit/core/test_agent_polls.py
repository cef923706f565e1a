"""The tools that poll a running process come from the agents' tool table (proxy/core/agents.py
``Tool.poll``), read by the waiting rules (proxy/core/waits.py ``POLLS``): one source for both."""

from __future__ import annotations

from proxy.core import agents, waits


def test_the_poll_tools_are_read_from_the_agents_table() -> None:
    assert waits.POLLS == {
        "write_stdin": ("session_id", "session"),
        "TaskOutput": ("task_id", "task"),
        "BashOutput": ("bash_id", "task"),
    }
    assert agents.polls() == waits.POLLS


def test_every_poll_tool_is_a_wait_in_the_table() -> None:
    """A poll is a ``wait`` (Claude Code's), or one when its input is blank (Codex ``write_stdin``
    with empty ``chars``)."""
    kinds = {name: agents.kind_of(name, {spec[0]: 7, "chars": ""}) for name, spec in waits.POLLS.items()}
    assert kinds == {"write_stdin": "wait", "TaskOutput": "wait", "BashOutput": "wait"}
