"""The batched sink: batching by count and by time, retry without loss, order, back-pressure."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from clickhouse_connect.driver.client import Client

from pipeline.store.sink import ClickHouseSink, SinkClosedError, SinkPolicy, UndeliveredRowsError


async def eventually(predicate: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Wait until predicate() holds; fail the test if it never does."""
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.01)


def count(client: Client, sql: str) -> int:
    return int(client.query(sql).result_rows[0][0])


def segments(make_segment: Callable[..., dict[str, Any]], call_id: str, n: int) -> list[dict[str, Any]]:
    return [make_segment(call_id, "agent", i * 1000, f"words {i}") for i in range(n)]


async def test_full_batches_are_inserted_without_waiting_for_the_interval(
    store: Client, store_url: str, database: str, fast_policy: SinkPolicy, make_segment: Callable[..., Any]
) -> None:
    sink = ClickHouseSink(store_url, database, policy=fast_policy)  # interval 60 s: only count triggers
    await sink.write("segments", segments(make_segment, "c1", 250))
    await eventually(lambda: sink.stats.inserts == 2)
    assert count(store, "SELECT count() FROM segments") == 200
    assert sink.stats.buffered_rows == 50
    await sink.flush()
    assert count(store, "SELECT count() FROM segments") == 250
    assert sink.stats.inserts == 3 and sink.stats.rows_written == 250
    await sink.close()


async def test_a_partial_batch_is_inserted_after_the_flush_interval(
    store: Client, store_url: str, database: str, fast_policy: SinkPolicy, make_segment: Callable[..., Any]
) -> None:
    policy = replace(fast_policy, batch_rows=1000, flush_interval_s=0.2)
    sink = ClickHouseSink(store_url, database, policy=policy)
    await sink.write("segments", segments(make_segment, "c1", 10))
    await eventually(lambda: sink.stats.buffered_rows == 0)  # no flush() call: only the timer can do this
    assert sink.stats.inserts == 1
    assert count(store, "SELECT count() FROM segments") == 10
    await sink.close()


async def test_store_outage_then_recovery_loses_nothing_and_duplicates_nothing(
    store: Client,
    store_url: str,
    database: str,
    closed_port_url: str,
    fast_policy: SinkPolicy,
    make_segment: Callable[..., Any],
) -> None:
    store.command("CREATE TABLE write_order (n UInt32) ENGINE = Log")
    sink = ClickHouseSink(closed_port_url, database, policy=fast_policy)
    for start in range(0, 250, 50):
        await sink.write("segments", segments(make_segment, f"c{start}", 50))
        await sink.write("write_order", [{"n": n} for n in range(start, start + 50)])
    await eventually(lambda: sink.stats.retries >= 3)
    assert sink.stats.last_error is not None and "127.0.0.1" in sink.stats.last_error
    assert "secret" not in sink.stats.last_error  # errors go to logs and metrics: no password
    assert sink.stats.buffered_rows == 500 and sink.stats.rows_written == 0
    assert count(store, "SELECT count() FROM segments") == 0

    sink.retarget(store_url, database)  # the store is back
    await sink.flush()

    assert count(store, "SELECT count() FROM segments") == 250  # raw rows: no FINAL, so no copy hides
    assert count(store, "SELECT uniqExact(segment_id) FROM segments") == 250
    order = [r[0] for r in store.query("SELECT n FROM write_order SETTINGS max_threads = 1").result_rows]
    assert order == list(range(250))
    assert sink.stats.rows_written == 500 and sink.stats.last_error is None
    await sink.close()


async def test_write_waits_while_the_buffer_is_full(
    store: Client,
    store_url: str,
    database: str,
    closed_port_url: str,
    fast_policy: SinkPolicy,
    make_segment: Callable[..., Any],
) -> None:
    sink = ClickHouseSink(closed_port_url, database, policy=replace(fast_policy, max_buffered_rows=100))
    await sink.write("segments", segments(make_segment, "c1", 100))
    blocked = asyncio.create_task(sink.write("segments", segments(make_segment, "c2", 10)))
    await eventually(lambda: sink.stats.retries >= 2)
    assert not blocked.done()
    assert sink.stats.buffered_rows == 100

    sink.retarget(store_url, database)
    await asyncio.wait_for(blocked, 20)
    await sink.flush()
    assert count(store, "SELECT count() FROM segments") == 110
    await sink.close()


async def test_close_gives_up_after_its_timeout_and_says_how_many_rows_are_undelivered(
    database: str, closed_port_url: str, fast_policy: SinkPolicy, make_segment: Callable[..., Any]
) -> None:
    sink = ClickHouseSink(closed_port_url, database, policy=fast_policy)
    await sink.write("segments", segments(make_segment, "c1", 30))
    with pytest.raises(UndeliveredRowsError) as raised:
        await sink.close(timeout_s=0.3)
    assert raised.value.rows == 30
    with pytest.raises(SinkClosedError):
        await sink.write("segments", segments(make_segment, "c1", 1))


async def test_close_flushes_what_is_buffered(
    store: Client, store_url: str, database: str, fast_policy: SinkPolicy, make_segment: Callable[..., Any]
) -> None:
    async with ClickHouseSink(store_url, database, policy=fast_policy) as sink:
        await sink.write("segments", segments(make_segment, "c1", 42))
    assert count(store, "SELECT count() FROM segments") == 42


async def test_rows_with_different_keys_in_one_write_are_refused(
    database: str, fast_policy: SinkPolicy, make_segment: Callable[..., Any], store_url: str
) -> None:
    sink = ClickHouseSink(store_url, database, policy=fast_policy)
    rows = segments(make_segment, "c1", 2)
    del rows[1]["text"]
    with pytest.raises(ValueError, match="differ"):
        await sink.write("segments", rows)
    await sink.close()


async def test_a_flush_waiting_when_close_gives_up_is_told_its_rows_are_not_durable(
    database: str, closed_port_url: str, fast_policy: SinkPolicy, make_segment: Callable[..., Any]
) -> None:
    sink = ClickHouseSink(closed_port_url, database, policy=fast_policy)
    await sink.write("segments", segments(make_segment, "c1", 5))
    waiting = asyncio.create_task(sink.flush())
    await eventually(lambda: sink.stats.retries >= 1)
    with pytest.raises(UndeliveredRowsError):
        await sink.close(timeout_s=0.2)
    with pytest.raises(SinkClosedError, match="before these rows were durable"):
        await asyncio.wait_for(waiting, 5)
