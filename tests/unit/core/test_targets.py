"""Target of a tool call (proxy.core.targets): first present argument, whitespace-normalized,
per-tool overrides, command words."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.core.canonical import INVALID
from proxy.core.targets import DEFAULT_TARGET_ARGS, Target, TargetRule, command_words, path_key

RULE = TargetRule()


@pytest.mark.parametrize(
    ("tool", "arguments", "expected"),
    [
        ("write_file", {"path": "fix.py", "content": "print(1)"}, Target("fix.py", "path")),
        ("Edit", {"file_path": "/repo/app.py", "old_string": "a"}, Target("/repo/app.py", "file_path")),
        ("read", {"filepath": "a.txt"}, Target("a.txt", "filepath")),
        ("view", {"file": "b.txt"}, Target("b.txt", "file")),
        ("open", {"filename": "c.txt"}, Target("c.txt", "filename")),
        ("edit_file", {"target_file": "d.py", "instructions": "x"}, Target("d.py", "target_file")),
        ("NotebookEdit", {"notebook_path": "n.ipynb"}, Target("n.ipynb", "notebook_path")),
        ("bash", {"command": "python fix.py"}, Target("python fix.py", "command")),
        ("shell", {"cmd": "ls -la"}, Target("ls -la", "cmd")),
        ("fetch", {"url": "https://example.com/a"}, Target("https://example.com/a", "url")),
        ("bash", {"command": "  python\n  fix.py\t--fast  "}, Target("python fix.py --fast", "command")),
        ("shell", {"command": ["bash", "-lc", "pytest  -x"]}, Target("bash -lc pytest -x", "command")),
        ("grep", {"pattern": "x", "path": "src", "url": "u"}, Target("src", "path")),  # first in order
        ("odd", {"path": "", "file_path": "real.py"}, Target("real.py", "file_path")),  # blank skipped
        ("odd", {"path": None, "file": "f.py"}, Target("f.py", "file")),  # null skipped
        ("odd", {"path": {"x": 1}, "url": "u"}, Target("u", "url")),  # object skipped
        ("odd", {"path": True}, None),  # boolean is not a target
        ("odd", {"path": 7}, Target("7", "path")),
        ("read", {"filePath": "/r/a.ts", "offset": 10}, Target("/r/a.ts", "filePath")),  # OpenCode
        ("read_file", {"absolute_path": "/r/a.py"}, Target("/r/a.py", "absolute_path")),  # Gemini CLI
        ("todo_write", {"todos": [{"content": "x"}]}, None),  # no target argument
        ("broken", INVALID, None),  # arguments that are not JSON
        ("list", ["path", "x"], None),  # arguments that are not an object
    ],
)
def test_default_target(tool: str, arguments: Any, expected: Target | None) -> None:
    assert RULE(tool, arguments) == expected


def test_default_argument_names() -> None:
    assert DEFAULT_TARGET_ARGS == (
        "path",
        "file_path",
        "filepath",
        "filePath",
        "absolute_path",
        "file",
        "filename",
        "target_file",
        "notebook_path",
        "command",
        "cmd",
        "url",
    )


@pytest.mark.parametrize(
    ("tool", "arguments", "expected"),
    [
        ("search_docs", {"query": "  loop  guard ", "path": "docs"}, Target("loop guard", "query")),
        ("search_docs", {"path": "docs"}, None),  # the override replaces the defaults
        ("mcp__fs__read", {"uri": "file:///a"}, Target("file:///a", "uri")),  # wildcard pattern
        ("mcp__fs__exact", {"uri": "u", "name": "n"}, Target("n", "name")),  # exact beats wildcard
        ("silent", {"path": "a.py"}, None),  # [] = no target
        ("write_file", {"path": "fix.py"}, Target("fix.py", "path")),  # others keep the defaults
    ],
)
def test_per_tool_overrides(tool: str, arguments: Any, expected: Target | None) -> None:
    rule = TargetRule(
        overrides={"search_docs": ["query"], "mcp__fs__*": ["uri"], "mcp__fs__exact": ["name"], "silent": []}
    )
    assert rule(tool, arguments) == expected


def test_star_override_replaces_the_default_list_for_every_tool() -> None:
    rule = TargetRule(overrides={"*": ["url"], "bash": ["command"]})
    assert rule("read_file", {"path": "a", "url": "u"}) == Target("u", "url")
    assert rule("bash", {"command": "ls"}) == Target("ls", "command")


@pytest.mark.parametrize(
    ("command", "words"),
    [
        ("python fix.py", {"python", "fix.py"}),
        ("cd src && python ./fix.py > out.txt", {"cd", "src", "python", "fix.py", "out.txt"}),
        ("cat 'my file.txt'|wc -l", {"cat", "my", "file.txt", "wc", "-l"}),
        ('pytest "tests/test_a.py";echo $(date)', {"pytest", "tests/test_a.py", "echo", "$", "date"}),
    ],
)
def test_command_words(command: str, words: set[str]) -> None:
    assert command_words(command) == words


def test_words_only_for_command_targets() -> None:
    assert Target("python fix.py", "command").words == {"python", "fix.py"}
    assert Target("my file.py", "path").words == frozenset()


@pytest.mark.parametrize(
    ("text", "key"),
    [("./fix.py", "fix.py"), ("././a", "a"), ("'b.py'", "b.py"), ("./", "./"), ("/abs", "/abs")],
)
def test_path_key(text: str, key: str) -> None:
    assert path_key(text) == key
