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
from pipeline.contracts.messages import now_ms
from pipeline.postcall.rows import model_of, revision_rows
from pipeline.qa.call import QaConfig

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
    model = model_of(engine.model_label)
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
            for table, rows in revision_rows(stored, analysis, revision, model, now_ms()).in_write_order():
                _insert(client, table, rows)
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
