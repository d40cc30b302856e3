"""Read side of the store, for ``callqa report`` and the worker's web API.

Every query reads the ``<table>_deduped`` views (``FINAL``), so replayed rows count once. Functions
take a clickhouse-connect client whose database is the callqa database (``connect()`` gives one).
``run_readonly_query`` runs an analyst's SQL: checked by ``sqlguard``, under ``QueryLimits``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError, ProgrammingError

from pipeline.config import Settings, get_settings
from pipeline.store.client import StoreError, check_identifier, connect
from pipeline.store.sqlguard import (
    CheckedQuery,
    QueryNotAllowedError,
    ReadonlyQueryError,
    check_select,
    clickhouse_error,
)


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


def after_call_sql(alias: str = "") -> str:
    """The keyset condition of a page of the call list (newest first: ``started_at`` descending, then
    ``call_id``): the calls after the one named by the parameters ``after_t`` and ``after_c``; ``alias``
    prefixes the columns (``"c."``)."""
    return (f"({alias}started_at < {{after_t:DateTime64(3, 'UTC')}} OR ({alias}started_at = "
            f"{{after_t:DateTime64(3, 'UTC')}} AND {alias}call_id > {{after_c:String}}))")


def list_calls(
    client: Client,
    *,
    tenant: str | None = None,
    agent_id: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 100,
    after: tuple[datetime, str] | None = None,
) -> list[CallSummary]:
    """Summaries of calls started in [since, until), newest first, optionally of one tenant/agent;
    ``after`` (started_at, call_id): only the calls that come after that one in this order (a page)."""
    clauses = ["1"]
    params: dict[str, Any] = {"limit": limit}
    if after is not None:
        clauses.append(after_call_sql())
        params.update(after_t=after[0], after_c=after[1])
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


@dataclass(frozen=True)
class QueryLimits:
    """Server-side limits of one API query: ClickHouse settings sent with it, which its SQL cannot change."""

    max_rows: int = 10_000
    max_result_bytes: int = 64 * 2**20
    max_execution_s: float = 30.0
    max_memory_bytes: int = 512 * 2**20
    # One ClickHouse thread per query: at most api_query_threads cores go to analysts, the rest to ingestion.
    max_threads: int = 1

    @classmethod
    def from_settings(cls, settings: Settings) -> QueryLimits:
        return cls(
            max_rows=settings.api_query_max_rows,
            max_result_bytes=settings.api_query_max_result_mb * 2**20,
            max_execution_s=settings.api_query_timeout_s,
            max_memory_bytes=settings.api_query_max_memory_mb * 2**20,
        )

    def clickhouse_settings(self, client: Client) -> dict[str, Any]:
        settings: dict[str, Any] = {
            "readonly": 1,
            "limit": self.max_rows + 1,  # one more than returned, so a cut-off answer says so
            "max_result_bytes": self.max_result_bytes,
            "result_overflow_mode": "throw",
            "max_execution_time": self.max_execution_s,
            "timeout_overflow_mode": "throw",
            "max_memory_usage": self.max_memory_bytes,
            "max_threads": self.max_threads,
        }
        # An account whose profile is read-only already may not send `readonly` again (and needs not).
        current = client.server_settings.get("readonly")
        if current is not None and current.value != "0":
            del settings["readonly"]
        return settings


class QueryFailedError(ReadonlyQueryError):
    """ClickHouse stopped a checked query: a limit was hit, or the SQL is wrong (unknown column...)."""


def check_readonly_sql(client: Client, sql: str, database: str | None = None) -> CheckedQuery:
    """One SELECT on the callqa tables, checked on ``client``'s ClickHouse (see pipeline/store/sqlguard.py)."""
    return check_select(client, sql, check_identifier(database or get_settings().clickhouse_database))


def run_readonly_query(
    sql: str,
    params: dict[str, Any] | None = None,
    *,
    url: str | None = None,
    database: str | None = None,
    client: Client | None = None,
    limits: QueryLimits | None = None,
    scope_settings: dict[str, Any] | None = None,
) -> QueryResult:
    """Run one SELECT from an untrusted caller; rows beyond ``limits.max_rows`` are cut off.

    Fences, in order: the statement check (ClickHouse parses, sqlguard walks the tree); the checked
    tree re-formatted by ClickHouse is what runs, its parameters bound by the server; ClickHouse's
    ``readonly=1`` and the limits of ``limits``, sent with the query; on a server, the read-only
    account's own grants (``clickhouse_readonly_url``). Unless ``client`` is given, the query runs on
    a client of its own opened on ``url``/``database`` (default: the configured store), never on one
    that also writes. ``scope_settings``: the caller's access scope (pipeline/access/scope.py), sent with
    the query like the limits.
    """
    limits = limits or QueryLimits()
    db = check_identifier(database or get_settings().clickhouse_database)
    own = client is None
    runner = client or connect(url, db, create_database=False, fresh=True)
    try:
        checked = check_select(runner, sql, db)
        bound = checked.bind(params)
        result = runner.query(checked.sql, parameters=bound,
                              settings={**limits.clickhouse_settings(runner), **(scope_settings or {})})
        rows = [tuple(r) for r in result.result_rows]
    except ProgrammingError as exc:
        raise _unusable_account(exc) from None
    except DatabaseError as exc:
        raise _query_failed(exc, limits) from None
    finally:
        if own:
            runner.close()
    return QueryResult(
        columns=list(result.column_names),
        types=[t.name for t in result.column_types],
        rows=rows[: limits.max_rows],
        truncated=len(rows) > limits.max_rows,
    )


def _unusable_account(exc: ProgrammingError) -> Exception:
    found = re.search(r"Setting (\w+) is readonly", str(exc))
    if not found:
        return QueryFailedError(f"query failed: {clickhouse_error(exc)[1]}")
    return StoreError(f"the read-only ClickHouse account may not set {found.group(1)}, so the API's limits "
                      "cannot be applied: give its profile readonly=2 with constraints (docker-compose.kafka.yml)")


def _query_failed(exc: DatabaseError, limits: QueryLimits) -> Exception:
    code, message = clickhouse_error(exc)
    if code == 159:  # TIMEOUT_EXCEEDED
        return QueryFailedError(f"query stopped at the API's time limit of {limits.max_execution_s:g} s "
                                "(CALLQA_API_QUERY_TIMEOUT_S)")
    if code == 241:  # MEMORY_LIMIT_EXCEEDED
        return QueryFailedError(f"query stopped at the API's memory limit of {limits.max_memory_bytes >> 20} MB "
                                "(CALLQA_API_QUERY_MAX_MEMORY_MB)")
    if code == 396:  # TOO_MANY_ROWS_OR_BYTES: the result outgrew max_result_bytes
        return QueryFailedError(f"query stopped: its result is larger than the API's limit of "
                                f"{limits.max_result_bytes >> 20} MB; select fewer columns or rows")
    if code in (164, 497):  # READONLY, ACCESS_DENIED
        return QueryNotAllowedError(f"refused by ClickHouse: {message}")
    return QueryFailedError(f"query failed: {message}")


@dataclass
class ClientRows:
    """A ``RowSource`` on one read-only client: every SELECT checked and limited as /api/query's."""

    client: Client
    database: str
    limits: QueryLimits

    def rows(self, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        result = run_readonly_query(sql, params, client=self.client, database=self.database, limits=self.limits)
        if result.truncated:
            raise StoreError(f"a page query matched more than {self.limits.max_rows} rows (CALLQA_API_QUERY_MAX_ROWS)")
        return [dict(zip(result.columns, row, strict=True)) for row in result.rows]
