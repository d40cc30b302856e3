"""Read side: replays read once, summaries join the latest state, percentiles, and the read-only guard."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError

from pipeline.store.queries import (
    ReadonlyQueryError,
    call_summary,
    check_readonly_sql,
    latency_percentiles,
    list_calls,
    run_readonly_query,
    transcript,
)

Insert = Callable[[Client, str, list[dict[str, Any]]], None]


def test_a_replayed_segment_is_read_once(
    t0: datetime, store: Client, insert: Insert, make_segment: Callable[..., Any]
) -> None:
    rows = [make_segment("c1", "agent", 0, "hello"), make_segment("c1", "customer", 900, "hi there")]
    insert(store, "segments", rows)
    insert(store, "segments", [dict(r, produced_at=t0 + timedelta(minutes=5)) for r in rows])  # replay
    assert store.query("SELECT count() FROM segments").result_rows[0][0] == 4
    lines = transcript(store, "c1")
    assert [(x.leg, x.text) for x in lines] == [("agent", "hello"), ("customer", "hi there")]


def test_a_final_beats_a_partial_replayed_after_it(
    t0: datetime, store: Client, insert: Insert, make_segment: Callable[..., Any]
) -> None:
    insert(store, "segments", [make_segment("c1", "agent", 0, "hel", is_final=0)])
    insert(
        store,
        "segments",
        [make_segment("c1", "agent", 0, "hello world", produced_at=t0 + timedelta(seconds=1))],
    )
    late_partial = make_segment("c1", "agent", 0, "hel", is_final=0, produced_at=t0 + timedelta(minutes=9))
    insert(store, "segments", [late_partial])
    assert [x.text for x in transcript(store, "c1", finals_only=False)] == ["hello world"]


def test_call_summary_joins_latest_call_state_segment_count_and_latest_score(
    t0: datetime,
    store: Client,
    insert: Insert,
    make_call: Callable[..., Any],
    make_segment: Callable[..., Any],
) -> None:
    insert(store, "calls", [make_call("c1")])
    insert(store, "calls", [make_call("c1", ended=True, updated_at=t0 + timedelta(minutes=3))])
    insert(store, "calls", [make_call("c1", ended=True, updated_at=t0 + timedelta(minutes=3))])  # replay
    segs = [make_segment("c1", "agent", 0, "hello"), make_segment("c1", "customer", 900, "hi")]
    insert(store, "segments", segs + segs + [make_segment("c1", "agent", 5000, "mor", is_final=0)])
    qa = {
        "call_id": "c1",
        "tenant": "acme",
        "agent_id": "agent-7",
        "auto_failed": 0,
        "metrics": {"silence_pct": 12.5},
        "items.question": ["greeted"],
        "items.weight": [1.0],
        "items.passed": [1],
        "items.rationale": ["said hello"],
    }
    insert(store, "call_qa", [dict(qa, score_pct=50.0, computed_at=t0 + timedelta(minutes=4))])
    insert(store, "call_qa", [dict(qa, score_pct=80.0, computed_at=t0 + timedelta(minutes=6))])  # re-score

    summary = call_summary(store, "c1")
    assert summary is not None
    assert summary.end_reason == "end" and summary.ended_at is not None
    assert summary.final_segments == 2
    assert summary.transcript_chars == len("hello") + len("hi")
    assert summary.score_pct == 80.0 and summary.auto_failed is False
    assert call_summary(store, "nope") is None


def test_list_calls_filters_by_tenant_and_time_and_reports_missing_scores_as_none(
    t0: datetime, store: Client, insert: Insert, make_call: Callable[..., Any]
) -> None:
    insert(store, "calls", [make_call("c1"), make_call("c2", tenant="other")])
    insert(store, "calls", [dict(make_call("c3"), started_at=t0 + timedelta(days=40))])
    acme = list_calls(store, tenant="acme")
    assert [c.call_id for c in acme] == ["c3", "c1"]  # newest first
    assert all(c.score_pct is None and c.final_segments == 0 for c in acme)
    window = list_calls(store, since=t0 - timedelta(hours=1), until=t0 + timedelta(days=1))
    assert sorted(c.call_id for c in window) == ["c1", "c2"]


def test_latency_percentiles_count_each_segment_once_and_keep_its_first_measurement(
    t0: datetime, store: Client, insert: Insert, make_latency: Callable[..., Any]
) -> None:
    rows = [make_latency("c1", n, float(n)) for n in range(1, 101)]
    insert(store, "latency", rows)
    # A replay re-measures the same segments much later: the crash, not the pipeline.
    insert(
        store, "latency", [make_latency("c1", n, 10_000.0, t0 + timedelta(minutes=2)) for n in range(1, 11)]
    )
    lat = latency_percentiles(store)
    assert lat.count == 100
    assert lat.max_ms == 100.0
    assert lat.p50_ms is not None and 50.0 <= lat.p50_ms <= 51.0
    assert lat.p99_ms is not None and 99.0 <= lat.p99_ms <= 100.0
    assert latency_percentiles(store, since=t0 + timedelta(minutes=1)).count == 0


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO segments (segment_id) VALUES ('x')",
        "DROP TABLE segments",
        "drop database callqa",
        "SELECT 1; DROP TABLE segments",
        "/* looks harmless */ ALTER TABLE segments DELETE WHERE 1",
        "-- comment\nTRUNCATE TABLE segments",
        "SELECT * FROM segments INTO OUTFILE '/tmp/x.csv'",
        "SET readonly = 0",
        "",
    ],
)
def test_readonly_guard_rejects_anything_but_one_read(sql: str) -> None:
    with pytest.raises(ReadonlyQueryError):
        check_readonly_sql(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT ';' AS s, 'DROP TABLE x' AS t",
        "-- why\nSELECT 1",
        "with 1 AS x SELECT x",
        "SHOW TABLES",
        "DESCRIBE TABLE segments",
        "SELECT 1;",
    ],
)
def test_readonly_guard_accepts_reads(sql: str) -> None:
    assert check_readonly_sql(sql)


def test_run_readonly_query_reads_with_parameters_and_cuts_off_rows(
    store: Client, store_url: str, database: str, insert: Insert, make_segment: Callable[..., Any]
) -> None:
    insert(store, "segments", [make_segment("c1", "agent", i * 1000, f"w{i}") for i in range(30)])
    result = run_readonly_query(
        "SELECT segment_id, text FROM segments_deduped WHERE call_id = {c:String} ORDER BY start_ms",
        {"c": "c1"},
        url=store_url,
        database=database,
        max_rows=10,
    )
    assert result.columns == ["segment_id", "text"]
    assert [r[1] for r in result.rows] == [f"w{i}" for i in range(10)]
    assert result.truncated


def test_run_readonly_query_refuses_writes_and_leaves_data_intact(
    store: Client, store_url: str, database: str, insert: Insert, make_segment: Callable[..., Any]
) -> None:
    insert(store, "segments", [make_segment("c1", "agent", 0, "kept")])
    for sql in ("INSERT INTO segments (segment_id) VALUES ('x')", "DROP TABLE segments"):
        with pytest.raises(ReadonlyQueryError):
            run_readonly_query(sql, url=store_url, database=database)
    assert [x.text for x in transcript(store, "c1")] == ["kept"]


def test_server_side_readonly_blocks_table_functions(store: Client, store_url: str, database: str) -> None:
    """The second fence: a SELECT that reads a local file passes the statement check, not ClickHouse."""
    with pytest.raises(DatabaseError, match="readonly"):
        run_readonly_query(
            "SELECT * FROM file('/etc/hostname', 'LineAsString')", url=store_url, database=database
        )
    assert store.command("SELECT 1") == 1  # the writer's client is not left read-only
