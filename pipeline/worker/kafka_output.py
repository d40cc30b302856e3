"""The worker's ``OutputPort`` on Kafka: in the input partition's transaction, or with faust's producer.

- ``TransactionalOutput`` (``CALLQA_EXACTLY_ONCE``, the default): a message goes in the transaction of
  the input partition it accounts for (pipeline/broker/transactions.py), committed with that
  partition's offsets;
- ``FaustOutput``: faust's idempotent producer, outside any transaction (at-least-once); also what the
  post-call pass publishes with when exactly once is off.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import faust

from pipeline.broker.transactions import PartitionTransactions
from pipeline.contracts import Message, Serde


class FaustOutput:
    """Produces contract messages with faust's producer; returns the delivery future."""

    def __init__(self, app: faust.App, serde: Serde) -> None:
        self.app = app
        self.serde = serde
        self._topics: dict[str, Any] = {}

    async def publish(self, topic: str, key: str, message: Message | None, partition: int = -1) -> Awaitable[Any]:
        t = self._topics.get(topic)
        if t is None:
            t = self._topics[topic] = self.app.topic(topic, key_serializer="raw", value_serializer="raw")
        value = self.serde.encode(message) if message is not None else None  # None: a tombstone
        fut: Awaitable[Any] = await t.send(key=key.encode(), value=value)
        return fut


class TransactionalOutput:
    """Produces contract messages in the transaction of the input partition they account for."""

    def __init__(self, transactions: PartitionTransactions, serde: Serde) -> None:
        self.transactions = transactions
        self.serde = serde

    async def publish(self, topic: str, key: str, message: Message | None, partition: int) -> Awaitable[Any]:
        value = self.serde.encode(message) if message is not None else None  # None: a tombstone
        return await self.transactions.send(partition, topic, key.encode(), value)
