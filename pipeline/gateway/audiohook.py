"""Genesys Cloud AudioHook Monitor, protocol version 2: one websocket is one session of one conversation.

The client's text messages (``open``, ``ping``, ``paused``, ``resumed``, ``discarded``, ``update``,
``error``, ``close``) carry ``seq`` (checked: last + 1), ``serverseq`` and the session ``id``; the
server's (``opened``, ``pong``, ``pause``, ``resume``, ``updated``, ``closed``, ``disconnect``) carry
``seq`` and ``clientseq``. Binary messages are audio: whole samples, the chosen ``channels`` interleaved
in the order ``opened`` named them (external = customer, internal = agent).

- A probe (all-zero conversationId) is answered ``opened`` and ``closed`` and produces nothing.
- A client pause (``paused`` ... ``resumed``) the gateway did not ask for is a PCI pause: no frames for
  it, the legs' clocks move on by the audio the client reports discarded, and the call's lifecycle sink
  hears ``call_held``/``call_resumed``. A pause the gateway asked for (its leg buffers near full) only
  moves the clocks on.
- ``close`` is answered ``closed`` once the session's audio reached Kafka (the server shell waits for
  that, bounded by ``gateway_close_flush_s``); the call ends after the grace, as for any stream.
- Bad input (malformed JSON, unknown types, wrong seq, partial samples, audio of more than a second,
  audio before ``opened``) gets ``disconnect`` with reason ``error``; the shell then closes the socket.
"""

from __future__ import annotations

import enum
import json
import logging
import re
import uuid
from typing import Any

from pipeline.contracts.messages import Leg
from pipeline.gateway.calls import Attachment, CallInfo, OpenCalls
from pipeline.gateway.metrics import GatewayMetrics
from pipeline.gateway.protocol import (
    CLOSE_INVALID_DATA,
    CLOSE_POLICY,
    CLOSE_TOO_BIG,
    CLOSE_UNSUPPORTED,
    MAX_FRAME_SAMPLES,
    ProtocolError,
)
from pipeline.gateway.timeline import SAMPLE_RATE

log = logging.getLogger("callqa.gateway")

PROBE_CONVERSATION = "00000000-0000-0000-0000-000000000000"
CHANNEL_LEGS: dict[str, Leg] = {"external": "customer", "internal": "agent"}
# Ask for a pause when a leg buffer is this full, and for a resume once it drained to this.
PAUSE_AT = 0.75
RESUME_AT = 0.25
_DURATION = re.compile(r"^PT(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?$")

ServerMessage = dict[str, Any]


class State(enum.Enum):
    PREPARING = "preparing"  # before open
    ACTIVE = "active"
    PAUSED = "paused"
    CLOSING = "closing"  # close received; closed not yet sent
    CLOSED = "closed"
    ERROR = "error"  # disconnect sent; waiting for the client to close


