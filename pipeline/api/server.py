"""The API's views on a faust app's web server, and the ``ApiServer`` the call pages plug into.

The worker builds the faust app with ``auth.auth_middleware`` in front, registers the views here and
plugs the call pages in (``register_web_views(server)`` of pipeline/web/views.py) with the
``ApiServer`` they return: the pages then read through the same pool, read-only clients and auth.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import faust

from pipeline.api.auth import ApiAuth
from pipeline.api.paging import CallPage, PageError, next_link
from pipeline.api.pool import ApiBusyError, QueryPool, ThreadClients
from pipeline.api.refusals import ApiRefusals
from pipeline.api.revocations import StoredRevocations
from pipeline.config import Settings
from pipeline.desk.review import ReviewError, submit_review
from pipeline.desk.search import SearchError, SearchQuery, search
from pipeline.qa.call import QaConfig
from pipeline.store import queries
from pipeline.store.client import StoreConnectionError, StoreError, connect
from pipeline.store.erasure import EraseError, erase_in_store
from pipeline.store.sqlguard import ReadonlyQueryError

log = logging.getLogger("callqa.worker.api")  # the worker's API: its lines stay under the worker's name


@dataclass(frozen=True)
class ApiServer:
    """The API on one faust app, as what plugs into it sees it: the app to register pages on, the
    settings, the API's pool and per-thread read-only clients, and who may log in."""

    app: faust.App
    settings: Settings
    pool: QueryPool
    readers: ThreadClients
    auth: ApiAuth


def register_api_views(app: faust.App, settings: Settings, pool: QueryPool, auth: ApiAuth) -> ApiServer:
    """/api/calls, /api/calls/{call_id} and /api/query on ``app``, guarded by ``auth``'s middleware (the one
    ``auth``: logouts are kept in the store through it); the ``ApiServer`` returned is what the call pages
    plug into."""
    # fresh: never the process's cached client, which may be the writer's (same URL with chdb).
    readers = ThreadClients(partial(connect, settings.reader_url, settings.clickhouse_database,
                                    create_database=False, fresh=True))
    pool.on_shutdown(readers.close)
    auth.revocations.source = StoredRevocations(settings, pool, readers)
    server = ApiServer(app, settings, pool, readers, auth)
    _register_call_views(server)
    _register_review_view(server)
    _register_erasure_view(server)
    _register_search_view(server)
    _register_query_view(server)
    return server


def _register_call_views(server: ApiServer) -> None:
    """/api/calls (summaries, ``?agent=``) and /api/calls/{call_id} (summary and transcript)."""
    readers, pool = server.readers, server.pool

    settings = server.settings

    @server.app.page("/api/calls")
    async def calls_view(web: Any, request: Any) -> Any:
        agent = request.query.get("agent")
        try:
            page = CallPage.from_query(request.query, settings.api_page_size, settings.api_page_max)
        except PageError as exc:
            server.auth.refusals.count("bad_request")
            return web.json({"error": str(exc)}, status=400)
        link: list[str] = []

        def read() -> list[Any]:
            with readers.client() as client:
                calls = queries.list_calls(client, agent_id=agent, limit=page.limit, after=page.after)
            link.extend(filter(None, [next_link(request.path, request.query, page, calls)]))
            return [_jsonable(asdict(r)) for r in calls]

        return await _answer(web, pool.run(read), server.auth.refusals,
                             headers=lambda: {"Link": link[0]} if link else None)

    @server.app.page("/api/calls/{call_id}")
    async def call_view(web: Any, request: Any, call_id: str) -> Any:
        def read() -> dict[str, Any]:
            with readers.client() as client:
                summary = queries.call_summary(client, call_id)
                lines = queries.transcript(client, call_id)
            return {"summary": _jsonable(asdict(summary)) if summary else None,
                    "transcript": [_jsonable(asdict(line)) for line in lines]}

        return await _answer(web, pool.run(read), server.auth.refusals)


def _register_review_view(server: ApiServer) -> None:
    """POST /api/calls/{call_id}/reviews: a human review of one scorecard item (JSON ``item``, ``verdict``,
    ``reason``, ``reviewer``; pipeline/desk/review.py), written with the store's writer account; answers the
    review and the call's new score. `callqa review` posts here while a worker holds the embedded store."""
    settings = server.settings
    scorecard = QaConfig.from_settings(settings).scorecard

    class ReviewsView(faust.web.View):  # type: ignore[misc]
        async def post(self, request: Any, call_id: str) -> Any:
            try:
                body = await request.json()
                fields = {name: str(body.get(name, "")) for name in ("item", "verdict", "reason", "reviewer")}
            except (ValueError, AttributeError):
                server.auth.refusals.count("bad_request")
                return self.json({"error": "the body must be a JSON object: item, verdict, reason, reviewer"},
                                 status=400)

            def write() -> dict[str, Any]:
                client = connect(settings.writer_url, settings.clickhouse_database, create_database=False, fresh=True)
                try:
                    review, row = submit_review(client, settings.clickhouse_database, scorecard, call_id,
                                                fields["item"], fields["verdict"], fields["reason"], fields["reviewer"])
                finally:
                    client.close()
                return {"review": _jsonable(asdict(review)), "score_pct": row["score_pct"],
                        "auto_failed": bool(row["auto_failed"]), "automatic_score_pct": row["automatic_score_pct"]}

            return await _answer(self, server.pool.run(write), server.auth.refusals)  # a ReviewError: 400/404

    server.app.page("/api/calls/{call_id}/reviews")(ReviewsView)


