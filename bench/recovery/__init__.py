"""The real-model recovery bench: what loopguard's interventions do to a looping local model.

``python -m bench.recovery`` (see :mod:`bench.recovery.__main__` and ``docs/recovery.md``). One
concept per module:

- :mod:`~bench.recovery.llama`, :mod:`~bench.recovery.llama_main`: the llama-cpp-python server
  (SmolLM2-135M GGUF) and its launcher (also used by the real-model tests);
- :mod:`~bench.recovery.chat_format`: the chat format that renders tool results, constrains the
  answer to one tool call or a text answer, and samples by the request's seed;
- :mod:`~bench.recovery.tasks`, :mod:`~bench.recovery.tools`: the toy repositories and the tools
  that really run in them;
- :mod:`~bench.recovery.agent`: the ``openai``-SDK agent, seeded per step;
- :mod:`~bench.recovery.relay`: the recording relay in front of the model server;
- :mod:`~bench.recovery.loopguard`: the real ``loopguard serve`` per arm;
- :mod:`~bench.recovery.arms`: the arms table (name -> config overrides);
- :mod:`~bench.recovery.loops`, :mod:`~bench.recovery.metrics`: what a loop is, the figures;
- :mod:`~bench.recovery.runner`, :mod:`~bench.recovery.report`: running the arms, the table.

Nothing here imports from ``tests``.
"""