class AudioHookSession:
    protocol = "audiohook"

    def __init__(self, calls: OpenCalls, metrics: GatewayMetrics, stream_id: str, *, session_id: str = "",
                 organization_id: str = "") -> None:
        self.calls = calls
        self.metrics = metrics
        self.stream_id = stream_id
        self.id = session_id  # from the audiohook-session-id header; else the first message's
        self.organization_id = organization_id  # from the signed header: open must name the same one
        self.state = State.PREPARING
        self.seq = 0
        self.clientseq = 0
        self.channels: list[str] = []
        self.probe = False
        self.attachment: Attachment | None = None
        self.samples = 0  # the session's audio clock: samples received plus samples discarded
        self.pauses_asked = 0  # pause messages sent and not yet answered by paused
        self.backpressure_paused = False
        self.pci_pause = False
        self.close_reason = ""
        self.error: ProtocolError | None = None

    @property
    def call_id(self) -> str:
        return self.attachment.call_id if self.attachment else ""

    @property
    def name(self) -> str:
        return f"audiohook session {self.id or self.stream_id}" + (f" call {self.call_id}" if self.call_id else "")

    # ---- input -----------------------------------------------------------------------------------------
    def on_text(self, text: str) -> list[ServerMessage]:
        if self.state in (State.ERROR, State.CLOSED):
            return self._after_end(text)
        try:
            message = self._checked(text)
            return self._dispatch(message["type"], message.get("parameters") or {})
        except ProtocolError as err:
            return self._fail(err)

    def on_binary(self, data: bytes) -> list[ServerMessage]:
        if self.state in (State.ERROR, State.CLOSED, State.CLOSING):
            return []
        if self.state is State.PAUSED:
            self.metrics.messages_ignored.labels(self.protocol, "audio_while_paused").inc()
            return []
        try:
            self._on_audio(data)
        except ProtocolError as err:
            return self._fail(err)
        return self.check_flow()

    def check_flow(self) -> list[ServerMessage]:
        """Back-pressure: ``pause`` when the call's leg buffers are near full, ``resume`` once drained."""
        if self.attachment is None or self.state not in (State.ACTIVE, State.PAUSED):
            return []
        fullness = self.calls.sink.buffered_fraction(self.attachment.call_id)
        if not self.backpressure_paused and fullness >= PAUSE_AT:
            self.backpressure_paused = True
            self.pauses_asked += 1
            self.metrics.pauses.labels("backpressure").inc()
            log.info("%s: Kafka is behind (leg buffer %.0f %% full), pausing the client", self.name, 100 * fullness)
            return [self._message("pause")]
        if self.backpressure_paused and fullness <= RESUME_AT:
            self.backpressure_paused = False
            log.info("%s: leg buffers drained, resuming the client", self.name)
            return [self._message("resume")]
        return []

    def closed_message(self) -> list[ServerMessage]:
        """``closed``, once the shell has flushed the session's audio."""
        if self.state is not State.CLOSING:
            return []
        self.state = State.CLOSED
        return [self._message("closed")]

    def socket_closed(self, reason: str) -> None:
        if self.attachment is not None:
            self.calls.detach(self.stream_id, self.attachment.call_id, self.close_reason or reason)

    # ---- messages --------------------------------------------------------------------------------------
    def _checked(self, text: str) -> dict[str, Any]:
        try:
            message = json.loads(text)
        except ValueError:
            raise ProtocolError(CLOSE_INVALID_DATA, "malformed", "malformed JSON") from None
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            raise ProtocolError(CLOSE_INVALID_DATA, "malformed", "not an AudioHook message (no type)")
        if message.get("version") != "2":
            raise ProtocolError(CLOSE_UNSUPPORTED, "version", "protocol version is not 2")
        seq = message.get("seq")
        if not isinstance(seq, int) or seq != self.clientseq + 1:
            raise ProtocolError(CLOSE_POLICY, "sequence", f"seq {seq!r} where {self.clientseq + 1} was due")
        self.clientseq = seq
        serverseq = message.get("serverseq", 0)
        if not isinstance(serverseq, int) or serverseq > self.seq:
            raise ProtocolError(CLOSE_POLICY, "sequence", f"serverseq {serverseq!r} beyond the server's {self.seq}")
        session_id = message.get("id")
        if not self.id and isinstance(session_id, str):
            self.id = session_id[:64]
        if session_id != self.id:
            raise ProtocolError(CLOSE_POLICY, "session_id", "message id differs from the session's")
        if not isinstance(message.get("parameters", {}), dict):
            raise ProtocolError(CLOSE_INVALID_DATA, "malformed", "parameters is not an object")
        return message

    def _dispatch(self, kind: str, params: dict[str, Any]) -> list[ServerMessage]:
        if kind == "open":
            return self._on_open(params)
        if kind == "ping":
            return [self._message("pong")]
        if kind == "paused":
            return self._on_paused()
        if kind == "resumed":
            return self._on_resumed(params)
        if kind == "discarded":
            self._skip(_duration_samples(params.get("discarded")))
            return []
        if kind == "update":
            return [self._message("updated")]
        if kind == "error":
            self.metrics.messages_ignored.labels(self.protocol, "client_error").inc()
            code = params.get("code")
            log.warning("%s: client reported error %s", self.name, code if isinstance(code, int) else "?")
            return []
        if kind == "close":
            reason = params.get("reason")
            self.close_reason = f"close ({reason})" if isinstance(reason, str) and len(reason) < 32 else "close"
            self.state = State.CLOSING
            return []
        raise ProtocolError(CLOSE_POLICY, "unknown_type", f"unknown message type {kind[:32]!r}")

    def _on_open(self, params: dict[str, Any]) -> list[ServerMessage]:
        if self.state is not State.PREPARING:
            raise ProtocolError(CLOSE_POLICY, "state", "a second open")
        org = params.get("organizationId")
        if self.organization_id and org != self.organization_id:
            self.metrics.auth_failures.labels(self.protocol, "organization").inc()
            log.warning("%s: open names another organization than the signed header", self.name)
            self.state = State.ERROR
            return [self._message("disconnect", {"reason": "unauthorized", "info": "organization mismatch"})]
        conversation = _uuid(params.get("conversationId"), "conversationId")
        media = _choose_media(params.get("media"))
        self.channels = list(media["channels"])
        self.probe = conversation == PROBE_CONVERSATION
        if not self.probe:
            custom = params.get("customConfig")
            config: dict[str, Any] = custom if isinstance(custom, dict) else {}
            tenant = config.get("tenant")
            # The tenant scopes whose data the call becomes: the signed organization decides it, not the
            # free-form customConfig an integration's admin types. One naming another is refused, not renamed,
            # so a misconfigured integration is seen at once rather than filed under an unexpected tenant.
            if self.organization_id and tenant not in (None, "", self.organization_id):
                self.metrics.auth_failures.labels(self.protocol, "tenant").inc()
                log.warning("%s: customConfig.tenant names another tenant than the signed organization", self.name)
                self.state = State.ERROR
                return [self._message("disconnect", {
                    "reason": "unauthorized", "info": "customConfig.tenant is not the signed organization"})]
            info = CallInfo.bounded(self.organization_id or tenant or org, config.get("agent_id"), config.get("queue"))
            legs = [CHANNEL_LEGS[c] for c in self.channels]
            self.attachment = self.calls.attach(self.stream_id, conversation, info, legs)
        self.state = State.ACTIVE
        log.info("%s: opened (%s)%s", self.name, "+".join(self.channels), " probe" if self.probe else "")
        return [self._message("opened", {"media": [media], "startPaused": False})]

    def _on_paused(self) -> list[ServerMessage]:
        if self.state is not State.ACTIVE:
            return []  # paused again: the message is idempotent
        self.state = State.PAUSED
        if self.pauses_asked:
            self.pauses_asked -= 1
            return []
        self.pci_pause = True
        self.metrics.pauses.labels("pci").inc()
        if self.attachment is not None:
            self.calls.hold(self.attachment)
        return []

    def _on_resumed(self, params: dict[str, Any]) -> list[ServerMessage]:
        if self.state is not State.PAUSED:
            return []
        self.state = State.ACTIVE
        discarded = _duration_samples(params.get("discarded"))
        self._skip(discarded)
        if self.pci_pause:
            self.pci_pause = False
            self.metrics.holds_seconds.inc(discarded / SAMPLE_RATE)
            if self.attachment is not None:
                self.calls.unhold(self.attachment)
        return []

    def _on_audio(self, data: bytes) -> None:
        if self.state is State.PREPARING:
            raise ProtocolError(CLOSE_POLICY, "media_before_start", "audio before open")
        n = len(self.channels)
        if len(data) % n:
            raise ProtocolError(CLOSE_INVALID_DATA, "partial_samples",
                                f"{len(data)} bytes is not a whole number of {n}-channel PCMU samples")
        samples = len(data) // n
        if samples > MAX_FRAME_SAMPLES:
            raise ProtocolError(CLOSE_TOO_BIG, "too_long", "one audio message of more than a second")
        if self.attachment is not None:
            for i, channel in enumerate(self.channels):
                self.calls.write(self.attachment, CHANNEL_LEGS[channel], self.samples, data[i::n])
        self.samples += samples

    def _skip(self, samples: int) -> None:
        if self.attachment is not None:
            self.calls.skip(self.attachment, samples)
        self.samples += samples

    def _after_end(self, text: str) -> list[ServerMessage]:
        """After disconnect: only the client's close is answered (closed), so it can end cleanly."""
        try:
            message = json.loads(text)
        except ValueError:
            return []
        if isinstance(message, dict) and message.get("type") == "close" and self.state is State.ERROR:
            self.state = State.CLOSED
            return [self._message("closed")]
        return []

    def _fail(self, err: ProtocolError) -> list[ServerMessage]:
        self.error = err
        self.state = State.ERROR
        self.metrics.protocol_errors.labels(self.protocol, err.kind).inc()
        log.warning("%s: %s", self.name, err)
        return [self._message("disconnect", {"reason": "error", "info": err.detail})]

    def _message(self, kind: str, parameters: dict[str, Any] | None = None) -> ServerMessage:
        self.seq += 1
        return {"version": "2", "type": kind, "seq": self.seq, "clientseq": self.clientseq, "id": self.id,
                "parameters": parameters or {}}


