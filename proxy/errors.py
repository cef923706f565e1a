"""The whole exception tree of loopguard, in one place (shallow on purpose).

    LoopguardError            base class; never raised itself
    ├── ConfigError           invalid configuration; ``key`` names the dotted key path
    └── DialectError          a request body the dialect cannot read (the proxy then
                              forwards the original bytes unchanged)

Anything else raised inside a guard or the rewriter is a bug: the server catches it, logs it
(without message content), counts it as ``internal_errors`` and forwards the original bytes
(fail open, DESIGN §1.3).
"""

from __future__ import annotations


class LoopguardError(Exception):
    """Base class of every error loopguard raises on purpose."""


class ConfigError(LoopguardError):
    """Invalid configuration. ``key`` is the dotted path of the offending key, e.g.
    ``guards.repeat_reminder.thresholds``; ``str(err)`` starts with it."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}")


class DialectError(LoopguardError):
    """The body is JSON, but not a shape the dialect can read (e.g. ``messages`` is not a list)."""
