"""The gateway's sender sends a call event again when Kafka refuses it (pipeline/gateway/outbox.py): a lost
end event left its call open until the worker's inactivity timeout (20 minutes). Real broker: the events
topic does not exist at first (auto-creation is off), so every event is refused; once it exists the
events arrive, each once."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline.broker.producer import ContractProducer
from pipeline.contracts import AudioFrame, CallEvent, Serde
from pipeline.gateway.metrics import GatewayMetrics
from pipeline.gateway.outbox import KafkaSender, Outbox


def _create(broker: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker})  # kept alive until the creation is answered
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(30)


@pytest.mark.broker
def test_refused_call_events_are_sent_again_until_kafka_takes_them(broker: str, unique_name: str,
                                                                    read_topic: Any) -> None:
    audio, events = f"test.{unique_name}.audio", f"test.{unique_name}.events"
    _create(broker, audio)
    serde = Serde.from_settings()
    metrics = GatewayMetrics()
    outbox = Outbox(metrics, leg_buffer_s=30)
    # Refused within a second and a half: librdkafka waits that long for the missing topic.
    sender = KafkaSender(outbox, ContractProducer(broker, serde, **{"message.timeout.ms": 1500}), audio, events,
                         metrics)
    sender.start()
    try:
        outbox.call_started(CallEvent("CA-retried", "start", tenant="acme", legs=["customer"]))
        outbox.frame(AudioFrame("CA-retried", "customer", 0, 0, 8000, "mulaw", b"\xff" * 160))
        outbox.call_ended(CallEvent("CA-retried", "end", legs=["customer"], frame_counts={"customer": 1}))
        deadline = time.monotonic() + 60
        while metrics.value("callqa_gateway_event_retries_total") < 4:  # both refused, twice each at least
            assert time.monotonic() < deadline, "no event was refused and queued again"
            time.sleep(0.2)
        _create(broker, events)
        sent = [serde.decode(m.value(), CallEvent) for m in read_topic(broker, events, expected=2, idle_s=5.0)]
    finally:
        sender.stop(timeout_s=10)
    assert sorted((e.call_id, e.event_type) for e in sent) == [("CA-retried", "end"), ("CA-retried", "start")]
    assert [f.seq for f in (serde.decode(m.value(), AudioFrame) for m in read_topic(broker, audio))] == [0]


class BrokenProducer:
    """A producer with a bug: its send raises (a fault injected, as tests/worker/test_health.py does)."""

    failures: list[str] = []

    def send(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("injected sender fault")


def test_a_sender_that_fails_says_why_instead_of_stopping_silently() -> None:
    """Its thread's exception ended it unseen while the sockets went on filling the buffers; now the
    reason is kept, and the server's /healthz answers 503 with it (pipeline/gateway/server.py)."""
    metrics = GatewayMetrics()
    outbox = Outbox(metrics, leg_buffer_s=30)
    sender = KafkaSender(outbox, BrokenProducer(), "audio", "events", metrics)  # type: ignore[arg-type]
    sender.start()
    outbox.call_started(CallEvent("CA-1", "start", legs=["customer"]))
    deadline = time.monotonic() + 10
    while sender.failure is None:
        assert time.monotonic() < deadline, "the sender's failure was not recorded"
        time.sleep(0.05)
    assert sender.failure == "RuntimeError: injected sender fault"
