"""Harnesses for running four agent CLIs from npm headless against loopguard: pi
(``@mariozechner/pi-coding-agent``), Cline CLI (``cline``), Continue CLI (``@continuedev/cli``,
the ``cn`` command) and opencode (``opencode-ai``).

Install: the versions pinned in ``.ci/<agent>-version``, each into its own prefix in the npm
cache (``${LOOPGUARD_NPM_CACHE:-~/.cache/loopguard-npm}/<agent>``: a second ``npm install
--no-save`` into one prefix prunes what the first installed), with ``--ignore-scripts``, done by
``.ci/run``. Everything comes from the npm registry: pi and Continue are plain JavaScript; Cline's
and opencode's native binaries are optional dependencies (``@cline/cli-linux-x64``-style and
``opencode-linux-x64`` packages) whose postinstall only copies or caches them, so the binary is
run from the platform package (opencode) or found by the launcher (Cline). Each ``find_*`` takes
``$LOOPGUARD_<AGENT>`` (set by ``.ci/run``) or the binary in that cache.

Every run gets a fresh ``HOME`` (and config dir) in a temp dir, an environment holding only what
it needs, the prompt as an argument, no stdin, and is killed with its whole process group when it
ends (:func:`tests.helpers.agent_cli.run_cli`).

- pi 0.73.1: ``pi -p PROMPT --provider loopguard --model fake-model --no-session`` with
  ``PI_CODING_AGENT_DIR`` holding ``models.json`` (a ``loopguard`` provider whose ``api`` is
  ``openai-completions`` or ``openai-responses`` with ``baseUrl`` loopguard's ``…/v1``, or
  ``anthropic-messages`` with ``baseUrl`` loopguard's origin: the Anthropic SDK appends
  ``/v1/messages``) and ``PI_OFFLINE=1`` (no update check, no telemetry). Tools: ``read
  {path, offset?, limit?}``, ``bash {command, timeout?}``, ``edit {path, edits: [{oldText,
  newText}]}``, ``write {path, content}``. Always streams. It prints the final answer on stdout and
  exits 0; loopguard's stop is that answer.
- Cline 3.0.65: ``cline auth --provider openai|openai-native --apikey … --modelid fake-model
  --baseurl …/v1 --data-dir D`` seeds ``D/settings/providers.json``, then ``cline --data-dir D
  PROMPT`` runs one turn with every tool auto-approved and exits when the model answers text.
  ``openai`` is the Chat Completions provider (``openai-compatible``), ``openai-native`` the
  Responses one. ``--data-dir`` also keeps it off the shared hub daemon (without it Cline starts
  one on a fixed port that outlives the run). Tools: ``read_files {files: [{path, start_line?,
  end_line?}]}``, ``run_commands {commands: [str]}``, ``editor {path, old_text?, new_text,
  insert_line?}``, ``submit_and_exit {summary, verified}``. Not ``--yolo``: in yolo mode every
  text-only answer gets a user message ``[SYSTEM] This run is not complete until you call one of
  these terminal completion tools: submit_and_exit. …`` and the run goes on for ever (the
  wrapper also ignores SIGTERM: only killing the group ends it). Its own loop detector aborts the
  run at the 5th identical call.
- Continue CLI 1.5.47: ``cn -p --auto --config FILE PROMPT`` with ``CONTINUE_GLOBAL_DIR`` under
  the temp ``HOME`` and ``FILE`` a ``config.yaml`` naming one model (``provider: openai`` for Chat
  Completions or ``anthropic`` for Messages, ``apiBase`` loopguard's ``…/v1``). Tools: ``Read
  {filepath}``, ``Write``, ``List``, ``Bash {command}``, ``Edit {file_path, old_string,
  new_string}``, ``Fetch``, ``Checklist``, …; ``--auto`` allows them all. Prints the final answer.
- opencode 1.18.33: ``opencode run PROMPT`` in a work dir holding ``opencode.json`` (a
  ``loopguard`` provider on ``@ai-sdk/openai-compatible`` with ``baseURL`` loopguard's ``…/v1``,
  model ``loopguard/fake-model``), ``OPENCODE_DISABLE_MODELS_FETCH`` and
  ``OPENCODE_DISABLE_AUTOUPDATE`` set. Chat Completions only here. Tools: ``read {filePath}``,
  ``edit {filePath, oldString, newString}``, ``bash {command}``, ``write``, ``glob``, ``grep``,
  ``todowrite``, ``task``, ``webfetch``, ``skill``. A title request without tools comes first (a
  side request). Prints the final answer on stdout.

What loopguard writes into them (seen in what reached the fake): reminders are user messages
(chat), user ``message`` items (Responses) or user text blocks (Messages) starting
``[loopguard]``; a withheld result is the tool result's text replaced by the denial; the stop is a
text answer with no call, which pi, Cline (not ``--yolo``), Continue and opencode print as their
answer and exit 0 on. All send the whole history every time and always stream.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.helpers.agent_cli import CliRun, find_pinned, run_cli

ROOT = Path(__file__).resolve().parents[2]
NPM_CACHE = Path(os.environ.get("LOOPGUARD_NPM_CACHE") or Path.home() / ".cache" / "loopguard-npm")
FAKE_KEY = "sk-loopguard-fake"
MODEL = "fake-model"


def pinned(agent: str) -> str:
    """The version in ``.ci/<agent>-version``."""
    return (ROOT / ".ci" / f"{agent}-version").read_text().strip()


PI_VERSION = pinned("pi")
CLINE_VERSION = pinned("cline")
CONTINUE_VERSION = pinned("continue")
OPENCODE_VERSION = pinned("opencode")


def _hint(prefix: str, package: str, env_var: str) -> str:
    return (
        f"npm install --prefix {NPM_CACHE / prefix} --no-save --ignore-scripts {package}"
        f" (what .ci/run does), or set {env_var}"
    )


def base_env(home: Path) -> dict[str, str]:
    """What every run's environment holds."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "NO_PROXY": "*",
        "NO_COLOR": "1",
        "LANG": "C.UTF-8",
    }


