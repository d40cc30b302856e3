"""Settings of the ClickHouse store."""

from __future__ import annotations

from pydantic import BaseModel, Field


class StoreSettings(BaseModel):
    clickhouse_url: str = Field(
        "",
        description="chdb:///abs/path (embedded engine) or http(s)://host:8123; empty means chdb under state_dir.",
    )
    clickhouse_database: str = Field("callqa", description="ClickHouse database for callqa tables.")
    store_batch_rows: int = Field(
        1000, ge=1, description="The sink flushes a table's buffer once it holds this many rows."
    )
    store_flush_interval_s: float = Field(
        1.0, gt=0, description="The sink flushes buffered rows at least this often (seconds)."
    )
    store_max_buffered_rows: int = Field(
        50_000,
        ge=1,
        description="Rows the sink holds before write() waits (back-pressure that pauses Kafka consumption).",
    )
    store_retry_backoff_min_s: float = Field(
        0.2, gt=0, description="First wait before retrying a failed ClickHouse insert (seconds)."
    )
    store_retry_backoff_max_s: float = Field(
        30.0, gt=0, description="Cap of the exponential wait between insert retries (seconds)."
    )
    store_insert_timeout_s: float = Field(
        30.0, gt=0, description="Send/receive timeout of one ClickHouse HTTP request, inserts included (seconds)."
    )
    store_connect_timeout_s: float = Field(
        5.0, gt=0, description="Connect timeout to a ClickHouse HTTP server (seconds)."
    )
