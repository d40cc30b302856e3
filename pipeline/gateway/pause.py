"""Secure pause: an agent desktop, a CRM or an operator pauses a call's capture while a card is read out
(as Genesys's Secure Pause, Amazon Connect's pause and resume recording and Twilio's recording pause do), and
resumes it after.

While a call is paused its audio never leaves the gateway: ``OpenCalls.write`` drops it before it is built
into a frame (``callqa_gateway_secure_pause_dropped_seconds_total``), and the legs' clocks go on, so audio
after the pause lines up with the call's time. The call's events say when: a ``pause`` event and an
``unpause`` event (``pause: resume`` on the wire), each with ``offset_ms`` on the call's clock. The worker
keeps the span apart from holds and leaves it out of talk and silence. A pause never resumed ends with the
call (an ``unpause`` with ``reason`` "call ended", before its end event).

Two sides, one module:

- the gateway's: ``SecurePause``, ``POST /calls/{call_id}/pause`` and ``/resume`` on the operators' listener
  (``gateway_metrics_host``:``gateway_metrics_port``, beside /metrics), each with the operator's bearer token
  (``CALLQA_API_TOKEN``; on a loopback listener without it, the local token file ``<state_dir>/api-token``
  that a local worker uses too, made at the gateway's start if missing). Bad requests change nothing:
  401 a missing or wrong token, 404 a call this gateway does not hold, 409 a pause of a paused call or a
  resume of one that is not paused, 503 no token configured.
- the command line's: ``request`` (``callqa pause CALL_ID`` / ``callqa resume CALL_ID``) asks each gateway of
  ``gateway_control_urls`` in turn; the one holding the call answers, the others say 404. A call no gateway
  holds, a refusal or no gateway reachable is one ``SecurePauseError`` line.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from aiohttp import web as aioweb

from pipeline.api.token_file import (
    MIN_TOKEN_CHARS,
    TokenFileError,
    ensure_token_file,
    read_token_file,
    token_path,
)

if TYPE_CHECKING:
    from pipeline.config import Settings
    from pipeline.gateway.calls import LiveCall, OpenCalls
    from pipeline.gateway.metrics import GatewayMetrics

log = logging.getLogger("callqa.gateway")

Action = Literal["pause", "resume"]
ACTIONS: tuple[Action, ...] = ("pause", "resume")
REQUEST_TIMEOUT_S = 5.0


class SecurePauseError(RuntimeError):
    """A pause or resume that was refused or could not be asked: one line, nothing changed."""


class Refusal(Exception):
    """Why the gateway refuses a pause or resume request (HTTP status and one line)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# ---- the gateway's side --------------------------------------------------------------------------------------
def operator_token(settings: Settings, loopback: bool) -> str:
    """The token pause and resume requests must carry: ``CALLQA_API_TOKEN``, else on a loopback listener the
    local token file (made now if there is none, as a local worker does); "" when neither may be used, and
    then every request is refused (503)."""
    token = settings.api_token.get_secret_value().strip()
    if token:
        if len(token) < MIN_TOKEN_CHARS:
            log.warning("CALLQA_API_TOKEN has fewer than %d characters: secure pause requests are refused",
                        MIN_TOKEN_CHARS)
            return ""
        return token
    if not loopback:
        return ""
    try:
        return ensure_token_file(token_path(settings.state_dir))
    except (TokenFileError, OSError) as exc:
        log.warning("secure pause requests are refused: %s", exc)
        return ""


class SecurePause:
    """Pauses and resumes the capture of this gateway's calls, for the operators' listener."""

    def __init__(self, calls: OpenCalls, metrics: GatewayMetrics, token: str = "") -> None:
        self.calls = calls
        self.metrics = metrics
        self._digest = _digest(token) if token else b""

    def use_token(self, token: str) -> None:
        self._digest = _digest(token) if token else b""

    def add_routes(self, app: aioweb.Application) -> None:
        # ``.+``: a SIP Call-ID may hold characters a path segment would split on, sent percent-encoded.
        app.router.add_post("/calls/{call_id:.+}/pause", self._pause_view)
        app.router.add_post("/calls/{call_id:.+}/resume", self._resume_view)

    def pause(self, call_id: str) -> dict[str, Any]:
        """Pause the call's capture; ``Refusal`` (404, 409) changes nothing."""
        call = self._open_call(call_id)
        if call.paused_at_ms is not None:
            raise Refusal(409, f"call {call_id} is already paused (since {_clock(call.paused_at_ms)} of the call)")
        at_ms = self.calls.pause(call)
        return {"call_id": call_id, "paused": True, "paused_at_ms": at_ms}

    def resume(self, call_id: str) -> dict[str, Any]:
        """Resume the call's capture; ``Refusal`` (404, 409) changes nothing."""
        call = self._open_call(call_id)
        if call.paused_at_ms is None:
            raise Refusal(409, f"call {call_id} is not paused")
        at_ms, paused_ms = self.calls.unpause(call)
        return {"call_id": call_id, "paused": False, "resumed_at_ms": at_ms, "paused_ms": paused_ms}

    def check_token(self, authorization: str | None) -> None:
        """``Refusal`` 401 (missing or wrong bearer token) or 503 (no token configured)."""
        if not self._digest:
            raise Refusal(503, "secure pause is off on this gateway: it has no operator token "
                               "(set CALLQA_API_TOKEN, 16+ characters)")
        scheme, _, presented = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            raise Refusal(401, "missing bearer token: send 'Authorization: Bearer <operator token>'")
        # Digests of equal length, compared in constant time: neither the token nor its length leaks.
        if not hmac.compare_digest(_digest(presented.strip()), self._digest):
            raise Refusal(401, "wrong operator token")

    def _open_call(self, call_id: str) -> LiveCall:
        call = self.calls.calls.get(call_id)
        if call is None:
            raise Refusal(404, f"no open call {call_id} on this gateway")
        return call

    async def _pause_view(self, request: aioweb.Request) -> aioweb.Response:
        return self._answer(request, "pause")

    async def _resume_view(self, request: aioweb.Request) -> aioweb.Response:
        return self._answer(request, "resume")

    def _answer(self, request: aioweb.Request, action: Action) -> aioweb.Response:
        call_id = request.match_info["call_id"]
        try:
            self.check_token(request.headers.get("Authorization"))
            body = self.pause(call_id) if action == "pause" else self.resume(call_id)
        except Refusal as refused:
            outcome = {401: "unauthorized", 404: "unknown_call", 409: "conflict"}.get(refused.status, "unavailable")
            self.metrics.secure_pauses.labels(action, outcome).inc()
            # The call ID is the telephony's (a SID, a UUID): an id, never a number the caller gave. A 404 is
            # what every gateway but the one holding the call answers to `callqa pause`: not worth a warning.
            log.log(logging.INFO if refused.status == 404 else logging.WARNING, "secure %s of call %s refused (%d): %s",
                    action, call_id[:128], refused.status, refused.message)
            headers = {"WWW-Authenticate": "Bearer"} if refused.status == 401 else None
            return aioweb.json_response({"error": refused.message}, status=refused.status, headers=headers)
        self.metrics.secure_pauses.labels(action, "done").inc()
        return aioweb.json_response(body)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _clock(ms: int) -> str:
    seconds = ms // 1000
    return f"{seconds // 60}:{seconds % 60:02d}.{ms % 1000 // 100}"


