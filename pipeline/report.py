"""`callqa report`: calls, QA scores, failed items, metrics and redacted transcripts as rich tables.

The embedded store (chdb) admits one process per data folder; while a worker runs it holds the
store, so the report asks the worker's web API (read-only SQL, with the bearer token CALLQA_API_TOKEN)
instead of opening the store itself. Without a worker it reads the store through the read-only
account (CALLQA_CLICKHOUSE_READONLY_URL), under the same statement check and limits.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from rich.console import Console
from rich.table import Table

from pipeline.config import Settings


class RowSource(Protocol):
    def rows(self, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]: ...


@dataclass
class WorkerApiSource:
    """Read-only SQL through a running worker's /api/query."""

    base_url: str
    token: str = field(default="", repr=False)  # the worker's CALLQA_API_TOKEN

    def rows(self, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        query = {"sql": sql, **{f"param_{k}": str(v) for k, v in params.items()}}
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        request = urllib.request.Request(f"{self.base_url}/api/query?{urllib.parse.urlencode(query)}",
                                         headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=60) as resp:  # noqa: S310 - our own worker
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:  # the worker says why in the body
            body = _error_body(exc)
        if "error" in body:
            raise RuntimeError(body["error"])
        return [dict(zip(body["columns"], r, strict=True)) for r in body["rows"]]

    def available(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/metrics", timeout=2):  # noqa: S310
                return True
        except (urllib.error.URLError, OSError):
            return False


def _error_body(exc: urllib.error.HTTPError) -> dict[str, Any]:
    try:
        body = json.loads(exc.read() or b"{}")
    except ValueError:
        body = None
    if isinstance(body, dict) and "error" in body:
        return {"error": f"worker API answered {exc.code}: {body['error']}"}
    return {"error": f"worker API answered {exc.code} {exc.reason}"}


@dataclass
class StoreSource:
    """Read-only SQL straight on the store (no worker running)."""

    settings: Settings

    def rows(self, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        from pipeline.store.queries import QueryLimits, run_readonly_query

        result = run_readonly_query(sql, params, url=self.settings.reader_url,
                                    database=self.settings.clickhouse_database,
                                    limits=QueryLimits.from_settings(self.settings))
        return [dict(zip(result.columns, r, strict=True)) for r in result.rows]


def source_for(settings: Settings) -> RowSource:
    api = WorkerApiSource(f"http://{settings.web_host}:{settings.web_port}",
                          settings.api_token.get_secret_value().strip())
    return api if api.available() else StoreSource(settings)


CALLS_SQL = """
SELECT c.call_id AS call_id, c.agent_id AS agent_id, c.started_at AS started_at, c.end_reason AS end_reason,
       c.audio_ms AS audio_ms, c.segments AS segments, q.score_pct AS score_pct, q.auto_failed AS auto_failed,
       length(arrayFilter(p -> p = 0, q.`items.passed`)) AS failed, length(q.`items.passed`) AS items
FROM {db}.calls AS c FINAL
LEFT JOIN (SELECT * FROM {db}.call_qa FINAL) AS q ON q.call_id = c.call_id
WHERE {where}
ORDER BY c.started_at DESC
LIMIT 200
"""

TRANSCRIPT_SQL = """
SELECT leg, start_ms, end_ms, text, confidence FROM {db}.segments FINAL
WHERE call_id = {{call:String}} AND is_final = 1 ORDER BY start_ms, leg
"""

QA_SQL = """
SELECT score_pct, auto_failed, metrics, `items.question` AS q, `items.weight` AS w, `items.passed` AS p,
       `items.rationale` AS r
FROM {db}.call_qa FINAL WHERE call_id = {{call:String}}
"""


def render_report(
    source: RowSource, db: str, console: Console, *, call_id: str | None = None, agent_id: str | None = None,
    since: datetime | None = None,
) -> int:
    """Print the report; returns the number of calls shown."""
    where, params = ["1"], {}
    if call_id:
        where.append("c.call_id = {call:String}")
        params["call"] = call_id
    if agent_id:
        where.append("c.agent_id = {agent:String}")
        params["agent"] = agent_id
    if since:
        where.append("c.started_at >= {since:DateTime64(3, 'UTC')}")
        params["since"] = since.strftime("%Y-%m-%d %H:%M:%S")
    calls = source.rows(CALLS_SQL.format(db=db, where=" AND ".join(where)), params)
    table = Table("call", "agent", "started", "ended", "audio s", "segments", "score %", "failed",
                  title="calls")
    table.columns[0].no_wrap = True
    for c in calls:
        score = "-" if c["score_pct"] is None else f"{c['score_pct']:.1f}" + (" AUTO-FAIL" if c["auto_failed"] else "")
        table.add_row(c["call_id"], c["agent_id"], str(c["started_at"])[:19], c["end_reason"] or "open",
                      f"{c['audio_ms'] / 1000:.1f}", str(c["segments"]), score,
                      f"{c['failed']}/{c['items']}" if c["items"] else "-")
    console.print(table)
    if call_id and calls:
        _render_call(source, db, console, call_id)
    return len(calls)


def _render_call(source: RowSource, db: str, console: Console, call_id: str) -> None:
    qa = source.rows(QA_SQL.format(db=db), {"call": call_id})
    if qa:
        q = qa[0]
        items = Table("question", "weight", "passed", "rationale", title=f"scorecard: {q['score_pct']:.1f} %")
        for question, weight, passed, why in zip(q["q"], q["w"], q["p"], q["r"], strict=True):
            items.add_row(question, f"{weight:g}", "yes" if passed else "[red]no[/red]", why)
        console.print(items)
        metrics = Table("metric", "value", title="conversation metrics")
        for name, value in sorted(q["metrics"].items()):
            metrics.add_row(name, f"{value:,.2f}")
        console.print(metrics)
    lines = source.rows(TRANSCRIPT_SQL.format(db=db), {"call": call_id})
    transcript = Table("time", "leg", "text", title="transcript (redacted)")
    for line in lines:
        transcript.add_row(f"{line['start_ms'] / 1000:6.1f}-{line['end_ms'] / 1000:6.1f}", line["leg"], line["text"])
    console.print(transcript)
