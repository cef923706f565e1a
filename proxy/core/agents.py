"""Know the agents (DESIGN §2.2): one table from each major agent's tools to what a call does.

The offered tool set says which agent is talking; :data:`AGENTS` maps each one's tools to a
:data:`Kind` (what a call does), the arguments that say what an edit changes, and the shapes of
its successful and failing results. Guards read it through :func:`tool` / :func:`kind_of`
(:mod:`proxy.core.effects`: what may change state and which edits are progress) and
:func:`failure_shape` (:mod:`proxy.core.failures`, ``same_target``, ``escalation``: which failures are
the same failure). A tool the table does not name keeps the generic reading (the name-word
heuristics of :mod:`proxy.core.effects`).

Kinds:

- ``read``: reads a file, a page, an image or the agent's own state (``Read``, ``read_file``,
  ``WebFetch``, ``Skill``); ``search``: finds files or text (``Grep``, ``Glob``, ``web_search``);
- ``mutate``: changes a file (``Edit``, ``Write``, ``apply_patch``, ``replace``); a successful
  mutation with new arguments is progress even when its result is a constant success line;
- ``execute``: runs a command (``Bash``, ``exec_command``, ``run_shell_command``): what it may
  change is the command's business (:func:`proxy.core.effects.shell_read_only`);
- ``wait``: waits on a running process (``BashOutput``, ``TaskOutput``, Codex ``write_stdin``
  with empty ``chars``); the tools that poll a process name it in ``Tool.poll``
  (:data:`proxy.core.waits.POLLS` is read from there);
- ``plan``: the agent's own plan or todo list (``TodoWrite``, ``update_plan``); ``delegate``: hands
  work to a sub-agent (``Task``); ``ask``: asks the user (``AskUserQuestion``, ``ExitPlanMode``).

A patch run through a shell tool is an edit: Codex (codex-rs ``maybe_parse_apply_patch``)
intercepts a shell call whose command is ``apply_patch <<'EOF' … EOF`` (optionally after ``cd
DIR &&``), the argv ``["apply_patch", "<patch>"]`` or ``["bash", "-lc", "apply_patch <<'EOF' …"]``
and applies the patch itself, answering as its ``apply_patch`` tool does (``apply_patch
verification failed: …``). The pinned Codex CLI offers no edit tool to a custom model provider,
so every edit it makes comes that way. Such a call (:func:`shell_patch`) is read as the patch it
carries: kind ``mutate`` (:func:`kind_of`), its change and files those of the patch
(:func:`change_of`, :func:`patched_files`), its failures shaped as ``apply_patch``'s
(:func:`failure_shape` with the call's ``arguments``).

Sources: the agents' own tool definitions (Claude Code 2.x, codex-rs, Qwen Code, opencode, Gemini
CLI, SWE-agent / OpenHands ``str_replace_editor``) and the tool names and arguments they send in
``shared/fixtures/realtraj-native``. Pure data and a small lookup; never raises.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal

from proxy.core.memo import ENTRY_BYTES, Memo

Kind = Literal["read", "search", "mutate", "execute", "wait", "plan", "delegate", "ask"]
KINDS: tuple[Kind, ...] = ("read", "search", "mutate", "execute", "wait", "plan", "delegate", "ask")
#: Kinds whose calls change nothing outside the agent (``wait`` is the waiting rules' business and
#: keeps the generic reading; ``execute`` depends on the command).
READ_ONLY_KINDS = frozenset(("read", "search", "plan", "ask"))


@dataclass(frozen=True, slots=True)
class Edit:
    """How a ``mutate`` tool's arguments say what it changes: ``old``/``new`` name the replaced
    and replacing text (one pair), ``edits`` a list of such pairs (each an object with ``old`` and
    ``new``), ``content`` a whole file written, ``patch`` a patch text (``*** Begin Patch``; the
    name of the argument holding it, ``""`` for a custom tool whose raw input is the patch)."""

    old: str | None = None
    new: str | None = None
    edits: str | None = None
    content: str | None = None
    patch: str | None = None


@dataclass(frozen=True, slots=True)
class Tool:
    """One tool of an agent: its :data:`Kind`; ``wait_if_blank``: the argument whose absence or
    blank value makes a call a ``wait`` (Codex ``write_stdin`` with ``chars: ""`` polls the
    process); ``subcommands``: kinds by subcommand of a multiplexed tool
    (:func:`proxy.core.targets.subcommand`); ``edit``: what a mutation changes; ``success`` / ``failure``:
    regular expressions (``re.MULTILINE``) of its result's success and failure lines. A failure
    pattern matches at the start of a line of the result's first lines; what it matched, with its
    named group ``echo`` (the tool's own arguments echoed back) left out, is the failure's
    *shape*: two results of one tool with the same shape are the same failure, whatever they
    echo. ``poll``: for a tool that polls a running process, (the argument naming the process,
    the prefix of its wait key: ``("session_id", "session")`` → ``session:59664``;
    :func:`proxy.core.waits.poll_of`). ``patches``: for a shell tool whose agent intercepts a patch
    run through it (:func:`shell_patch`), the name of the agent's patch tool, whose entry reads
    such a call."""

    kind: Kind
    wait_if_blank: str | None = None
    poll: tuple[str, str] | None = None
    patches: str | None = None
    subcommands: Mapping[str, Kind] = field(default_factory=dict)
    edit: Edit | None = None
    success: tuple[str, ...] = ()
    failure: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Agent:
    """One agent: its ``name``, the tool names that identify it in an offered tool set
    (``signature``: all of them offered), and its ``tools``."""

    name: str
    signature: frozenset[str]
    tools: Mapping[str, Tool]


_OLD_NEW = Edit(old="old_string", new="new_string")
_CAMEL = Edit(old="oldString", new="newString")

#: Claude Code's tool errors: ``<tool_use_error>`` then the message; an edit's missing or
#: ambiguous text is echoed on the lines after it (``String: …``).
_CC_ERROR = r"^<tool_use_error>[^\n<]*(?P<echo>(?:\n[^\n]*)*)"
_CC_EDIT_OK = (
    r"^The file .+ has been (?:updated|overwritten) successfully\.",
    r"^The file .+ has been updated\. (?:Here's the result of running `cat -n`|All occurrences of )",
)
#: Gemini CLI and Qwen Code (a fork of it): a replace whose old text is missing or ambiguous.
_GEMINI_EDIT_FAILED = (
    r"^Failed to edit, (?:0 occurrences found|expected \d+ occurrences? but found \d+) for old_string"
    r"(?P<echo>.*)",
    r"^Error: (?:Failed to edit|No changes to apply|File not found)[^\n]*",
)
_GEMINI_WRITE_OK = (r"^Successfully (?:created and wrote to new file|overwrote file): ",)
_GEMINI_EDIT_OK = (r"^Successfully (?:modified file|created new file): ",)
#: codex-rs apply_patch: the patch did not apply (its context lines echoed after the colon).
_CODEX_PATCH_FAILED = (
    r"^apply_patch verification failed: Failed to find expected lines in [^\n]*?:(?P<echo>(?:\n[^\n]*)*)",
    r"^apply_patch verification failed: Failed to find context (?P<echo>.*?) in [^\n]*",
    r"^apply_patch verification failed: [^\n]*",
    r"^Invalid patch[^\n]*",
)
_CODEX_PATCH_OK = (r"^Success\. Updated the following files:",)

CLAUDE_CODE = Agent(
    "claude-code",
    frozenset(("Read", "Edit", "Bash", "Grep", "Glob")),
    {
        "Read": Tool("read", failure=(_CC_ERROR,)),
        "Write": Tool(
            "mutate",
            edit=Edit(content="content"),
            success=(r"^File created successfully at: ", *_CC_EDIT_OK),
            failure=(_CC_ERROR,),
        ),
        "Edit": Tool("mutate", edit=_OLD_NEW, success=_CC_EDIT_OK, failure=(_CC_ERROR,)),
        "MultiEdit": Tool(
            "mutate",
            edit=Edit(edits="edits", old="old_string", new="new_string"),
            success=(r"^Applied \d+ edits? to ",),
            failure=(_CC_ERROR,),
        ),
        "NotebookEdit": Tool(
            "mutate", edit=Edit(content="new_source"), success=(r"^Updated cell ",), failure=(_CC_ERROR,)
        ),
        "Bash": Tool("execute", failure=(_CC_ERROR,)),
        "BashOutput": Tool("wait", poll=("bash_id", "task")),
        "KillShell": Tool("execute"),
        "KillBash": Tool("execute"),
        "Glob": Tool("search"),
        "Grep": Tool("search"),
        "LS": Tool("read"),
        "WebFetch": Tool("read"),
        "WebSearch": Tool("search"),
        "TodoWrite": Tool("plan"),
        "TodoRead": Tool("plan"),
        "Task": Tool("delegate"),
        "Agent": Tool("delegate"),
        "TaskOutput": Tool("wait", poll=("task_id", "task")),
        "TaskCreate": Tool("plan"),
        "TaskUpdate": Tool("plan"),
        "TaskGet": Tool("plan"),
        "TaskList": Tool("plan"),
        "TaskStop": Tool("execute"),
        "ExitPlanMode": Tool("ask"),
        "EnterPlanMode": Tool("plan"),
        "AskUserQuestion": Tool("ask"),
        "Skill": Tool("read"),
        "SlashCommand": Tool("read"),
        "ListMcpResourcesTool": Tool("read"),
        "ReadMcpResourceTool": Tool("read"),
    },
)
CODEX = Agent(
    "codex",
    frozenset(("apply_patch",)),
    {
        "shell": Tool("execute", patches="apply_patch"),
        "shell_command": Tool("execute", patches="apply_patch"),
        "exec_command": Tool("execute", patches="apply_patch"),
        "local_shell": Tool("execute", patches="apply_patch"),
        "container.exec": Tool("execute", patches="apply_patch"),
        "write_stdin": Tool("execute", wait_if_blank="chars", poll=("session_id", "session")),
        "apply_patch": Tool(
            "mutate", edit=Edit(patch="input"), success=_CODEX_PATCH_OK, failure=_CODEX_PATCH_FAILED
        ),
        "update_plan": Tool("plan"),
        "view_image": Tool("read"),
        "web_search": Tool("search"),
        "read_file": Tool("read"),
        "list_dir": Tool("read"),
        "grep_files": Tool("search"),
    },
)
QWEN_CODE = Agent(
    "qwen-code",
    frozenset(("run_shell_command", "todo_write")),
    {
        "read_file": Tool("read"),
        "read_many_files": Tool("read"),
        "write_file": Tool("mutate", edit=Edit(content="content"), success=_GEMINI_WRITE_OK),
        "edit": Tool("mutate", edit=_OLD_NEW, success=_GEMINI_EDIT_OK, failure=_GEMINI_EDIT_FAILED),
        "replace": Tool("mutate", edit=_OLD_NEW, success=_GEMINI_EDIT_OK, failure=_GEMINI_EDIT_FAILED),
        "run_shell_command": Tool("execute"),
        "glob": Tool("search"),
        "search_file_content": Tool("search"),
        "grep_search": Tool("search"),
        "list_directory": Tool("read"),
        "todo_write": Tool("plan"),
        "task": Tool("delegate"),
        "web_fetch": Tool("read"),
        "web_search": Tool("search"),
        "save_memory": Tool("mutate"),
        "exit_plan_mode": Tool("ask"),
    },
)
GEMINI_CLI = Agent(
    "gemini-cli",
    frozenset(("run_shell_command", "google_web_search")),
    {
        "read_file": Tool("read"),
        "read_many_files": Tool("read"),
        "write_file": Tool("mutate", edit=Edit(content="content"), success=_GEMINI_WRITE_OK),
        "replace": Tool("mutate", edit=_OLD_NEW, success=_GEMINI_EDIT_OK, failure=_GEMINI_EDIT_FAILED),
        "run_shell_command": Tool("execute"),
        "glob": Tool("search"),
        "search_file_content": Tool("search"),
        "list_directory": Tool("read"),
        "google_web_search": Tool("search"),
        "web_fetch": Tool("read"),
        "save_memory": Tool("mutate"),
        "write_todos": Tool("plan"),
    },
)
OPENCODE = Agent(
    "opencode",
    frozenset(("read", "edit", "bash", "todowrite")),
    {
        "read": Tool("read"),
        "write": Tool("mutate", edit=Edit(content="content")),
        "edit": Tool("mutate", edit=_CAMEL, success=(r"^Edit applied successfully\.",)),
        "multiedit": Tool("mutate", edit=Edit(edits="edits", old="oldString", new="newString")),
        "patch": Tool("mutate", edit=Edit(patch="patchText")),
        "bash": Tool("execute"),
        "glob": Tool("search"),
        "grep": Tool("search"),
        "list": Tool("read"),
        "todowrite": Tool("plan"),
        "todoread": Tool("plan"),
        "task": Tool("delegate"),
        "webfetch": Tool("read"),
        "websearch": Tool("search"),
        "codesearch": Tool("search"),
        "skill": Tool("read"),
        "question": Tool("ask"),
    },
)
#: Chat agents of the SWE-bench kind (SWE-agent, OpenHands, mini-swe-agent): the multiplexed
#: editor and a shell.
CHAT_AGENTS = Agent(
    "swe-agents",
    frozenset(("str_replace_editor",)),
    {
        "str_replace_editor": Tool(
            "mutate",
            subcommands={
                "view": "read",
                "create": "mutate",
                "str_replace": "mutate",
                "insert": "mutate",
                "undo_edit": "mutate",
            },
            edit=Edit(old="old_str", new="new_str", content="file_text"),
            success=(r"^The file .+ has been edited\.", r"^File created successfully at: "),
            failure=(r"^No replacement was performed(?P<echo>.*)",),
        ),
        "bash": Tool("execute"),
        "execute_bash": Tool("execute"),
        "execute_ipython_cell": Tool("execute"),
        "think": Tool("plan"),
    },
)

#: Every agent of the table, most specific signature first.
AGENTS: tuple[Agent, ...] = (CLAUDE_CODE, CODEX, GEMINI_CLI, QWEN_CODE, OPENCODE, CHAT_AGENTS)


def agent_for(tools: Iterable[str] | None) -> Agent | None:
    """The agent whose signature is in the offered tool names (the first of :data:`AGENTS`), or
    None: an agent the table does not know (or no tools offered)."""
    if not tools:
        return None
    names = frozenset(tools)
    return next((a for a in AGENTS if a.signature <= names), None)


@cache
def _by_name() -> Mapping[str, Tool]:
    """Tool name → its entry, over every agent (the first agent naming it wins; entries of one
    name agree on the kind: :func:`tool` may be asked without knowing the agent)."""
    out: dict[str, Tool] = {}
    for agent in AGENTS:
        for name, entry in agent.tools.items():
            out.setdefault(name, entry)
    return out


def tool(name: str, agent: Agent | None = None) -> Tool | None:
    """The table's entry for tool ``name``: ``agent``'s when given and it names it, else the
    first agent's that names it; None for a tool the table does not know."""
    if agent is not None:
        entry = agent.tools.get(name)
        if entry is not None:
            return entry
    return _by_name().get(name)


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def kind_of(
    name: str, arguments: Any, subcommand: str | None = None, agent: Agent | None = None
) -> Kind | None:
    """What a call does (:data:`Kind`), or None for a tool the table does not know (a
    multiplexed tool's unknown subcommand included)."""
    entry = tool(name, agent)
    if entry is None:
        return None
    if entry.subcommands:
        return entry.subcommands.get(subcommand) if subcommand is not None else None
    if (
        entry.wait_if_blank is not None
        and isinstance(arguments, dict)
        and _blank(arguments.get(entry.wait_if_blank))
    ):
        return "wait"
    if entry.patches is not None and shell_patch(name, arguments, agent) is not None:
        return "mutate"
    return entry.kind


#: How a search tool says it found nothing, at the start of its result (or a blank result):
#: Claude Code ``Grep``/``Glob`` ("No matches found", "No files found"), OpenCode ``grep``/``glob``
#: ("No files found"), Gemini CLI and Qwen Code ``search_file_content``/``glob`` ("No matches found
#: for pattern …", "No files found matching pattern …"), and counts of zero ("Found 0 matches").
NOTHING_FOUND = re.compile(
    r"\A\s*(?:\Z|No (?:files|matches|results|match|file)(?: were)? found\b"
    r"|Found 0 (?:files|matches|results)\b|0 (?:files|matches|results)(?: found)?\b)",
    re.IGNORECASE,
)


def found_nothing(name: str, arguments: Any, text: str, agent: Agent | None = None) -> bool:
    """True when a call of a ``search`` tool (:func:`kind_of`) answered that it found nothing
    (:data:`NOTHING_FOUND`). Searching with one pattern after another that each find nothing is
    exploration: the answer "not there" is news each time."""
    return kind_of(name, arguments, agent=agent) == "search" and NOTHING_FOUND.match(text) is not None


def polls() -> dict[str, tuple[str, str]]:
    """Tool name → :attr:`Tool.poll` of every tool of the table that polls a running process
    (``{"write_stdin": ("session_id", "session"), "TaskOutput": ("task_id", "task"), …}``)."""
    return {name: entry.poll for name, entry in _by_name().items() if entry.poll is not None}


# --- a patch run through a shell tool --------------------------------------------------------------

#: The commands codex-rs runs as its patch tool (``APPLY_PATCH_COMMANDS``).
PATCH_COMMANDS = frozenset(("apply_patch", "applypatch"))
#: The shells whose ``-c``/``-lc`` script codex-rs looks into for a patch.
PATCH_SHELLS = frozenset(("bash", "zsh", "sh"))
#: The one statement codex-rs intercepts in a script (``extract_apply_patch_from_bash``):
#: ``apply_patch <<'EOF'``, a newline, the patch, the closing word on a line of its own and
#: nothing after it; optionally ``cd DIR &&`` first (one word or one quoted string). Anything
#: before or after (``… EOF && echo done``) and the shell runs the script itself.
_HEREDOC = re.compile(
    r"\s*(?:cd[ \t]+(?:'[^'\n]*'|\"[^\"\n]*\"|[^\s'\"&;|<>()`$]+)[ \t]*&&[ \t]*)?"
    r"(?:apply_patch|applypatch)[ \t]*<<-?[ \t]*(?P<q>['\"]?)(?P<tag>[A-Za-z_][\w.-]*)(?P=q)[ \t]*\n"
    r"(?P<body>.*?)\n(?P=tag)\s*\Z",
    re.S,
)
_BEGIN_PATCH = "*** Begin Patch"


def _patch_text(text: str) -> str | None:
    return text if text.lstrip().startswith(_BEGIN_PATCH) else None


#: Bounds of the memo of :func:`_heredoc_patch` (an agent's old calls come back on every request):
#: entries, and bytes (:data:`proxy.core.memo.ENTRY_BYTES` plus the script and its patch; a patch
#: can be a whole file).
PATCH_MEMO_ENTRIES = 1024
PATCH_MEMO_BYTES = 2 * 1024 * 1024
#: script -> its patch, "" when it runs none
_patches: Memo[str, str] = Memo(
    PATCH_MEMO_ENTRIES, PATCH_MEMO_BYTES, lambda script, patch: ENTRY_BYTES + len(script) + len(patch)
)


def _heredoc_patch(script: str) -> str | None:
    found = _patches.get(script)
    if found is None:
        m = _HEREDOC.match(script)
        found = _patches.put(script, (_patch_text(m.group("body")) if m is not None else None) or "")
    return found or None


def _script_patch(value: Any) -> str | None:
    if isinstance(value, list):
        if not value or not all(isinstance(v, str) for v in value):
            return None
        if len(value) == 2 and value[0] in PATCH_COMMANDS:  # ["apply_patch", "<patch>"]
            return _patch_text(value[1])
        shell = value[0].rsplit("/", 1)[-1].split(".", 1)[0].lower()
        if len(value) != 3 or shell not in PATCH_SHELLS or value[1] not in ("-c", "-lc"):
            return None
        value = value[2]
    if not isinstance(value, str) or ("apply_patch" not in value and "applypatch" not in value):
        return None
    return _heredoc_patch(value)


def shell_patch(name: str, arguments: Any, agent: Agent | None = None) -> str | None:
    """The patch text a shell call hands to its agent's patch tool (see the module docstring),
    read from its first present ``cmd``/``command`` argument: ``exec_command {"cmd":
    "apply_patch <<'EOF'\\n*** Begin Patch\\n…\\nEOF"}`` → ``"*** Begin Patch\\n…"``;
    ``shell {"command": ["apply_patch", "*** Begin Patch…"]}`` and ``shell {"command": ["bash",
    "-lc", "apply_patch <<'EOF'…"]}`` likewise. None for any other call: a tool that intercepts no
    patch (:attr:`Tool.patches`), a command of another form, a heredoc that is not a patch (its
    first line not ``*** Begin Patch``)."""
    entry = tool(name, agent)
    if entry is None or entry.patches is None or not isinstance(arguments, dict):
        return None
    for arg in ("cmd", "command"):
        if arg in arguments:
            return _script_patch(arguments[arg])
    return None


def runs_as(name: str, arguments: Any, agent: Agent | None = None) -> str:
    """The tool a call is read as: a shell call that runs a patch (:func:`shell_patch`) is its
    agent's patch tool (``exec_command`` running ``apply_patch <<'EOF' …`` → ``apply_patch``),
    any other call its own tool ``name``."""
    entry = tool(name, agent)
    if entry is not None and entry.patches is not None and shell_patch(name, arguments, agent) is not None:
        return entry.patches
    return name


@cache
def _compiled(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p, re.MULTILINE) for p in patterns)


