"""What the streaming worker needs from any row store: the ``RowSink`` protocol and its counters."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

Row = Mapping[str, Any]


@dataclass(frozen=True)
class SinkStats:
    """A snapshot of a sink's counters, for Prometheus and logs."""

    rows_written: int
    """Rows acknowledged by the store (durable)."""
    inserts: int
    """Successful insert statements."""
    retries: int
    """Failed insert attempts that were (or will be) retried."""
    buffered_rows: int
    """Rows accepted by write() and not yet durable, in-flight inserts included."""
    last_error: str | None
    """The latest insert failure, ``None`` once an insert succeeds after it."""
    last_error_at: float | None
    """Unix time of ``last_error``."""


@runtime_checkable
class RowSink(Protocol):
    """Asynchronous, batched, at-least-once writer of rows into named tables.

    ``write`` may wait (back-pressure) but never drops rows; ``flush`` returns once every row written
    before the call is durable, which is when the caller may commit its Kafka offsets.
    """

    async def write(self, table: str, rows: Sequence[Row]) -> None: ...

    async def flush(self) -> None: ...

    async def close(self) -> None: ...

    @property
    def stats(self) -> SinkStats: ...
