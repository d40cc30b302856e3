"""Fixtures of the gateway tests: a recording sink and a manual clock for the core, message builders
for both protocols (as Twilio and Genesys send them), and an in-process gateway on the real broker."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.contracts.messages import AudioFrame, CallEvent

RECORDING = Path("/usr/share/sounds/alsa/Front_Center.wav")


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class RecordingSink:
    """A CallSink that keeps everything; ``fullness`` is what buffered_fraction answers."""

    starts: list[CallEvent] = field(default_factory=list)
    frames: list[AudioFrame] = field(default_factory=list)
    ends: list[CallEvent] = field(default_factory=list)
    holds: list[tuple[str, str, int]] = field(default_factory=list)  # (call, "held"/"resumed", ms)
    fullness: float = 0.0

    def call_started(self, event: CallEvent) -> None:
        self.starts.append(event)

    def frame(self, frame: AudioFrame) -> None:
        self.frames.append(frame)

    def buffered_fraction(self, call_id: str) -> float:
        return self.fullness

    def call_ended(self, event: CallEvent) -> None:
        self.ends.append(event)

    def call_held(self, call_id: str, at_ms: int) -> None:
        self.holds.append((call_id, "held", at_ms))

    def call_resumed(self, call_id: str, at_ms: int, held_ms: int) -> None:
        self.holds.append((call_id, "resumed", held_ms))

    def leg_frames(self, leg: str) -> list[AudioFrame]:
        return [f for f in self.frames if f.leg == leg]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def sink() -> RecordingSink:
    return RecordingSink()


@pytest.fixture
def metrics():  # type: ignore[no-untyped-def]
    from pipeline.gateway.metrics import GatewayMetrics

    return GatewayMetrics()


@pytest.fixture
def calls(sink: RecordingSink, metrics, clock: ManualClock):  # type: ignore[no-untyped-def]
    from pipeline.gateway.calls import OpenCalls

    return OpenCalls(sink, metrics, end_grace_s=5.0, clock=clock)


def _mulaw_audio(seconds: float, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 0xFF, int(seconds * 8000), dtype=np.uint8).tobytes()


@pytest.fixture
def mulaw_audio():  # type: ignore[no-untyped-def]
    """``mulaw_audio(seconds, seed=0)``: μ-law bytes with no 0xFF (μ-law silence), so that filled gaps
    are told from audio."""
    return _mulaw_audio


@pytest.fixture(scope="session")
def recording_mulaw() -> bytes:
    """A real recording (ALSA's test voice) at 8 kHz μ-law: what a phone leg carries."""
    from pipeline.audio import codecs
    from pipeline.audio.files import load_audio
    from pipeline.audio.resample import resample

    audio = load_audio(RECORDING)
    return codecs.encode(resample(audio.mono(), audio.sample_rate, 8000), "mulaw")


# ---- Twilio Media Streams messages ---------------------------------------------------------------------
class TwilioMessages:
    """One stream's messages as Twilio sends them (numbers as strings, sequenceNumber counting up)."""

    def __init__(self, call_sid: str, **custom: str) -> None:
        self.call_sid = call_sid
        self.stream_sid = "MZ" + uuid.uuid4().hex
        self.custom = custom
        self.seq = 0
        self.chunks = {"inbound": 0, "outbound": 0}

    def _next(self) -> str:
        self.seq += 1
        return str(self.seq)

    def connected(self) -> str:
        return json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"})

    def start(self, tracks: tuple[str, ...] = ("inbound", "outbound")) -> str:
        return json.dumps({"event": "start", "sequenceNumber": self._next(), "streamSid": self.stream_sid,
                           "start": {"streamSid": self.stream_sid, "accountSid": "AC" + "0" * 32,
                                     "callSid": self.call_sid, "tracks": list(tracks),
                                     "customParameters": self.custom,
                                     "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000,
                                                     "channels": 1}}})

    def media(self, track: str, timestamp_ms: int, payload: bytes) -> str:
        self.chunks[track] += 1
        return json.dumps({"event": "media", "sequenceNumber": self._next(), "streamSid": self.stream_sid,
                           "media": {"track": track, "chunk": str(self.chunks[track]),
                                     "timestamp": str(timestamp_ms),
                                     "payload": base64.b64encode(payload).decode()}})

    def stop(self) -> str:
        return json.dumps({"event": "stop", "sequenceNumber": self._next(), "streamSid": self.stream_sid,
                           "stop": {"accountSid": "AC" + "0" * 32, "callSid": self.call_sid}})

    def chunks_of(self, audio: dict[str, bytes], chunk_ms: int = 20) -> Iterator[str]:
        """Media messages of both tracks interleaved in time, ``chunk_ms`` each, as Twilio paces them."""
        step = chunk_ms * 8
        n = max(len(a) for a in audio.values())
        for at in range(0, n, step):
            for track, pcm in audio.items():
                if at < len(pcm):
                    yield self.media(track, at // 8, pcm[at:at + step])


@pytest.fixture
def twilio_messages():  # type: ignore[no-untyped-def]
    return TwilioMessages


# ---- Genesys AudioHook client messages -----------------------------------------------------------------
class AudioHookClient:
    """The client side of one AudioHook session's text messages (seq, serverseq, position kept)."""

    def __init__(self, conversation_id: str | None = None, organization_id: str | None = None,
                 session_id: str | None = None) -> None:
        self.session_id = session_id or str(uuid.uuid4())
        self.organization_id = organization_id or str(uuid.uuid4())
        self.conversation_id = conversation_id or str(uuid.uuid4())
        self.seq = 0
        self.serverseq = 0

    def message(self, kind: str, parameters: dict[str, Any] | None = None) -> str:
        self.seq += 1
        return json.dumps({"version": "2", "id": self.session_id, "type": kind, "seq": self.seq,
                           "serverseq": self.serverseq, "position": "PT0S", "parameters": parameters or {}})

    def saw(self, reply: dict[str, Any]) -> dict[str, Any]:
        self.serverseq = reply["seq"]
        return reply

    def open(self, channels: tuple[str, ...] = ("external", "internal"), **custom: str) -> str:
        return self.message("open", {
            "organizationId": self.organization_id, "conversationId": self.conversation_id,
            "participant": {"id": str(uuid.uuid4()), "ani": "+15551234567", "aniName": "Jane Caller",
                            "dnis": "+15557654321"},
            "media": [{"type": "audio", "format": "PCMU", "channels": list(channels), "rate": 8000}],
            "language": "en-US", "customConfig": custom})

    def headers(self) -> dict[str, str]:
        return {"audiohook-organization-id": self.organization_id, "audiohook-session-id": self.session_id,
                "audiohook-correlation-id": str(uuid.uuid4())}


def _interleave(*channels: bytes) -> bytes:
    return np.stack([np.frombuffer(c, dtype=np.uint8) for c in channels], axis=1).tobytes()


@pytest.fixture
def interleave():  # type: ignore[no-untyped-def]
    """``interleave(*channels)``: stereo PCMU as AudioHook sends it, one sample of each channel in turn."""
    return _interleave


@pytest.fixture
def audiohook_client():  # type: ignore[no-untyped-def]
    return AudioHookClient


# ---- an in-process gateway on the real broker ------------------------------------------------------------
@dataclass
class RunningGateway:
    server: Any
    url: str
    settings: Any

    def ws(self, path: str) -> str:
        return f"{self.url}{path}"


@pytest.fixture
async def start_gateway(kafka_settings) -> AsyncIterator[Any]:  # type: ignore[no-untyped-def]
    """``await start_gateway(producer=None, **settings)``: a gateway on 127.0.0.1 (a free port) writing to
    this test's topics; every gateway started is shut down (drained) at the end of the test."""
    from pipeline.broker.producer import ContractProducer
    from pipeline.contracts import Serde
    from pipeline.gateway.server import GatewayServer

    started: list[Any] = []

    async def start(producer: ContractProducer | None = None, **overrides: Any) -> RunningGateway:
        values = {"gateway_end_grace_s": 0.3, "gateway_drain_s": 0.0, **overrides}
        settings = kafka_settings.model_copy(update=values)
        producer = producer or ContractProducer.from_settings(settings, Serde.from_settings(""))
        server = GatewayServer(settings, producer)
        port = await server.start("127.0.0.1", 0)
        started.append(server)
        return RunningGateway(server, f"ws://127.0.0.1:{port}", settings)

    yield start
    for server in started:
        await server.shutdown()


@pytest.fixture
def read_calls(read_topic):  # type: ignore[no-untyped-def]
    """``read_calls(settings, frames=N, events=M)``: the decoded frames and call events on the test's topics."""
    from pipeline.contracts import Serde

    serde = Serde.from_settings("")

    def read(settings: Any, frames: int | None = None, events: int | None = None,
             idle_s: float = 2.0) -> tuple[list[AudioFrame], list[CallEvent]]:
        got_frames = [serde.decode(m.value(), AudioFrame)
                      for m in read_topic(settings.bootstrap, settings.topic_audio, frames, idle_s=idle_s)]
        got_events = [serde.decode(m.value(), CallEvent)
                      for m in read_topic(settings.bootstrap, settings.topic_call_events, events, idle_s=idle_s)]
        return got_frames, got_events

    return read
