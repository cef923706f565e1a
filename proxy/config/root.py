"""The whole config (DESIGN §8): :class:`Config`, its modes, and what a reload may change."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from proxy.config.fields import SECTION, Mode, Str
from proxy.config.guards import GuardsConfig
from proxy.config.recovery import RecoveryConfig
from proxy.config.response import ResponseConfig, StopConfig
from proxy.config.sections import (
    CaptureConfig,
    ConversationKeyConfig,
    ListenConfig,
    PrefixCacheConfig,
    ProgressConfig,
    ResponsesStoreConfig,
    StateConfig,
    UpstreamConfig,
)

#: The rules of each config section with a ``mode`` (``narration`` is part of ``turn_guard``).
MODE_SECTIONS: dict[str, tuple[str, ...]] = {
    "repeat_reminder": ("repeat_reminder",),
    "circuit_breaker": ("circuit_breaker",),
    "turn_guard": ("turn_guard", "narration"),
    "recurrence": ("recurrence",),
    "cycles": ("cycles",),
    "repeated_failure": ("repeated_failure",),
    "monologue": ("monologue",),
    "echo_loop": ("echo_loop",),
    "same_target": ("same_target",),
    "escalation": ("escalation",),
    "waiting": ("waiting",),
}
#: Response-side rules: ``stop.mode`` covers stops, ``response.mode`` runaway and degenerate cuts.
STOP_RULES = ("stop",)
RESPONSE_RULES = ("runaway", "degenerate_text", "repair_text_tool_calls")


@dataclass(frozen=True)
class Config:
    """loopguard's configuration: one YAML file, every key optional (DESIGN §8). Precedence for
    listen and upstream: command-line flags, then LOOPGUARD_* variables, then the file, then
    these defaults."""

    __pydantic_config__ = SECTION

    listen: ListenConfig = field(default_factory=ListenConfig)
    """The agent side: address, timeouts, connection limit."""
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    """The model server."""
    conversation_key: ConversationKeyConfig = field(default_factory=ConversationKeyConfig)
    """Which conversation a request belongs to."""
    guards: GuardsConfig = field(default_factory=GuardsConfig)
    """The loop rules on the request side."""
    stop: StopConfig = field(default_factory=StopConfig)
    """Ending the agent's turn."""
    response: ResponseConfig = field(default_factory=ResponseConfig)
    """Runaway answers, degenerate text, tool calls written as text."""
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    """Helping a looping model out: reminder wording, folded repeats, re-sampling, a fallback
    upstream (all off by default)."""
    progress: ProgressConfig = field(default_factory=ProgressConfig)
    """What is volatile, what may change state, what continues a turn."""
    responses_store: ResponsesStoreConfig = field(default_factory=ResponsesStoreConfig)
    """The Responses API's previous_response_id chains."""
    prefix_cache: PrefixCacheConfig = field(default_factory=PrefixCacheConfig)
    """What the previous request of each conversation established (a speed-up only)."""
    state: StateConfig = field(default_factory=StateConfig)
    """Where the state several replicas share lives."""
    admin_token: Str | None = None
    """Bearer token required on the /loop-guard routes (healthz too); null or "" = none: then
    GET /loop-guard and POST /loop-guard/reload answer loopback clients only. Restart only."""
    mode: Mode = "enforce"
    """observe: every section is observed (decided, logged, counted, nothing changed), whatever
    its own mode; enforce: each section's own mode decides."""
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    """Capture of guarded requests for loopguard replay (opt-in)."""

    def observed_rules(self) -> frozenset[str]:
        """The rule names (``Action.rule``) whose actions are observed, not applied: every rule
        when ``mode: observe``, else the rules of each section whose own ``mode`` is ``observe``
        (:data:`MODE_SECTIONS`; ``stop.mode`` for ``stop``, ``response.mode`` for ``runaway``
        and ``degenerate_text``; ``collapse`` with ``mode: observe`` only). An observed action is
        decided, logged, counted and recorded as an incident exactly as an applied one, but
        changes no byte."""
        every = self.mode == "observe"
        out: set[str] = set()
        for section, rules in MODE_SECTIONS.items():
            if every or getattr(self.guards, section).mode == "observe":
                out.update(rules)
        if every or self.stop.mode == "observe":
            out.update(STOP_RULES)
        if every or self.response.mode == "observe":
            out.update(RESPONSE_RULES)
        if every:  # recovery.collapse has no mode of its own: it folds only when enforcing
            out.add("collapse")
        return frozenset(out)

    def modes(self) -> dict[str, str]:
        """Each enabled section's effective mode (``guards.<name>``, ``stop``, ``response``), for
        the startup line and ``GET /loop-guard``."""
        observed = self.observed_rules()
        out = {
            name: "observe" if MODE_SECTIONS[name][0] in observed else "enforce"
            for name in MODE_SECTIONS
            if getattr(self.guards, name).enabled
        }
        out["stop"] = "observe" if "stop" in observed else "enforce"
        out["response"] = "observe" if "runaway" in observed else "enforce"
        return out


#: The keys a reload cannot change (SIGHUP or POST /loop-guard/reload, :mod:`proxy.edge.runtime`):
#: the listening socket, the upstream
#: connection pool and its timeouts (:mod:`proxy.edge.app` builds them at start), the stores
#: sized at start, the state backend's connection, the incident log's file. A reload whose file
#: changes one of them is rejected, naming the keys (restart to change them).
RESTART_ONLY = (
    # the one credential of the admin routes: a reload re-reads a file anyone who can write it
    # (or empty it) controls, and must never open or move the door it is asked through
    "admin_token",
    "listen",
    "upstream",
    "responses_store",
    # the prefix cache is sized at start (proxy.edge.app)
    "prefix_cache.max_bytes_mb",
    "state",
    "guards.circuit_breaker.incident_log",
    # the capture file is opened at start (capture.contents may change on a reload)
    "capture.path",
    "capture.max_bytes",
    "capture.backups",
)


def _leaves(plain: Any, path: str) -> dict[str, Any]:
    if isinstance(plain, dict):
        out: dict[str, Any] = {}
        for k, v in plain.items():
            out.update(_leaves(v, f"{path}.{k}" if path else k))
        return out
    return {path: plain}


def restart_keys(old: Config, new: Config) -> list[str]:
    """The dotted keys under :data:`RESTART_ONLY` whose values differ between ``old`` and ``new``
    (sorted; empty when a reload may apply ``new``)."""
    a, b = _leaves(to_plain(old), ""), _leaves(to_plain(new), "")
    return sorted(
        k
        for k in a.keys() | b.keys()
        if a.get(k) != b.get(k) and any(k == p or k.startswith(p + ".") for p in RESTART_ONLY)
    )


def to_plain(cfg: Any) -> Any:
    """The effective config as plain data (tuples as lists), for ``check-config`` and stats."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: to_plain(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, tuple | list):
        return [to_plain(v) for v in cfg]
    if isinstance(cfg, dict):
        return {k: to_plain(v) for k, v in cfg.items()}
    return cfg
