"""Leg audio and segmentation: the audio each leg got goes through its VAD segmenter, all legs of a batch
in one batched VAD run, and the segments that closed are announced to their calls' analyzers.

Announcing happens here, before anything awaits: once a leg's segmenter has moved past a segment, a
later segment may be released only after it is known (pipeline/qa/call.py orders releases by it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.segmentation.segmenter import SpeechSegment, accept_many
from pipeline.worker.intake import LegAudio, ReorderTally
from pipeline.worker.legs import LegState
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.state import CallState, segment_id


@dataclass(frozen=True, slots=True)
class ClosedSegment:
    """A segment a leg's segmenter closed, with its call and leg: what transcription is scheduled for."""

    call: CallState
    leg: LegState
    seg: SpeechSegment

    @property
    def segment_id(self) -> str:
        return segment_id(self.call.call_id, self.leg.leg, self.seg.start_ms)


class LegSegmentation:
    """Feeds legs' audio to their segmenters and announces the segments that closed."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self.metrics = metrics

    def segment(self, legs: Sequence[LegAudio]) -> list[ClosedSegment]:
        """The segments the legs' new audio closed, announced, in leg order."""
        fed = [(audio, np.concatenate(audio.chunks)) for audio in legs if audio.chunks]
        self.metrics.leg_audio_seconds.inc(sum(samples.size for _, samples in fed) / 16000)
        closed = accept_many([audio.leg.front_end.segmenter for audio, _ in fed], [samples for _, samples in fed])
        segments = [ClosedSegment(audio.call, audio.leg, seg)
                    for (audio, _), segs in zip(fed, closed, strict=True) for seg in segs]
        announce(segments)
        return segments

    def flush(self, call: CallState) -> list[ClosedSegment]:
        """End of the call: every leg releases what its jitter buffer holds (gaps filled up to the frame
        count its end event announced) and closes its open segment; those segments, announced."""
        counts = call.end.frame_counts if call.end else {}
        segments: list[ClosedSegment] = []
        for leg in call.legs.values():
            tally = ReorderTally.of(leg)
            segments += [ClosedSegment(call, leg, seg) for seg in leg.finish(counts.get(leg.leg))]
            tally.count_since(leg, self.metrics)
        announce(segments)
        return segments


def announce(segments: Sequence[ClosedSegment]) -> None:
    """Tell each call's analyzer about its newly closed segments; each stays unresolved until emitted or
    skipped (a checkpoint snapshot taken after it waits for it)."""
    for closed in segments:
        call = closed.call
        assert call.analyzer is not None
        seg_id = closed.segment_id
        call.analyzer.expect(closed.leg.leg, seg_id, closed.seg.start_ms)
        call.announced.setdefault(closed.leg.leg, []).append(seg_id)
        call.unresolved.add(seg_id)