#: How much of a result's start the failure shapes are searched in.
SHAPE_CHARS = 2000
SHAPE_LINES = 5


def _head(text: str) -> str:
    head = text.lstrip()[:SHAPE_CHARS]
    return "\n".join(head.split("\n", SHAPE_LINES)[:SHAPE_LINES])


def failure_shape(name: str, text: str, agent: Agent | None = None, arguments: Any = None) -> str | None:
    """The shape of ``text`` as a failure of tool ``name`` (see :class:`Tool`): the first failure
    pattern of its entry matching at a line start of the result's first :data:`SHAPE_LINES` lines,
    what it matched with its ``echo`` group left out; None when none matches (or the table does
    not know the tool). With the call's ``arguments``, a shell call that runs a patch is shaped
    as its patch tool's (:func:`runs_as`)."""
    entry = tool(runs_as(name, arguments, agent), agent)
    if entry is None or not entry.failure:
        return None
    head = _head(text)
    for pattern in _compiled(entry.failure):
        m = pattern.search(head)
        if m is not None:
            start, end = m.span("echo") if "echo" in pattern.groupindex else (m.end(), m.end())
            if start < 0:
                start = end = m.end()
            return m.string[m.start() : start] + m.string[end : m.end()]
    return None


def succeeded(name: str, text: str, agent: Agent | None = None) -> bool:
    """True when ``text`` has one of tool ``name``'s success lines (in its first lines)."""
    entry = tool(name, agent)
    if entry is None or not entry.success:
        return False
    head = _head(text)
    return any(p.search(head) for p in _compiled(entry.success))


