"""No audio, message bytes or transcript text at rest by default: real broker, real worker processes.

Dead letters are references (topic, partition, offset, call, leg, time range, reason); they carry the
payload only with CALLQA_DEBUG_RAW_AUDIO. Inference fails for real here: with ``max_segment_ms`` above
Whisper's 30 s window and an endpoint silence no pause reaches (long_segment_ms off), a 42 s leg stays one segment, and the
recognizer rejects it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.broker.producer import ContractProducer
from pipeline.contracts import DeadLetter, Serde, TranscriptSegment
from pipeline.ingest.replay import CallRecording, ReplayOptions, TelephonyReplay, load_recording
from pipeline.worker.dead_letters import DEBUG_RAW_MAX_BYTES

pytestmark = [pytest.mark.broker, pytest.mark.slow]

SAMPLES = Path(__file__).resolve().parents[2] / "samples" / "calls"
OPTIONS = ReplayOptions(encoding="mulaw", frame_ms=20)
ONE_SEGMENT_PER_LEG = {"max_segment_ms": "60000", "endpoint_silence_ms": "60000", "long_segment_ms": "0"}
# Confluent header of a registered schema (1: AudioFrame, 2: CallEvent), then a body that is no record.
AUDIO_GARBAGE = b"\x00\x00\x00\x00\x01garbage-frame-4242"
EVENT_GARBAGE = b"\x00\x00\x00\x00\x02garbage-event-4242"
DEBUG_WARNING = b"CALLQA_DEBUG_RAW_AUDIO is on"


def _replay(settings: Any, recordings: list[CallRecording]) -> list[str]:
    player = TelephonyReplay(ContractProducer(settings.bootstrap, Serde.from_settings()),
                             settings.topic_audio, settings.topic_call_events)
    return player.run(recordings, OPTIONS).call_ids


def _long_call() -> CallRecording:
    """Agent leg only: call_02's agent audio twice over (42 s), speech from 0.4 s to 41.4 s."""
    sample = load_recording(SAMPLES / "call_02.wav", OPTIONS)
    agent = sample.legs["agent"]
    rec = CallRecording("call_02 agent x2", {"agent": np.concatenate([agent, agent])}, sample.sample_rate)
    rec.encode(OPTIONS.encoding)
    return rec


def _failing_run(settings: Any, start_worker: Any, read_topic: Any, **overrides: str) -> tuple[Any, str, dict]:  # type: ignore[type-arg]
    """Garbage on both input topics, then a call whose one segment inference rejects; the dead letters."""
    worker = start_worker(**ONE_SEGMENT_PER_LEG, **overrides)
    producer = ContractProducer(settings.bootstrap, Serde.from_settings())
    # Sent first, on fresh topics: each is offset 0 of its partition.
    producer.send_raw(settings.topic_audio, b"garbage-audio-call", AUDIO_GARBAGE)
    producer.send_raw(settings.topic_call_events, b"garbage-event-call", EVENT_GARBAGE)
    producer.flush()
    [call_id] = _replay(settings, [_long_call()])
    worker.wait_for_calls([call_id])
    serde = Serde.from_settings()
    letters = {}
    for m in read_topic(settings.bootstrap, settings.topic_dead_letters, expected=3):
        letter = serde.decode_any(m.value())
        assert isinstance(letter, DeadLetter)
        letters[letter.call_id] = (letter, m.value())
    assert set(letters) == {call_id, "garbage-audio-call", "garbage-event-call"}
    worker.stop()
    return worker, call_id, letters


