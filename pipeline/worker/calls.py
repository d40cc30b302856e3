"""The worker's Kafka-free core: call state, segments to the shared batcher, outputs, call lifecycle.

``CallProcessor`` receives decoded frames and call events with their input positions, and emits
contract messages through an ``OutputPort`` and rows through a ``RowSink``. The faust app (app.py)
is a thin shell that feeds it and commits what ``OffsetTracker`` allows. This module orchestrates; the
parts live beside it: ports.py (its ports), state.py (per-call state), budget.py (in-flight audio),
clock.py (stream time and when a call closes), partials.py, outputs.py (messages and rows),
dead_letters.py.

Durability rule: a call's input offsets are released only up to what is durable: its checkpoint
(checkpoints.py; taken between segments, written once the segments before it are produced,
acknowledged by Kafka and flushed into ClickHouse), and at its end its "finished" record. A crash or a
rebalance therefore replays an open call from its last checkpoint (at most an open segment per leg and
a commit interval of audio) and, the pipeline being deterministic, yields the same segment ids, which
the ReplacingMergeTree tables deduplicate. Rebalances: ``on_revoked`` stops the calls of partitions
taken away (after the app committed what is durable), ``on_assigned`` reads the new partitions'
checkpoints before any of their calls opens.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import Any

import numpy as np

from pipeline.asr.engine import LegFrontEnd
from pipeline.config import Settings
from pipeline.contracts.messages import AudioFrame, CallCheckpoint, CallEvent, DeadLetter, Message, now_ms
from pipeline.qa.call import AnalyzedSegment, CallAnalyzer, QaConfig
from pipeline.qa.segment import Segment
from pipeline.segmentation.segmenter import SpeechSegment, accept_many
from pipeline.store.base import RowSink
from pipeline.worker.budget import InflightBudget
from pipeline.worker.checkpoints import (
    CheckpointStore,
    MemoryCheckpointStore,
    call_checkpoint,
    checkpoint_written,
    due_checkpoint,
    leg_is_quiet,
    leg_position_ms,
    restore_call,
    take_leg_snapshot,
)
from pipeline.worker.clock import StreamClock, close_reason
from pipeline.worker.dead_letters import (
    bytes_per_ms,
    describe_error,
    message_dead_letter,
    segment_dead_letter,
)
from pipeline.worker.early import EarlyDecoder
from pipeline.worker.frames import FrameError, RejectedFrame, check_frame, check_leg_format, check_seq_jump
from pipeline.worker.legs import LegState
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.offsets import OffsetTracker, TopicPartition
from pipeline.worker.outputs import (
    call_qa_message,
    call_qa_row,
    call_row,
    latency_message,
    latency_row,
    qa_alert,
    qa_event_row,
    segment_row,
    transcript_message,
)
from pipeline.worker.partials import PartialTranscripts, take_partial
from pipeline.worker.ports import OutputPort, SegmentTranscriber, TranscriberDeadError, Transcription
from pipeline.worker.state import CallState, publish, segment_id, watermarks

log = logging.getLogger("callqa.worker")

# Calls closed for inactivity that this process can still reopen from memory (their checkpoints are
# on the checkpoint topic too, for another owner).
MAX_CLOSED_CALLS = 10_000


class CallProcessor:
    def __init__(
        self,
        settings: Settings,
        transcriber: SegmentTranscriber,
        output: OutputPort,
        sink: RowSink,
        front_ends: Callable[[int, str], LegFrontEnd],
        qa_config: QaConfig,
        metrics: WorkerMetrics | None = None,
        checkpoints: CheckpointStore | None = None,
    ) -> None:
        self.settings = settings
        self.transcriber = transcriber
        self.output = output
        self.sink = sink
        self.front_ends = front_ends
        self.qa_config = qa_config
        self.metrics = metrics or WorkerMetrics()
        self.offsets = OffsetTracker()
        self.clock = StreamClock()
        # Messages not yet consumed on a partition, -1 when unknown (the app asks Kafka; without
        # Kafka: caught up).
        self.lag: Callable[[TopicPartition], int] = lambda tp: 0
        self.budget = InflightBudget(settings.max_inflight_audio_mb * 1024 * 1024)
        self.calls: dict[str, CallState] = {}
        self.finished: OrderedDict[str, None] = OrderedDict()  # recently finished calls (bounded)
        self.awaiting_release: list[CallState] = []
        self.partials = PartialTranscripts(settings, transcriber, self.budget, output, sink, self.metrics)
        self.early = EarlyDecoder(transcriber, self.metrics, settings.early_decode, settings.context_tokens > 0)
        # Checkpoints: where calls resume after a crash or rebalance, read per audio partition on assignment.
        self.checkpoints: CheckpointStore = checkpoints or MemoryCheckpointStore()
        self.resume_points: dict[int, dict[str, CallCheckpoint]] = {}
        self._loading: dict[int, asyncio.Task[None]] = {}
        # Calls closed for inactivity, by id: (audio partition, checkpoint); reopened if frames still come.
        self.closed: OrderedDict[str, tuple[int, CallCheckpoint]] = OrderedDict()
        # Finished calls whose "finished" record is deleted once the commit has passed all their input.
        self._forgettable: list[tuple[str, TopicPartition, int, TopicPartition, int]] = []
        self._durable_lock = asyncio.Lock()
        # Partitions this worker owns (None: not told, e.g. without Kafka): input of others is ignored,
        # such as a batch that was already taken when its partition was revoked.
        self.owned: set[int] | None = None
        # What failed (a call task, a frame batch): the worker is unhealthy once there is any.
        self.failures: list[str] = []
        self.failure_count = 0

    # ---- input ---------------------------------------------------------------------------------
    async def on_frame(self, tp: TopicPartition, offset: int, frame: AudioFrame) -> list[RejectedFrame]:
        return await self.on_frames([(tp, offset, frame)])

    async def on_frames(self, frames: Sequence[tuple[TopicPartition, int, AudioFrame]]) -> list[RejectedFrame]:
        """A batch of frames, in consumption order: the VAD scores every leg that got audio in one run.

        Returns the frames rejected as unusable (``FrameError``), for the caller to dead-letter (then
        ``dead_letter_message``); they touch no call state and their seqs stay gaps, filled with silence.
        Any other exception is a bug, not bad input: the caller must treat it as fatal (``fail``).
        """
        consumed_ms = now_ms()
        frames = [f for f in frames if self._owns(f[0])]
        touched: dict[tuple[str, str], tuple[CallState, LegState, list[np.ndarray]]] = {}
        rejected: list[RejectedFrame] = []
        for tp, offset, frame in frames:
            try:
                check_frame(frame)
            except FrameError as exc:
                rejected.append(self._reject(tp, offset, frame, exc))
                continue
            call = await self._call_for(frame.call_id, tp)
            if call is None or call.finishing:
                self.offsets.consumed(tp, offset, None)
                self.metrics.frames_dropped.labels("after_call_end").inc()
                continue
            known = call.legs.get(frame.leg)
            try:
                if known is not None:
                    check_leg_format(frame, known.front_end.sample_rate, known.front_end.encoding)
                    # A pause longer than the timeout closes the call; twice that is no pause, it is corrupt.
                    check_seq_jump(frame, known.reorder.next_seq,
                                   int(2 * self.settings.call_inactivity_timeout_s * 1000 / known.frame_ms))
            except FrameError as exc:
                rejected.append(self._reject(tp, offset, frame, exc))
                continue
            self.offsets.consumed(tp, offset, call.call_id)
            self.clock.advance(tp, frame.produced_at_ms, consumed_ms)
            call.audio_tp = tp
            call.last_frame_produced_ms = max(call.last_frame_produced_ms, frame.produced_at_ms)
            call.last_activity_ms = consumed_ms
            leg = self._leg(call, frame)
            before = _stats_tuple(leg)
            samples = leg.release(frame.seq, frame.payload, frame.produced_at_ms)
            self._count_reorder(leg, before)
            entry = touched.setdefault((call.call_id, leg.leg), (call, leg, []))
            if samples is not None and len(samples):
                entry[2].append(samples)
        self.metrics.frames.inc(len(frames))
        fed = [(call, leg, np.concatenate(chunks)) for call, leg, chunks in touched.values() if chunks]
        self.metrics.leg_audio_seconds.inc(sum(audio.size for _, _, audio in fed) / 16000)
        closed = accept_many([leg.front_end.segmenter for _, leg, _ in fed], [audio for _, _, audio in fed])
        submitted = [(call, leg, seg) for (call, leg, _), segments in zip(fed, closed, strict=True) for seg in segments]
        self._announce(submitted)
        for call, leg, seg in submitted:
            await self._submit(call, leg, seg, consumed_ms)
        for call in {id(c): c for c, _, _ in touched.values()}.values():
            if call.decoded and not call.finishing and call.analyzer is not None:
                # A decoded segment held only for the other leg's VAD to pass its start goes out as soon
                # as the audio has moved on, not at the call's next decoded segment (a task of the call's,
                # so the call completes only after it, and a failure stays with the call, not the batch).
                self._spawn(call, self._emit_released(call, call.analyzer.release(self._watermarks(call))))
        for call, leg, _ in touched.values():
            self.early.update(leg)
            if self.settings.partial_interval_ms > 0:
                self._maybe_partial(call, leg)
            if call.end is not None and not call.finishing and call.frames_complete():
                await self._finish(call, call.end.event_type)
        self._take_snapshots({id(c): c for c, _, _ in touched.values()}.values())
        return rejected

    async def on_event(self, tp: TopicPartition, offset: int, event: CallEvent) -> None:
        if not self._owns(tp):
            return
        call = await self._call_for(event.call_id, tp)
        if call is None or call.finishing:
            self.offsets.consumed(tp, offset, None)
            return
        self.offsets.consumed(tp, offset, call.call_id)
        call.last_activity_ms = now_ms()
        if call.audio_tp is None:
            # Audio and events are co-partitioned (same key, same partition count): the call's frames
            # are on the audio partition with this number, even before the first of them is read.
            call.audio_tp = (self.settings.topic_audio, tp[1])
        if event.event_type == "start":
            call.start = event
            call.started_at_ms = event.at_ms
            return
        call.end, call.end_offset = event, offset
        call.end_consumed_ms = now_ms()
        if event.event_type == "abort" or call.frames_complete():
            await self._finish(call, event.event_type)
        # Otherwise frames are still on their way on the audio topic; tick() closes the call once the
        # audio partition's stream time has passed the end event (plus a grace), or all frames came.

    def dead_letter_message(
        self, tp: TopicPartition, offset: int, key: bytes | None, raw: bytes, exc: BaseException,
        frame: AudioFrame | None = None,
    ) -> DeadLetter:
        """A reference to an input message that could not be processed (``frame``: it was decoded).
        Its offset stays uncommitted until ``dead_letter_delivered``: a crash before then must not lose it."""
        self.metrics.dead_letters.labels(type(exc).__name__).inc()
        self.offsets.consumed(tp, offset, _dead_letter_holder(tp, offset))
        return message_dead_letter(tp, offset, key, raw, exc, self.settings.worker_id,
                                   self.settings.debug_raw_audio, frame)

    def dead_letter_delivered(self, tp: TopicPartition, offset: int) -> None:
        """The dead letter of the message at ``tp``/``offset`` is acknowledged by Kafka: it may be committed."""
        self.offsets.release(_dead_letter_holder(tp, offset))

    def fail(self, reason: str) -> None:
        """Something failed that leaves results incomplete (a bug, not bad input): from now on nothing is
        committed, and the worker reports itself unhealthy (so it exits and its input is replayed)."""
        if len(self.failures) < MAX_FAILURES_KEPT:
            self.failures.append(reason)
        self.failure_count += 1

    # ---- timers --------------------------------------------------------------------------------
    async def tick(self) -> None:
        """Close calls whose end event's grace has passed, or that went quiet (no end event ever came).

        Both are judged in stream time (producer timestamps of the audio partition the call is on), not
        wall time: after a backlog the worker reads old audio fast, and a wall clock would close calls
        whose frames are merely queued behind other calls' frames.
        """
        timeout_ms = self.settings.call_inactivity_timeout_s * 1000
        grace_ms = self.settings.end_grace_ms
        wall = now_ms()
        for call in list(self.calls.values()):
            if call.finishing:
                continue
            how = self._due(call, wall, timeout_ms, grace_ms)
            if how == "timeout":
                log.info("call %s: no audio for %.0f s of stream time, closing it", call.call_id, timeout_ms / 1000)
            if how is not None:
                await self._finish(call, how)
        self.metrics.active_calls.set(len(self.calls))
        self.metrics.active_legs.set(sum(len(c.legs) for c in self.calls.values()))
        self.metrics.inflight_audio_bytes.set(self.budget.used)
        self.metrics.inflight_audio_peak_bytes.set(self.budget.peak)

    def _due(self, call: CallState, wall: int, timeout_ms: float, grace_ms: int) -> str | None:
        """How the call should be closed now ("end", "abort", "timeout"), or None to keep it open."""
        tp = call.audio_tp
        assert tp is not None  # set by the first frame or event
        return close_reason(call, self.lag(tp), self.clock.now(tp), wall, timeout_ms, grace_ms,
                            self.clock.idle_ms(tp, wall))

    async def make_durable(self) -> dict[TopicPartition, int]:
        """Make finished calls and due checkpoints durable, move the offsets they hold; return what may
        be committed.

        Order matters: a call's outputs are acknowledged by Kafka and flushed into ClickHouse, then its
        checkpoint (or "finished" record) is acknowledged, and only then its hold on the input moves.
        """
        async with self._durable_lock:
            if self.failures:  # results may be incomplete: nothing more is committed; a restart replays
                return {}
            await self._forget_committed()
            ready = [c for c in self.awaiting_release if not c.pending and not c.failed]
            due = [(c, legs) for c in self.calls.values() if not c.finishing and not c.failed
                   if (legs := due_checkpoint(c)) is not None]
            if not ready and not due:
                return self.offsets.committable()
            delivered: list[Awaitable[Any]] = []
            for call in ready + [c for c, _ in due]:
                delivered, call.deliveries = delivered + call.deliveries, []
            await asyncio.gather(*delivered)
            await self.sink.flush()
            saved = [await self._save(c, call_checkpoint(c, "open", legs)) for c, legs in due]
            saved += [await self._save(c, c.closed_checkpoint or call_checkpoint(c, "finished")) for c in ready]
            await asyncio.gather(*saved)
            for call, legs in due:
                if self.calls.get(call.call_id) is not call:
                    continue  # ended or handed over meanwhile: its later record or new owner takes over
                assert call.audio_tp is not None
                self.offsets.hold_from(call.audio_tp, call.call_id, min(s.resume_offset for s in legs.values()))
                # The start event is in the checkpoint; an end event already read is not: its offset stays
                # held (one read later holds its offset again).
                events_tp = (self.settings.topic_call_events, call.audio_tp[1])
                if call.end is None:
                    self.offsets.release_on(events_tp, call.call_id)
                else:
                    self.offsets.hold_from(events_tp, call.call_id, call.end_offset)
                checkpoint_written(call, legs)
                self.metrics.checkpoints.labels("open").inc()
            for call in ready:
                if call in self.awaiting_release:  # else handed over in a rebalance meanwhile
                    self._released(call)
            return self.offsets.committable()

    async def _save(self, call: CallState, checkpoint: CallCheckpoint) -> Awaitable[Any]:
        assert call.audio_tp is not None
        return await self.checkpoints.save(call.audio_tp[1], call.call_id, checkpoint)

    def _released(self, call: CallState) -> None:
        """A finished call is durable: its input offsets are free, its record deleted once committed past."""
        assert call.audio_tp is not None
        events_tp = (self.settings.topic_call_events, call.audio_tp[1])
        if call.call_id not in self.calls:  # else reopened meanwhile: it goes on holding what it holds
            self.offsets.release(call.call_id)
        self.awaiting_release.remove(call)
        status = "closed" if call.closed_checkpoint is not None else "finished"
        self.metrics.checkpoints.labels(status).inc()
        if status == "finished":
            # Every frame and event of it is before these positions (frames after its end are dropped).
            self._forgettable.append((call.call_id, call.audio_tp, self.offsets.consumed_up_to(call.audio_tp) or 0,
                                      events_tp, self.offsets.consumed_up_to(events_tp) or 0))

    async def _forget_committed(self) -> None:
        """Delete the "finished" records of calls whose input is all committed: no replay can reach it."""
        keep: list[tuple[str, TopicPartition, int, TopicPartition, int]] = []
        forget: list[tuple[str, TopicPartition, int, TopicPartition, int]] = []
        for entry in self._forgettable:
            _, audio_tp, audio_end, events_tp, events_end = entry
            done = (self.offsets.committed_at(audio_tp) >= audio_end
                    and self.offsets.committed_at(events_tp) >= events_end)
            (forget if done else keep).append(entry)
        self._forgettable = keep
        await asyncio.gather(*[await self.checkpoints.save(tp[1], call_id, None) for call_id, tp, _, _, _ in forget])

    async def drain(self) -> None:
        """Finish in-flight inference (on shutdown); calls stay open and will be replayed."""
        tasks = [t for c in self.calls.values() for t in c.pending]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # ---- internals -----------------------------------------------------------------------------
    async def _call_for(self, call_id: str, tp: TopicPartition) -> CallState | None:
        """The open call ``call_id`` (resumed from its checkpoint, or new), or None once it is finished."""
        call = self.calls.get(call_id)
        if call is not None:
            return call
        if call_id in self.finished:
            return None
        await self._resume_points_ready(tp[1])
        # The audio and the events agent both run this; the other may have opened the call while this
        # one waited for the partition's checkpoints, so look again (no await from here on).
        call = self.calls.get(call_id)
        if call is not None or call_id in self.finished:
            return call
        checkpoint = self.resume_points.get(tp[1], {}).pop(call_id, None)
        if call_id in self.closed:
            checkpoint = self.closed.pop(call_id)[1]
        if checkpoint is not None and checkpoint.status == "finished":
            self._remember_finished(call_id)  # frames of a call whose results are stored already
            return None
        if checkpoint is None:
            call = CallState(call_id)
            call.analyzer = CallAnalyzer(call_id, self.qa_config)
        else:
            call = self._resume(checkpoint)
        call.audio_tp = (self.settings.topic_audio, tp[1])
        self.calls[call_id] = call
        return call

    def _resume(self, checkpoint: CallCheckpoint) -> CallState:
        call = restore_call(checkpoint, self.qa_config, self.front_ends, self.settings.max_segment_ms,
                            self.settings.reorder_window_frames)
        if checkpoint.status == "closed":
            # Closed for inactivity, and frames still came: the call goes on, its QA is computed again.
            self.metrics.calls_reopened.inc()
            log.info("call %s: frames after it was closed (%s), reopening it", call.call_id, checkpoint.end_reason)
        else:
            self.metrics.calls_resumed.inc()
        return call

    async def _resume_points_ready(self, partition: int) -> None:
        """Wait until the checkpoints of ``partition`` are read (read now if no assignment announced it)."""
        loading = self._loading.get(partition)
        if loading is None:
            loading = self._loading[partition] = asyncio.create_task(self._load_resume_points(partition))
        await asyncio.shield(loading)

    async def _load_resume_points(self, partition: int) -> None:
        self.resume_points[partition] = await self.checkpoints.load(partition)

    # ---- rebalance ------------------------------------------------------------------------------
    def on_assigned(self, tps: set[TopicPartition]) -> None:
        """New partitions: read their checkpoints before any of their calls is opened."""
        self.metrics.rebalances.inc()
        self.owned = {p for _, p in tps}  # an assignment is the whole new set
        for topic, partition in tps:
            if topic == self.settings.topic_audio and partition not in self._loading:
                self._loading[partition] = asyncio.create_task(self._load_resume_points(partition))

    async def settle_ending(self, tps: set[TopicPartition], timeout_s: float) -> None:
        """Before ``tps`` are handed over: let calls already ending there finish (bounded), so they are
        made durable and released here rather than finished a second time by the next owner."""
        partitions = {p for _, p in tps}
        ending = [t for c in [*self.calls.values(), *self.awaiting_release]
                  if c.finishing and c.audio_tp is not None and c.audio_tp[1] in partitions for t in c.pending]
        if ending:
            await asyncio.wait(ending, timeout=timeout_s)

    def on_revoked(self, tps: set[TopicPartition]) -> None:
        """Partitions taken away: their calls stop here (their new owner resumes them from their
        checkpoints), and their positions, holds, clocks and checkpoints are forgotten. The caller makes
        durable and commits what it can first (``make_durable``); nothing of these is committed after."""
        partitions = {p for _, p in tps}
        if self.owned is not None:
            self.owned -= partitions

        def on_revoked_partition(call: CallState) -> bool:
            return call.audio_tp is not None and call.audio_tp[1] in partitions

        for call in [c for c in self.calls.values() if on_revoked_partition(c)]:
            self._drop(call)
            del self.calls[call.call_id]
            self.metrics.calls_dropped.inc()
        for call in [c for c in self.awaiting_release if on_revoked_partition(c)]:
            self._drop(call)
            self.awaiting_release.remove(call)
        for call_id in [k for k, (p, _) in self.closed.items() if p in partitions]:
            del self.closed[call_id]
        self._forgettable = [f for f in self._forgettable if f[1][1] not in partitions]
        revoked = {(t, p) for t in (self.settings.topic_audio, self.settings.topic_call_events) for p in partitions}
        self.offsets.forget(revoked | set(tps))
        self.clock.forget(revoked | set(tps))
        for partition in partitions:
            self.resume_points.pop(partition, None)
            loading = self._loading.pop(partition, None)
            if loading is not None:
                loading.cancel()

    def _owns(self, tp: TopicPartition) -> bool:
        return self.owned is None or tp[1] in self.owned

    @staticmethod
    def _drop(call: CallState) -> None:
        call.finishing = True  # anything still running for it stops short of new work
        for task in list(call.pending):
            task.cancel()

    def _take_snapshots(self, calls: Iterable[CallState]) -> None:
        """Snapshot each leg at a quiet moment, spaced by the checkpoint interval of its audio."""
        for call in calls:
            if call.finishing or call.audio_tp is None:
                continue
            resume_offset = self.offsets.consumed_up_to(call.audio_tp)
            for leg in call.legs.values():
                position = leg_position_ms(leg)
                if (resume_offset is None or not leg_is_quiet(leg)
                        or position - call.leg_snapshot_ms.get(leg.leg, 0) < self.settings.checkpoint_interval_ms):
                    continue
                call.leg_snapshots.setdefault(leg.leg, []).append(take_leg_snapshot(call, leg, resume_offset))
                call.leg_snapshot_ms[leg.leg] = position

    def _leg(self, call: CallState, frame: AudioFrame) -> LegState:
        leg = call.legs.get(frame.leg)
        if leg is None:
            frame_ms = max(1, round(len(frame.payload) / bytes_per_ms(frame)))
            leg = call.legs[frame.leg] = LegState.open(
                call.call_id, frame.leg, self.front_ends(frame.sample_rate, frame.encoding), frame_ms,
                self.settings.max_segment_ms, self.settings.reorder_window_frames,
            )
        return leg

    def _count_reorder(self, leg: LegState, before: tuple[int, int, int, int]) -> None:
        s = leg.reorder.stats
        dup, late, gaps = s.duplicates - before[0], s.late - before[1], s.gaps_filled - before[2]
        if leg.before_checkpoint > before[3]:
            self.metrics.frames_dropped.labels("before_checkpoint").inc(leg.before_checkpoint - before[3])
        if dup:
            self.metrics.frames_dropped.labels("duplicate").inc(dup)
        if late:
            self.metrics.frames_dropped.labels("late").inc(late)
            log.info("call %s %s: %d frame(s) arrived after their place was filled with silence",
                     leg.call_id, leg.leg, late)
        if gaps:
            self.metrics.gap_frames.inc(gaps)

    @staticmethod
    def _announce(closed: Sequence[tuple[CallState, LegState, SpeechSegment]]) -> None:
        """Tell each call's analyzer about its newly closed segments before anything awaits: once a leg's
        segmenter has moved past a segment, a later segment may be released only after it is known."""
        for call, leg, seg in closed:
            assert call.analyzer is not None
            seg_id = segment_id(call.call_id, leg.leg, seg.start_ms)
            call.analyzer.expect(leg.leg, seg_id, seg.start_ms)
            call.announced.setdefault(leg.leg, []).append(seg_id)
            call.unresolved.add(seg_id)  # until emitted or skipped: a snapshot after it waits for it

    def _spawn(self, call: CallState, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` as one of the call's pending tasks (the call completes only after them)."""
        task = asyncio.create_task(work)
        call.pending.add(task)
        task.add_done_callback(call.pending.discard)
        task.add_done_callback(functools.partial(self._task_done, call, task_kind(work)))

    def _task_done(self, call: CallState, kind: str, task: asyncio.Task[None]) -> None:
        """A call task that raised is a bug, not bad input (those are handled inside the tasks): its
        outputs may be missing, so the call fails. A partial is a preview: its failure costs nothing."""
        exc = None if task.cancelled() else task.exception()  # cancelled: shutdown or a revoked partition
        if exc is None:
            return
        error = describe_error(exc)
        self.metrics.task_failures.labels(kind).inc()
        log.error("call %s: %s task failed: %s", call.call_id, kind, error)
        if kind != "partial":
            call.failed = True
            self.fail(f"call {call.call_id}: {kind} task failed: {error}")

    def _reject(self, tp: TopicPartition, offset: int, frame: AudioFrame, exc: FrameError) -> RejectedFrame:
        # Held until its dead letter is delivered (dead_letter_message holds it under the same name).
        self.offsets.consumed(tp, offset, _dead_letter_holder(tp, offset))
        return RejectedFrame(tp, offset, frame, exc)

    async def _submit(self, call: CallState, leg: LegState, seg: SpeechSegment, consumed_ms: int) -> None:
        nbytes = seg.audio.nbytes
        early = self.early.take(leg, seg)  # now: the leg's next update would drop it
        # Taken at submit: the leg's finals known by now (one still decoding is not waited for).
        context = leg.context.for_segment(seg.start_ms) if self.settings.context_tokens > 0 else ()
        await self.budget.acquire(nbytes)  # back-pressure: the agent waits, Kafka fetching pauses
        self._spawn(call, self._transcribe(call, leg, seg, consumed_ms, nbytes, early, context))

    async def _transcribe(self, call: CallState, leg: LegState, seg: SpeechSegment, consumed_ms: int,
                          nbytes: int, early: asyncio.Task[Transcription] | None = None,
                          context: tuple[int, ...] = ()) -> None:
        closed_ms = now_ms()
        seg_id = segment_id(call.call_id, leg.leg, seg.start_ms)
        assert call.analyzer is not None
        # The budget is held until the segment's rows are in the sink's buffer: while ClickHouse is
        # down the sink's write() waits, so does this, and the agents stop taking frames.
        try:
            try:
                # The early decode ran on exactly these samples: the same text, sooner.
                result = await (early if early is not None else self.transcriber.transcribe(seg.audio, context))
            except TranscriberDeadError:
                raise  # not this segment's fault: the call fails, the worker exits, a restart replays it
            except Exception as exc:  # noqa: BLE001 - one failed segment must not stop the call
                self.metrics.segment_failures.inc()
                log.warning("segment %s failed: %s", seg_id, describe_error(exc))
                await self._publish(call, self.settings.topic_dead_letters, call.call_id,
                                    self._segment_dead_letter(call, leg, seg, seg_id, exc))
                call.unresolved.discard(seg_id)
                await self._emit_released(call, call.analyzer.skip(seg_id, self._watermarks(call)))
                return
            leg.context.update(result, seg.end_ms)
            if result.is_silence or not result.text.strip():
                self.metrics.segments.labels("silence").inc()
                call.unresolved.discard(seg_id)
                await self._emit_released(call, call.analyzer.skip(seg_id, self._watermarks(call)))
                return
            call.decoded[seg_id] = (leg, seg.start_ms, seg.end_ms, result, consumed_ms, closed_ms)
            segment = Segment(call.call_id, leg.leg, seg_id,  # type: ignore[arg-type]
                              seg.start_ms, seg.end_ms, result.text.strip())
            await self._emit_released(call, call.analyzer.complete(segment, self._watermarks(call)))
        finally:
            await self.budget.release(nbytes)

    def _segment_dead_letter(self, call: CallState, leg: LegState, seg: SpeechSegment, seg_id: str,
                             exc: BaseException) -> DeadLetter:
        self.metrics.dead_letters.labels(type(exc).__name__).inc()
        return segment_dead_letter(
            self.settings.topic_audio, call.audio_tp[1] if call.audio_tp else -1, call.call_id, leg.leg, seg,
            seg_id, exc, self.settings.worker_id, self.settings.debug_raw_audio,
        )

    def _watermarks(self, call: CallState) -> dict[str, int]:
        return watermarks(call, self.settings.pre_roll_ms)

    async def _emit_released(self, call: CallState, released: list[AnalyzedSegment]) -> None:
        """Publish segments the analyzer released (in time order), each with its own decoding's details."""
        for analyzed in released:
            seg_id = analyzed.redacted.segment.segment_id
            leg, start_ms, end_ms, r, consumed_ms, closed_ms = call.decoded.pop(seg_id)
            await self._emit_segment(call, leg, start_ms, end_ms, seg_id, r, consumed_ms, closed_ms, analyzed)

    async def _emit_segment(self, call: CallState, leg: LegState, start_ms: int, end_ms: int, seg_id: str,
                            r: Transcription, consumed_ms: int, closed_ms: int,
                            analyzed: AnalyzedSegment) -> None:
        text = analyzed.redacted.text  # the analyzer redacts unless redaction is explicitly off
        produced = now_ms()
        last_frame_ms = leg.produced_at(end_ms) or consumed_ms
        transcript = transcript_message(call.call_id, leg, seg_id, start_ms, end_ms, text, r, True,
                                        sum(analyzed.redacted.counts.values()), closed_ms, produced)
        latency = latency_message(call.call_id, leg.leg, seg_id, r, consumed_ms, last_frame_ms, produced,
                                  self.settings.worker_id)
        await self._publish(call, self.settings.topic_transcripts, call.call_id, transcript)
        await self._publish(call, self.settings.topic_latency, call.call_id, latency)
        for ev in analyzed.events:
            self.metrics.qa_alerts.labels(ev.rule).inc()
            await self._publish(call, self.settings.topic_qa, call.call_id, qa_alert(call.call_id, ev))
        await self.sink.write("segments", [segment_row(transcript)])
        await self.sink.write("latency", [latency_row(latency)])
        call.segments_done += 1
        call.unresolved.discard(seg_id)
        self.metrics.segments.labels("final").inc()
        self.metrics.final_delay.observe(latency.end_to_end_ms / 1000)
        self.metrics.batch_size.observe(r.batch_size)

    def _maybe_partial(self, call: CallState, leg: LegState) -> None:
        """Transcribe the open segment again once it has grown by the partial interval."""
        due = take_partial(leg, self.settings.partial_interval_ms)
        if due is not None:
            self._spawn(call, self.partials.transcribe(call, leg, *due))

    async def _finish(self, call: CallState, how: str) -> None:
        """Flush the legs, wait for the call's segments, then emit the call's QA and row."""
        if call.finishing:
            return
        call.finishing = True
        counts = call.end.frame_counts if call.end else {}
        closed: list[tuple[CallState, LegState, SpeechSegment]] = []
        for leg in call.legs.values():
            before = _stats_tuple(leg)
            closed += [(call, leg, seg) for seg in leg.finish(counts.get(leg.leg))]
            self._count_reorder(leg, before)
        self._announce(closed)
        for _, leg, seg in closed:
            await self._submit(call, leg, seg, now_ms())
        self._spawn(call, self._complete(call, how))

    async def _complete(self, call: CallState, how: str) -> None:
        current = asyncio.current_task()
        await asyncio.gather(*[t for t in call.pending if t is not current], return_exceptions=True)
        assert call.analyzer is not None
        await self._emit_released(call, call.analyzer.flush())
        audio_ms = max((leg.frames_released * leg.frame_ms for leg in call.legs.values()), default=0)
        result = call.analyzer.finalize(audio_ms)
        start = call.start or call.end
        qa = call_qa_message(call.call_id, result, start)
        await self._publish(call, self.settings.topic_qa, call.call_id, qa)
        await self.sink.write("calls", [call_row(call, qa, start, how, audio_ms, now_ms())])
        await self.sink.write("call_qa", [call_qa_row(qa)])
        if result.events:
            await self.sink.write("qa_events", [qa_event_row(call.call_id, e) for e in result.events])
        self.metrics.calls_finished.labels(how).inc()
        if how == "timeout" and call.audio_tp is not None:
            # Frames may still come (a hold longer than the timeout): keep what resuming the call needs.
            call.closed_checkpoint = call_checkpoint(call, "closed", end_reason=how)
            self.closed[call.call_id] = (call.audio_tp[1], call.closed_checkpoint)
            while len(self.closed) > MAX_CLOSED_CALLS:
                self.closed.popitem(last=False)
        else:
            self._remember_finished(call.call_id)
        call.legs.clear()  # audio buffers and VAD state are not needed while the call awaits release
        del self.calls[call.call_id]
        self.awaiting_release.append(call)

    async def _publish(self, call: CallState, topic: str, key: str, message: Message) -> None:
        await publish(self.output, call, topic, key, message)

    def _remember_finished(self, call_id: str) -> None:
        self.finished[call_id] = None
        while len(self.finished) > 100_000:
            self.finished.popitem(last=False)


# What each kind of call task does, for logs and callqa_task_failures_total{task}.
TASK_KINDS = {
    "CallProcessor._transcribe": "segment",
    "CallProcessor._emit_released": "emit",
    "CallProcessor._complete": "finish",
    "PartialTranscripts.transcribe": "partial",
}
MAX_FAILURES_KEPT = 10  # reasons /health lists; the worker exits at the first anyway


def task_kind(work: Coroutine[Any, Any, None]) -> str:
    name: str = getattr(work, "__qualname__", "call")
    return TASK_KINDS.get(name, name.rpartition(".")[2].lstrip("_"))


def _dead_letter_holder(tp: TopicPartition, offset: int) -> str:
    """The offset tracker's holder name of a message on its way to the dead-letter topic."""
    return f"dead letter {tp[0]}[{tp[1]}]@{offset}"


def _stats_tuple(leg: LegState) -> tuple[int, int, int, int]:
    s = leg.reorder.stats
    return s.duplicates, s.late, s.gaps_filled, leg.before_checkpoint
