"""Wall-clock times as text (ms since the epoch in, ISO-8601 UTC out)."""

from __future__ import annotations

from datetime import datetime, timezone


def iso_utc(ms: int) -> str:
    """``ms`` since the epoch as ISO-8601 UTC with milliseconds: ``2025-01-02T03:04:05.678Z``."""
    dt = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")
