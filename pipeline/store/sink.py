"""Batched, at-least-once ClickHouse writer for the asyncio worker.

``write`` appends rows to a per-(table, columns) buffer; a background task turns buffers into inserts
of at most ``batch_rows`` rows, as soon as a buffer is full or once its oldest row has waited
``flush_interval_s``. Inserts run in a thread (clickhouse-connect is synchronous). A failed insert is
retried with capped exponential backoff until it succeeds or the sink is closed: rows are never
dropped, and a table's rows reach ClickHouse in the order they were written. A retry after a lost
response can insert a batch twice; the ReplacingMergeTree tables absorb that like any replay.

The buffer is bounded: when ``max_buffered_rows`` are waiting, ``write`` waits, which is the
back-pressure that pauses Kafka consumption while the store is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from clickhouse_connect.driver.client import Client

from pipeline.config import Settings, get_settings
from pipeline.store.base import Row, SinkStats
from pipeline.store.client import check_identifier, connect

log = logging.getLogger(__name__)

ClientFactory = Callable[[], Client]


class SinkClosedError(RuntimeError):
    """write() or flush() on a closed sink."""


class UndeliveredRowsError(RuntimeError):
    """close() gave up before every row was durable; those rows were not committed upstream either."""

    def __init__(self, rows: int, last_error: str | None) -> None:
        super().__init__(f"{rows} rows not written to ClickHouse at close (last error: {last_error})")
        self.rows = rows


@dataclass(frozen=True)
class SinkPolicy:
    """Batching, back-pressure and retry knobs of a sink."""

    batch_rows: int = 1000
    flush_interval_s: float = 1.0
    max_buffered_rows: int = 50_000
    retry_backoff_min_s: float = 0.2
    retry_backoff_max_s: float = 30.0

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> SinkPolicy:
        s = settings or get_settings()
        return cls(
            batch_rows=s.store_batch_rows,
            flush_interval_s=s.store_flush_interval_s,
            max_buffered_rows=s.store_max_buffered_rows,
            retry_backoff_min_s=s.store_retry_backoff_min_s,
            retry_backoff_max_s=s.store_retry_backoff_max_s,
        )

    def backoff(self, failures: int) -> float:
        """Wait before the next attempt after ``failures`` consecutive failures (>= 1)."""
        return min(self.retry_backoff_max_s, self.retry_backoff_min_s * 2 ** min(failures - 1, 30))


@dataclass
class _Buffer:
    """Rows of one table and column list, with the write sequence number of each row."""

    table: str
    columns: tuple[str, ...]
    rows: list[list[Any]] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    oldest_at: float = 0.0


@dataclass(frozen=True)
class _Chunk:
    """One insert statement's worth of rows."""

    table: str
    columns: tuple[str, ...]
    rows: list[list[Any]]
    first_seq: int


