"""Fixtures of the store tests: one migrated database per test on the session's chdb path."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from clickhouse_connect.driver.client import Client

from pipeline.store.client import connect
from pipeline.store.migrations import migrate
from pipeline.store.sink import SinkPolicy

T0 = datetime(2026, 3, 2, 9, 30, tzinfo=UTC)


@pytest.fixture
def store_url(chdb_path: str) -> str:
    return f"chdb://{chdb_path}"


@pytest.fixture
def database(unique_name: str) -> str:
    return unique_name


@pytest.fixture
def store(store_url: str, database: str) -> Iterator[Client]:
    """A client on a freshly migrated database of its own, dropped after the test."""
    client = connect(store_url, database)
    migrate(client, database)
    yield client
    client.command(f"DROP DATABASE IF EXISTS {database}")


@pytest.fixture
def closed_port_url() -> str:
    """An http URL on a 127.0.0.1 port nobody listens on: every connection is refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://default:secret@127.0.0.1:{port}"


@pytest.fixture
def fast_policy() -> SinkPolicy:
    """Small batches and quick retries so the sink tests run in well under a second each."""
    return SinkPolicy(
        batch_rows=100,
        flush_interval_s=60.0,
        max_buffered_rows=10_000,
        retry_backoff_min_s=0.01,
        retry_backoff_max_s=0.05,
    )


def _segment(
    call_id: str,
    leg: str,
    start_ms: int,
    text: str,
    *,
    is_final: int = 1,
    produced_at: datetime = T0,
) -> dict[str, Any]:
    return {
        "segment_id": f"{call_id}:{leg}:{start_ms}",
        "call_id": call_id,
        "leg": leg,
        "start_ms": start_ms,
        "end_ms": start_ms + 1500,
        "text": text,
        "confidence": 0.9,
        "avg_logprob": -0.2,
        "no_speech_prob": 0.01,
        "is_final": is_final,
        "model_name": "whisper-tiny.en",
        "model_version": 1,
        "redactions": 0,
        "produced_at": produced_at,
    }


@pytest.fixture
def make_segment() -> Callable[..., dict[str, Any]]:
    """Builds a ``segments`` row; segment_id is derived from call, leg and start like the worker's."""
    return _segment


def _latency(call_id: str, n: int, end_to_end_ms: float, measured_at: datetime = T0) -> dict[str, Any]:
    return {
        "segment_id": f"{call_id}:agent:{n * 1000}",
        "call_id": call_id,
        "leg": "agent",
        "batch_size": 4,
        "batcher_wait_ms": 5.0,
        "inference_ms": end_to_end_ms / 2,
        "frame_to_consume_ms": 2.0,
        "end_to_end_ms": end_to_end_ms,
        "worker_id": "w1",
        "measured_at": measured_at,
    }


@pytest.fixture
def make_latency() -> Callable[..., dict[str, Any]]:
    return _latency


def _call(
    call_id: str, *, ended: bool = False, updated_at: datetime = T0, tenant: str = "acme"
) -> dict[str, Any]:
    return {
        "call_id": call_id,
        "tenant": tenant,
        "agent_id": "agent-7",
        "queue": "billing",
        "direction": "inbound",
        "legs": ["agent", "customer"],
        "started_at": T0,
        "ended_at": T0 + timedelta(minutes=3) if ended else None,
        "end_reason": "end" if ended else "",
        "segments": 2 if ended else 0,
        "audio_ms": 180_000 if ended else 0,
        "updated_at": updated_at,
    }


@pytest.fixture
def make_call() -> Callable[..., dict[str, Any]]:
    return _call


def insert_rows(client: Client, table: str, rows: list[dict[str, Any]]) -> None:
    columns = list(rows[0])
    client.insert(table, [[r[c] for c in columns] for r in rows], column_names=columns)


@pytest.fixture
def insert() -> Callable[[Client, str, list[dict[str, Any]]], None]:
    """Direct insert, as a replay after a crash would do it."""
    return insert_rows


@pytest.fixture
def t0() -> datetime:
    """The time every row factory stamps by default (a Monday morning in March 2026, UTC)."""
    return T0
