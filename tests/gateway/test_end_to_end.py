"""End to end on real processes: `callqa gateway` and `callqa worker` on the real broker, real websocket
clients speaking Twilio Media Streams and AudioHook, results read from the worker's ClickHouse.

A library call sent live through either protocol is stored with the same transcripts and QA as the same
call through `callqa replay`; a PCI pause keeps the call one call and is measured as its hold; a socket
that drops still ends its call once; the caller's number (ANI) given in the signalling reaches no topic
and no table. One worker and one gateway serve the whole module (a worker takes a while to load its
model); each test uses call IDs of its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect

from pipeline.bench.workers import WorkerProcess, worker_env
from pipeline.broker.producer import ContractProducer
from pipeline.config import Settings
from pipeline.contracts import CallEvent, Serde
from pipeline.ingest.replay import CallRecording, ReplayOptions, TelephonyReplay, load_recording
from pipeline.store.migrations import TABLE_KEYS
from tests.conftest import _read_topic, drop_topics
from tests.gateway.conftest import AudioHookClient, TwilioMessages, _interleave
from tests.gateway.siprec.test_sipp import sipp_session
from tests.gateway.test_process import free_port, wait_healthy

pytestmark = [pytest.mark.broker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
CALL = REPO / "samples" / "calls" / "library" / "built" / "05_rude_agent.wav"
ANI = "+15551234567"  # AudioHookClient.open puts it in participant.ani; the Twilio test in a custom parameter
CHUNK_MS = 200  # AudioHook binary messages (at most 1 s each)
SIPP_PAUSE_MS = 12_000  # SIPp's BYE after the 200 OK: the 64 s call's RTP at 8x real time takes 8 s


@dataclass
class Stack:
    settings: Settings
    worker: WorkerProcess
    gateway_port: int
    sip_port: int

    def url(self, path: str) -> str:
        return f"ws://127.0.0.1:{self.gateway_port}{path}"

    def transcript(self, call_id: str) -> list[tuple[str, int, int, str]]:
        rows = self.worker.query("SELECT leg, start_ms, end_ms, text FROM segments FINAL WHERE call_id = {c:String} "
                                 "AND is_final = 1 ORDER BY start_ms, leg", c=call_id)
        return [(r["leg"], r["start_ms"], r["end_ms"], r["text"]) for r in rows]

    def qa(self, call_id: str) -> dict[str, Any]:
        (qa,) = self.worker.query("SELECT score_pct, auto_failed, metrics, `items.question` AS q, `items.passed` AS p "
                                  "FROM call_qa FINAL WHERE call_id = {c:String}", c=call_id)
        events = self.worker.query("SELECT rule, kind FROM qa_events FINAL WHERE call_id = {c:String} "
                                   "ORDER BY rule, kind", c=call_id)
        return {**qa, "events": [(e["rule"], e["kind"]) for e in events]}

    def events(self, call_id: str) -> list[CallEvent]:
        serde = Serde.from_settings("")
        messages = _read_topic(self.settings.bootstrap, self.settings.topic_call_events)
        return [e for e in (serde.decode(m.value(), CallEvent) for m in messages) if e.call_id == call_id]


@pytest.fixture(scope="module")
def stack(broker: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    from pipeline.broker.topics import ensure_topics

    prefix = f"test.e2e-{uuid.uuid4().hex[:8]}"
    settings = Settings(bootstrap_servers=broker, topic_audio=f"{prefix}.audio", topic_call_events=f"{prefix}.events",
                        topic_transcripts=f"{prefix}.transcripts", topic_latency=f"{prefix}.latency",
                        topic_qa=f"{prefix}.qa", topic_dead_letters=f"{prefix}.dlq",
                        topic_checkpoints=f"{prefix}.checkpoints", topic_live_calls=f"{prefix}.live",
                        worker_id=f"{prefix}.worker")
    ensure_topics(settings)
    tmp = tmp_path_factory.mktemp("e2e")
    topics = {name: getattr(settings, name) for name in ("topic_audio", "topic_call_events", "topic_transcripts",
                                                         "topic_latency", "topic_qa", "topic_dead_letters",
                                                         "topic_checkpoints")}
    web_port = free_port()
    worker = WorkerProcess(worker_env({"bootstrap_servers": broker, **topics, "worker_id": settings.worker_id,
                                       "clickhouse_url": f"chdb://{(tmp / 'chdb').resolve()}",
                                       "commit_interval_s": "1.0", "model_watch_interval_s": "0",
                                       "web_port": str(web_port)}), web_port, tmp / "worker.log")
    gateway_port, sip_port = free_port(), free_port()
    # Sent faster than real time: leg buffers of two minutes take a whole call without back-pressure.
    gateway_env = {**os.environ, **{f"CALLQA_{k.upper()}": v for k, v in topics.items()},
                   "CALLQA_BOOTSTRAP_SERVERS": broker, "CALLQA_GATEWAY_END_GRACE_S": "0.5",
                   "CALLQA_GATEWAY_LEG_BUFFER_S": "120", "CALLQA_GATEWAY_AUTH": "off",
                   "CALLQA_GATEWAY_METRICS_PORT": "0", "CALLQA_GATEWAY_SESSION_MESSAGES_PER_S": "0"}
    gateway_log = open(tmp / "gateway.log", "wb")  # noqa: SIM115 - the child's output, closed below
    gateway = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "gateway", "--port", str(gateway_port),
                                "--sip-port", str(sip_port)],
                               cwd=REPO, env=gateway_env, stdout=gateway_log, stderr=subprocess.STDOUT)
    try:
        worker.start()
        wait_healthy(gateway_port, gateway)
        yield Stack(settings, worker, gateway_port, sip_port)
    finally:
        gateway.terminate()
        gateway.wait(30)
        gateway_log.close()
        worker.stop()
        drop_topics(broker, prefix)


@pytest.fixture(scope="module")
def recording() -> CallRecording:
    return load_recording(CALL, ReplayOptions())


@pytest.fixture(scope="module")
def replayed(stack: Stack, recording: CallRecording) -> str:
    """The call through `callqa replay`'s path, finished: what the live paths must equal."""
    player = TelephonyReplay(ContractProducer(stack.settings.bootstrap, Serde.from_settings("")),
                             stack.settings.topic_audio, stack.settings.topic_call_events)
    (call_id,) = player.run([recording], ReplayOptions(call_id_prefix="replayed")).call_ids
    stack.worker.wait_for_calls([call_id])
    return call_id


