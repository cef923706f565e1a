"""Prometheus metrics for ``GET /loop-guard/metrics`` (DESIGN §7), via prometheus-client.

The counters are read from :class:`proxy.edge.observe.Stats` at scrape time (one source of truth, no
double bookkeeping); only the added-latency histogram is observed per request. Each app has its own
registry, so several proxies in one process (tests) never share series.

Series: ``loopguard_requests_total``, ``loopguard_guarded_requests_total``,
``loopguard_nothing_to_guard_total`` (guarded requests with no tool call, result or offered tool:
no guard ran, :mod:`proxy.request.plain`), ``loopguard_rewritten_requests_total``,
``loopguard_actions_total{rule,kind,mode}`` (fresh
actions; ``mode`` ``enforce`` for applied ones, ``observe`` for observed ones),
``loopguard_unguarded_requests_total{reason}`` (chat and Responses requests the guards could not
read: ``not_json``, ``nesting``, ``not_chat``, ``content_encoding``, and
``unknown_previous_response``: a ``previous_response_id`` loopguard does not hold,
:mod:`proxy.request.response_store`), ``loopguard_unguarded_responses_total{reason}`` (answers the
response side was to read and relayed unread: ``content_encoding``, ``content_type``,
``too_large``, ``internal_error``; :data:`proxy.edge.relay.UNREAD_REASONS`),
``loopguard_internal_errors_total`` (fail-open events),
``loopguard_upstream_errors_total``, ``loopguard_disconnects_total`` (agents that went away
before the whole answer), ``loopguard_state_backend_errors_total{op}`` (shared-state backend
calls that failed open, ``state.backend``: :mod:`proxy.edge.shared_state`),
``loopguard_capture_write_errors_total`` (capture lines that could not be written),
``loopguard_responses_repaired_total`` and ``loopguard_text_calls_repaired_total`` (answers, and
calls, written as text and repaired), ``loopguard_recovery_total{kind,outcome}`` (recovery
interventions: ``kind="collapse"``, ``outcome="folded"`` for requests whose upstream body had a
fold and ``outcome="prefix_break"`` for those where a fold began at a step the previous request
sent unfolded; ``kind`` ``resample`` or ``fallback``, ``outcome`` ``recovered``, ``repeated`` or
``error``: :mod:`proxy.edge.recovery`), ``loopguard_recovery_folded_steps_total`` (steps left out
of those bodies), ``loopguard_extra_upstream_calls_total`` (the upstream calls re-sample and
fallback made), and
``loopguard_added_latency_seconds`` (histogram: time between having the request body and sending it
upstream). With ``prefix_cache`` on (:mod:`proxy.request.prefix_cache`):
``loopguard_prefix_cache_hits_total`` (requests that resumed their conversation's kept history),
``loopguard_prefix_cache_misses_total`` (requests read in full), ``loopguard_prefix_cache_evictions_total``
(conversations dropped for the budget), ``loopguard_prefix_cache_fast_hits_total`` (hits found
before the body was decoded), ``loopguard_prefix_cache_edit_hits_total`` (requests that
reused the edits their previous request made before its last step), and the gauges
``loopguard_prefix_cache_bytes`` and ``loopguard_prefix_cache_entries`` (kept now).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from proxy.edge.observe import Stats
from proxy.request.prefix_cache import PrefixCache

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_COUNTERS = (
    ("requests", "Requests received (any path)."),
    ("guarded_requests", "Chat-completion requests read by the guards."),
    ("nothing_to_guard", "Guarded requests with no tool call, result or offered tool (no guard run)."),
    ("rewritten_requests", "Requests whose body the guards changed."),
    ("internal_errors", "Internal errors that were failed open (original bytes forwarded)."),
    ("upstream_errors", "Upstream unreachable or dropped mid-response."),
    ("disconnects", "Agents that went away before the whole answer (the upstream request was closed)."),
    ("responses_repaired", "Answers whose tool calls written as text were repaired into structured calls."),
    ("text_calls_repaired", "Tool calls written as text that were repaired into structured calls."),
    ("capture_write_errors", "Capture lines (capture.path) that could not be written."),
    (
        "extra_upstream_calls",
        "Extra upstream calls made by re-sample and fallback (recovery.*).",
    ),
)


class _StatsCollector(Collector):
    def __init__(self, stats: Stats, prefixes: PrefixCache | None) -> None:
        self._stats = stats
        self._prefixes = prefixes

    def collect(self) -> Iterator[Metric]:
        for name, doc in _COUNTERS:
            yield CounterMetricFamily(f"loopguard_{name}", doc, value=getattr(self._stats, name))
        actions = CounterMetricFamily(
            "loopguard_actions",
            "Fresh actions by rule, kind and mode (enforce: applied; observe: decided, not applied).",
            labels=["rule", "kind", "mode"],
        )
        for (rule, kind, mode), n in sorted(self._stats.per_action.items()):
            actions.add_metric([rule, kind, mode], n)
        yield actions
        unguarded = CounterMetricFamily(
            "loopguard_unguarded_requests",
            "Chat and Responses requests forwarded without guards, by reason.",
            labels=["reason"],
        )
        for reason, n in sorted(self._stats.unguarded.items()):
            unguarded.add_metric([reason], n)
        yield unguarded
        unread = CounterMetricFamily(
            "loopguard_unguarded_responses",
            "Answers the response side was to read and relayed unread, by reason.",
            labels=["reason"],
        )
        for reason, n in sorted(self._stats.unguarded_responses.items()):
            unread.add_metric([reason], n)
        yield unread
        backend = CounterMetricFamily(
            "loopguard_state_backend_errors",
            "Shared-state backend (Redis) operations that failed open, by operation.",
            labels=["op"],
        )
        for op, n in sorted(self._stats.backend_errors.items()):
            backend.add_metric([op], n)
        yield backend
        recovery = CounterMetricFamily(
            "loopguard_recovery",
            "Recovery interventions by kind and outcome (collapse: folded, prefix_break; resample and"
            " fallback: recovered, repeated, error).",
            labels=["kind", "outcome"],
        )
        recovery.add_metric(["collapse", "folded"], self._stats.collapsed_requests)
        recovery.add_metric(["collapse", "prefix_break"], self._stats.prefix_breaks)
        # every series from the start, at 0 until it happens (an alert on a missing series misfires)
        asked = {(k, o): 0 for k in ("resample", "fallback") for o in ("recovered", "repeated", "error")}
        for (kind, outcome), n in sorted({**asked, **self._stats.recovery}.items()):
            recovery.add_metric([kind, outcome], n)
        yield recovery
        yield CounterMetricFamily(
            "loopguard_recovery_folded_steps",
            "Steps left out of the upstream's bodies by recovery.collapse.",
            value=self._stats.folded_steps,
        )
        if self._prefixes is not None:
            p = self._prefixes.stats
            yield CounterMetricFamily(
                "loopguard_prefix_cache_hits",
                "Requests that resumed their conversation's kept history.",
                value=p.hits,
            )
            yield CounterMetricFamily(
                "loopguard_prefix_cache_misses", "Requests whose history was read in full.", value=p.misses
            )
            yield CounterMetricFamily(
                "loopguard_prefix_cache_evictions",
                "Conversations dropped for the byte budget.",
                value=p.evictions,
            )
            yield CounterMetricFamily(
                "loopguard_prefix_cache_fast_hits",
                "Hits found before the body was decoded (bodies of 64 KiB or more).",
                value=p.fast_hits,
            )
            yield CounterMetricFamily(
                "loopguard_prefix_cache_edit_hits",
                "Requests that reused the edits their previous request made before its last step.",
                value=p.edit_hits,
            )
            yield GaugeMetricFamily(
                "loopguard_prefix_cache_bytes", "Bytes kept (the budget's measure).", value=p.bytes
            )
            yield GaugeMetricFamily("loopguard_prefix_cache_entries", "Conversations kept.", value=p.entries)


class Metrics:
    """One app's registry: ``observe_added(seconds)`` per request, ``render()`` for a scrape.
    ``prefixes``: the app's prefix cache, for its series (None: off, no series)."""

    __slots__ = ("_added", "registry")

    def __init__(self, stats: Stats, prefixes: PrefixCache | None = None) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_StatsCollector(stats, prefixes))
        self._added = Histogram(
            "loopguard_added_latency_seconds",
            "Time loopguard spent between having the request body and sending it upstream.",
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=self.registry,
        )

    def observe_added(self, seconds: float) -> None:
        self._added.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
