"""`callqa retranscribe`: the post-call pass over calls already stored, from the contact center's
recordings or from the audio topic.

For each stored call (started since ``--since``, or the ``--call`` IDs) whose recording is in the folder
(named by call ID, any format `callqa analyze` reads) or, with ``--audio-topic``, whose frames the audio
topic still holds, the audio goes through the same analysis as ``callqa analyze`` with the accurate model
(``--model``, default the ``final_model`` setting), and the result is written as the call's next
revision: its segments, QA events, QA result and calls row, beside the earlier ones (store migrations 5, 6). Readers of the ``_deduped`` views (call pages, ``callqa report``,
the dashboards) show it from then on. Printed: how each call's score, auto-fail and scorecard items
changed against the revision it replaces, the A/B of a model change on real traffic.

It writes to the store ``CALLQA_CLICKHOUSE_URL`` names: a ClickHouse server, or the embedded store of a
worker that is not running (chdb admits one process per folder). A worker with ``CALLQA_FINAL_MODEL`` set
runs the same pass on every call as it finishes (pipeline/postcall); this command redoes stored calls
(another model, rules changed since, calls from before the setting).
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
from confluent_kafka import Consumer, TopicPartition

from pipeline.analyze import AnalyzeOptions, CallAnalysis, analyze_file
from pipeline.asr.batcher import SegmentBatcher
from pipeline.asr.engine import Engine
from pipeline.asr.results import TranscriptResult
from pipeline.broker.security import kafka_config
from pipeline.config import Settings
from pipeline.contracts.messages import AudioFrame, JobHold, PostCallJob, now_ms
from pipeline.contracts.serde import Serde
from pipeline.postcall.audio import assemble, partition_span, read_keyed_frames
from pipeline.postcall.final_pass import Decode, transcribe_call
from pipeline.postcall.rows import model_of, revision_rows, stored_holds
from pipeline.qa.call import QaConfig
from pipeline.segmentation import SpeechSegment

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


class RecordingsFolder:
    """Calls' audio from the contact center's recordings: one file per call, named by call ID."""

    def __init__(self, folder: Path, options: AnalyzeOptions | None = None) -> None:
        self.folder = folder
        self.options = options

    async def analysis(self, stored: dict[str, Any], engine: Engine, batcher: SegmentBatcher,
                       config: QaConfig) -> CallAnalysis | str:
        path = recording_of(self.folder, stored["call_id"])
        if path is None:
            return f"no recording named {stored['call_id']}.* in {self.folder}"
        return replace(await analyze_file(path, engine, batcher, config, self.options), call_id=stored["call_id"])


class AudioTopic:
    """Calls' audio from the audio topic, while it keeps it (``audio_retention_ms``, 6 h): the call's frames
    between its start and its end (plus a margin) on whichever partition holds them. The call's partition
    is not stored, so up to every partition's span of that time is read: a batch tool's cost."""

    def __init__(self, settings: Settings, serde: Serde) -> None:
        self.settings = settings
        self.serde = serde
        self.config = kafka_config(settings)

    async def analysis(self, stored: dict[str, Any], engine: Engine, batcher: SegmentBatcher,
                       config: QaConfig) -> CallAnalysis | str:
        call_id, topic = stored["call_id"], self.settings.topic_audio
        margin_ms = int(self.settings.final_pass_read_margin_s * 1000)
        from_ms, to_ms = _epoch_ms(stored["started_at"]) - margin_ms, _epoch_ms(stored["ended_at"]) + margin_ms
        for partition in await asyncio.to_thread(self._partitions):
            tp = TopicPartition(topic, partition)
            begin, end = await asyncio.to_thread(partition_span, self.config, tp, from_ms, to_ms)
            if begin >= end:
                continue
            frames, _ = await asyncio.to_thread(read_keyed_frames, self.config, self.serde, call_id, tp, from_ms, end)
            if frames:
                job = _job_of(stored, frames, engine.model_label, tp, from_ms, end)
                outcome = await transcribe_call(job, assemble(job, frames), engine, engine.model_label,
                                                _recognizer_decode(engine), config)
                return outcome.analysis
        return f"no frame of it on {topic} between its start and end (kept {self.settings.audio_retention_ms / 3_600_000:g} h)"

    def _partitions(self) -> list[int]:
        consumer = Consumer({**self.config, "group.id": "callqa-retranscribe"})
        try:
            topic = consumer.list_topics(self.settings.topic_audio, timeout=10.0).topics[self.settings.topic_audio]
            return sorted(topic.partitions)
        finally:
            consumer.close()


def _epoch_ms(value: datetime) -> int:
    return int((value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp() * 1000)


def _job_of(stored: dict[str, Any], frames: list[AudioFrame], model: str, tp: TopicPartition, from_ms: int,
            end: int) -> PostCallJob:
    """The post-call job the stored call would have had: its frames per leg as found on the topic."""
    counts: dict[str, int] = {}
    for f in frames:
        counts[f.leg] = max(counts.get(f.leg, 0), f.seq + 1)
    holds = [JobHold(start, end) for start, end in stored_holds(stored)]
    pauses = [JobHold(start, end) for start, end in stored_holds(stored, "pauses")]
    return PostCallJob(call_id=stored["call_id"], revision=int(stored.get("revision") or 0) + 1, model=model,
                       audio_topic=tp.topic, audio_partition=tp.partition, audio_from_ms=from_ms, audio_end_offset=end,
                       frame_counts=counts, audio_ms=int(stored.get("audio_ms") or 0), holds=holds, pauses=pauses)


def _recognizer_decode(engine: Engine) -> Decode:
    async def decode(segments: Sequence[SpeechSegment]) -> list[TranscriptResult | Exception]:
        return await asyncio.to_thread(engine.recognizer.recognize, list(segments))

    return decode


AudioSource = RecordingsFolder | AudioTopic


async def retranscribe(client: Client, calls: Sequence[dict[str, Any]], source: AudioSource, engine: Engine,
                       config: QaConfig) -> tuple[list[RevisionChange], list[Skipped]]:
    """Redo each call from ``source`` with ``engine`` and store it as its next revision."""
    model = model_of(engine.model_label)
    batcher = engine.new_batcher()
    await batcher.start()
    changes: list[RevisionChange] = []
    skipped: list[Skipped] = []
    try:
        for stored in calls:
            analysis = await source.analysis(stored, engine, batcher, config)
            if isinstance(analysis, str):
                skipped.append(Skipped(stored["call_id"], analysis))
                continue
            revision = int(stored.get("revision") or 0) + 1
            for table, rows in revision_rows(stored, analysis, revision, model, now_ms()).in_write_order():
                _insert(client, table, rows)
            changes.append(change_of(stored, analysis, revision))
    finally:
        await batcher.close()
    return changes, skipped


def run(client: Client, source: Path | AudioSource, engine: Engine, config: QaConfig, *,
        since: datetime | None = None, call_ids: Sequence[str] = (), options: AnalyzeOptions | None = None
        ) -> tuple[list[RevisionChange], list[Skipped]]:
    """For the CLI and tests (no event loop running); a Path is a recordings folder."""
    calls = stored_calls(client, since, call_ids)
    audio = RecordingsFolder(source, options) if isinstance(source, Path) else source
    return asyncio.run(retranscribe(client, calls, audio, engine, config))
