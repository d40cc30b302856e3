"""Early decoding: a leg's open segment is transcribed before its endpoint, while the batcher is idle.

A segment closes after ``endpoint_silence_ms`` of silence (400 ms), but its audio ends at the last speech
plus ``post_roll_ms`` (150 ms): from then on, the segment it will be if no speech resumes is known sample
for sample (``Segmenter.provisional_end``). Decoding it then, instead of at the endpoint, takes about
the endpoint's remaining 250 ms off the final's latency. Decoding is deterministic and independent of
the batch, so the early text is the text the closed segment would get; when speech resumes first, or
the segment is cut another way, the early decode is dropped (cancelled if its batch has not run).

Only while the batcher has nothing queued or running: spare capacity is spent, and a final waiting for
inference is never delayed by a guess. At most one early decode per leg is in flight; its audio is a
copy of the open segment's, which the leg holds anyway, so it is not charged to the in-flight budget.

On by default where batches decode in child processes (``early_decode`` unset, ``early_decode_enabled``): in the
worker's own threads the early decodes held the event loop's GIL and the worker fell behind its input in
three of six runs at four calls; off the GIL it took the capacity on 2 cores from 6 to 9 calls
at P99 <= 1.5 s (pipeline/config/worker.py has the figures).
"""

from __future__ import annotations

import asyncio
import logging

from pipeline.asr.batcher import inference_processes
from pipeline.config import Settings
from pipeline.segmentation.segmenter import SAMPLES_PER_MS, SpeechSegment
from pipeline.worker.legs import EarlyDecode, LegState
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.ports import SegmentTranscriber, Transcription

log = logging.getLogger("callqa.worker")


def early_decode_enabled(settings: Settings) -> bool:
    """``early_decode``, or unset: whether batches decode in child processes (off the event loop's GIL)."""
    if settings.early_decode is not None:
        return settings.early_decode
    return inference_processes(settings.inference_processes) > 0


class EarlyDecoder:
    """Starts, hands over and drops the early decodes of legs (``LegState.early``)."""

    def __init__(
        self, transcriber: SegmentTranscriber, metrics: WorkerMetrics, enabled: bool, with_context: bool = False
    ) -> None:
        self.transcriber = transcriber
        self.metrics = metrics
        self.enabled = enabled
        self.with_context = with_context  # decode after the leg's previous text (AsrSettings.context_tokens)

    def update(self, leg: LegState) -> None:
        """After a leg took audio: drop an early decode its segment outgrew; start one when due and idle."""
        if not self.enabled:
            return
        segmenter = leg.front_end.segmenter
        key = segmenter.provisional_end()
        current = leg.early
        if current is not None and (current.start_sample, current.end_sample) == key:
            return
        if current is not None:
            self._drop(leg, "overtaken")  # speech resumed (or the segment was cut): not this segment
        if key is None or not self.transcriber.idle:
            return
        audio = segmenter.provisional_audio(*key)
        context = self._context(leg, key[0])
        task = asyncio.create_task(self.transcriber.transcribe(audio, context), name="early-decode")
        task.add_done_callback(_retrieve)
        leg.early = EarlyDecode(key[0], key[1], task, context)
        self.metrics.early_decodes.labels("started").inc()

    def take(self, leg: LegState, seg: SpeechSegment) -> asyncio.Task[Transcription] | None:
        """The early decode of ``seg`` if one ran for exactly its samples (then the leg's is cleared)."""
        current = leg.early
        if current is None:
            return None
        if (current.start_sample, current.end_sample) != (seg.start_sample, seg.end_sample) or (
            current.context != self._context(leg, seg.start_sample)  # a final came in since: other context
        ):
            self._drop(leg, "overtaken")
            return None
        leg.early = None
        self.metrics.early_decodes.labels("used").inc()
        return current.task

    def _context(self, leg: LegState, start_sample: int) -> tuple[int, ...]:
        if not self.with_context:
            return ()
        return leg.context.for_segment(start_sample // SAMPLES_PER_MS)

    def _drop(self, leg: LegState, outcome: str) -> None:
        assert leg.early is not None
        leg.early.task.cancel()  # skipped by the batcher if its batch has not run yet
        leg.early = None
        self.metrics.early_decodes.labels(outcome).inc()


def _retrieve(task: asyncio.Task[Transcription]) -> None:
    """A dropped early decode's failure matters to no one; one that is used is awaited and raises there."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("early decode failed: %s", task.exception())
