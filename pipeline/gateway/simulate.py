"""`callqa gateway simulate`: recordings sent to a gateway as live calls, over real websockets, signed.

What a contact center's platform would send, so a deployment (or the tests, or the benchmark) can be
tried without a phone: each recording is one call (stereo: left = agent, right = customer, as
``callqa replay`` reads it), cut into 20 ms μ-law chunks.

- **Twilio Media Streams**: ``connected``, ``start`` (a generated ``callSid``, custom parameters
  ``tenant``, ``agent_id``, ``queue``, ``callqa_inbound_leg``), one ``media`` message per track per
  20 ms (base64 μ-law, ``timestamp`` in ms since the stream began), ``stop``. The stream goes to
  ``/twilio/<callSid>`` (the path a load balancer hashes on), signed with ``X-Twilio-Signature``.
  A hold sends nothing (the timestamps jump past it, as the audio does).
- **Genesys AudioHook v2**: ``open`` offering PCMU stereo [external, internal] (a generated
  ``conversationId``), binary frames interleaved in that order, ``ping`` every 5 s, ``paused`` /
  ``resumed{discarded}`` around a hold, the gateway's ``pause``/``resume`` obeyed, ``close`` answered by
  ``closed``. Signed with ``X-API-KEY`` and the RFC 9421 signature.
- **SIPREC** (RFC 7866): a recording session as an SBC opens it (``siprec.client.record``: INVITE with SDP
  and metadata, the digest challenge answered with the first of ``CALLQA_SIPREC_USERS``, ACK, both legs as
  PCMU RTP in 20 ms packets, BYE) to ``sip:HOST:PORT[;transport=tcp]``; the Call-ID is the call ID. The
  client is blocking, so each call has a thread of its own. A hold's audio is sent as audio.

``realtime`` sends each chunk when its audio has happened (as replay and the platforms do); otherwise as
fast as the gateway takes it (websocket back-pressure, and AudioHook's ``pause``); SIPREC's RTP has no
back-pressure, so it goes at ``SIPREC_FAST_SPEED`` times real time.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

import numpy as np
import uvloop
from picows.websockets import ClientConnection, ConnectionClosed, InvalidStatus, connect
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pipeline.gateway.auth import audiohook_signed_headers, twilio_signature
from pipeline.ingest.replay import CallRecording, ReplayOptions, load_recording

if TYPE_CHECKING:
    from pipeline.config import Settings

Protocol = Literal["twilio", "audiohook", "siprec"]
FRAME_MS = 20
FRAME_SAMPLES = 160  # 20 ms at 8 kHz, one μ-law byte a sample
SAMPLE_RATE = 8000
PING_INTERVAL_S = 5.0  # Genesys pings every 5 s
REPLY_TIMEOUT_S = 10.0  # opened within 5 s, closed within 10 s: Genesys's deadlines, with room
CHANNEL_LEG = {"external": "customer", "internal": "agent"}  # AudioHook's channel names
# SIPREC --fast: RTP has no flow control, so "as fast as the gateway takes it" is a pace. 8x real time is
# 400 packets a second per stream, far below what fills a stream's 256 KB socket buffer while the event
# loop is busy, and it keeps a leg's 2 s buffer (gateway_leg_buffer_s) 250 ms ahead of a slow Kafka ack.
SIPREC_FAST_SPEED = 8.0


class SimulationError(RuntimeError):
    """A call could not be sent (refused handshake, a gateway disconnect): one line, no traceback."""


@dataclass(frozen=True)
class SimulateOptions:
    protocol: Protocol
    url: str = "ws://127.0.0.1:8765"  # a bare host:port gets /twilio/<callSid> or /audiohook; SIPREC: sip:HOST:PORT
    calls: int = 0  # 0: one call per recording
    realtime: bool = True
    tenant: str = "demo"
    queue: str = "support"
    inbound_leg: str = "customer"  # Twilio: which leg the inbound track is
    twilio_auth_token: str = ""
    audiohook_api_key: str = ""
    audiohook_client_secret: str = ""
    siprec_user: str = ""  # digest credentials, when the SIPREC server challenges
    siprec_password: str = ""
    organization_id: str = ""  # AudioHook's signed organization, which is the call's tenant; default: tenant
    stagger_s: float = 0.0  # calls begin this far apart (the benchmark spreads its legs' frames)
    call_ids: tuple[str, ...] = ()  # the calls' IDs (callSid / conversationId); default: generated
    keep_going: bool = False  # a call that fails is counted in the report, the others go on (benchmark)

    @property
    def organization(self) -> str:
        """AudioHook's organization header (the gateway refuses a customConfig.tenant naming another)."""
        return self.organization_id or self.tenant


