"""Overrides of ``listen`` and ``upstream`` from the environment and the command line
(DESIGN §3): flags beat ``LOOPGUARD_*`` variables, which beat the file, which beats the defaults.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from proxy.config.load import build
from proxy.config.root import Config
from proxy.config.sections import ListenConfig, UpstreamConfig
from proxy.errors import ConfigError

#: What each override sets: ``LOOPGUARD_UPSTREAM`` / ``--upstream`` the upstream URL, and so on.
TARGETS = {"upstream": "upstream.url", "host": "listen.host", "port": "listen.port"}


def with_overrides(cfg: Config, overrides: Sequence[tuple[str, str | None, str]]) -> Config:
    """``cfg`` with each override applied in order (a later one wins): ``(source, value, key)``
    where ``source`` names the variable or flag (``LOOPGUARD_PORT``, ``--port``), ``key`` is
    ``listen.host``, ``listen.port`` or ``upstream.url``, and a value of None or "" is no
    override. Raises :class:`ConfigError` naming the source, not a file key the user never
    wrote, when a value is invalid (``LOOPGUARD_PORT: must be an integer, got 'abc'``)."""
    listen = dataclasses.asdict(cfg.listen)
    upstream = dataclasses.asdict(cfg.upstream)
    origin: dict[str, str] = {}
    for source, value, key in overrides:
        if value is None or value == "":
            continue
        section, name = key.split(".")
        target = listen if section == "listen" else upstream
        origin[key] = source
        parsed: str | int = value
        if name == "port":
            try:
                parsed = int(value)
            except ValueError:
                raise ConfigError(source, f"must be an integer, got {value!r}") from None
        target[name] = parsed
    try:
        return dataclasses.replace(
            cfg,
            listen=build(ListenConfig, listen, "listen"),
            upstream=build(UpstreamConfig, upstream, "upstream"),
        )
    except ConfigError as e:
        raise ConfigError(origin.get(e.key, e.key), e.message) from None
