"""Post-call jobs whose audio no longer exists (its topic deleted, a partition it never had, or the log past
its frames): skipped at once from the broker's metadata and watermarks, counted, said once, and the jobs
behind them go on. Real broker, the real runner; the recorder stands in for the recordings writer."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from concurrent.futures import Executor
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline.config import Settings
from pipeline.contracts import Serde
from pipeline.contracts.messages import PostCallJob
from pipeline.postcall.audio import AudioGone, CallAudio, read_keyed_frames
from pipeline.postcall.runner import PostCallRunner
from pipeline.qa.call import QaConfig
from pipeline.recordings.writer import RecordedCall
from pipeline.worker.metrics import WorkerMetrics
from tests.postcall.conftest import job_for

pytestmark = [pytest.mark.broker]


class Recorder:
    """Notes which calls it was asked to record, and how many gone jobs had been skipped by then."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self.metrics = metrics
        self.calls: list[tuple[str, float]] = []

    async def record(self, job: PostCallJob, audio: CallAudio, executor: Executor | None = None) -> RecordedCall:
        skipped = self.metrics.registry.get_sample_value("callqa_recordings_total", {"outcome": "no_audio"})
        self.calls.append((job.call_id, skipped or 0.0))
        return RecordedCall(job.call_id, f"file:///{job.call_id}.ogg", 1, job.audio_ms, ())


class Sink:
    def __init__(self) -> None:
        self.rows: dict[str, list[dict[str, Any]]] = {}

    async def write(self, table: str, rows: Any) -> None:
        self.rows.setdefault(table, []).extend(rows)

    async def flush(self) -> None:
        return None

    async def close(self) -> None:
        return None


def _dead_topic(bootstrap: str, prefix: str) -> str:
    """A topic that held a call's frames, deleted (as a reset or a renamed audio topic leaves it)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    name = f"{prefix}.old-audio"
    for future in admin.create_topics([NewTopic(name, 1, 1)]).values():
        future.result()
    producer = Producer({"bootstrap.servers": bootstrap})
    for _ in range(5):
        producer.produce(name, b"frame", key=b"CA-dead", partition=0)
    producer.flush(30)
    for future in admin.delete_topics([name]).values():
        future.result()
    return name


@pytest.mark.slow  # about 80 s: a consumer group's join and thirteen jobs' topics
async def test_jobs_whose_audio_is_gone_are_skipped_at_once_and_the_live_calls_recording_follows(
        kafka_settings: Settings, library_frames: list[Any], caplog: pytest.LogCaptureFixture) -> None:
    settings = kafka_settings.model_copy(update={"exactly_once": False})
    serde = Serde.from_settings()
    dead = _dead_topic(settings.bootstrap, settings.topic_audio)
    # The live call's frames on its audio partition, as a gateway sends them.
    producer = Producer({"bootstrap.servers": settings.bootstrap})
    frames = [f for f in library_frames if f.seq < 100]
    for f in frames:
        producer.produce(settings.topic_audio, serde.encode(f), key=b"CA-pass", partition=3)
    producer.flush(30)
    live = job_for("CA-pass", frames, model="", audio_topic=settings.topic_audio, audio_partition=3,
                   audio_end_offset=len(frames))
    gone = [job_for(f"CA-dead-{i}", frames, model="", audio_topic=dead, audio_partition=0, audio_end_offset=5)
            for i in range(12)]
    gone.append(job_for("CA-no-partition", frames, model="", audio_topic=settings.topic_audio,
                        audio_partition=settings.audio_partitions + 5, audio_end_offset=5))
    for job in [*gone, live]:  # one job partition: taken in this order
        producer.produce(settings.topic_postcall, serde.encode(job), key=job.call_id.encode(), partition=0)
    producer.flush(30)

    metrics = WorkerMetrics()
    recorder = Recorder(metrics)

    async def publish(topic: str, key: str, message: Any) -> Any:
        raise AssertionError("no revision is published without a post-call model")

    runner = PostCallRunner(settings, None, None, lambda: 0, publish, Sink(), metrics,  # type: ignore[arg-type]
                            QaConfig.from_settings(settings), serde, recorder)  # type: ignore[arg-type]
    caplog.set_level(logging.INFO, logger="callqa.postcall")
    runner.start()
    try:
        deadline = time.monotonic() + 120
        while not recorder.calls and time.monotonic() < deadline and runner.error is None:
            await asyncio.sleep(0.1)
    finally:
        await runner.close()
    # Every gone job was skipped, as no_audio (not as a failure), before the live call's recording.
    assert recorder.calls == [("CA-pass", 13.0)], runner.error
    assert metrics.registry.get_sample_value("callqa_recordings_total", {"outcome": "no_audio"}) == 13
    assert metrics.registry.get_sample_value("callqa_recordings_total", {"outcome": "failed"}) == 0
    assert metrics.registry.get_sample_value("callqa_recordings_total", {"outcome": "written"}) == 1
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 2, said  # once for the deleted topic, once for the partition it never had
    assert sum(f"{dead}[0]" in line and "topic_gone" in line for line in said) == 1, said
    assert sum("partition_gone" in line for line in said) == 1, said


def test_a_topic_deleted_under_a_read_ends_the_read_as_gone(kafka_settings: Settings) -> None:
    """A topic deleted just before or while its frames are read: the reader says it is gone instead of polling
    a partition that will never answer until its idle limit (30 s a job)."""
    name = f"{kafka_settings.topic_audio}.{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": kafka_settings.bootstrap})
    for future in admin.create_topics([NewTopic(name, 1, 1)]).values():
        future.result()
    producer = Producer({"bootstrap.servers": kafka_settings.bootstrap})
    for _ in range(10):
        producer.produce(name, b"frame", key=b"c1", partition=0)
    producer.flush(30)
    deleting = admin.delete_topics([name])  # not waited for: the read starts while the broker deletes it
    with pytest.raises(AudioGone) as gone:
        # Sixty idle seconds before a plain CallAudioError: noticing the deletion ends it as gone first.
        read_keyed_frames({"bootstrap.servers": kafka_settings.bootstrap}, Serde.from_settings(), "c1",
                          TopicPartition(name, 0), 0, 10, poll_timeout_s=0.5, max_idle_polls=120)
    assert gone.value.reason in ("topic_gone", "partition_gone")
    for future in deleting.values():
        future.result()
