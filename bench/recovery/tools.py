"""The agent's tools, which really run in the task's temporary repository.

``list_files``, ``read_file``, ``write_file`` and ``run`` (``python <path>``, killed after
:data:`bench.recovery.tasks.RUN_TIMEOUT_S` seconds). Paths are relative to the repository; one
that leaves it is refused. Results longer than :data:`MAX_RESULT_CHARS` characters are cut.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.recovery.tasks import run_python

#: Longest tool result, in characters (the small model's context is 8,192 tokens).
MAX_RESULT_CHARS = 800


def _fn(name: str, description: str, **props: str) -> dict[str, Any]:
    """An OpenAI function tool spec whose parameters are the string properties ``props``."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {k: {"type": "string", "description": d} for k, d in props.items()},
                "required": list(props),
            },
        },
    }


TOOLS: list[dict[str, Any]] = [
    _fn("list_files", "List the files in the repository."),
    _fn("read_file", "Read a file of the repository.", path="file path, e.g. test.py"),
    _fn(
        "write_file",
        "Write a file of the repository (replaces its whole content).",
        path="file path",
        content="the new file content",
    ),
    _fn("run", "Run a Python file of the repository and show its output.", path="e.g. test.py"),
]


def _inside(root: Path, rel: Any) -> Path | None:
    """``root/rel`` if it is a path inside ``root``, else None."""
    if not isinstance(rel, str) or not rel.strip():
        return None
    path = (root / rel.strip()).resolve()
    return path if path.is_relative_to(root.resolve()) and path != root.resolve() else None


def execute(root: Path, name: str, arguments: str) -> str:
    """Run tool ``name`` with JSON ``arguments`` in ``root``; the result text (errors included:
    unknown tool, bad JSON, a path outside the repository, a missing file)."""
    try:
        args = json.loads(arguments or "{}")
    except ValueError:
        return "error: the arguments are not valid JSON"
    if not isinstance(args, dict):
        return "error: the arguments must be a JSON object"
    if name == "list_files":
        files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
        out = "\n".join(f for f in files if "__pycache__" not in f)
    elif name in ("read_file", "write_file", "run"):
        path = _inside(root, args.get("path"))
        if path is None:
            return f"error: {args.get('path')!r} is not a file path inside the repository"
        if name == "write_file":
            content = args.get("content")
            if not isinstance(content, str):
                return "error: content must be a string"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
            out = f"wrote {len(content)} characters to {path.relative_to(root.resolve()).as_posix()}"
        elif not path.is_file():
            return f"error: no such file: {args.get('path')}"
        elif name == "read_file":
            out = path.read_text(errors="replace")
        else:
            code, output = run_python(root, str(path.relative_to(root.resolve())))
            out = f"exit code {code}\n{output}"
    else:
        return f"error: unknown tool {name!r}"
    return out if len(out) <= MAX_RESULT_CHARS else out[:MAX_RESULT_CHARS] + "\n[... cut]"
