"""Property-based fuzzing of the SQL guard in front of /api/query, on the real embedded ClickHouse: a
query that reaches anything outside the allow-list (another table or database, a table function), in any
position and any spelling, is refused; any text at all is either checked or refused with a clear
``ReadonlyQueryError``, never another exception."""

from __future__ import annotations

from typing import Any

from clickhouse_connect.driver.client import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.store.queries import ReadonlyQueryError, check_readonly_sql

# The store fixture is one migrated database for all of a test's examples: the guard only reads it.
per_test_store = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])

FORBIDDEN = [
    "system.tables", "system.one", "`system`.`users`", '"system"."one"', "SYSTEM.ONE", "information_schema.tables",
    "default.calls_elsewhere", "numbers(3)", "file('/etc/hostname', 'LineAsString')", "url('http://127.0.0.1:9/x', 'CSV')",
    "remote('127.0.0.1', system.one)", "merge(REGEXP('.*'))", "view(SELECT 1)", "generateRandom('a Int8')",
    "s3('http://127.0.0.1:9/b/x.csv')", "cluster('default', system.one)", "input('a String')", "zeros(1)",
]
# Where a source can hide in a SELECT: {src} is the forbidden source, {t} an allowed table.
SHAPES = [
    "SELECT * FROM {src}",
    "SELECT call_id FROM {t} WHERE call_id IN (SELECT * FROM {src})",
    "SELECT c.call_id FROM {t} AS c JOIN {src} AS s ON 1 = 1",
    "SELECT c.call_id FROM {t} AS c LEFT ARRAY JOIN [1] AS x CROSS JOIN {src}",
    "WITH q AS (SELECT * FROM {src}) SELECT * FROM q",
    "WITH q AS (SELECT * FROM {t}) SELECT * FROM q UNION ALL SELECT * FROM {src}",
    "SELECT (SELECT count() FROM {src})",
    "SELECT * FROM {t} WHERE EXISTS (SELECT 1 FROM {src})",
    "SELECT * FROM (SELECT * FROM (SELECT * FROM {src}))",
    "SELECT * FROM {t} WHERE call_id = (SELECT any(call_id) FROM {src} LIMIT 1)",
    "SELECT arrayJoin((SELECT groupArray(1) FROM {src}))",
]
TABLES = ["calls", "segments", "call_qa", "qa_events", "calls_deduped"]
GARNISH = st.sampled_from(["", " ", "\n", "\t", " /* x */ ", " -- c\n", "  "])


def spelled(sql: str, case: list[bool], garnish: list[str]) -> str:
    """``sql`` with keywords' letters in random case and comments or whitespace between its words."""
    words = sql.split(" ")
    out = []
    for i, word in enumerate(words):
        if word.isalpha() and word.isupper():
            word = "".join(c.lower() if case[(i + j) % len(case)] else c for j, c in enumerate(word))
        out.append(word)
    return "".join(w + (garnish[i % len(garnish)] or " ") for i, w in enumerate(out)).strip()


@per_test_store
@given(st.sampled_from(SHAPES), st.sampled_from(FORBIDDEN), st.sampled_from(TABLES),
       st.lists(st.booleans(), min_size=1, max_size=8), st.lists(GARNISH, min_size=1, max_size=8))
def test_a_source_outside_the_allow_list_is_refused_wherever_and_however_written(
    store: Client, database: str, shape: str, source: str, table: str, case: list[bool], garnish: list[str]
) -> None:
    sql = spelled(shape.format(src=source, t=table), case, garnish)
    try:
        check_readonly_sql(store, sql, database)
    except ReadonlyQueryError as exc:
        assert str(exc)
    else:
        raise AssertionError(f"let through: {sql}")


sql_words = st.sampled_from(["SELECT", "FROM", "WHERE", "JOIN", "UNION", "ALL", "WITH", "AS", "IN", "(", ")",
                             ",", "*", "1", "'x'", "calls", "segments", "system.one", "numbers(1)", "SETTINGS",
                             "readonly=0", "FORMAT", "INTO", "OUTFILE", "INSERT", "DROP", "TABLE", ";", "--",
                             "/*", "*/", "`", '"', "\\", "count()", "file('x')", "{p:String}", "LIMIT", "="])


@per_test_store
@given(st.lists(sql_words, max_size=14).map(" ".join) | st.text(max_size=120))
def test_any_text_is_checked_or_refused_with_a_clear_error(store: Client, database: str, sql: str) -> None:
    try:
        checked: Any = check_readonly_sql(store, sql, database)
    except ReadonlyQueryError as exc:
        assert str(exc)
    else:
        assert checked is not None
