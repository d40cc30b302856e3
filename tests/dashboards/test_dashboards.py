"""Dashboards: valid against Grafana's published schema, and every ClickHouse panel query runs on the
callqa schema with the plugin's macros expanded, returning the columns its panel plots."""

from __future__ import annotations

import copy
import importlib.util
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from prometheus_client import generate_latest

from pipeline.worker.metrics import WorkerMetrics

DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"
FILES = ("qa-supervisor.json", "operations.json")
# The fixture calls start at 2026-03-02 09:00 UTC (tests/dashboards/conftest.py); the dashboard looks at 3 h.
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
FROM, TO = T0 - timedelta(hours=1), T0 + timedelta(hours=2)
FilledDatabase = Any  # tests/dashboards/conftest.py: client, database, results, segments
INTERVAL_S = 300


def _load(name: str) -> dict[str, Any]:
    return json.loads((DASHBOARDS / name).read_text())


def _validator() -> jsonschema.protocols.Validator:
    schema = json.loads((DASHBOARDS / "schema" / "dashboard.schema.json").read_text())
    return jsonschema.validators.validator_for(schema)(schema)


def _targets(dashboard: dict[str, Any], plugin: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        (p["title"], t)
        for p in dashboard["panels"]
        for t in p["targets"]
        if t["datasource"]["type"] == plugin
    ]


def expand(sql: str, database: str, variables: dict[str, str]) -> str:
    """What the ClickHouse plugin sends for this SQL (its macros, pkg/macros/macros.go) and Grafana's variables."""
    frm, to = int(FROM.timestamp()), int(TO.timestamp())
    sql = re.sub(r"\$__timeFilter\(([^()]+)\)", rf"\1 >= toDateTime({frm}) AND \1 <= toDateTime({to})", sql)
    sql = re.sub(
        r"\$__timeInterval\(([^()]+)\)",
        rf"toStartOfInterval(toDateTime(\1), INTERVAL {INTERVAL_S} second)",
        sql,
    )
    sql = sql.replace("$__fromTime", f"toDateTime({frm})").replace("$__toTime", f"toDateTime({to})")
    sql = sql.replace("$__interval_s", str(INTERVAL_S))
    for name, value in variables.items():
        sql = sql.replace(f"${{{name}}}", value).replace(f"${name}", value)
    assert "$" not in sql, f"unexpanded macro or variable in: {sql}"
    return sql.replace("callqa.", f"{database}.")


@pytest.mark.parametrize("name", FILES)
def test_dashboard_matches_grafana_schema(name: str) -> None:
    errors = list(_validator().iter_errors(_load(name)))
    assert errors == [], [e.message for e in errors]


@pytest.mark.parametrize(
    "breakage",
    [
        lambda d: d.pop("schemaVersion"),
        lambda d: d["panels"][0].__setitem__("gridPos", "top left"),
        lambda d: d["panels"][0].__setitem__("no_such_field", 1),
        lambda d: d["templating"]["list"][0].__setitem__("type", "spreadsheet"),
    ],
)
def test_broken_dashboard_is_rejected(breakage: Any) -> None:
    dashboard = copy.deepcopy(_load(FILES[0]))
    breakage(dashboard)
    assert list(_validator().iter_errors(dashboard))


