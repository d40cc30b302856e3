"""Who may use the API server: the bearer token on /api/*, a login on the call pages, and the settings
a worker refuses to start with.

The guard is one aiohttp middleware over every request, by its path and by the route it matched, so a
view or page added later cannot forget it: it denies by default. A route is open only when it is declared
in ``PUBLIC_PATHS``; /api/* (matched or not) needs a bearer token, and every other route a page login.
Tokens are compared as SHA-256 digests in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlencode

from aiohttp import web as aioweb
from pydantic import SecretStr

from pipeline.access.users import Principal
from pipeline.api import sessions
from pipeline.api.accounts import AccountTokens, LoginThrottle, TokenLookupsThrottled
from pipeline.api.refusals import ApiRefusals
from pipeline.api.token_file import MIN_TOKEN_CHARS, TokenFileError, ensure_token_file, token_path
from pipeline.config import Settings

Handler = Callable[[aioweb.Request], Awaitable[aioweb.StreamResponse]]


class ApiConfigError(ValueError):
    """The API settings would expose it; the worker does not start."""


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and 'localhost'; 0.0.0.0, '::', '' and any other name are not."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


# The pages' roots: a path under one of them needs a login (a new page goes under one, or is added here).
PAGE_ROOTS = ("/calls", "/agents", "/calibration", "/live")
# The routes open to anyone: the login itself, and the probes (Prometheus, a supervisor or load balancer).
# Any other route needs a principal, whether or not it is declared (tests/api/test_routes.py lists them all).
PUBLIC_PATHS = frozenset({"/login", "/logout", "/metrics", "/health"})


def is_page_path(path: str) -> bool:
    """The pages' paths (call list and pages, agent trends, calibration), which need a login."""
    return any(path == root or path.startswith(root + "/") for root in PAGE_ROOTS)


def with_local_token(settings: Settings) -> Settings:
    """``settings`` with the local token file's token (made now if there is none) when the worker binds a
    loopback address, checks tokens and has none configured; otherwise ``settings`` as they are."""
    if (settings.api_auth == "off" or settings.api_token.get_secret_value().strip()
            or not is_loopback(settings.web_host)):
        return settings
    try:
        token = ensure_token_file(token_path(settings.state_dir))
    except TokenFileError as exc:
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
    # One per worker, shared by the middleware and the views: the login sessions logged out.
    revocations: sessions.SessionRevocations = field(default_factory=sessions.SessionRevocations, compare=False)
    refusals: ApiRefusals = field(default_factory=ApiRefusals, compare=False)  # for the worker's /metrics
    # Accounts' bearer tokens (the store's users table, attached by the API server) beside the operator's.
    accounts: AccountTokens = field(default_factory=AccountTokens, compare=False)
    logins: LoginThrottle = field(default_factory=LoginThrottle, compare=False)  # failed page logins
    # Without a token (auth off, loopback only) forms are still bound to this process: a page of another
    # site can post to 127.0.0.1 but cannot read the form's token.
    _form_secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False, compare=False)

    @classmethod
    def from_settings(cls, settings: Settings) -> ApiAuth:
        ttl = settings.web_session_hours * 3600
        revocations = sessions.SessionRevocations(settings.web_logout_sync_s)
        if settings.api_auth == "off":
            return cls("off", session_ttl_s=ttl, revocations=revocations)
        token = settings.api_token.get_secret_value().strip()
        if not token:
            return cls("unconfigured", session_ttl_s=ttl, revocations=revocations)
        # An account removed is refused on every worker within the time a logout takes to reach them.
        return cls("token", _digest(token), ttl, revocations, accounts=AccountTokens(settings.web_logout_sync_s))

    def token_matches(self, presented: str) -> bool:
        """The login form's check: the token, compared as the bearer token is (digests, constant time)."""
        presented = presented.strip()
        return self.mode == "token" and bool(presented) and hmac.compare_digest(_digest(presented), self.token_digest)

    def new_session(self, now_s: float, account_id: str = "") -> str:
        """A session cookie value for a browser that just logged in (as the account of ``account_id``, or with
        the token)."""
        return sessions.new_session(sessions.session_key(self.token_digest), now_s, self.session_ttl_s, account_id)

    async def page_principal(self, cookie: str | None, authorization: str | None, now_s: float) -> Principal | None:
        """Who may see the call pages on this request (``page_allowed``'s rule), or None: a session of an account
        is that account (by its id, never its name) while it exists."""
        if not self.page_allowed(cookie, authorization, now_s):
            return None
        if self.mode != "token" or self._live_session(cookie, now_s) is None:
            return Principal.operator()  # auth off, or the bearer token
        account_id = sessions.session_account(cookie or "")
        return Principal.operator() if not account_id else await self.accounts.of_id(account_id)

    def form_token(self, cookie: str | None) -> str:
        """The CSRF token a page's form carries: a MAC of the session cookie under a key for forms only, so it
        is valid for that browser session only (any worker with the same API token accepts it)."""
        key = sessions.form_key(self.token_digest) if self.mode == "token" else self._form_secret
        return sessions.form_token(key, cookie or "")

    def form_allowed(self, cookie: str | None, presented: str, authorization: str | None) -> bool:
        """May a page's POST act: its form token is this session's, or it carries the bearer token (a script,
        not a browser's ambient cookie)."""
        if authorization and self.mode == "token" and self.refusal(authorization) is None:
            return True
        # compare_digest refuses a str that is not ASCII; a form token is base64url, so such a value is wrong.
        return bool(presented) and presented.isascii() and hmac.compare_digest(self.form_token(cookie), presented)

    def page_allowed(self, cookie: str | None, authorization: str | None, now_s: float) -> bool:
        """May this request see the call pages: a valid session cookie not logged out, or the bearer token."""
        if self.mode == "off":
            return True
        if self.mode == "unconfigured":
            return False
        return (self._live_session(cookie, now_s) is not None
                or (bool(authorization) and self.refusal(authorization) is None))

    async def logout(self, cookie: str | None, now_s: float) -> bool:
        """Revoke the session of this cookie (for every worker once stored); False when it was not one."""
        session = self._live_session(cookie, now_s)
        if session is None:
            return False
        await self.revocations.revoke(*session, now_s=now_s)
        return True

    def _live_session(self, cookie: str | None, now_s: float) -> tuple[str, int] | None:
        if self.mode != "token":
            return None
        session = sessions.signed_session(sessions.session_key(self.token_digest), cookie, now_s)
        return None if session is None or self.revocations.is_revoked(session[0]) else session

    async def principal(self, authorization: str | None,
                        source: str = "") -> tuple[Principal | None, tuple[int, str] | None]:
        """Who a request to /api/* from ``source`` (the peer's address) is: the operator (its token, or auth
        off), an account (its token), or nobody, with the (status, reason) of the refusal (429: the source sent
        too many unknown tokens)."""
        refused = self.refusal(authorization)
        if refused is None:
            return Principal.operator(), None
        if refused[0] == 401 and refused[1] == "wrong bearer token":
            try:
                account = await self.accounts.principal((authorization or "").strip().partition(" ")[2], source)
            except TokenLookupsThrottled as exc:
                return None, (429, str(exc))
            if account is not None:
                return account, None
        return None, refused

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


