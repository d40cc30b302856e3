"""Read side of the store, for ``callqa report`` and the worker's web API.

Every query reads the ``<table>_deduped`` views (``FINAL``), so replayed rows count once. Functions
take a clickhouse-connect client whose database is the callqa database (``connect()`` gives one).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from clickhouse_connect.driver.client import Client

from pipeline.store.client import connect


@dataclass(frozen=True)
class CallSummary:
    """One call as supervisors see it: its state, how much was transcribed, its latest QA score."""

    call_id: str
    tenant: str
    agent_id: str
    queue: str
    direction: str
    legs: list[str]
    started_at: datetime
    ended_at: datetime | None
    end_reason: str
    segments: int
    audio_ms: int
    final_segments: int
    transcript_chars: int
    score_pct: float | None
    auto_failed: bool | None
    qa_computed_at: datetime | None


@dataclass(frozen=True)
class TranscriptLine:
    segment_id: str
    leg: str
    start_ms: int
    end_ms: int
    text: str
    confidence: float
    is_final: bool


@dataclass(frozen=True)
class LatencyPercentiles:
    """End-to-end latency over ``count`` segments (milliseconds); NaN-free: None when count is 0."""

    count: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    max_ms: float | None


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    types: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool


_SUMMARY_SQL = """
SELECT c.call_id, c.tenant, c.agent_id, c.queue, c.direction, c.legs, c.started_at, c.ended_at,
       c.end_reason, c.segments, c.audio_ms,
       ifNull(s.final_segments, 0), ifNull(s.transcript_chars, 0),
       q.score_pct, q.auto_failed, q.computed_at
FROM (SELECT * FROM calls_deduped WHERE {where}) AS c
LEFT JOIN (
    SELECT call_id, countIf(is_final = 1) AS final_segments,
           sumIf(length(text), is_final = 1) AS transcript_chars
    FROM segments_deduped
    WHERE call_id IN (SELECT call_id FROM calls_deduped WHERE {where})
    GROUP BY call_id
) AS s ON s.call_id = c.call_id
LEFT JOIN (
    SELECT call_id, score_pct, auto_failed, computed_at
    FROM call_qa_deduped
    WHERE call_id IN (SELECT call_id FROM calls_deduped WHERE {where})
) AS q ON q.call_id = c.call_id
ORDER BY c.started_at DESC, c.call_id
LIMIT {{limit:UInt32}}
SETTINGS join_use_nulls = 1
"""


def _summary_from_row(row: Sequence[Any]) -> CallSummary:
    return CallSummary(
        call_id=row[0],
        tenant=row[1],
        agent_id=row[2],
        queue=row[3],
        direction=row[4],
        legs=list(row[5]),
        started_at=row[6],
        ended_at=row[7],
        end_reason=row[8],
        segments=int(row[9]),
        audio_ms=int(row[10]),
        final_segments=int(row[11]),
        transcript_chars=int(row[12]),
        score_pct=None if row[13] is None else float(row[13]),
        auto_failed=None if row[14] is None else bool(row[14]),
        qa_computed_at=row[15],
    )


def list_calls(
    client: Client,
    *,
    tenant: str | None = None,
    agent_id: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 100,
) -> list[CallSummary]:
    """Summaries of calls started in [since, until), newest first, optionally of one tenant/agent."""
    clauses = ["1"]
    params: dict[str, Any] = {"limit": limit}
    for column, value, ch_type, op in (
        ("tenant", tenant, "String", "="),
        ("agent_id", agent_id, "String", "="),
        ("started_at", since, "DateTime64(3, 'UTC')", ">="),
        ("started_at", until, "DateTime64(3, 'UTC')", "<"),
    ):
        if value is not None:
            name = f"p{len(params)}"
            clauses.append(f"{column} {op} {{{name}:{ch_type}}}")
            params[name] = value
    sql = _SUMMARY_SQL.format(where=" AND ".join(clauses))
    return [_summary_from_row(r) for r in client.query(sql, parameters=params).result_rows]


def call_summary(client: Client, call_id: str) -> CallSummary | None:
    """The summary of one call, or None if the store has no such call."""
    sql = _SUMMARY_SQL.format(where="call_id = {call_id:String}")
    rows = client.query(sql, parameters={"call_id": call_id, "limit": 1}).result_rows
    return _summary_from_row(rows[0]) if rows else None


def transcript(client: Client, call_id: str, *, finals_only: bool = True) -> list[TranscriptLine]:
    """A call's segments, each once (latest version), ordered by start time then leg."""
    rows = client.query(
        """
        SELECT segment_id, leg, start_ms, end_ms, text, confidence, is_final
        FROM segments_deduped
        WHERE call_id = {call_id:String} AND (is_final = 1 OR NOT {finals_only:Bool})
        ORDER BY start_ms, leg, segment_id
        """,
        parameters={"call_id": call_id, "finals_only": finals_only},
    ).result_rows
    return [
        TranscriptLine(
            segment_id=r[0],
            leg=r[1],
            start_ms=int(r[2]),
            end_ms=int(r[3]),
            text=r[4],
            confidence=float(r[5]),
            is_final=bool(r[6]),
        )
        for r in rows
    ]


