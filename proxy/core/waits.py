"""Waiting on a running process (DESIGN §2.2): a poll whose result says the process is still
running, or a shell call that only sleeps, is waiting, not looping.

The shapes, as the real agents send them (``shared/fixtures/realtraj-native``, and the CLIs):

- Codex (codex-rs) starts a command with ``exec_command``; when it outlives ``yield_time_ms``
  the result says ``Process running with session ID N``, and the model polls it with
  ``write_stdin {"session_id": N, "chars": ""}`` (each poll waits up to ``yield_time_ms``, often
  30 s; dozens in a row while a build runs). Every result starts with ``Chunk ID: …`` and
  ``Wall time: 30.0045 seconds``, then ``Process running with session ID N`` or
  ``Process exited with code C``, then ``Output:`` and only the output that is new since the
  last read.
- Claude Code starts one with ``Bash {"run_in_background": true}`` (``Command running in
  background with ID: X``) and checks it with ``TaskOutput {"task_id": X, "block": …,
  "timeout": ms}`` (``<status>running</status>``, ``<status>completed</status>`` with
  ``<exit_code>`` and ``<output>``), or, before 2.x, ``BashOutput {"bash_id": X}`` (the same
  ``<status>`` tag, new output in ``<stdout>``). It also waits with ``sleep 60 && echo …``
  between status checks while teammates work.

Rules:
- A **poll** is ``write_stdin`` with a ``session_id`` and empty (or no) ``chars``,
  ``TaskOutput`` with a ``task_id``, or ``BashOutput`` with a ``bash_id``; it polls that
  process (:func:`poll_of`). Writing characters to a process is talking to it, not waiting.
- A **sleep** is a shell call (a ``command``/``cmd`` argument) whose every simple command
  (split on ``&&``, ``||``, ``;``, newlines) is ``sleep`` with a duration or one of
  :data:`QUIET` (``echo``, ``printf``, ``true``, ``:``), with at least one ``sleep``
  (:func:`sleep_ms`). ``sleep 5 && make`` is a command, not a wait.
- A call **waits** (:func:`is_wait`) when it is a sleep whose result is not an error and that
  waited at least :data:`MIN_SLEEP_MS` (by :func:`waited_ms`: the wall time its result reports,
  else its duration), or a poll whose result says the process is still running
  (:data:`RUNNING`). A wait exempts a call from the loop rules only while time really passes or
  the process waited on runs: ``sleep 0 && echo still waiting`` answered the same way hundreds of
  times waits for nothing, and is counted as any other repeated command. A poll whose result has not
  arrived (the response side's look-ahead) waits: it cannot be judged on a result it does not
  have, and a wait is never stopped. A poll whose result says the process exited (or anything
  else) does not wait: the wait is over, and repeating that poll is an ordinary repeat.
- How long a call waited (:func:`waited_ms`), from the conversation only: the ``Wall time``
  its result reports (Codex), the ``timeout`` of a blocking ``TaskOutput`` that came back still
  running, the duration of a sleep; 0 when the conversation does not say.
- Whether a poll's result brought output (:func:`has_output`): text after Codex's ``Output:``
  line, or in a ``<stdout>``/``<output>``/``<stderr>`` element.
- :func:`started` names the process a call's result says it left running (an ``exec_command``
  result with ``Process running with session ID N``, a background ``Bash``'s ID), so the wait's
  time counts from its start.

Pure; never raises on odd arguments.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from proxy.core import agents
from proxy.core.transcript import ToolCall, ToolResult

#: Poll tools: name → the argument naming the process it polls (and the key prefix); the agents'
#: tool table says which tools poll (:attr:`proxy.core.agents.Tool.poll`).
POLLS: dict[str, tuple[str, str]] = agents.polls()
#: The least a sleep must wait (ms) to be a wait: one of 0 (or a few ms) lets a loop pass as
#: waiting with no time passing at all, while agents do poll a background job with half-second
#: sleeps (Claude Code's ``sleep 0.5 && echo still running``): those pass time, and the waiting
#: rule bounds them by the time they add up to.
MIN_SLEEP_MS = 100
#: Programs a sleep may run besides ``sleep`` and still only wait.
QUIET = frozenset(("echo", "printf", "true", ":"))
#: A result that says the process is still running (Codex; Claude Code's ``<status>``).
RUNNING = re.compile(r"^Process running with session ID \d+\s*$|<status>running</status>", re.M)
_WALL = re.compile(r"^Wall time: (\d+(?:\.\d+)?) seconds?\s*$", re.M)
_STARTED = re.compile(
    r"^Process running with session ID (\d+)\s*$|^Command running in background with ID: (\w+)", re.M
)
_CODEX_OUTPUT = re.compile(r"^Output:\n(.*)", re.M | re.S)
_TAGGED_OUTPUT = re.compile(r"<(stdout|stderr|output)>(.*?)</\1>", re.S)
_SEGMENTS = re.compile(r"&&|\|\||[;\n]")
_QUOTED = re.compile(r"'[^']*'|\"(?:[^\"\\\\]|\\\\.)*\"")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?|\.\d+)([smhd]?)$")
_UNIT_MS = {"": 1000, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def _known(result: ToolResult | None) -> bool:
    return result is not None and not result.pending


def poll_of(call: ToolCall) -> str | None:
    """The process ``call`` polls (``session:59664``, ``task:b2ed671``), or None when it is not
    a poll (see the module docstring)."""
    spec = POLLS.get(call.name)
    args = call.arguments
    if spec is None or not isinstance(args, dict):
        return None
    arg, prefix = spec
    pid = args.get(arg)
    if isinstance(pid, bool) or not isinstance(pid, (int, str)) or pid == "":
        return None
    if call.name == "write_stdin" and args.get("chars") not in (None, ""):
        return None
    return f"{prefix}:{pid}"


def _command(arguments: Any) -> str | None:
    if not isinstance(arguments, dict):
        return None
    for name in ("command", "cmd"):
        value = arguments.get(name)
        if isinstance(value, str):
            return value
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            if (
                len(value) == 3
                and value[0].rsplit("/", 1)[-1] in ("bash", "sh", "zsh")
                and value[1] in ("-c", "-lc")
            ):
                return value[2]
            return " ".join(value)
    return None


def sleep_ms(call: ToolCall) -> int | None:
    """How long a sleep call sleeps (ms; ``sleep 60 && echo done`` → 60000, ``sleep 1m`` →
    60000, ``sleep 2 3`` → 5000), or None when ``call`` is not a sleep."""
    command = _command(call.arguments)
    return None if command is None else _sleep_of(command)


@functools.lru_cache(maxsize=4096)  # an agent's old calls come back on every request
def _sleep_of(command: str) -> int | None:
    if "<<" in command or "`" in command or "$(" in command or "|" in command.replace("||", ""):
        return None
    command = _QUOTED.sub("Q", command)
    total = 0
    slept = False
    for segment in _SEGMENTS.split(command):
        words = segment.split()
        if not words:
            continue
        prog = words[0].rsplit("/", 1)[-1]
        if prog in QUIET:
            if any(w.startswith(">") or ">" in w for w in words[1:]):
                return None  # writes a file
            continue
        if prog != "sleep" or len(words) < 2:
            return None
        for word in words[1:]:
            m = _DURATION.match(word)
            if m is None:
                return None
            total += int(float(m.group(1)) * _UNIT_MS[m.group(2)])
        slept = True
    return total if slept else None


def says_running(result: ToolResult | None) -> bool:
    """True when ``result`` is known and says its process is still running."""
    return _known(result) and result is not None and RUNNING.search(result.text) is not None


def is_wait(call: ToolCall) -> bool:
    """True when ``call`` waits on a running process (see the module docstring)."""
    name = call.name
    if name in POLLS and poll_of(call) is not None:
        return not _known(call.result) or says_running(call.result)
    if sleep_ms(call) is None:
        return False
    if call.result is not None and call.result.is_error is True:
        return False
    return waited_ms(call) >= MIN_SLEEP_MS


def waited_ms(call: ToolCall) -> int:
    """How long ``call`` waited, in ms, as the conversation says (0 when it does not)."""
    result = call.result
    if _known(result):
        assert result is not None
        wall = _WALL.search(result.text[:400])
        if wall is not None:
            return int(float(wall.group(1)) * 1000)
        if call.name == "TaskOutput" and says_running(result) and isinstance(call.arguments, dict):
            args = call.arguments
            timeout = args.get("timeout", 30_000)
            if args.get("block", True) is not False and isinstance(timeout, (int, float)):
                return max(int(timeout), 0)
    slept = sleep_ms(call)
    return slept if slept is not None else 0


def has_output(result: ToolResult | None) -> bool:
    """True when a poll's ``result`` carries output (new output, for the agents that return only
    what is new since the last read)."""
    if not _known(result):
        return False
    assert result is not None
    text = result.text
    m = _CODEX_OUTPUT.search(text)
    if m is not None:
        return bool(m.group(1).strip())
    return any(body.strip() for _, body in _TAGGED_OUTPUT.findall(text))


def started(call: ToolCall) -> str | None:
    """The process ``call``'s result says it left running, as :func:`poll_of` names it
    (``session:59664``, ``task:b2ed671``), or None."""
    if not _known(call.result):
        return None
    assert call.result is not None
    m = _STARTED.search(call.result.text[:400])
    if m is None:
        return None
    return f"session:{m.group(1)}" if m.group(1) else f"task:{m.group(2)}"