def test_committed_json_is_what_the_generator_writes() -> None:
    spec = importlib.util.spec_from_file_location("dashboards_generate", DASHBOARDS / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, build in module.DASHBOARDS.items():
        assert (DASHBOARDS / name).read_text() == module.render(build), f"run dashboards/generate.py ({name})"


@pytest.mark.parametrize("name", FILES)
def test_clickhouse_targets_use_the_plugin_fields(name: str) -> None:
    dashboard = _load(name)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for title, target in _targets(dashboard, "grafana-clickhouse-datasource"):
        assert target["editorType"] == "sql" and target["rawSql"].strip(), title
        assert (target["queryType"], target["format"]) in (("timeSeries", 0), ("table", 1)), title
        sql = target["rawSql"]
        assert " FINAL" in sql or "_deduped" in sql, f"{title}: ReplacingMergeTree tables must be read with FINAL"
        for table in ("calls", "call_qa", "segments"):  # their latest revision through the views, or a revision
            raw = f"callqa.{table} FINAL" in sql  # chosen by name (the live pass beside the final one)
            assert not raw or "revision =" in sql, f"{title}: {table} is read through {table}_deduped"


def exposed_worker_metrics() -> set[str]:
    """The metric names a worker's /metrics page declares (its registry's TYPE lines)."""
    text = generate_latest(WorkerMetrics().registry).decode()
    return set(re.findall(r"^# TYPE (\S+) ", text, flags=re.MULTILINE))


def test_prometheus_panels_use_worker_metrics() -> None:
    exprs = [t["expr"] for name in FILES for _, t in _targets(_load(name), "prometheus")]
    used = {m for expr in exprs for m in re.findall(r"\b(?:callqa_\w+|process_\w+)", expr)}
    assert {re.sub(r"_(bucket|sum|count)$", "", m) for m in used} <= exposed_worker_metrics()
    assert {"callqa_consumer_lag", "callqa_frames_dropped_total", "callqa_dead_letters_total",
            "callqa_final_delay_seconds_bucket"} <= used  # fmt: skip


ALL = {"tenant": "__all", "agent": "__all", "worker": "__all", "min_score": "70"}
ONE = {"tenant": "acme", "agent": "agent-2", "worker": "worker-1", "min_score": "70"}


def _run(db: FilledDatabase, sql: str, variables: dict[str, str]) -> tuple[list[str], list[tuple[Any, ...]]]:
    result = db.client.query(expand(sql, db.database, variables))
    return list(result.column_names), [tuple(r) for r in result.result_rows]


@pytest.mark.parametrize("name", FILES)
def test_every_clickhouse_query_runs_and_returns_its_columns(filled_db: FilledDatabase, name: str) -> None:
    dashboard = _load(name)
    targets = _targets(dashboard, "grafana-clickhouse-datasource")
    assert len(targets) >= 5
    for variables in (ALL, ONE):
        for title, target in targets:
            columns, rows = _run(filled_db, target["rawSql"], variables)
            if target["format"] == 0:
                assert columns[0] == "time" and len(columns) >= 2, title
            if variables is ALL:
                assert rows, f"{title}: no rows on the fixture calls"
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            _, rows = _run(filled_db, variable["query"], ALL)
            assert rows, variable["name"]


@pytest.mark.parametrize("name", FILES)
def test_every_clickhouse_query_passes_the_query_api_unchanged(filled_db: FilledDatabase, name: str) -> None:
    """Analysts' SQL looks like the dashboards': all of it passes the query API's check (CTEs, joins,
    IN subqueries, FINAL, window functions) and gives the rows it gives straight on ClickHouse."""
    from pipeline.store.queries import run_readonly_query

    dashboard = _load(name)
    queries = [t["rawSql"] for _, t in _targets(dashboard, "grafana-clickhouse-datasource")]
    queries += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    for sql in queries:
        for variables in (ALL, ONE):
            through = run_readonly_query(expand(sql, filled_db.database, variables), client=filled_db.client,
                                         database=filled_db.database)
            columns, rows = _run(filled_db, sql, variables)
            assert through.columns == columns and not through.truncated, sql
            assert sorted(map(repr, through.rows)) == sorted(map(repr, rows)), sql


def _panel_sql(name: str, title_start: str) -> str:
    return next(t["rawSql"] for title, t in _targets(_load(name), "grafana-clickhouse-datasource")
                if title.startswith(title_start))  # fmt: skip


def test_supervisor_numbers_follow_the_qa_results(filled_db: FilledDatabase) -> None:
    scores = [r.score_pct for r in filled_db.results.values()]
    _, rows = _run(filled_db, _panel_sql("qa-supervisor.json", "Calls scored"), ALL)
    assert rows == [(len(scores),)]  # the replayed rows are not counted twice
    _, rows = _run(filled_db, _panel_sql("qa-supervisor.json", "Average score"), ALL)
    assert rows[0][0] == pytest.approx(sum(scores) / len(scores), abs=0.05)

    columns, rows = _run(filled_db, _panel_sql("qa-supervisor.json", "Compliance rate per rule"), ALL)
    compliance = {row[columns.index("rule")]: row[columns.index("compliance_pct")] for row in rows}
    violating = sum(
        any(e.rule == "prohibited_language" for e in r.events) for r in filled_db.results.values()
    )
    assert compliance["prohibited_language"] == pytest.approx(100 * (1 - violating / len(scores)), abs=0.05)
    assert all(0 <= v <= 100 for v in compliance.values())

    columns, rows = _run(filled_db, _panel_sql("qa-supervisor.json", "Agent comparison"), ALL)
    assert {row[0] for row in rows} == {"agent-1", "agent-2", "agent-3"}


def test_flagged_calls_show_redacted_transcripts(filled_db: FilledDatabase) -> None:
    columns, rows = _run(filled_db, _panel_sql("qa-supervisor.json", "Flagged calls"), ALL)
    flagged = {r.call_id for r in filled_db.results.values() if r.auto_failed or r.score_pct < 70}
    assert {row[columns.index("call_id")] for row in rows} == flagged and "call-rude" in flagged
    rude = next(row for row in rows if row[columns.index("call_id")] == "call-rude")
    transcript = rude[columns.index("transcript")]
    assert "[PAN]" in transcript and "4111" not in transcript
    assert transcript.splitlines()[0].startswith("[0 s] agent: ")
    assert "prohibited_language violation" in rude[columns.index("findings")]


def test_operations_latency_percentiles(filled_db: FilledDatabase) -> None:
    columns, rows = _run(filled_db, _panel_sql("operations.json", "End-to-end latency"), ALL)
    assert columns == ["time", "p50", "p95", "p99"]
    assert all(p50 <= p95 <= p99 for _, p50, p95, p99 in rows)


def test_provisioning_names_the_datasources_the_dashboards_use() -> None:
    import yaml

    datasources = yaml.safe_load(
        (DASHBOARDS / "provisioning" / "datasources" / "clickhouse.yaml").read_text()
    )
    provided = {(d["type"], d["uid"]) for d in datasources["datasources"]}
    used = {(t["datasource"]["type"], t["datasource"]["uid"]) for name in FILES
            for p in _load(name)["panels"] for t in p["targets"]}  # fmt: skip
    assert used <= provided
    providers = yaml.safe_load((DASHBOARDS / "provisioning" / "dashboards" / "callqa.yaml").read_text())
    assert providers["apiVersion"] == 1 and providers["providers"][0]["type"] == "file"


def test_alert_rules() -> None:
    import yaml

    groups = yaml.safe_load((DASHBOARDS / "prometheus" / "alerts.yml").read_text())["groups"]
    rules = {r["alert"]: r for g in groups for r in g["rules"]}
    delay = rules["CallqaFinalDelayP99High"]
    assert "histogram_quantile(0.99" in delay["expr"] and "callqa_final_delay_seconds_bucket" in delay["expr"]
    assert delay["for"] == "1m"
    memory = rules["CallqaMemoryHighAndRising"]
    assert "0.8" in memory["expr"] and "deriv(" in memory["expr"]
    assert all({"summary", "description"} <= r["annotations"].keys() for r in rules.values())


def test_sentiment_and_interaction_panels_follow_the_qa_results(filled_db: FilledDatabase) -> None:
    from .conftest import CALLS

    results = filled_db.results

    def metric(call_id: str, name: str) -> float:
        return float(results[call_id].metrics.get(name, 0.0))  # a map lookup of a missing key reads 0

    _, rows = _run(filled_db, _panel_sql("qa-supervisor.json", "Calls ending with a negative customer"), ALL)
    negative = [c for c in results if metric(c, "customer_sentiment_end") <= -1]
    assert rows[0][0] == pytest.approx(100 * len(negative) / len(results), abs=0.05)

    columns, rows = _run(filled_db, _panel_sql("qa-supervisor.json", "Customer sentiment: start → end of call"), ALL)
    change = [metric(c, "customer_sentiment_end") - metric(c, "customer_sentiment_start") for c in results]
    assert columns == ["improving", "steady", "worsening"]
    assert rows == [(sum(d >= 1 for d in change), sum(abs(d) < 1 for d in change), sum(d <= -1 for d in change))]

    columns, rows = _run(filled_db, _panel_sql("qa-supervisor.json", "Interaction per agent"), ALL)
    agent_of = {call_id: agent for call_id, _, agent, *_ in CALLS}
    for row in rows:
        got = dict(zip(columns, row, strict=True))
        mine = [c for c in results if agent_of[c] == got["agent_id"]]
        assert got["calls"] == len(mine)
        for column, name, scale in (("longest_monologue_s", "longest_monologue_ms", 1000),
                                    ("hold_s_per_call", "hold_ms", 1000), ("overtalk_s", "overtalk_ms", 1000),
                                    ("agent_interruptions", "agent_interruptions", 1)):
            expected = sum(metric(c, name) for c in mine) / len(mine) / scale
            assert got[column] == pytest.approx(expected, abs=0.051), (got["agent_id"], column)
    assert {r[0] for r in rows} == set(agent_of.values())


def test_agent_trend_panels_put_the_agent_beside_the_team(filled_db: FilledDatabase) -> None:
    scores = {call: r.score_pct for call, r in filled_db.results.items()}
    columns, rows = _run(filled_db, _panel_sql("qa-supervisor.json", "Agent vs team: weekly QA score"), ONE)
    [row] = rows  # the fixture's calls all start in one week
    assert row[columns.index("agent")] == pytest.approx(scores["call-rude"], abs=0.05)  # agent-2's one call
    acme = [scores["call-good"], scores["call-rude"]]  # the team: the chosen tenant's agents
    assert row[columns.index("team")] == pytest.approx(sum(acme) / len(acme), abs=0.05)
    columns, rows = _run(filled_db, _panel_sql("qa-supervisor.json", "Agent vs team: scorecard items"), ONE)
    rude = filled_db.results["call-rude"]
    passed = {row[columns.index("question")]: row[columns.index("agent_pass_pct")] for row in rows
              if row[columns.index("agent_pass_pct")] is not None}  # None: an item only the team was scored on
    assert passed == {i.question: (100.0 if i.passed else 0.0) for i in rude.items if i.passed is not None}


def test_calls_per_category_per_day_count_the_stored_categories(filled_db: FilledDatabase) -> None:
    columns, rows = _run(filled_db, _panel_sql("qa-supervisor.json", "Calls per category per day"), ALL)
    counted = {row[columns.index("category")]: row[columns.index("calls")] for row in rows}  # one day of calls
    expected: dict[str, int] = {}
    for result in filled_db.results.values():
        for name in result.categories:
            expected[name] = expected.get(name, 0) + 1
    assert counted == expected and expected  # the replayed rows are not counted twice
