"""Command line: ``loopguard serve | demo | check-config | replay`` (also ``python -m proxy …``).

Precedence for ``serve``: flags, then environment (:data:`ENVIRONMENT`: ``LOOPGUARD_UPSTREAM``,
``LOOPGUARD_HOST``, ``LOOPGUARD_PORT``, ``LOOPGUARD_CONFIG``), then the config file, then
defaults (DESIGN §3). Exit codes: 0 ok, 1 ``replay`` found nothing to replay, 2 bad usage,
invalid configuration (the message names the key; ``check-config`` lists every error) or a
listen address that cannot be bound (one line, no traceback).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import importlib.metadata
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import yaml

import proxy
from proxy.config import Config, config_errors, load_config, to_plain
from proxy.config.env import with_overrides
from proxy.config.redact import redact_url
from proxy.edge.observe import LOG_FORMATS, configure_logging, default_log_format
from proxy.errors import ConfigError


def effective_config(args: argparse.Namespace, env: Mapping[str, str]) -> Config:
    """The config ``serve`` runs with: file (``--config`` or ``LOOPGUARD_CONFIG``), then env, then
    flags applied on top (:func:`proxy.config.env.with_overrides`). Raises :class:`ConfigError`
    naming the key (``--port``, ``LOOPGUARD_PORT`` …) for bad values."""
    cfg = load_config(args.config or env.get("LOOPGUARD_CONFIG") or None)
    return with_overrides(
        cfg,
        [
            ("LOOPGUARD_UPSTREAM", env.get("LOOPGUARD_UPSTREAM"), "upstream.url"),
            ("LOOPGUARD_HOST", env.get("LOOPGUARD_HOST"), "listen.host"),
            ("LOOPGUARD_PORT", env.get("LOOPGUARD_PORT"), "listen.port"),
            ("--upstream", args.upstream, "upstream.url"),
            ("--host", args.host, "listen.host"),
            ("--port", args.port, "listen.port"),
        ],
    )


#: Every environment variable the proxy reads (``serve --help`` lists them), with what it sets.
ENVIRONMENT: tuple[tuple[str, str], ...] = (
    ("LOOPGUARD_CONFIG", "the YAML config file (as --config)"),
    ("LOOPGUARD_UPSTREAM", "the upstream base URL (as --upstream; upstream.url)"),
    ("LOOPGUARD_HOST", "the listen address (as --host; listen.host)"),
    ("LOOPGUARD_PORT", "the listen port (as --port; listen.port)"),
    ("LOOPGUARD_EVENT_LOOP", "auto (uvloop when installed), asyncio or uvloop"),
)


def _environment_help() -> str:
    width = max(len(name) for name, _ in ENVIRONMENT)
    rows = "\n".join(f"  {name.ljust(width)}  {what}" for name, what in ENVIRONMENT)
    return (
        "environment variables (a flag beats its variable, a variable beats the config file):\n"
        f"{rows}\n\nexit status: 0 after a clean shutdown (SIGTERM, SIGINT); 2 for an invalid "
        "configuration or an address already in use."
    )


def _version() -> str:
    try:
        return importlib.metadata.version("loopguard")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return proxy.__version__


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="loopguard",
        description="Transparent proxy that breaks AI agents' tool-call loops.",
    )
    p.add_argument("--version", action="version", version=f"loopguard {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser(
        "serve",
        help="run the proxy in front of an OpenAI-compatible server",
        description="Run the proxy in front of an OpenAI-compatible server.",
        epilog=_environment_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("--upstream", help="upstream base URL (default http://127.0.0.1:8080/v1)")
    s.add_argument("--host", help="listen address (default 127.0.0.1)")
    s.add_argument("--port", help="listen port (default 4000)")
    s.add_argument("--config", help="YAML config file (see config/loopguard.yaml)")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    s.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=None,
        help="json: one JSON object per line (the default when stderr is not a terminal); "
        "console: aligned key=value lines for people, in colour on a terminal (the default there)",
    )
    d = sub.add_parser("demo", help="watch the proxy catch a looping agent (no model server needed)")
    d.add_argument(
        "--steps", type=int, default=20, help="tool calls the scripted model makes before giving up"
    )
    d.add_argument("--config", help="YAML config file to run the demo with")
    c = sub.add_parser(
        "check-config",
        help="validate a config file",
        description="Validate a config file: every error is listed (exit 2), else one line says "
        "what was checked and that the file is valid. With --print, the effective config is "
        "printed too (admin_token redacted, or shown as off when empty; user info and query "
        "values of upstream.url and state.backend redacted). With --schema, print the config "
        "file's JSON Schema instead (for editors: every key's type, default and description).",
    )
    c.add_argument("file", nargs="?")
    c.add_argument(
        "--print",
        action="store_true",
        dest="print_config",
        help="print the effective config (the file over the defaults) as YAML on stdout",
    )
    c.add_argument("--schema", action="store_true", help="print the JSON Schema of a config file")
    r = sub.add_parser(
        "replay",
        help="replay captured traffic or fixture conversations through the guards",
        description="Replay capture files (capture.path) or fixture conversations (JSON files "
        "with messages) through the same decision code as the proxy, and print every action at "
        "its call, per conversation, and the totals per rule.",
    )
    r.add_argument(
        "paths",
        nargs="+",
        metavar="FILE|DIR",
        help="capture JSONL files, fixture JSON files, or directories of them",
    )
    r.add_argument("--config", help="YAML config file to decide with (default: the built-in defaults)")
    r.add_argument(
        "--format", choices=("table", "json"), default="table", help="output format (default table)"
    )
    r.add_argument(
        "--no-progress", action="store_true", help="no progress bar (it is shown on a terminal only)"
    )
    return p


#: What ``check-config`` prints for a set ``admin_token``.
REDACTED = "<redacted>"
#: What it prints for ``admin_token: ""``, which turns the check off as null does.
TOKEN_OFF = "<empty = off>"


def shown_config(cfg: Config) -> dict[str, object]:
    """``cfg`` as plain data with no credential in it (``check-config``): ``admin_token`` as
    :data:`REDACTED` when set, :data:`TOKEN_OFF` when empty (null stays null); ``upstream.url``
    and ``state.backend`` with user info and query values redacted
    (:func:`proxy.config.redact.redact_url`, ``marked``)."""
    plain = to_plain(cfg)
    if plain.get("admin_token") is not None:
        plain["admin_token"] = REDACTED if plain["admin_token"] else TOKEN_OFF
    plain["upstream"]["url"] = redact_url(cfg.upstream.url, marked=True)
    plain["state"]["backend"] = redact_url(cfg.state.backend, marked=True)
    return plain


def valid_line(path: str, cfg: Config, hint: bool = True) -> str:
    """What ``check-config`` says of a valid file: what was checked, the guards it enables with
    their modes (as the ``listening`` line names them) and the recovery interventions it turns on
    (:meth:`proxy.config.RecoveryConfig.active`; none: not said)."""
    modes = ", ".join(f"{name} ({mode})" for name, mode in cfg.modes().items())
    recovery = cfg.recovery.active()
    return (
        f"loopguard: {path} is valid: every key is known and every value has its type and range "
        f"(templates, patterns and URLs included); unset keys take their defaults. Enabled: {modes}."
        + (f" Recovery: {', '.join(recovery)}." if recovery else "")
        + (" --print shows the effective config." if hint else "")
    )


def _check_config(path: str, print_config: bool = False) -> int:
    cfg, errors = config_errors(path)
    if errors or cfg is None:
        for e in errors:  # one line each, as serve says its one
            print(f"loopguard: invalid configuration: {e}", file=sys.stderr)
        return 2
    if print_config:  # stdout stays YAML alone (pipe it to a file); the verdict goes to stderr
        sys.stdout.write(yaml.safe_dump(shown_config(cfg), sort_keys=False))
        print(valid_line(path, cfg, hint=False), file=sys.stderr)
    else:
        print(valid_line(path, cfg))
    return 0


#: ``LOOPGUARD_EVENT_LOOP``: ``auto`` (uvloop when it is installed, else asyncio's own loop),
#: ``asyncio`` or ``uvloop`` (an error when it is not installed).
EVENT_LOOPS = ("auto", "asyncio", "uvloop")


def event_loop(env: Mapping[str, str]) -> tuple[Callable[[Any], Any], str]:
    """How ``serve`` runs its event loop, and the loop's name for the ``listening`` line:
    uvloop (``pip install 'loopguard[uvloop]'``; a faster loop and transports written in C) when
    it is importable, unless ``LOOPGUARD_EVENT_LOOP`` says ``asyncio``. Raises ConfigError for
    another value, or for ``uvloop`` when it is not installed."""
    wanted = env.get("LOOPGUARD_EVENT_LOOP", "auto") or "auto"
    if wanted not in EVENT_LOOPS:
        raise ConfigError("LOOPGUARD_EVENT_LOOP", f"must be one of {', '.join(EVENT_LOOPS)}, got {wanted!r}")
    if wanted != "asyncio":
        try:
            import uvloop
        except ImportError:
            if wanted == "uvloop":
                raise ConfigError(
                    "LOOPGUARD_EVENT_LOOP", "uvloop is not installed (pip install 'loopguard[uvloop]')"
                ) from None
        else:
            return uvloop.run, f"uvloop {uvloop.__version__}"
    return asyncio.run, "asyncio"


def _serve(
    cfg: Config, args: argparse.Namespace, source: str | None, reread: Callable[[], Config] | None = None
) -> int:
    from proxy.edge.serve import serve_forever

    configure_logging(args.log_level, args.log_format or default_log_format(), cache=True)
    run, loop_name = event_loop(os.environ)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            run(serve_forever(cfg, reread, source, loop_name))
    except OSError as e:
        if e.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            why = {errno.EADDRINUSE: "address already in use"}.get(e.errno, e.strerror or str(e))
            print(f"loopguard: cannot listen on {cfg.listen.host}:{cfg.listen.port}: {why}", file=sys.stderr)
            return 2
        raise
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "check-config":
        if args.schema == (args.file is not None):
            parser.error("check-config takes a config file, or --schema alone")
        if args.schema:
            from proxy.config.schema import schema_text

            sys.stdout.write(schema_text())
            return 0
        return _check_config(args.file, args.print_config)
    try:
        if args.command == "demo":
            from proxy.cli.demo import run_demo

            return asyncio.run(run_demo(load_config(args.config), steps=args.steps))
        if args.command == "replay":
            from proxy.cli.replay import main as replay_main

            return replay_main(args, load_config(args.config))
        cfg = effective_config(args, os.environ)
    except ConfigError as e:
        print(f"loopguard: invalid configuration: {e}", file=sys.stderr)
        return 2

    try:
        event_loop(os.environ)
    except ConfigError as e:
        print(f"loopguard: invalid configuration: {e}", file=sys.stderr)
        return 2

    def reread() -> Config:  # SIGHUP and POST /loop-guard/reload: the same file, env and flags
        return effective_config(args, os.environ)

    return _serve(cfg, args, args.config or os.environ.get("LOOPGUARD_CONFIG") or None, reread)


if __name__ == "__main__":
    raise SystemExit(main())