def assert_same_call(stack: Stack, live: str, replayed: str) -> None:
    expected = stack.transcript(replayed)
    assert len(expected) >= 4 and {leg for leg, *_ in expected} == {"agent", "customer"}
    assert stack.transcript(live) == expected
    got, want = stack.qa(live), stack.qa(replayed)
    assert (got["score_pct"], got["auto_failed"], got["q"], got["p"], got["events"]) == (
        want["score_pct"], want["auto_failed"], want["q"], want["p"], want["events"])
    assert got["metrics"] == pytest.approx(want["metrics"])


async def send_twilio(stack: Stack, call_sid: str, rec: CallRecording, **custom: str) -> None:
    twilio = TwilioMessages(call_sid, **custom)
    async with connect(stack.url(f"/twilio/{call_sid}")) as ws:
        await ws.send(twilio.connected())
        await ws.send(twilio.start())
        for message in twilio.chunks_of({"inbound": rec.encoded["customer"], "outbound": rec.encoded["agent"]}):
            await ws.send(message)
        await ws.send(twilio.stop())


def stereo_chunks(rec: CallRecording, start_ms: int = 0, end_ms: int | None = None) -> Iterator[bytes]:
    """AudioHook's binary audio: external (customer) and internal (agent) interleaved, CHUNK_MS each."""
    customer, agent = rec.encoded["customer"], rec.encoded["agent"]
    end = min(len(customer), len(agent)) if end_ms is None else end_ms * 8
    for at in range(start_ms * 8, end, CHUNK_MS * 8):
        upto = min(at + CHUNK_MS * 8, end)
        yield _interleave(customer[at:upto], agent[at:upto])


