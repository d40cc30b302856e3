"""PartitionTransactions' shutdown (pipeline/broker/transactions.py): without Kafka, and fenced by a real
next owner on the real broker."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from pipeline.broker.transactions import PartitionTransactions
from pipeline.config import Settings


class FencedProducer:
    """An aiokafka producer after a new owner fenced it: it refuses the abort as aiokafka does."""

    def __init__(self, fenced: bool) -> None:
        self.fenced = fenced
        self.stopped = False

    async def abort_transaction(self) -> None:
        if self.fenced:
            raise AssertionError("Invalid state transition TransactionState.FATAL_ERROR -> "
                                 "TransactionState.ABORTING_TRANSACTION")

    async def stop(self) -> None:
        self.stopped = True


def test_close_stops_every_producer_when_a_fenced_one_refuses_its_abort() -> None:
    transactions = PartitionTransactions(Settings(), "g", 30.0)
    producers: dict[int, Any] = {0: FencedProducer(True), 1: FencedProducer(False), 2: FencedProducer(True)}
    for partition, producer in producers.items():
        transactions._producers[partition] = producer
        transactions._locks[partition] = asyncio.Lock()
        transactions._open.add(partition)  # each had a transaction open at the SIGTERM
    asyncio.run(transactions.close())
    assert all(p.stopped for p in producers.values()), "a producer left running holds the process at exit"
    assert transactions.partitions == set() and transactions.aborts == 3


@pytest.mark.broker
async def test_a_producer_the_next_owner_fenced_stops_without_an_unseen_error(kafka_settings: Any) -> None:
    """A hand-over: the partition's next owner fences this worker's producer mid-transaction; stopping it
    leaves no "Future exception was never retrieved" (a ProducerFenced traceback logged as an ERROR at exit)."""
    loop = asyncio.get_running_loop()
    unseen: list[str] = []
    loop.set_exception_handler(lambda _, context: unseen.append(f"{context.get('message')} {context.get('future')!r}"))
    transactions = PartitionTransactions(kafka_settings, f"{kafka_settings.topic_audio}.g", 30.0, lambda p: True)
    await transactions.assign({0})
    await (await transactions.send(0, kafka_settings.topic_transcripts, b"k", b"before"))
    next_owner = AIOKafkaProducer(bootstrap_servers=kafka_settings.bootstrap,
                                  transactional_id=transactions.transactional_id(0))
    await next_owner.start()  # InitProducerId: fences the first
    try:
        with pytest.raises(Exception):  # noqa: B017, PT011 - whichever error aiokafka raises for the fenced send
            await asyncio.wait_for(await transactions.send(0, kafka_settings.topic_qa, b"k", b"after"), 30)
        await transactions.close()
    finally:
        await next_owner.stop()
    del transactions
    gc.collect()
    await asyncio.sleep(0)
    assert not [m for m in unseen if "never retrieved" in m], unseen
