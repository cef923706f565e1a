"""The response side: the upstream's answer, read and decided on before it reaches the agent.

``decide`` (the stop judge, the runaway cut, degenerate text), ``answer`` (one answer's text
and calls, and those decisions on them, for every wire), ``stream_guard`` (the shared
stream loop and a chat-completions stream), ``responses_stream`` (a Responses API answer, JSON and
SSE), ``messages_stream`` (an Anthropic Messages answer, JSON and SSE), ``gemini_stream`` (a
Gemini API answer, JSON and ``alt=sse``), ``assemble`` (tool-call
deltas into calls), ``degenerate``, ``sse`` (the SSE framer),
``as_stream`` (a non-streaming request sent upstream as a stream), ``repair`` (tool calls the
model wrote as text, rewritten into structured calls).
"""
