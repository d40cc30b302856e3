"""How much the worker's Kafka consumer fetches at once: faust fixes aiokafka's ``fetch_max_wait_ms`` at
1500 and leaves ``fetch_min_bytes`` at 1. aiokafka keeps one fetch in flight per broker and leaves out of
it the partitions whose fetched records are still being handed on, so at tens of live legs a fetch that
carries only idle partitions (the call-events topic, a quiet audio partition) holds the broker's one slot
for the full 1.5 s while frames queue on the busy ones: finals waited seconds (P99 4.47 s at 23 calls on
2 cores, 1.64 s with the settings' 16 KB / 20 ms; the figures are in pipeline/config/worker.py).

``use_fetch_sizes(app, min_bytes, max_wait_ms)`` makes the app's consumer ask for at least ``min_bytes``
per fetch, waiting at most ``max_wait_ms`` for them: at low load a frame waits at most that long.
"""

from __future__ import annotations

from typing import Any

import aiokafka
import faust
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread, Consumer

FAUST_FETCH_MAX_WAIT_MS = 1500  # what faust passes aiokafka (faust/transport/drivers/aiokafka.py)


class SizedFetchConsumerThread(AIOKafkaConsumerThread):
    """faust's consumer thread, whose aiokafka consumer fetches with the sizes its consumer carries."""

    consumer: SizedFetchConsumer

    def _create_worker_consumer(self, transport: Any) -> aiokafka.AIOKafkaConsumer:
        client = super()._create_worker_consumer(transport)
        # faust passes no fetch_min_bytes and a fixed fetch_max_wait_ms; aiokafka reads both from these
        # attributes when it starts its fetcher (AIOKafkaConsumer.start), which happens after this.
        client._fetch_min_bytes = self.consumer.fetch_min_bytes
        client._fetch_max_wait_ms = self.consumer.fetch_max_wait_ms
        return client


class SizedFetchConsumer(Consumer):
    """faust's aiokafka consumer with fetch sizes of its own (set by ``use_fetch_sizes``)."""

    fetch_min_bytes = 1
    fetch_max_wait_ms = FAUST_FETCH_MAX_WAIT_MS

    def _new_consumer_thread(self) -> AIOKafkaConsumerThread:
        return SizedFetchConsumerThread(self, loop=self.loop, beacon=self.beacon)


def use_fetch_sizes(app: faust.App, min_bytes: int, max_wait_ms: int) -> None:
    """Before the app starts: its consumer fetches at least ``min_bytes``, waiting at most ``max_wait_ms``."""
    consumer_class = type("SizedFetchConsumer", (SizedFetchConsumer,),
                          {"fetch_min_bytes": min_bytes, "fetch_max_wait_ms": max_wait_ms})
    # The transport makes the app's consumer from its ``Consumer`` class (faust's Transport.create_consumer).
    app.transport.Consumer = consumer_class  # type: ignore[misc]
