"""`callqa report`: calls, QA scores, failed items, metrics and redacted transcripts, as tables or JSON.

The embedded store (chdb) admits one process per data folder; while a worker runs it holds the
store, so the report asks the worker's web API (read-only SQL, with the bearer token CALLQA_API_TOKEN, or
when that is not set the token a local worker keeps in ``<state_dir>/api-token``) instead of opening the
store itself. Without a worker it reads the store through the read-only account
(CALLQA_CLICKHOUSE_READONLY_URL), under the same statement check and limits.

``--html DIR`` writes the worker's call pages as static files instead (``write_html``: pipeline/web/).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pipeline.config import Settings
from pipeline.tables import keep_whole, print_table


class TruncatedRowsError(RuntimeError):
    """A read matched more rows than the read-only API returns: a reader that went on with the first
    ones would report a partial answer as a whole one (a count, a scan for PII, a comparison)."""

    def __init__(self, returned: int) -> None:
        super().__init__(f"the query matched more than the {returned} rows the API returns "
                         "(CALLQA_API_QUERY_MAX_ROWS): narrow it (--call, --agent, --since) or raise the limit")


class WorkerApiError(RuntimeError):
    """The worker's API refused a request: ``worker API answered <status>: <its one line>``."""


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
        if body.get("truncated"):
            raise TruncatedRowsError(len(body["rows"]))
        return [dict(zip(body["columns"], r, strict=True)) for r in body["rows"]]

    def send(self, method: str, path: str, body: dict[str, Any] | None = None, timeout_s: float = 60) -> Any:
        """A JSON request to the worker's API (``path`` quoted by the caller) with the token; its JSON answer,
        or a WorkerApiError with the worker's one line."""
        request = urllib.request.Request(
            f"{self.base_url}{path}", method=method, data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json",
                     **({"Authorization": f"Bearer {self.token}"} if self.token else {})})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as answer:  # noqa: S310 - our own worker
                return json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            raise WorkerApiError(_error_body(exc)["error"]) from None

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
        if result.truncated:
            raise TruncatedRowsError(len(result.rows))
        return [dict(zip(result.columns, r, strict=True)) for r in result.rows]


def api_token(settings: Settings) -> str:
    """CALLQA_API_TOKEN, else the token a local worker made and keeps in ``<state_dir>/api-token`` (a file
    others can read is refused: ``TokenFileError``), else empty."""
    from pipeline.api.token_file import read_token_file, token_path

    return settings.api_token.get_secret_value().strip() or read_token_file(token_path(settings.state_dir)) or ""


def running_worker(settings: Settings) -> WorkerApiSource | None:
    """The local worker's API (with the operator's token) when a worker answers there, else None: a command
    that writes then goes through it, as the worker holds the embedded store."""
    api = WorkerApiSource(f"http://{settings.web_host}:{settings.web_port}", api_token(settings))
    return api if api.available() else None


def source_for(settings: Settings) -> RowSource:
    return running_worker(settings) or StoreSource(settings)


def write_html(source: RowSource, settings: Settings, out_dir: Path, *, call_id: str | None = None,
               agent_id: str | None = None, since: datetime | None = None) -> tuple[Path, int]:
    """``callqa report --html DIR``: the call list (``DIR/index.html``) and a page per listed call
    (``DIR/calls/``), as the worker serves them; returns the list's path and the number of calls."""
    from pipeline.web.data import ListFilters
    from pipeline.web.render import write_site

    filters = ListFilters(agent=agent_id, since=since, call_id=call_id)
    return write_site(source, settings.clickhouse_database, out_dir, filters, settings.qa_silence_threshold_ms)


# A call not scored yet has no call_qa row: the LEFT JOIN gives it call_qa's defaults (a score of 0),
# hence NULL for those, told apart by the empty call_id.
CALLS_SQL = """
SELECT c.call_id AS call_id, c.agent_id AS agent_id, c.started_at AS started_at, c.end_reason AS end_reason,
       c.audio_ms AS audio_ms, c.segments AS segments,
       if(empty(q.call_id), NULL, q.score_pct) AS score_pct, if(empty(q.call_id), NULL, q.auto_failed) AS auto_failed,
       length(arrayFilter(p -> p = 0, q.`items.passed`)) AS failed, length(q.`items.passed`) AS items,
       c.customer_sentiment AS customer_sentiment
FROM {db}.calls_deduped AS c
LEFT JOIN (SELECT * FROM {db}.call_qa_deduped) AS q ON q.call_id = c.call_id
WHERE {where}
ORDER BY c.started_at DESC
LIMIT 200
"""

