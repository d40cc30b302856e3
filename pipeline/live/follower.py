"""The live desk's reader: the live-calls, transcripts and QA topics, every partition, into a ``LiveBoard``.

No consumer group (it commits nothing and shares nothing: every desk reads everything) and read_uncommitted:
a final shows when the worker releases it, not a commit interval later; what an aborted transaction held is
published again by the call's next owner under the same ids, which the board takes as one.

Start: the live-calls topic from its beginning (compacted: the calls in progress, and tombstones of those
ended lately) up to its end, then the transcripts and alerts from a little before the oldest call in
progress started (at most ``live_lookback_s`` back), then all three as they come. Runs on a thread of its own;
the board is fed on the event loop, in batches.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, TopicPartition

from pipeline.broker.security import kafka_config
from pipeline.config import Settings
from pipeline.contracts.messages import LiveCall, Message, QaAlert, TranscriptSegment
from pipeline.contracts.serde import ContractError, Serde
from pipeline.live.board import LiveBoard

log = logging.getLogger("callqa.live")
# Transcripts and alerts read from this long before the oldest call in progress started: a call's start
# event can come a little after its first frames.
READ_BACK_MARGIN_MS = 10_000
POLL_S = 0.1
BATCH = 500
RETRY_S = 2.0

Feed = list[tuple[str, LiveCall | TranscriptSegment | QaAlert | None]]


class LiveFollower:
    """Follows the topics on a thread; ``start(loop)``, ``stop()``."""

    def __init__(self, settings: Settings, board: LiveBoard, serde: Serde | None = None) -> None:
        self.settings = settings
        self.board = board
        self.serde = serde or Serde.from_settings(settings.schema_registry_url)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.undecodable = 0

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        def feed(batch: Feed) -> None:
            loop.call_soon_threadsafe(self.board.apply, batch)

        def ready() -> None:
            loop.call_soon_threadsafe(self.board.mark_ready)

        self._thread = threading.Thread(target=self._run, args=(feed, ready), name="callqa-live-follower",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self, feed: Callable[[Feed], None], ready: Callable[[], None]) -> None:
        said = ""
        while not self._stop.is_set():
            try:
                self._follow(feed, ready)
            except Exception as exc:  # noqa: BLE001 - the desk keeps trying; the workers never wait on it
                why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                if why != said:  # once per cause, not every retry
                    log.warning("live desk: reading the topics failed (%s); trying again every %.0f s", why, RETRY_S)
                    said = why
                self._stop.wait(RETRY_S)

    def _follow(self, feed: Callable[[Feed], None], ready: Callable[[], None]) -> None:
        s = self.settings
        consumer = Consumer({**kafka_config(s), "group.id": f"callqa-live-{uuid.uuid4().hex}",
                             "enable.auto.commit": False, "enable.partition.eof": True,
                             "isolation.level": "read_uncommitted", "fetch.wait.max.ms": 100,
                             "auto.offset.reset": "earliest"})
        try:
            started = self._read_calls_in_progress(consumer, feed)
            ready()
            now = int(time.time() * 1000)
            from_ms = max(now - int(s.live_lookback_s * 1000), min([now, *started]) - READ_BACK_MARGIN_MS)
            turns = [tp for topic in (s.topic_transcripts, s.topic_qa) for tp in _partitions(consumer, topic)]
            for tp in turns:
                tp.offset = from_ms
            found = consumer.offsets_for_times(turns, timeout=10.0) if turns else []
            consumer.incremental_assign([TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0
                                                        else OFFSET_END) for tp in found])
            while not self._stop.is_set():
                # The first message as soon as it comes, then what else is there: consume() alone waits out
                # its whole timeout unless the batch fills, which held every final up to that long.
                first = consumer.poll(POLL_S)
                if first is None:
                    continue
                batch = self._decode([first, *consumer.consume(BATCH, 0)])
                if batch:
                    feed(batch)
        finally:
            consumer.close()

    def _read_calls_in_progress(self, consumer: Consumer, feed: Callable[[Feed], None]) -> list[int]:
        """The live-calls topic from its beginning to its end: the calls in progress (fed), and when each
        started."""
        partitions = _partitions(consumer, self.settings.topic_live_calls)
        if not partitions:
            raise RuntimeError(f"topic {self.settings.topic_live_calls} not found")
        consumer.assign([TopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING) for tp in partitions])
        # Read up to each partition's end as it is now (read_uncommitted: the log's end): an empty partition
        # is done at once (no end-of-partition event comes for it), the others at their last record or EOF.
        ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=10.0) for tp in partitions}
        open_ends = {p for p, (low, high) in ends.items() if high > low}
        started: dict[str, int] = {}
        while open_ends and not self._stop.is_set():
            messages = consumer.consume(BATCH, 1.0)
            for msg in messages:
                error, partition = msg.error(), msg.partition() or 0
                at_end = (error.code() == KafkaError._PARTITION_EOF if error is not None
                          else (msg.offset() or 0) + 1 >= ends[partition][1])
                if at_end:
                    open_ends.discard(partition)
            batch = self._decode(messages)
            for call_id, message in batch:
                if message is None:
                    started.pop(call_id, None)
                elif isinstance(message, LiveCall):
                    started[call_id] = message.started_at_ms
            if batch:
                feed(batch)
        return list(started.values())

    def _decode(self, messages: list[Any]) -> Feed:
        out: Feed = []
        for msg in messages:
            if msg.error() is not None:
                continue  # end of a partition, or a transient error librdkafka retries
            key = (msg.key() or b"").decode("utf-8", errors="replace")
            value = msg.value()
            if value is None:
                if msg.topic() == self.settings.topic_live_calls:
                    out.append((key, None))
                continue
            try:
                message: Message = self.serde.decode_any(value)
            except ContractError:
                self.undecodable += 1
                if self.undecodable == 1 or self.undecodable % 1000 == 0:
                    log.warning("live desk: %d undecodable messages skipped (last on %s[%d] at %d)",
                                self.undecodable, msg.topic(), msg.partition(), msg.offset())
                continue
            if isinstance(message, LiveCall | TranscriptSegment | QaAlert):
                out.append((key, message))
        return out


def _partitions(consumer: Consumer, topic: str) -> list[TopicPartition]:
    meta = consumer.list_topics(topic, timeout=10.0).topics.get(topic)
    if meta is None or meta.error is not None:
        return []
    return [TopicPartition(topic, p) for p in sorted(meta.partitions)]
