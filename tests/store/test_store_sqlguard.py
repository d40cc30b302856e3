"""The query API's SQL on the real embedded ClickHouse: each bypass refused with a clear error, the
project's own queries still answered, and the server-side limits that cut off what is allowed."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError

from pipeline.report import CALLS_SQL, QA_SQL, TRANSCRIPT_SQL
from pipeline.store import sqlguard_functions as allowed
from pipeline.store.client import connect
from pipeline.store.queries import (
    QueryFailedError,
    QueryLimits,
    QueryNotAllowedError,
    ReadonlyQueryError,
    check_readonly_sql,
    run_readonly_query,
)

Insert = Callable[[Client, str, list[dict[str, Any]]], None]

TABLE_FUNCTIONS = [
    ("SELECT * FROM file('/etc/hostname', 'LineAsString')", "table function file()"),
    ("SELECT call_id FROM calls WHERE call_id IN (SELECT * FROM url('http://127.0.0.1:9/x', 'LineAsString'))",
     "table function url()"),  # IN (subquery)
    ("SELECT c.call_id FROM calls AS c JOIN s3('http://127.0.0.1:9/b/x.csv') AS s ON c.call_id = s.a",
     "table function s3()"),  # join
    ("WITH t AS (SELECT * FROM remote('127.0.0.1', system.one)) SELECT * FROM t", "table function remote()"),  # CTE
    ("SELECT call_id FROM calls UNION ALL SELECT toString(number) FROM numbers(10)", "table function numbers()"),
    ("SELECT (SELECT count() FROM input('a String'))", "table function input()"),  # scalar subquery
    ("SELECT * FROM (SELECT * FROM (SELECT * FROM executable('id', TabSeparated, 'a String')))",
     "table function executable()"),  # nested subqueries
    ("SELECT * FROM calls_deduped WHERE EXISTS (SELECT 1 FROM generateRandom('a Int8') LIMIT 1)",
     "table function generateRandom()"),
    ("SELECT * FROM merge(REGEXP('.*'))", "table function merge()"),
    ("SELECT * FROM view(SELECT 1)", "table function view()"),
    ("SELECT * FROM (EXPLAIN QUERY TREE SELECT 1)", "table function viewExplain()"),  # EXPLAIN as a subquery
]
SCALAR_FUNCTIONS = [
    ("SELECT file('/etc/hostname')", "function file()"),  # the issue's own example
    ("SELECT FILE('/etc/hostname')", "function FILE()"),
    ("SELECT call_id, dictGet('d', 'v', toUInt64(1)) FROM calls", "function dictGet()"),
    ("SELECT joinGet('j', 'v', 1)", "function joinGet()"),
    ("SELECT getSetting('readonly')", "function getSetting()"),
    ("SELECT hasColumnInTable('system', 'users', 'name')", "function hasColumnInTable()"),
    ("SELECT sleepEachRow(1) FROM calls", "function sleepEachRow()"),
    ("SELECT arrayReduce('sum', [1])", "function arrayReduce()"),  # an aggregate named in a string
    ("SELECT randomString(10)", "function randomString()"),  # random data: off the list, whatever its size
    ("SELECT sumResample(0, 1000000000, 1)(audio_ms, audio_ms) FROM calls", "function sumResample()"),
    ("SELECT * APPLY(file) FROM calls", "function file() in APPLY"),  # APPLY(f) calls f on each column
    ("SELECT COLUMNS('call_id') APPLY(x -> hostName()) FROM calls", "function hostName()"),
]
# Functions that tell about the server, the session or the query: none is on the allow-list.
INFORMATION_FUNCTIONS = [
    (f"SELECT {name}()", f"function {name}() is not allowed in the query API")
    for name in ("hostName", "hostname", "HOSTNAME", "FQDN", "fullHostName", "version", "VERSION", "revision",
                 "buildId", "uptime", "currentUser", "user", "current_user", "session_user", "authenticatedUser",
                 "currentDatabase", "database", "currentProfiles", "currentRoles", "enabledRoles", "serverUUID",
                 "shardNum", "tcpPort", "getServerPort", "displayName", "getOSKernelVersion", "queryID",
                 "initialQueryID", "connectionId", "timezone", "serverTimezone", "zookeeperSessionUptime",
                 "getMacro", "currentSchemas", "filesystemAvailable")
]
# The right side of IN names a table, or (on some ClickHouse versions) a table function, like FROM does.
IN_RIGHT_SIDES = [
    ("SELECT call_id FROM calls WHERE audio_ms IN numbers(10)", "table function numbers() is not allowed on "
     "the right of IN"),  # the issue's own example
    ("SELECT 1 WHERE 1 NOT IN numbers(10)", "table function numbers()"),
    ("SELECT 1 WHERE 1 GLOBAL IN url('http://127.0.0.1:9/x', 'CSV', 'a UInt8')", "table function url()"),
    ("SELECT 1 WHERE 1 IN file('/etc/hostname', 'LineAsString')", "table function file()"),
    ("SELECT 1 WHERE 1 IN remote('127.0.0.1', system.one)", "table function remote()"),
    ("SELECT 1 WHERE 1 IN format(CSV, '1')", "table function format()"),  # also a scalar function, but not here
    ("SELECT 1 WHERE 1 IN schema_migrations", "table schema_migrations is not allowed"),
    ("SELECT 1 WHERE 1 IN (system.one)", "database system is not allowed"),
]
# Functions that build a value of a size they are given: a number written in the query, at most 1,000,000.
SIZES = [
    ("SELECT repeat('a', 1e9)", "repeat(): argument 2 is 1,000,000,000; the query API allows at most 1,000,000"),
    ("SELECT repeat('a', 1000001)", "repeat(): argument 2 is 1,000,001"),
    ("SELECT space(10000000)", "space(): argument 1 is 10,000,000"),
    ("SELECT leftPad('a', 1e8, 'b')", "leftPad(): argument 2 is 100,000,000"),
    ("SELECT RPAD('a', 1e8)", "RPAD(): argument 2 is 100,000,000"),
    ("SELECT arrayWithConstant(1e9, 'x')", "arrayWithConstant(): argument 1 is 1,000,000,000"),
    ("SELECT arrayResize([1], 1e7)", "arrayResize(): argument 2 is 10,000,000"),
    ("SELECT toFixedString('a', 1e8)", "toFixedString(): argument 2 is 100,000,000"),
    ("SELECT range(1e7)", "range() would build 10,000,000 elements; the query API allows at most 1,000,000"),
    ("SELECT arrayJoin(range(-1e6, 1e6))", "range() would build 2,000,000 elements"),
    ("SELECT range(0, 1e9, 10)", "range() would build 100,000,000 elements"),
    ("SELECT repeat('a', audio_ms) FROM calls", "repeat(): argument 2 must be a number written in the query"),
    ("SELECT repeat('a', {n:UInt32})", "repeat(): argument 2 must be a number written in the query"),
    ("SELECT space(toUInt32(5))", "space(): argument 1 must be a number written in the query"),
    ("SELECT repeat('a', inf)", "repeat(): argument 2 must be a number written in the query"),
    ("SELECT range(audio_ms) FROM calls", "range(): its arguments must be numbers written in the query"),
    ("SELECT * APPLY(space) FROM calls", "space() in APPLY: argument 1 must be a number written in the query"),
    ("SELECT topK(1e9)(call_id) FROM calls", "topK(): parameter 1 is 1,000,000,000"),
    ("SELECT groupArrayIf(2000000)(call_id, 1) FROM calls", "groupArrayIf(): parameter 1 is 2,000,000"),
]
SETTINGS_AND_OUTPUT = [
    ("SELECT count() FROM calls SETTINGS readonly = 0", "SETTINGS is not allowed"),
    ("SELECT * FROM calls SETTINGS max_result_rows = 0, max_execution_time = 0", "SETTINGS is not allowed"),
    ("SELECT * FROM (SELECT * FROM calls SETTINGS max_memory_usage = 0)", "SETTINGS is not allowed"),
    ("SELECT 1 FORMAT JSON SETTINGS readonly = 0", "FORMAT is not allowed"),
    ("SELECT * FROM calls FORMAT Native", "FORMAT is not allowed"),
    ("SELECT * FROM calls INTO OUTFILE '/tmp/callqa-x.csv'", "INTO OUTFILE is not allowed"),
    ("SELECT * FROM calls INTO OUTFILE '/tmp/callqa-x.csv' AND STDOUT", "INTO OUTFILE is not allowed"),
    ("SELECT * FROM calls INTO OUTFILE '/tmp/callqa-x.gz' TRUNCATE COMPRESSION 'gzip'", "INTO OUTFILE is not allowed"),
]
SECOND_STATEMENTS = [
    "SELECT 1; DROP TABLE calls",
    "SELECT 1 /* ; */ ; DROP TABLE calls",
    "SELECT 1 -- harmless\n; DROP TABLE calls",
    "SELECT ';' AS s; INSERT INTO calls (call_id) VALUES ('x')",
    "SELECT 1;\nSELECT 2",
]
OTHER_DATABASES = [
    ("SELECT * FROM system.tables", "database system is not allowed"),
    ("SELECT * FROM `system`.`users`", "database system is not allowed"),
    ('SELECT * FROM "system"."users"', "database system is not allowed"),
    ("SELECT * FROM SYSTEM.tables", "database SYSTEM is not allowed"),
    ("SELECT * FROM INFORMATION_SCHEMA.TABLES", "database INFORMATION_SCHEMA is not allowed"),
    ("SELECT * FROM information_schema.tables", "database information_schema is not allowed"),
    ("SELECT * FROM default.calls", "database default is not allowed"),
    ("SELECT * FROM `system.tables`", "table system.tables is not allowed"),  # one quoted name with a dot
    ("SELECT call_id FROM calls WHERE call_id IN system.tables", "database system is not allowed"),
    ("SELECT c.call_id FROM calls AS c JOIN system.users AS u ON 1", "database system is not allowed"),
    ("SELECT * FROM calls WHERE call_id IN (SELECT name FROM system.databases)", "database system is not allowed"),
    ("SELECT version FROM schema_migrations", "table schema_migrations is not allowed"),
    ("SELECT * FROM Calls", "table Calls is not allowed"),
    ("SELECT * FROM {t:Identifier}", "table names from query parameters are not allowed"),
    ("SELECT 1 WHERE 1 IN {t:Identifier}", "table names from query parameters are not allowed"),
]
# A CTE's body sees only the CTEs defined before it: its own name, a later one, or (in a UNION's
# other SELECTs) the first SELECT's, would be read by ClickHouse as the table of that name.
CTE_SCOPES = [
    ("WITH schema_migrations AS (SELECT * FROM schema_migrations) SELECT * FROM schema_migrations",
     "table schema_migrations is not allowed"),  # its own name in its body
    ("WITH RECURSIVE schema_migrations AS (SELECT * FROM schema_migrations) SELECT * FROM schema_migrations",
     "table schema_migrations is not allowed"),  # no UNION: read as the table even WITH RECURSIVE
    ("WITH a AS (SELECT * FROM b), b AS (SELECT 1) SELECT * FROM a", "table b is not allowed"),  # a later one
    ("WITH a AS (SELECT * FROM schema_migrations), schema_migrations AS (SELECT 1) SELECT * FROM a",
     "table schema_migrations is not allowed"),
    ("SELECT * FROM (WITH schema_migrations AS (SELECT version FROM schema_migrations) "
     "SELECT * FROM schema_migrations)", "table schema_migrations is not allowed"),  # in a subquery
    ("WITH schema_migrations AS (SELECT 1) SELECT * FROM schema_migrations "
     "UNION ALL WITH b AS (SELECT * FROM schema_migrations) SELECT * FROM b",
     "table schema_migrations is not allowed"),  # the first SELECT's CTE inside another's CTE body
    ("WITH schema_migrations AS (SELECT 1) SELECT * FROM schema_migrations UNION ALL "
     "WITH schema_migrations AS (SELECT * FROM schema_migrations) SELECT * FROM schema_migrations",
     "table schema_migrations is not allowed"),
    # a scalar subquery of a WITH clause: a later CTE's name is a table to it, wherever it is used
    ("WITH (SELECT count() FROM schema_migrations) AS n, schema_migrations AS (SELECT 1) SELECT n",
     "table schema_migrations is not allowed"),
    ("WITH (SELECT 1 WHERE 1 IN schema_migrations) AS n, schema_migrations AS (SELECT 1) SELECT n",
     "table schema_migrations is not allowed"),
    ("SELECT * FROM (WITH (SELECT max(version) FROM schema_migrations) AS n, schema_migrations AS (SELECT 1) "
     "SELECT n)", "table schema_migrations is not allowed"),
]
DDL_AND_DML = [
    ("INSERT INTO calls (call_id) VALUES ('x')", "INSERT"),
    ("INSERT INTO calls SELECT * FROM calls", "INSERT"),
    ("ALTER TABLE calls DELETE WHERE 1", "ALTER"),
    ("DROP TABLE calls", "DROP"),
    ("TRUNCATE TABLE calls", "TRUNCATE"),
    ("DETACH TABLE calls", "DETACH"),
    ("ATTACH TABLE calls", "ATTACH"),
    ("CREATE TABLE x (a Int8) ENGINE = Memory", "CREATE"),
    ("OPTIMIZE TABLE calls FINAL", "OPTIMIZE"),
    ("KILL QUERY WHERE 1", "KILL QUERY"),
    ("SET readonly = 0", "SET"),
    ("GRANT SELECT ON *.* TO default", "GRANT"),
    ("SYSTEM FLUSH LOGS", "SYSTEM"),
    ("RENAME TABLE calls TO c2", "RENAME"),
    ("DELETE FROM calls WHERE 1", "DELETE"),
    ("USE system", "USE"),
    ("SHOW TABLES", "SHOW TABLES"),
    ("DESCRIBE TABLE calls", "DESCRIBE"),
    ("EXPLAIN SELECT 1", "EXPLAIN"),
    ("-- looks harmless\n/* SELECT */ DROP DATABASE callqa", "DROP"),
]


@pytest.mark.parametrize(("sql", "refused"), TABLE_FUNCTIONS + SCALAR_FUNCTIONS + SETTINGS_AND_OUTPUT + OTHER_DATABASES
                         + CTE_SCOPES + INFORMATION_FUNCTIONS + IN_RIGHT_SIDES + SIZES)
def test_reads_outside_the_project_tables_are_refused_naming_what(
    store: Client, database: str, sql: str, refused: str
) -> None:
    with pytest.raises(QueryNotAllowedError, match=re.escape(refused)) as caught:
        check_readonly_sql(store, sql, database)
    assert caught.value.status == 403 and "\n" not in str(caught.value)


@pytest.mark.parametrize("sql", SECOND_STATEMENTS)
def test_a_second_statement_is_refused_however_it_is_hidden(store: Client, database: str, sql: str) -> None:
    with pytest.raises(QueryNotAllowedError, match="only one statement is allowed"):
        check_readonly_sql(store, sql, database)


@pytest.mark.parametrize(("sql", "keyword"), DDL_AND_DML)
def test_statements_other_than_select_are_refused_by_name(
    store: Client, database: str, sql: str, keyword: str
) -> None:
    with pytest.raises(QueryNotAllowedError, match=f"^{re.escape(keyword)} is not allowed: only one SELECT"):
        check_readonly_sql(store, sql, database)


@pytest.mark.parametrize(("sql", "message"), [("", "empty query"), ("  -- nothing\n", "empty query"),
                                              ("SELEC 1", "SQL syntax error"), ("SELECT 1 /*", "SQL syntax error")])
def test_empty_and_broken_sql_are_a_clear_400(store: Client, database: str, sql: str, message: str) -> None:
    with pytest.raises(ReadonlyQueryError, match=message) as caught:
        check_readonly_sql(store, sql, database)
    assert caught.value.status == 400


def test_refusals_leave_the_data_intact(
    store: Client, store_url: str, database: str, insert: Insert, make_segment: Callable[..., Any]
) -> None:
    insert(store, "segments", [make_segment("c1", "agent", 0, "kept")])
    for sql, _ in DDL_AND_DML:
        with pytest.raises(QueryNotAllowedError):
            run_readonly_query(sql, url=store_url, database=database)
    assert store.query("SELECT text FROM segments").result_rows == [("kept",)]
    assert {r[0] for r in store.query("SHOW TABLES").result_rows} >= {"calls", "segments", "schema_migrations"}


def test_the_reports_queries_and_the_workers_own_still_run(
    store: Client,
    store_url: str,
    database: str,
    insert: Insert,
    make_call: Callable[..., Any],
    make_segment: Callable[..., Any],
) -> None:
    insert(store, "calls", [make_call("c1", ended=True), make_call("c2")])
    insert(store, "segments", [make_segment("c1", "agent", 0, "hello; DROP TABLE calls"),
                               make_segment("c1", "customer", 900, "file('/etc/hostname')")])

    def rows(sql: str, **params: Any) -> list[tuple[Any, ...]]:
        return run_readonly_query(sql, params, url=store_url, database=database).rows

    report_calls = rows(CALLS_SQL.format(db=database, where="c.agent_id = {agent:String}"), agent="agent-7")
    assert sorted(r[0] for r in report_calls) == ["c1", "c2"]
    assert [r[3] for r in rows(TRANSCRIPT_SQL.format(db=database), call="c1")] == [
        "hello; DROP TABLE calls", "file('/etc/hostname')"]  # literals that look like attacks are data
    assert rows(QA_SQL.format(db=database), call="c1") == []
    assert rows("SELECT count() AS n FROM segments FINAL WHERE is_final = 1 AND "
                "has(splitByChar(',', {ids:String}), call_id)", ids="c1,c2") == [(2,)]
    analyst = """
        -- calls with their segment count; a CTE, a join, IN (subquery) and UNION, all on project tables
        WITH seg AS (SELECT call_id, count() AS n FROM segments_deduped GROUP BY call_id),
             ids AS (SELECT call_id FROM calls)
        SELECT * FROM (
            SELECT c.call_id AS id, ifNull(seg.n, 0) AS n
            FROM calls_deduped AS c LEFT JOIN seg ON seg.call_id = c.call_id
            WHERE c.call_id IN (SELECT call_id FROM calls FINAL) AND c.call_id IN ids
            UNION ALL SELECT 'total', count() FROM segments_deduped
        ) ORDER BY id;
    """
    assert rows(analyst) == [("c1", 2), ("c2", 0), ("total", 2)]


def test_ctes_see_the_ones_defined_before_them(
    store: Client, store_url: str, database: str, insert: Insert, make_call: Callable[..., Any]
) -> None:
    insert(store, "calls", [make_call("c1", ended=True), make_call("c2")])

    def rows(sql: str) -> list[tuple[Any, ...]]:
        return run_readonly_query(sql, url=store_url, database=database).rows

    assert rows("WITH a AS (SELECT call_id FROM calls), b AS (SELECT call_id FROM a) SELECT count() FROM b") == [(2,)]
    # an outer CTE in a subquery's CTE body; the first SELECT's CTE in the FROM of a UNION's others
    assert rows("WITH a AS (SELECT call_id FROM calls) "
                "SELECT count() FROM (WITH b AS (SELECT call_id FROM a) SELECT * FROM b)") == [(2,)]
    assert rows("WITH a AS (SELECT call_id FROM calls) SELECT count() FROM a "
                "UNION ALL SELECT count() FROM a") == [(2,), (2,)]
    # a scalar subquery of the WITH clause sees the CTEs before it, as ClickHouse reads them
    assert rows("WITH a AS (SELECT call_id FROM calls), (SELECT count() FROM a) AS n SELECT n") == [(2,)]
    assert rows("WITH schema_migrations AS (SELECT 7 AS v), (SELECT max(v) FROM schema_migrations) AS n "
                "SELECT n") == [(7,)]  # the CTE, not the table of that name


def test_values_up_to_the_size_cap_are_built_and_allowed_functions_answer(
    store: Client, store_url: str, database: str, insert: Insert, make_call: Callable[..., Any]
) -> None:
    insert(store, "calls", [make_call("c1", ended=True), make_call("c2")])

    def rows(sql: str) -> list[tuple[Any, ...]]:
        return run_readonly_query(sql, url=store_url, database=database).rows

    assert rows("SELECT length(repeat('ab', 1000000)), length(range(1000000)), length(range(0, 2000000, 2)), "
                "length(space(1000000)), leftPad('7', 3, '0'), arrayWithConstant(2, 'x'), length(arrayResize([1], 5))"
                ) == [(2_000_000, 1_000_000, 1_000_000, 1_000_000, "007", ["x", "x"], 5)]
    assert rows("SELECT topK(1)(agent_id), groupArray(1)(agent_id), COUNT(DISTINCT call_id), countIf(ended_at "
                "IS NOT NULL), uniqExactIf(call_id, audio_ms > 0) FROM calls") == [(["agent-7"], ["agent-7"], 2, 1, 1)]
    assert rows("SELECT COLUMNS('call_id') APPLY(upper) FROM calls ORDER BY 1") == [("C1",), ("C2",)]
    assert rows("SELECT 'c1' IN splitByChar(',', 'c1,c9'), 2 IN tuple(1, 2), 3 IN [1, 2], "
                "count() FROM calls WHERE call_id IN (SELECT call_id FROM calls_deduped)") == [(1, 1, 0, 2)]
    assert rows("SELECT TRIM(BOTH ' ' FROM ' a '), SUBSTRING('abc' FROM 2 FOR 1), EXTRACT(YEAR FROM "
                "toDate('2026-03-02')), CASE 'a' WHEN 'a' THEN 1 ELSE 2 END, 'a' || 'b', 7 DIV 2") == [
        ("a", "b", 2026, 1, "ab", 3)]


def test_the_function_allow_list_matches_this_clickhouse(store: Client) -> None:
    """Every listed name is a function of the store's ClickHouse; a name that is listed in another case,
    or as an alias, is the same function as a listed one; and none tells about the server or session."""
    functions = store.query("SELECT name, alias_to, deterministic FROM system.functions").result_rows
    known = {name.lower() for name, _, _ in functions}
    listed = allowed.SCALAR_FUNCTIONS | allowed.AGGREGATE_FUNCTIONS
    assert listed - allowed.SYNTAX_FUNCTIONS - known == set()
    for name, alias_to, _ in functions:
        if allowed.is_allowed(name) and alias_to:
            assert allowed.is_allowed(alias_to), f"{name} is allowed but is an alias of {alias_to}, which is not"
    # ClickHouse calls these not deterministic: the clock, and row generation (arrayJoin). No session,
    # server or random function is among them (hostName, currentUser, rand... are not listed).
    assert {name for name, _, deterministic in functions if allowed.is_allowed(name) and deterministic == 0} == {
        "now", "now64", "today", "yesterday", "arrayJoin", "unnest", "arrayPartialSort", "arrayPartialReverseSort"}
    table_functions = {r[0].lower() for r in store.query("SELECT name FROM system.table_functions").result_rows}
    assert {name for name in table_functions if allowed.is_allowed(name)} == set(allowed.ALSO_TABLE_FUNCTIONS)


def test_every_table_function_is_refused_in_from_and_on_the_right_of_in(store: Client, database: str) -> None:
    unparsed = set()
    for (name,) in store.query("SELECT name FROM system.table_functions").result_rows:
        for sql, refusal in ((f"SELECT * FROM {name}(1)", f"table function {name}() is not allowed: read"),
                             (f"SELECT 1 WHERE 1 IN {name}(1)", f"table function {name}() is not allowed on the right")):
            with pytest.raises(ReadonlyQueryError) as caught:
                check_readonly_sql(store, sql, database)
            if isinstance(caught.value, QueryNotAllowedError):
                assert str(caught.value).startswith(refusal), sql
            else:
                unparsed.add(name)  # ClickHouse does not parse the call as written: refused all the same
    assert unparsed <= {"view", "viewIfPermitted", "null"}  # a SELECT as argument; NULL is a keyword


def test_parameters_are_bound_by_the_server_only(store: Client, store_url: str, database: str) -> None:
    """clickhouse-connect formats %(name)s into the SQL text when no {name:Type} is present: never here."""
    with pytest.raises(ReadonlyQueryError, match="query parameter 'c' is not used by the query"):
        run_readonly_query("SELECT '%(c)s'", {"c": "x') UNION ALL SELECT name FROM system.tables --"},
                           url=store_url, database=database)
    with pytest.raises(ReadonlyQueryError, match="is not an identifier"):
        run_readonly_query("SELECT {c:String}", {"c; DROP": "x"}, url=store_url, database=database)
    quote = "x'; DROP TABLE calls; --"
    assert run_readonly_query("SELECT {c:String} AS v", {"c": quote}, url=store_url, database=database).rows == [
        (quote,)]


def test_large_results_are_cut_off_at_max_rows(
    store: Client, store_url: str, database: str, insert: Insert, make_call: Callable[..., Any]
) -> None:
    insert(store, "calls", [make_call(f"c{i}") for i in range(20)])
    result = run_readonly_query("SELECT * FROM calls, calls, calls", url=store_url, database=database,
                                limits=QueryLimits(max_rows=100))
    assert len(result.rows) == 100 and result.truncated  # of 8,000 rows
    whole = run_readonly_query("SELECT call_id FROM calls", url=store_url, database=database,
                               limits=QueryLimits(max_rows=20))
    assert len(whole.rows) == 20 and not whole.truncated


def test_time_memory_and_result_size_limits_stop_queries(
    store: Client, store_url: str, database: str, insert: Insert, make_segment: Callable[..., Any]
) -> None:
    insert(store, "segments", [make_segment("c1", "agent", i * 1000, "w" * 1000) for i in range(100)])

    def run(sql: str, limits: QueryLimits) -> None:
        run_readonly_query(sql, url=store_url, database=database, limits=limits)

    with pytest.raises(QueryFailedError, match="time limit of 0.5 s"):  # 100^6 rows: never finishes
        run("SELECT count() FROM segments a, segments b, segments c, segments d, segments e, segments f",
            QueryLimits(max_execution_s=0.5))
    with pytest.raises(QueryFailedError, match="memory limit of 64 MB"):  # each range at the cap, 4 GB together
        run("SELECT length(arrayMap(x -> range(1000000), range(1000)))", QueryLimits(max_memory_bytes=64 << 20))
    with pytest.raises(QueryFailedError, match="larger than the API's limit of 1 MB"):  # ~10 MB of text
        run("SELECT a.text, b.text FROM segments a, segments b", QueryLimits(max_result_bytes=1 << 20))


def test_the_limit_settings_refuse_writes_and_table_functions_without_the_checker(
    store_url: str, database: str, store: Client
) -> None:
    """The second fence: readonly=1 goes with every API query, whatever the statement check let through."""
    client = connect(store_url, database, create_database=False, fresh=True)
    try:
        settings = QueryLimits().clickhouse_settings(client)
        assert settings["readonly"] == 1 and settings["max_threads"] == 1
        with pytest.raises(DatabaseError, match="readonly"):
            client.query("SELECT * FROM file('/etc/hostname', 'LineAsString')", settings=settings)
        with pytest.raises(DatabaseError, match="readonly"):
            client.query("SELECT * FROM calls SETTINGS max_execution_time = 0", settings=settings)
    finally:
        client.close()
    assert store.command("SELECT 1") == 1  # the writer's client is not left read-only


def test_a_reader_of_rows_fails_loudly_when_the_limit_cut_its_answer(
    store: Client, store_url: str, database: str, insert: Insert, make_call: Callable[..., Any]
) -> None:
    """A read that hit the row cap must not pass a part for the whole (a count, a PII scan, a comparison)."""
    from pipeline.config import Settings
    from pipeline.report import StoreSource, TruncatedRowsError

    insert(store, "calls", [make_call(f"c{i}") for i in range(20)])
    source = StoreSource(Settings(clickhouse_url=store_url, clickhouse_database=database, api_query_max_rows=19))
    with pytest.raises(TruncatedRowsError, match="more than the 19 rows .*CALLQA_API_QUERY_MAX_ROWS"):
        source.rows("SELECT call_id FROM calls", {})
    assert len(source.rows("SELECT call_id FROM calls LIMIT 19", {})) == 19