@cache
def failure_lines() -> tuple[str, ...]:
    """Every failure pattern of the table, once each and without its named groups, for
    :class:`proxy.core.failures.FailureRule`: a result that has one is a failure whatever the
    configured patterns (they are specific to their tools: ``apply_patch verification failed:
    …`` comes from nothing else)."""
    out: dict[str, None] = {}
    for agent in AGENTS:
        for entry in agent.tools.values():
            out.update(dict.fromkeys(_GROUP.sub("(?:", p) for p in entry.failure))
    return tuple(out)


_GROUP = re.compile(r"\(\?P<\w+>")

# --- what an edit changes -----------------------------------------------------------------------

#: What one edit call changes: ``(file or "", old text or None, new text or None)`` per replaced
#: span (a whole file written has old None; a deleted file new None), in the call's order.
Change = tuple[tuple[str, str | None, str | None], ...]

_PATCH_FILE = re.compile(r"^\*\*\* (Update|Add|Delete) File: (.+?)\s*$")


def patch_files(text: str) -> tuple[str, ...]:
    """The files a patch (codex-rs ``apply_patch`` format: ``*** Update File: path``) names, in
    order, once each."""
    out: dict[str, None] = {}
    for line in text.splitlines():
        m = _PATCH_FILE.match(line)
        if m is not None:
            out[m.group(2)] = None
    return tuple(out)