async def audiohook_session(stack: Stack, client: AudioHookClient, rec: CallRecording,
                            pause_at_ms: int | None = None, discarded_s: int = 0) -> None:
    """A whole AudioHook session: open, the call's audio (with a client pause at ``pause_at_ms`` whose
    ``discarded_s`` of audio never come), close, closed."""
    async with connect(stack.url("/audiohook"), additional_headers={"X-API-KEY": "any", **client.headers()}) as ws:
        await ws.send(client.open(tenant="acme", agent_id="a7", queue="cards"))
        opened = client.saw(json.loads(await ws.recv()))
        assert opened["type"] == "opened"
        if pause_at_ms is None:
            for chunk in stereo_chunks(rec):
                await ws.send(chunk)
        else:
            for chunk in stereo_chunks(rec, 0, pause_at_ms):
                await ws.send(chunk)
            await ws.send(client.message("paused"))
            await ws.send(client.message("resumed", {"start": f"PT{pause_at_ms / 1000}S",
                                                     "discarded": f"PT{discarded_s}S"}))
            for chunk in stereo_chunks(rec, pause_at_ms + discarded_s * 1000):
                await ws.send(chunk)
        await ws.send(client.message("close", {"reason": "end"}))
        while (reply := json.loads(await asyncio.wait_for(ws.recv(), 60)))["type"] != "closed":
            client.saw(reply)


async def test_a_call_through_twilio_is_stored_as_the_replayed_call(stack: Stack, replayed: str,
                                                                    recording: CallRecording) -> None:
    call_sid = "CA" + uuid.uuid4().hex
    await send_twilio(stack, call_sid, recording, tenant="acme", agent_id="a7", queue="cards", caller=ANI)
    (row,) = await asyncio.to_thread(stack.worker.wait_for_calls, [call_sid])
    assert row["end_reason"] == "end"
    assert_same_call(stack, call_sid, replayed)


async def test_a_call_through_audiohook_is_stored_as_the_replayed_call(stack: Stack, replayed: str,
                                                                       recording: CallRecording) -> None:
    client = AudioHookClient(organization_id="acme")
    await audiohook_session(stack, client, recording)
    (row,) = await asyncio.to_thread(stack.worker.wait_for_calls, [client.conversation_id])
    assert row["end_reason"] == "end"
    assert_same_call(stack, client.conversation_id, replayed)


async def test_a_pci_pause_mid_call_keeps_one_call_and_is_measured_as_its_hold(stack: Stack,
                                                                               recording: CallRecording) -> None:
    client = AudioHookClient(organization_id="acme")
    await audiohook_session(stack, client, recording, pause_at_ms=20_000, discarded_s=5)
    call_id = client.conversation_id
    (row,) = await asyncio.to_thread(stack.worker.wait_for_calls, [call_id])
    assert row["end_reason"] == "end"
    events = await asyncio.to_thread(stack.events, call_id)
    assert [(e.event_type, e.offset_ms) for e in events] == [("start", -1), ("hold", 20_000), ("resume", 25_000),
                                                              ("end", -1)]
    metrics = stack.qa(call_id)["metrics"]
    assert (metrics["hold_ms"], metrics["holds"]) == (5_000, 1)
    # the pause is silence on the call's clock: no segment lies inside it, and speech goes on after it
    transcript = stack.transcript(call_id)
    assert not [s for s in transcript if s[1] >= 20_000 and s[2] <= 25_000]
    assert any(start >= 25_000 for _, start, _, _ in transcript)


async def test_a_dropped_socket_still_ends_its_call_once(stack: Stack, recording: CallRecording) -> None:
    call_sid = "CA" + uuid.uuid4().hex
    twilio = TwilioMessages(call_sid, tenant="acme")
    ws = await connect(stack.url("/twilio"))
    await ws.send(twilio.connected())
    await ws.send(twilio.start())
    audio = {"inbound": recording.encoded["customer"][:8 * 15_000], "outbound": recording.encoded["agent"][:8 * 15_000]}
    for message in twilio.chunks_of(audio):
        await ws.send(message)
    ws.transport.abort()  # no stop, no close frame: the TCP connection just goes
    (row,) = await asyncio.to_thread(stack.worker.wait_for_calls, [call_sid])
    assert row["end_reason"] == "end"
    ends = [e for e in await asyncio.to_thread(stack.events, call_sid) if e.event_type == "end"]
    assert len(ends) == 1 and ends[0].reason == "disconnected"
    messages = 15_000 // stack.settings.audio_message_ms  # 15 s in messages of CALLQA_AUDIO_MESSAGE_MS
    assert ends[0].frame_counts == {"customer": messages, "agent": messages}
    assert len(stack.worker.query("SELECT call_id FROM calls FINAL WHERE call_id = {c:String}", c=call_sid)) == 1


