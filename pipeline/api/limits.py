"""Limits in front of the API server: requests in flight per source, and the size of a request.

Size: a request to /api/*, the call pages or /login whose target (path and query: /api/query's SQL
rides in it) or body is larger than ``api_max_request_bytes`` is answered 413 at once, counted as
``too_large``. The same bound is the aiohttp application's ``client_max_size``, for a body without a
Content-Length. (aiohttp refuses a request line over 8 KB itself, before any middleware.)

In flight:
The pool (pool.py) bounds what the worker gives every reader together: ``api_query_threads`` running and
``api_query_max_waiting`` waiting, then 503 for everyone. A single script or an over-eager dashboard
looping on /api/query filled that line and every other reader got 503s. Now each source (the peer's
address) may have ``api_source_max_concurrent`` requests on /api/*, the call pages and /login (a password's
check is a scrypt hash on the API's pool) in flight; one more
is answered 429 with ``Retry-After`` at once, counted as ``source_busy``. Behind a reverse proxy every
request comes from the proxy's address: raise the limit there, or set 0 (no limit) and let the proxy limit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable

from aiohttp import web as aioweb

from pipeline.api.auth import is_page_path
from pipeline.api.refusals import ApiRefusals

Handler = Callable[[aioweb.Request], Awaitable[aioweb.StreamResponse]]


class SourceLimit:
    """How many requests each source has in flight, and whether one more may start."""

    def __init__(self, max_concurrent: int) -> None:
        self.max_concurrent = max_concurrent
        self._in_flight: Counter[str] = Counter()

    def enter(self, source: str) -> bool:
        if self.max_concurrent and self._in_flight[source] >= self.max_concurrent:
            return False
        self._in_flight[source] += 1
        return True

    def leave(self, source: str) -> None:
        self._in_flight[source] -= 1
        if self._in_flight[source] <= 0:
            del self._in_flight[source]  # no entry left behind per address ever seen

    def in_flight(self, source: str) -> int:
        return self._in_flight[source]


STREAM_PATHS = frozenset({"/api/live/events", "/live/events"})  # bounded by pipeline/live/views.py instead


def source_limit_middleware(limit: SourceLimit, refusals: ApiRefusals) -> Callable[[aioweb.Request, Handler],
                                                                                   Awaitable[aioweb.StreamResponse]]:
    """aiohttp middleware holding each source to ``limit`` on /api/*, the call pages and /login (/metrics,
    /health and /logout stay open: they are cheap, and a prober must always get through)."""

    @aioweb.middleware
    async def hold_to_limit(request: aioweb.Request, handler: Handler) -> aioweb.StreamResponse:
        limited = (request.path == "/api" or request.path.startswith("/api/") or is_page_path(request.path)
                   or request.path == "/login")
        # A live event stream stays open for minutes: counted here it would hold a slot the whole time (four
        # tabs, or a team behind one proxy, and nothing else gets through); the desk bounds streams itself.
        if not limited or request.path in STREAM_PATHS:
            return await handler(request)
        source = request.remote or "unknown"
        if not limit.enter(source):
            refusals.count("source_busy")
            return aioweb.json_response(
                {"error": f"too many requests in flight from {source} ({limit.max_concurrent}, "
                          "CALLQA_API_SOURCE_MAX_CONCURRENT): wait for one to finish"},
                status=429, headers={"Retry-After": "1"})
        try:
            return await handler(request)
        finally:
            limit.leave(source)

    return hold_to_limit


def request_size_middleware(max_bytes: int, refusals: ApiRefusals) -> Callable[[aioweb.Request, Handler],
                                                                               Awaitable[aioweb.StreamResponse]]:
    """aiohttp middleware refusing (413) a request whose target or declared body is over ``max_bytes``."""

    @aioweb.middleware
    async def hold_to_size(request: aioweb.Request, handler: Handler) -> aioweb.StreamResponse:
        size = max(len(request.raw_path), request.content_length or 0)
        if size > max_bytes:
            refusals.count("too_large")
            return aioweb.json_response(
                {"error": f"request of {size} bytes is over the limit of {max_bytes} "
                          "(CALLQA_API_MAX_REQUEST_BYTES)"}, status=413)
        return await handler(request)

    return hold_to_size
