"""The one Kafka producer callqa writers share: idempotent, acks=all, Avro in the Confluent framing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from pipeline.broker.security import ClientErrors, kafka_config
from pipeline.config.broker import BrokerSettings
from pipeline.contracts import Message as ContractMessage
from pipeline.contracts import Serde

POLL_EVERY = 64  # sends between serving delivery reports
# librdkafka's message.timeout.ms (its default, not overridden here): by then every message is delivered or
# failed. A flush that must not give up first (a broker restart under load took over 60 s to take the
# first messages again: the idempotent producer waits for its producer id) waits this long.
DELIVERY_TIMEOUT_S = 300.0


class DeliveryError(RuntimeError):
    """The broker did not take a message; the message names the topic and the error."""


class ContractProducer:
    """Produces contract messages keyed by call ID; delivery failures are counted and raised on flush."""

    def __init__(self, bootstrap: str, serde: Serde, errors: ClientErrors | None = None, **overrides: Any) -> None:
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
        self.errors = errors
        self._lock = threading.Lock()
        self.delivered = 0
        self._unpolled = 0
        self.failures: list[str] = []

    @classmethod
    def from_settings(cls, settings: BrokerSettings, serde: Serde, **overrides: Any) -> ContractProducer:
        """A producer with the settings' bootstrap servers and security (SASL, TLS)."""
        errors = ClientErrors(settings)
        config = kafka_config(settings, errors)
        bootstrap = config.pop("bootstrap.servers")
        return cls(bootstrap, serde, errors, **config, **overrides)

    def send(self, topic: str, key: str, message: ContractMessage,
             on_failure: Callable[[KafkaError], None] | None = None) -> None:
        """Produce ``message``; ``on_failure`` is called (from a later poll or flush) if Kafka refuses it."""
        self.send_raw(topic, key.encode(), self.serde.encode(message), on_failure)

    def send_raw(self, topic: str, key: bytes | None, value: bytes,
                 on_failure: Callable[[KafkaError], None] | None = None) -> None:
        report = self._on_delivery if on_failure is None else partial(self._on_delivery, on_failure=on_failure)
        while True:
            try:
                self._producer.produce(topic, value=value, key=key, on_delivery=report)
                break
            except BufferError:
                # Local queue full: let librdkafka send some, then retry (back-pressure, not loss).
                self._producer.poll(0.05)
                self._raise_if_refused()
        # Serving delivery reports once per batch of sends, not per message, is a tenth of the cost of a
        # 20 ms audio frame; the local queue holds 200,000 messages, and flush serves them all anyway.
        self._unpolled += 1
        if self._unpolled >= POLL_EVERY:
            self._unpolled = 0
            self._producer.poll(0)

    def pending(self) -> int:
        """Messages produced and neither delivered nor failed yet."""
        return len(self._producer)

    def flush(self, timeout_s: float = 60.0) -> None:
        # In short steps, so a refused login or TLS handshake ends the wait at once.
        deadline = time.monotonic() + timeout_s
        remaining = self._producer.flush(min(1.0, timeout_s))
        while remaining and time.monotonic() < deadline:
            self._raise_if_refused()
            remaining = self._producer.flush(min(1.0, max(0.0, deadline - time.monotonic())))
        if remaining:
            self._raise_if_refused()
            raise DeliveryError(f"{remaining} messages still undelivered after {timeout_s:.0f} s")
        if self.failures:
            raise DeliveryError(f"{len(self.failures)} messages failed: {self.failures[0]}")

    def _raise_if_refused(self) -> None:
        if self.errors is not None:
            self.errors.raise_if_failed()

    def _on_delivery(self, err: KafkaError | None, msg: Message,
                     on_failure: Callable[[KafkaError], None] | None = None) -> None:
        with self._lock:
            if err is None:
                self.delivered += 1
            else:
                self.failures.append(f"{msg.topic()}: {err.str()}")
        if err is not None and on_failure is not None:
            on_failure(err)
