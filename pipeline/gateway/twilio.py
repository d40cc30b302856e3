"""Twilio Media Streams (`<Start><Stream track="both_tracks">`): one websocket is one stream of one call.

Messages are JSON text: ``connected``, ``start`` (callSid, tracks, customParameters, mediaFormat),
``media`` (track, timestamp in ms since the stream began, base64 μ-law payload), ``stop``; ``dtmf`` and
``mark`` only come on bidirectional streams and are ignored. Twilio's ``inbound``/``outbound`` are
relative to Twilio, so which one is the customer comes from the custom parameter
``callqa_inbound_leg`` (``customer``, the default, or ``agent``). The call ID is the ``callSid``;
``tenant``, ``agent_id`` and ``queue`` are custom parameters; no other parameter is read (they may hold
phone numbers). Audio is placed by its ``timestamp``, so a lost chunk becomes silence, not a shift.
"""

from __future__ import annotations

import base64
import binascii
import logging
from typing import Any

import orjson

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

INBOUND_LEG_PARAMETER = "callqa_inbound_leg"
DEFAULT_INBOUND_LEG: Leg = "customer"
OTHER_LEG: dict[str, Leg] = {"customer": "agent", "agent": "customer"}
IGNORED_EVENTS = ("connected", "dtmf", "mark")


class TwilioStream:
    """One Twilio stream's state machine: text messages in, audio on its call out (through ``calls``)."""

    protocol = "twilio"

    def __init__(self, calls: OpenCalls, metrics: GatewayMetrics, stream_id: str,
                 signed_call_sid: str | None = None) -> None:
        self.calls = calls
        self.metrics = metrics
        self.stream_id = stream_id
        # The call SID of the signed URL (/twilio/<CallSid>) when the handshake's signature was checked: the
        # start's callSid must be it, else a captured signature would open or join any call.
        self.signed_call_sid = signed_call_sid
        self.attachment: Attachment | None = None
        self.legs_by_track: dict[str, Leg] = {}
        self.stream_sid = ""
        self.last_sequence = 0
        self.stopped = False

    @property
    def call_id(self) -> str:
        return self.attachment.call_id if self.attachment else ""

    @property
    def name(self) -> str:
        """How log lines name the session: the stream and call SIDs (Twilio's IDs, not phone numbers)."""
        return f"twilio stream {self.stream_sid or self.stream_id}" + (f" call {self.call_id}" if self.call_id else "")

    def on_binary(self, data: bytes) -> None:
        self._reported(ProtocolError(CLOSE_UNSUPPORTED, "binary", "binary message: Media Streams sends JSON text"))

    def on_text(self, text: str) -> None:
        """Take one message; bad input raises ``ProtocolError`` (counted and logged here), which ends
        the stream with its close code."""
        try:
            self._handle(text)
        except ProtocolError as err:
            self._reported(err)

    def _reported(self, err: ProtocolError) -> None:
        self.metrics.protocol_errors.labels(self.protocol, err.kind).inc()
        log.warning("%s: %s", self.name, err)
        raise err

    def _handle(self, text: str) -> None:
        message = _parse_json(text)
        event = message.get("event")
        if not isinstance(event, str):
            raise ProtocolError(CLOSE_INVALID_DATA, "malformed", "message without an event name")
        self._check_sequence(message)
        if event == "start":
            self._on_start(_object(message, "start"))
        elif event == "media":
            self._on_media(_object(message, "media"))
        elif event == "stop":
            self._on_stop()
        elif event in IGNORED_EVENTS:
            self.metrics.messages_ignored.labels(self.protocol, event).inc()
        else:
            # Twilio adds event types over time: an unknown one is noted, not fatal to a live call.
            self.metrics.messages_ignored.labels(self.protocol, "unknown").inc()
            log.info("%s: unknown event %r ignored", self.name, event[:32])

    def close(self, reason: str) -> None:
        """The socket closed (after ``stop``, or dropped, or closed by the gateway)."""
        if self.attachment is not None:
            self.calls.detach(self.stream_id, self.attachment.call_id, "stop" if self.stopped else reason)

    def _check_sequence(self, message: dict[str, Any]) -> None:
        if "sequenceNumber" not in message:
            return
        seq = _integer(message["sequenceNumber"], "sequenceNumber")
        if seq <= self.last_sequence:
            raise ProtocolError(CLOSE_POLICY, "sequence",
                                f"sequenceNumber {seq} after {self.last_sequence}: messages out of order")
        if seq > self.last_sequence + 1 and self.last_sequence:
            self.metrics.messages_ignored.labels(self.protocol, "sequence_gap").inc()
        self.last_sequence = seq

    def _on_start(self, start: dict[str, Any]) -> None:
        if self.attachment is not None:
            raise ProtocolError(CLOSE_POLICY, "state", "a second start on one stream")
        call_sid = start.get("callSid")
        if not isinstance(call_sid, str) or not call_sid.strip():
            raise ProtocolError(CLOSE_INVALID_DATA, "malformed", "start without a callSid")
        if self.signed_call_sid is not None and call_sid != self.signed_call_sid:
            raise ProtocolError(CLOSE_POLICY, "call_mismatch",
                                "the start's callSid is not the one in the signed URL (/twilio/<CallSid>)")
        _check_media_format(start.get("mediaFormat"))
        params = start.get("customParameters") or {}
        if not isinstance(params, dict):
            raise ProtocolError(CLOSE_INVALID_DATA, "malformed", "customParameters is not an object")
        inbound = params.get(INBOUND_LEG_PARAMETER, DEFAULT_INBOUND_LEG)
        if inbound not in OTHER_LEG:
            raise ProtocolError(CLOSE_POLICY, "parameter",
                                f"{INBOUND_LEG_PARAMETER} must be customer or agent")
        tracks = start.get("tracks") or ["inbound"]
        if not isinstance(tracks, list) or not set(tracks) <= {"inbound", "outbound"}:
            raise ProtocolError(CLOSE_INVALID_DATA, "malformed", "tracks must be inbound and/or outbound")
        by_track: dict[str, Leg] = {"inbound": inbound, "outbound": OTHER_LEG[inbound]}
        self.legs_by_track = {track: by_track[track] for track in tracks}
        sid = start.get("streamSid")
        self.stream_sid = sid[:64] if isinstance(sid, str) else ""
        info = CallInfo.bounded(params.get("tenant"), params.get("agent_id"), params.get("queue"))
        self.attachment = self.calls.attach(self.stream_id, call_sid[:128], info, self.legs_by_track.values())
        log.info("%s: started (%s%s)", self.name, ", ".join(f"{t}={leg}" for t, leg in self.legs_by_track.items()),
                 ", continues the call" if self.attachment.continued else "")

    def _on_media(self, media: dict[str, Any]) -> None:
        if self.attachment is None:
            raise ProtocolError(CLOSE_POLICY, "media_before_start", "media before start")
        if self.stopped:
            raise ProtocolError(CLOSE_POLICY, "state", "media after stop")
        track = media.get("track", "inbound")
        leg = self.legs_by_track.get(track) if isinstance(track, str) else None
        if leg is None:
            raise ProtocolError(CLOSE_POLICY, "track", "media for a track the stream did not start")
        payload = _decode_payload(media.get("payload"))
        at = _integer(media.get("timestamp"), "timestamp") * SAMPLE_RATE // 1000
        if not payload:
            return
        if not self.calls.write(self.attachment, leg, at, payload):
            # Another open stream of the call writes this leg already: two writers would garble it.
            self.metrics.messages_ignored.labels(self.protocol, "leg_taken").inc()

    def _on_stop(self) -> None:
        if self.attachment is None:
            raise ProtocolError(CLOSE_POLICY, "state", "stop before start")
        self.stopped = True
        # The stream is over now, not when its socket has closed: a stream continuing the call may
        # already be on its way (a transfer), and it must not be taken for a concurrent one.
        self.calls.detach(self.stream_id, self.attachment.call_id, "stop")


