"""Fixtures of the gateway tests: a recording sink and a manual clock for the core, message builders
for both protocols (as Twilio and Genesys send them), and an in-process gateway on the real broker."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.contracts.messages import AudioFrame, CallEvent

# Real speech (pocketsphinx's test recordings, ~9.6 s in all), as phone legs carry it.
RECORDINGS = sorted(Path("/usr/share/pocketsphinx/test/data/cards").glob("*.wav"))


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
    pauses: list[tuple[str, str, int, str | None]] = field(default_factory=list)  # (call, "paused"/"unpaused", ms, why)
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

    def call_paused(self, call_id: str, at_ms: int) -> None:
        self.pauses.append((call_id, "paused", at_ms, None))

    def call_unpaused(self, call_id: str, at_ms: int, paused_ms: int, reason: str | None = None) -> None:
        self.pauses.append((call_id, "unpaused", at_ms, reason))

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
    """Real recordings one after the other at 8 kHz μ-law: what a phone leg carries."""
    from pipeline.audio import codecs
    from pipeline.audio.files import load_audio
    from pipeline.audio.resample import resample

    legs = []
    for path in RECORDINGS:
        audio = load_audio(path)
        legs.append(codecs.encode(resample(audio.mono(), audio.sample_rate, 8000), "mulaw"))
    joined = b"".join(legs)
    assert len(joined) >= 40000, "the test recordings are missing"
    return joined


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
OPERATOR_TOKEN = "callqa-test-operator-token-0123456789"  # secure pause requests (pipeline/gateway/pause.py)


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
    from pydantic import SecretStr

    from pipeline.broker.producer import ContractProducer
    from pipeline.contracts import Serde
    from pipeline.gateway.server import GatewayServer

    started: list[Any] = []

    async def start(producer: ContractProducer | None = None, **overrides: Any) -> RunningGateway:
        # The tests send audio faster than real time: a leg buffer of 30 s takes their bursts without
        # back-pressure, unless a test asks for a small one. They count 20 ms frames (Twilio's chunk): the
        # default message span has test_a_twilio_call_reaches_the_topics_as_sent and tests/gateway/test_end_to_end.py.
        # Without credentials (most tests) streams are taken unauthenticated: an explicit opt-out. An operator
        # token of their own: a loopback gateway without one would make the checkout's .callqa/api-token.
        values = {"gateway_end_grace_s": 0.3, "gateway_drain_s": 0.0, "gateway_leg_buffer_s": 30.0,
                  "audio_message_ms": 20, "gateway_auth": "off", "gateway_metrics_port": 0,
                  "gateway_session_messages_per_s": 0, "api_token": SecretStr(OPERATOR_TOKEN), **overrides}
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
def tls_files(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (PEM files): (cert, key)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "callqa-gateway-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp_path / "gateway.pem", tmp_path / "gateway.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


@pytest.fixture
def read_calls(read_topic):  # type: ignore[no-untyped-def]
    """``await read_calls(settings, frames=N, events=M)``: the decoded frames and call events on the test's
    topics, read in a thread (the gateway under test runs on this event loop)."""
    from confluent_kafka import KafkaException

    from pipeline.contracts import Serde

    serde = Serde.from_settings("")

    def read_one(bootstrap: str, topic: str, expected: int | None, idle_s: float) -> list[Any]:
        for attempt in range(10):
            try:
                return read_topic(bootstrap, topic, expected, idle_s=idle_s)  # type: ignore[no-any-return]
            except KafkaException:  # a topic created moments ago may still be electing its leaders
                if attempt == 9:
                    raise
                time.sleep(0.5)
        return []

    def read(settings: Any, frames: int | None, events: int | None,
             idle_s: float) -> tuple[list[AudioFrame], list[CallEvent]]:
        got_frames = [serde.decode(m.value(), AudioFrame)
                      for m in read_one(settings.bootstrap, settings.topic_audio, frames, idle_s)]
        got_events = [serde.decode(m.value(), CallEvent)
                      for m in read_one(settings.bootstrap, settings.topic_call_events, events, idle_s)]
        return got_frames, got_events

    async def read_async(settings: Any, frames: int | None = None, events: int | None = None,
                         idle_s: float = 2.0) -> tuple[list[AudioFrame], list[CallEvent]]:
        return await asyncio.to_thread(read, settings, frames, events, idle_s)

    return read_async


@pytest.fixture
def audio_offsets():  # type: ignore[no-untyped-def]
    """``audio_offsets(gateway)``: what says where frames that a read did not find went: the audio topic's
    (low, high) offsets per partition that holds any, and the frames the gateway's sender had acknowledged
    by Kafka. High offsets above what was read: the reader skipped them; fewer acknowledged: the sender."""
    from confluent_kafka import Consumer, TopicPartition

    def offsets(gw: Any) -> dict[str, Any]:
        topic = gw.settings.topic_audio
        consumer = Consumer({"bootstrap.servers": gw.settings.bootstrap, "group.id": f"offsets-{uuid.uuid4().hex}"})
        try:
            partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
            marks = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in partitions}
        finally:
            consumer.close()
        return {"offsets": {p: m for p, m in marks.items() if m[1]},
                "acknowledged": gw.server.metrics.value("callqa_gateway_frames_acknowledged_total"),
                "dropped": gw.server.metrics.value("callqa_gateway_frames_dropped_total"),
                "delivery_failures": gw.server.metrics.value("callqa_gateway_delivery_failures_total"),
                "lost": {r: gw.server.metrics.value("callqa_gateway_frames_lost_total", reason=r)
                         for r in ("refused", "not_sent")}}

    return offsets


# ---- signed websocket clients ----------------------------------------------------------------------------
TWILIO_TOKEN = "twilio-test-auth-token-0123456789"
AUDIOHOOK_KEY = "callqa-test-api-key"
AUDIOHOOK_SECRET = base64.b64encode(b"callqa-test-client-secret-32-byt").decode()
CREDENTIALS = {"twilio_auth_token": TWILIO_TOKEN, "audiohook_api_key": AUDIOHOOK_KEY,
               "audiohook_client_secret": AUDIOHOOK_SECRET}


@pytest.fixture
def credentials() -> dict[str, Any]:
    """Settings overrides that make the gateway check both protocols' credentials."""
    from pydantic import SecretStr

    return {k: SecretStr(v) for k, v in CREDENTIALS.items()}


