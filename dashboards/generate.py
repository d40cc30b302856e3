"""Writes the Grafana dashboards (qa-supervisor.json, operations.json) next to this file.

The JSON files are what Grafana provisions; this script is their source, so panels share one way of
building queries and stay consistent. Run `python dashboards/generate.py` after editing; the tests fail
when the committed JSON is not what this script writes.

ClickHouse tables are ReplacingMergeTree (at-least-once inserts): every query reads them with FINAL, and
calls, call_qa and segments through their ``_deduped`` views, which are FINAL and each call's latest
revision (the post-call pass's result where there is one, else the live one).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CLICKHOUSE = {"type": "grafana-clickhouse-datasource", "uid": "callqa-clickhouse"}
PROMETHEUS = {"type": "prometheus", "uid": "callqa-prometheus"}
# The plugin's format numbers (grafana-plugin-sdk-go sqlutil.FormatQueryOption).
FORMAT_TIME_SERIES, FORMAT_TABLE = 0, 1
ALL = "__all"
TENANT = f"('${{tenant}}' = '{ALL}' OR tenant = '${{tenant}}')"
AGENT = f"('${{agent}}' = '{ALL}' OR agent_id = '${{agent}}')"
SCORED = f"$__timeFilter(computed_at) AND {TENANT} AND {AGENT}"

Json = dict[str, Any]


def sql_target(sql: str, time_series: bool, ref: str = "A") -> Json:
    return {
        "refId": ref,
        "datasource": CLICKHOUSE,
        "editorType": "sql",
        "queryType": "timeSeries" if time_series else "table",
        "format": FORMAT_TIME_SERIES if time_series else FORMAT_TABLE,
        "rawSql": " ".join(sql.split()),
    }


def prom_target(expr: str, legend: str, ref: str = "A") -> Json:
    return {"refId": ref, "datasource": PROMETHEUS, "expr": expr, "legendFormat": legend, "range": True}


def panel(
    title: str, kind: str, targets: list[Json], pos: tuple[int, int, int, int], unit: str = "", **options: Any
) -> Json:
    x, y, w, h = pos
    return {
        "type": kind,
        "title": title,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "datasource": targets[0]["datasource"],
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": unit} if unit else {}, "overrides": []},
        "options": options,
    }


def query_variable(name: str, label: str, sql: str) -> Json:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": CLICKHOUSE,
        "query": sql,
        "refresh": 2,
        "includeAll": True,
        "allValue": ALL,
        "multi": False,
        "sort": 1,
        "current": {"text": "All", "value": "$__all"},
    }


def dashboard(uid: str, title: str, tags: list[str], panels: list[Json], variables: list[Json]) -> Json:
    for number, item in enumerate(panels, start=1):
        item["id"] = number
    return {
        "uid": uid,
        "title": title,
        "tags": tags,
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 41,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-24h", "to": "now"},
        "timezone": "utc",
        "templating": {"list": variables},
        "annotations": {"list": []},
        "links": [],
        "panels": panels,
    }


TRANSCRIPT = """
arrayStringConcat(arrayMap(s -> concat('[', toString(round(s.1 / 1000, 1)), ' s] ', s.2, ': ', s.3),
  arraySort(s -> s.1, groupArray((start_ms, toString(leg), text)))), '\\n')
