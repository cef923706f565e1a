"""Stats for ``GET /loop-guard`` and the one-line-per-request structured log (DESIGN §7).

Never records message content or credentials: only counts, rule names, tool names, timings.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
import structlog

from proxy.core.actions import Action, Cut, Fold, Recover, Repair, Stop, Withhold
from proxy.core.collapse import breaks_prefix
from proxy.edge.incidents import Incident

#: How many incidents ``GET /loop-guard`` shows (the newest ones).
RECENT_INCIDENTS = 50


class StderrLogger:
    """structlog logger writing one line per event to the *current* ``sys.stderr``.

    Looked up at each write (so a replaced stderr, e.g. under test capture, is followed) and never
    raising: a closed or full stderr must not turn a forwarded request into an error.
    """

    __slots__ = ()

    def msg(self, message: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(message + "\n")
            sys.stderr.flush()

    log = debug = info = warning = warn = error = critical = exception = fatal = msg


def _dumps(obj: Any, **_: Any) -> str:
    return orjson.dumps(obj, default=str).decode()


class _WithoutContent(logging.Filter):
    """aiohttp's own server log, told without what the agent sent: its
    records (a malformed request line or header, a bad chunked body, an error in a handler) carry
    tracebacks that quote the raw bytes — an ``Authorization`` header, message content. Each
    record becomes one structlog line with the error's type and HTTP status only (``bad_request``
    for a request aiohttp refused, 400 or 413; ``server_error`` otherwise); the record itself is
    dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        status = getattr(exc, "code", None) or getattr(exc, "status", None)
        event = "bad_request" if isinstance(status, int) and 400 <= status < 500 else "server_error"
        with contextlib.suppress(Exception):
            structlog.get_logger("loopguard").warning(
                event, error=type(exc).__name__ if exc is not None else None, status=status
            )
        return False


#: The logger handed to aiohttp's server (``proxy.edge.serve.start``): nothing it is given leaves
#: except through :class:`_WithoutContent`.
SERVER_LOG = logging.getLogger("loopguard.aiohttp")
SERVER_LOG.propagate = False
SERVER_LOG.addFilter(_WithoutContent())


#: ``--log-format`` choices.
LOG_FORMATS = ("json", "console")


def default_log_format() -> str:
    """``console`` when stderr is a terminal, else ``json`` (log collectors read JSON lines)."""
    try:
        return "console" if sys.stderr.isatty() else "json"
    except (AttributeError, ValueError):
        return "json"


