"""Migration 3: sentiment, longest monologue and hold time columns on a store that has data."""

from __future__ import annotations

from datetime import UTC, datetime

from pipeline.contracts.messages import TranscriptSegment
from pipeline.store.client import connect
from pipeline.store.migrations import MIGRATIONS, migrate
from pipeline.store.queries import run_readonly_query
from pipeline.worker.outputs import segment_row

T0 = datetime(2026, 3, 2, 9, 30, tzinfo=UTC)
NEW_CALL_COLUMNS = ["customer_sentiment", "customer_sentiment_start", "customer_sentiment_end",
                    "agent_sentiment_start", "agent_sentiment_end", "longest_monologue_ms", "hold_ms"]


def _insert(client, table: str, row: dict) -> None:  # type: ignore[no-untyped-def]
    client.insert(table, [list(row.values())], column_names=list(row))


def _call(call_id: str, **extra: object) -> dict:  # type: ignore[type-arg]
    return {"call_id": call_id, "tenant": "t", "agent_id": "a", "queue": "q", "direction": "inbound",
            "legs": ["agent", "customer"], "started_at": T0, "ended_at": T0, "end_reason": "end", "segments": 1,
            "audio_ms": 1000, "updated_at": T0, **extra}


def test_old_rows_read_zero_and_new_rows_keep_their_figures_through_the_views(store_url: str,
                                                                               database: str) -> None:
    client = connect(store_url, database)
    try:
        migrate(client, database, MIGRATIONS[:2])  # a store as it was before migration 3, with a call in it
        _insert(client, "calls", _call("old"))
        # Up to the current schema: the new rows are today's worker's, which always runs on a migrated store.
        assert migrate(client, database) == [m.version for m in MIGRATIONS[2:]]

        figures = dict(zip(NEW_CALL_COLUMNS, [-1.5, -2.0, 1.25, 2.0, 1.5, 38050, 20000], strict=True))
        _insert(client, "calls", _call("new", **figures))
        final = TranscriptSegment("new/customer/000001000", "new", "customer", 1000, 2000, "Thank you.", True,
                                  0.9, -0.1, 0.01, "m", 1, produced_at_ms=1_772_443_800_000, sentiment=1.8)
        client.insert("segments", [list(segment_row(final).values())], column_names=list(segment_row(final)))

        columns = ", ".join(NEW_CALL_COLUMNS)
        rows = {r[0]: r[1:] for r in client.query(f"SELECT call_id, {columns} FROM calls_deduped").result_rows}
        assert rows["old"] == (0.0, 0.0, 0.0, 0.0, 0.0, 0, 0)
        assert rows["new"] == tuple(figures.values())
        # The query API reads them like any other column (the guard allows tables and functions, not columns).
        got = run_readonly_query("SELECT call_id, customer_sentiment_end, hold_ms FROM calls_deduped "
                                 "ORDER BY call_id", url=store_url, database=database)
        assert got.rows == [("new", 1.25, 20000), ("old", 0.0, 0)]
        segment = run_readonly_query("SELECT text, sentiment FROM segments_deduped", url=store_url,
                                     database=database)
        assert segment.rows == [("Thank you.", 1.7999999523162842)]  # Float32
    finally:
        client.command(f"DROP DATABASE IF EXISTS {database}")



def test_the_report_shows_the_customers_sentiment_per_call_and_per_turn(store, store_url: str,  # type: ignore[no-untyped-def]
                                                                        database: str) -> None:
    from rich.console import Console

    from pipeline.config import Settings
    from pipeline.contracts.messages import CallQA
    from pipeline.report import StoreSource, print_report, read_report
    from pipeline.worker.outputs import call_qa_row

    _insert(store, "calls", _call("c1", customer_sentiment=-1.5))
    qa = CallQA("c1", 80.0, False, {"customer_sentiment": -1.5}, [], [], computed_at_ms=1_772_443_800_000)
    store.insert("call_qa", [list(call_qa_row(qa).values())], column_names=list(call_qa_row(qa)))
    for start, text, score in ((1000, "This is a disgrace.", -2.9), (5000, "Thank you.", 1.8)):
        row = segment_row(TranscriptSegment(f"c1/customer/{start:09d}", "c1", "customer", start, start + 2000, text,
                                            True, 0.9, -0.1, 0.01, "m", 1, produced_at_ms=1_772_443_800_000,
                                            sentiment=score))
        store.insert("segments", [list(row.values())], column_names=list(row))

    source = StoreSource(Settings(clickhouse_url=store_url, clickhouse_database=database))
    report = read_report(source, database, call_id="c1")
    assert report.calls[0].customer_sentiment == -1.5
    assert report.call is not None and [round(t.sentiment, 1) for t in report.call.transcript] == [-2.9, 1.8]
    console = Console(record=True, width=160)
    print_report(report, console)
    text = console.export_text()
    assert "customer" in text and "-1.5" in text and "sentiment" in text and "+1.8" in text
