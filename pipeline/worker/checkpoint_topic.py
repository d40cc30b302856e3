"""Call checkpoints on the compacted checkpoint topic (see pipeline/worker/checkpoints.py).

Written with the worker's own (faust) producer, keyed by call ID, on the partition number of the call's
audio partition, so a worker that is assigned audio partition p reads checkpoint partition p and nothing
else. Read with a plain librdkafka consumer (no group, no commits) from the beginning to the high-water
mark: compaction keeps that short, one record per call not yet forgotten. Records are sealed with
AES-256-GCM when ``CALLQA_CHECKPOINT_KEY`` is set (checkpoint_cipher.py).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable
from typing import Any

import faust
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from pipeline.broker.security import kafka_config
from pipeline.config import Settings
from pipeline.contracts import Serde
from pipeline.contracts.messages import CallCheckpoint
from pipeline.worker.checkpoint_cipher import CheckpointCipher

READ_TIMEOUT_S = 30.0


class CheckpointTopicError(RuntimeError):
    """The checkpoint topic could not be read (the partition's calls cannot be resumed safely)."""


class KafkaCheckpointStore:
    def __init__(self, app: faust.App, settings: Settings, serde: Serde) -> None:
        self.settings = settings
        self.serde = serde
        self.cipher = CheckpointCipher(settings.checkpoint_key.get_secret_value(),
                                       settings.checkpoint_previous_keys.get_secret_value(),
                                       settings.checkpoint_plain_accepted)
        self._topic = app.topic(settings.topic_checkpoints, key_serializer="raw", value_serializer="raw")

    async def save(self, partition: int, call_id: str, checkpoint: CallCheckpoint | None) -> Awaitable[Any]:
        value = None if checkpoint is None else self.cipher.seal(call_id, self.serde.encode(checkpoint))
        fut: Awaitable[Any] = await self._topic.send(key=call_id.encode(), value=value, partition=partition)
        return fut

    async def load(self, partition: int) -> dict[str, CallCheckpoint]:
        return await asyncio.to_thread(self._read, partition)

    def _read(self, partition: int) -> dict[str, CallCheckpoint]:
        topic = self.settings.topic_checkpoints
        consumer = Consumer({**kafka_config(self.settings), "group.id": f"callqa-checkpoints-{uuid.uuid4().hex}",
                             "enable.auto.commit": False, "enable.partition.eof": False})
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=READ_TIMEOUT_S)
            out: dict[str, CallCheckpoint] = {}
            if high <= low:
                return out
            consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
            position = low
            while position < high:
                msg = consumer.poll(READ_TIMEOUT_S)
                if msg is None:
                    raise CheckpointTopicError(f"{topic}[{partition}]: no record in {READ_TIMEOUT_S:.0f} s "
                                               f"at offset {position} of {high}")
                if msg.error():
                    raise CheckpointTopicError(f"{topic}[{partition}]: {msg.error()}")
                position = (msg.offset() or 0) + 1
                key = (msg.key() or b"").decode("utf-8", errors="replace")
                value = msg.value()
                if value is None:  # a tombstone: the call is forgotten
                    out.pop(key, None)
                else:
                    out[key] = self.serde.decode(self.cipher.open(key, value), CallCheckpoint)
            return out
        except Exception as exc:
            if isinstance(exc, CheckpointTopicError):
                raise
            raise CheckpointTopicError(f"{topic}[{partition}]: {exc}") from exc
        finally:
            consumer.close()
