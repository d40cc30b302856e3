"""The post-call backlog gauge counts from what the consumer knows locally (asking the brokers per partition
took seconds, and a worker's clean stop waited for it). Real broker: jobs produced, some committed by an
earlier owner, some taken, the rest counted."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline.config import Settings
from pipeline.postcall.runner import JobBacklog

pytestmark = [pytest.mark.broker]


def test_the_backlog_is_the_jobs_neither_committed_nor_taken_on_the_consumers_partitions(
        kafka_settings: Settings) -> None:
    name = f"{kafka_settings.topic_postcall}.{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": kafka_settings.bootstrap})
    for future in admin.create_topics([NewTopic(name, 2, 1)]).values():
        future.result()
    producer = Producer({"bootstrap.servers": kafka_settings.bootstrap})
    for partition, jobs in ((0, 7), (1, 5)):
        for _ in range(jobs):
            producer.produce(name, b"job", partition=partition)
    producer.flush(30)
    config = {"bootstrap.servers": kafka_settings.bootstrap, "group.id": name, "enable.auto.commit": False,
              "auto.offset.reset": "earliest"}
    earlier = Consumer(config)  # the partitions' earlier owner did 2 jobs of partition 0 and 1 of partition 1
    earlier.commit(offsets=[TopicPartition(name, 0, 2), TopicPartition(name, 1, 1)], asynchronous=False)
    earlier.close()

    consumer = Consumer(config)
    consumer.subscribe([name])
    count = JobBacklog()
    try:
        taken, deadline = 0, time.monotonic() + 60
        while taken < 3 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            taken += message is not None and message.error() is None
        assert taken == 3
        # (7 - 2) + (5 - 1) = 9 not done by the earlier owner, 3 of them taken now: 6, once a fetch of each
        # partition has brought its high watermark.
        while count(consumer) != 6 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert count(consumer) == 6
    finally:
        consumer.close()
        admin.delete_topics([name])
