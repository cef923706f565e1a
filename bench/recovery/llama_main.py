"""The llama-cpp-python server as the bench starts it: ``python -m bench.recovery.llama_main <server
arguments>`` (the arguments of ``python -m llama_cpp.server``).

Before the server starts, two things change in the server process:

- llama.cpp's "extra buffer types" (CPU weight repacking, including the AMX backend) are turned
  off: a native build on a CPU that advertises AMX (e.g. Sapphire Rapids in a Firecracker VM)
  segfaults in ``llama_decode`` on the first multi-token batch otherwise. Older llama-cpp-python
  versions without the field are left untouched;
- the bench's chat format (:mod:`bench.recovery.chat_format`) is registered under
  :data:`~bench.recovery.chat_format.FORMAT_NAME`, with the sampling overrides of
  ``$LOOPGUARD_BENCH_SAMPLING`` (a JSON object, e.g. ``{"temperature": 1.0}``) if set.
"""

from __future__ import annotations

import functools
import json
import os
import runpy
from typing import Any

SAMPLING_ENV_VAR = "LOOPGUARD_BENCH_SAMPLING"


def _no_extra_bufts() -> None:
    """Wrap ``llama_model_default_params`` so that ``use_extra_bufts`` is False."""
    import llama_cpp.llama_cpp as ll

    orig = ll.llama_model_default_params

    def params() -> Any:
        p = orig()
        if hasattr(p, "use_extra_bufts"):
            p.use_extra_bufts = False
        return p

    ll.llama_model_default_params = params


def _overridden(handler: Any, overrides: dict[str, Any], **kwargs: Any) -> Any:
    """Call ``handler`` with the request's settings replaced by ``overrides``."""
    return handler(**{**kwargs, **overrides})


def _register() -> None:
    """Register the bench's chat format (with ``$LOOPGUARD_BENCH_SAMPLING`` applied)."""
    from llama_cpp import llama_chat_format

    from bench.recovery.chat_format import FORMAT_NAME, handler

    overrides = json.loads(os.environ.get(SAMPLING_ENV_VAR) or "{}")
    chosen = functools.partial(_overridden, handler, overrides) if overrides else handler
    llama_chat_format.LlamaChatCompletionHandlerRegistry().register_chat_completion_handler(
        FORMAT_NAME, chosen, overwrite=True
    )


def main() -> None:
    """Patch, register, then run ``llama_cpp.server`` as ``__main__`` (it reads ``sys.argv``)."""
    _no_extra_bufts()
    _register()
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
