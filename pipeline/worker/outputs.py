"""Contract messages and store rows built from a call's results (pure: no ports, no clocks but ``now``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pipeline.contracts.messages import (
    CallEvent,
    CallHold,
    CallQA,
    JobCut,
    JobHold,
    JobKeypadTone,
    JobRedaction,
    LatencyMetric,
    PostCallJob,
    QaAlert,
    QaItem,
    TranscriptSegment,
    now_ms,
)
from pipeline.contracts.messages import QaEvent as QaEventMessage
from pipeline.qa.rules import QaEvent
from pipeline.qa.scorecard import CallQaResult
from pipeline.qa.sentiment import score_text
from pipeline.worker.legs import LegState
from pipeline.worker.ports import Transcription
from pipeline.worker.state import CallState


def to_datetime(ms: int) -> datetime:
    """Epoch milliseconds as the aware UTC datetime the store's DateTime64 columns take."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


# ---- messages --------------------------------------------------------------------------------------
def transcript_message(call_id: str, leg: LegState, segment_id: str, start_ms: int, end_ms: int, text: str,
                       r: Transcription, is_final: bool, redactions: int, closed_ms: int,
                       produced_ms: int, sentiment: float | None = None) -> TranscriptSegment:
    """The TranscriptSegment of a final or partial result (a partial has no closing time, nor sentiment).

    ``sentiment``: the analyzer's score of the final (``AnalyzedSegment.sentiment``); scored here from the
    same redacted ``text`` when not given, which gives the same value.
    """
    if not is_final:
        sentiment = 0.0
    elif sentiment is None:
        sentiment = score_text(text)
    return TranscriptSegment(
        segment_id=segment_id, call_id=call_id, leg=leg.leg,  # type: ignore[arg-type]
        start_ms=start_ms, end_ms=end_ms, text=text, is_final=is_final, confidence=r.confidence,
        avg_logprob=r.avg_logprob, no_speech_prob=r.no_speech_prob, model_name=r.model_name,
        model_version=r.model_version, redactions=redactions,
        first_frame_produced_at_ms=leg.produced_at(start_ms + 1), segment_closed_at_ms=closed_ms,
        batch_size=r.batch_size, batcher_wait_ms=r.batcher_wait_ms, inference_ms=r.inference_ms,
        produced_at_ms=produced_ms, sentiment=sentiment,
    )


def latency_message(call_id: str, leg: str, segment_id: str, r: Transcription, consumed_ms: int,
                    last_frame_ms: int, produced_ms: int, worker_id: str) -> LatencyMetric:
    """A final segment's timings: from its last frame's production to consumption and to its transcript."""
    return LatencyMetric(
        segment_id=segment_id, call_id=call_id, leg=leg, is_final=True,  # type: ignore[arg-type]
        frame_to_consume_ms=float(max(0, consumed_ms - last_frame_ms)),
        batcher_wait_ms=r.batcher_wait_ms, batch_size=r.batch_size, inference_ms=r.inference_ms,
        end_to_end_ms=float(max(0, produced_ms - last_frame_ms)), worker_id=worker_id,
        measured_at_ms=produced_ms,
    )


def qa_alert(call_id: str, e: QaEvent) -> QaAlert:
    return QaAlert(call_id, e.rule, e.category, e.leg, e.kind, e.offset_ms, e.text, e.severity)


def event_message(e: QaEvent) -> QaEventMessage:
    return QaEventMessage(e.rule, e.category, e.leg, e.kind, e.offset_ms, e.text, e.severity)


def call_qa_message(call_id: str, result: CallQaResult, start: CallEvent | None,
                    holds: Sequence[tuple[int, int]] = (), pauses: Sequence[tuple[int, int]] = ()) -> CallQA:
    """The call's scorecard result; ``start``: the start (else end) event, for tenant and agent; ``holds``,
    ``pauses``: the call's hold and secure pause intervals on its clock (``CallState.hold_intervals``,
    ``pause_intervals``, as the QA measured them)."""
    customer = result.sentiment.leg("customer") if result.sentiment else None
    agent = result.sentiment.leg("agent") if result.sentiment else None
    return CallQA(
        call_id=call_id, score_pct=result.score_pct, auto_failed=result.auto_failed,
        metrics={k: float(v) for k, v in result.metrics.items()},
        # An item whose metric the call lacks (passed None) is not applicable: it is not scored.
        items=[QaItem(i.question, float(i.weight), bool(i.passed), i.rationale, bool(i.auto_fail))
               for i in result.items if i.passed is not None],
        events=[event_message(e) for e in result.events],
        tenant=start.tenant if start else "", agent_id=start.agent_id if start else "",
        scorecard=result.scorecard,
        customer_sentiment=customer.overall if customer else 0.0,
        customer_sentiment_start=customer.start if customer else 0.0,
        customer_sentiment_end=customer.end if customer else 0.0,
        agent_sentiment_start=agent.start if agent else 0.0,
        agent_sentiment_end=agent.end if agent else 0.0,
        longest_monologue_ms=int(result.metrics.get("longest_monologue_ms", 0)),
        hold_ms=int(result.metrics.get("hold_ms", 0)),
        holds=[CallHold(int(a), int(b)) for a, b in holds],
        paused_ms=int(result.metrics.get("paused_ms", 0)),
        pauses=[CallHold(int(a), int(b)) for a, b in pauses],
    )