def _parse_json(text: str) -> dict[str, Any]:
    try:
        message = orjson.loads(text)  # every media message is JSON: orjson parses it in a third of json's time
    except ValueError:
        raise ProtocolError(CLOSE_INVALID_DATA, "malformed", "malformed JSON") from None
    if not isinstance(message, dict):
        raise ProtocolError(CLOSE_INVALID_DATA, "malformed", "message is not a JSON object")
    return message


def _object(message: dict[str, Any], name: str) -> dict[str, Any]:
    value = message.get(name)
    if not isinstance(value, dict):
        raise ProtocolError(CLOSE_INVALID_DATA, "malformed", f"{name} message without its {name!r} object")
    return value


def _integer(value: Any, name: str) -> int:
    """Twilio sends numbers as strings."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ProtocolError(CLOSE_INVALID_DATA, "malformed", f"{name} is not a number") from None
    if number < 0:
        raise ProtocolError(CLOSE_INVALID_DATA, "malformed", f"{name} is negative")
    return number


def _check_media_format(fmt: Any) -> None:
    if fmt is None:
        return  # Twilio always streams 8 kHz μ-law mono; older messages may leave the format out
    if not isinstance(fmt, dict):
        raise ProtocolError(CLOSE_INVALID_DATA, "malformed", "mediaFormat is not an object")
    encoding, rate, channels = fmt.get("encoding"), fmt.get("sampleRate"), fmt.get("channels", 1)
    if encoding != "audio/x-mulaw" or str(rate) != "8000" or str(channels) != "1":
        raise ProtocolError(CLOSE_UNSUPPORTED, "media_format",
                            "media format must be audio/x-mulaw, 8000 Hz, 1 channel")


def _decode_payload(payload: Any) -> bytes:
    if not isinstance(payload, str):
        raise ProtocolError(CLOSE_INVALID_DATA, "malformed", "media without a payload")
    try:
        audio = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError(CLOSE_INVALID_DATA, "malformed", "payload is not base64") from None
    if len(audio) > MAX_FRAME_SAMPLES:  # μ-law: a byte a sample
        raise ProtocolError(CLOSE_TOO_BIG, "too_long", "one media message of more than a second of audio")
    return audio
