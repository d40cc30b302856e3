"""Read side: replays read once, summaries join the latest state, percentiles.

The query API's statement check and limits are tested in test_store_sqlguard.py."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from clickhouse_connect.driver.client import Client

from pipeline.store.queries import (
    call_summary,
    latency_percentiles,
    list_calls,
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
