"""A ``ToolCallingAgent`` with three file and shell tools, as a smolagents user writes one (run with
the smolagents venv's Python by ``tests/agents/test_smolagents.py``; imports nothing of the project).

``python smolagents_tools.py <api_base> <task>``: the agent on ``OpenAIModel`` at ``api_base``
(streamed answers, as the ``smolagent`` CLI asks), in the current directory; prints the final
answer last."""

import subprocess
import sys
from pathlib import Path

from smolagents import OpenAIModel, ToolCallingAgent, tool


@tool
def read_file(path: str) -> str:
    """Read a text file.

    Args:
        path: the file's path, relative to the working directory.
    """
    return Path(path).read_text()


@tool
def replace_in_file(path: str, old: str, new: str) -> str:
    """Replace the first occurrence of a text in a file.

    Args:
        path: the file's path.
        old: the text to replace.
        new: the text to put instead.
    """
    text = Path(path).read_text()
    if old not in text:
        return f"Error: {old!r} not found in {path}"
    Path(path).write_text(text.replace(old, new, 1))
    return f"The file {path} has been updated successfully."


@tool
def run_command(command: str) -> str:
    """Run a shell command and return its exit code and output.

    Args:
        command: the command line.
    """
    done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60)
    return f"exit code {done.returncode}\n{done.stdout}{done.stderr}"


def main() -> None:
    api_base, task = sys.argv[1], sys.argv[2]
    model = OpenAIModel(model_id="fake-model", api_base=api_base, api_key="sk-loopguard-fake")
    agent = ToolCallingAgent(
        tools=[read_file, replace_in_file, run_command], model=model, stream_outputs=True
    )
    print("FINAL:", agent.run(task))


if __name__ == "__main__":
    main()
