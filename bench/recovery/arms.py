"""The bench's arms: one table, arm name -> loopguard config overrides.

``None`` is the paired baseline: the agent talks straight to the model (through the recording
relay only). Any other value is a nested mapping merged over the shipped defaults
(``config/loopguard.yaml``); ``{}`` is the defaults themselves. The string :data:`FALLBACK_URL`
anywhere in a value is replaced with the second llama server's relay URL (started only when an
arm uses it). Add, rename or drop arms here; ``--arms`` picks among them.
"""

from __future__ import annotations

from typing import Any

#: Placeholder for the second model server's URL in an arm's overrides.
FALLBACK_URL = "{fallback_url}"

#: Sampling settings of the second server (the same GGUF: no other model weights exist here), set
#: on every request it gets over the request's own.
FALLBACK_SAMPLING: dict[str, float] = {"temperature": 1.0, "repeat_penalty": 1.3, "presence_penalty": 0.6}

ARMS: dict[str, dict[str, Any] | None] = {
    "direct": None,
    "default": {},
    "tool_suffix": {"guards": {"repeat_reminder": {"inject_as": "tool_suffix"}}},
    "plain": {"recovery": {"reminders": "plain"}},
    "redirect": {"recovery": {"reminders": "redirect"}},
    "collapse": {"recovery": {"collapse": {"enabled": True}}},
    "resample": {
        "recovery": {
            "resample": {
                "attempts": 2,
                "params": {"temperature": 1.0, "repeat_penalty": 1.3, "presence_penalty": 0.6},
            }
        }
    },
    "fallback": {"recovery": {"fallback": {"url": FALLBACK_URL}}},
    # what the model reads and how it samples, together: no quoted call, no repetition in the
    # context, a second draw before a withheld result is ignored
    "combined": {
        "recovery": {
            "reminders": "plain",
            "collapse": {"enabled": True},
            "resample": {
                "attempts": 2,
                "params": {"temperature": 1.0, "repeat_penalty": 1.3, "presence_penalty": 0.6},
            },
        }
    },
}


def uses_fallback(overrides: Any) -> bool:
    """True if :data:`FALLBACK_URL` occurs anywhere in ``overrides``."""
    if isinstance(overrides, dict):
        return any(uses_fallback(v) for v in overrides.values())
    return overrides == FALLBACK_URL


def resolve(overrides: Any, fallback_url: str) -> Any:
    """``overrides`` with :data:`FALLBACK_URL` replaced by ``fallback_url``."""
    if isinstance(overrides, dict):
        return {k: resolve(v, fallback_url) for k, v in overrides.items()}
    return fallback_url if overrides == FALLBACK_URL else overrides
