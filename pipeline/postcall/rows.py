"""A post-call revision's rows and messages: the call's segments, QA events, QA result and calls row.

Both post-call passes write them, the worker's (from the call's job) and `callqa retranscribe` (from the
call's stored row). Every row carries the revision in its key (store migrations 5 and 6) and the time
the revision was asked for, so a pass done twice (a worker killed mid-pass, a job written twice by a
replay) writes the same rows again, which the tables' ReplacingMergeTree keeps once.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from pipeline.analyze import CallAnalysis
from pipeline.contracts.messages import CallEvent, CallQA, PostCallJob, TranscriptSegment
from pipeline.worker.outputs import call_qa_message, call_qa_row, qa_event_row, segment_row, to_datetime


@dataclass(frozen=True)
class RevisionRows:
    calls: dict[str, Any]
    call_qa: dict[str, Any]
    segments: list[dict[str, Any]]
    qa_events: list[dict[str, Any]]
    qa: CallQA  # the message for the QA topic
    transcripts: list[TranscriptSegment]  # the messages for the transcripts topic

    def in_write_order(self) -> Iterator[tuple[str, list[dict[str, Any]]]]:
        """Segments and events first, the call's QA and calls row last: a reader of the views sees the new
        revision once its calls row is there (the views pick each table's highest revision on their own)."""
        yield "segments", self.segments
        yield "qa_events", self.qa_events
        yield "call_qa", [self.call_qa]
        yield "calls", [self.calls]


def job_calls_row(job: PostCallJob) -> dict[str, Any]:
    """The live revision's calls row as the job carries it (the base of the new revision's row)."""
    return {
        "call_id": job.call_id, "tenant": job.tenant, "agent_id": job.agent_id, "queue": job.queue,
        "direction": job.direction, "legs": sorted(job.frame_counts), "started_at": to_datetime(job.started_at_ms),
        "ended_at": to_datetime(job.ended_at_ms), "end_reason": job.end_reason, "segments": 0,
        "audio_ms": job.audio_ms, "updated_at": to_datetime(job.requested_at_ms), "customer_sentiment": 0.0,
        "customer_sentiment_start": 0.0, "customer_sentiment_end": 0.0, "agent_sentiment_start": 0.0,
        "agent_sentiment_end": 0.0, "longest_monologue_ms": 0,
        "hold_ms": sum(max(0, h.end_ms - h.start_ms) for h in job.holds),
        "holds": [(max(0, h.start_ms), max(0, h.end_ms)) for h in job.holds],
        "paused_ms": sum(max(0, h.end_ms - h.start_ms) for h in job.pauses),
        "pauses": [(max(0, h.start_ms), max(0, h.end_ms)) for h in job.pauses],
        "keypad": [(t.leg, max(0, t.start_ms), max(0, t.end_ms)) for t in job.keypad], "revision": job.revision - 1,
    }


def revision_rows(stored: dict[str, Any], analysis: CallAnalysis, revision: int, model: tuple[str, int],
                  written_ms: int) -> RevisionRows:
    """The rows of the call's new revision, from its stored (or job's) calls row and the pass's analysis."""
    call_id = stored["call_id"]
    start = CallEvent(call_id, "start", tenant=stored["tenant"], agent_id=stored["agent_id"], queue=stored["queue"])
    qa = replace(call_qa_message(call_id, analysis.qa, start, stored_holds(stored), stored_holds(stored, "pauses")),
                 computed_at_ms=written_ms, revision=revision)
    calls = {k: v for k, v in stored.items() if k not in ("score_pct", "auto_failed", "questions", "passed")}
    calls.update(revision=revision, updated_at=to_datetime(written_ms), segments=len(analysis.segments),
                 customer_sentiment=qa.customer_sentiment, customer_sentiment_start=qa.customer_sentiment_start,
                 customer_sentiment_end=qa.customer_sentiment_end, agent_sentiment_start=qa.agent_sentiment_start,
                 agent_sentiment_end=qa.agent_sentiment_end, longest_monologue_ms=qa.longest_monologue_ms,
                 categories=list(analysis.qa.categories))
    transcripts = [TranscriptSegment(
        segment_id=s.segment_id, call_id=call_id, leg=s.leg, start_ms=s.start_ms, end_ms=s.end_ms, text=s.text,
        is_final=True, confidence=s.confidence, avg_logprob=s.avg_logprob, no_speech_prob=0.0, model_name=model[0],
        model_version=model[1], redactions=s.redactions, produced_at_ms=written_ms, sentiment=s.sentiment,
        revision=revision) for s in analysis.segments]
    events = [qa_event_row(call_id, e, revision, written_ms) for e in analysis.qa.events]
    return RevisionRows(calls, call_qa_row(qa), [segment_row(t) for t in transcripts], events, qa, transcripts)


def stored_holds(stored: dict[str, Any], column: str = "holds") -> list[tuple[int, int]]:
    """A calls row's hold intervals (``column`` "pauses": its secure pauses), whether the store gave them as
    tuples or (through the API) as objects."""
    return [(int(h["start_ms"]), int(h["end_ms"])) if isinstance(h, dict) else (int(h[0]), int(h[1]))
            for h in stored.get(column) or []]


def model_of(label: str) -> tuple[str, int]:
    """(name, version) of an engine's label, e.g. ``moonshine-base@2/fp32`` -> ("moonshine-base", 2)."""
    name, _, rest = label.partition("@")
    version = rest.split("/", 1)[0]
    return name, int(version) if version.isdigit() else 0
