"""What the benchmarks read back from the broker: the live finals as they are written (``TranscriptTap``), a
topic to its end as a read_committed consumer downstream sees it (``read_topic``), and the checkpoint topic as
compaction will leave it (``checkpoint_figures``)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from pipeline.bench.latency import FinalSeen
from pipeline.bench.workers import BenchError
from pipeline.broker.security import kafka_config
from pipeline.config import Settings
from pipeline.contracts import Serde, TranscriptSegment


class TranscriptTap(threading.Thread):
    """Reads the transcripts topic from its beginning; keeps every final with its Kafka timestamp."""

    def __init__(self, settings: Settings, serde: Serde) -> None:
        super().__init__(name="bench-transcripts", daemon=True)
        self.topic = settings.topic_transcripts
        self.serde = serde
        # read_committed, as a downstream consumer of exactly-once outputs reads (read_committed_latency).
        self.consumer = Consumer({**kafka_config(settings), "group.id": f"bench-live-{uuid.uuid4().hex}",
                                  "enable.auto.commit": False, "isolation.level": "read_committed"})
        partitions = self.consumer.list_topics(self.topic, timeout=10).topics[self.topic].partitions
        self.consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in partitions])
        self.halt = threading.Event()
        self._lock = threading.Lock()
        self._finals: list[FinalSeen] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                msg = self.consumer.poll(0.2)
                if msg is not None and not msg.error() and msg.value():
                    self._keep(msg)
        except BaseException as exc:  # noqa: BLE001 - handed to the level by finals()
            self.error = exc
        finally:
            self.consumer.close()

    def _keep(self, msg: Any) -> None:
        received = time.time()
        segment = self.serde.decode(msg.value(), TranscriptSegment)
        if not segment.is_final or segment.revision > 0:  # a post-call revision is not a live final
            return
        kind, stamp_ms = msg.timestamp()
        written = stamp_ms / 1000 if kind != 0 and stamp_ms > 0 else received  # 0: no timestamp
        final = FinalSeen(segment.call_id, segment.leg, segment.segment_id, segment.start_ms, segment.end_ms,
                          segment.text, written, received, segment.batch_size,
                          closed_s=segment.segment_closed_at_ms / 1000 if segment.segment_closed_at_ms else None,
                          wait_s=segment.batcher_wait_ms / 1000, inference_s=segment.inference_ms / 1000,
                          produced_s=segment.produced_at_ms / 1000 if segment.produced_at_ms else None)
        with self._lock:
            self._finals.append(final)

    def finals(self) -> list[FinalSeen]:
        if self.error is not None:
            raise BenchError(f"reading {self.topic} failed: {type(self.error).__name__}: {self.error}")
        with self._lock:
            return list(self._finals)

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=10)


def read_topic(settings: Settings, topic: str) -> list[Any]:
    """Every committed record of ``topic`` (tombstones included), from each partition's start to its end
    now, as a read_committed consumer downstream sees them."""
    # Transactions end with commit markers, which no poll returns: a partition's end is its EOF.
    consumer = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": f"chaos-read-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": "read_committed"})
    out: list[Any] = []
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30) for p in partitions}
        want = {p: hi for p, (lo, hi) in ends.items() if hi > lo}
        consumer.assign([TopicPartition(topic, p, ends[p][0]) for p in want])
        position = {p: ends[p][0] for p in want}
        deadline = time.monotonic() + 120
        while any(position[p] < want[p] for p in want) and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF and (msg.offset() or 0) >= want.get(msg.partition(), 0):
                    position[msg.partition()] = want[msg.partition()]
                continue
            out.append(msg)
            position[msg.partition()] = (msg.offset() or 0) + 1
    finally:
        consumer.close()
    return out


def checkpoint_figures(messages: list[Any]) -> dict[str, Any]:
    """The checkpoint topic as written (records, bytes) and as compaction leaves it (latest value per key)."""
    latest: dict[bytes, Any] = {}
    for msg in sorted(messages, key=lambda m: (m.partition(), m.offset())):
        latest[msg.key()] = msg.value()
    live = {k: v for k, v in latest.items() if v is not None}
    return {"records": len(messages), "bytes": sum(len(m.key() or b"") + len(m.value() or b"") for m in messages),
            "tombstones": sum(1 for m in messages if m.value() is None), "keys": len(latest),
            "live_keys": len(live), "live_bytes": sum(len(v) for v in live.values()),
            "live_calls": sorted(k.decode(errors="replace") for k in live)}
