"""Partial transcripts: the open segment of a leg transcribed again each time it has grown by the
partial interval, a preview that carries its final's segment id (the final supersedes it).

Partials are bounded under load, so they never slow the finals: one in flight per leg; none taken while
the in-flight audio budget has finals waiting or no room (``InflightBudget.try_acquire``: a partial never
waits for budget); in the batcher they give way to finals and are dropped when stale
(``SegmentBatcher``'s previews). ``callqa_partials_total{outcome}`` counts what became of each."""

from __future__ import annotations

import logging

import numpy as np

from pipeline.asr.batcher import PreviewDroppedError
from pipeline.config import Settings
from pipeline.contracts.messages import now_ms
from pipeline.qa.segment import Segment
from pipeline.store.base import RowSink
from pipeline.worker.budget import InflightBudget
from pipeline.worker.dead_letters import describe_error
from pipeline.worker.legs import LegState
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.outputs import segment_row, transcript_message
from pipeline.worker.ports import OutputPort, SegmentTranscriber
from pipeline.worker.state import CallState, publish, segment_id, watermarks

log = logging.getLogger("callqa.worker")


def take_partial(leg: LegState, interval_ms: int) -> tuple[int, np.ndarray] | None:
    """The open segment's start and a copy of its audio when a partial of it is due, marking it in flight
    (one at a time per leg, so partials never pile up in the batcher); None when none is due."""
    segmenter = leg.front_end.segmenter
    start, length_ms = segmenter.open_segment_start_ms, segmenter.open_segment_ms  # the lead is not timed
    if start is None or length_ms is None or leg.partial_inflight:
        return None
    grown = length_ms - (leg.partial_len_ms if leg.partial_start_ms == start else 0)
    if grown < interval_ms:
        return None
    audio = segmenter.open_segment_audio()  # a copy, taken only when a partial is due
    assert audio is not None
    leg.partial_start_ms, leg.partial_len_ms, leg.partial_inflight = start, length_ms, True
    return start, audio


class PartialTranscripts:
    """Transcribes a taken partial and publishes it (transcripts topic and segments table)."""

    def __init__(self, settings: Settings, transcriber: SegmentTranscriber, budget: InflightBudget,
                 output: OutputPort, sink: RowSink, metrics: WorkerMetrics) -> None:
        self.settings = settings
        self.transcriber = transcriber
        self.budget = budget
        self.output = output
        self.sink = sink
        self.metrics = metrics

    async def transcribe(self, call: CallState, leg: LegState, start_ms: int, audio: np.ndarray) -> None:
        outcomes = self.metrics.partials
        end_ms = start_ms + leg.partial_len_ms  # what take_partial took (the audio's lead is before start_ms)
        try:
            give_way = self.settings.partials_yield
            if not give_way:
                await self.budget.acquire(audio.nbytes)
            elif not self.budget.try_acquire(audio.nbytes):  # finals wait for budget, or it is full: skip
                outcomes.labels("skipped").inc()
                return
            try:
                context = leg.context.for_segment(start_ms) if self.settings.context_tokens > 0 else ()
                r = await self.transcriber.transcribe(audio, context, preview=give_way)
            finally:
                await self.budget.release(audio.nbytes)
        except PreviewDroppedError:
            outcomes.labels("dropped").inc()
            return
        except Exception as exc:  # noqa: BLE001 - a partial is a preview: the final will be tried again
            outcomes.labels("failed").inc()
            log.info("partial of %s/%s failed: %s", call.call_id, leg.leg, describe_error(exc))
            return
        finally:
            leg.partial_inflight = False
        # Closed meanwhile: its final is on its way and supersedes this partial.
        if leg.front_end.segmenter.open_segment_start_ms != start_ms or r.is_silence or not r.text.strip():
            outcomes.labels("superseded").inc()
            return
        assert call.analyzer is not None
        redacted = call.analyzer.redact_partial(
            Segment(call.call_id, leg.leg, segment_id(call.call_id, leg.leg, start_ms), start_ms, end_ms,  # type: ignore[arg-type]
                    r.text.strip()),
            watermarks(call, self.settings.pre_roll_ms, self.settings.held_final_max_ms),
        )
        produced = now_ms()
        partial = transcript_message(call.call_id, leg, redacted.segment.segment_id, start_ms, end_ms,
                                     redacted.text, r, False, sum(redacted.counts.values()), 0, produced)
        await publish(self.output, call, self.settings.topic_transcripts, call.call_id, partial)
        await self.sink.write("segments", [segment_row(partial)])
        self.metrics.segments.labels("partial").inc()
        outcomes.labels("published").inc()
        captured = leg.produced_at(end_ms)
        if captured:
            self.metrics.partial_delay.observe(max(0, produced - captured) / 1000)
