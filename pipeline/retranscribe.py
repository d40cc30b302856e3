"""`callqa retranscribe`: the post-call pass over calls already stored, from the contact center's recordings.

For each stored call (started since ``--since``, or the ``--call`` IDs) whose recording is in the folder
(named by call ID, any format `callqa analyze` reads), the recording goes through the same analysis as
``callqa analyze`` with the accurate model (``--model``, default the ``final_model`` setting), and the
result is written as the call's next revision: its segments, its QA result and its calls row, beside
the earlier ones (store migration 5). Readers of the ``_deduped`` views (call pages, ``callqa report``,
the dashboards) show it from then on. Printed: how each call's score, auto-fail and scorecard items
changed against the revision it replaces, the A/B of a model change on real traffic.

It writes to the store ``CALLQA_CLICKHOUSE_URL`` names: a ClickHouse server, or the embedded store of a
worker that is not running (chdb admits one process per folder). Calls whose audio is only in the audio
topic are the worker's post-call pass (issue 26), not this command's.
"""

from __future__ import annotations

import asyncio
import glob
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from clickhouse_connect.driver.client import Client

from pipeline.analyze import AnalyzeOptions, CallAnalysis, analyze_file
from pipeline.asr.engine import Engine
from pipeline.contracts.messages import CallEvent, TranscriptSegment, now_ms
from pipeline.qa.call import QaConfig
from pipeline.worker.outputs import call_qa_message, call_qa_row, segment_row, to_datetime

CALLS_SQL = """
SELECT c.*, q.score_pct AS score_pct, q.auto_failed AS auto_failed, q.`items.question` AS questions,
       q.`items.passed` AS passed
FROM calls_deduped AS c
LEFT JOIN call_qa_deduped AS q ON q.call_id = c.call_id
WHERE {where}
ORDER BY c.started_at, c.call_id
"""


@dataclass(frozen=True)
class RevisionChange:
    """What the new revision of one call changed, against the revision it replaces."""

    call_id: str
    revision: int
    model: str
    segments: int
    score_before: float | None
    score_after: float
    auto_failed_before: bool | None
    auto_failed_after: bool
    items_changed: dict[str, tuple[bool | None, bool | None]] = field(default_factory=dict)  # question: before, after

    def as_json(self) -> dict[str, Any]:
        return {"call_id": self.call_id, "revision": self.revision, "model": self.model, "segments": self.segments,
                "score_before": self.score_before, "score_after": self.score_after,
                "auto_failed_before": self.auto_failed_before, "auto_failed_after": self.auto_failed_after,
                "items_changed": {q: {"before": b, "after": a} for q, (b, a) in self.items_changed.items()}}


@dataclass(frozen=True)
class Skipped:
    call_id: str
    why: str