@dataclass
class SimulatedCall:
    call_id: str
    source: str
    frames: dict[str, int] = field(default_factory=dict)  # leg -> frames sent (holds excluded)


@dataclass
class SimulationReport:
    calls: list[SimulatedCall] = field(default_factory=list)
    elapsed_s: float = 0.0
    lateness_s: list[float] = field(default_factory=list)  # realtime: how late each chunk went out
    failures: list[str] = field(default_factory=list)  # with keep_going: why calls ended early

    @property
    def call_ids(self) -> list[str]:
        return [c.call_id for c in self.calls]

    @property
    def frames_sent(self) -> int:
        return sum(sum(c.frames.values()) for c in self.calls)


def recordings_of(paths: list[Path]) -> list[CallRecording]:
    """The files as replay reads them (μ-law, 8 kHz, left = agent, right = customer), with their holds
    when a file is a call of the call library."""
    from pipeline.eval.call_library import LibraryNotBuilt, holds_of, load_manifest

    try:
        holds = {Path(c["file"]).name: holds_of(c) for c in load_manifest()["calls"]}
    except (LibraryNotBuilt, KeyError, OSError):
        holds = {}
    recordings = []
    for path in paths:
        rec = load_recording(path, ReplayOptions(encoding="mulaw"))
        rec.holds_ms = holds.get(Path(path).name, [])
        recordings.append(rec)
    return recordings


async def simulate(recordings: list[CallRecording], options: SimulateOptions,
                   on_frames: Callable[[int], None] | None = None) -> SimulationReport:
    """Send the calls at once (each its own websocket); returns their IDs and what was sent. Raises
    SimulationError on the first call the gateway refuses or disconnects."""
    n = options.calls or len(recordings)
    if options.call_ids and len(options.call_ids) != n:
        raise ValueError(f"{len(options.call_ids)} call ids for {n} calls")
    report = SimulationReport()
    began = time.monotonic()
    tasks = []
    threads = ThreadPoolExecutor(n, "siprec-call") if options.protocol == "siprec" else None
    for i in range(n):
        rec = recordings[i % len(recordings)]
        call = SimulatedCall(options.call_ids[i] if options.call_ids else new_call_id(options.protocol), rec.source)
        report.calls.append(call)
        start_at = began + i * options.stagger_s
        if threads is not None:
            tasks.append(asyncio.create_task(_siprec_call(rec, call, options, report, threads, on_frames, start_at)))
            continue
        sender = _TwilioCall if options.protocol == "twilio" else _AudioHookCall
        tasks.append(asyncio.create_task(sender(rec, call, options, report, on_frames).run(start_at)))
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if threads is not None:
            threads.shutdown(wait=False)  # a session already sending finishes in its thread
    report.elapsed_s = time.monotonic() - began
    return report


def new_call_id(protocol: Protocol) -> str:
    """A call ID as the platform makes them: a Twilio callSid, an AudioHook conversationId, a SIP Call-ID."""
    if protocol == "siprec":
        return f"{uuid.uuid4().hex}@src.callqa.test"
    return "CA" + uuid.uuid4().hex if protocol == "twilio" else str(uuid.uuid4())


def sip_target(url: str) -> tuple[str, int, Literal["udp", "tcp"]]:
    """``sip:HOST:PORT[;transport=udp|tcp]`` (the port 5060 when left out) as (host, port, transport)."""
    rest = url.removeprefix("sip:")
    address, *params = rest.split(";")
    host, colon, port = address.rpartition(":")
    if not colon:
        host, port = address, "5060"
    transport = next((p.split("=", 1)[1].lower() for p in params if p.lower().startswith("transport=")), "udp")
    if not host or not port.isdigit() or not 0 < int(port) < 65536 or transport not in ("udp", "tcp"):
        raise SimulationError(f"--url {url!r} is not sip:HOST:PORT[;transport=udp|tcp]")
    return host.strip("[]"), int(port), "tcp" if transport == "tcp" else "udp"