def _twilio_headers(url: str, token: str = TWILIO_TOKEN) -> dict[str, str]:
    digest = hmac.new(token.encode(), url.encode(), hashlib.sha1).digest()
    return {"X-Twilio-Signature": base64.b64encode(digest).decode()}


def _audiohook_headers(url: str, client: AudioHookClient, key: str = AUDIOHOOK_KEY,
                       secret: str = AUDIOHOOK_SECRET, nonce: str | None = None) -> dict[str, str]:
    from http_message_signatures import HTTPMessageSigner, MappingKeyResolver, algorithms

    @dataclass
    class Request:
        method: str
        url: str
        headers: dict[str, str]

    authority = url.split("://", 1)[1].split("/", 1)[0]
    request = Request("GET", f"https://{authority}/audiohook", {"Host": authority, "X-API-KEY": key,
                                                                 **client.headers()})
    signer = HTTPMessageSigner(signature_algorithm=algorithms.HMAC_SHA256,
                               key_resolver=MappingKeyResolver(public_keys={},
                                                               private_keys={key: base64.b64decode(secret)}))
    signer.sign(request, key_id=key, label="sig1",
                nonce=nonce or base64.urlsafe_b64encode(uuid.uuid4().bytes + uuid.uuid4().bytes).decode(),
                covered_component_ids=("@request-target", "@authority", "audiohook-organization-id",
                                       "audiohook-session-id", "audiohook-correlation-id", "x-api-key"))
    return {k: v for k, v in request.headers.items() if k != "Host"}


@pytest.fixture
def twilio_headers():  # type: ignore[no-untyped-def]
    """``twilio_headers(url, token=...)``: the X-Twilio-Signature header Twilio would send for ``url``."""
    return _twilio_headers


@pytest.fixture
def audiohook_headers():  # type: ignore[no-untyped-def]
    """``audiohook_headers(url, client, key=..., secret=..., nonce=None)``: Genesys's signed headers."""
    return _audiohook_headers