"""


# Sentiment on Contact Lens's −5..+5 scale (pipeline/qa/sentiment.py): one point either way is the neutral
# band, and a change of start to end of at least one point is a trend. Read from the QA metrics map, which
# carries every figure of a scored call, so the panels need no column of a later migration.
SENTIMENT_POINTS = 1


def sentiment_and_interaction_panels(y: int) -> list[Json]:
    """Customer sentiment (over time, start → end, calls ending negative) and interaction (holds,
    monologues, interruptions, overtalk) per call and per agent."""
    m = "metrics"
    over_time = panel(
        "Customer sentiment over time",
        "timeseries",
        [
            sql_target(
                f"""
        SELECT $__timeInterval(computed_at) AS time, round(avg({m}['customer_sentiment']), 2) AS customer,
               round(avg({m}['customer_sentiment_start']), 2) AS customer_start,
               round(avg({m}['customer_sentiment_end']), 2) AS customer_end,
               round(avg({m}['agent_sentiment']), 2) AS agent
        FROM callqa.call_qa_deduped WHERE {SCORED} GROUP BY time ORDER BY time""",
                True,
            )
        ],
        (0, y, 12, 8),
    )
    over_time["fieldConfig"]["defaults"].update(min=-5, max=5)  # the whole scale, so 0 sits in the middle
    return [
        over_time,
        panel(
            "Customer sentiment: start → end of call",
            "bargauge",
            [
                sql_target(
                    f"""
            SELECT countIf({m}['customer_sentiment_end'] - {m}['customer_sentiment_start'] >= {SENTIMENT_POINTS})
                     AS improving,
                   countIf(abs({m}['customer_sentiment_end'] - {m}['customer_sentiment_start']) < {SENTIMENT_POINTS})
                     AS steady,
                   countIf({m}['customer_sentiment_end'] - {m}['customer_sentiment_start'] <= -{SENTIMENT_POINTS})
                     AS worsening
            FROM callqa.call_qa_deduped WHERE {SCORED}""",
                    False,
                )
            ],
            (12, y, 6, 8),
            orientation="horizontal",
            reduceOptions={"values": False, "calcs": ["lastNotNull"], "fields": ""},
        ),
        panel(
            "Calls ending with a negative customer",
            "stat",
            [
                sql_target(
                    f"""
            SELECT round(100 * avg({m}['customer_sentiment_end'] <= -{SENTIMENT_POINTS}), 1) AS negative_end_pct
            FROM callqa.call_qa_deduped WHERE {SCORED}""",
                    False,
                )
            ],
            (18, y, 6, 8),
            "percent",
        ),
        panel(
            "Interaction per agent",
            "table",
            [
                sql_target(
                    f"""
            SELECT agent_id, count() AS calls,
                   round(avg({m}['customer_sentiment']), 2) AS customer_sentiment,
                   round(avg({m}['hold_ms']) / 1000, 1) AS hold_s_per_call, round(avg({m}['holds']), 2) AS holds_per_call,
                   round(avg({m}['longest_monologue_ms']) / 1000, 1) AS longest_monologue_s,
                   round(avg({m}['agent_interruptions']), 2) AS agent_interruptions,
                   round(avg({m}['customer_interruptions']), 2) AS customer_interruptions,
                   round(avg({m}['overtalk_ms']) / 1000, 1) AS overtalk_s,
                   round(avg({m}['non_talk_pct']), 1) AS non_talk_pct
            FROM callqa.call_qa_deduped WHERE {SCORED} GROUP BY agent_id ORDER BY customer_sentiment ASC""",
                    False,
                )
            ],
            (0, y + 8, 12, 8),
        ),
        panel(
            "Hold time per call",
            "histogram",
            [
                sql_target(
                    f"""
            SELECT {m}['hold_ms'] / 1000 AS hold_s FROM callqa.call_qa_deduped WHERE {SCORED}""",
                    False,
                )
            ],
            (12, y + 8, 6, 8),
            "s",
        ),
        panel(
            "Longest monologue per call",
            "histogram",
            [
                sql_target(
                    f"""
            SELECT {m}['longest_monologue_ms'] / 1000 AS longest_monologue_s
            FROM callqa.call_qa_deduped WHERE {SCORED}""",
                    False,
                )
            ],
            (18, y + 8, 6, 8),
            "s",
        ),
    ]


# An agent's weeks beside the team's (pipeline/desk/trends.py, the /agents/{id} page): the calls with their
# scores, then "agent" is the calls of the chosen agent (all agents when none is chosen) and "team" every
# call of the tenant. Weekly figures want weeks: these panels show the last 12 whatever the dashboard's range.
WEEKS = "84d"
SCORED_CALLS = """
    (SELECT c.started_at AS started_at, c.agent_id AS agent_id, c.tenant AS tenant, q.score_pct AS score_pct,
            q.metrics AS metrics, arrayZip(q.`items.question`, q.`items.passed`) AS items
     FROM callqa.calls_deduped AS c INNER JOIN callqa.call_qa_deduped AS q ON q.call_id = c.call_id)