# --- pi ------------------------------------------------------------------------------------------

#: pi's ``api`` for each wire format.
PI_APIS = {"chat": "openai-completions", "responses": "openai-responses", "messages": "anthropic-messages"}


def find_pi() -> str:
    return find_pinned(
        "LOOPGUARD_PI",
        NPM_CACHE / "pi" / "node_modules" / ".bin" / "pi",
        PI_VERSION,
        r"(\d+\.\d+\.\d+)",
        _hint("pi", f"@mariozechner/pi-coding-agent@{PI_VERSION}", "LOOPGUARD_PI"),
    )


async def run_pi(
    binary: str, base_url: str, wire: str, prompt: str, workdir: Path, home: Path, timeout: float = 120
) -> CliRun:
    """``pi -p`` in ``workdir`` against loopguard at ``base_url`` (``…/v1``) on ``wire``."""
    agent_dir = home / ".pi" / "agent"
    agent_dir.mkdir(parents=True, exist_ok=True)
    # the Anthropic SDK pi uses appends /v1/messages itself: its base is loopguard's origin
    base = base_url.removesuffix("/v1") if wire == "messages" else base_url
    provider = {"baseUrl": base, "api": PI_APIS[wire], "apiKey": FAKE_KEY, "models": [{"id": MODEL}]}
    (agent_dir / "models.json").write_text(json.dumps({"providers": {"loopguard": provider}}, indent=2))
    env = base_env(home) | {"PI_CODING_AGENT_DIR": str(agent_dir), "PI_OFFLINE": "1", "PI_TELEMETRY": "0"}
    argv = [binary, "-p", prompt, "--provider", "loopguard", "--model", MODEL, "--no-session"]
    return CliRun(*await run_cli(argv, workdir, env, timeout))


# --- Cline ---------------------------------------------------------------------------------------

#: Cline's provider id for each wire format.
CLINE_PROVIDERS = {"chat": "openai", "responses": "openai-native"}


def find_cline() -> str:
    return find_pinned(
        "LOOPGUARD_CLINE",
        NPM_CACHE / "cline" / "node_modules" / ".bin" / "cline",
        CLINE_VERSION,
        r"(\d+\.\d+\.\d+)",
        _hint("cline", f"cline@{CLINE_VERSION}", "LOOPGUARD_CLINE"),
    )


