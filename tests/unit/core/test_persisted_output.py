"""Large results behind a fresh file name: compared by what they show.

Claude Code replaces a tool result over ~30 KB with a ``<persisted-output>`` block: the size,
"Full output saved to: …/tool-results/<random>.txt" (a new name on every call) and a 2 KB preview
(the shape recorded in the native sessions, e.g. ``cc-cli-6d63c3a51594-0``; the publisher
redacted the paths there). Without masking that name, an exact loop with big outputs never gets
the same result twice: no reminder, no denial, no stop. The default masks
(:data:`proxy.core.volatile.DEFAULT_MASK_PATTERNS`) mask it, so two such results are the same when
their size and preview are. Pinned on the masks and end to end through the real server in the
Messages dialect, JSON and SSE.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.core.progress import same_text
from proxy.core.volatile import DEFAULT_MASKS, MASK, mask
from tests.gates.test_realtraj_native_gate import MINI_OBSERVATIONS
from tests.helpers.realtraj_native import replay_sessions

PREVIEW = "\n".join(f"2026 build step {k}: compiling module_{k}.go" for k in range(40))


def persisted(name: str, preview: str = PREVIEW, size: str = "61.3KB") -> str:
    """A result as Claude Code persists it, saved under ``tool-results/<name>.txt``."""
    path = f"/Users/alex/.claude/projects/-Users-alex-workspace-cli/4f2c9a1e/tool-results/{name}.txt"
    return (
        f"<persisted-output>\nOutput too large ({size}). Full output saved to: {path}\n\n"
        f"Preview (first 2KB):\n{preview}\n...\n</persisted-output>"
    )


def test_the_saved_file_name_is_masked() -> None:
    line = mask(persisted("b7x2kq9w").splitlines()[1], DEFAULT_MASKS)
    assert line == f"Output too large (61.3KB). {MASK}"


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        (persisted("b7x2kq9w"), persisted("mz04tt1c"), True),
        (persisted("b7x2kq9w"), persisted("mz04tt1c", preview=PREVIEW + "\nFAIL module_40"), False),
        (persisted("b7x2kq9w"), persisted("mz04tt1c", size="64.0KB"), False),
    ],
    ids=["only-the-name-differs", "the-preview-differs", "the-size-differs"],
)
def test_persisted_results_are_compared_by_what_they_show(a: str, b: str, same: bool) -> None:
    assert same_text(a, b, DEFAULT_MASKS) is same


def big_output_loop(n: int) -> dict[str, Any]:
    """A Claude Code session running the same ``go build ./...`` ``n`` times, each result
    persisted under a new random name."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "build it"}]
    names = ["b7x2kq9w", "mz04tt1c", "q8rr5d2v", "k3ne7w0p", "x1ya6s4h", "t9uu2m8c", "f5ll0z3e", "w2jj9b6n"]
    for k in range(n):
        use = {
            "type": "tool_use",
            "id": f"toolu_b{k}",
            "name": "Bash",
            "input": {"command": "go build ./..."},
        }
        messages.append(
            {
                "role": "assistant",
                "content": [{"type": "thinking", "thinking": "build", "signature": "s"}, use],
            }
        )
        result = {"type": "tool_result", "tool_use_id": f"toolu_b{k}", "content": persisted(names[k])}
        messages.append({"role": "user", "content": [result]})
    messages.append({"role": "assistant", "content": [{"type": "text", "text": "Done."}]})
    body = {"model": "claude-opus-4-6", "system": None, "tools": [{"name": "Bash", "input_schema": {}}]}
    return {
        "id": "cc-persisted",
        "agent": "claude-code",
        "dialect": "anthropic_messages",
        "request_bodies_final": {**body, "messages": messages},
        "compaction_segments": [],
    }


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_end_to_end_an_exact_loop_with_big_outputs_is_caught(stream: bool) -> None:
    """The same observations as the same loop with a small result (the tiny session of
    :mod:`tests.gates.test_realtraj_native_gate`): reminded at calls 3 and 5, withheld from call 6,
    stopped at call 7."""
    [done] = asyncio.run(replay_sessions([big_output_loop(7)], stream))
    [r] = done.replays
    assert (done.calls, r.requests, r.internal_errors) == (7, 8, 0)
    assert r.observations == MINI_OBSERVATIONS
    assert done.violations() == []