def patch_change(text: str) -> Change:
    """What a patch changes: per hunk (``@@`` lines split a file's hunks) its file, its old text
    (context and ``-`` lines) and its new text (context and ``+`` lines); an added file is
    (file, None, content), a deleted one (file, "", None)."""
    out: list[tuple[str, str | None, str | None]] = []
    file, mode = "", ""
    old: list[str] = []
    new: list[str] = []

    def flush() -> None:
        if mode == "Update" and (old or new):
            out.append((file, "\n".join(old), "\n".join(new)))
        elif mode == "Add":
            out.append((file, None, "\n".join(new)))
        old.clear()
        new.clear()

    for line in text.splitlines():
        m = _PATCH_FILE.match(line)
        if m is not None or line.startswith("*** End Patch"):
            flush()
            mode, file = (m.group(1), m.group(2)) if m is not None else ("", "")  # End Patch: no file
            if mode == "Delete":
                out.append((file, "", None))
            continue
        if line.startswith("@@"):
            flush()
        elif line.startswith("-"):
            old.append(line[1:])
        elif line.startswith("+"):
            new.append(line[1:])
        elif line.startswith(" ") and mode == "Update":
            old.append(line[1:])
            new.append(line[1:])
    flush()
    return tuple(out)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _entries(name: str, agent: Agent | None) -> list[Tool]:
    """``agent``'s entry for ``name`` when it names it, else every agent's entry for it, in order."""
    if agent is not None and name in agent.tools:
        return [agent.tools[name]]
    return [a.tools[name] for a in AGENTS if name in a.tools]


