"""Configuration: one YAML file parsed once into frozen dataclasses (DESIGN §8).

Every key is optional; unknown keys, wrong types and out-of-range values raise
:class:`proxy.errors.ConfigError` naming the dotted key path (``guards.repeat_reminder.thresholds``).
The defaults here are the ones documented in ``config/loopguard.yaml``. Precedence for the listen
address and upstream: command-line flags, then ``LOOPGUARD_*`` environment variables, then the file,
then these defaults (:mod:`proxy.config.env`).

The package imports nothing of loopguard but :mod:`proxy.errors` (it is the bottom layer):

- :mod:`~proxy.config.defaults`: the default lists (tool names, programs, patterns);
- :mod:`~proxy.config.fields`: value types and declared ranges;
- :mod:`~proxy.config.checks`: the value checks shared by sections;
- :mod:`~proxy.config.sections`, :mod:`~proxy.config.guards`, :mod:`~proxy.config.response`:
  the sections; :mod:`~proxy.config.root`: :class:`Config`, its modes, the restart-only keys;
- :mod:`~proxy.config.load`: reading a file (pydantic for the types, then the checks);
- :mod:`~proxy.config.env`: flag and environment overrides;
- :mod:`~proxy.config.schema`: the JSON Schema (``check-config --schema``);
- :mod:`~proxy.config.redact`: URLs without credentials.
"""

from __future__ import annotations

from proxy.config.checks import SECRET_KEYS, URL_KEYS
from proxy.config.defaults import (
    DEFAULT_CONTINUATION_PATTERNS,
    DEFAULT_EXEMPT,
    DEFAULT_FAILURE_PATTERNS,
    DEFAULT_IGNORE_ARGS,
    DEFAULT_MASK_PATTERNS,
    DEFAULT_READ_ONLY_COMMANDS,
    DEFAULT_READ_ONLY_TOOLS,
    DEFAULT_REJECTION_PATTERNS,
)
from proxy.config.fields import Mode
from proxy.config.guards import (
    DENY_PLACEHOLDERS,
    CircuitBreakerConfig,
    CyclesConfig,
    EchoLoopConfig,
    EscalationConfig,
    GuardsConfig,
    MonologueConfig,
    RecurrenceConfig,
    RepeatedFailureConfig,
    RepeatReminderConfig,
    SameTargetConfig,
    TurnGuardConfig,
    WaitingConfig,
)
from proxy.config.load import build, config_errors, load_config
from proxy.config.recovery import CollapseConfig, FallbackConfig, RecoveryConfig, ResampleConfig
from proxy.config.response import STOP_PLACEHOLDERS, DegenerateTextConfig, ResponseConfig, StopConfig
from proxy.config.root import (
    MODE_SECTIONS,
    RESPONSE_RULES,
    RESTART_ONLY,
    STOP_RULES,
    Config,
    restart_keys,
    to_plain,
)
from proxy.config.sections import (
    REDIS_SCHEMES,
    CaptureConfig,
    ConversationKeyConfig,
    ListenConfig,
    PrefixCacheConfig,
    ProgressConfig,
    ResponsesStoreConfig,
    StateConfig,
    UpstreamConfig,
)
from proxy.errors import ConfigError

__all__ = [
    "DEFAULT_CONTINUATION_PATTERNS",
    "DEFAULT_EXEMPT",
    "DEFAULT_FAILURE_PATTERNS",
    "DEFAULT_IGNORE_ARGS",
    "DEFAULT_MASK_PATTERNS",
    "DEFAULT_READ_ONLY_COMMANDS",
    "DEFAULT_READ_ONLY_TOOLS",
    "DEFAULT_REJECTION_PATTERNS",
    "DENY_PLACEHOLDERS",
    "MODE_SECTIONS",
    "REDIS_SCHEMES",
    "RESPONSE_RULES",
    "RESTART_ONLY",
    "SECRET_KEYS",
    "STOP_PLACEHOLDERS",
    "STOP_RULES",
    "URL_KEYS",
    "CaptureConfig",
    "CircuitBreakerConfig",
    "CollapseConfig",
    "Config",
    "ConfigError",
    "ConversationKeyConfig",
    "CyclesConfig",
    "DegenerateTextConfig",
    "EchoLoopConfig",
    "EscalationConfig",
    "FallbackConfig",
    "GuardsConfig",
    "ListenConfig",
    "Mode",
    "MonologueConfig",
    "PrefixCacheConfig",
    "ProgressConfig",
    "RecoveryConfig",
    "RecurrenceConfig",
    "RepeatReminderConfig",
    "RepeatedFailureConfig",
    "ResampleConfig",
    "ResponseConfig",
    "ResponsesStoreConfig",
    "SameTargetConfig",
    "StateConfig",
    "StopConfig",
    "TurnGuardConfig",
    "UpstreamConfig",
    "WaitingConfig",
    "build",
    "config_errors",
    "load_config",
    "restart_keys",
    "to_plain",
]
