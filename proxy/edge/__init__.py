"""The aiohttp edge: sockets and HTTP. ``server`` (routes, app lifecycle, the request handler),
``relay`` (the response side's I/O), ``forward`` (upstream URLs and headers), ``connections``
(agent-side limits and timeouts)."""
