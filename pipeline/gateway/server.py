"""The websocket shell around the gateway's core: one asyncio server, paths /twilio and /audiohook, and
plain HTTP /healthz answered before any upgrade; /metrics on a listener of its own
(``gateway_metrics_host``/``_port``, loopback by default), not on the public port, beside the operator's
secure pause requests (``pause.py``).

Everything that can refuse a connection happens on the upgrade request (``process_request``): the
session limit (503), the credentials (Twilio 403, AudioHook 401), unknown paths (404). After the
upgrade a session object of the core (``TwilioStream``, ``AudioHookSession``) takes each message; this
module only reads sockets, sends replies, closes with the core's close codes, and runs the timers
(call end grace, back-pressure resume, idle timeout, AudioHook's flush before ``closed``).

The server is picows's websockets-compatible API (``picows.websockets.serve``): the same handler and
``process_request`` as the websockets library, with the frame parsing and masking in Cython, which cut the
gateway's CPU per message by a third. The tests talk to it with the websockets library's client.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import ssl
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web as aioweb
from multidict import CIMultiDict
from picows.websockets import ConnectionClosed, Request, Response, Server, ServerConnection, serve
from prometheus_client import CONTENT_TYPE_LATEST

from pipeline.broker.producer import ContractProducer
from pipeline.config import Settings
from pipeline.gateway.audiohook import AudioHookSession, State
from pipeline.gateway.auth import AudioHookAuthenticator, PublicAddress, twilio_refusal
from pipeline.gateway.calls import OpenCalls
from pipeline.gateway.limits import SourceLimits, TokenBucket, message_bucket, source_of
from pipeline.gateway.metrics import GatewayMetrics
from pipeline.gateway.outbox import KafkaSender, Outbox
from pipeline.gateway.pause import SecurePause, operator_token
from pipeline.gateway.protocol import (
    CLOSE_GOING_AWAY,
    CLOSE_IDLE,
    CLOSE_NORMAL,
    CLOSE_POLICY,
    CLOSE_TRY_AGAIN,
    ProtocolError,
)
from pipeline.gateway.twilio import TwilioStream

if TYPE_CHECKING:
    from pipeline.gateway.siprec.transport import SipListener

log = logging.getLogger("callqa.gateway")

PROTOCOLS = ("twilio", "audiohook")
MAX_MESSAGE_BYTES = 64 * 1024  # a second of stereo PCMU is 16 KB; Twilio's JSON of a second ~11 KB
TICK_S = 0.1
ERROR_CLOSE_WAIT_S = 2.0  # after an AudioHook disconnect, how long the client has to send its close

Session = TwilioStream | AudioHookSession


class GatewayConfigError(ValueError):
    """Settings the gateway refuses to start with (one line, naming the setting)."""


class GatewayServer:
    def __init__(self, settings: Settings, producer: ContractProducer, *, metrics: GatewayMetrics | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.metrics = metrics or GatewayMetrics()
        self.outbox = Outbox(self.metrics, settings.gateway_leg_buffer_s, settings.audio_message_ms)
        self.calls = OpenCalls(self.outbox, self.metrics, settings.gateway_end_grace_s, clock, settings.audio_message_ms)
        self.sender = KafkaSender(self.outbox, producer, settings.topic_audio, settings.topic_call_events,
                                  self.metrics, settings.gateway_send_batch)
        self.secure_pause = SecurePause(self.calls, self.metrics)  # its token is resolved by start()
        self.audiohook_auth = AudioHookAuthenticator(
            settings.audiohook_api_key.get_secret_value(), settings.audiohook_client_secret.get_secret_value(),
            settings.audiohook_signature_max_age_s, settings.audiohook_clock_skew_s)
        self.tls = _tls_context(settings)
        self.sessions: dict[ServerConnection, Session] = {}
        self._last_seen: dict[ServerConnection, float] = {}  # when each socket last gave a message (monotonic)
        self._idle_closed: set[ServerConnection] = set()  # sockets the tick is closing for silence
        self.draining = False
        self._closing_all = False
        self._unauthenticated = settings.gateway_auth == "off"  # credentials not set: streams taken anyway
        self._server: Server | None = None
        self.limits = SourceLimits(settings.gateway_source_max_sessions, settings.gateway_source_handshakes_per_s)
        self._sources: dict[ServerConnection, str] = {}  # each open session's source address (limits.py)
        self._message_budgets: dict[ServerConnection, TokenBucket] = {}
        self._ticker: asyncio.Task[None] | None = None
        self._metrics_runner: aioweb.AppRunner | None = None
        self.metrics_port = 0  # the operators' listener, once started
        self._tasks: set[asyncio.Task[Any]] = set()
        self.siprec: SipListener | None = None  # the SIPREC recording server, with --sip-port

    # ---- lifecycle ----------------------------------------------------------------------------------------
    async def start(self, host: str, port: int) -> int:
        """Listen; returns the port (useful with port 0)."""
        if self._unauthenticated and not _is_loopback(host):
            raise GatewayConfigError(f"CALLQA_GATEWAY_AUTH=off is only allowed with a loopback host, not {host!r}: "
                                     "set CALLQA_TWILIO_AUTH_TOKEN and CALLQA_AUDIOHOOK_API_KEY instead")
        self.sender.start()
        self._server = await serve(self._handle, host, port, process_request=self._process_request,
                                   max_size=MAX_MESSAGE_BYTES, compression=None, ssl=self.tls,
                                   open_timeout=self.settings.gateway_handshake_timeout_s,
                                   logger=logging.getLogger("callqa.gateway.websockets"))
        self._ticker = asyncio.create_task(self._tick())
        self.secure_pause.use_token(operator_token(self.settings, _is_loopback(self.settings.gateway_metrics_host)))
        self.metrics_port = await self._serve_metrics(self.settings.gateway_metrics_host,
                                                      self.settings.gateway_metrics_port)
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    async def start_siprec(self, host: str, sip_port: int, sips_port: int | None = None) -> tuple[int, int | None]:
        """The SIPREC recording server on ``sip_port`` (UDP and TCP) and ``sips_port`` (TLS), feeding the same
        calls and Kafka sender; returns the ports bound."""
        from pipeline.gateway.siprec.metrics import SiprecMetrics
        from pipeline.gateway.siprec.recorder import RecordingServer
        from pipeline.gateway.siprec.transport import SipListener, UdpMediaPorts

        address = self.settings.siprec_media_address or host
        if address in ("0.0.0.0", "::", ""):
            raise GatewayConfigError("with a wildcard --host, set CALLQA_SIPREC_MEDIA_ADDRESS to the address SBCs "
                                     "send RTP to (it goes in the SDP answer)")
        media = UdpMediaPorts(host)
        metrics = SiprecMetrics(self.metrics.registry)
        listener = SipListener(RecordingServer(self.settings, self.calls, media, metrics, address, sip_port), media)
        bound, tls_bound = await listener.start(host, sip_port, sips_port, self.tls)
        listener.server.contact = (address, bound)
        self.siprec = listener
        return bound, tls_bound

    async def _serve_metrics(self, host: str, port: int) -> int:
        """/metrics and /healthz over plain HTTP on the operators' listener, and secure pause (with the
        operator's token: pause.py); returns its port."""
        app = aioweb.Application()
        app.router.add_get("/metrics", self._metrics_view)
        app.router.add_get("/healthz", self._healthz_view)
        self.secure_pause.add_routes(app)
        self._metrics_runner = aioweb.AppRunner(app, access_log=None)
        await self._metrics_runner.setup()
        site = aioweb.TCPSite(self._metrics_runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            raise GatewayConfigError(f"the metrics listener (CALLQA_GATEWAY_METRICS_HOST/_PORT) cannot listen "
                                     f"on {host}:{port}: {exc.strerror or exc}") from None
        metrics_port: int = self._metrics_runner.addresses[0][1]
        return metrics_port

    async def _metrics_view(self, request: aioweb.Request) -> aioweb.Response:
        return aioweb.Response(body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz_view(self, request: aioweb.Request) -> aioweb.Response:
        status, text = self.health()
        return aioweb.Response(status=status, text=text)

    def health(self) -> tuple[int, str]:
        """(status, body) of /healthz: 503 once the Kafka sender stopped or while draining."""
        if self.sender.failure is not None:
            return 503, f"Kafka sender stopped: {self.sender.failure}\n"
        return (503, "draining\n") if self.draining else (200, "ok\n")

    async def shutdown(self) -> None:
        """Drain: refuse new sessions, let open ones go on up to ``gateway_drain_s``, close the rest,
        end every call (one end event each), and send what is buffered."""
        self.draining = True
        if self.siprec is not None:  # new INVITEs get 503 from now on; open sessions go on with the drain
            self.siprec.server.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.gateway_drain_s
        while self.sessions and loop.time() < deadline:
            await asyncio.sleep(TICK_S)
        self._closing_all = True
        for ws in list(self.sessions):
            await ws.close(CLOSE_GOING_AWAY, "gateway shutdown")
        while self.sessions and loop.time() < deadline + 5:
            await asyncio.sleep(0.01)
        if self._ticker is not None:
            self._ticker.cancel()
        if self.siprec is not None:
            await self.siprec.shutdown()
        self.calls.end_all("gateway shutdown")
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        await asyncio.to_thread(self.sender.stop)
        if self._metrics_runner is not None:  # last: a scrape during the drain still sees it
            await self._metrics_runner.cleanup()

    # ---- before the upgrade -------------------------------------------------------------------------------
    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.partition("?")[0]
        if path == "/healthz":
            return connection.respond(*self.health())
        protocol = _protocol_of(path)
        if protocol is None:
            # /metrics included: it is on the operators' listener (gateway_metrics_port), never here.
            return connection.respond(404, "not found: the gateway serves /twilio, /audiohook, /healthz\n")
        if self.draining or len(self.sessions) >= self.settings.gateway_max_sessions:
            self.metrics.sessions.labels(protocol, "refused_busy").inc()
            log.warning("%s handshake refused: %s", protocol, "draining" if self.draining else "session limit reached")
            return connection.respond(503, "gateway at its session limit\n")
        refusal = self._refusal(protocol, request)
        if refusal is not None:
            self.metrics.auth_failures.labels(protocol, refusal).inc()
            self.metrics.sessions.labels(protocol, "refused_auth").inc()
            log.warning("%s handshake from %s refused: %s", protocol, _peer(connection), refusal)
            return connection.respond(403 if protocol == "twilio" else 401, f"refused: {refusal}\n")
        return None

    def _source(self, ws: ServerConnection) -> str:
        assert ws.request is not None
        forwarded = _lower(ws.request.headers).get("x-forwarded-for", "")
        return source_of(_peer(ws), forwarded, self.settings.gateway_forwarded_for)

    def _refusal(self, protocol: str, request: Request) -> str | None:
        headers = _lower(request.headers)
        address = PublicAddress.of_request(headers, self.settings.gateway_public_url, self.tls is not None)
        if protocol == "twilio":
            token = self.settings.twilio_auth_token.get_secret_value()
            if not token:
                return None if self._unauthenticated else "no_auth_token_configured"
            if not signed_call_sid(request.path):
                # The signature covers the URL only: without the call in it, one captured handshake could
                # be replayed with any callSid in its start message.
                return "call_sid_not_in_path"
            return twilio_refusal(token, address.url(request.path), headers.get("x-twilio-signature"))
        if not self.settings.audiohook_api_key.get_secret_value() and not self._unauthenticated:
            return "no_api_key_configured"
        return self.audiohook_auth.refusal(request.path, address.host, headers)

    # ---- after the upgrade --------------------------------------------------------------------------------
    async def _handle(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        protocol = _protocol_of(ws.request.path.partition("?")[0])
        # Per-source limits here, not on the handshake: picows tells no peer address before the upgrade.
        # Nothing of the session has been read yet.
        source = self._source(ws)
        limited = self.limits.refusal(source)
        if limited is not None:
            self.metrics.limit_refusals.labels(protocol, limited).inc()
            self.metrics.sessions.labels(protocol, "refused_limit").inc()
            log.warning("%s session from %s refused: %s", protocol, source, limited)
            await ws.close(CLOSE_TRY_AGAIN, f"refused: {limited}")
            return
        stream_id = uuid.uuid4().hex[:16]
        session: Session
        if protocol == "twilio":
            signed = self.settings.twilio_auth_token.get_secret_value() != ""
            session = TwilioStream(self.calls, self.metrics, stream_id,
                                   signed_call_sid(ws.request.path) if signed else None)
        else:
            headers = _lower(ws.request.headers)
            session = AudioHookSession(self.calls, self.metrics, stream_id,
                                       session_id=headers.get("audiohook-session-id", "")[:64],
                                       organization_id=headers.get("audiohook-organization-id", ""))
        self.sessions[ws] = session
        self._last_seen[ws] = time.monotonic()
        self._sources[ws] = source
        self.limits.opened(source)
        budget = message_bucket(self.settings.gateway_session_messages_per_s)
        if budget is not None:
            self._message_budgets[ws] = budget
        self.metrics.sessions.labels(protocol, "accepted").inc()
        self.metrics.sessions_active.labels(protocol).inc()
        reason = "disconnected"
        try:
            reason = await (self._read_twilio(ws, session) if isinstance(session, TwilioStream)
                            else self._read_audiohook(ws, session))
        finally:
            if isinstance(session, TwilioStream):
                session.close(reason)
            else:
                session.socket_closed(reason)
            del self.sessions[ws]
            self.limits.closed(self._sources.pop(ws))
            self._message_budgets.pop(ws, None)
            self._last_seen.pop(ws, None)
            self._idle_closed.discard(ws)
            self.metrics.sessions_active.labels(protocol).dec()

    async def _read_twilio(self, ws: ServerConnection, session: TwilioStream) -> str:
        while True:
            message = await self._receive(ws)
            if isinstance(message, _Ended):
                return message.reason
            try:
                if isinstance(message, str):
                    session.on_text(message)
                else:
                    session.on_binary(message)
            except ProtocolError as err:
                await ws.close(err.code, err.detail[:120])
                return "protocol error"

    async def _read_audiohook(self, ws: ServerConnection, session: AudioHookSession) -> str:
        while True:
            message = await self._receive(ws)
            if isinstance(message, _Ended):
                if message.reason == "idle timeout" and session.state is State.ERROR:
                    # The client never closed after our disconnect: the tick closed it with the error's code.
                    return "protocol error" if session.error else "unauthorized"
                return message.reason
            replies = session.on_text(message) if isinstance(message, str) else session.on_binary(message)
            await self._send(ws, replies)
            if session.state is State.CLOSING:
                self._spawn(self._close_after_flush(ws, session))
            elif session.state is State.CLOSED:  # the client closed after our disconnect
                await ws.close(CLOSE_NORMAL)
                return "protocol error" if session.error else "unauthorized"

    async def _receive(self, ws: ServerConnection) -> str | bytes | _Ended:
        """The next message, or why there is none. No timer per message (``asyncio.wait_for`` was a task
        and a timer handle for each of 50 messages a second per leg): the tick closes idle sockets."""
        try:
            message = await ws.recv()
        except ConnectionClosed:
            if ws in self._idle_closed:
                return _Ended("idle timeout")
            return _Ended("gateway shutdown" if self._closing_all else "disconnected")
        now = self._last_seen[ws] = time.monotonic()
        budget = self._message_budgets.get(ws)
        if budget is not None and not budget.take(now):
            self.metrics.limit_refusals.labels(self.sessions[ws].protocol, "session_message_rate").inc()
            log.warning("%s closed: more than %g messages a second", self.sessions[ws].name, budget.rate)
            await ws.close(CLOSE_POLICY, f"more than {budget.rate:g} messages a second")
            return _Ended("message rate")
        return message

    def _close_idle(self, now: float) -> None:
        """Close the sockets that sent nothing for ``gateway_idle_timeout_s``, and AudioHook clients that
        did not close within ``ERROR_CLOSE_WAIT_S`` after we disconnected them (with the error's code)."""
        for ws, session in list(self.sessions.items()):
            if ws in self._idle_closed:
                continue
            errored = isinstance(session, AudioHookSession) and session.state is State.ERROR
            wait = ERROR_CLOSE_WAIT_S if errored else self.settings.gateway_idle_timeout_s
            if now - self._last_seen.get(ws, now) < wait:
                continue
            self._idle_closed.add(ws)
            if errored:
                assert isinstance(session, AudioHookSession)
                code, why = ((session.error.code, session.error.detail) if session.error
                             else (CLOSE_POLICY, "unauthorized"))
                self._spawn(ws.close(code, why[:120]))
            else:
                self.metrics.protocol_errors.labels(session.protocol, "idle").inc()
                log.warning("%s: nothing received for %.0f s, closing", session.name, wait)
                self._spawn(ws.close(CLOSE_IDLE, "idle timeout"))

    async def _close_after_flush(self, ws: ServerConnection, session: AudioHookSession) -> None:
        """``closed`` once the session's audio is acknowledged by Kafka (bounded), then the socket closes."""
        deadline = time.monotonic() + self.settings.gateway_close_flush_s
        while not self.outbox.call_flushed(session.call_id) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await self._send(ws, session.closed_message())
        await ws.close(CLOSE_NORMAL)

    async def _tick(self) -> None:
        """Calls past their end grace end; AudioHook sessions paused for back-pressure resume."""
        while True:
            await asyncio.sleep(TICK_S)
            try:
                self.calls.tick()
                self._close_idle(time.monotonic())
                for ws, session in list(self.sessions.items()):
                    if isinstance(session, AudioHookSession):
                        await self._send(ws, session.check_flow())
            except Exception:  # a bug here must not stop every later call from ending
                log.exception("gateway timer failed; it goes on")

    async def _send(self, ws: ServerConnection, replies: list[dict[str, Any]]) -> None:
        for reply in replies:
            with contextlib.suppress(ConnectionClosed):
                await ws.send(json.dumps(reply))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class _Ended:
    """The socket gave no message: why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _protocol_of(path: str) -> str | None:
    """``twilio`` for /twilio and /twilio/<anything> (a per-call path a load balancer can route on), ..."""
    first = path.split("/", 2)[1] if path.startswith("/") else ""
    return first if first in PROTOCOLS else None


def signed_call_sid(path: str) -> str:
    """The call SID of a per-call Twilio path, ``/twilio/<CallSid>`` (a query string aside), else ""."""
    parts = path.partition("?")[0].split("/")
    return parts[2] if len(parts) == 3 and parts[1] == "twilio" else ""


def _lower(headers: CIMultiDict[str]) -> dict[str, str]:
    """Header names lower-cased; a repeated header keeps its first value."""
    out: dict[str, str] = {}
    for name, value in headers.items():
        out.setdefault(name.lower(), value)
    return out


def _peer(connection: Any) -> str:
    address = getattr(connection, "remote_address", None)  # not known before the upgrade in every server
    return str(address[0]) if address else "?"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _tls_context(settings: Settings) -> ssl.SSLContext | None:
    if settings.gateway_tls_cert is None or settings.gateway_tls_key is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(settings.gateway_tls_cert), str(settings.gateway_tls_key))
    return context
