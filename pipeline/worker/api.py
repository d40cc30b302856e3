"""The worker's web API (/api/*): a bearer token in front, ClickHouse reads on a thread pool of their own.

- Every path under /api/ (matched or not) needs ``Authorization: Bearer <CALLQA_API_TOKEN>``, checked
  in constant time by an aiohttp middleware, so a view added later cannot forget it. ``/metrics``
  stays open for Prometheus. With no token configured /api/* answers 503 and says what to set;
  ``CALLQA_API_AUTH=off`` drops the check, and a worker refuses to start with it unless its web
  server binds a loopback address (``check_api_settings``).
- No token configured: a loopback worker uses the one kept in ``<state_dir>/api-token``, made at its
  first start (``with_local_token``; pipeline/web/auth.py); a worker bound to any other address
  refuses to start without an explicit CALLQA_API_TOKEN.
- The call pages (/calls, /calls/{id}: pipeline/web/) need a session cookie from /login (a browser
  cannot send a bearer token) or the bearer token; without either the middleware redirects to /login.
- /api/query runs one checked SELECT (pipeline/store/sqlguard.py) on the read-only account
  (``clickhouse_readonly_url``) under ``QueryLimits``; /api/calls and /api/calls/{id} read summaries.
- All of them run on ``QueryPool``: ``api_query_threads`` threads and at most ``api_query_max_waiting``
  waiting requests (more are answered 503 at once), never on the default executor that the
  worker's own blocking work (sink inserts, store look-ups) uses.
- A clickhouse-connect client is not for concurrent queries (over HTTP a second query in its session is
  refused, a chdb client serializes them): /api/calls and /api/calls/{id} read through a client per pool
  thread (``ThreadClients``: opened on the thread's first request, closed with the pool, never the
  writer's cached one), /api/query through a client of its own per request.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, Literal, TypeVar
from urllib.parse import urlencode

import faust
from aiohttp import web as aioweb
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import OperationalError
from pydantic import SecretStr

from pipeline.config import Settings
from pipeline.store import queries
from pipeline.store.client import StoreConnectionError, StoreError, connect
from pipeline.store.sqlguard import ReadonlyQueryError
from pipeline.web import auth as web_auth

log = logging.getLogger("callqa.worker.api")
T = TypeVar("T")
MIN_TOKEN_CHARS = web_auth.MIN_TOKEN_CHARS
Handler = Callable[[aioweb.Request], Awaitable[aioweb.StreamResponse]]


class ApiConfigError(ValueError):
    """The API settings would expose it; the worker does not start."""


class ApiBusyError(RuntimeError):
    """Every pool thread is busy and the waiting line is full."""


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and 'localhost'; 0.0.0.0, '::', '' and any other name are not."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def with_local_token(settings: Settings) -> Settings:
    """``settings`` with the local token file's token (made now if there is none) when the worker binds a
    loopback address, checks tokens and has none configured; otherwise ``settings`` as they are."""
    if (settings.api_auth == "off" or settings.api_token.get_secret_value().strip()
            or not is_loopback(settings.web_host)):
        return settings
    try:
        token = web_auth.ensure_token_file(web_auth.token_path(settings.state_dir))
    except web_auth.TokenFileError as exc:
        raise ApiConfigError(str(exc)) from None
    return settings.model_copy(update={"api_token": SecretStr(token)})


def check_api_settings(settings: Settings) -> None:
    """Refuse settings that would open /api/* to others: auth off off-loopback, or a guessable token."""
    if settings.api_auth == "off" and not is_loopback(settings.web_host):
        raise ApiConfigError(
            f"CALLQA_API_AUTH=off is only allowed with a loopback CALLQA_WEB_HOST, not {settings.web_host!r}: "
            "set CALLQA_API_TOKEN instead"
        )
    token = settings.api_token.get_secret_value().strip()
    if settings.api_auth == "on" and not token and not is_loopback(settings.web_host):
        raise ApiConfigError(
            f"CALLQA_WEB_HOST {settings.web_host!r} is not a loopback address: set CALLQA_API_TOKEN (16+ characters, "
            "e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    if settings.api_auth == "on" and token and len(token) < MIN_TOKEN_CHARS:
        raise ApiConfigError(
            f"CALLQA_API_TOKEN has {len(token)} characters; use at least {MIN_TOKEN_CHARS} "
            "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )


@dataclass(frozen=True)
class ApiAuth:
    mode: Literal["token", "off", "unconfigured"]
    token_digest: bytes = field(default=b"", repr=False)
    session_ttl_s: float = 12 * 3600  # how long a call-page login lasts

    @classmethod
    def from_settings(cls, settings: Settings) -> ApiAuth:
        ttl = settings.web_session_hours * 3600
        if settings.api_auth == "off":
            return cls("off", session_ttl_s=ttl)
        token = settings.api_token.get_secret_value().strip()
        return cls("token", _digest(token), ttl) if token else cls("unconfigured", session_ttl_s=ttl)

    def token_matches(self, presented: str) -> bool:
        """The login form's check: the token, compared as the bearer token is (digests, constant time)."""
        presented = presented.strip()
        return self.mode == "token" and bool(presented) and hmac.compare_digest(_digest(presented), self.token_digest)

    def new_session(self, now_s: float) -> str:
        """A session cookie value for a browser that just logged in."""
        return web_auth.new_session(web_auth.session_key(self.token_digest), now_s, self.session_ttl_s)

    def page_allowed(self, cookie: str | None, authorization: str | None, now_s: float) -> bool:
        """May this request see the call pages: a valid session cookie, or the bearer token."""
        if self.mode == "off":
            return True
        if self.mode == "unconfigured":
            return False
        return (web_auth.session_valid(web_auth.session_key(self.token_digest), cookie, now_s)
                or (bool(authorization) and self.refusal(authorization) is None))

    def refusal(self, authorization: str | None) -> tuple[int, str] | None:
        """(status, reason) when a request with this Authorization header may not use /api/*, else None."""
        if self.mode == "off":
            return None
        if self.mode == "unconfigured":
            return 503, "the API has no token configured: set CALLQA_API_TOKEN on the worker"
        scheme, _, presented = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            return 401, "missing bearer token: send 'Authorization: Bearer <CALLQA_API_TOKEN>'"
        # Digests of equal length, compared in constant time: neither the token nor its length leaks.
        if not hmac.compare_digest(_digest(presented.strip()), self.token_digest):
            return 401, "wrong bearer token"
        return None


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _is_api_path(path: str) -> bool:
    return path == "/api" or path.startswith("/api/")


def auth_middleware(auth: ApiAuth) -> Callable[[aioweb.Request, Handler], Awaitable[aioweb.StreamResponse]]:
    """aiohttp middleware guarding /api/* (bearer token) and the call pages (session cookie or bearer token,
    else a redirect to /login) by the request's path and by the route it matched."""

    @aioweb.middleware
    async def require_api_token(request: aioweb.Request, handler: Handler) -> aioweb.StreamResponse:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else ""
        if _is_api_path(request.path) or _is_api_path(route):
            refused = auth.refusal(request.headers.get("Authorization"))
            if refused is not None:
                status, reason = refused
                headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
                return aioweb.json_response({"error": reason}, status=status, headers=headers)
        elif (web_auth.is_page_path(request.path) or web_auth.is_page_path(route)) and not auth.page_allowed(
                request.cookies.get(web_auth.SESSION_COOKIE), request.headers.get("Authorization"), time.time()):
            login = f"/login?{urlencode({'next': request.path_qs})}"
            return aioweb.Response(status=303, headers={"Location": login, "Cache-Control": "no-store"})
        return await handler(request)

    return require_api_token


class QueryPool:
    """A small executor of its own for API reads, with a bounded waiting line."""

    def __init__(self, threads: int, max_waiting: int) -> None:
        self.threads = threads
        self.max_waiting = max_waiting
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="callqa-api")
        self._admitted = 0  # running + waiting; only touched on the event loop's thread
        self._on_shutdown: list[Callable[[], None]] = []

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self._admitted >= self.threads + self.max_waiting:
            raise ApiBusyError(f"the query API is busy ({self.threads} queries running, {self.max_waiting} "
                               "waiting); try again shortly")
        self._admitted += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, partial(fn, *args, **kwargs))
        finally:
            self._admitted -= 1

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        for close in self._on_shutdown:
            close()

    def on_shutdown(self, close: Callable[[], None]) -> None:
        """Call ``close`` when the pool shuts down (the views' per-thread clients)."""
        self._on_shutdown.append(close)


class ThreadClients:
    """One store client per thread, opened by ``factory`` on the thread's first ``get()``.

    A clickhouse-connect client must not run two queries at once: over HTTP the second one in its
    session fails ("concurrent queries within the same session"), and a chdb client serializes them
    on its one handle. A failed open is not remembered, and a client whose connection failed
    (``OperationalError``: refused, timed out, its session maybe still busy) is closed and dropped, so
    the thread's next request opens a new one."""

    def __init__(self, factory: Callable[[], Client]) -> None:
        self._factory = factory
        self._local = threading.local()
        self._lock = threading.Lock()
        self._opened: list[Client] = []

    @contextmanager
    def client(self) -> Iterator[Client]:
        """This thread's client, for one request."""
        client: Client | None = getattr(self._local, "client", None)
        if client is None:
            client = self._factory()
            self._local.client = client
            with self._lock:
                self._opened.append(client)
        try:
            yield client
        except OperationalError:
            self._local.client = None
            with self._lock:
                if client in self._opened:
                    self._opened.remove(client)
            client.close()
            raise

    def close(self) -> None:
        """Close every client opened so far (at shutdown: a thread still querying gets an error)."""
        with self._lock:
            opened, self._opened = self._opened, []
        for client in opened:
            client.close()


def register_api_views(app: faust.App, settings: Settings, pool: QueryPool) -> None:
    """/api/calls, /api/calls/{call_id} and /api/query on ``app`` (the auth middleware guards them), and the
    call pages of pipeline/web (/login, /logout, /calls, /calls/{call_id})."""
    database = settings.clickhouse_database
    limits = queries.QueryLimits.from_settings(settings)

    # fresh: never the process's cached client, which may be the writer's (same URL with chdb).
    readers = ThreadClients(partial(connect, settings.reader_url, database, create_database=False, fresh=True))
    pool.on_shutdown(readers.close)

    @app.page("/api/calls")
    async def calls_view(web: Any, request: Any) -> Any:
        agent = request.query.get("agent")

        def read() -> list[Any]:
            with readers.client() as client:
                return [_jsonable(asdict(r)) for r in queries.list_calls(client, agent_id=agent, limit=200)]

        return await _answer(web, pool.run(read))

    @app.page("/api/calls/{call_id}")
    async def call_view(web: Any, request: Any, call_id: str) -> Any:
        def read() -> dict[str, Any]:
            with readers.client() as client:
                summary = queries.call_summary(client, call_id)
                lines = queries.transcript(client, call_id)
            return {"summary": _jsonable(asdict(summary)) if summary else None,
                    "transcript": [_jsonable(asdict(line)) for line in lines]}

        return await _answer(web, pool.run(read))

    @app.page("/api/query")
    async def query_view(web: Any, request: Any) -> Any:
        sql = request.query.get("sql", "")
        params = {k[len("param_"):]: v for k, v in request.query.items() if k.startswith("param_")}

        def run() -> dict[str, Any]:
            # A client of its own per query (run_readonly_query opens and closes it): an analyst's query
            # may outlast the client's timeout, and an HTTP session it leaves busy must not be reused.
            result = queries.run_readonly_query(sql, params, url=settings.reader_url, database=database,
                                                limits=limits)
            return {"columns": result.columns, "types": result.types, "rows": _jsonable(result.rows),
                    "truncated": result.truncated}

        return await _answer(web, pool.run(run))

    # The call pages (imported here: pipeline.web.views builds on this module).
    from pipeline.web.views import register_web_views

    register_web_views(app, settings, pool, readers, ApiAuth.from_settings(settings))


async def _answer(web: Any, work: Awaitable[Any]) -> Any:
    """The view's JSON, or {"error": one line} with a status that says whose fault it is."""
    try:
        return web.json(await work)
    except ReadonlyQueryError as exc:
        return web.json({"error": str(exc)}, status=exc.status)
    except (ApiBusyError, StoreError, StoreConnectionError) as exc:
        return web.json({"error": str(exc)}, status=503)
    except Exception as exc:  # noqa: BLE001 - reported to the caller, not fatal to the worker
        log.warning("API request failed: %s", exc)
        return web.json({"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"},
                        status=500)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value
