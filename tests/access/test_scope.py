"""A scope holds every query to its tenant's (or agent's) calls inside ClickHouse: crafted SQL through the query
API's path (subqueries, joins, unions, CTEs, FINAL, aliases, views, IN) reads only tenant B's rows, and what
could lift the filter (a SETTINGS clause, a table function) is refused."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from clickhouse_connect.driver.client import Client

from pipeline.access.scope import AccessScope, ScopedClient
from pipeline.store import queries
from pipeline.store.client import connect
from pipeline.store.migrations import migrate
from pipeline.store.sqlguard import ReadonlyQueryError

T0 = datetime(2026, 3, 2, 9, 30, tzinfo=UTC)
CALLS = (("a-1", "tenant-a", "ann"), ("a-2", "tenant-a", "bob"), ("b-1", "tenant-b", "cy"), ("b-2", "tenant-b", "di"))


@pytest.fixture
def store(chdb_path: str, unique_name: str) -> Iterator[Client]:
    client = connect(f"chdb://{chdb_path}", unique_name)
    migrate(client, unique_name)
    for call_id, tenant, agent in CALLS:
        client.insert("calls", [[call_id, tenant, agent, T0, T0, T0]],
                      column_names=["call_id", "tenant", "agent_id", "started_at", "ended_at", "updated_at"])
        client.insert("segments", [[f"{call_id}/agent/0", call_id, "agent", f"words of {call_id}", 1, T0]],
                      column_names=["segment_id", "call_id", "leg", "text", "is_final", "produced_at"])
        client.insert("call_qa", [[call_id, 50.0, T0]], column_names=["call_id", "score_pct", "computed_at"])
    client.insert("users", [["boss", "admin", "tenant-a", "", "f" * 64, 0, T0, T0]],
                  column_names=["name", "role", "tenant", "agent_id", "token_sha256", "removed", "created_at",
                                "updated_at"])
    yield client
    client.command(f"DROP DATABASE IF EXISTS {unique_name}")


CRAFTED = [
    "SELECT call_id FROM calls",
    "SELECT call_id FROM {db}.calls_deduped",
    "SELECT call_id FROM calls FINAL",
    "SELECT x.call_id FROM segments AS x",
    "SELECT call_id FROM (SELECT call_id FROM segments_deduped WHERE text LIKE 'words%')",
    "SELECT s.call_id FROM segments AS s INNER JOIN calls AS c ON c.call_id = s.call_id",
    "SELECT call_id FROM calls UNION ALL SELECT call_id FROM segments UNION ALL SELECT call_id FROM call_qa",
    "WITH everything AS (SELECT call_id FROM segments) SELECT call_id FROM everything",
    "SELECT call_id FROM calls WHERE call_id IN (SELECT call_id FROM segments WHERE call_id LIKE 'a-%') OR 1",
    "SELECT arrayJoin([(SELECT any(call_id) FROM calls WHERE call_id = 'a-1')]) AS call_id",
    "SELECT c.call_id FROM calls AS c LEFT JOIN (SELECT call_id FROM call_qa_deduped) AS q USING call_id",
    "SELECT call_id FROM {db}.segments AS segments FINAL WHERE 1 = 1 OR call_id LIKE 'a-%'",
]


@pytest.mark.parametrize("sql", CRAFTED)
def test_crafted_sql_of_tenant_b_reads_only_tenant_b(store: Client, unique_name: str, sql: str) -> None:
    scope = AccessScope("tenant-b")
    result = queries.run_readonly_query(sql.format(db=unique_name), client=store, database=unique_name,
                                        scope_settings=scope.settings(unique_name))
    seen = {str(r[0]) for r in result.rows if r[0]}
    assert seen <= {"b-1", "b-2"}, seen
    unscoped = queries.run_readonly_query(sql.format(db=unique_name), client=store, database=unique_name)
    assert {str(r[0]) for r in unscoped.rows} & {"a-1", "a-2"}  # the same SQL without a scope reads tenant A


def test_counts_and_accounts_are_held_too(store: Client, unique_name: str) -> None:
    settings = AccessScope("tenant-b").settings(unique_name)
    count = queries.run_readonly_query("SELECT count() FROM segments", client=store, database=unique_name,
                                       scope_settings=settings)
    assert count.rows == [(2,)]
    agent = queries.run_readonly_query("SELECT call_id FROM segments_deduped", client=store, database=unique_name,
                                       scope_settings=AccessScope("tenant-b", "cy").settings(unique_name))
    assert agent.rows == [("b-1",)]  # an agent: its own calls only
    with pytest.raises(ReadonlyQueryError):
        queries.run_readonly_query("SELECT name FROM users", client=store, database=unique_name,
                                   scope_settings=settings)
    assert store.query("SELECT count() FROM users", settings=settings).result_rows == [(0,)]  # were it let through


@pytest.mark.parametrize("sql", [
    "SELECT call_id FROM calls SETTINGS additional_table_filters = {{}}",
    "SELECT * FROM merge('{db}', '.*')",
    "SELECT call_id FROM calls WHERE call_id IN (SELECT call_id FROM merge('{db}', 'segments'))",
])
def test_what_could_lift_the_scope_is_refused(store: Client, unique_name: str, sql: str) -> None:
    with pytest.raises(ReadonlyQueryError):
        queries.run_readonly_query(sql.format(db=unique_name), client=store, database=unique_name,
                                   scope_settings=AccessScope("tenant-b").settings(unique_name))


def test_the_readers_typed_queries_run_in_the_scope(store: Client, unique_name: str) -> None:
    client = ScopedClient(store, AccessScope("tenant-b").settings(unique_name))
    assert {c.call_id for c in queries.list_calls(client)} == {"b-1", "b-2"}  # type: ignore[arg-type]
    assert queries.call_summary(client, "a-1") is None  # type: ignore[arg-type]
    assert queries.transcript(client, "a-1") == []  # type: ignore[arg-type]
    assert [t.text for t in queries.transcript(client, "b-1")] == ["words of b-1"]  # type: ignore[arg-type]
    tenant = AccessScope("it's \\ odd")  # a tenant with quotes and a backslash stays one string literal
    odd = ScopedClient(store, tenant.settings(unique_name))
    assert queries.list_calls(odd) == []  # type: ignore[arg-type]


def test_every_table_of_the_store_has_a_filter(store: Client, unique_name: str) -> None:
    """A table added later must say how a scope holds it (pipeline/access/scope.py): none is left unfiltered."""
    tables = {r[0] for r in store.query("SELECT name FROM system.tables WHERE database = {db:String} "
                                        "AND engine NOT LIKE '%View'", parameters={"db": unique_name}).result_rows}
    filtered = {key.split(".", 1)[1] for key in AccessScope("tenant-b").table_filters(unique_name)}
    assert tables and tables <= filtered, tables - filtered
