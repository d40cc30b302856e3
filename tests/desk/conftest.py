"""Fixtures of the QA desk tests: a migrated database of their own on the session's chdb path, rows put
in as the worker writes them, read back through the query API's check and limits."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from clickhouse_connect.driver.client import Client

from pipeline.store.queries import QueryLimits, run_readonly_query

T0 = datetime(2026, 3, 2, 9, 30, tzinfo=UTC)


class CheckedRows:
    """A ``RowSource`` that runs every SELECT as /api/query does: checked by the SQL guard, limited."""

    def __init__(self, client: Client) -> None:
        self.client, self.database = client, client.database or ""

    def rows(self, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        result = run_readonly_query(sql, params, client=self.client, database=self.database,
                                    limits=QueryLimits(max_rows=10_000))
        return [dict(zip(result.columns, row, strict=True)) for row in result.rows]


@pytest.fixture
def source(store: Client) -> CheckedRows:
    return CheckedRows(store)


def insert(client: Client, table: str, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    columns = list(rows[0])
    client.insert(table, [[r[c] for c in columns] for r in rows], column_names=columns)


@pytest.fixture
def add_call(store: Client) -> Callable[..., None]:
    """Stores a finished call as the worker does: its calls row, its final segments ((leg, start_s, text)
    each), its QA score and the rules it failed, all at ``revision``."""

    def add(call_id: str, turns: list[tuple[str, float, str]], *, agent: str = "agent-7", minute: int = 0,
            score: float | None = 80.0, failed: tuple[str, ...] = (), revision: int = 0,
            items: tuple[tuple[str, int], ...] = (), metrics: dict[str, float] | None = None,
            auto_failed: bool = False, sentiment: float = 0.0) -> None:
        started = T0 + timedelta(minutes=minute)
        updated = started + timedelta(minutes=5, seconds=revision)
        insert(store, "calls", [{
            "call_id": call_id, "tenant": "acme", "agent_id": agent, "queue": "billing", "direction": "inbound",
            "legs": ["agent", "customer"], "started_at": started, "ended_at": started + timedelta(minutes=3),
            "end_reason": "end", "segments": len(turns), "audio_ms": 180_000, "updated_at": updated,
            "revision": revision, "customer_sentiment": sentiment}])
        insert(store, "segments", [{
            "segment_id": f"{call_id}:{leg}:{round(start_s * 1000)}", "call_id": call_id, "leg": leg,
            "start_ms": round(start_s * 1000), "end_ms": round(start_s * 1000) + 1500, "text": text,
            "confidence": 0.9, "avg_logprob": -0.2, "no_speech_prob": 0.01, "is_final": 1,
            "model_name": "moonshine-base", "model_version": 1, "redactions": 0, "produced_at": updated,
            "revision": revision} for leg, start_s, text in turns])
        if score is not None:
            insert(store, "call_qa", [{
                "call_id": call_id, "tenant": "acme", "agent_id": agent, "score_pct": score,
                "auto_failed": int(auto_failed), "metrics": metrics or {}, "items.question": [q for q, _ in items],
                "items.weight": [1.0] * len(items), "items.passed": [p for _, p in items],
                "items.rationale": [""] * len(items), "computed_at": updated, "revision": revision}])
        if failed:
            insert(store, "qa_events", [{
                "call_id": call_id, "rule": rule, "category": "compliance", "leg": "agent", "kind": "missing",
                "offset_ms": 0, "text": "", "severity": "critical", "detected_at": updated, "revision": revision}
                for rule in failed])

    return add