async def _siprec_call(rec: CallRecording, call: SimulatedCall, options: SimulateOptions, report: SimulationReport,
                       threads: ThreadPoolExecutor, on_frames: Callable[[int], None] | None, start_at: float) -> None:
    """One call as a SIPREC session: ``client.record`` (blocking) in a thread of its own."""
    from pipeline.gateway.siprec.client import ClientError, SrcOptions, record
    from pipeline.gateway.siprec.recorder import call_id_for

    host, port, transport = sip_target(options.url)
    src = SrcOptions(host, port, transport, user=options.siprec_user, password=options.siprec_password,
                     speed=1.0 if options.realtime else SIPREC_FAST_SPEED)
    legs = {leg: rec.encoded.get(leg, b"") for leg in ("customer", "agent")}
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    try:
        await asyncio.get_running_loop().run_in_executor(threads, record, src, legs["customer"], legs["agent"],
                                                         call.call_id)
    except (ClientError, OSError) as exc:
        verb = "refused the siprec session" if isinstance(exc, ClientError) and exc.status else "did not take call"
        failure = SimulationError(f"the gateway at {options.url} {verb} {call.call_id}: {exc}")
        if not options.keep_going:
            raise failure from None
        report.failures.append(str(failure))
        return
    call.frames = {leg: -(-len(audio) // FRAME_SAMPLES) for leg, audio in legs.items() if audio}
    # The ID callqa keeps: the SIP Call-ID scoped by the digest user's tenant, as the server names it.
    call.call_id = call_id_for(options.siprec_user, call.call_id) or call.call_id
    if on_frames is not None:
        on_frames(sum(call.frames.values()))


def endpoint(base: str, protocol: Protocol, call_id: str) -> str:
    """The URL a call's stream goes to: ``base`` as given when it names a path, else the protocol's
    path (Twilio's with the call ID, for sticky routing)."""
    parts = urlsplit(base)
    if parts.path.strip("/"):
        return base
    root = base.rstrip("/")
    return f"{root}/twilio/{call_id}" if protocol == "twilio" else f"{root}/audiohook"


def _agent_id(rec: CallRecording) -> str:
    return f"agent-{zlib.crc32(rec.source.encode()) % 100:02d}"  # as replay names it


def _iso(samples: int) -> str:
    return f"PT{samples / SAMPLE_RATE:.3f}S"


class _CallSender:
    """One call's stream: the frame schedule and pacing shared by both protocols."""

    protocol: Protocol

    def __init__(self, rec: CallRecording, call: SimulatedCall, options: SimulateOptions,
                 report: SimulationReport, on_frames: Callable[[int], None] | None) -> None:
        self.rec = rec
        self.call = call
        self.options = options
        self.report = report
        self.on_frames = on_frames
        self.legs = [leg for leg in ("agent", "customer") if leg in rec.encoded]
        self.n_frames = max(-(-len(rec.encoded[leg]) // FRAME_SAMPLES) for leg in self.legs)
        self.url = endpoint(options.url, options.protocol, call.call_id)

    async def run(self, start_at: float) -> None:
        try:
            await self.send(start_at)
        except SimulationError as exc:
            if not self.options.keep_going:
                raise
            self.report.failures.append(str(exc))

    async def send(self, start_at: float) -> None:
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        try:
            # No websocket keepalive pings: the platforms' streams have none (AudioHook pings in its own
            # messages), and a gateway busy past 20 s must not have its calls dropped by the simulator.
            async with connect(self.url, additional_headers=self.headers(), compression=None, ping_interval=None,
                               open_timeout=REPLY_TIMEOUT_S, max_size=2**20) as ws:
                await self.converse(ws)
        except InvalidStatus as exc:
            # picows keeps the refusal's body on the error it wraps, not on the response it converts
            raw = exc.response.body or getattr(exc.__cause__, "raw_body", None) or b""
            body = bytes(raw).decode(errors="replace").strip()
            raise SimulationError(f"the gateway refused the {self.options.protocol} handshake at {self.url}: "
                                  f"HTTP {exc.response.status_code}{f' ({body})' if body else ''}") from None
        except (OSError, TimeoutError) as exc:
            raise SimulationError(f"cannot reach the gateway at {self.url}: {exc}") from None
        except ConnectionClosed as exc:
            raise SimulationError(f"the gateway closed call {self.call.call_id}: {exc}") from None

    def headers(self) -> dict[str, str]:
        raise NotImplementedError

    async def converse(self, ws: ClientConnection) -> None:
        raise NotImplementedError

    def chunk(self, leg: str, k: int) -> bytes:
        return self.rec.encoded[leg][k * FRAME_SAMPLES:(k + 1) * FRAME_SAMPLES]

    async def pace(self, began: float, k: int) -> None:
        """Realtime: wait until frame k's audio has happened (its end), and note how late we are."""
        if not self.options.realtime:
            return
        due = began + (k + 1) * FRAME_MS / 1000
        wait = due - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        self.report.lateness_s.append(max(0.0, time.monotonic() - due))

    def sent(self, leg: str) -> None:
        self.call.frames[leg] = self.call.frames.get(leg, 0) + 1
        if self.on_frames is not None:
            self.on_frames(1)


class _TwilioCall(_CallSender):
    def headers(self) -> dict[str, str]:
        token = self.options.twilio_auth_token
        return {"X-Twilio-Signature": twilio_signature(token, self.url)} if token else {}

    async def converse(self, ws: ClientConnection) -> None:
        tracks = _twilio_tracks(self.options.inbound_leg)
        stream_sid = "MZ" + uuid.uuid4().hex
        tail = stream_sid + '"}'
        await ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
        custom = {"tenant": self.options.tenant, "agent_id": _agent_id(self.rec), "queue": self.options.queue,
                  "callqa_inbound_leg": self.options.inbound_leg}
        await ws.send(json.dumps({"event": "start", "sequenceNumber": "1", "streamSid": stream_sid, "start": {
            "streamSid": stream_sid, "accountSid": "AC" + "0" * 32, "callSid": self.call.call_id,
            "tracks": [tracks[leg] for leg in self.legs], "customParameters": custom,
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": SAMPLE_RATE, "channels": 1}}}))
        media, last_seq = _twilio_media(self.rec, self.legs, tracks, self.n_frames)
        began = time.monotonic()
        for k, messages in enumerate(media):
            if messages is None:
                continue  # on hold: Twilio sends nothing; the next timestamp says how long it was
            await self.pace(began, k)
            for leg, head in messages:
                await ws.send(head + tail)
                self.sent(leg)
        await ws.send(json.dumps({"event": "stop", "sequenceNumber": str(last_seq + 1), "streamSid": stream_sid,
                                  "stop": {"accountSid": "AC" + "0" * 32, "callSid": self.call.call_id}}))


def _twilio_tracks(inbound_leg: str) -> dict[str, str]:
    outbound = "agent" if inbound_leg == "customer" else "customer"
    return {inbound_leg: "inbound", outbound: "outbound"}


# Per recording and track mapping: every call sent from it carries the same media messages but for its
# streamSid, so they are encoded once (JSON and base64 per message were a fifth of a simulator's CPU,
# and the benchmark's simulators must offer a thousand legs from one core).
_MEDIA: dict[tuple[int, str], tuple[CallRecording, list[list[tuple[str, str]] | None], int]] = {}


def _twilio_media(rec: CallRecording, legs: Sequence[str], tracks: dict[str, str],
                  n_frames: int) -> tuple[list[list[tuple[str, str]] | None], int]:
    """For each 20 ms frame, None on hold, else the (leg, message up to its streamSid's value) to send;
    and the last sequenceNumber (the start is 1)."""
    key = (id(rec), ",".join(f"{leg}={track}" for leg, track in sorted(tracks.items())))
    cached = _MEDIA.get(key)
    if cached is not None and cached[0] is rec:
        return cached[1], cached[2]
    seq, chunks = 1, dict.fromkeys(legs, 0)
    media: list[list[tuple[str, str]] | None] = []
    for k in range(n_frames):
        if rec.on_hold(k * FRAME_MS, (k + 1) * FRAME_MS):
            media.append(None)
            continue
        messages = []
        for leg in legs:
            payload = rec.encoded[leg][k * FRAME_SAMPLES:(k + 1) * FRAME_SAMPLES]
            if not payload:
                continue
            seq += 1
            chunks[leg] += 1
            body = json.dumps({"event": "media", "sequenceNumber": str(seq), "media": {
                "track": tracks[leg], "chunk": str(chunks[leg]), "timestamp": str(k * FRAME_MS),
                "payload": base64.b64encode(payload).decode()}})
            messages.append((leg, body[:-1] + ', "streamSid": "'))
        media.append(messages)
    if len(_MEDIA) >= 32:  # a long run over many files: keep the memory bounded
        _MEDIA.clear()
    _MEDIA[key] = (rec, media, seq)
    return media, seq


class _AudioHookCall(_CallSender):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.session_id = str(uuid.uuid4())
        # external first, as Genesys offers it; a mono recording is the one channel of its leg
        self.channels = [c for c in ("external", "internal") if CHANNEL_LEG[c] in self.legs]
        self.seq = 0
        self.serverseq = 0
        self.position = 0  # samples sent or discarded
        self.flowing = asyncio.Event()  # cleared while the gateway has us paused
        self.flowing.set()
        self.replies: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.failure: str | None = None
        # The channels interleaved sample by sample once, in the offered order; a shorter leg ends in
        # μ-law silence.
        n = max(len(self.rec.encoded[CHANNEL_LEG[c]]) for c in self.channels)
        self.interleaved = np.stack([np.frombuffer(self.rec.encoded[CHANNEL_LEG[c]].ljust(n, b"\xff"), np.uint8)
                                     for c in self.channels], axis=1).tobytes()

    def headers(self) -> dict[str, str]:
        parts = urlsplit(self.url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        return audiohook_signed_headers(
            parts.netloc, target, self.options.audiohook_api_key, self.options.audiohook_client_secret,
            {"audiohook-organization-id": self.options.organization, "audiohook-session-id": self.session_id,
             "audiohook-correlation-id": str(uuid.uuid4())})

    def message(self, kind: str, parameters: dict[str, Any] | None = None) -> str:
        self.seq += 1
        return json.dumps({"version": "2", "id": self.session_id, "type": kind, "seq": self.seq,
                           "serverseq": self.serverseq, "position": _iso(self.position),
                           "parameters": parameters or {}})

    async def converse(self, ws: ClientConnection) -> None:
        reader = asyncio.create_task(self.read(ws))
        pinger = asyncio.create_task(self.ping(ws))
        try:
            await self.request(ws, "open", "opened", {
                "organizationId": self.options.organization, "conversationId": self.call.call_id,
                "participant": {"id": str(uuid.uuid4()), "ani": "", "aniName": "", "dnis": ""},
                "media": [{"type": "audio", "format": "PCMU", "channels": self.channels, "rate": SAMPLE_RATE}],
                "language": "en-US",
                "customConfig": {"tenant": self.options.tenant, "agent_id": _agent_id(self.rec),
                                 "queue": self.options.queue}})
            await self.stream(ws)
            await self.request(ws, "close", "closed", {"reason": "end"})
        finally:
            pinger.cancel()
            reader.cancel()
            await asyncio.gather(pinger, reader, return_exceptions=True)

    async def stream(self, ws: ClientConnection) -> None:
        began = time.monotonic()
        held_from: int | None = None
        for k in range(self.n_frames):
            if self.rec.on_hold(k * FRAME_MS, (k + 1) * FRAME_MS):
                if held_from is None:
                    held_from = self.position
                    await ws.send(self.message("paused"))
                self.position += FRAME_SAMPLES
                continue
            if held_from is not None:  # a PCI-style pause: its audio is discarded, the clock moves on
                await self.pace(began, k - 1)
                await ws.send(self.message("resumed", {"start": _iso(held_from),
                                                       "discarded": _iso(self.position - held_from)}))
                held_from = None
            await self.pace(began, k)
            await self.flowing.wait()
            self.check_failure()
            width = len(self.channels)
            data = self.interleaved[k * FRAME_SAMPLES * width:(k + 1) * FRAME_SAMPLES * width]
            await ws.send(data)
            self.position += len(data) // width
            for c in self.channels:
                self.sent(CHANNEL_LEG[c])

    async def request(self, ws: ClientConnection, kind: str, answer: str, parameters: dict[str, Any]) -> None:
        reply = asyncio.get_running_loop().create_future()
        self.replies[answer] = reply
        await ws.send(self.message(kind, parameters))
        try:
            await asyncio.wait_for(reply, REPLY_TIMEOUT_S)
        except TimeoutError:
            self.check_failure()
            raise SimulationError(f"call {self.call.call_id}: no {answer} within {REPLY_TIMEOUT_S:.0f} s") from None
        self.check_failure()

    async def read(self, ws: ClientConnection) -> None:
        async for text in ws:
            message = json.loads(text)
            self.serverseq = int(message.get("seq", self.serverseq))
            kind = message.get("type")
            if kind == "pause":  # back-pressure: stop sending until resume
                self.flowing.clear()
                await ws.send(self.message("paused"))
            elif kind == "resume":
                await ws.send(self.message("resumed", {"start": _iso(self.position), "discarded": "PT0S"}))
                self.flowing.set()
            elif kind == "disconnect":
                info = message.get("parameters", {})
                self.failure = f"{info.get('reason', '?')}: {info.get('info', '')}".strip(": ")
                self.flowing.set()
                for reply in self.replies.values():
                    if not reply.done():
                        reply.set_result(message)
            elif kind in self.replies and not self.replies[kind].done():
                self.replies[kind].set_result(message)

    async def ping(self, ws: ClientConnection) -> None:
        while True:
            await asyncio.sleep(PING_INTERVAL_S)
            await ws.send(self.message("ping"))

    def check_failure(self) -> None:
        if self.failure is not None:
            raise SimulationError(f"the gateway disconnected call {self.call.call_id}: {self.failure}")


def options_from_settings(settings: Settings, protocol: Protocol, url: str, calls: int,
                          realtime: bool) -> SimulateOptions:
    """Signed with the secrets the gateway checks (CALLQA_TWILIO_AUTH_TOKEN, CALLQA_AUDIOHOOK_API_KEY,
    CALLQA_AUDIOHOOK_CLIENT_SECRET), read the same way; SIPREC's digest answered as the first user of
    CALLQA_SIPREC_USERS."""
    from pipeline.gateway.siprec.digest import DigestError, parse_users

    try:
        users = parse_users(settings.siprec_users.get_secret_value())
    except DigestError as exc:
        raise SimulationError(f"CALLQA_SIPREC_USERS: {exc}") from None
    user, password = next(iter(users.items()), ("", ""))
    return SimulateOptions(protocol, url=url, calls=calls, realtime=realtime,
                           twilio_auth_token=settings.twilio_auth_token.get_secret_value(),
                           audiohook_api_key=settings.audiohook_api_key.get_secret_value(),
                           audiohook_client_secret=settings.audiohook_client_secret.get_secret_value(),
                           siprec_user=user, siprec_password=password)


def run_with_progress(recordings: list[CallRecording], options: SimulateOptions,
                      console: Console) -> SimulationReport:
    """``simulate`` with a rich progress bar of the frames sent; prints a one-line summary."""
    total = sum(max(-(-len(r.encoded[leg]) // FRAME_SAMPLES) for leg in r.encoded) * len(r.encoded)
                for r in (recordings[i % len(recordings)] for i in range(options.calls or len(recordings))))
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        task = progress.add_task(f"{options.protocol}: {options.calls or len(recordings)} calls", total=total)
        report = uvloop.run(simulate(recordings, options, lambda n: progress.advance(task, n)))
    pace = "in real time" if options.realtime else "as fast as the gateway took them" \
        if options.protocol != "siprec" else f"at {SIPREC_FAST_SPEED:g}x real time"
    console.print(f"sent {len(report.calls)} calls ({report.frames_sent:,} frames) {pace} "
                  f"in {report.elapsed_s:.1f} s to {options.url}")
    return report
