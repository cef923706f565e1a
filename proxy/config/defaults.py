"""The default lists of the config (DESIGN §8): tool names, programs and regular expressions
that a file may replace key by key. They live here, at the bottom layer, so the schema can show
them as defaults and the core modules that read them (:mod:`proxy.core.failures`,
:mod:`proxy.core.volatile`, :mod:`proxy.core.effects`, :mod:`proxy.core.episodes`) import them
downward; the compiled rule objects are built there, from whatever lists the config holds.
"""

from __future__ import annotations

#: Top-level argument keys dropped before two calls are compared: free-text fields an agent
#: rewrites on every call while the call itself stays the same.
DEFAULT_IGNORE_ARGS: tuple[str, ...] = ("description", "explanation", "reason", "thought", "purpose")
#: Tools the circuit breaker never counts (plans, questions to the user).
DEFAULT_EXEMPT: tuple[str, ...] = ("todo_write", "ask_user_question", "exit_plan_mode")

#: Result texts that say the user rejected a call (``guards.repeated_failure.rejection_patterns``).
DEFAULT_REJECTION_PATTERNS: tuple[str, ...] = (
    # "User declined", "The user rejected this tool call", "user denied the request", opencode's
    # "The user rejected permission to use this specific tool call", Cline's "The user denied
    # this operation" (not "user.rejected = True": a space after "user")
    r"(?i)\buser (?:has |had )?(?:rejected|denied|declined|refused)\b",
    # "Permission denied by user", "Command rejected by user", Codex's "exec command rejected by
    # user" (not a shell's bare "Permission denied")
    r"(?i)\b(?:rejected|denied|declined|refused) by (?:the )?user\b",
    # "the user did not approve this command", "The user doesn't want to proceed with this tool
    # use", Claude Code's "The user doesn't want to take this action right now. STOP …"
    r"(?i)\buser (?:doesn['\u2019]t|does not|didn['\u2019]t|did not|hasn['\u2019]t|has not) "
    r"(?:want|approved?|allow(?:ed)?|permit(?:ted)?|consent(?:ed)?)\b",
    # "The user chose not to run this"
    r"(?i)\buser (?:chose|has chosen|decided|has decided) not to\b",
    # "Tool use was rejected", "tool call denied"
    r"(?i)\btool (?:use|call) (?:was |has been )?(?:rejected|denied|declined)\b",
)


#: The default failure patterns (``guards.turn_guard.failure_patterns``, rule step 4), one concept
#: each. Exit codes are step 2's business (:data:`EXIT_STATUS_PATTERNS`), not a pattern's.
DEFAULT_FAILURE_PATTERNS: tuple[str, ...] = (
    # "Error: …", "ERROR …", "FATAL: …", "Error executing command"; not "Errors: 0", "ERROR_CODES".
    r"^(?:Error|ERROR|Fatal|FATAL)\b",
    # lower-case prefixes with a colon: "error: pathspec…", "error[E0425]: …", "fatal: not a git repo"
    r"^(?:error|fatal)(?:\[[\w-]+\])?:",
    r"^(?:npm ERR!|make: \*\*\*)",
    # an agent framework's error wrapper
    r"^<(?:tool_use_error|error)>",
    r"^Traceback \(most recent call last\)",
    # the last line of an uncaught exception: "NameError: name 'x' is not defined", "AssertionError"
    r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)(?::|[ \t\r]*$)",
    # "bash: line 1: foo: command not found", "zsh: command not found: foo",
    # "cat: x: No such file or directory", "bash: ./run.sh: Permission denied"
    r"^(?:[^\s:]+: (?=\S).*?)?(?:command not found|No such file or directory|Permission denied)",
    # dash: "sh: 1: foo: not found"
    r"^[^\s:]+: \d+: .*: not found[ \t\r]*$",
    # an edit rejected by the linter (SWE-agent, OpenHands): "Your proposed edit has introduced new
    # syntax error(s). Please understand the fixes and retry your edit commmand." (sic), then ERRORS:
    r"^\[?Your proposed edit has introduced new syntax error",
    # a string replacement that found nothing to replace (str_replace_editor of SWE-agent,
    # OpenHands, Anthropic's text editor): "No replacement was performed, old_str `x` did not appear…"
    r"^No replacement was performed\b",
    # SWE-agent's interface commands called wrongly: a bare signature "Usage: search_file
    # <search_term> [<file>]" (not --help output such as "Usage: cli [OPTIONS] COMMAND")
    r"^Usage: [\w.-]+(?: \[?<\w+>\]?)+(?:\.|[ \t\r]*$)",
    # SWE-agent's open / find_file / search_dir on a missing path: "File x.py not found",
    # "Directory forms not found"
    r"^(?:File|Directory) \S.* not found[ \t\r]*$",
    # SWE-agent's commands that need an open file, and its searches with too many hits to show:
    # "No file open. Use the open command first.", "More than 120 files matched for "x" in /r.
    # Please narrow your search."
    r"^(?:No file open\. Use the `?open`? command first|More than \d+ (?:files|lines) matched for .*"
    r"Please narrow your search)",
)


