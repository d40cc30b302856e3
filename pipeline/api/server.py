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

from pipeline.access.scope import ScopedClient, scope_settings
from pipeline.access.users import (
    AccountError,
    AccountExistsError,
    Principal,
    add_account,
    list_accounts,
    remove_account,
    set_password,
)
from pipeline.api.accounts import stored_lookup
from pipeline.api.auth import ApiAuth, principal_of
from pipeline.api.paging import CallPage, PageError, next_link
from pipeline.api.pool import ApiBusyError, QueryPool, ThreadClients
from pipeline.api.ranges import RangeNotSatisfiable, byte_range
from pipeline.api.refusals import ApiRefusals
from pipeline.api.revocations import StoredRevocations
from pipeline.config import Settings
from pipeline.desk.review import ReviewError, submit_review
from pipeline.desk.search import SearchError, SearchQuery, search
from pipeline.qa.call import QaConfig
from pipeline.recordings.storage import RecordingStore
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
    auth.accounts.source = stored_lookup(settings.clickhouse_database, pool, readers)
    auth.accounts.by_id = stored_lookup(settings.clickhouse_database, pool, readers, by_id=True)
    server = ApiServer(app, settings, pool, readers, auth)
    _register_call_views(server)
    _register_review_view(server)
    _register_recording_view(server)
    _register_erasure_view(server)
    _register_account_views(server)
    _register_search_view(server)
    _register_query_view(server)
    return server


def _register_call_views(server: ApiServer) -> None:
    """/api/calls (summaries, ``?agent=``) and /api/calls/{call_id} (summary and transcript; 404 for a call the
    store has none of, or that was erased, or that is outside the principal's scope)."""
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

        who = principal_of(request)

        def read() -> list[Any]:
            with readers.client() as client:
                calls = queries.list_calls(scoped_client(client, who, settings), agent_id=agent, limit=page.limit,
                                           after=page.after)
            link.extend(filter(None, [next_link(request.path, request.query, page, calls)]))
            return [_jsonable(asdict(r)) for r in calls]

        return await _answer(web, pool.run(read), server.auth.refusals,
                             headers=lambda: {"Link": link[0]} if link else None)

    @server.app.page("/api/calls/{call_id}")
    async def call_view(web: Any, request: Any, call_id: str) -> Any:
        who = principal_of(request)

        def read() -> dict[str, Any] | None:
            with readers.client() as reader:
                client = scoped_client(reader, who, settings)
                summary = queries.call_summary(client, call_id)
                lines = queries.transcript(client, call_id)
            if summary is None and not lines:
                return None
            return {"summary": _jsonable(asdict(summary)) if summary else None,
                    "transcript": [_jsonable(asdict(line)) for line in lines]}

        async def found() -> dict[str, Any]:
            call = await pool.run(read)
            if call is None:
                raise NoSuchCall(f"no call {call_id}")
            return call

        return await _answer(web, found(), server.auth.refusals)


def _register_recording_view(server: ApiServer) -> None:
    """/api/calls/{call_id}/audio (the bearer token) and /calls/{call_id}/audio (the call page's player, on its
    session cookie): the call's redacted recording (Ogg/Opus), with byte ranges, to whoever may see the call (its
    row is read in the principal's scope: a call of another tenant is a 404, as one with none)."""
    settings, readers, pool = server.settings, server.readers, server.pool

    async def audio_view(web: Any, request: Any, call_id: str) -> Any:
        who = principal_of(request)
        store = RecordingStore(settings.recordings_location)

        def read() -> tuple[int, bytes, dict[str, str]]:
            with readers.client() as reader:
                found = scoped_client(reader, who, settings).query(
                    "SELECT media_type FROM recordings FINAL WHERE call_id = {call:String}",
                    parameters={"call": call_id}).result_rows
            if not found or not store.exists(call_id):
                return 404, b"", {}
            size = store.size(call_id)
            headers = {"Accept-Ranges": "bytes", "Content-Type": found[0][0], "Cache-Control": "private, no-store"}
            try:
                wanted = byte_range(request.headers.get("Range"), size)
            except RangeNotSatisfiable as exc:
                return 416, b"", {**headers, "Content-Range": str(exc)}
            if wanted is None:
                return 200, store.read(call_id), headers
            return 206, store.read(call_id, wanted.start, wanted.end), {**headers, "Content-Range": wanted.content_range}

        try:
            status, body, headers = await pool.run(read)
        except Exception as exc:  # noqa: BLE001 - answered as every view answers its failures
            return await _answer(web, _raise(exc), server.auth.refusals)
        if status == 404:
            server.auth.refusals.count("bad_request")
            return web.json({"error": f"no recording of call {call_id}"}, status=404)
        return web.bytes(body, content_type=headers.pop("Content-Type", None), status=status, headers=headers)

    server.app.page("/api/calls/{call_id}/audio")(audio_view)
    server.app.page("/calls/{call_id}/audio")(audio_view)


