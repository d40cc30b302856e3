"""No state left behind on the checkpoint topic: a "finished" record is deleted (a tombstone) once the
group's commits pass its call's input, whoever committed them.

Real broker, a real worker process. The state is the one a chaos run left: a previous owner finished a
call, committed past its input and died before deleting its record; the partition has been quiet since.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from pipeline.broker.producer import ContractProducer
from pipeline.config import Settings
from pipeline.contracts import Serde
from pipeline.contracts.messages import CallCheckpoint
from pipeline.ingest.replay import ReplayOptions, TelephonyReplay, load_recording
from tests.conftest import _high_watermark

pytestmark = pytest.mark.broker

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "calls" / "call_01.wav"


def high_watermarks(settings: Settings, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": "watermarks"})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        # A topic created a moment ago can answer NOT_LEADER for a while (seen in CI): retried there.
        return {p: _high_watermark(consumer, TopicPartition(topic, p)) for p in partitions}
    finally:
        consumer.close()


def last_value(read_topic: Any, settings: Settings, key: str) -> tuple[bool, bytes | None]:
    """(seen, value) of the newest record of ``key`` on the checkpoint topic."""
    records = [m for m in read_topic(settings.bootstrap, settings.topic_checkpoints, idle_s=1.0)
               if m.key() == key.encode()]
    return (True, records[-1].value()) if records else (False, None)


def test_a_finished_record_a_dead_owner_left_is_deleted_on_a_quiet_partition(
    kafka_settings: Settings, start_worker: Any, read_topic: Any
) -> None:
    # The call, as a previous owner read it: start, frames, end, on one partition of each input topic.
    call_id = "left-behind"
    player = TelephonyReplay(ContractProducer(kafka_settings.bootstrap, Serde.from_settings()),
                             kafka_settings.topic_audio, kafka_settings.topic_call_events)
    player.run([load_recording(SAMPLE, ReplayOptions())], ReplayOptions(), call_ids=[call_id])
    audio = {p: h for p, h in high_watermarks(kafka_settings, kafka_settings.topic_audio).items() if h}
    events = {p: h for p, h in high_watermarks(kafka_settings, kafka_settings.topic_call_events).items() if h}
    assert len(audio) == 1 and audio.keys() == events.keys(), (audio, events)
    partition, audio_end = audio.popitem()
    events_end = events[partition]

    # It committed past all of it (the worker's group is the faust app id, the worker id)...
    group = Consumer({"bootstrap.servers": kafka_settings.bootstrap, "group.id": kafka_settings.worker_id,
                      "enable.auto.commit": False})
    try:
        group.commit(offsets=[TopicPartition(kafka_settings.topic_audio, partition, audio_end),
                              TopicPartition(kafka_settings.topic_call_events, partition, events_end)],
                     asynchronous=False)
    finally:
        group.close()
    # ...and died before deleting the call's "finished" record.
    record = CallCheckpoint(call_id, "finished", end_reason="end", resume_offset=audio_end,
                            events_end_offset=events_end)
    producer = Producer({"bootstrap.servers": kafka_settings.bootstrap})
    producer.produce(kafka_settings.topic_checkpoints, key=call_id.encode(), partition=partition,
                     value=Serde.from_settings().encode(record))
    assert producer.flush(30) == 0
    assert last_value(read_topic, kafka_settings, call_id)[0]

    worker = start_worker()
    deadline = time.monotonic() + 90
    while (newest := last_value(read_topic, kafka_settings, call_id)) != (True, None):
        assert worker.alive(), worker.log_tail()
        assert time.monotonic() < deadline, (
            f"the finished record of {call_id} is still on the checkpoint topic 90 s after its partition's new "
            f"owner started (newest value {len(newest[1] or b'')} bytes)")
        time.sleep(1)
    # Nothing of the call was read again: the commit was past it.
    assert worker.metric("callqa_calls_finished_total") == 0
    assert worker.metric("callqa_frames_total") == 0