"""


def agent_trend_panels(y: int) -> list[Json]:
    """The chosen agent against the team, week by week: score and customer sentiment, talk share, silence and
    overtalk, and each scorecard item's pass rate."""
    week = "toDateTime(toMonday(started_at)) AS time"
    where = f"WHERE $__timeFilter(started_at) AND {TENANT}"
    share = "100 * metrics['overtalk_ms'] / metrics['duration_ms']"
    panels = [
        panel("Agent vs team: weekly QA score", "timeseries", [sql_target(f"""
            SELECT {week}, round(avgIfOrNull(score_pct, {AGENT}), 1) AS agent, round(avg(score_pct), 1) AS team
            FROM {SCORED_CALLS} {where} GROUP BY time ORDER BY time""", True)], (0, y, 8, 8), "percent"),
        panel("Agent vs team: weekly customer sentiment", "timeseries", [sql_target(f"""
            SELECT {week}, round(avgIfOrNull(metrics['customer_sentiment'], {AGENT}), 2) AS agent,
                   round(avg(metrics['customer_sentiment']), 2) AS team
            FROM {SCORED_CALLS} {where} GROUP BY time ORDER BY time""", True)], (8, y, 8, 8)),
        panel("Agent vs team: talk share, non-talk, overtalk", "timeseries", [sql_target(f"""
            SELECT {week}, round(avgIfOrNull(metrics['agent_talk_share_pct'], {AGENT}), 1) AS agent_talk_share,
                   round(avg(metrics['agent_talk_share_pct']), 1) AS team_talk_share,
                   round(avgIfOrNull(metrics['non_talk_pct'], {AGENT}), 1) AS agent_non_talk,
                   round(avg(metrics['non_talk_pct']), 1) AS team_non_talk,
                   round(avgIfOrNull({share}, {AGENT} AND metrics['duration_ms'] > 0), 1) AS agent_overtalk,
                   round(avgIfOrNull({share}, metrics['duration_ms'] > 0), 1) AS team_overtalk
            FROM {SCORED_CALLS} {where} GROUP BY time ORDER BY time""", True)], (16, y, 8, 8), "percent"),
        panel("Agent vs team: scorecard items passed per week", "table", [sql_target(f"""
            SELECT toMonday(started_at) AS week, item.1 AS question, round(100 * avgIfOrNull(item.2, {AGENT}), 0) AS agent_pass_pct,
                   round(100 * avg(item.2), 0) AS team_pass_pct
            FROM {SCORED_CALLS} ARRAY JOIN items AS item {where}
            GROUP BY week, question ORDER BY week DESC, question""", False)], (0, y + 8, 24, 8)),
    ]
    for item in panels:
        item["timeFrom"] = WEEKS
    return panels


