"""Incident records (DESIGN §6.2): one per conversation and kind.

An *incident* is the first circuit-breaker denial of a kind (``duplicate``, ``waste``, ``cap``) or the first
response-side stop (kind ``stop``, :mod:`proxy.response.decide`) in a conversation, recorded once, when it
is decided. Which actions qualify is derived from the request alone (:func:`first_fresh_denials`):
the action must be fresh (it concerns the newest step) and no earlier action of that kind may exist
among the re-derived ones (for stops: the stop texts already in the history,
:func:`proxy.response.decide.earlier_stops`). So once a conversation's history shows one, later requests
never record it again, across a proxy restart too.

The one case the history cannot tell apart is a client retry of the very request that carried the
fresh denial; a bounded in-memory set of ``(agent, kind)`` already recorded (least recently used
dropped first) covers it. A retry that spans a restart is the only way to get a second line.

:class:`IncidentLog` writes each incident as one JSON line
``{"time","kind","tool","count","limit","agent"}`` (``time`` ISO-8601 UTC, ``agent`` the
conversation key of DESIGN §4) to an append-only file. Writes happen in a background task that
hands each line to a worker thread (the event loop never touches the disk); the file is opened in
append mode, written and closed per line, so every line is flushed (and log rotation just works).
A failed write (missing directory, permissions, full disk) is logged once, without content, and
counted in ``write_errors``; it never reaches the request path.

Several replicas (``state.backend: redis://…``): the writer first claims ``(agent,
kind)`` through ``claim`` (:meth:`proxy.edge.shared_state.SharedState.claim`, one ``SET NX``) and
writes the line only when this replica won it, so the replicas' logs together hold one line per
conversation and kind (a retry sent to another replica included). The claim happens in the
writer task, off the request path; a failed claim writes the line (fail open).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson
import structlog

from proxy.core.actions import Action, Stop, Withhold
from proxy.core.clock import iso_utc
from proxy.guards.circuit_breaker import RULE

log = structlog.get_logger("loopguard")


@dataclass(frozen=True, slots=True)
class Incident:
    time: str
    kind: str
    tool: str
    count: int
    limit: int | None
    agent: str
    #: ``observe`` when the action was observed, not applied
    mode: str = "enforce"

    def as_dict(self) -> dict[str, Any]:
        """The JSON line's fields; ``mode: "observe"`` only for an observed incident."""
        out: dict[str, Any] = {
            "time": self.time,
            "kind": self.kind,
            "tool": self.tool,
            "count": self.count,
            "limit": self.limit,
            "agent": self.agent,
        }
        if self.mode != "enforce":
            out["mode"] = self.mode
        return out


#: The incident kind of a response-side :class:`~proxy.core.actions.Stop`.
STOP_KIND = "stop"


def incident_kind(a: Action) -> str | None:
    """``duplicate``/``waste``/``cap`` for a circuit-breaker denial, ``stop`` for a stop, else None."""
    if isinstance(a, Withhold) and a.rule == RULE:
        return a.reason
    if isinstance(a, Stop):
        return STOP_KIND
    return None


def first_fresh_denials(actions: Iterable[Action]) -> list[Withhold | Stop]:
    """The actions of one request that are incidents: for each kind (:func:`incident_kind`), the
    first action of that kind, kept only when it is fresh. Pure; in action (= call) order."""
    kinds: set[str] = set()
    out: list[Withhold | Stop] = []
    for a in actions:
        kind = incident_kind(a)
        if kind is None or kind in kinds:
            continue
        kinds.add(kind)
        if a.fresh and isinstance(a, Withhold | Stop):
            out.append(a)
    return out


class IncidentLog:
    """Decides which denials are new incidents and appends them to ``path`` (``""`` = no file).

    ``record`` is synchronous and cheap (called on the request path); file writes start after
    ``await start()`` and are drained by ``await close()``. Incidents recorded while not started
    are returned but not written.
    """

    __slots__ = ("_max_keys", "_queue", "_seen", "_task", "claim", "path", "write_errors")

    def __init__(
        self,
        path: str = "",
        max_keys: int = 10_000,
        claim: Callable[[str, str], Awaitable[bool]] | None = None,
    ) -> None:
        self.path = path
        self.write_errors = 0
        #: ``await claim(agent, kind)`` before a line is written: False = another replica wrote it
        self.claim = claim
        self._max_keys = max_keys
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._queue: asyncio.Queue[tuple[str, str, bytes]] | None = None
        self._task: asyncio.Task[None] | None = None

    def seen(self, agent: str, kind: str) -> bool:
        """Whether ``(agent, kind)`` was recorded by this process (and not yet dropped): then no
        action of that kind can be a new incident, so the caller need not look for earlier ones
        in the history (a scan of the whole body per stopped answer)."""
        return (agent, kind) in self._seen

    def record(self, actions: Iterable[Action], agent: str, now_ms: int) -> list[Incident]:
        """The new incidents among ``actions`` of one request of conversation ``agent``; each is
        queued for writing and remembered so a retry of the same request records nothing."""
        out: list[Incident] = []
        for w in first_fresh_denials(actions):
            kind = incident_kind(w) or ""
            key = (agent, kind)
            if key in self._seen:
                self._seen.move_to_end(key)
                continue
            self._seen[key] = None
            if len(self._seen) > self._max_keys:
                self._seen.popitem(last=False)
            mode = "observe" if w.observed else "enforce"
            incident = Incident(iso_utc(now_ms), kind, w.tool, w.count, w.limit, agent, mode)
            out.append(incident)
            if self._queue is not None:
                self._queue.put_nowait((agent, kind, orjson.dumps(incident.as_dict()) + b"\n"))
        return out

    async def start(self) -> None:
        if self.path and self._task is None:
            self._queue = asyncio.Queue()
            self._task = asyncio.create_task(self._run(self._queue), name="loopguard-incident-log")

    async def close(self) -> None:
        """Write what is queued, then stop the writer."""
        if self._task is None or self._queue is None:
            return
        await self._queue.join()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = self._queue = None

    async def _run(self, queue: asyncio.Queue[tuple[str, str, bytes]]) -> None:
        while True:
            agent, kind, line = await queue.get()
            try:
                if self.claim is not None and not await self.claim(agent, kind):
                    continue  # another replica has written this incident
                await asyncio.to_thread(self._append, line)
            except Exception as exc:  # a broken log must never affect forwarding
                self.write_errors += 1
                if self.write_errors == 1:
                    log.error(
                        "incident_log_error",
                        path=self.path,
                        error=type(exc).__name__,
                        detail=getattr(exc, "strerror", None),
                    )
            finally:
                queue.task_done()

    def _append(self, line: bytes) -> None:
        with open(self.path, "ab") as f:
            f.write(line)