def test_dead_letters_are_references_without_audio_or_message_bytes(
    kafka_settings, start_worker, read_topic  # type: ignore[no-untyped-def]
) -> None:
    worker, call_id, letters = _failing_run(kafka_settings, start_worker, read_topic)
    # (a) the segment inference rejected: where it is, which call, leg and time, why; no audio
    segment, encoded = letters[call_id]
    assert (segment.original_topic, segment.original_offset) == (kafka_settings.topic_audio, -1)
    assert 0 <= segment.original_partition < kafka_settings.audio_partitions
    assert (segment.leg, segment.error_type, segment.worker_id) == ("agent", "SegmentRejectedError",
                                                                    kafka_settings.worker_id)
    assert segment.segment_id == f"{call_id}/agent/{segment.start_ms:09d}"
    assert 0 <= segment.start_ms < 1000 and segment.end_ms - segment.start_ms > 30_000
    assert "longer than 30" in segment.reason and segment.segment_id in segment.reason
    assert segment.raw is None and segment.key is None and segment.raw_kind == ""
    assert len(encoded) < 1024  # the segment's audio alone is 41 s x 32 kB/s
    # (b) undecodable input: topic, partition, offset and the call its key names; not its bytes
    for name, topic, garbage in (("garbage-audio-call", kafka_settings.topic_audio, AUDIO_GARBAGE),
                                 ("garbage-event-call", kafka_settings.topic_call_events, EVENT_GARBAGE)):
        letter, encoded = letters[name]
        assert (letter.original_topic, letter.original_offset, letter.error_type) == (topic, 0, "ContractError")
        assert f"{topic}[{letter.original_partition}]@0" in letter.reason
        assert letter.raw is None and letter.key is None and letter.raw_kind == ""
        assert garbage[5:] not in encoded and garbage[5:] not in worker.log_path.read_bytes()
    events = [m for m in read_topic(kafka_settings.bootstrap, kafka_settings.topic_call_events)
              if m.value() == EVENT_GARBAGE]
    assert letters["garbage-event-call"][0].original_partition == events[0].partition()
    assert DEBUG_WARNING not in worker.log_path.read_bytes()


def test_debug_raw_audio_attaches_the_payloads_and_says_so_once(
    kafka_settings, start_worker, read_topic  # type: ignore[no-untyped-def]
) -> None:
    worker, call_id, letters = _failing_run(kafka_settings, start_worker, read_topic, debug_raw_audio="true")
    segment = letters[call_id][0]
    assert segment.raw_kind == "pcm16le_16k" and segment.raw is not None
    # 16 kHz PCM of the segment's start: 41 s would exceed Kafka's 1 MiB message limit, so it is cut.
    samples = np.frombuffer(segment.raw, dtype="<i2")
    assert (segment.end_ms - segment.start_ms) * 16 > len(samples) == DEBUG_RAW_MAX_BYTES // 2
    assert np.abs(samples).max() > 1000  # speech, not silence
    for name, garbage in (("garbage-audio-call", AUDIO_GARBAGE), ("garbage-event-call", EVENT_GARBAGE)):
        letter = letters[name][0]
        assert (letter.raw, letter.key, letter.raw_kind) == (garbage, name.encode(), "message")
    assert worker.log_path.read_bytes().count(DEBUG_WARNING) == 1


def test_debug_level_worker_log_holds_no_transcript_words_and_no_audio(
    kafka_settings, start_worker, read_topic  # type: ignore[no-untyped-def]
) -> None:
    worker = start_worker(loglevel="debug")
    rec = load_recording(SAMPLES / "call_01.wav", OPTIONS)
    [call_id] = _replay(kafka_settings, [rec])
    worker.wait_for_calls([call_id])
    stored = worker.query("SELECT count() AS n FROM segments FINAL WHERE call_id = {c:String}", c=call_id)[0]["n"]
    serde = Serde.from_settings()
    texts = [t.text.lower() for t in (serde.decode_any(m.value()) for m in read_topic(
        kafka_settings.bootstrap, kafka_settings.topic_transcripts, expected=stored)) if isinstance(t, TranscriptSegment)]
    worker.stop()
    log = worker.log_path.read_bytes().lower()
    assert b"[debug]" in log  # the worker really logged at debug level

    words = [re.findall(r"[a-z']+", t) for t in texts]
    distinctive = {w for ws in words for w in ws if len(w) >= 5}
    phrases = {" ".join(ws[i:i + 3]) for ws in words for i in range(len(ws) - 2)}
    assert len(distinctive) >= 8 and len(phrases) >= 10  # the call was transcribed: there is text to look for
    assert sorted(w for w in distinctive if re.search(rb"\b" + w.encode() + rb"\b", log)) == []
    assert sorted(p for p in phrases if p.encode() in log) == []
    # Audio: no 16-byte stretch of either leg's frames, as bytes or as a Python bytes repr (a logged frame).
    chunks = [(leg, i, payload[i:i + 16]) for leg, payload in rec.encoded.items() for i in range(0, len(payload) - 16, 2000)]
    assert [(leg, i) for leg, i, c in chunks if c.lower() in log or repr(c)[2:-1].encode().lower() in log] == []