def change_of(name: str, arguments: Any, raw: Any, agent: Agent | None = None) -> Change | None:
    """What a call of a ``mutate`` tool changes (by its entry's :class:`Edit`; without ``agent``,
    the first entry for that name whose arguments fit: opencode's ``edit`` has ``oldString``,
    Qwen Code's ``old_string``), or None when the table does not say (an unknown tool, arguments
    not of the documented form): ``Edit {"old_string": "a", "new_string": "b"}`` →
    ``(("", "a", "b"),)``; a custom tool's raw patch text (``raw``) is read when its arguments
    are not an object. A shell call that runs a patch (:func:`shell_patch`) changes what its patch
    changes."""
    patch = shell_patch(name, arguments, agent)
    if patch is not None:
        return patch_change(patch)
    for entry in _entries(name, agent):
        if entry.edit is not None:
            change = _change(entry.edit, arguments, raw)
            if change is not None:
                return change
    return None


def _change(spec: Edit, arguments: Any, raw: Any) -> Change | None:
    if spec.patch is not None:
        text = _text(arguments.get(spec.patch)) if isinstance(arguments, dict) else _text(raw)
        return patch_change(text) if text else None
    if not isinstance(arguments, dict):
        return None
    if spec.edits is not None and isinstance(arguments.get(spec.edits), list):
        pairs = arguments[spec.edits]
        if all(isinstance(p, dict) for p in pairs):
            return tuple(("", _text(p.get(spec.old)), _text(p.get(spec.new))) for p in pairs)
        return None
    if spec.old is not None and (spec.old in arguments or spec.new in arguments):
        return (("", _text(arguments.get(spec.old)), _text(arguments.get(spec.new))),)
    if spec.content is not None and spec.content in arguments:
        return (("", None, _text(arguments.get(spec.content))),)
    return None


