"""The one Kafka producer callqa writers share: idempotent, acks=all, Avro in the Confluent framing."""

from __future__ import annotations

import threading
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from pipeline.contracts import Message as ContractMessage
from pipeline.contracts import Serde


class DeliveryError(RuntimeError):
    """The broker did not take a message; the message names the topic and the error."""


class ContractProducer:
    """Produces contract messages keyed by call ID; delivery failures are counted and raised on flush."""

    def __init__(self, bootstrap: str, serde: Serde, **overrides: Any) -> None:
        config = {
            "bootstrap.servers": bootstrap,
            # Idempotence gives exactly-once writes per partition across the producer's retries.
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 200_000,
            **overrides,
        }
        self._producer = Producer(config)
        self.serde = serde
        self._lock = threading.Lock()
        self.delivered = 0
        self.failures: list[str] = []

    def send(self, topic: str, key: str, message: ContractMessage) -> None:
        self.send_raw(topic, key.encode(), self.serde.encode(message))

    def send_raw(self, topic: str, key: bytes | None, value: bytes) -> None:
        while True:
            try:
                self._producer.produce(topic, value=value, key=key, on_delivery=self._on_delivery)
                break
            except BufferError:
                # Local queue full: let librdkafka send some, then retry (back-pressure, not loss).
                self._producer.poll(0.05)
        self._producer.poll(0)

    def flush(self, timeout_s: float = 60.0) -> None:
        remaining = self._producer.flush(timeout_s)
        if remaining:
            raise DeliveryError(f"{remaining} messages still undelivered after {timeout_s:.0f} s")
        if self.failures:
            raise DeliveryError(f"{len(self.failures)} messages failed: {self.failures[0]}")

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        with self._lock:
            if err is None:
                self.delivered += 1
            else:
                self.failures.append(f"{msg.topic()}: {err.str()}")
