"""Migrations are versioned and idempotent; tables have the engines and keys readers rely on."""

from __future__ import annotations

from clickhouse_connect.driver.client import Client

from pipeline.store.client import connect
from pipeline.store.migrations import MIGRATIONS, REVISED_TABLES, TABLE_KEYS, migrate, schema_version


def test_migrate_twice_applies_each_version_once(store_url: str, database: str) -> None:
    client = connect(store_url, database)
    try:
        assert migrate(client, database) == [m.version for m in MIGRATIONS]
        assert migrate(client, database) == []
        assert schema_version(client, database) == MIGRATIONS[-1].version
        recorded = client.query("SELECT version FROM schema_migrations ORDER BY version").result_rows
        assert [r[0] for r in recorded] == [m.version for m in MIGRATIONS]
    finally:
        client.command(f"DROP DATABASE IF EXISTS {database}")


def test_an_unrecorded_migration_reruns_harmlessly(store_url: str, database: str) -> None:
    """A crash after a migration's DDL but before its record: the next run repeats it without error."""
    client = connect(store_url, database)
    try:
        migrate(client, database)
        client.command(f"DELETE FROM schema_migrations WHERE version = {MIGRATIONS[-1].version}")
        assert migrate(client, database) == [MIGRATIONS[-1].version]
    finally:
        client.command(f"DROP DATABASE IF EXISTS {database}")


def test_tables_are_replacing_merge_trees_keyed_for_dedup(store: Client, database: str) -> None:
    rows = store.query(
        "SELECT name, engine, sorting_key FROM system.tables WHERE database = {db:String}",
        parameters={"db": database},
    ).result_rows
    tables = {name: (engine, key) for name, engine, key in rows}
    for table, key in TABLE_KEYS.items():
        engine, sorting_key = tables[table]
        assert engine == "ReplacingMergeTree"
        assert sorting_key == ", ".join((*key, "revision") if table in REVISED_TABLES else key)
        assert tables[f"{table}_deduped"][0] == "View"


def test_deduped_views_expose_the_table_columns(store: Client) -> None:
    for table in TABLE_KEYS:
        table_cols = [r[0] for r in store.query(f"DESCRIBE TABLE {table}").result_rows]
        view_cols = [r[0] for r in store.query(f"DESCRIBE TABLE {table}_deduped").result_rows]
        assert view_cols == [c for c in table_cols if c != "row_version"]


def test_every_merge_tree_removes_outdated_parts_with_one_thread(store: Client, database: str) -> None:
    """The embedded engine keeps each thread of its part-removal pool (128) for the worker's life: no table
    may use that pool (the soak's worker grew by 125 threads at its first clean-up without this)."""
    rows = store.query(
        "SELECT name, create_table_query FROM system.tables WHERE database = {db:String} AND engine LIKE '%MergeTree'",
        parameters={"db": database},
    ).result_rows
    assert {name for name, _ in rows} >= set(TABLE_KEYS)
    for name, query in rows:
        assert "concurrent_part_removal_threshold = 1000000" in query, name
