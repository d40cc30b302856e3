"""PartitionTransactions' shutdown, without Kafka (pipeline/broker/transactions.py)."""

from __future__ import annotations

import asyncio
from typing import Any

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
