"""What the API refused, counted for the worker's /metrics: ``callqa_api_refusals_total{reason}``.

Reasons: ``unauthorized`` (401: no or a wrong bearer token), ``unconfigured`` (503: no token set),
``token_throttled`` (429: a source past its unknown bearer tokens, accounts.py), ``login_throttled`` (429: past
the failed logins), ``login_required`` (a call page without a session: redirected to /login), ``busy`` (503: the pool's line
is full), ``source_busy`` (429: one source's requests in flight, limits.py), ``too_large`` (413: a request's
target or body over its size limit, limits.py), ``query_refused`` (the SQL
guard or a query limit), ``bad_request`` (a page size or cursor that
cannot be used), ``store_unavailable`` (503). The counter is registered by whoever owns the /metrics
registry (the worker: ``registry.register(refusals.counter)``); until then it counts unseen.
"""

from __future__ import annotations

from prometheus_client import Counter


class ApiRefusals:
    def __init__(self) -> None:
        self.counter = Counter("callqa_api_refusals_total", "API requests refused, by why.", ["reason"], registry=None)

    def count(self, reason: str) -> None:
        self.counter.labels(reason).inc()
