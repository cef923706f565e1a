"""Hot reload: what a request decides with, and how a reload replaces it.

A :class:`Runtime` is the config plus what is built from it (the guards, the memory glue for
them). The server holds the current one in a :class:`Live`; each request takes the current one
when it starts and keeps it to its end (:func:`proxy.edge.keys.runtime_of`), so a request in flight
finishes under the config it started with while later requests get the new one.

:func:`reload` (``SIGHUP``, ``POST /loop-guard/reload``) re-reads the config through the
``loader`` the CLI gave (the same file, environment and flags as at start). It changes nothing
and raises :class:`proxy.errors.ConfigError` naming the key when the file is invalid, or when it
changes a key only a restart can change (:data:`proxy.config.RESTART_ONLY`: the listening
socket, the upstream pool and its timeouts, the stores sized at start, the state backend, the
incident log's file): rejecting such a file, rather than applying the rest, keeps the running
config equal to one file that was read. What the process remembers (the state store, the
Responses store, stats, incidents already recorded) outlives a reload.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import structlog

from proxy.config import Config, restart_keys
from proxy.core.collapse import Collapse
from proxy.core.effects import progress_rules
from proxy.dialects import anthropic_messages, openai_chat, openai_responses
from proxy.errors import ConfigError
from proxy.guards import Guard, build_guards
from proxy.guards.stop_note import stop_note_for
from proxy.request.memory import Memory

log = structlog.get_logger("loopguard")


@dataclass(frozen=True, slots=True)
class Runtime:
    """What a request decides with: the config, the guards built from it, and the memory glue
    for those guards (over the one state store of the process)."""

    cfg: Config
    guards: tuple[Guard, ...]
    memory: Memory
    #: ``cfg.observed_rules()``, computed once per config
    observed: frozenset[str] = frozenset()
    #: the dialects whose requests with nothing to guard in their bytes skip the guards
    #: (:mod:`proxy.request.plain`, :func:`plain_dialects`)
    plain: tuple[ModuleType, ...] = ()
    #: the folding of repeated steps (``recovery.collapse``; None: off), :func:`collapse_for`
    collapse: Collapse | None = None


def plain_dialects(cfg: Config, memory: Memory) -> tuple[ModuleType, ...]:
    """The dialects for which the nothing-to-guard path keeps every effect of a full read: none
    with per-conversation memory (the turn guard remembers when a turn was first seen, plain or
    not), a capture (it records every guarded request) or the stream conversion (it reads the
    body); the Responses API only without its store (which keeps the answer of every request
    not sent with ``store: false``, for later ``previous_response_id`` chains)."""
    if memory.enabled or cfg.capture.path or cfg.upstream.stream_json_requests:
        return ()
    if cfg.responses_store.max_entries == 0:
        return (openai_chat, anthropic_messages, openai_responses)
    return (openai_chat, anthropic_messages)


def collapse_for(cfg: Config) -> Collapse | None:
    """What ``recovery.collapse`` folds with (:mod:`proxy.core.collapse`): its ``min_repeats``,
    the compiled ``progress.masks`` and the reminders' delivery
    (``guards.repeat_reminder.inject_as``); None when it is off."""
    section = cfg.recovery.collapse
    if not section.enabled:
        return None
    masks = progress_rules(cfg.progress)[0]
    return Collapse(section.min_repeats, masks, cfg.guards.repeat_reminder.inject_as)


def build_runtime(cfg: Config, previous: Runtime | None = None) -> Runtime:
    """The :class:`Runtime` of ``cfg``; after ``previous`` (a reload), over its state store and
    clock. Raises what :func:`proxy.guards.build_guards` raises (nothing for a checked config)."""
    guards = build_guards(
        cfg.guards,
        *progress_rules(cfg.progress),
        stop_note_for(cfg),
        cfg.recovery.reminders,
    )
    if previous is None:
        memory = Memory(guards)
    else:
        memory = Memory(guards, previous.memory.store, previous.memory.clock)
    return Runtime(cfg, guards, memory, cfg.observed_rules(), plain_dialects(cfg, memory), collapse_for(cfg))


class Live:
    """The current :class:`Runtime` (replaced by :func:`reload`) and how to re-read the config
    (``loader``: None when the server was not started from a file the CLI can read again)."""

    __slots__ = ("_lock", "_tasks", "current", "loader")

    def __init__(self, current: Runtime, loader: Callable[[], Config] | None) -> None:
        self.current = current
        self.loader = loader
        self._lock = asyncio.Lock()  # one reload at a time
        self._tasks: set[asyncio.Task[str | None]] = set()

    def on_signal(self) -> None:
        """The SIGHUP handler: start :func:`reload_logged` (the loop's signal handlers are sync)."""
        task = asyncio.ensure_future(reload_logged(self, "SIGHUP"))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def reload(live: Live) -> Runtime:
    """Re-read the config and make it current (requests in flight keep theirs). Raises
    :class:`ConfigError` naming the key, and changes nothing, when the file is invalid, when it
    changes a key only a restart can change (:func:`proxy.config.restart_keys`; the first one
    is the key, the message lists them all), or when there is no file to re-read (``<file>``).
    Reading the file and building the guards (regular expressions) run in a worker thread: the
    event loop goes on serving meanwhile."""
    if live.loader is None:
        raise ConfigError("<file>", "this server was not started from a config file it can re-read")
    async with live._lock:
        new = await asyncio.to_thread(live.loader)
        changed = restart_keys(live.current.cfg, new)
        if changed:
            raise ConfigError(
                changed[0],
                f"cannot change without a restart (changed: {', '.join(changed)}); nothing reloaded",
            )
        runtime = await asyncio.to_thread(build_runtime, new, live.current)
        live.current = runtime
        return runtime


async def reload_logged(live: Live, via: str) -> str | None:
    """:func:`reload`, logged: ``config_reloaded`` (info, with the guards now on and their modes,
    :meth:`proxy.config.Config.modes`, as the ``listening`` line) or
    ``config_reload_rejected`` (warning, with ``key`` and the message ``error``; any other
    exception is a bug, logged as an error with its type). ``via``: ``SIGHUP`` or ``http``.
    Returns the error message, None when reloaded."""
    try:
        runtime = await reload(live)
    except ConfigError as exc:
        log.warning("config_reload_rejected", via=via, key=exc.key, error=str(exc))
        return str(exc)
    except Exception as exc:  # a bug: the old config stays
        log.error("config_reload_rejected", via=via, error=type(exc).__name__)
        return f"reload failed ({type(exc).__name__})"
    log.info("config_reloaded", via=via, guards=runtime.cfg.modes())
    return None