async def _raise(exc: BaseException) -> Any:
    raise exc


class NoSuchCall(LookupError):
    """No call of that id that the principal may see (none, erased, or another scope's): 404."""


def _register_review_view(server: ApiServer) -> None:
    """POST /api/calls/{call_id}/reviews: a human review of one scorecard item (JSON ``item``, ``verdict``,
    ``reason``, ``reviewer``; pipeline/desk/review.py), written with the store's writer account; answers the
    review and the call's new score. The reviewer kept is the account signed in (``Principal.audit_name``: the
    body's ``reviewer`` only for the operator's token). `callqa review` posts here while a worker holds the
    embedded store."""
    settings = server.settings
    scorecard = QaConfig.from_settings(settings).scorecard

    class ReviewsView(faust.web.View):  # type: ignore[misc]
        async def post(self, request: Any, call_id: str) -> Any:
            who = principal_of(request)
            refused = await action_refusal(server, who, "review", call_id)
            if refused is not None:
                return self.json({"error": refused[1]}, status=refused[0])
            try:
                body = await request.json()
                fields = {name: str(body.get(name, "")) for name in ("item", "verdict", "reason", "reviewer")}
                fields["reviewer"] = who.audit_name(fields["reviewer"])
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
    ``erased_by`` kept is the account signed in (``Principal.audit_name``: the body's only for the operator's
    token). `callqa erase` posts here while a worker holds the embedded store; 409 for a call that has not ended."""
    settings = server.settings

    class ErasureView(faust.web.View):  # type: ignore[misc]
        async def post(self, request: Any, call_id: str) -> Any:
            who = principal_of(request)
            refused = await action_refusal(server, who, "erase", call_id)
            if refused is not None:
                return self.json({"error": refused[1]}, status=refused[0])
            try:
                body = await request.json()
                erased_by = who.audit_name(str(body.get("erased_by", "")))
                force, outside = bool(body.get("force")), str(body.get("outside", ""))
            except (ValueError, AttributeError):
                server.auth.refusals.count("bad_request")
                return self.json({"error": "the body must be a JSON object: erased_by, force, outside"}, status=400)

            def erase() -> dict[str, Any]:
                client = connect(settings.writer_url, settings.clickhouse_database, create_database=False, fresh=True)
                try:
                    rows = erase_in_store(client, settings.clickhouse_database, call_id, erased_by, force, outside,
                                          remove_recording=RecordingStore(settings.recordings_location).delete)
                finally:
                    client.close()
                log.info("call %s erased by %s: %d rows", call_id, erased_by, sum(rows.values()))
                return {"call_id": call_id, "rows": rows}

            return await _answer(self, server.pool.run(erase), server.auth.refusals)  # a live call: 409

    server.app.page("/api/calls/{call_id}/erasure")(ErasureView)


def _register_account_views(server: ApiServer) -> None:
    """/api/users: GET lists the accounts, POST adds one (JSON ``name``, ``role``, ``tenant``, ``agent_id``, and a
    ``password`` for the pages' login; answers its token, shown once; 409 for a name a live account of any tenant
    holds), DELETE /api/users/{name} removes one. The operator manages every tenant; an admin its
    own (a tenant it names is ignored). `callqa users` goes through here while a worker holds the embedded store."""
    settings = server.settings
    db = settings.clickhouse_database

    def writer() -> Any:
        return connect(settings.writer_url, db, create_database=False, fresh=True)

    def managed(who: Principal) -> str | None:
        return None if who.is_operator else who.tenant

    class UsersView(faust.web.View):  # type: ignore[misc]
        async def get(self, request: Any) -> Any:
            who = principal_of(request)
            if not who.may("manage"):
                return self.json({"error": f"a {who.role} may not manage accounts"}, status=403)

            def read() -> list[dict[str, Any]]:
                with server.readers.client() as client:
                    return [_jsonable(asdict(a)) for a in list_accounts(client, db, managed(who))]

            return await _answer(self, server.pool.run(read), server.auth.refusals)

        async def post(self, request: Any) -> Any:
            who = principal_of(request)
            if not who.may("manage"):
                return self.json({"error": f"a {who.role} may not manage accounts"}, status=403)
            try:
                body = await request.json()
                name, role, agent_id, password = (str(body.get(k, "")) for k in ("name", "role", "agent_id",
                                                                                   "password"))
                tenant = managed(who) or str(body.get("tenant", ""))
            except (ValueError, AttributeError):
                return self.json({"error": "the body must be a JSON object: name, role, tenant, agent_id"}, status=400)

            def add() -> dict[str, Any]:
                client = writer()
                try:
                    token = add_account(client, db, name, role, tenant, agent_id)
                    if password:
                        set_password(client, db, name, password)
                finally:
                    client.close()
                log.info("account %s added (%s of %s) by %s", name, role, tenant, who.name)
                return {"name": name, "role": role, "tenant": tenant, "agent_id": agent_id, "token": token}

            return await _answer(self, server.pool.run(add), server.auth.refusals)

    class UserView(faust.web.View):  # type: ignore[misc]
        async def delete(self, request: Any, name: str) -> Any:
            who = principal_of(request)
            if not who.may("manage"):
                return self.json({"error": f"a {who.role} may not manage accounts"}, status=403)

            def remove() -> dict[str, Any]:
                client = writer()
                try:
                    account = remove_account(client, db, name, managed(who))
                finally:
                    client.close()
                log.info("account %s removed by %s", name, who.name)
                return {"removed": _jsonable(asdict(account))}

            return await _answer(self, server.pool.run(remove), server.auth.refusals)

    server.app.page("/api/users")(UsersView)
    server.app.page("/api/users/{name}")(UserView)


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
        who = principal_of(request)

        def read() -> list[Any]:
            with readers.client() as client:
                found = search(queries.ClientRows(scoped_client(client, who, settings), settings.clickhouse_database, limits),
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
        scope = scope_settings(principal_of(request).scope, settings.clickhouse_database)

        def run() -> dict[str, Any]:
            # A client of its own per query (run_readonly_query opens and closes it): an analyst's query
            # may outlast the client's timeout, and an HTTP session it leaves busy must not be reused.
            result = queries.run_readonly_query(sql, params, url=settings.reader_url,
                                                database=settings.clickhouse_database, limits=limits,
                                                scope_settings=scope)
            return {"columns": result.columns, "types": result.types, "rows": _jsonable(result.rows),
                    "truncated": result.truncated}

        return await _answer(web, server.pool.run(run), server.auth.refusals)


def scoped_client(client: Any, who: Principal, settings: Settings) -> Any:
    """``client`` held to what ``who`` may see (every query: pipeline/access/scope.py)."""
    scope = who.scope
    return client if scope is None else ScopedClient(client, scope.settings(settings.clickhouse_database))


async def action_refusal(server: ApiServer, who: Principal, action: str, call_id: str) -> tuple[int, str] | None:
    """(status, reason) when ``who`` may not ``action`` this call: 403 for its role, 404 for a call outside its
    scope (as if there were none); None when it may."""
    if not who.may(action):
        server.auth.refusals.count("forbidden")
        return 403, f"a {who.role} may not {action} calls"
    if who.scope is None:
        return None

    def visible() -> bool:
        with server.readers.client() as client:
            return bool(scoped_client(client, who, server.settings).query(
                "SELECT count() FROM calls WHERE call_id = {call:String}", parameters={"call": call_id}
            ).result_rows[0][0])

    if not await server.pool.run(visible):
        server.auth.refusals.count("bad_request")
        return 404, f"no call {call_id}"
    return None


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
    except AccountExistsError as exc:
        refusals.count("bad_request")
        return web.json({"error": str(exc)}, status=409)
    except AccountError as exc:
        refusals.count("bad_request")
        return web.json({"error": str(exc)}, status=404 if str(exc).startswith("no account") else 400)
    except NoSuchCall as exc:
        refusals.count("bad_request")
        return web.json({"error": str(exc)}, status=404)
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