PRINCIPAL = aioweb.RequestKey("callqa.principal", Principal)  # who a request is (set by the middleware)


def principal_of(request: aioweb.Request) -> Principal:
    """Who a request is (the middleware set it on every route not public; a request it did not see is
    refused)."""
    principal = request.get(PRINCIPAL)
    if principal is None:
        raise PermissionError("no principal on this request")
    return principal


def _digest(token: str) -> bytes:
    # surrogatepass: a header's undecodable bytes arrive as surrogates, and a wrong token is not an error.
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def _is_api_path(path: str) -> bool:
    return path == "/api" or path.startswith("/api/")


def is_public_route(route: str) -> bool:
    """A route anyone may use (``PUBLIC_PATHS``), by its canonical path."""
    return route in PUBLIC_PATHS


def is_declared(route: str) -> bool:
    """Whether a route's canonical path is declared: public, /api/* or under a page root."""
    return is_public_route(route) or _is_api_path(route) or is_page_path(route)


_REFUSED_AS = {401: "unauthorized", 429: "token_throttled"}


def auth_middleware(auth: ApiAuth) -> Callable[[aioweb.Request, Handler], Awaitable[aioweb.StreamResponse]]:
    """aiohttp middleware guarding /api/* (bearer token) and every other route not in ``PUBLIC_PATHS`` (a page:
    session cookie or bearer token, else a redirect to /login), by the request's path and the route it matched.
    A path no route matches is answered by the router (404) unless it is under /api/."""

    @aioweb.middleware
    async def require_api_token(request: aioweb.Request, handler: Handler) -> aioweb.StreamResponse:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else ""
        if _is_api_path(request.path) or _is_api_path(route):
            principal, refused = await auth.principal(request.headers.get("Authorization"), request.remote or "")
            if principal is not None:
                request[PRINCIPAL] = principal
            if refused is not None:
                status, reason = refused
                auth.refusals.count(_REFUSED_AS.get(status, "unconfigured"))
                headers = ({"WWW-Authenticate": "Bearer"} if status == 401
                           else {"Retry-After": f"{auth.accounts.misses.window_s:.0f}"} if status == 429 else None)
                return aioweb.json_response({"error": reason}, status=status, headers=headers)
        elif (resource is not None and not is_public_route(route)) or is_page_path(request.path):
            cookie = request.cookies.get(sessions.SESSION_COOKIE)
            if cookie and auth.mode == "token":  # sessions logged out on other workers
                await auth.revocations.sync(time.time(), time.monotonic())
            who = await auth.page_principal(cookie, request.headers.get("Authorization"), time.time())
            if who is not None:
                request[PRINCIPAL] = who
            else:
                auth.refusals.count("login_required")
                login = f"/login?{urlencode({'next': request.path_qs})}"
                return aioweb.Response(status=303, headers={"Location": login, "Cache-Control": "no-store"})
        return await handler(request)

    return require_api_token
