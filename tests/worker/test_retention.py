"""The worker's sweeper: erases calls past retention on the store it is given; a store that is away is logged and
retried at the next interval, never fatal."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest

from pipeline.broker.local import free_port
from pipeline.config import Settings
from pipeline.store.client import connect
from pipeline.store.erasure import erasures_of, rows_of
from pipeline.store.migrations import migrate
from pipeline.worker.retention import sweep_now


async def test_a_sweep_erases_calls_past_retention(chdb_path: str, unique_name: str) -> None:
    client = connect(f"chdb://{chdb_path}", unique_name)
    migrate(client, unique_name)
    now = datetime.now(UTC)
    for call_id, started in (("old", now - timedelta(days=31)), ("recent", now - timedelta(days=29))):
        client.insert("calls", [[call_id, started, started, started]],
                      column_names=["call_id", "started_at", "ended_at", "updated_at"])
    try:
        settings = Settings(clickhouse_url=f"chdb://{chdb_path}", clickhouse_database=unique_name,
                            retention_days_transcripts=30)
        done = await sweep_now(settings)
        assert [(e.call_id, e.reason) for e in done] == [("old", "retention")]
        assert rows_of(client, unique_name, ["old", "recent"]) == {"old": {}, "recent": {"calls": 1}}
        assert erasures_of(client, unique_name, "old")[0].erased_by == "retention"
    finally:
        client.command(f"DROP DATABASE IF EXISTS {unique_name}")


async def test_a_store_that_is_away_is_logged_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(clickhouse_url=f"http://default:x@127.0.0.1:{free_port()}", store_connect_timeout_s=1,
                        retention_days_transcripts=30)
    with caplog.at_level(logging.WARNING, "callqa.worker"):
        assert await sweep_now(settings) == []
    assert "store sweep failed (retried in 3600 s)" in caplog.text