def undoes(change: Change, earlier: Change) -> bool:
    """True when ``change`` takes back what ``earlier`` did (each old and new text swapped: A→B
    then B→A)."""
    return len(change) == len(earlier) and all(
        f == g and a == d and b == c and a is not None and b is not None
        for (f, a, b), (g, c, d) in zip(change, earlier, strict=True)
    )


def same_failure(name: str, a: str, b: str, agent: Agent | None = None, arguments: Any = None) -> str | None:
    """The shared shape when ``a`` and ``b`` are the same failure of tool ``name`` called with
    ``arguments`` (:func:`failure_shape` of both, equal), else None."""
    name = runs_as(name, arguments, agent)
    shape = failure_shape(name, a, agent)
    return shape if shape is not None and failure_shape(name, b, agent) == shape else None


def patched_files(name: str, arguments: Any, raw: Any, agent: Agent | None = None) -> tuple[str, ...]:
    """The files a call of a patch tool (an :class:`Edit` with ``patch``) names (:func:`patch_files`
    of its patch text; a custom tool's raw input ``raw`` when its arguments are not an object),
    or of a shell call that runs a patch (:func:`shell_patch`); empty for any other call."""
    patch = shell_patch(name, arguments, agent)
    if patch is not None:
        return patch_files(patch)
    entry = tool(name, agent)
    spec = entry.edit if entry is not None else None
    if spec is None or spec.patch is None:
        return ()
    text = _text(arguments.get(spec.patch)) if isinstance(arguments, dict) else _text(raw)
    return patch_files(text) if text else ()
