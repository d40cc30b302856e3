"""One malformed frame among a call's good ones affects only itself.

A call and its clean twin (the same recording under another call id) are produced in one burst, so the
worker takes their frames in the same batches. In the faulty call, one agent frame in the middle of
speech is replaced by a malformed one (sample rate 0). That frame, and only it, is dead-lettered with
its topic, partition and offset; the faulty call keeps its timeline: its segments have the same start
and end as the twin's and the same words (20 ms of silence where the frame was may change one).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.broker.producer import ContractProducer
from pipeline.contracts import AudioFrame, CallEvent, DeadLetter, Serde
from pipeline.eval.wer import word_error_rate
from pipeline.ingest.replay import ReplayOptions, load_recording

pytestmark = [pytest.mark.broker, pytest.mark.slow]

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "calls" / "call_01.wav"
FRAME_SAMPLES = 160  # 20 ms at 8 kHz
SEGMENTS_SQL = ("SELECT leg, start_ms, end_ms, text FROM segments FINAL WHERE call_id = {c:String} "
                "AND is_final = 1 ORDER BY leg, start_ms")


def loudest_frame(samples: np.ndarray) -> int:
    """The frame in the middle of the loudest second of the call's middle third: inside speech."""
    frames = samples[: len(samples) // FRAME_SAMPLES * FRAME_SAMPLES].reshape(-1, FRAME_SAMPLES)
    energy = np.convolve((frames ** 2).mean(axis=1), np.ones(50), mode="same")
    third = len(frames) // 3
    return third + int(np.argmax(energy[third:2 * third]))


def test_a_malformed_frame_is_dead_lettered_alone_and_the_call_keeps_its_timeline(
    kafka_settings: Any, start_worker: Any, read_topic: Any
) -> None:
    worker = start_worker()
    rec = load_recording(SAMPLE, ReplayOptions(encoding="mulaw"))
    serde = Serde.from_settings()
    producer = ContractProducer(kafka_settings.bootstrap, serde)
    run = time.time_ns()
    clean, faulty = f"clean-{run}", f"faulty-{run}"
    bad_seq = loudest_frame(rec.legs["agent"])
    counts = {leg: -(-len(payload) // FRAME_SAMPLES) for leg, payload in rec.encoded.items()}
    bad_value = b""
    for call_id in (clean, faulty):
        producer.send(kafka_settings.topic_call_events, call_id,
                      CallEvent(call_id, "start", legs=list(rec.encoded), sample_rate=8000, encoding="mulaw"))
    for seq in range(max(counts.values())):  # the two calls interleaved, as a gateway sends live calls
        for call_id in (clean, faulty):
            for leg, payload in rec.encoded.items():
                chunk = payload[seq * FRAME_SAMPLES:(seq + 1) * FRAME_SAMPLES]
                if not chunk:
                    continue
                bad = call_id == faulty and leg == "agent" and seq == bad_seq
                frame = AudioFrame(call_id, leg, seq, seq * 20, 0 if bad else 8000, "mulaw", chunk)  # type: ignore[arg-type]
                value = serde.encode(frame)
                if bad:
                    bad_value = value
                producer.send_raw(kafka_settings.topic_audio, call_id.encode(), value)
    for call_id in (clean, faulty):
        producer.send(kafka_settings.topic_call_events, call_id,
                      CallEvent(call_id, "end", legs=list(rec.encoded), sample_rate=8000, encoding="mulaw",
                                frame_counts=counts))
    producer.flush()

    rows = worker.wait_for_calls([clean, faulty], timeout_s=180)
    assert {r["call_id"]: r["end_reason"] for r in rows} == {clean: "end", faulty: "end"}
    where = [(m.topic(), m.partition(), m.offset()) for m in read_topic(kafka_settings.bootstrap,
                                                                        kafka_settings.topic_audio)
             if m.value() == bad_value]
    assert len(where) == 1
    letters = [serde.decode_any(m.value()) for m in read_topic(kafka_settings.bootstrap,
                                                               kafka_settings.topic_dead_letters)]
    assert [(d.original_topic, d.original_partition, d.original_offset) for d in letters] == where
    letter = letters[0]
    assert isinstance(letter, DeadLetter)
    assert (letter.call_id, letter.leg, letter.start_ms) == (faulty, "agent", bad_seq * 20)

    expected = worker.query(SEGMENTS_SQL, c=clean)
    got = worker.query(SEGMENTS_SQL, c=faulty)
    assert len(expected) >= 4
    assert any(s["leg"] == "agent" and s["start_ms"] < bad_seq * 20 < s["end_ms"] for s in expected), \
        "the malformed frame is not inside a segment of speech"
    assert [(s["leg"], s["start_ms"], s["end_ms"]) for s in got] == [(s["leg"], s["start_ms"], s["end_ms"])
                                                                     for s in expected]
    wer = word_error_rate([s["text"] for s in expected], [s["text"] for s in got])
    print(f"\nbad frame at agent seq {bad_seq} ({bad_seq * 20} ms); WER faulty vs clean call: {wer:.3f}")
    assert wer <= 0.1
