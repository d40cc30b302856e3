"""Call checkpoints on the compacted checkpoint topic (see pipeline/worker/checkpoints.py).

Written keyed by call ID, on the partition number of the call's audio partition, so a worker that is
assigned audio partition p reads checkpoint partition p and nothing else; with exactly once, in audio
partition p's transaction (a checkpoint is committed with the input offsets and outputs it accounts
for), else with the worker's own (faust) producer. Read with a plain librdkafka consumer (no group, no
commits, read_committed: an aborted transaction's records are skipped) from the beginning to the end of
what is committed: compaction keeps that short, one record per call not yet forgotten. Records are
sealed with AES-256-GCM when ``CALLQA_CHECKPOINT_KEY`` is set (checkpoint_cipher.py).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable
from typing import Any

import faust
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from pipeline.broker.security import kafka_config
from pipeline.broker.transactions import PartitionTransactions
from pipeline.config import Settings
from pipeline.contracts import Serde
from pipeline.contracts.messages import CallCheckpoint
from pipeline.worker.checkpoint_cipher import CheckpointCipher

READ_TIMEOUT_S = 30.0
# The read ends at the fetch that finds nothing more, and the broker holds such a fetch for the consumer's
# fetch.wait.max.ms (librdkafka's default 500 ms): half a second more of every take-over (a restart, a
# rebalance, a crash) before the partition's calls resume. Nothing is waited for here, so it returns at once.
EOF_FETCH_WAIT_MS = 10


class CheckpointTopicError(RuntimeError):
    """The checkpoint topic could not be read (the partition's calls cannot be resumed safely)."""


class KafkaCheckpointStore:
    def __init__(self, app: faust.App, settings: Settings, serde: Serde,
                 transactions: PartitionTransactions | None = None) -> None:
        self.settings = settings
        self.serde = serde
        self.cipher = CheckpointCipher(settings.checkpoint_key.get_secret_value(),
                                       settings.checkpoint_previous_keys.get_secret_value(),
                                       settings.checkpoint_plain_accepted)
        self.transactions = transactions
        self._topic = app.topic(settings.topic_checkpoints, key_serializer="raw", value_serializer="raw")

    async def save(self, partition: int, call_id: str, checkpoint: CallCheckpoint | None) -> Awaitable[Any]:
        value = None if checkpoint is None else self.cipher.seal(call_id, self.serde.encode(checkpoint))
        if self.transactions is not None:
            return await self.transactions.send(partition, self.settings.topic_checkpoints, call_id.encode(),
                                                value, to_partition=partition)
        fut: Awaitable[Any] = await self._topic.send(key=call_id.encode(), value=value, partition=partition)
        return fut

    async def load(self, partition: int) -> dict[str, CallCheckpoint]:
        return await asyncio.to_thread(self._read, partition)

    def _read(self, partition: int) -> dict[str, CallCheckpoint]:
        topic = self.settings.topic_checkpoints
        # read_committed (also librdkafka's default): records of a transaction that was aborted, or that the
        # partition's new owner is aborting, are never read. The end is where the partition reports EOF:
        # with transactions, the last offsets are commit markers, which no poll returns.
        consumer = Consumer({**kafka_config(self.settings), "group.id": f"callqa-checkpoints-{uuid.uuid4().hex}",
                             "enable.auto.commit": False, "enable.partition.eof": True,
                             "isolation.level": "read_committed", "fetch.wait.max.ms": EOF_FETCH_WAIT_MS})
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=READ_TIMEOUT_S)
            # Raw values first, decoded once per surviving key at the end: the uncompacted head holds many
            # versions of each open call's checkpoint (tens of KB each), and a take-over's stall is this read.
            latest: dict[str, bytes] = {}
            if high <= low:
                return {}
            consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
            position = low
            while position < high:
                msg = consumer.poll(READ_TIMEOUT_S)
                if msg is None:
                    raise CheckpointTopicError(f"{topic}[{partition}]: no record in {READ_TIMEOUT_S:.0f} s "
                                               f"at offset {position} of {high}")
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        break  # the end of what is committed
                    raise CheckpointTopicError(f"{topic}[{partition}]: {error}")
                position = (msg.offset() or 0) + 1
                key = (msg.key() or b"").decode("utf-8", errors="replace")
                value = msg.value()
                if value is None:  # a tombstone: the call is forgotten
                    latest.pop(key, None)
                else:
                    latest[key] = value
            return {key: self.serde.decode(self.cipher.open(key, value), CallCheckpoint)
                    for key, value in latest.items()}
        except Exception as exc:
            if isinstance(exc, CheckpointTopicError):
                raise
            raise CheckpointTopicError(f"{topic}[{partition}]: {exc}") from exc
        finally:
            consumer.close()
