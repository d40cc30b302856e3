"""A clean stop commits what it finished: the finals it drained are published to read_committed readers
and the group's offsets move past them, rather than being aborted with their transaction and decoded
again by the next owner (which delayed every turn that ended just before a restart by the whole restart)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from pipeline.contracts import Serde, TranscriptSegment
from pipeline.ingest.replay import ReplayOptions, load_recording
from tests.worker.test_pipeline import replay

pytestmark = [pytest.mark.broker, pytest.mark.slow]

CALL = Path(__file__).resolve().parents[2] / "samples" / "calls" / "call_01.wav"


def _finals(read_topic, settings, call_id: str) -> list[str]:  # type: ignore[no-untyped-def]
    serde = Serde.from_settings()
    messages = (serde.decode_any(m.value()) for m in read_topic(settings.bootstrap, settings.topic_transcripts,
                                                                idle_s=2.0))
    return [m.segment_id for m in messages if isinstance(m, TranscriptSegment) and m.is_final and m.call_id == call_id]


def _committed_and_end(settings) -> tuple[dict[int, int], dict[int, int]]:  # type: ignore[no-untyped-def]
    consumer = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": settings.worker_id,
                         "enable.auto.commit": False})
    try:
        parts = [TopicPartition(settings.topic_audio, p)
                 for p in consumer.list_topics(settings.topic_audio, timeout=30).topics[settings.topic_audio].partitions]
        committed = {tp.partition: tp.offset for tp in consumer.committed(parts, timeout=30)}
        ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=30)[1] for tp in parts}
        return committed, ends
    finally:
        consumer.close()


def _idle(worker) -> bool:  # type: ignore[no-untyped-def]
    """Nothing left to read, no segment waiting for inference or in it (on a loaded machine the segments alone can stand still for seconds while the call is still being decoded: a
    batch in a decoding process once took longer than the 5 s the count must hold, and the test read one
    segment of several)."""
    lines = worker.metrics_text().splitlines()
    lag = sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("callqa_consumer_lag{"))
    return lag == 0 and all(worker.metric(name) == 0 for name in (
        "callqa_batcher_queue_depth", "callqa_inflight_audio_bytes"))


def _settled_segments(worker, call_id: str, timeout_s: float = 180.0) -> set[str]:  # type: ignore[no-untyped-def]
    """The call's stored segments once their number has not moved for 5 s with the worker idle (the store is
    flushed on its own interval; what waits for the commit interval, the call's end among it, does not come
    in this test)."""
    seen: set[str] = set()
    since = time.monotonic()
    deadline = since + timeout_s
    while time.monotonic() < deadline:
        now = {r["segment_id"] for r in worker.query(
            "SELECT segment_id FROM segments FINAL WHERE call_id = {id:String}", id=call_id)}
        if now != seen or not _idle(worker):
            seen, since = now, time.monotonic()
        elif seen and time.monotonic() - since > 5:
            return seen
        time.sleep(0.5)
    raise TimeoutError(f"call {call_id}: segments still coming after {timeout_s:.0f} s: {worker.why()}")


def test_a_clean_stop_commits_the_finals_it_drained_and_the_offsets_past_them(
    kafka_settings, start_worker, read_topic  # type: ignore[no-untyped-def]
) -> None:
    # No commit on time during the test (and transactions kept open that long): only the stop can commit.
    worker = start_worker(commit_interval_s="300", transaction_timeout_s="600")
    call_id = replay(kafka_settings, [load_recording(CALL, ReplayOptions(encoding="mulaw", frame_ms=20))])[0]
    stored = _settled_segments(worker, call_id)  # decoded, published in the open transaction, stored
    assert len(stored) >= 2
    assert _finals(read_topic, kafka_settings, call_id) == []  # nothing committed yet
    committed, _ = _committed_and_end(kafka_settings)
    assert all(offset < 0 for offset in committed.values()), committed

    worker.stop()
    assert worker.exit_code == 0, worker.why()

    finals = _finals(read_topic, kafka_settings, call_id)
    # Each once, now visible to read_committed readers: what was stored before, and what the stop released.
    after = {r["segment_id"] for r in worker.store_rows(
        "SELECT segment_id FROM segments FINAL WHERE call_id = {id:String}", id=call_id)}
    assert stored <= after
    assert sorted(finals) == sorted(after)
    committed, ends = _committed_and_end(kafka_settings)
    with_audio = {p for p, end in ends.items() if end > 0}
    # The call is open (its end waits for the commit interval): its partition's commit stops at its checkpoint.
    assert with_audio and all(0 <= committed[p] <= ends[p] for p in with_audio), (committed, ends)
    assert "last commit not made" not in worker.log_text()