TRANSCRIPT_SQL = """
SELECT leg, start_ms, end_ms, text, confidence, sentiment FROM {db}.segments_deduped
WHERE call_id = {{call:String}} AND is_final = 1 ORDER BY start_ms, leg
"""

QA_SQL = """
SELECT score_pct, auto_failed, metrics, `items.question` AS q, `items.weight` AS w, `items.passed` AS p,
       `items.rationale` AS r, automatic_score_pct, reviewed_by
FROM {db}.call_qa_deduped WHERE call_id = {{call:String}}
"""


@dataclass(frozen=True)
class CallRow:
    """One call of the list: its state and its QA score (None until the call is scored)."""

    call_id: str
    agent_id: str
    started_at: datetime
    end_reason: str | None  # end, abort or timeout; None while the call is open
    audio_s: float
    segments: int
    score_pct: float | None
    auto_failed: bool | None
    failed_items: int
    items: int
    customer_sentiment: float | None = None  # −5..+5 over the customer's turns (pipeline/qa/sentiment.py)


@dataclass(frozen=True)
class ScorecardItem:
    question: str
    weight: float
    passed: bool
    rationale: str
    id: str | None = None  # the item's id in the configured scorecard (what `callqa review --item` takes)


@dataclass(frozen=True)
class ReviewLine:
    """One human review of an item (pipeline/desk/review.py), oldest first."""

    item: str
    automatic: str
    verdict: str
    reason: str
    reviewer: str
    reviewed_at: datetime


@dataclass(frozen=True)
class TranscriptLine:
    start_s: float
    end_s: float
    leg: str
    text: str  # redacted
    sentiment: float = 0.0  # of the text, −5..+5


@dataclass
class CallDetail:
    """One call in full (``--call``): its scorecard (empty before QA ran), metrics and redacted transcript."""

    score_pct: float | None
    auto_failed: bool | None
    items: list[ScorecardItem]
    metrics: dict[str, float]
    transcript: list[TranscriptLine]
    automatic_score_pct: float | None = None  # the score before any review; None: never reviewed
    reviewed_by: str = ""
    reviews: list[ReviewLine] = field(default_factory=list)


@dataclass
class Report:
    calls: list[CallRow]
    call: CallDetail | None = None  # with --call, when the store has that call

    def as_json(self) -> dict[str, Any]:
        """``callqa report --json``: ``{"calls": [CallRow], "call": CallDetail or null}``, field names as above."""
        return {"calls": [asdict(c) for c in self.calls], "call": asdict(self.call) if self.call else None}


def read_report(
    source: RowSource, db: str, *, call_id: str | None = None, agent_id: str | None = None,
    since: datetime | None = None, item_ids: Mapping[str, str] | None = None,
) -> Report:
    """The calls matching the filters (the newest 200), and with ``call_id`` that call in full."""
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
    calls = [_call_row(c) for c in source.rows(CALLS_SQL.format(db=db, where=" AND ".join(where)), params)]
    return Report(calls, _read_call(source, db, call_id, item_ids or {}) if call_id and calls else None)


def _call_row(c: dict[str, Any]) -> CallRow:
    started = c["started_at"]  # a datetime from the store, ISO 8601 text through the worker's API
    if not isinstance(started, datetime):
        started = datetime.fromisoformat(started)
    scored = c["score_pct"] is not None
    return CallRow(
        call_id=c["call_id"], agent_id=c["agent_id"],
        started_at=started if started.tzinfo else started.replace(tzinfo=UTC),  # the column is in UTC
        end_reason=c["end_reason"] or None, audio_s=c["audio_ms"] / 1000, segments=int(c["segments"]),
        score_pct=round(float(c["score_pct"]), 2) if scored else None,
        auto_failed=bool(c["auto_failed"]) if scored else None,
        failed_items=int(c["failed"] or 0), items=int(c["items"] or 0),
        customer_sentiment=round(float(c["customer_sentiment"]), 2) if scored and "customer_sentiment" in c else None,
    )