class ClickHouseSink:
    """The worker's ``RowSink`` on ClickHouse (see the module docstring for the guarantees).

    ``client_factory`` (default: ``connect(url, database)``) is called in the insert thread whenever
    no client is open; after a failed insert the client is dropped and a new one is made, so replacing
    ``client_factory`` or calling ``retarget`` takes effect at the next attempt.
    """

    def __init__(
        self,
        url: str | None = None,
        database: str | None = None,
        *,
        policy: SinkPolicy | None = None,
        client_factory: ClientFactory | None = None,
    ) -> None:
        self.policy = policy or SinkPolicy.from_settings()
        self.client_factory: ClientFactory = client_factory or self._factory_for(url, database)
        self._client: Client | None = None
        self._buffers: OrderedDict[tuple[str, tuple[str, ...]], _Buffer] = OrderedDict()
        self._inflight: deque[_Chunk] = deque()
        self._buffered = 0
        self._next_seq = 0
        self._flush_wanted = False
        self._closing = False
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._changed = asyncio.Condition()
        self._rows_written = 0
        self._inserts = 0
        self._retries = 0
        self._last_error: str | None = None
        self._last_error_at: float | None = None

    @staticmethod
    def _factory_for(url: str | None, database: str | None) -> ClientFactory:
        # fresh=True: the sink owns and closes its client, and a cached one might be shared with readers.
        # create_database=False: migrations own the schema, and an insert-only account cannot create it.
        return lambda: connect(url, database, create_database=False, fresh=True)

    def retarget(self, url: str | None, database: str | None = None) -> None:
        """Send the next insert attempts to another store URL (e.g. after a failover)."""
        self.client_factory = self._factory_for(url, database)
        self._client = None

    @property
    def stats(self) -> SinkStats:
        return SinkStats(
            rows_written=self._rows_written,
            inserts=self._inserts,
            retries=self._retries,
            buffered_rows=self._buffered,
            last_error=self._last_error,
            last_error_at=self._last_error_at,
        )

    @property
    def error(self) -> BaseException | None:
        """Why the background flushing stopped before ``close()`` (rows would wait forever), or None.
        A failing insert is not that: it is retried until it succeeds."""
        task = self._task
        if task is None or not task.done() or self._closing or self._closed:
            return None
        if task.cancelled():
            return RuntimeError("the ClickHouse sink's flushing task was cancelled")
        return task.exception() or RuntimeError("the ClickHouse sink's flushing task ended")

    # --- writer side -------------------------------------------------------------------------------

    async def write(self, table: str, rows: Sequence[Row]) -> None:
        """Buffer ``rows`` (mappings with the same keys) for ``table``; waits while the buffer is full."""
        if not rows:
            return
        self._check_open()
        columns = tuple(rows[0].keys())
        values = [_row_values(row, columns) for row in rows]
        self._ensure_started()
        async with self._changed:
            await self._changed.wait_for(lambda: self._closed or self._has_room(len(values)))
            self._check_open()
            self._append(check_identifier(table), columns, values)

    def _has_room(self, n: int) -> bool:
        # A write larger than the whole buffer passes when the buffer is empty, or it would wait forever.
        return self._buffered == 0 or self._buffered + n <= self.policy.max_buffered_rows

    def _append(self, table: str, columns: tuple[str, ...], values: list[list[Any]]) -> None:
        buffer = self._buffers.get((table, columns))
        if buffer is None:
            buffer = self._buffers[(table, columns)] = _Buffer(table, columns)
        if not buffer.rows:
            buffer.oldest_at = time.monotonic()
        buffer.rows.extend(values)
        buffer.seqs.extend(range(self._next_seq, self._next_seq + len(values)))
        self._next_seq += len(values)
        self._buffered += len(values)
        if len(buffer.rows) >= self.policy.batch_rows:
            self._wake.set()

    async def flush(self) -> None:
        """Return once every row written before this call is durable in ClickHouse."""
        self._check_open()
        target = self._next_seq - 1
        if self._min_pending_seq() > target:
            return
        self._ensure_started()
        self._flush_wanted = True
        self._wake.set()
        async with self._changed:
            await self._changed.wait_for(
                lambda: self._min_pending_seq() > target or self._task_failed() or self._closed
            )
        self._raise_if_task_failed()
        if self._min_pending_seq() <= target:
            raise SinkClosedError("the sink was closed before these rows were durable")

    async def close(self, timeout_s: float | None = None) -> None:
        """Flush and stop. With ``timeout_s``, give up retrying then and raise ``UndeliveredRowsError``."""
        if self._closed:
            return
        self._closing = True
        self._wake.set()
        try:
            if self._task is not None:
                await asyncio.wait_for(asyncio.shield(self._task), timeout_s)
        except TimeoutError:
            assert self._task is not None
            self._task.cancel()
            raise UndeliveredRowsError(self._buffered, self._last_error) from None
        finally:
            self._closed = True
            self._drop_client()
            async with self._changed:
                self._changed.notify_all()
        self._raise_if_task_failed()

    async def __aenter__(self) -> ClickHouseSink:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self._closing or self._closed:
            raise SinkClosedError("the ClickHouse sink is closed")

    def _ensure_started(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="clickhouse-sink")

    def _task_failed(self) -> bool:
        return self._task is not None and self._task.done() and not self._task.cancelled()

    def _raise_if_task_failed(self) -> None:
        if self._task_failed():
            assert self._task is not None
            self._task.result()

    def _min_pending_seq(self) -> float:
        firsts = [c.first_seq for c in self._inflight] + [b.seqs[0] for b in self._buffers.values() if b.seqs]
        return min(firsts, default=float("inf"))

    # --- background task ---------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            take_all = await self._wait_for_work()
            self._take(take_all)
            while self._inflight:
                await self._insert_with_retry(self._inflight[0])
                await self._mark_durable(self._inflight.popleft())
            if self._closing and self._buffered == 0:
                return

    async def _wait_for_work(self) -> bool:
        """Sleep until a buffer is full (False) or rows are due / a flush or close is asked (True)."""
        while True:
            if self._closing or self._flush_wanted:
                self._flush_wanted = False
                return True
            if any(len(b.rows) >= self.policy.batch_rows for b in self._buffers.values()):
                return False
            due_in = self._due_in()
            if due_in is not None and due_in <= 0:
                return True
            self._wake.clear()
            # A timeout just means the oldest buffered rows are now due.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), due_in)

    def _due_in(self) -> float | None:
        oldest = [b.oldest_at for b in self._buffers.values() if b.rows]
        if not oldest:
            return None
        return min(oldest) + self.policy.flush_interval_s - time.monotonic()

    def _take(self, take_all: bool) -> None:
        """Move buffered rows into in-flight chunks: full chunks only, or everything."""
        size = self.policy.batch_rows
        for buffer in self._buffers.values():
            while len(buffer.rows) >= size or (take_all and buffer.rows):
                n = min(size, len(buffer.rows))
                self._inflight.append(_Chunk(buffer.table, buffer.columns, buffer.rows[:n], buffer.seqs[0]))
                del buffer.rows[:n], buffer.seqs[:n]
                buffer.oldest_at = time.monotonic()

    async def _insert_with_retry(self, chunk: _Chunk) -> None:
        failures = 0
        while True:
            try:
                await asyncio.to_thread(self._insert, chunk)
                self._last_error = None
                return
            except Exception as exc:  # any failure is retried: nothing may be dropped
                failures += 1
                self._retries += 1
                self._last_error = f"{type(exc).__name__}: {exc}"
                self._last_error_at = time.time()
                self._drop_client()
                delay = self.policy.backoff(failures)
                log.warning(
                    "insert of %d rows into %s failed (%s); retry in %.1fs",
                    len(chunk.rows),
                    chunk.table,
                    self._last_error,
                    delay,
                )
                await asyncio.sleep(delay)

    def _insert(self, chunk: _Chunk) -> None:
        if self._client is None:
            self._client = self.client_factory()
        self._client.insert(chunk.table, chunk.rows, column_names=list(chunk.columns))

    async def _mark_durable(self, chunk: _Chunk) -> None:
        self._inserts += 1
        self._rows_written += len(chunk.rows)
        self._buffered -= len(chunk.rows)
        async with self._changed:
            self._changed.notify_all()

    def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # closing a broken connection may fail too; the client is discarded anyway
                log.debug("closing a failed ClickHouse client raised", exc_info=True)


def _row_values(row: Row, columns: tuple[str, ...]) -> list[Any]:
    if len(row) != len(columns):
        raise ValueError(f"row keys {sorted(row)} differ from the first row's {sorted(columns)}")
    return [row[c] for c in columns]
