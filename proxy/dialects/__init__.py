"""Wire dialects: read a request body into a :class:`proxy.transcript.Transcript` and apply actions.

Only ``openai_chat`` exists so far (``/v1/chat/completions``); every other path is passthrough.
"""
