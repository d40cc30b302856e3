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


@pytest.mark.broker
def test_every_frame_the_sender_takes_is_written_or_counted_lost(broker: str, unique_name: str,
                                                                 read_topic: Any) -> None:
    """Four frames librdkafka will not even queue (larger than message.max.bytes: produce raises) sit in the
    middle of a batch. They are counted lost with their reason; the frames after them and the call's end are
    still written, and the sender goes on (the exception used to end it with the rest of the batch taken)."""
    audio, events = f"test.{unique_name}.audio", f"test.{unique_name}.events"
    _create(broker, audio)
    _create(broker, events)
    serde = Serde.from_settings()
    metrics = GatewayMetrics()
    outbox = Outbox(metrics, leg_buffer_s=30)
    sender = KafkaSender(outbox, ContractProducer(broker, serde, **{"message.max.bytes": 2000}), audio, events,
                         metrics)
    outbox.call_started(CallEvent("CA-big", "start", legs=["customer"]))
    for seq in range(100):
        payload = b"\xff" * (4000 if 90 <= seq <= 93 else 160)
        outbox.frame(AudioFrame("CA-big", "customer", seq, seq * 20, 8000, "mulaw", payload))
    outbox.call_ended(CallEvent("CA-big", "end", legs=["customer"], frame_counts={"customer": 100}))
    sender.start()  # after the frames: they are taken in one batch
    try:
        deadline = time.monotonic() + 60
        while not outbox.empty():
            assert time.monotonic() < deadline and sender.failure is None, sender.failure
            time.sleep(0.1)
        frames = [serde.decode(m.value(), AudioFrame) for m in read_topic(broker, audio, expected=96)]
        sent = [serde.decode(m.value(), CallEvent) for m in read_topic(broker, events, expected=2)]
    finally:
        sender.stop(timeout_s=10)
    assert sender.failure is None
    assert sorted(f.seq for f in frames) == [*range(90), *range(94, 100)]
    assert sorted(e.event_type for e in sent) == ["end", "start"]
    assert metrics.value("callqa_gateway_frames_lost_total", reason="not_sent") == 4
    assert metrics.value("callqa_gateway_frames_acknowledged_total") == 96
    assert metrics.value("callqa_gateway_frames_dropped_total") == 0
