"""Call lifecycle: start and end events, closing calls, and completing them.

Hold and resume events keep a call open through a hold (no frames come while it is held) and measure
its hold time; pause and unpause events do the same for a secure pause, kept apart from holds. A call closes on its end event once all the frames it announced came; without them, once
the audio partition's stream time has passed the end event plus a grace and, with nothing left to read
there, ``CALLQA_END_WAIT_MAX_S`` of wall time after the event (frames still in flight: clock.py); such a
close is logged and counted (``callqa_calls_closed_incomplete_total``). An abort closes it at once, a
stretch of stream time without audio too (clock.py). Closing flushes its legs and submits their last
segments; completing waits for all its tasks, emits what the analyzer still holds, publishes the call's
QA and hands it to the registry to await release (durability.py). The timer also releases finals held
for a leg that sends nothing while the whole call is quiet (release.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from pipeline.config import Settings
from pipeline.contracts.messages import CallEvent, now_ms
from pipeline.worker.call_outputs import CallOutputs
from pipeline.worker.clock import StreamClock, close_reason
from pipeline.worker.offsets import OffsetTracker, TopicPartition
from pipeline.worker.registry import CallRegistry
from pipeline.worker.release import ReleaseGate
from pipeline.worker.segmentation import LegSegmentation
from pipeline.worker.state import CallState
from pipeline.worker.tasks import CallTasks
from pipeline.worker.transcription import TranscriptionScheduler

log = logging.getLogger("callqa.worker")


class CallLifecycle:
    """Takes call events, decides when calls close, and closes and completes them."""

    def __init__(self, settings: Settings, registry: CallRegistry, offsets: OffsetTracker, clock: StreamClock,
                 segmentation: LegSegmentation, scheduler: TranscriptionScheduler, gate: ReleaseGate,
                 outputs: CallOutputs, tasks: CallTasks) -> None:
        self.settings = settings
        self.registry = registry
        self.offsets = offsets
        self.clock = clock
        self.segmentation = segmentation
        self.scheduler = scheduler
        self.gate = gate
        self.outputs = outputs
        self.tasks = tasks
        # Messages not yet consumed on a partition, -1 when unknown (the app asks Kafka; without
        # Kafka: caught up).
        self.lag: Callable[[TopicPartition], int] = lambda tp: 0

    async def on_event(self, tp: TopicPartition, offset: int, event: CallEvent) -> None:
        if not self.registry.owns(tp):
            return
        call = await self.registry.call_for(event.call_id, tp)
        if not self.registry.owns(tp):
            return  # revoked while this waited: not consumed here, its next owner reads it
        if call is None or call.finishing:
            self.offsets.consumed(tp, offset, None)
            return
        self.offsets.consumed(tp, offset, call.call_id)
        call.last_activity_ms = now_ms()
        if call.audio_tp is None:
            # Audio and events are co-partitioned (same key, same partition count): the call's frames
            # are on the audio partition with this number, even before the first of them is read.
            call.audio_tp = (self.settings.topic_audio, tp[1])
        if event.is_hold_change:
            self._hold_change(call, event)
            self.outputs.live.changed(call)
            return
        if event.is_pause_change:
            self._pause_change(call, event)
            self.outputs.live.changed(call)
            return
        if event.event_type == "start":
            call.start = event
            call.started_at_ms = event.at_ms
            self.outputs.live.changed(call)
            return
        call.end, call.end_offset = event, offset
        call.end_consumed_ms = now_ms()
        if event.event_type == "abort" or call.frames_complete():
            await self.finish(call, event.event_type)
        # Otherwise frames are still on their way on the audio topic; close_due() closes the call once
        # the audio partition's stream time has passed the end event (plus a grace), or all frames came.

    async def finish_if_complete(self, call: CallState) -> None:
        """After the call took frames: close it if its end event came and every frame it announced too."""
        if call.end is not None and not call.finishing and call.frames_complete():
            await self.finish(call, call.end.event_type)

    async def close_due(self) -> None:
        """Close calls whose end event's grace has passed, or that went quiet (no end event ever came).

        Both are judged in stream time (producer timestamps of the audio partition the call is on), not
        wall time: after a backlog the worker reads old audio fast, and a wall clock would close calls
        whose frames are merely queued behind other calls' frames.
        """
        timeout_ms = self.settings.call_inactivity_timeout_s * 1000
        grace_ms = self.settings.end_grace_ms
        wall = now_ms()
        for call in list(self.registry.calls.values()):
            if call.finishing:
                continue
            how = self._due(call, wall, timeout_ms, grace_ms)
            if how == "timeout":
                log.info("call %s: no audio for %.0f s of stream time, closing it", call.call_id, timeout_ms / 1000)
            if how is not None:
                await self.finish(call, how)
            else:
                self.gate.release_held(call)  # a call that sends nothing: stream time moves its legs on

    async def finish(self, call: CallState, how: str) -> None:
        """Flush the legs and submit their last segments; completing waits for all of them."""
        if call.finishing:
            return
        call.finishing = True
        missing = call.frames_missing()
        if missing:  # its jitter buffers fill the rest with silence
            self.outputs.metrics.calls_closed_incomplete.labels(how).inc()
            log.warning("call %s closed (%s) without all the frames its end event announced: %s", call.call_id,
                        how, ", ".join(f"{leg} {n} missing" for leg, n in sorted(missing.items())))
        for closed in self.segmentation.flush(call):
            await self.scheduler.submit(closed, now_ms())
        self.tasks.spawn(call, self._complete(call, how), "finish")

    async def settle_ending(self, tps: set[TopicPartition], timeout_s: float) -> None:
        """Before ``tps`` are handed over: let calls already ending there finish (bounded), so they are
        made durable and released here rather than finished a second time by the next owner."""
        ending = self.registry.ending_tasks({p for _, p in tps})
        if ending:
            await asyncio.wait(ending, timeout=timeout_s)

    async def drain(self) -> None:
        """Finish in-flight inference (on shutdown); calls stay open and will be replayed."""
        tasks = [t for c in self.registry.calls.values() for t in c.pending]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    @staticmethod
    def _hold_change(call: CallState, event: CallEvent) -> None:
        """A hold begins or ends; a repeated hold (or a resume while not held) changes nothing."""
        call.held_from_ms = _span_change(call, event, event.event_type == "hold", call.held_from_ms, call.holds_ms)

    @staticmethod
    def _pause_change(call: CallState, event: CallEvent) -> None:
        """A secure pause begins or ends; a repeated pause (or an unpause while not paused) changes nothing.
        No frames come while paused, so inactivity counts from its end, as from a hold's."""
        call.paused_from_ms = _span_change(call, event, event.event_type == "pause", call.paused_from_ms,
                                           call.pauses_ms)

    def _due(self, call: CallState, wall: int, timeout_ms: float, grace_ms: int) -> str | None:
        """How the call should be closed now ("end", "abort", "timeout"), or None to keep it open."""
        tp = call.audio_tp
        assert tp is not None  # set by the first frame or event
        return close_reason(call, self.lag(tp), self.clock.now(tp), wall, timeout_ms, grace_ms,
                            self.clock.idle_ms(tp, wall), self.settings.end_wait_max_s * 1000)

    async def _complete(self, call: CallState, how: str) -> None:
        """Once the call's other tasks are done: what the analyzer still holds, then the call's QA."""
        current = asyncio.current_task()
        await asyncio.gather(*[t for t in call.pending if t is not current], return_exceptions=True)
        assert call.analyzer is not None
        await self.gate.flush(call)
        audio_ms = max((leg.audio_ms for leg in call.legs.values()), default=0)
        pauses = call.pause_intervals(audio_ms)
        # A call that ended while paused lasted until its pause ended, past its last audio.
        call_end_ms = max([audio_ms, *(end for _, end in pauses)])
        result = call.analyzer.finalize(call_end_ms, call.hold_intervals(audio_ms), pauses)
        audio_end = self.offsets.consumed_up_to(call.audio_tp) if call.audio_tp else None
        await self.outputs.call_result(call, result, how, audio_ms, audio_end)
        self.registry.retire(call, how)


def _span_change(call: CallState, event: CallEvent, begins: bool, open_from: int | None,
                 spans: list[tuple[int, int]]) -> int | None:
    """A hold's or a pause's start or end on the call's clock: the span's new open start (None: closed),
    a closed span appended to ``spans``. Frames stop during either, so inactivity counts from its end."""
    at = max(event.offset_ms, 0)
    if begins:
        return at if open_from is None else open_from
    if open_from is not None:
        spans.append((open_from, max(at, open_from)))
    call.resumed_at_ms = max(call.resumed_at_ms, event.at_ms)
    return None
