"""The worker's web API server: /api/* behind a bearer token, ClickHouse reads on a thread pool of their own.

A package of its own so that the worker (which starts it) and the call pages (which plug into it) both
build on it and neither on the other: it imports ``pipeline.config`` and ``pipeline.store`` only, never
``pipeline.worker`` or ``pipeline.web``.

- Every path under /api/ (matched or not) needs ``Authorization: Bearer <CALLQA_API_TOKEN>``, checked
  in constant time by an aiohttp middleware (``auth.auth_middleware``), so a view added later cannot
  forget it. ``/metrics`` stays open for Prometheus; every route not declared public (``auth.PUBLIC_PATHS``:
  /login, /logout, /metrics, /health) needs a principal, a page's login when it is not under /api/. With no
  token configured /api/* answers 503 and says what to set; ``CALLQA_API_AUTH=off`` drops the check, and a worker refuses to start with it unless its
  web server binds a loopback address (``auth.check_api_settings``).
- No token configured: a loopback worker uses the one kept in ``<state_dir>/api-token``, made at its
  first start (``auth.with_local_token``; ``token_file.py``); a worker bound to any other address
  refuses to start without an explicit CALLQA_API_TOKEN.
- The call pages (/calls, /calls/{id}: pipeline/web/, plugged in with ``register_web_views(server)``)
  need a session cookie from /login (``sessions.py``: a browser cannot send a bearer token) or the
  bearer token; without either the middleware redirects to /login.
- /api/query runs one checked SELECT (pipeline/store/sqlguard.py) on the read-only account
  (``clickhouse_readonly_url``) under ``QueryLimits``; /api/calls and /api/calls/{id} read summaries
  (``server.register_api_views``). /api/calls answers in pages (``paging.py``): ``?limit=`` up to
  ``api_page_max`` (``api_page_size`` without it), the next page in the ``Link: <...>; rel="next"`` header.
- All of them run on ``pool.QueryPool``: ``api_query_threads`` threads and at most ``api_query_max_waiting``
  waiting requests (more are answered 503 at once), never on the default executor that the
  worker's own blocking work (sink inserts, store look-ups) uses.
- A clickhouse-connect client is not for concurrent queries (over HTTP a second query in its session is
  refused, a chdb client serializes them): /api/calls and /api/calls/{id} read through a client per pool
  thread (``pool.ThreadClients``: opened on the thread's first request, closed with the pool, never the
  writer's cached one), /api/query through a client of its own per request.
"""
