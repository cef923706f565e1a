"""The sections of the config that are not guards or the response side (DESIGN §8): the agent
side (``listen``), the model server (``upstream``), the conversation key, progress (what is
volatile, what may change state, what continues a turn), the Responses store, the prefix cache,
shared state and capture.

Each section is a frozen dataclass whose field docstrings are the JSON Schema's descriptions;
:class:`~proxy.config.fields.Bound` declares ranges; ``check(path)`` yields the errors a value of
the right type can still have (naming the dotted key). Seconds throughout unless the key says
``_ms``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

from proxy.config import checks
from proxy.config.defaults import (
    DEFAULT_CONTINUATION_PATTERNS,
    DEFAULT_MASK_PATTERNS,
    DEFAULT_READ_ONLY_COMMANDS,
    DEFAULT_READ_ONLY_TOOLS,
)
from proxy.config.fields import SECTION, Bool, Bound, Float, Int, Str
from proxy.errors import ConfigError

#: A timeout in seconds; null = off.
Timeout = Annotated[Float, Bound(gt=0)] | None


@dataclass(frozen=True)
class ListenConfig:
    """The agent side (:mod:`proxy.edge.connections`). Every stall ends: each timeout ends a
    client that is stuck or gone, and none is ever reached by a working one. An idle kept-alive
    connection (nothing sent since the last answer) is not timed: it stays open for aiohttp's
    ``keepalive_timeout`` (3,630 s), longer than any client keeps an idle pooled connection
    (httpx 5 s, Go and Rust 90 s), so the client always closes it first."""

    __pydantic_config__ = SECTION

    host: Str = "127.0.0.1"
    """Listen address (LOOPGUARD_HOST, --host). Use 0.0.0.0 only inside a container."""
    port: Annotated[Int, Bound(ge=0, le=65535)] = 4000
    """Listen port (LOOPGUARD_PORT, --port)."""
    shutdown_grace_s: Annotated[Float, Bound(ge=0)] = 30.0
    """On SIGTERM or SIGINT: how long requests in flight may take to finish before they are ended."""
    header_timeout_s: Timeout = 60.0
    """The longest an agent may take to send a request's headers, from the connection's opening
    (on a kept-alive connection from the first byte of its next request); then the connection
    is closed (a 408 if part of a request came). nginx's client_header_timeout. null = off."""
    body_timeout_s: Timeout = 60.0
    """The longest a request body may stall (idle time between two reads, not the whole upload);
    then a 408 and the connection is closed; nothing was sent upstream. null = off."""
    max_connections: Annotated[Int, Bound(ge=1)] = 1024
    """Agent connections open at once (active and idle kept-alive); one more is answered at once
    with a 503 (too_many_connections, Retry-After: 1). The soft open-files limit is raised to fit."""


@dataclass(frozen=True)
class UpstreamConfig:
    """The model server. ``stream_json_requests`` sends a non-streaming chat completion upstream
    as a stream and assembles the answer (:mod:`proxy.response.as_stream`): an agent that hangs
    up then frees the model slot on servers that only notice a closed stream, and the runaway
    and degenerate-text cuts apply; off by default, since the agent then gets JSON loopguard
    wrote, not the server's bytes."""

    __pydantic_config__ = SECTION

    url: Str = "http://127.0.0.1:8080/v1"
    """Base URL of the model server, as in OPENAI_BASE_URL (LOOPGUARD_UPSTREAM, --upstream). An
    incoming /v1/<rest> goes to <url>/<rest>; a query on this URL goes with every request."""
    connect_timeout_s: Annotated[Float, Bound(gt=0)] = 10.0
    """Seconds to open a connection to the upstream."""
    read_timeout_s: Annotated[Float, Bound(gt=0)] | None = 900.0
    """The longest the upstream may send nothing, in seconds: before its response headers and
    between any two reads of its body (then a 504, or the stream's error event). null = wait forever."""
    max_body_mb: Annotated[Int, Bound(ge=1)] = 64
    """Largest request body accepted, MiB; bigger gets a 413 (request_too_large)."""
    stream_json_requests: Bool = False
    """Send a chat completion asked for without "stream": true upstream as a stream and give the
    agent the answer assembled into one chat.completion object."""

    def check(self, path: str) -> Iterator[ConfigError]:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            got = checks.shown(f"{path}.url", self.url)
            yield ConfigError(f"{path}.url", f"must be an http(s) URL, got {got}")


@dataclass(frozen=True)
class ConversationKeyConfig:
    """Which conversation a request belongs to (DESIGN §4): stats, logs, incident records; never
    decisions. Then the body's prompt_cache_key, then a fingerprint of the conversation's start."""

    __pydantic_config__ = SECTION

    headers: tuple[Str, ...] = ("x-session-id", "session_id", "conversation_id")
    """Request headers tried in order (case-insensitive); the first present wins."""


