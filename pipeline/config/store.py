"""Settings of the ClickHouse store."""

from __future__ import annotations

from pydantic import BaseModel, Field


class StoreSettings(BaseModel):
    clickhouse_url: str = Field(
        "",
        description="chdb:///abs/path (embedded engine) or http(s)://host:8123; empty means chdb under state_dir.",
    )
    clickhouse_database: str = Field("callqa", description="ClickHouse database for callqa tables.")
