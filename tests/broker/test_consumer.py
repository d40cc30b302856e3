"""The worker's consumer (pipeline/broker/consumer.py): callqa's fetch sizes, not faust's fixed ones; and a
seek back to the committed offsets that also moves partitions committed at 0 or never committed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import faust
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from faust.types import TP

from pipeline.broker.consumer import FAUST_FETCH_MAX_WAIT_MS, WorkerConsumer, use_worker_consumer


def _app(tmp_path: Path) -> faust.App:
    return faust.App("fetch-test", broker="kafka://127.0.0.1:1", store="memory://", datadir=str(tmp_path / "{conf.name}"))


async def test_the_aiokafka_consumer_faust_makes_carries_the_fetch_sizes(tmp_path: Path) -> None:
    app = _app(tmp_path)
    use_worker_consumer(app, 65536, 20)
    assert isinstance(app.consumer, WorkerConsumer)
    client = app.consumer._thread._create_worker_consumer(app.transport)  # what its thread starts
    # What aiokafka hands its fetcher when it starts (AIOKafkaConsumer.start).
    assert (client._fetch_min_bytes, client._fetch_max_wait_ms) == (65536, 20)


async def test_without_fetch_sizes_faust_keeps_its_own(tmp_path: Path) -> None:
    app = _app(tmp_path)
    client = app.consumer._thread._create_worker_consumer(app.transport)
    assert not isinstance(app.consumer, WorkerConsumer)
    assert (client._fetch_min_bytes, client._fetch_max_wait_ms) == (1, FAUST_FETCH_MAX_WAIT_MS)


# ---- seeking back on a real broker ---------------------------------------------------------------------

async def _wait_for(seen: list[tuple[int, int]], count: int, timeout_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while len(seen) < count and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.1)


@pytest.mark.broker
@pytest.mark.parametrize("ours", [True, False], ids=["worker consumer", "faust alone"])
async def test_seeking_back_reaches_partitions_committed_at_0_and_never_committed(
    broker: str, unique_name: str, tmp_path: Path, ours: bool,
) -> None:
    """On a rebalance faust drops what it fetched but has not handed on, and reads it again only if
    ``perform_seek`` moves the partition back. Partition 0 committed at 0 and partition 1 never committed,
    both read to their end: after ``perform_seek`` the worker's consumer reads both again from 0; faust
    alone reads neither (the frames the chaos test lost)."""
    topic = f"test.{unique_name}.seek"
    admin = AdminClient({"bootstrap.servers": broker})
    for future in admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)]).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": broker})
    for partition in (0, 1):
        for k in range(10):
            producer.produce(topic, value=b"%d" % k, partition=partition)
    assert producer.flush(30) == 0

    app = faust.App(unique_name, broker=f"kafka://{broker}", store="memory://", web_enabled=False,
                    datadir=str(tmp_path / "{conf.name}"), consumer_auto_offset_reset="earliest")
    if ours:
        use_worker_consumer(app, 1, 20)
    seen: list[tuple[int, int]] = []

    @app.agent(app.topic(topic, key_serializer="raw", value_serializer="raw", acks=False))
    async def read(stream):  # type: ignore[no-untyped-def]
        async for event in stream.events():
            seen.append((event.message.partition, event.message.offset))

    await app.start()
    try:
        await _wait_for(seen, 20, 60)
        assert sorted(seen) == [(p, k) for p in (0, 1) for k in range(10)]
        assert await app.consumer._commit_offsets({TP(topic, 0): 0})  # type: ignore[attr-defined]

        await app.consumer.perform_seek()

        await _wait_for(seen, 40, 10 if ours else 3)
        again = sorted(seen[20:])
        assert again == ([(p, k) for p in (0, 1) for k in range(10)] if ours else [])
    finally:
        await app.stop()