def qa_supervisor() -> Json:
    flagged = f"SELECT call_id FROM callqa.call_qa_deduped WHERE {SCORED} AND (auto_failed = 1 OR score_pct < ${{min_score}})"
    panels = [
        panel(
            "Calls scored",
            "stat",
            [sql_target(f"SELECT count() AS calls FROM callqa.call_qa_deduped WHERE {SCORED}", False)],
            (0, 0, 6, 4),
        ),
        panel(
            "Average score",
            "stat",
            [
                sql_target(
                    f"SELECT round(avg(score_pct), 1) AS avg_score FROM callqa.call_qa_deduped WHERE {SCORED}",
                    False,
                )
            ],
            (6, 0, 6, 4),
            "percent",
        ),
        panel(
            "Automatic fails",
            "stat",
            [
                sql_target(
                    f"SELECT round(100 * avg(auto_failed), 1) AS auto_fail_pct FROM callqa.call_qa_deduped WHERE {SCORED}",
                    False,
                )
            ],
            (12, 0, 6, 4),
            "percent",
        ),
        panel(
            "Live alerts (violations, intents)",
            "stat",
            [
                sql_target(
                    f"""
            SELECT count() AS alerts FROM callqa.qa_events_deduped
            WHERE $__timeFilter(detected_at) AND kind IN ('violation', 'alert')
              AND call_id IN (SELECT call_id FROM callqa.calls_deduped WHERE {TENANT} AND {AGENT})""",
                    False,
                )
            ],
            (18, 0, 6, 4),
        ),
        panel(
            "QA score over time",
            "timeseries",
            [
                sql_target(
                    f"""
            SELECT $__timeInterval(computed_at) AS time, avg(score_pct) AS avg_score,
                   quantile(0.1)(score_pct) AS p10_score
            FROM callqa.call_qa_deduped WHERE {SCORED} GROUP BY time ORDER BY time""",
                    True,
                )
            ],
            (0, 4, 12, 8),
            "percent",
        ),
        panel(
            "Compliance rate per rule",
            "bargauge",
            [
                sql_target(
                    f"""
            WITH (SELECT count() FROM callqa.call_qa_deduped WHERE {SCORED}) AS scored_calls
            SELECT rule, any(category) AS category,
                   round(100 * (1 - uniqExactIf(call_id, kind IN ('missing', 'violation')) / greatest(scored_calls, 1)), 1)
                     AS compliance_pct
            FROM callqa.qa_events_deduped
            WHERE kind IN ('match', 'missing', 'violation')
              AND call_id IN (SELECT call_id FROM callqa.call_qa_deduped WHERE {SCORED})
            GROUP BY rule ORDER BY compliance_pct ASC""",
                    False,
                )
            ],
            (12, 4, 12, 8),
            "percent",
            orientation="horizontal",
            reduceOptions={"values": True, "calcs": [], "fields": "/^compliance_pct$/"},
        ),
        panel(
            "Pass rate per scorecard question",
            "table",
            [
                sql_target(
                    f"""
            SELECT items.question AS question, round(100 * avg(items.passed), 1) AS pass_pct, count() AS calls,
                   any(items.weight) AS weight
            FROM callqa.call_qa_deduped ARRAY JOIN items
            WHERE {SCORED} GROUP BY question ORDER BY pass_pct ASC""",
                    False,
                )
            ],
            (0, 12, 12, 8),
        ),
        panel(
            "Agent comparison",
            "table",
            [
                sql_target(
                    f"""
            SELECT agent_id, count() AS calls, round(avg(score_pct), 1) AS avg_score,
                   round(100 * avg(auto_failed), 1) AS auto_fail_pct,
                   round(avg(metrics['agent_talk_share_pct']), 1) AS agent_talk_share_pct,
                   round(avg(metrics['non_talk_pct']), 1) AS non_talk_pct,
                   round(avg(metrics['agent_interruptions']), 2) AS interruptions_per_call,
                   round(avg(metrics['agent_wpm']), 0) AS agent_wpm
            FROM callqa.call_qa_deduped WHERE {SCORED} GROUP BY agent_id ORDER BY avg_score DESC""",
                    False,
                )
            ],
            (12, 12, 12, 8),
        ),
        panel(
            "Silence: non-talk % per call",
            "histogram",
            [
                sql_target(
                    f"""
            SELECT metrics['non_talk_pct'] AS non_talk_pct
            FROM callqa.call_qa_deduped WHERE {SCORED}""",
                    False,
                )
            ],
            (0, 20, 8, 8),
            "percent",
            bucketSize=5,
        ),
        panel(
            "Longest silence per call",
            "histogram",
            [
                sql_target(
                    f"""
            SELECT metrics['longest_silence_ms'] / 1000 AS longest_silence_s
            FROM callqa.call_qa_deduped WHERE {SCORED}""",
                    False,
                )
            ],
            (8, 20, 8, 8),
            "s",
        ),
        panel(
            "Overtalk per call",
            "histogram",
            [
                sql_target(
                    f"""
            SELECT metrics['overtalk_ms'] / 1000 AS overtalk_s, metrics['overtalk_count'] AS overtalk_count
            FROM callqa.call_qa_deduped WHERE {SCORED}""",
                    False,
                )
            ],
            (16, 20, 8, 8),
        ),
        panel(
            "Flagged calls (auto-fail or score below ${min_score}) with transcripts",
            "table",
            [
                sql_target(
                    f"""
            SELECT q.call_id AS call_id, q.agent_id AS agent_id, q.score_pct AS score_pct,
                   q.auto_failed AS auto_failed, q.computed_at AS computed_at, e.findings AS findings,
                   t.transcript AS transcript
            FROM (SELECT call_id, agent_id, score_pct, auto_failed, computed_at
                  FROM callqa.call_qa_deduped WHERE call_id IN ({flagged})) AS q
            LEFT JOIN (SELECT call_id,
                         arrayStringConcat(groupArray(concat(toString(rule), ' ', toString(kind), ' at ',
                           toString(round(offset_ms / 1000, 1)), ' s')), '; ') AS findings
                       FROM callqa.qa_events_deduped
                       WHERE kind IN ('missing', 'violation', 'alert') AND call_id IN ({flagged})
                       GROUP BY call_id) AS e ON e.call_id = q.call_id
            LEFT JOIN (SELECT call_id, {TRANSCRIPT} AS transcript
                       FROM callqa.segments_deduped WHERE is_final = 1 AND call_id IN ({flagged})
                       GROUP BY call_id) AS t ON t.call_id = q.call_id
            ORDER BY q.auto_failed DESC, q.score_pct ASC LIMIT 200""",
                    False,
                )
            ],
            (0, 28, 24, 10),
            cellHeight="lg",
        ),
        panel(
            "Recent live alerts",
            "table",
            [
                sql_target(
                    f"""
            SELECT detected_at, call_id, rule, category, leg, kind, round(offset_ms / 1000, 1) AS offset_s,
                   severity, text
            FROM callqa.qa_events_deduped
            WHERE $__timeFilter(detected_at) AND kind IN ('violation', 'alert')
              AND call_id IN (SELECT call_id FROM callqa.calls_deduped WHERE {TENANT} AND {AGENT})
            ORDER BY detected_at DESC LIMIT 200""",
                    False,
                )
            ],
            (0, 38, 24, 8),
        ),
        *sentiment_and_interaction_panels(46),
    ]
    panels += agent_trend_panels(max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels))
    panels.append(panel("Calls per category per day", "timeseries", [sql_target(f"""
        SELECT toDateTime(toStartOfDay(started_at)) AS time, arrayJoin(categories) AS category, count() AS calls
        FROM callqa.calls_deduped WHERE $__timeFilter(started_at) AND {TENANT} AND {AGENT}
        GROUP BY time, category ORDER BY time, category""", True)],
        (0, max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels), 24, 8)))
    panels[-1]["timeFrom"] = "30d"  # a day per point: a month whatever the dashboard's range
    variables = [
        query_variable("tenant", "Tenant", "SELECT DISTINCT tenant FROM callqa.calls_deduped ORDER BY tenant"),
        query_variable(
            "agent",
            "Agent",
            f"SELECT DISTINCT agent_id FROM callqa.calls_deduped WHERE {TENANT} ORDER BY agent_id",
        ),
        {
            "name": "min_score",
            "label": "Flag calls scoring below",
            "type": "custom",
            "query": "50,60,70,80,90",
            "current": {"text": "70", "value": "70"},
            "options": [
                {"text": v, "value": v, "selected": v == "70"} for v in ("50", "60", "70", "80", "90")
            ],
        },
    ]
    return dashboard("callqa-supervisor", "Call QA: supervisor", ["callqa", "qa"], panels, variables)


