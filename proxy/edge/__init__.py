"""The aiohttp edge: sockets and HTTP, around the sans-I/O request and response sides.

A request's way through the modules, top to bottom:

- ``serve`` runs the proxy (:func:`proxy.edge.serve.start`, :func:`proxy.edge.serve.serve_forever`:
  the startup line, the signals, the stop); ``app`` builds the application (``create_app``: its
  state, typed in ``keys``; its routes; what opens and closes with it).
- ``admin``: the proxy's own routes under ``/loop-guard`` (stats, healthz, metrics, reload), with
  the admin token and loopback rule; anything else under ``/loop-guard`` is a 404 or 405, never
  forwarded (it would carry the admin token upstream).
- ``handler``: every other path and method, forwarded. ``POST …/chat/completions``,
  ``…/responses``, ``…/v1/messages`` (Anthropic Messages) and ``…/models/{m}:generateContent`` /
  ``:streamGenerateContent`` (Gemini) bodies go through the guards first
  (:func:`proxy.request.rewrite.decide_request`, :data:`proxy.dialects.REGISTRY`; ``wire`` says
  which dialect and answer wire a path has). Every header, ``x-api-key``, ``authorization``,
  ``x-goog-api-key``, ``anthropic-version`` and ``anthropic-beta`` included, goes upstream as it
  came (hop-by-hop ones aside, ``forward``) and is never logged; so does the query string
  (Gemini's ``?key=``), which the log line leaves out (it logs ``request.path``).
- ``upstream``: sends the request and relays the answer chunk by chunk (the response side's I/O is
  ``relay``); ``streamed`` sends a JSON chat request as a stream when
  ``upstream.stream_json_requests`` asks (llama-cpp-python only stops generating for a hung-up
  *stream*); ``answers`` holds the proxy's own error answers (502, 504, 408, 413, 503), each in
  the wire's error form.
- ``shutdown``: the grace period; ``connections``: the agent side's limits and timeouts.
- Alongside: ``runtime`` (hot reload: ``SIGHUP`` and ``POST /loop-guard/reload`` re-read the
  config; a request keeps the :class:`proxy.edge.runtime.Runtime` it started with, so a request in
  flight finishes under its config; an invalid file, or one that changes a key only a restart can
  change, :data:`proxy.config.RESTART_ONLY`, is rejected naming the key and the running config
  stays), ``shared_state`` (several replicas, ``state.backend``: the request side's state is
  fetched before and written after the pure decision, a kept Responses answer before its last
  bytes reach the agent, incidents are claimed by the writer), ``observe`` (logs and stats;
  observe mode, ``mode``: the guards' actions are logged, counted and recorded but not applied,
  and the response side reads the answer in a shadow that changes no byte), ``metrics``,
  ``incidents`` (written by a background task), ``capture`` (``capture.path``: after a guarded
  request's log line, one line with the history the agent sent and the upstream's chat answer).
"""