def _uuid(value: Any, name: str) -> str:
    try:
        return str(uuid.UUID(value))
    except (TypeError, ValueError, AttributeError):
        raise ProtocolError(CLOSE_INVALID_DATA, "malformed", f"{name} is not a UUID") from None


def _choose_media(offered: Any) -> dict[str, Any]:
    """The first offer the gateway takes: PCMU at 8 kHz, channels among external and internal."""
    if not isinstance(offered, list):
        raise ProtocolError(CLOSE_INVALID_DATA, "malformed", "open without a media list")
    for media in offered:
        if not isinstance(media, dict):
            continue
        channels = media.get("channels")
        if (media.get("type") == "audio" and media.get("format") == "PCMU" and media.get("rate") == SAMPLE_RATE
                and isinstance(channels, list) and channels and len(set(channels)) == len(channels)
                and set(channels) <= set(CHANNEL_LEGS)):
            return {"type": "audio", "format": "PCMU", "channels": list(channels), "rate": SAMPLE_RATE}
    raise ProtocolError(CLOSE_UNSUPPORTED, "media_format",
                        "no offered media is PCMU at 8000 Hz with external/internal channels")


def _duration_samples(value: Any) -> int:
    """An ISO 8601 duration ("PT1.25S") as samples at 8 kHz."""
    match = _DURATION.match(value) if isinstance(value, str) else None
    if match is None:
        raise ProtocolError(CLOSE_INVALID_DATA, "malformed", "duration is not ISO 8601 (PT...S)")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    return round((hours * 3600 + minutes * 60 + seconds) * SAMPLE_RATE)