@dataclass(frozen=True)
class ProgressConfig:
    """Progress-aware repeats (:mod:`proxy.core.progress`): what is volatile in a result, what may
    change state (:mod:`proxy.core.effects`), which user messages continue a turn
    (:mod:`proxy.core.episodes`). One section for every guard with ``progress_aware``; the core
    compiles these lists into its rule objects."""

    __pydantic_config__ = SECTION

    masks: tuple[Str, ...] = DEFAULT_MASK_PATTERNS
    """Regular expressions for volatile spans (timestamps, durations, ids, pids) masked before two
    results are compared; inline flags only in scoped form, (?i:...), as they are searched as one
    alternation."""
    read_only_tools: tuple[Str, ...] = DEFAULT_READ_ONLY_TOOLS
    """Tool-name patterns (whole name, * wildcard) whose calls only read."""
    state_changing_tools: tuple[Str, ...] = ()
    """Tool-name patterns that always may change state (they beat read_only_tools)."""
    read_only_commands: tuple[Str, ...] = DEFAULT_READ_ONLY_COMMANDS
    """Programs whose shell runs only read (without output redirection, sed -i, find -exec …)."""
    continuation_patterns: tuple[Str, ...] = DEFAULT_CONTINUATION_PATTERNS
    """User messages that are no new request (regular expressions that must match the whole
    trimmed text, re.fullmatch; a long text's pattern ends in .* under (?s)): a loop rule that
    counts per turn goes on across them. [] = every user message is a new request."""

    def check(self, path: str) -> Iterator[ConfigError]:
        yield from checks.masks(self.masks, f"{path}.masks")
        for name in ("read_only_tools", "state_changing_tools", "read_only_commands"):
            yield from checks.names(getattr(self, name), f"{path}.{name}")
        yield from checks.regexes(self.continuation_patterns, f"{path}.continuation_patterns")


@dataclass(frozen=True)
class ResponsesStoreConfig:
    """The Responses API's ``previous_response_id`` chains (:mod:`proxy.request.response_store`):
    per response id seen in an upstream answer, that chain's items as the agent has them. Answers
    to requests with ``store: false`` are never kept; an id loopguard does not hold is forwarded
    unguarded (``unguarded{reason="unknown_previous_response"}``)."""

    __pydantic_config__ = SECTION

    max_entries: Annotated[Int, Bound(ge=0, note="0 = keep none")] = 1024
    """Responses kept, least recently used dropped first. 0 = keep none."""
    max_bytes_mb: Annotated[Float, Bound(gt=0, note="no limit")] | None = 64.0
    """MiB of kept items (JSON bytes; a chain's responses share their items). null = no byte limit."""
    max_age_s: Annotated[Float, Bound(gt=0, note="no limit")] | None = 21600.0
    """An entry neither stored nor used for this many seconds is dropped. null = no age limit."""


@dataclass(frozen=True)
class PrefixCacheConfig:
    """What the previous request of each conversation established, kept so the next one reads
    only its new messages (:mod:`proxy.request.prefix_cache`). Decisions are the same with it or
    without it; it only saves time."""

    __pydantic_config__ = SECTION

    max_bytes_mb: Annotated[Float, Bound(ge=0, message="must be a number >= 0 (0 = off)")] = 24.0
    """MiB kept over all conversations (an entry counts its history's JSON bytes plus an estimate
    of its parse state); least recently used dropped first. 0 = off."""

    @property
    def max_bytes(self) -> int:
        """The budget in bytes (0 = off)."""
        return int(self.max_bytes_mb * 1024 * 1024)


#: What a backend URL may start with (``state.backend``): the redis package's URL schemes.
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


@dataclass(frozen=True)
class StateConfig:
    """Where the state shared by replicas lives (:mod:`proxy.request.shared`): narration timing and
    first-seen times, incident de-duplication, the Responses store, the stats totals. A Redis
    outage fails open (requests are decided with the replica's local state)."""

    __pydantic_config__ = SECTION

    backend: Str = "memory"
    """memory (one process), or a Redis URL shared by every replica: redis://host:6379/0,
    rediss://… (TLS), unix:///run/redis.sock."""
    timeout_ms: Annotated[Float, Bound(gt=0)] = 50.0
    """The longest one Redis operation may take, connect included (ms); past it the request goes on."""
    retry_s: Annotated[Float, Bound(ge=0)] = 1.0
    """After a failed operation Redis is not asked again for this many seconds. 0 = at once."""
    prefix: Str = "loopguard:"
    """Prefix of every Redis key."""
    stats_interval_s: Annotated[Float, Bound(gt=0)] = 5.0
    """How often a replica publishes its counters for the totals (seconds)."""

    @property
    def shared(self) -> bool:
        return self.backend != "memory"

    def check(self, path: str) -> Iterator[ConfigError]:
        if self.backend != "memory" and not self.backend.startswith(REDIS_SCHEMES):
            got = checks.shown(f"{path}.backend", self.backend)
            yield ConfigError(f"{path}.backend", f"must be 'memory' or a redis:// URL, got {got}")
        if not self.prefix:
            yield ConfigError(f"{path}.prefix", "must not be empty")


@dataclass(frozen=True)
class CaptureConfig:
    """Capture of guarded requests for ``loopguard replay`` (:mod:`proxy.edge.capture`): one JSON
    line per guarded request (the conversation's messages and the answer's calls, never headers),
    the file rotated by :class:`logging.handlers.RotatingFileHandler`."""

    __pydantic_config__ = SECTION

    path: Str = ""
    """The JSONL file; "" = off. Its directory must exist and be writable (checked at start)."""
    max_bytes: Annotated[Int, Bound(ge=1024)] = 100 * 1024 * 1024
    """Rotate when the file would grow past this many bytes."""
    backups: Annotated[Int, Bound(ge=1)] = 5
    """Rotated files kept (path.1 … path.<backups>, the oldest dropped)."""
    contents: Bool = False
    """true: write texts and arguments as sent; false: each as a digest (equal texts give equal
    digests, so replay decides the same)."""

    def check(self, path: str) -> Iterator[ConfigError]:
        if self.path:
            problem = checks.unwritable(Path(self.path))
            if problem:
                yield ConfigError(f"{path}.path", problem)
