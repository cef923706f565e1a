"""Helpers for running a real llama-cpp-python server in the test-suite: the bench's launcher
(:mod:`bench.recovery.llama`), shared so the tests and the recovery bench start the same server.

Nothing here imports pytest; a fixture can be as small as::

    @pytest.fixture(scope="session")
    def llama_base_url():
        python = llama_python()
        if not llama_available(python):
            pytest.skip("llama-cpp-python[server] not installed")
        gguf = find_or_fetch_gguf()
        with llama_server(gguf, python=python) as url:
            yield url
"""

from __future__ import annotations

from bench.recovery.llama import (
    DEFAULT_CACHE_DIR,
    GGUF_ENV_VAR,
    MODEL_ALIAS,
    PYTHON_ENV_VAR,
    find_or_fetch_gguf,
    free_port,
    llama_available,
    llama_python,
    llama_server,
)

__all__ = [
    "DEFAULT_CACHE_DIR",
    "GGUF_ENV_VAR",
    "MODEL_ALIAS",
    "PYTHON_ENV_VAR",
    "find_or_fetch_gguf",
    "free_port",
    "llama_available",
    "llama_python",
    "llama_server",
]
