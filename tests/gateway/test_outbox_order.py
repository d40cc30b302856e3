"""A call's end event leaves the gateway only after Kafka took the call's frames (pipeline/gateway/outbox.py).

Frames and end are on two topics, and Kafka keeps order per partition only: after a broker outage a producer's
queues drain in any order, and a worker that read the end first closed the call 30 s later without its last
frames (the chaos test lost 211-312 frames of two calls so, from the replay's producer)."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.broker.producer import ContractProducer, DeliveryError
from pipeline.contracts import AudioFrame, CallEvent, Serde
from pipeline.gateway.metrics import GatewayMetrics
from pipeline.gateway.outbox import KafkaSender, Outbox


def frame(seq: int) -> AudioFrame:
    return AudioFrame("CA-1", "customer", seq, seq * 20, 8000, "mulaw", b"\xff" * 160)


def test_an_end_is_not_taken_with_its_calls_frames_nor_before_they_are_acknowledged() -> None:
    outbox = Outbox(GatewayMetrics(), leg_buffer_s=30)
    outbox.call_started(CallEvent("CA-1", "start", tenant="acme", legs=["customer"]))
    for seq in range(3):
        outbox.frame(frame(seq))
    outbox.call_ended(CallEvent("CA-1", "end", tenant="acme", legs=["customer"], frame_counts={"customer": 3}))
    first = outbox.take(100, wait_s=0)
    assert len(first.frames) == 3 and first.ends == []
    assert outbox.take(100, wait_s=0).ends == []  # still on their way to Kafka
    outbox.acknowledged(first)
    assert [e.event_type for e in outbox.take(100, wait_s=0).ends] == ["end"]


class OutageProducer(ContractProducer):
    """The real producer, whose first two flushes end as a broker outage does: messages still undelivered."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outage_flushes = 2
        self.log: list[str] = []

    def send(self, topic: str, key: str, message: Any, on_failure: Any = None) -> None:
        self.log.append("end" if isinstance(message, CallEvent) and message.event_type == "end" else "message")
        super().send(topic, key, message, on_failure)

    def pending(self) -> int:
        return 1 if self.outage_flushes >= 0 else super().pending()

    def flush(self, timeout_s: float = 60.0) -> None:
        if self.outage_flushes > 0:
            self.outage_flushes -= 1
            self.log.append("flush timed out")
            raise DeliveryError("3 messages still undelivered after 30 s")
        self.outage_flushes -= 1
        super().flush(timeout_s)
        self.log.append("flushed")


@pytest.mark.broker
def test_the_sender_waits_out_an_outage_before_the_calls_end(kafka_settings, read_topic) -> None:  # type: ignore[no-untyped-def]
    metrics = GatewayMetrics()
    outbox = Outbox(metrics, leg_buffer_s=30)
    producer = OutageProducer(kafka_settings.bootstrap, Serde.from_settings())
    sender = KafkaSender(outbox, producer, kafka_settings.topic_audio, kafka_settings.topic_call_events, metrics)
    outbox.call_started(CallEvent("CA-1", "start", tenant="acme", legs=["customer"]))
    for seq in range(3):
        outbox.frame(frame(seq))
    outbox.call_ended(CallEvent("CA-1", "end", tenant="acme", legs=["customer"], frame_counts={"customer": 3}))
    sender.start()
    sender.stop(30)
    assert producer.log.index("end") > producer.log.index("flushed")  # the end only after a flush that took all
    assert producer.log[:producer.log.index("end")].count("flush timed out") == 2
    assert metrics.value("callqa_gateway_delivery_failures_total") == 0
    assert len(read_topic(kafka_settings.bootstrap, kafka_settings.topic_audio)) == 3
