"""A clean stop gives up the post-call job in hand rather than waiting for it: the job's outcome is dropped once
the runner stops anyway, and the wait (a recording's read-back and encoding, seconds) held the worker's whole
stop, and so a static member's calls through its restart. The job is left uncommitted, and whoever gets the
partition next does it. Real broker, the real runner; the recorder stands in for the recordings writer."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Executor
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from pipeline.config import Settings
from pipeline.contracts import Serde
from pipeline.contracts.messages import PostCallJob
from pipeline.postcall.audio import CallAudio
from pipeline.postcall.runner import PostCallRunner
from pipeline.qa.call import QaConfig
from pipeline.recordings.writer import RecordedCall
from pipeline.worker.metrics import WorkerMetrics
from tests.postcall.conftest import job_for
from tests.postcall.test_gone_audio import Recorder, Sink

pytestmark = [pytest.mark.broker, pytest.mark.slow]


class SlowRecorder:
    """A recording whose step on the pass's thread runs until the test lets it end."""

    def __init__(self) -> None:
        self.started, self.release, self.finished = threading.Event(), threading.Event(), threading.Event()

    async def record(self, job: PostCallJob, audio: CallAudio, executor: Executor | None = None) -> RecordedCall:
        def encode() -> None:
            self.started.set()
            self.release.wait(120)
            self.finished.set()

        await asyncio.get_running_loop().run_in_executor(executor, encode)
        return RecordedCall(job.call_id, f"file:///{job.call_id}.ogg", 1, job.audio_ms, ())


def _runner(settings: Settings, recorder: Any, sink: Sink) -> PostCallRunner:
    async def publish(topic: str, key: str, message: Any) -> Any:
        raise AssertionError("no revision is published without a post-call model")

    return PostCallRunner(settings, None, None, lambda: 0, publish, sink, WorkerMetrics(),  # type: ignore[arg-type]
                          QaConfig.from_settings(settings), Serde.from_settings(), recorder)


def _committed(settings: Settings) -> int:
    consumer = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": f"{settings.worker_id}.postcall"})
    try:
        return consumer.committed([TopicPartition(settings.topic_postcall, 0)], timeout=30)[0].offset
    finally:
        consumer.close()


async def test_a_stop_gives_up_the_job_in_hand_uncommitted_and_the_next_runner_does_it(
        kafka_settings: Settings, library_frames: list[Any]) -> None:
    settings = kafka_settings.model_copy(update={"exactly_once": False})
    serde = Serde.from_settings()
    producer = Producer({"bootstrap.servers": settings.bootstrap})
    frames = [f for f in library_frames if f.seq < 100]
    for f in frames:
        producer.produce(settings.topic_audio, serde.encode(f), key=b"CA-pass", partition=3)
    job = job_for("CA-pass", frames, model="", audio_topic=settings.topic_audio, audio_partition=3,
                  audio_end_offset=len(frames))
    producer.produce(settings.topic_postcall, serde.encode(job), key=b"CA-pass", partition=0)
    producer.flush(30)

    slow, first_sink = SlowRecorder(), Sink()
    first = _runner(settings, slow, first_sink)
    first.start()
    try:
        assert await asyncio.to_thread(slow.started.wait, 120), first.error
        await first.close()
        # Closed while the recording's step still ran: not waited for, nothing of the job stored or committed.
        assert not slow.finished.is_set()
        assert first_sink.rows == {}
        assert _committed(settings) < 0
    finally:
        slow.release.set()
    assert await asyncio.to_thread(slow.finished.wait, 30)
    await asyncio.sleep(0.5)  # what the step's end would have led to, had the job not been given up
    assert first_sink.rows == {}

    recorder, sink = Recorder(WorkerMetrics()), Sink()
    second = _runner(settings, recorder, sink)
    second.start()
    try:
        deadline = time.monotonic() + 120
        while await asyncio.to_thread(_committed, settings) < 1 and time.monotonic() < deadline:
            assert second.error is None, second.error
            await asyncio.sleep(0.5)
    finally:
        await second.close()
    assert [call for call, _ in recorder.calls] == ["CA-pass"], second.error
    assert _committed(settings) == 1
    assert len(sink.rows.get("recordings", [])) == 1, sink.rows