LATENCY = "FROM callqa.latency FINAL WHERE $__timeFilter(measured_at) AND ('${worker}' = '__all' OR worker_id = '${worker}')"


def operations() -> Json:
    panels = [
        panel(
            "End-to-end latency (frame to transcript)",
            "timeseries",
            [
                sql_target(
                    f"""
            SELECT $__timeInterval(measured_at) AS time, quantile(0.5)(end_to_end_ms) AS p50,
                   quantile(0.95)(end_to_end_ms) AS p95, quantile(0.99)(end_to_end_ms) AS p99
            {LATENCY} GROUP BY time ORDER BY time""",
                    True,
                )
            ],
            (0, 0, 12, 8),
            "ms",
        ),
        panel(
            "Where the time goes (mean per segment)",
            "timeseries",
            [
                sql_target(
                    f"""
            SELECT $__timeInterval(measured_at) AS time, avg(frame_to_consume_ms) AS frame_to_consume,
                   avg(batcher_wait_ms) AS batcher_wait, avg(inference_ms) AS inference
            {LATENCY} GROUP BY time ORDER BY time""",
                    True,
                )
            ],
            (12, 0, 12, 8),
            "ms",
            stacking={"mode": "normal"},
        ),
        panel(
            "Final delay after end of speech (P50/P95/P99)",
            "timeseries",
            [
                prom_target(
                    f"histogram_quantile({q}, sum by (le) (rate(callqa_final_delay_seconds_bucket[$__rate_interval])))",
                    f"p{round(q * 100)}",
                    ref,
                )
                for q, ref in ((0.5, "A"), (0.95, "B"), (0.99, "C"))
            ],
            (0, 8, 12, 8),
            "s",
        ),
        panel(
            "Throughput",
            "timeseries",
            [
                sql_target(
                    f"""
            SELECT $__timeInterval(measured_at) AS time, count() / $__interval_s AS segments_per_s,
                   uniqExact(call_id) AS active_calls
            {LATENCY} GROUP BY time ORDER BY time""",
                    True,
                )
            ],
            (12, 8, 12, 8),
        ),
        panel(
            "Batch size",
            "timeseries",
            [
                sql_target(
                    f"""
                SELECT $__timeInterval(measured_at) AS time, avg(batch_size) AS mean_batch, max(batch_size) AS max_batch
                {LATENCY} GROUP BY time ORDER BY time""",
                    True,
                ),
                prom_target(
                    "sum(rate(callqa_batch_size_sum[$__rate_interval])) / sum(rate(callqa_batch_size_count[$__rate_interval]))",
                    "mean batch (worker)",
                    "B",
                ),
            ],
            (0, 16, 12, 8),
        ),
        panel(
            "Latency by worker (P99)",
            "table",
            [
                sql_target(
                    f"""
            SELECT worker_id, count() AS segments, round(quantile(0.5)(end_to_end_ms), 1) AS p50_ms,
                   round(quantile(0.99)(end_to_end_ms), 1) AS p99_ms, round(avg(batch_size), 2) AS mean_batch
            {LATENCY} GROUP BY worker_id ORDER BY p99_ms DESC""",
                    False,
                )
            ],
            (12, 16, 12, 8),
        ),
        panel(
            "Consumer lag",
            "timeseries",
            [prom_target("sum by (topic) (callqa_consumer_lag)", "{{topic}}")],
            (0, 24, 8, 8),
        ),
        panel(
            "Dropped frames",
            "timeseries",
            [prom_target("sum(rate(callqa_frames_dropped_total[$__rate_interval]))", "frames/s")],
            (8, 24, 8, 8),
            "short",
        ),
        panel(
            "Dead letters",
            "timeseries",
            [prom_target("sum(increase(callqa_dead_letters_total[$__rate_interval]))", "dead letters")],
            (16, 24, 8, 8),
        ),
        panel(
            "Worker memory",
            "timeseries",
            [prom_target('process_resident_memory_bytes{job="callqa-worker"}', "{{instance}} {{replica}}")],
            (0, 32, 12, 8),
            "bytes",
        ),
        panel(
            "Calls ended",
            "timeseries",
            [
                sql_target(
                    f"""
            SELECT $__timeInterval(ended_at) AS time, countIf(end_reason = 'end') AS ended,
                   countIf(end_reason != 'end') AS aborted_or_timed_out
            FROM callqa.calls_deduped WHERE ended_at IS NOT NULL AND $__timeFilter(ended_at) AND {TENANT}
            GROUP BY time ORDER BY time""",
                    True,
                )
            ],
            (12, 32, 12, 8),
        ),
        panel(
            "Post-call pass: backlog and calls done",
            "timeseries",
            [
                prom_target("sum(callqa_postcall_backlog)", "calls waiting"),
                prom_target('sum(rate(callqa_postcall_calls_total{outcome="written"}[$__rate_interval])) * 60',
                            "calls revised per minute", "B"),
                prom_target("sum(rate(callqa_postcall_changes_total[$__rate_interval])) * 60",
                            "revisions that changed score or auto-fail per minute", "C"),
            ],
            (0, 40, 12, 8),
        ),
        panel(
            "Post-call revisions (final vs live score)",
            "table",
            [
                sql_target(
                    f"""
            SELECT count() AS calls, countIf(f.revision > 0) AS revised,
                   round(avgIf(f.score_pct - l.score_pct, f.revision > 0), 2) AS mean_score_change,
                   countIf(f.revision > 0 AND f.auto_failed != l.auto_failed) AS auto_fail_changed
            FROM callqa.call_qa_deduped AS f
            INNER JOIN (SELECT call_id, score_pct, auto_failed FROM callqa.call_qa FINAL WHERE revision = 0) AS l
                ON l.call_id = f.call_id
            WHERE $__timeFilter(f.computed_at) AND ('${{tenant}}' = '{ALL}' OR f.tenant = '${{tenant}}')""",
                    False,
                )
            ],
            (12, 40, 12, 8),
        ),
    ]
    variables = [
        query_variable(
            "worker", "Worker", "SELECT DISTINCT worker_id FROM callqa.latency FINAL ORDER BY worker_id"
        ),
        query_variable("tenant", "Tenant", "SELECT DISTINCT tenant FROM callqa.calls_deduped ORDER BY tenant"),
    ]
    return dashboard("callqa-operations", "Call QA: operations", ["callqa", "ops"], panels, variables)


DASHBOARDS = {"qa-supervisor.json": qa_supervisor, "operations.json": operations}


def render(build: Any) -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main() -> None:
    for name, build in DASHBOARDS.items():
        (HERE / name).write_text(render(build), encoding="utf-8")


if __name__ == "__main__":
    main()