def configure_logging(level: str = "info", fmt: str = "json", cache: bool = False) -> None:
    """One event per line on stderr, ISO-8601 UTC timestamps (``level``: debug, info, warning or
    error). ``fmt``: ``json`` (JSON lines) or ``console`` (structlog's ConsoleRenderer: aligned
    ``time [level] event key=value``, in colour when stderr is a terminal; for people).
    ``cache``: each module's logger is bound once, at its first event, instead of at every event
    (structlog's ``cache_logger_on_first_use``; for a server process, whose logging is
    configured once; tests that reconfigure logging keep the default).
    Raises ValueError for another ``fmt``."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    renderer: Any
    if fmt == "console":
        try:
            colors = sys.stderr.isatty()
        except (AttributeError, ValueError):
            colors = False
        renderer = structlog.dev.ConsoleRenderer(colors=colors, sort_keys=False)
    else:
        renderer = structlog.processors.JSONRenderer(serializer=_dumps)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=lambda *args: StderrLogger(),
        cache_logger_on_first_use=cache,
    )


def action_summary(a: Action) -> dict[str, Any]:
    """The loggable evidence of an action: rule, kind, tool, count, limit, the ``reason`` when it
    has one (withhold, stop, cut; a repair's markup form), a stop's named figures
    (:attr:`~proxy.core.actions.Stop.evidence`), ``applied: false`` for a cut only
    reported, and ``mode: "observe"`` for an observed action (no texts)."""
    out = {"rule": a.rule, "kind": a.kind, "tool": a.tool, "count": a.count, "limit": a.limit}
    if isinstance(a, Withhold | Stop | Cut | Repair) and a.reason:
        out["reason"] = a.reason
    if isinstance(a, Recover):  # its evidence: the extra upstream calls made and what came of them
        out.update(attempts=a.count, outcome=a.reason)
    if isinstance(a, Stop):
        out.update(a.evidence)  # what count and limit count, each figure named
    if isinstance(a, Fold):  # the steps it folded (first, last) and the positions left out
        out["steps"] = list(a.steps)
        out["folded_steps"] = a.count - 1
    if isinstance(a, Cut) and not a.applied:
        out["applied"] = False
    if a.observed:
        out["mode"] = "observe"
    return out


#: The action kinds ``observed`` counts in :meth:`Stats.snapshot`, in order.
OBSERVED_KINDS = ("remind", "withhold", "stop", "cut", "repair", "fold")


@dataclass
class Stats:
    """Process-wide counters (reset on restart). Only *fresh* actions are counted.

    ``withhold_kinds``: fresh withholds per ``reason`` (``duplicate``, ``cap``). ``incidents``: the
    newest :data:`RECENT_INCIDENTS` incident records (:mod:`proxy.edge.incidents`), oldest first.

    Observe mode: ``per_rule`` counts every fresh action, applied or observed (what
    enforce mode would count), ``observed_per_rule`` the observed ones (flat mappings, so that
    replicas' counters add up key by key); ``per_action`` is keyed ``(rule, kind, mode)``;
    ``reminders_injected``, ``results_withheld``, ``stops``, ``responses_cut`` and
    ``withhold_kinds`` count applied actions only, and ``observed`` the observed ones per kind
    (``remind``, ``withhold``, ``stop``, ``cut``)."""

    started: float = field(default_factory=time.monotonic)
    requests: int = 0
    guarded_requests: int = 0
    rewritten_requests: int = 0
    #: guarded requests with no tool call, result or offered tool in their bytes, forwarded
    #: without a guard run (:mod:`proxy.request.plain`; also counted in ``guarded_requests``)
    nothing_to_guard: int = 0
    reminders_injected: int = 0
    results_withheld: int = 0
    #: response side: turns ended (Stop), responses cut (runaway / degenerate text, applied ones)
    stops: int = 0
    responses_cut: int = 0
    #: answers whose calls written as text were repaired, and those calls
    responses_repaired: int = 0
    text_calls_repaired: int = 0
    internal_errors: int = 0
    upstream_errors: int = 0
    #: requests the agent went away from before it had the whole answer (the upstream request
    #: was closed then, so the model server can stop generating)
    disconnects: int = 0
    per_rule: Counter[str] = field(default_factory=Counter)
    #: fresh actions per (rule, kind, mode), for the Prometheus ``loopguard_actions_total`` series
    per_action: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    #: fresh observed actions per kind
    observed: Counter[str] = field(default_factory=Counter)
    withhold_kinds: Counter[str] = field(default_factory=Counter)
    #: chat and Responses requests forwarded without guards, per reason (``RequestDecision.unguarded``)
    unguarded: Counter[str] = field(default_factory=Counter)
    #: answers the response side was to read and relayed unread, per reason
    #: (:data:`proxy.edge.relay.UNREAD_REASONS`)
    unguarded_responses: Counter[str] = field(default_factory=Counter)
    incidents: deque[Incident] = field(default_factory=lambda: deque(maxlen=RECENT_INCIDENTS))
    #: shared-state backend operations that failed open, per operation (``state.backend``,
    #: :mod:`proxy.edge.shared_state`: ``fetch``, ``save_state``, ``save_entry``, ``claim_incident``, …)
    backend_errors: Counter[str] = field(default_factory=Counter)
    #: capture lines that could not be written (``capture.path``: disk full, file removed, …)
    capture_write_errors: int = 0
    #: re-sample and fallback (:mod:`proxy.edge.recovery`): requests that asked again, those whose
    #: answer was then one that did not repeat, and every extra upstream call made
    resample_requests: int = 0
    resample_recovered: int = 0
    fallback_requests: int = 0
    fallback_recovered: int = 0
    extra_upstream_calls: int = 0
    #: interventions per (kind, outcome), for ``loopguard_recovery_total``
    recovery: Counter[tuple[str, str]] = field(default_factory=Counter)

    def record_recovery(self, kind: str, outcome: str, calls: int) -> None:
        """One intervention (``kind`` ``resample`` or ``fallback``) that made ``calls`` extra
        upstream calls and ended with ``outcome`` (``recovered``, ``repeated``, ``error``)."""
        self.recovery[(kind, outcome)] += 1
        self.extra_upstream_calls += calls
        if kind == "resample":
            self.resample_requests += 1
            self.resample_recovered += outcome == "recovered"
        elif kind == "fallback":
            self.fallback_requests += 1
            self.fallback_recovered += outcome == "recovered"

    #: ``recovery.collapse`` (:mod:`proxy.core.collapse`), over every fold of a request, fresh or
    #: not: requests whose upstream body had a fold, steps left out of them, and requests where
    #: a fold began at a step the conversation's previous request sent unfolded (the upstream's
    #: prefix cache broke there: :func:`proxy.core.collapse.breaks_prefix`)
    collapsed_requests: int = 0
    folded_steps: int = 0
    prefix_breaks: int = 0

    def record_actions(self, actions: Iterable[Action]) -> None:
        withheld: set[tuple[int, int | None]] = set()  # a result two guards withhold is one result withheld
        folded = broke = False
        for a in actions:
            if isinstance(a, Fold) and not a.observed:
                folded = True
                self.folded_steps += a.count - 1
                broke = broke or breaks_prefix(a)
            if not a.fresh:
                continue
            self.per_rule[a.rule] += 1
            self.per_action[(a.rule, a.kind, "observe" if a.observed else "enforce")] += 1
            if a.observed:
                self.observed[a.kind] += 1
            elif a.kind == "remind":
                self.reminders_injected += 1
            elif a.kind == "withhold":
                position = (a.position, a.part) if isinstance(a, Withhold) else (-1, None)
                if position not in withheld:
                    withheld.add(position)
                    self.results_withheld += 1
                if isinstance(a, Withhold) and a.reason:
                    self.withhold_kinds[a.reason] += 1
            elif a.kind == "stop":
                self.stops += 1
            elif isinstance(a, Cut) and a.applied:
                self.responses_cut += 1
            elif isinstance(a, Repair):
                self.responses_repaired += 1
                self.text_calls_repaired += a.count
        self.collapsed_requests += folded
        self.prefix_breaks += broke

    def record_incidents(self, incidents: Iterable[Incident]) -> None:
        self.incidents.extend(incidents)

    def _per_rule(self, mode: str) -> dict[str, int]:
        out: Counter[str] = Counter()
        for (rule, _, m), n in self.per_action.items():
            if m == mode:
                out[rule] += n
        return dict(sorted(out.items()))

    def snapshot(self) -> dict[str, Any]:
        return {
            "uptime_s": round(time.monotonic() - self.started, 3),
            "requests": self.requests,
            "guarded_requests": self.guarded_requests,
            "nothing_to_guard": self.nothing_to_guard,
            "rewritten_requests": self.rewritten_requests,
            "reminders_injected": self.reminders_injected,
            "results_withheld": self.results_withheld,
            "stops": self.stops,
            "responses_cut": self.responses_cut,
            "responses_repaired": self.responses_repaired,
            "text_calls_repaired": self.text_calls_repaired,
            "internal_errors": self.internal_errors,
            "upstream_errors": self.upstream_errors,
            "disconnects": self.disconnects,
            "capture_write_errors": self.capture_write_errors,
            "per_rule": dict(sorted(self.per_rule.items())),
            "observed_per_rule": self._per_rule("observe"),
            "observed": {k: self.observed[k] for k in OBSERVED_KINDS},
            "withhold_kinds": dict(sorted(self.withhold_kinds.items())),
            "unguarded": dict(sorted(self.unguarded.items())),
            "unguarded_responses": dict(sorted(self.unguarded_responses.items())),
            "state_backend_errors": dict(sorted(self.backend_errors.items())),
            "incidents": [i.as_dict() for i in self.incidents],
            "recovery": {
                "resample_requests": self.resample_requests,
                "resample_recovered": self.resample_recovered,
                "fallback_requests": self.fallback_requests,
                "fallback_recovered": self.fallback_recovered,
                "extra_upstream_calls": self.extra_upstream_calls,
                "collapsed_requests": self.collapsed_requests,
                "folded_steps": self.folded_steps,
                "prefix_breaks": self.prefix_breaks,
            },
        }