@pytest.mark.skipif(shutil.which("sipp") is None, reason="sip-tester not installed")
async def test_a_siprec_call_from_sipp_is_stored_as_the_replayed_call(stack: Stack, replayed: str,
                                                                     recording: CallRecording, tmp_path: Path) -> None:
    """SIPREC from an independent client: SIPp's signalling (metadata naming the caller by number), the legs'
    RTP in PCMU from the project's sender at 8x real time."""
    call_id, _ = await sipp_session(stack.sip_port, tmp_path, SIPP_PAUSE_MS, recording.encoded["customer"],
                                    recording.encoded["agent"], speed=8.0)
    (row,) = await asyncio.to_thread(stack.worker.wait_for_calls, [call_id])
    assert row["end_reason"] == "end"
    assert_same_call(stack, call_id, replayed)
    (start,) = [e for e in await asyncio.to_thread(stack.events, call_id) if e.event_type == "start"]
    assert start.agent_id == "agent1001"  # the callee's AOR user part (sip:agent1001@pbx.example.com)
    # The SIP Call-ID as the SBC wrote it (SIPp's: "1-<pid>@127.0.0.1") is the API's call, URL-encoded.
    request = urllib.request.Request(f"{stack.worker.base_url}/api/calls/{urllib.parse.quote(call_id, safe='')}",
                                     headers={"Authorization": f"Bearer {stack.worker.env['CALLQA_API_TOKEN']}"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert call_id in answer.read().decode()


@pytest.mark.skipif(shutil.which("sipp") is None, reason="sip-tester not installed")
async def test_a_siprec_call_in_pcma_with_loss_and_reordering_scores_as_the_replayed_call(
        stack: Stack, replayed: str, recording: CallRecording, tmp_path: Path) -> None:
    """The same call in PCMA with 1 % of its RTP lost and 3 % reordered, 8x real time: the jitter buffer puts
    the order back, the losses are 20 ms gaps of silence; the score within 10 points of the replayed call's."""
    call_id, _ = await sipp_session(stack.sip_port, tmp_path, SIPP_PAUSE_MS, recording.encoded["customer"],
                                    recording.encoded["agent"], speed=8.0, encoding="pcma", loss=0.01,
                                    reorder=0.03, seed=7)
    (row,) = await asyncio.to_thread(stack.worker.wait_for_calls, [call_id])
    assert row["end_reason"] == "end"
    got, want = stack.qa(call_id), stack.qa(replayed)
    assert abs(got["score_pct"] - want["score_pct"]) <= 10, (got, want)
    legs = {leg for leg, *_ in stack.transcript(call_id)}
    assert legs == {"agent", "customer"}


def test_no_caller_number_in_any_topic_or_table(stack: Stack) -> None:
    """Runs after the calls above: the ANI they gave (AudioHook participant, Twilio custom parameter)."""
    digits = ANI.lstrip("+").encode()
    topics = [getattr(stack.settings, name) for name in ("topic_audio", "topic_call_events", "topic_transcripts",
                                                         "topic_latency", "topic_qa", "topic_dead_letters",
                                                         "topic_checkpoints")]
    assert stack.worker.query("SELECT count() AS n FROM calls")[0]["n"] >= 4
    for topic in topics:
        for message in _read_topic(stack.settings.bootstrap, topic, idle_s=1.0):
            assert digits not in (message.value() or b"") and digits not in (message.key() or b""), topic
    for table in sorted(TABLE_KEYS):  # every table the worker's API may read
        rows = stack.worker.query(f"SELECT * FROM {table}")
        assert digits.decode() not in json.dumps(rows, default=str), table
