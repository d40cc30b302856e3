"""Leg audio and segmentation: the audio each leg got goes through its VAD segmenter, all legs of a batch
in one batched VAD run, and the segments that closed are announced to their calls' analyzers. A leg's
long gap (``Silence``, a hold) is skipped by its segmenter between two such runs, by its length.

Announcing happens here, before anything awaits: once a leg's segmenter has moved past a segment, a
later segment may be released only after it is known (pipeline/qa/call.py orders releases by it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.segmentation.segmenter import Silence, SpeechSegment, accept_many
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
        fed = [audio for audio in legs if audio.chunks]
        self.metrics.leg_audio_seconds.inc(sum(
            (c.samples if isinstance(c, Silence) else c.size) / audio.leg.front_end.segmenter.input_rate
            for audio in fed for c in audio.chunks))
        closed: list[list[SpeechSegment]] = [[] for _ in fed]
        rest = [list(audio.chunks) for audio in fed]
        while any(rest):
            # Each leg's samples up to its next Silence, in one VAD run; then those silences skipped.
            batch = [(k, _samples_until_silence(todo)) for k, todo in enumerate(rest) if todo and
                     not isinstance(todo[0], Silence)]
            ran = accept_many([fed[k].leg.front_end.segmenter for k, _ in batch], [x for _, x in batch])
            for (k, _), segs in zip(batch, ran, strict=True):
                closed[k] += segs
            for k, todo in enumerate(rest):
                if todo and isinstance(silence := todo[0], Silence):
                    del todo[0]
                    closed[k] += fed[k].leg.front_end.segmenter.skip_zeros(silence.samples)
        segments = [ClosedSegment(audio.call, audio.leg, seg)
                    for audio, segs in zip(fed, closed, strict=True) for seg in segs]
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


def _samples_until_silence(chunks: list[np.ndarray | Silence]) -> np.ndarray:
    """The samples ``chunks`` start with, up to its first Silence, taken out of it."""
    count = next((i for i, c in enumerate(chunks) if isinstance(c, Silence)), len(chunks))
    samples = [c for c in chunks[:count] if not isinstance(c, Silence)]
    del chunks[:count]
    return np.concatenate(samples)


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