def _read_call(source: RowSource, db: str, call_id: str, item_ids: Mapping[str, str]) -> CallDetail:
    from pipeline.desk.review import read_reviews

    qa = source.rows(QA_SQL.format(db=db), {"call": call_id})
    q = qa[0] if qa else {"score_pct": None, "auto_failed": None, "metrics": {}, "q": [], "w": [], "p": [], "r": [],
                          "automatic_score_pct": None, "reviewed_by": ""}
    items = [ScorecardItem(question, float(weight), bool(passed), why, item_ids.get(question))
             for question, weight, passed, why in zip(q["q"], q["w"], q["p"], q["r"], strict=True)]
    reviews = [ReviewLine(r.item, r.automatic, r.verdict, r.reason, r.reviewer, r.reviewed_at)
               for r in read_reviews(source, db, call_id)]
    lines = [TranscriptLine(line["start_ms"] / 1000, line["end_ms"] / 1000, line["leg"], line["text"],
                            float(line.get("sentiment") or 0.0))
             for line in source.rows(TRANSCRIPT_SQL.format(db=db), {"call": call_id})]
    return CallDetail(
        score_pct=None if q["score_pct"] is None else round(float(q["score_pct"]), 2),
        auto_failed=None if q["auto_failed"] is None else bool(q["auto_failed"]),
        items=items, metrics=dict(sorted(q["metrics"].items())), transcript=lines,
        automatic_score_pct=None if q.get("automatic_score_pct") is None else round(float(q["automatic_score_pct"]), 2),
        reviewed_by=q.get("reviewed_by") or "", reviews=reviews,
    )


def render_report(
    source: RowSource, db: str, console: Console, *, call_id: str | None = None, agent_id: str | None = None,
    since: datetime | None = None,
) -> int:
    """Read and print the report; returns the number of calls shown."""
    report = read_report(source, db, call_id=call_id, agent_id=agent_id, since=since)
    print_report(report, console)
    return len(report.calls)


def print_report(report: Report, console: Console) -> None:
    """The calls table; with a call in full, its scorecard, metrics and transcript after it."""
    table = keep_whole(Table("call", "agent", "started", "ended", "audio s", "segments", "score %", "failed",
                             "customer", title="calls"), "call", "agent", "ended", "audio s", "segments", "failed",
                       "customer")
    for c in report.calls:
        score = "-" if c.score_pct is None else f"{c.score_pct:.1f}" + (" AUTO-FAIL" if c.auto_failed else "")
        table.add_row(escape(c.call_id), escape(c.agent_id), c.started_at.strftime("%Y-%m-%d %H:%M:%S"),
                      c.end_reason or "open", f"{c.audio_s:.1f}", str(c.segments), score,
                      f"{c.failed_items}/{c.items}" if c.items else "-",
                      "-" if c.customer_sentiment is None else f"{c.customer_sentiment:+.1f}")
    print_table(console, table, optional=("segments", "audio s", "ended", "customer"))
    if report.call:
        _print_call(report.call, console)


def _print_call(call: CallDetail, console: Console) -> None:
    if call.score_pct is not None:
        reviewed = (f" (reviewed by {call.reviewed_by}; automatic {call.automatic_score_pct:.1f} %)"
                    if call.automatic_score_pct is not None else "")
        items = keep_whole(Table("item", "question", "weight", "passed", "rationale",
                                 title=f"scorecard: {call.score_pct:.1f} %{escape(reviewed)}"), "item", "weight", "passed")
        for i in call.items:
            items.add_row(i.id or "–", escape(i.question), f"{i.weight:g}", "yes" if i.passed else "[red]no[/red]",
                          escape(i.rationale))
        print_table(console, items, optional=("item",))
        if call.reviews:
            reviews = keep_whole(Table("when (UTC)", "item", "machine", "reviewer's", "by", "reason",
                                       title="reviews"), "when (UTC)", "item", "machine", "reviewer's")
            for r in call.reviews:
                reviews.add_row(r.reviewed_at.strftime("%Y-%m-%d %H:%M"), r.item, r.automatic, r.verdict,
                                escape(r.reviewer), escape(r.reason))
            print_table(console, reviews)
        metrics = keep_whole(Table("metric", "value", title="conversation metrics"), "metric", "value")
        for name, value in call.metrics.items():
            metrics.add_row(escape(name), f"{value:,.2f}")
        print_table(console, metrics)
    transcript = keep_whole(Table("time", "leg", "sentiment", "text", title="transcript (redacted)"),
                            "time", "leg", "sentiment")
    for line in call.transcript:
        transcript.add_row(f"{line.start_s:6.1f}-{line.end_s:6.1f}", line.leg, f"{line.sentiment:+.1f}",
                           escape(line.text))
    print_table(console, transcript, optional=("sentiment",))
