"""Command line: ``loopguard serve | demo | check-config`` (also ``python -m proxy …``).

Precedence for ``serve``: flags, then environment (``LOOPGUARD_UPSTREAM``, ``LOOPGUARD_HOST``,
``LOOPGUARD_PORT``, ``LOOPGUARD_CONFIG``), then the config file, then defaults (DESIGN §3).
Exit codes: 0 ok, 2 bad usage or invalid configuration (the message names the key).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence

import yaml

from proxy.errors import ConfigError
from proxy.ops.config import Config, ListenConfig, UpstreamConfig, build, load_config, to_plain


def effective_config(args: argparse.Namespace, env: Mapping[str, str]) -> Config:
    """The config ``serve`` runs with: file (``--config`` or ``LOOPGUARD_CONFIG``), then env, then
    flags applied on top. Raises :class:`ConfigError` naming the key (``--port``,
    ``LOOPGUARD_PORT`` …) for bad values."""
    cfg = load_config(args.config or env.get("LOOPGUARD_CONFIG") or None)
    listen = dataclasses.asdict(cfg.listen)
    upstream = dataclasses.asdict(cfg.upstream)
    sources = [
        ("LOOPGUARD_UPSTREAM", env.get("LOOPGUARD_UPSTREAM"), upstream, "url"),
        ("LOOPGUARD_HOST", env.get("LOOPGUARD_HOST"), listen, "host"),
        ("LOOPGUARD_PORT", env.get("LOOPGUARD_PORT"), listen, "port"),
        ("--upstream", args.upstream, upstream, "url"),
        ("--host", args.host, listen, "host"),
        ("--port", args.port, listen, "port"),
    ]
    origin: dict[str, str] = {}
    for name, value, target, key in sources:
        if value is None or value == "":
            continue
        origin[f"{'listen' if target is listen else 'upstream'}.{key}"] = name
        if key == "port":
            try:
                value = int(value)
            except ValueError:
                raise ConfigError(name, f"must be an integer, got {value!r}") from None
        target[key] = value
    try:
        return dataclasses.replace(
            cfg,
            listen=build(ListenConfig, listen, "listen"),
            upstream=build(UpstreamConfig, upstream, "upstream"),
        )
    except ConfigError as e:
        # Name the flag or variable the bad value came from, not a file key the user never wrote.
        raise ConfigError(origin.get(e.key, e.key), e.message) from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="loopguard",
        description="Transparent proxy that breaks AI agents' tool-call loops.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the proxy in front of an OpenAI-compatible server")
    s.add_argument("--upstream", help="upstream base URL (default http://127.0.0.1:8080/v1)")
    s.add_argument("--host", help="listen address (default 127.0.0.1)")
    s.add_argument("--port", help="listen port (default 4000)")
    s.add_argument("--config", help="YAML config file (see config/loopguard.yaml)")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    d = sub.add_parser("demo", help="watch the proxy catch a looping agent (no model server needed)")
    d.add_argument(
        "--steps", type=int, default=20, help="tool calls the scripted model makes before giving up"
    )
    d.add_argument("--config", help="YAML config file to run the demo with")
    c = sub.add_parser("check-config", help="validate a config file and print the effective config")
    c.add_argument("file")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "check-config":
            cfg = load_config(args.file)
            sys.stdout.write(yaml.safe_dump(to_plain(cfg), sort_keys=False))
            return 0
        if args.command == "demo":
            from proxy.ops.demo import run_demo

            return asyncio.run(run_demo(load_config(args.config), steps=args.steps))
        cfg = effective_config(args, os.environ)
    except ConfigError as e:
        print(f"loopguard: invalid configuration: {e}", file=sys.stderr)
        return 2

    from proxy.edge.server import serve_forever
    from proxy.ops.observe import configure_logging

    configure_logging(args.log_level)

    def reread() -> Config:  # SIGHUP and POST /loop-guard/reload: the same file, env and flags
        return effective_config(args, os.environ)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_forever(cfg, reread))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
