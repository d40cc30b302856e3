"""Transcription scheduling: closed segments go to the shared batcher under the in-flight audio budget,
one call task each; open segments get early decodes and partial transcripts.

The budget is back-pressure: ``submit`` waits while too much audio is in flight, so the agent stops
taking frames and Kafka fetching pauses. A segment's budget is held until its rows are in the sink's
buffer: while ClickHouse is down the sink's write() waits, so does the segment, and so does the intake.
A decoded segment goes to the ``ReleaseGate``; silence and failed segments are skipped there (a failed
one is dead-lettered first). The transcriber dying is no segment's fault: the call fails, the worker
exits, and a restart replays the call.
"""

from __future__ import annotations

import asyncio
import logging

from pipeline.config import Settings
from pipeline.contracts.messages import now_ms
from pipeline.store.base import RowSink
from pipeline.worker.budget import InflightBudget
from pipeline.worker.call_outputs import CallOutputs
from pipeline.worker.dead_letters import describe_error
from pipeline.worker.early import EarlyDecoder, early_decode_enabled
from pipeline.worker.legs import LegState
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.partials import PartialTranscripts, take_partial
from pipeline.worker.ports import OutputPort, SegmentTranscriber, TranscriberDeadError, Transcription
from pipeline.worker.release import ReleaseGate
from pipeline.worker.segmentation import ClosedSegment
from pipeline.worker.state import CallState
from pipeline.worker.tasks import CallTasks

log = logging.getLogger("callqa.worker")


class TranscriptionScheduler:
    """Submits closed segments for transcription and hands their results on; starts early decodes and
    partials of open segments."""

    def __init__(self, settings: Settings, transcriber: SegmentTranscriber, budget: InflightBudget,
                 gate: ReleaseGate, outputs: CallOutputs, tasks: CallTasks, metrics: WorkerMetrics) -> None:
        self.settings = settings
        self.transcriber = transcriber
        self.budget = budget
        self.gate = gate
        self.outputs = outputs
        self.tasks = tasks
        self.metrics = metrics
        output: OutputPort = outputs.output
        sink: RowSink = outputs.sink
        self.partials = PartialTranscripts(settings, transcriber, budget, output, sink, metrics)
        self.early = EarlyDecoder(transcriber, metrics, early_decode_enabled(settings), settings.context_tokens > 0)

    async def submit(self, closed: ClosedSegment, consumed_ms: int) -> None:
        """Schedule a closed segment's transcription once the budget has room for its audio."""
        leg, seg = closed.leg, closed.seg
        nbytes = seg.audio.nbytes
        early = self.early.take(leg, seg)  # now: the leg's next update would drop it
        # Taken at submit: the leg's finals known by now (one still decoding is not waited for).
        context = leg.context.for_segment(seg.start_ms) if self.settings.context_tokens > 0 else ()
        await self.budget.acquire(nbytes)  # back-pressure: the agent waits, Kafka fetching pauses
        self.tasks.spawn(closed.call, self._transcribe(closed, consumed_ms, nbytes, early, context), "segment")

    def after_audio(self, call: CallState, leg: LegState) -> None:
        """After a leg took audio: its early decode follows the open segment; a partial when one is due."""
        self.early.update(leg)
        if self.settings.partial_interval_ms > 0:
            due = take_partial(leg, self.settings.partial_interval_ms)
            if due is not None:
                self.tasks.spawn(call, self.partials.transcribe(call, leg, *due), "partial")

    async def _transcribe(self, closed: ClosedSegment, consumed_ms: int, nbytes: int,
                          early: asyncio.Task[Transcription] | None, context: tuple[int, ...]) -> None:
        closed_ms = now_ms()
        call, leg, seg = closed.call, closed.leg, closed.seg
        seg_id = closed.segment_id
        try:
            try:
                # The early decode ran on exactly these samples: the same text, sooner.
                result = await (early if early is not None else self.transcriber.transcribe(seg.audio, context))
            except TranscriberDeadError:
                raise  # not this segment's fault: the call fails, the worker exits, a restart replays it
            except Exception as exc:  # noqa: BLE001 - one failed segment must not stop the call
                self.metrics.segment_failures.inc()
                log.warning("segment %s failed: %s", seg_id, describe_error(exc))
                await self.outputs.segment_failed(call, leg, seg, seg_id, exc)
                await self.gate.skip(call, seg_id)
                return
            leg.context.update(result, seg.end_ms)
            if result.is_silence or not result.text.strip():
                self.metrics.segments.labels("silence").inc()
                await self.gate.skip(call, seg_id)
                return
            await self.gate.complete(call, seg_id, (leg, seg.start_ms, seg.end_ms, result, consumed_ms, closed_ms),
                                     result.text.strip())
        finally:
            await self.budget.release(nbytes)
