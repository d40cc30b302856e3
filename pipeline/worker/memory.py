"""In-memory ports of the Kafka-free core: what ``CallProcessor`` is run against without Kafka or
ClickHouse (unit tests, experiments). Beside ``checkpoints.MemoryCheckpointStore``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any

from pipeline.contracts.messages import Message, TranscriptSegment
from pipeline.store.base import Row, SinkStats


class MemoryPorts:
    """An ``OutputPort`` and a ``RowSink`` in one: keeps every message published and row written, in order;
    a publish is delivered at once, a write is durable at once."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.rows: list[tuple[str, Row]] = []
        self.tombstones: list[tuple[str, str]] = []  # (topic, key), in order

    async def publish(self, topic: str, key: str, message: Message | None, partition: int = 0) -> Awaitable[Any]:
        if message is None:
            self.tombstones.append((topic, key))
        else:
            self.messages.append(message)
        delivered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        delivered.set_result(None)
        return delivered

    async def write(self, table: str, rows: Sequence[Row]) -> None:
        self.rows += [(table, row) for row in rows]

    async def flush(self) -> None:
        return None

    async def close(self) -> None:
        return None

    @property
    def stats(self) -> SinkStats:
        return SinkStats(len(self.rows), len(self.rows), 0, 0, None, None)

    def finals(self) -> list[TranscriptSegment]:
        """The final transcript segments published, in publishing order."""
        return [m for m in self.messages if isinstance(m, TranscriptSegment) and m.is_final]
