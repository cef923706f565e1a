"""The core every guard reads: plain data and plain functions over it.

Tool calls and results (``transcript``), their canonical form, effects, failures, progress,
episodes, targets, waits, the agent tool table and the conversation state. Imports nothing of
the project but :mod:`proxy.config` and :mod:`proxy.errors`.
"""
