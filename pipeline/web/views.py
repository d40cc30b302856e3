"""The worker's call pages: /login, /logout, /calls and /calls/{call_id}, plugged into the API server
(``register_web_views(server)`` with the ``ApiServer`` that ``pipeline.api.server.register_api_views``
returns; the worker wires them, pipeline/worker/app.py).

/calls and /calls/{id} are guarded by the API server's auth middleware (``pipeline/api/auth.py``): a valid
session cookie or the bearer token, else a redirect to /login. /login takes the API token in a POST form
(never in a URL), compares it in constant time and sets the session cookie: HttpOnly, SameSite=Strict,
Secure when the request came over TLS (or a proxy in front says it did), holding a signed opaque value (``pipeline/api/sessions.py``).

The pages read through the API's own pool and read-only clients, each SELECT checked and limited as
/api/query's are (``run_readonly_query``); rendering happens on the pool thread too, off the event loop.
"""

from __future__ import annotations

import logging
import re
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import faust
from aiohttp import web as aioweb

from pipeline.access.users import Principal, login
from pipeline.api.auth import is_page_path, principal_of
from pipeline.api.pool import ApiBusyError
from pipeline.api.server import ApiServer, action_refusal, scoped_client
from pipeline.api.sessions import SESSION_COOKIE
from pipeline.desk.calibration import read_calibration
from pipeline.desk.review import ReviewError, submit_review
from pipeline.desk.trends import read_agent_trend
from pipeline.qa.call import QaConfig
from pipeline.store.client import StoreConnectionError, StoreError, connect
from pipeline.store.queries import ClientRows, QueryLimits
from pipeline.store.sqlguard import ReadonlyQueryError
from pipeline.web.data import FilterError, ListFilters, read_call_list, read_call_page, read_filter_options
from pipeline.web.render import (
    CSP,
    PageContext,
    ReviewForm,
    ServerLinks,
    render_agent_page,
    render_calibration,
    render_call_list,
    render_call_page,
    render_login,
    render_message,
)

log = logging.getLogger("callqa.web")
PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",  # a transcript, redacted or not, stays out of shared caches
}
FORWARDED_HTTPS = re.compile(r'(?:^|[;,\s])proto="?https"?(?:$|[;,\s])', re.IGNORECASE)  # RFC 7239


def safe_next(path: str | None) -> str:
    """Where to go after logging in: a page of this worker, never another site (``//host``, ``/\\host``)."""
    if not path or not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/calls"
    parts = urllib.parse.urlsplit(path)
    return path if not parts.scheme and not parts.netloc and is_page_path(parts.path) else "/calls"


def login_redirect(path_qs: str) -> aioweb.Response:
    return redirect(f"/login?{urllib.parse.urlencode({'next': path_qs})}")


def came_over_tls(request: Any) -> bool:
    """Did the browser reach us over TLS: directly, or through a proxy that says so (``X-Forwarded-Proto``
    or ``Forwarded: proto=``; any hop saying https). Behind a TLS proxy the worker sees plain HTTP, and a
    session cookie without Secure would also be sent over plain http:// to the same host. Believing the
    header can only make the cookie stricter: a client that invents it gets a cookie that its own plain
    connection does not send back."""
    if request.secure:
        return True
    hops = [h.strip().lower() for h in request.headers.get("X-Forwarded-Proto", "").split(",")]
    return "https" in hops or FORWARDED_HTTPS.search(request.headers.get("Forwarded", "")) is not None


def redirect(location: str) -> aioweb.Response:
    return aioweb.Response(status=303, headers={"Location": location, **PAGE_HEADERS})


def html(body: str, status: int = 200) -> aioweb.Response:
    return aioweb.Response(text=body, status=status, content_type="text/html", headers=PAGE_HEADERS)