def post_call_job(call: CallState, qa: CallQA, start: CallEvent | None, how: str, audio_ms: int, ended_ms: int,
                  model: str, audio_end_offset: int, read_margin_s: float) -> PostCallJob:
    """The finished call's job (its recording, and the post-call pass with ``model``): where its audio is, what
    its recording cuts, and its calls row's fields."""
    assert call.audio_tp is not None
    # Its first frame seen here; a call resumed from a checkpoint knows only its start event's time.
    first_ms = min((t for t in (call.first_frame_produced_ms, call.started_at_ms) if t > 0), default=0)
    return PostCallJob(
        call_id=call.call_id, revision=qa.revision + 1, model=model, audio_topic=call.audio_tp[0],
        audio_partition=call.audio_tp[1], audio_from_ms=max(0, first_ms - int(read_margin_s * 1000)),
        audio_end_offset=audio_end_offset,
        frame_counts={leg.leg: leg.frames_released for leg in call.legs.values()},
        tenant=qa.tenant, agent_id=qa.agent_id, queue=start.queue if start else "",
        direction=start.direction if start else "inbound", started_at_ms=call.started_at_ms, ended_at_ms=ended_ms,
        end_reason=how, audio_ms=audio_ms, holds=[JobHold(h.start_ms, h.end_ms) for h in qa.holds],
        pauses=[JobHold(h.start_ms, h.end_ms) for h in qa.pauses],
        live_score_pct=qa.score_pct, live_auto_failed=qa.auto_failed, requested_at_ms=ended_ms,
        redacted=[] if call.analyzer is None else [
            JobRedaction(t.leg, t.start_ms, t.end_ms, t.digits_kept, [JobCut(a, b, kind) for a, b, kind in t.cuts])
            for t in call.analyzer.redacted_turns],
        keypad=[JobKeypadTone(leg, a, b) for leg, a, b in keypad_tones(call)],
    )


def keypad_tones(call: CallState) -> list[tuple[str, int, int]]:
    """The call's keypad tones, (leg, start_ms, end_ms) on its clock in time order (its legs' front ends
    silenced them): when, never which key."""
    tones = [(leg.leg, t.start_ms, t.end_ms) for leg in call.legs.values() for t in leg.front_end.keypad_tones]
    return sorted(tones, key=lambda t: (t[1], t[0]))


# ---- rows ------------------------------------------------------------------------------------------
def call_row(call: CallState, qa: CallQA, start: CallEvent | None, how: str, audio_ms: int,
             ended_ms: int, categories: Sequence[str] = ()) -> dict[str, Any]:
    return {
        "call_id": call.call_id, "tenant": qa.tenant, "agent_id": qa.agent_id,
        "queue": start.queue if start else "", "direction": start.direction if start else "inbound",
        "legs": sorted(call.legs), "started_at": to_datetime(call.started_at_ms), "ended_at": to_datetime(ended_ms),
        "end_reason": how, "segments": call.segments_done, "audio_ms": audio_ms, "updated_at": to_datetime(ended_ms),
        "customer_sentiment": qa.customer_sentiment, "customer_sentiment_start": qa.customer_sentiment_start,
        "customer_sentiment_end": qa.customer_sentiment_end, "agent_sentiment_start": qa.agent_sentiment_start,
        "agent_sentiment_end": qa.agent_sentiment_end, "longest_monologue_ms": qa.longest_monologue_ms,
        "hold_ms": qa.hold_ms,
        # UInt32 columns: a hold's times are on the call's clock, never before its start.
        "holds": [(max(0, h.start_ms), max(0, h.end_ms)) for h in qa.holds],
        "paused_ms": qa.paused_ms, "pauses": [(max(0, h.start_ms), max(0, h.end_ms)) for h in qa.pauses],
        "keypad": keypad_tones(call),
        "revision": qa.revision, "categories": list(categories),
    }


def segment_row(t: TranscriptSegment) -> dict[str, Any]:
    return {
        "segment_id": t.segment_id, "call_id": t.call_id, "leg": t.leg, "start_ms": t.start_ms,
        "end_ms": t.end_ms, "text": t.text, "confidence": t.confidence, "avg_logprob": t.avg_logprob,
        "no_speech_prob": t.no_speech_prob, "is_final": int(t.is_final), "model_name": t.model_name,
        "model_version": t.model_version, "redactions": t.redactions, "produced_at": to_datetime(t.produced_at_ms),
        "sentiment": t.sentiment, "revision": t.revision,
    }


def latency_row(m: LatencyMetric) -> dict[str, Any]:
    return {
        "segment_id": m.segment_id, "call_id": m.call_id, "leg": m.leg, "batch_size": m.batch_size,
        "batcher_wait_ms": m.batcher_wait_ms, "inference_ms": m.inference_ms,
        "frame_to_consume_ms": m.frame_to_consume_ms, "end_to_end_ms": m.end_to_end_ms,
        "worker_id": m.worker_id, "measured_at": to_datetime(m.measured_at_ms),
    }


def call_qa_row(qa: CallQA) -> dict[str, Any]:
    return {
        "call_id": qa.call_id, "tenant": qa.tenant, "agent_id": qa.agent_id, "score_pct": qa.score_pct,
        "auto_failed": int(qa.auto_failed), "metrics": qa.metrics,
        "items.question": [i.question for i in qa.items], "items.weight": [i.weight for i in qa.items],
        "items.passed": [int(i.passed) for i in qa.items], "items.rationale": [i.rationale for i in qa.items],
        "computed_at": to_datetime(qa.computed_at_ms), "revision": qa.revision,
    }


def qa_event_row(call_id: str, e: QaEvent, revision: int = 0, detected_ms: int | None = None) -> dict[str, Any]:
    return {
        "call_id": call_id, "rule": e.rule, "category": e.category, "leg": e.leg, "kind": e.kind,
        "offset_ms": max(0, e.offset_ms), "text": e.text, "severity": e.severity,
        "detected_at": to_datetime(now_ms() if detected_ms is None else detected_ms), "revision": revision,
    }
