"""The ClickHouse store: connections, schema migrations, the batched sink and read-side queries."""

from pipeline.store.base import RowSink, SinkStats
from pipeline.store.client import ChdbPathConflictError, StoreError, connect, parse_store_url
from pipeline.store.migrations import migrate
from pipeline.store.sink import ClickHouseSink, SinkClosedError, SinkPolicy, UndeliveredRowsError

__all__ = [
    "ChdbPathConflictError",
    "ClickHouseSink",
    "RowSink",
    "SinkClosedError",
    "SinkPolicy",
    "SinkStats",
    "StoreError",
    "UndeliveredRowsError",
    "connect",
    "migrate",
    "parse_store_url",
]