def register_web_views(server: ApiServer) -> None:
    """The call pages on the API server's app, reading through its pool and read-only clients."""
    app, settings, pool, readers, auth = server.app, server.settings, server.pool, server.readers, server.auth
    db = settings.clickhouse_database
    limits = QueryLimits.from_settings(settings)
    threshold = settings.qa_silence_threshold_ms
    context = PageContext(ServerLinks(), logged_in=auth.mode == "token")
    scorecard = QaConfig.from_settings(settings).scorecard
    scorecard_items = tuple((q.id, q.question) for q in scorecard.questions)

    async def on_pool(request: Any, render: Callable[[ClientRows], aioweb.Response]) -> aioweb.Response:
        who = principal_of(request)  # an account's pages read only what its scope holds

        def work() -> aioweb.Response:
            with readers.client() as client:
                return render(ClientRows(scoped_client(client, who, settings), db, limits))

        try:
            return await pool.run(work)
        except (ApiBusyError, StoreError, StoreConnectionError, ReadonlyQueryError) as exc:
            return html(render_message("Store unavailable", str(exc), context.links, context.logged_in), 503)
        except Exception as exc:  # noqa: BLE001 - one page failed, not the worker
            # The type only: a message could quote a transcript.
            log.warning("call page failed: %s", type(exc).__name__)
            return html(render_message("Page failed", type(exc).__name__, context.links, context.logged_in), 500)

    def _login(name: str, password: str) -> Principal | None:
        with readers.client() as client:
            return login(client, db, name, password)

    class LoginView(faust.web.View):
        async def get(self, request: Any) -> aioweb.Response:
            if auth.mode == "off":
                return redirect(safe_next(request.query.get("next")))
            return html(render_login(safe_next(request.query.get("next")), unconfigured=auth.mode == "unconfigured"),
                        503 if auth.mode == "unconfigured" else 200)

        async def post(self, request: Any) -> aioweb.Response:
            form = await request.post()
            next_path = safe_next(str(form.get("next", "")))
            if auth.mode == "off":
                return redirect(next_path)
            name, unconfigured = str(form.get("name", "")).strip(), auth.mode == "unconfigured"
            keys = (f"address:{request.remote}", f"name:{name}") if name else (f"address:{request.remote}",)
            # Counted as a failure before the check runs (taken back if it succeeds): guesses sent together
            # cannot all pass the count while their checks are still running.
            wait = auth.logins.reserve(*keys)
            if wait > 0:
                auth.refusals.count("login_throttled")
                return html(render_login(next_path, error=f"too many failed logins: try again in {wait:.0f} s",
                                         unconfigured=unconfigured), 429)
            account = ""
            if name:
                password = str(form.get("password", ""))
                try:
                    who = await pool.run(lambda: _login(name, password))
                except (ApiBusyError, StoreError, StoreConnectionError) as exc:
                    auth.logins.release(*keys)  # not a wrong password: the store could not be asked
                    return html(render_login(next_path, error=str(exc), unconfigured=unconfigured), 503)
                if who is None:
                    return html(render_login(next_path, error="wrong name or password", unconfigured=unconfigured),
                                401 if auth.mode == "token" else 503)
                account = who.account_id
            elif not auth.token_matches(str(form.get("token", ""))):
                return html(render_login(next_path, error="wrong token", unconfigured=unconfigured),
                            401 if auth.mode == "token" else 503)
            auth.logins.release(*keys)
            response = redirect(next_path)
            response.set_cookie(SESSION_COOKIE, auth.new_session(time.time(), account),
                                max_age=int(auth.session_ttl_s), path="/", httponly=True, samesite="Strict",
                                secure=came_over_tls(request))
            return response

    class LogoutView(faust.web.View):
        async def post(self, request: Any) -> aioweb.Response:
            try:
                await auth.logout(request.cookies.get(SESSION_COOKIE), time.time())
            except Exception as exc:  # noqa: BLE001 - revoked here already; the store may be down or busy
                log.warning("logout not stored (other workers accept the session until it expires): %s",
                            str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            response = redirect("/login")
            response.del_cookie(SESSION_COOKIE, path="/")
            return response

    app.page("/login")(LoginView)
    app.page("/logout")(LogoutView)

    @app.page("/calls")
    async def calls_page(web: Any, request: Any) -> Any:
        try:
            filters = ListFilters.from_query(request.query)
        except FilterError as exc:
            return html(render_call_list([], context, ListFilters(), None, error=str(exc)), 400)

        def render(source: ClientRows) -> aioweb.Response:
            calls = read_call_list(source, db, filters, settings.web_page_size)
            options = read_filter_options(source, db)
            return html(render_call_list(calls, context, filters, options, page_size=settings.web_page_size))

        return await on_pool(request, render)

    @app.page("/calibration")
    async def calibration_page(web: Any, request: Any) -> Any:
        def render(source: ClientRows) -> aioweb.Response:
            questions = {item: question for item, question in scorecard_items}
            return html(render_calibration(read_calibration(source, db), questions, context))

        return await on_pool(request, render)

    @app.page("/agents/{agent_id}")
    async def agent_page(web: Any, request: Any, agent_id: str) -> Any:
        def render(source: ClientRows) -> aioweb.Response:
            trend = read_agent_trend(source, db, agent_id)
            if trend is None:
                return html(render_message("No such agent", f"The store has no call of agent {agent_id!r}.",
                                           context.links, context.logged_in), 404)
            return html(render_agent_page(trend, context))

        return await on_pool(request, render)

    @app.page("/calls/{call_id}")
    async def call_page(web: Any, request: Any, call_id: str) -> Any:
        form = ReviewForm(f"{context.links.call(call_id)}/reviews", auth.form_token(request.cookies.get(SESSION_COOKIE)),
                          scorecard_items)

        def render(source: ClientRows) -> aioweb.Response:
            page = read_call_page(source, db, call_id)
            if page is None:
                return html(render_message("No such call", f"The store has no call {call_id!r}.", context.links,
                                           context.logged_in), 404)
            return html(render_call_page(page, context, threshold, form))

        return await on_pool(request, render)

    class CallReviewsView(faust.web.View):  # type: ignore[misc]
        async def post(self, request: Any, call_id: str) -> aioweb.Response:
            form = await request.post()
            if not auth.form_allowed(request.cookies.get(SESSION_COOKIE), str(form.get("csrf", "")),
                                     request.headers.get("Authorization")):
                auth.refusals.count("bad_request")
                return html(render_message("Form expired", "Open the call page again and review from there.",
                                           context.links, context.logged_in), 403)
            who = principal_of(request)
            refused = await action_refusal(server, who, "review", call_id)
            if refused is not None:
                return html(render_message("Review not taken", refused[1], context.links, context.logged_in),
                            refused[0])
            item, verdict, reason, claimed = (str(form.get(name, "")) for name in ("item", "verdict", "reason",
                                                                                     "reviewer"))
            reviewer = who.audit_name(claimed)  # an account's session reviews as that account

            def write() -> None:
                client = connect(settings.writer_url, db, create_database=False, fresh=True)
                try:
                    submit_review(client, db, scorecard, call_id, item, verdict, reason, reviewer)
                finally:
                    client.close()

            try:
                await pool.run(write)
            except ReviewError as exc:
                return html(render_message("Review not taken", str(exc), context.links, context.logged_in), 400)
            except (ApiBusyError, StoreError, StoreConnectionError) as exc:
                return html(render_message("Store unavailable", str(exc), context.links, context.logged_in), 503)
            return redirect(f"{context.links.call(call_id)}#scorecard")

    app.page("/calls/{call_id}/reviews")(CallReviewsView)