def latency_percentiles(
    client: Client,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    call_id: str | None = None,
) -> LatencyPercentiles:
    """Exact P50/P95/P99/max of end_to_end_ms over deduplicated latency rows in [since, until)."""
    clauses = ["1"]
    params: dict[str, Any] = {}
    if since is not None:
        clauses.append("measured_at >= {since:DateTime64(3, 'UTC')}")
        params["since"] = since
    if until is not None:
        clauses.append("measured_at < {until:DateTime64(3, 'UTC')}")
        params["until"] = until
    if call_id is not None:
        clauses.append("call_id = {call_id:String}")
        params["call_id"] = call_id
    row = client.query(
        f"""
        SELECT count(), quantilesExact(0.5, 0.95, 0.99)(end_to_end_ms), max(end_to_end_ms)
        FROM latency_deduped WHERE {" AND ".join(clauses)}
        """,
        parameters=params,
    ).result_rows[0]
    count = int(row[0])
    if count == 0:
        return LatencyPercentiles(0, None, None, None, None)
    p50, p95, p99 = (float(v) for v in row[1])
    return LatencyPercentiles(count, p50, p95, p99, float(row[2]))


# --- guarded read-only SQL for the web API ---------------------------------------------------------

READONLY_STATEMENTS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC"})
# Literals, quoted identifiers and comments are blanked before the checks, so a ';' or a keyword
# inside a string cannot hide a second statement and cannot cause a false rejection either.
_LEXEMES = re.compile(
    r"""'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.)*"|`(?:[^`\\]|\\.)*`|--[^\n]*|\#[^\n]*|/\*.*?\*/""",
    re.DOTALL,
)


class ReadonlyQueryError(ValueError):
    """The SQL is not a single read-only statement."""


def check_readonly_sql(sql: str) -> str:
    """Return the statement without a trailing ';' if it is one SELECT/WITH/SHOW/DESCRIBE, else raise."""
    blanked = _LEXEMES.sub(lambda m: " " if m.group(0)[0] in "-#/" else "''", sql).strip()
    body = blanked.rstrip(";").strip()
    if not body:
        raise ReadonlyQueryError("empty query")
    if ";" in body:
        raise ReadonlyQueryError("only one statement is allowed")
    keyword = re.split(r"[\s(]", body, maxsplit=1)[0].upper()
    if keyword not in READONLY_STATEMENTS:
        raise ReadonlyQueryError(f"{keyword} is not allowed: only SELECT, WITH, SHOW and DESCRIBE")
    if re.search(r"\bINTO\s+OUTFILE\b", body, re.IGNORECASE):
        raise ReadonlyQueryError("INTO OUTFILE is not allowed")
    return sql.strip().rstrip(";").rstrip()


def run_readonly_query(
    sql: str,
    params: dict[str, Any] | None = None,
    *,
    url: str | None = None,
    database: str | None = None,
    client: Client | None = None,
    max_rows: int = 10_000,
    max_execution_s: float = 30.0,
) -> QueryResult:
    """Run one read-only statement from an untrusted caller; rows beyond ``max_rows`` are cut off.

    The statement check is the first fence; ClickHouse's ``readonly=1`` (which also forbids table
    functions such as ``file()`` and ``url()``) is the second. ``readonly`` sticks to the session of
    an embedded chdb handle, so unless ``client`` is given the query runs on a client of its own
    (opened on ``url``/``database``, default: the configured store), never on one that also writes.
    """
    statement = check_readonly_sql(sql)
    own = client is None
    runner = client or connect(url, database, create_database=False, fresh=True)
    try:
        result = runner.query(
            statement,
            parameters=params or None,
            settings={
                "readonly": 1,
                "max_result_rows": max_rows + 1,
                "result_overflow_mode": "break",
                "max_execution_time": max_execution_s,
            },
        )
        rows = [tuple(r) for r in result.result_rows]
    finally:
        if own:
            runner.close()
    return QueryResult(
        columns=list(result.column_names),
        types=[t.name for t in result.column_types],
        rows=rows[:max_rows],
        truncated=len(rows) > max_rows,
    )