def stored_calls(client: Client, since: datetime | None = None, call_ids: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The calls to redo: their latest calls row (every column) and its QA verdicts, oldest first."""
    where: list[str] = ["c.end_reason != ''"]  # a call still open has no result to revise
    params: dict[str, Any] = {}
    if since is not None:
        where.append("c.started_at >= {since:DateTime64(3, 'UTC')}")
        params["since"] = since.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    if call_ids:
        where.append("has({ids:Array(String)}, c.call_id)")
        params["ids"] = list(call_ids)
    result = client.query(CALLS_SQL.format(where=" AND ".join(where)), parameters=params)
    return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]


def recording_of(folder: Path, call_id: str) -> Path | None:
    """The call's recording in the folder: the file whose name, less its extension, is the call ID."""
    matches = sorted(p for p in folder.glob(f"{glob.escape(call_id)}.*") if p.is_file() and p.stem == call_id)
    return matches[0] if matches else None


def revision_rows(stored: dict[str, Any], analysis: CallAnalysis, revision: int, model: tuple[str, int],
                  written_ms: int) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """The rows of the call's new revision: calls (its stored row, with the new QA figures), call_qa, segments."""
    call_id = stored["call_id"]
    start = CallEvent(call_id, "start", tenant=stored["tenant"], agent_id=stored["agent_id"], queue=stored["queue"])
    holds = [(int(h["start_ms"]), int(h["end_ms"])) if isinstance(h, dict) else (int(h[0]), int(h[1]))
             for h in stored.get("holds") or []]
    qa = replace(call_qa_message(call_id, analysis.qa, start, holds), computed_at_ms=written_ms, revision=revision)
    calls = {k: v for k, v in stored.items() if k not in ("score_pct", "auto_failed", "questions", "passed")}
    calls.update(revision=revision, updated_at=to_datetime(written_ms), segments=len(analysis.segments),
                 customer_sentiment=qa.customer_sentiment, customer_sentiment_start=qa.customer_sentiment_start,
                 customer_sentiment_end=qa.customer_sentiment_end, agent_sentiment_start=qa.agent_sentiment_start,
                 agent_sentiment_end=qa.agent_sentiment_end, longest_monologue_ms=qa.longest_monologue_ms)
    segments = [segment_row(TranscriptSegment(
        segment_id=s.segment_id, call_id=call_id, leg=s.leg, start_ms=s.start_ms, end_ms=s.end_ms, text=s.text,
        is_final=True, confidence=s.confidence, avg_logprob=s.avg_logprob, no_speech_prob=0.0, model_name=model[0],
        model_version=model[1], redactions=s.redactions, produced_at_ms=written_ms, sentiment=s.sentiment,
        revision=revision)) for s in analysis.segments]
    return calls, call_qa_row(qa), segments


def change_of(stored: dict[str, Any], analysis: CallAnalysis, revision: int) -> RevisionChange:
    before = dict(zip(stored.get("questions") or [], (bool(p) for p in stored.get("passed") or []), strict=False))
    after = {i.question: i.passed for i in analysis.qa.items if i.passed is not None}
    changed = {q: (before.get(q), after.get(q)) for q in sorted(set(before) | set(after)) if before.get(q) != after.get(q)}
    score = stored.get("score_pct")
    failed = stored.get("auto_failed")
    return RevisionChange(stored["call_id"], revision, analysis.model, len(analysis.segments),
                          None if score is None else float(score), analysis.qa.score_pct,
                          None if failed is None else bool(failed), analysis.qa.auto_failed, changed)


def _insert(client: Client, table: str, rows: list[dict[str, Any]]) -> None:
    if rows:
        columns = list(rows[0])
        client.insert(table, [[r[c] for c in columns] for r in rows], column_names=columns)


async def retranscribe(client: Client, calls: Sequence[dict[str, Any]], recordings: Path, engine: Engine,
                       config: QaConfig, options: AnalyzeOptions | None = None
                       ) -> tuple[list[RevisionChange], list[Skipped]]:
    """Redo each call from its recording with ``engine`` and store it as its next revision."""
    name, _, rest = engine.model_label.partition("@")
    model = (name, int(rest.split("/", 1)[0]) if rest.split("/", 1)[0].isdigit() else 0)
    batcher = engine.new_batcher()
    await batcher.start()
    changes: list[RevisionChange] = []
    skipped: list[Skipped] = []
    try:
        for stored in calls:
            path = recording_of(recordings, stored["call_id"])
            if path is None:
                skipped.append(Skipped(stored["call_id"], f"no recording named {stored['call_id']}.* in {recordings}"))
                continue
            analysis = replace(await analyze_file(path, engine, batcher, config, options), call_id=stored["call_id"])
            revision = int(stored.get("revision") or 0) + 1
            calls_row, qa_row, segment_rows = revision_rows(stored, analysis, revision, model, now_ms())
            # Segments first, the call's QA and calls row last: a reader of the views sees the new revision
            # once its calls row is there (the views pick each table's highest revision on its own).
            _insert(client, "segments", segment_rows)
            _insert(client, "call_qa", [qa_row])
            _insert(client, "calls", [calls_row])
            changes.append(change_of(stored, analysis, revision))
    finally:
        await batcher.close()
    return changes, skipped


def run(client: Client, recordings: Path, engine: Engine, config: QaConfig, *, since: datetime | None = None,
        call_ids: Sequence[str] = (), options: AnalyzeOptions | None = None
        ) -> tuple[list[RevisionChange], list[Skipped]]:
    """For the CLI and tests (no event loop running)."""
    calls = stored_calls(client, since, call_ids)
    return asyncio.run(retranscribe(client, calls, recordings, engine, config, options))