# ---- the command line's side ---------------------------------------------------------------------------------
def control_urls(settings: Settings) -> list[str]:
    """The gateways' operators' listeners to ask: ``gateway_control_urls``, else this host's listener."""
    configured = [u.strip().rstrip("/") for u in settings.gateway_control_urls.split(",") if u.strip()]
    if configured:
        return configured
    host = settings.gateway_metrics_host.strip()
    host = "127.0.0.1" if host in ("", "0.0.0.0") else "::1" if host == "::" else host
    return [f"http://{f'[{host}]' if ':' in host else host}:{settings.gateway_metrics_port}"]


def client_token(settings: Settings) -> str:
    """The operator's token as the command line finds it: ``CALLQA_API_TOKEN``, else the local token file."""
    token = settings.api_token.get_secret_value().strip()
    if token:
        return token
    try:
        return read_token_file(token_path(settings.state_dir)) or ""
    except TokenFileError as exc:
        raise SecurePauseError(str(exc)) from None


@dataclass(frozen=True)
class Answer:
    """What the gateway holding the call answered."""

    url: str
    body: dict[str, Any]


def request(settings: Settings, call_id: str, action: Action, urls: list[str] | None = None,
            token: str | None = None) -> Answer:
    """Ask each gateway in turn to pause or resume ``call_id``; the answer of the one that holds it.
    ``SecurePauseError`` (one line) when it refuses, no gateway holds the call, or none can be reached."""
    if action not in ACTIONS:
        raise SecurePauseError(f"unknown action {action!r}: pause or resume")
    if not call_id.strip():
        raise SecurePauseError("no call ID given")
    hint = "" if urls else " (CALLQA_GATEWAY_CONTROL_URLS lists the gateways)"
    urls = urls or control_urls(settings)
    token = client_token(settings) if token is None else token
    if not token:
        raise SecurePauseError("no operator token: set CALLQA_API_TOKEN to the gateway's (a loopback gateway "
                               f"keeps it in {token_path(settings.state_dir)})")
    unknown: list[str] = []
    unreachable: list[str] = []
    for url in urls:
        status, body = _post(f"{url}/calls/{urllib.parse.quote(call_id, safe='')}/{action}", token)
        if status == 200:
            return Answer(url, body)
        if status == 404 and "error" in body:
            unknown.append(url)
        elif status is None:
            unreachable.append(f"{url} ({body['error']})")
        elif status == 404:  # not a gateway's operators' listener, or one from before secure pause
            unreachable.append(f"{url} (no secure pause there: HTTP 404)")
        else:
            raise SecurePauseError(f"{url} refused to {action} call {call_id}: {body.get('error') or status}")
    if unknown:
        asked = ", ".join(unknown)
        more = f"; not reachable: {', '.join(unreachable)}" if unreachable else ""
        raise SecurePauseError(f"no gateway holds call {call_id} (asked {asked}{more})")
    raise SecurePauseError(f"no gateway answered: {', '.join(unreachable)}{hint}")


def _post(url: str, token: str) -> tuple[int | None, dict[str, Any]]:
    """(status, JSON body) of a POST; (None, {"error": why}) when the gateway could not be asked."""
    req = urllib.request.Request(url, data=b"", method="POST", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as response:  # noqa: S310 - operator's URL
            return response.status, _json(response.read())
    except urllib.error.HTTPError as exc:
        body = _json(exc.read())
        return exc.code, body if "error" in body else {}
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return None, {"error": getattr(reason, "strerror", None) or str(reason)}


def _json(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