#: Default volatile spans, each a Python regular expression (inline flags only in scoped form,
#: ``(?i:...)``, because the list is compiled as one alternation). Order matters where two could
#: match at the same place: the first listed wins.
DEFAULT_MASK_PATTERNS: tuple[str, ...] = (
    # ISO 8601 dates and timestamps: 2026-11-30, 2026-11-30T02:37:55.123Z, 2026-11-30 02:37:55+01:00
    r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?",
    # UUIDs
    r"(?i:\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b)",
    # clock times: 02:37, 02:37:55, 02:37:55.123, 2:37 PM
    r"\b\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:\s?(?i:am|pm))?\b",
    # durations: 0.53s, 12 ms, 1.5 seconds, 3m, 2h, 250µs
    r"\b\d+(?:\.\d+)?\s?(?:ns|us|µs|ms|s|secs?|seconds?|m|mins?|minutes?|h|hrs?|hours?)\b",
    # hex ids (git SHAs, container and request ids): 0x-prefixed, or 7+ hex digits mixing letters and digits
    r"(?i:\b0x[0-9a-f]+\b)",
    r"(?i:\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,}\b)",
    # process ids: pid 4242, PID: 4242, pid=4242, and process group ids: Gemini CLI ends every
    # shell result with "Process Group PGID: 4242"
    r"(?i:\bp(?:g)?id\b[\s:=#]*\d+)",
    # line numbers and counts that shift when a file is edited above them:
    # "(90 lines total)", "(216 more lines above)", a traceback's `File "x.py", line 19` and
    # `(x.py, line 5)`, "error at/on line 5", a linter's `x.py:12:5:`. What the line says is never
    # masked (a different error or line of code is still a new result), nor is a bare "line N"
    # (a job reporting "processing line 1200" is making progress), nor grep's `x.py:12:` hits.
    r"\d+(?= lines total\b)",
    r"\d+(?= more lines (?:above|below)\b)",
    r"(?<=, line )\d+\b",
    r"(?<= at line )\d+\b",
    r"(?<= on line )\d+\b",
    r"(?<=\.py:)\d+(?=:\d+:)",
    # ids an agent harness writes around every tool result (Codex CLI 0.171's
    # exec_command output): "Chunk ID: 3f9a0c" (6 random hex digits, new on every call) and
    # "Process running with session ID 50343"
    r"(?<=Chunk ID: )[0-9a-f]+\b",
    r"(?<=Process running with session ID )\d+\b",
    # where Claude Code saved a large result (over ~30 KB it sends "<persisted-output>", "Output
    # too large (61.3KB). Full output saved to: …/tool-results/<random>.txt" and a 2 KB preview):
    # the file name is new on every call, so two such results are compared by what they show
    # (the size and the preview), or an exact loop with big outputs is never the same result
    r"Full output saved to: [^\n]+",
)


#: Programs whose runs only read (a shell call is read-only when every simple command runs one).
DEFAULT_READ_ONLY_COMMANDS: tuple[str, ...] = (
    "cat",
    "head",
    "tail",
    "less",
    "more",
    "grep",
    "egrep",
    "fgrep",
    "rg",
    "ag",
    "ack",
    "find",
    "ls",
    "tree",
    "pwd",
    "wc",
    "nl",
    "sed",
    "sort",
    "uniq",
    "cut",
    "diff",
    "cmp",
    "file",
    "stat",
    "du",
    "df",
    "which",
    "whereis",
    "type",
    "echo",
    "printf",
    "true",
    "test",
    "basename",
    "dirname",
    "realpath",
    "readlink",
    "date",
    "printenv",
    "id",
    "whoami",
    "uname",
    "hostname",
    "cd",
    "git",
    "jq",
    "xxd",
    "od",
    "hexdump",
    "md5sum",
    "sha256sum",
    "column",
    "tr",
    "fold",
    "rev",
    "seq",
    "sleep",
    "ps",
    "top",
    "free",
    "uptime",
    "lsof",
    "history",
    "man",
)
#: Tools that change nothing outside the agent (plans, todo lists, thinking), read-only by default.
DEFAULT_READ_ONLY_TOOLS: tuple[str, ...] = (
    "todo*",
    "Todo*",
    "*_todo*",
    "*Todo*",
    "update_plan",
    "think",
    "Think",
    "ask_user_question",
)


#: User messages that continue the work rather than ask for something new. Each pattern must match
#: the whole trimmed text (``re.fullmatch``): a short reply is the whole message ("continue", not
#: "continue with the tests"), and a compaction summary's pattern names its opening and then takes
#: the rest of the (long) text with ``.*`` under ``(?s)``.
DEFAULT_CONTINUATION_PATTERNS: tuple[str, ...] = (
    # short replies: "continue", "go on", "No", "yes please", "try again", "ok, keep going."
    r"(?i)(?:(?:ok(?:ay)?|yes|yeah|yep|no|nope|sure|please|thanks|great|good)[,.!]*\s*)*"
    r"(?:continue|go on|go ahead|keep going|carry on|proceed|resume|next|try again|again|retry|do it|"
    r"ok(?:ay)?|yes|yeah|yep|no|nope|sure)?(?:\s*please)?[.!]*",
    # context compaction (Claude Code, Codex, opencode and others summarize the conversation so far):
    # the summary's fixed opening, then the summary itself
    r"(?is)this session is being continued from a previous conversation\b.*",
    r"(?is)(?:here is |the following is )?(?:a )?summary of (?:the|our) (?:previous |prior )?conversation"
    r"(?: so far)?[:.].*",
    r"(?is)(?:\[(?:context|conversation) (?:summary|compacted|compaction)\]"
    r"|(?:context|conversation) summary:).*",
    r"(?is)another language model started to solve this problem\b.*",
    # harness format errors answering an answer without a usable tool call: the heading alone or on
    # a line of its own, a fixed opening, or the bare request for a tool call (a request that says
    # what to do with the tool is a person's)
    r"(?is)tool call error *:? *(?:\r?\n.*)?",
    r"(?is)\[?error\]? *:? *you did not use a tool\b.*",
    r"(?i)please (?:use|call) (?:a|one of the(?: available)?) tools?(?: call)?(?: (?:now|again))?[.!]*",
)