async def run_cline(
    binary: str,
    base_url: str,
    wire: str,
    prompt: str,
    workdir: Path,
    home: Path,
    timeout: float = 120,
    yolo: bool = False,
) -> CliRun:
    """``cline auth`` then ``cline --data-dir D PROMPT`` (``--yolo`` when asked) in ``workdir``
    against loopguard at ``base_url`` (``…/v1``) on ``wire``."""
    home.mkdir(parents=True, exist_ok=True)
    data = home / "cline-data"
    env = base_env(home) | {"CLINE_LOG_ENABLED": "0"}
    auth = [
        binary,
        "auth",
        "--provider",
        CLINE_PROVIDERS[wire],
        "--apikey",
        FAKE_KEY,
        "--modelid",
        MODEL,
        "--baseurl",
        base_url,
        "--data-dir",
        str(data),
    ]
    code, out, err, _ = await run_cli(auth, workdir, env, 60)
    assert code == 0, (out, err)
    argv = [binary, "--data-dir", str(data), *(["--yolo"] if yolo else []), prompt]
    return CliRun(*await run_cli(argv, workdir, env, timeout))


# --- Continue CLI --------------------------------------------------------------------------------

#: Continue's model ``provider`` for each wire format.
CONTINUE_PROVIDERS = {"chat": "openai", "messages": "anthropic"}


def find_continue() -> str:
    return find_pinned(
        "LOOPGUARD_CONTINUE",
        NPM_CACHE / "continue" / "node_modules" / ".bin" / "cn",
        CONTINUE_VERSION,
        r"(\d+\.\d+\.\d+)",
        _hint("continue", f"@continuedev/cli@{CONTINUE_VERSION}", "LOOPGUARD_CONTINUE"),
    )


def continue_config(base_url: str, wire: str) -> str:
    """The ``config.yaml`` naming loopguard as the one chat model."""
    return (
        "name: loopguard\nversion: 1.0.0\nschema: v1\nmodels:\n"
        f"  - name: fake\n    provider: {CONTINUE_PROVIDERS[wire]}\n    model: {MODEL}\n"
        f"    apiBase: {base_url}\n    apiKey: {FAKE_KEY}\n    roles: [chat]\n"
    )


async def run_continue(
    binary: str, base_url: str, wire: str, prompt: str, workdir: Path, home: Path, timeout: float = 120
) -> CliRun:
    """``cn -p --auto --config FILE PROMPT`` in ``workdir`` against loopguard at ``base_url``."""
    cdir = home / ".continue"
    cdir.mkdir(parents=True, exist_ok=True)
    config = cdir / "config.yaml"
    config.write_text(continue_config(base_url, wire))
    env = base_env(home) | {"CONTINUE_GLOBAL_DIR": str(cdir), "CONTINUE_CLI_ENABLE_TELEMETRY": "0"}
    argv = [binary, "-p", "--auto", "--config", str(config), prompt]
    return CliRun(*await run_cli(argv, workdir, env, timeout))


# --- opencode ------------------------------------------------------------------------------------


def find_opencode() -> str:
    return find_pinned(
        "LOOPGUARD_OPENCODE",
        NPM_CACHE / "opencode" / "node_modules" / "opencode-linux-x64" / "bin" / "opencode",
        OPENCODE_VERSION,
        r"(\d+\.\d+\.\d+)",
        _hint("opencode", f"opencode-ai@{OPENCODE_VERSION}", "LOOPGUARD_OPENCODE"),
    )


def opencode_config(base_url: str) -> dict[str, object]:
    """The ``opencode.json`` naming loopguard as the provider of the one model."""
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "loopguard",
        "options": {"baseURL": base_url, "apiKey": FAKE_KEY},
        "models": {MODEL: {"name": MODEL}},
    }
    return {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "provider": {"loopguard": provider},
        "model": f"loopguard/{MODEL}",
    }


async def run_opencode(
    binary: str, base_url: str, prompt: str, workdir: Path, home: Path, timeout: float = 120
) -> CliRun:
    """``opencode run PROMPT`` in ``workdir`` (which gets ``opencode.json``) against loopguard."""
    home.mkdir(parents=True, exist_ok=True)
    (workdir / "opencode.json").write_text(json.dumps(opencode_config(base_url), indent=2))
    env = base_env(home) | {"OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1"}
    return CliRun(*await run_cli([binary, "run", prompt], workdir, env, timeout))
