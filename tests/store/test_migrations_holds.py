"""Migration 4: the calls table keeps when a call was on hold, and its view shows it."""

from __future__ import annotations

from datetime import UTC, datetime

from pipeline.contracts.messages import CallEvent
from pipeline.qa.scorecard import CallQaResult
from pipeline.store.client import connect
from pipeline.store.migrations import MIGRATIONS, migrate
from pipeline.store.queries import run_readonly_query
from pipeline.worker.outputs import call_qa_message, call_row
from pipeline.worker.state import CallState

T0 = datetime(2026, 3, 2, 9, 30, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)


def _insert(client, row: dict) -> None:  # type: ignore[no-untyped-def]
    client.insert("calls", [list(row.values())], column_names=list(row))


def test_old_calls_read_no_holds_and_the_workers_row_keeps_its_intervals(store_url: str, database: str) -> None:
    client = connect(store_url, database)
    try:
        migrate(client, database, MIGRATIONS[:3])  # a store as it was before the intervals, with a call in it
        _insert(client, {"call_id": "old", "started_at": T0, "updated_at": T0, "hold_ms": 7000})
        assert migrate(client, database) == [m.version for m in MIGRATIONS[3:]]

        # The worker's own row for a call held twice, the second hold still open when the audio ended.
        call = CallState("new", start=CallEvent("new", "start", tenant="acme"), started_at_ms=T0_MS,
                         holds_ms=[(3_000, 7_500)], held_from_ms=20_000)
        result = CallQaResult("new", 80.0, False, [], {"hold_ms": 6_500}, [], "default")
        qa = call_qa_message("new", result, call.start, call.hold_intervals(22_000))
        _insert(client, call_row(call, qa, call.start, "end", 22_000, T0_MS + 22_000))

        rows = dict(client.query("SELECT call_id, holds FROM calls_deduped").result_rows)
        # A named tuple comes back as a mapping of its element names.
        assert rows == {"old": [], "new": [{"start_ms": 3_000, "end_ms": 7_500}, {"start_ms": 20_000, "end_ms": 22_000}]}
        # The query API (the call pages' path) reads the column by name like any other.
        got = run_readonly_query("SELECT holds FROM calls_deduped WHERE call_id = 'new'", url=store_url,
                                 database=database)
        assert got.rows[0][0] == rows["new"]
    finally:
        client.command(f"DROP DATABASE IF EXISTS {database}")