def _register_erasure_view(server: ApiServer) -> None:
    """POST /api/calls/{call_id}/erasure: every row of the call removed from the store and the erasure recorded
    (JSON ``erased_by``, ``force``, ``outside``; pipeline/privacy/erase.py); answers the rows removed per table.
    `callqa erase` posts here while a worker holds the embedded store; 409 for a call that has not ended."""
    settings = server.settings

    class ErasureView(faust.web.View):  # type: ignore[misc]
        async def post(self, request: Any, call_id: str) -> Any:
            try:
                body = await request.json()
                erased_by, force, outside = str(body.get("erased_by", "")), bool(body.get("force")), str(
                    body.get("outside", ""))
            except (ValueError, AttributeError):
                server.auth.refusals.count("bad_request")
                return self.json({"error": "the body must be a JSON object: erased_by, force, outside"}, status=400)

            def erase() -> dict[str, Any]:
                client = connect(settings.writer_url, settings.clickhouse_database, create_database=False, fresh=True)
                try:
                    rows = erase_in_store(client, settings.clickhouse_database, call_id, erased_by, force, outside)
                finally:
                    client.close()
                log.info("call %s erased by %s: %d rows", call_id, erased_by, sum(rows.values()))
                return {"call_id": call_id, "rows": rows}

            return await _answer(self, server.pool.run(erase), server.auth.refusals)  # a live call: 409

    server.app.page("/api/calls/{call_id}/erasure")(ErasureView)


def _register_search_view(server: ApiServer) -> None:
    """/api/search: calls whose redacted turns hold a phrase (``?q=``), with the list's filters (``leg``, ``agent``,
    ``since``, ``until``, ``score_below``, ``failed``, ``category``) and pages (``limit``, ``after``, ``Link``); see
    pipeline/desk/search.py. Run as /api/query runs a SELECT: checked, limited, on the read-only account."""
    settings, readers = server.settings, server.readers
    limits = queries.QueryLimits.from_settings(settings)

    @server.app.page("/api/search")
    async def search_view(web: Any, request: Any) -> Any:
        try:
            page = CallPage.from_query(request.query, settings.api_page_size, settings.api_page_max)
            query = SearchQuery.from_params(request.query, page.limit, page.after)
        except (PageError, SearchError) as exc:
            server.auth.refusals.count("bad_request")
            return web.json({"error": str(exc)}, status=400)
        link: list[str] = []

        def read() -> list[Any]:
            with readers.client() as client:
                found = search(queries.ClientRows(client, settings.clickhouse_database, limits),
                               settings.clickhouse_database,
                               query)
            link.extend(filter(None, [next_link(request.path, request.query, page, found)]))
            return [_jsonable(asdict(call)) for call in found]

        return await _answer(web, server.pool.run(read), server.auth.refusals,
                             headers=lambda: {"Link": link[0]} if link else None)


def _register_query_view(server: ApiServer) -> None:
    """/api/query: one checked SELECT (``?sql=``, ``param_<name>=``) on the read-only account."""
    settings = server.settings
    limits = queries.QueryLimits.from_settings(settings)

    @server.app.page("/api/query")
    async def query_view(web: Any, request: Any) -> Any:
        sql = request.query.get("sql", "")
        params = {k[len("param_"):]: v for k, v in request.query.items() if k.startswith("param_")}

        def run() -> dict[str, Any]:
            # A client of its own per query (run_readonly_query opens and closes it): an analyst's query
            # may outlast the client's timeout, and an HTTP session it leaves busy must not be reused.
            result = queries.run_readonly_query(sql, params, url=settings.reader_url,
                                                database=settings.clickhouse_database, limits=limits)
            return {"columns": result.columns, "types": result.types, "rows": _jsonable(result.rows),
                    "truncated": result.truncated}

        return await _answer(web, server.pool.run(run), server.auth.refusals)


async def _answer(web: Any, work: Awaitable[Any], refusals: ApiRefusals,
                  headers: Callable[[], dict[str, str] | None] = lambda: None) -> Any:
    """The view's JSON (with ``headers()`` once it is done), or {"error": one line} with a status that
    says whose fault it is (counted in ``refusals``)."""
    try:
        result = await work
        return web.json(result, headers=headers())
    except ReadonlyQueryError as exc:
        refusals.count("query_refused")
        return web.json({"error": str(exc)}, status=exc.status)
    except ReviewError as exc:
        refusals.count("bad_request")
        return web.json({"error": str(exc)}, status=404 if str(exc).startswith("no scored call") else 400)
    except EraseError as exc:  # a call that has not ended: refused, nothing removed
        refusals.count("bad_request")
        return web.json({"error": str(exc)}, status=409)
    except ApiBusyError as exc:
        refusals.count("busy")
        return web.json({"error": str(exc)}, status=503)
    except (StoreError, StoreConnectionError) as exc:
        refusals.count("store_unavailable")
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
