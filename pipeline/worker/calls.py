"""The worker's Kafka-free core: ``CallProcessor`` wires the stages a frame goes through.

It receives decoded frames and call events with their input positions, and emits contract messages
through an ``OutputPort`` and rows through a ``RowSink``. The faust app (app.py) is a thin shell that
feeds it and commits what ``OffsetTracker`` allows. The stages, along the data's path (README.md):

    frames -> FrameIntake (intake.py)          checks, call lookup, jitter buffer: each leg's new audio
           -> LegSegmentation (segmentation.py) batched VAD, closed segments announced to the analyzer
           -> TranscriptionScheduler (transcription.py)  budget, batcher, early decodes, partials
           -> ReleaseGate (release.py)          analyzer: redaction and QA in time order
           -> CallOutputs (call_outputs.py)     messages and rows
    events, timers -> CallLifecycle (lifecycle.py)  close, flush, complete; CallRegistry (registry.py)
    commit timer -> CallDurability (durability.py)  snapshots, checkpoints, offsets that may be committed

Rebalances (faust's consumer revokes every partition on every rebalance): ``on_revoking`` pauses the
calls of the revoked partitions (after the app committed what is durable); ``on_assigned`` then drops
only those of partitions that moved (``on_revoked``: their next owner resumes them from their
checkpoints), lets the others go on, and reads the new partitions' checkpoints before any of their calls
opens. ``CALLQA_KEEP_CALLS_ON_REBALANCE=false`` drops every call at once instead (the old behaviour).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from pipeline.asr.engine import LegFrontEnd
from pipeline.config import Settings
from pipeline.contracts.messages import AudioFrame, CallEvent, DeadLetter
from pipeline.qa.call import QaConfig
from pipeline.store.base import RowSink
from pipeline.worker.budget import InflightBudget
from pipeline.worker.call_outputs import CallOutputs
from pipeline.worker.checkpoints import CheckpointStore, MemoryCheckpointStore
from pipeline.worker.clock import StreamClock
from pipeline.worker.dead_letters import describe_error
from pipeline.worker.durability import CallDurability
from pipeline.worker.frames import RejectedFrame
from pipeline.worker.intake import FrameIntake
from pipeline.worker.lifecycle import CallLifecycle
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.offsets import OffsetTracker, TopicPartition
from pipeline.worker.ports import OutputPort, SegmentTranscriber
from pipeline.worker.registry import CallRegistry
from pipeline.worker.release import ReleaseGate
from pipeline.worker.segmentation import LegSegmentation
from pipeline.worker.state import CallState
from pipeline.worker.tasks import CallTasks
from pipeline.worker.transcription import TranscriptionScheduler
from pipeline.worker.waiting import WaitingFrames

log = logging.getLogger("callqa.worker")

# On a rebalance, how long calls already ending on revoked partitions may take to finish here (their
# last segments are decoding): the group waits for this, so it stays well under the session timeout.
HANDOVER_SETTLE_S = 5.0
# A hand-over looks this often whether it is done or the store refuses writes, and gives a store that
# refuses this long (a hiccup's first retry comes after 0.2 s) the chance to recover before giving up.
HANDOVER_POLL_S = 0.1
STORE_HICCUP_S = 1.0


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
        live_output: OutputPort | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or WorkerMetrics()
        self.offsets = OffsetTracker()
        self.clock = StreamClock()
        self.budget = InflightBudget(settings.max_inflight_audio_mb * 1024 * 1024)
        self.tasks = CallTasks(self.metrics)
        # Checkpoints: where calls resume after a crash or rebalance, read per audio partition on assignment.
        store: CheckpointStore = checkpoints or MemoryCheckpointStore()
        self.registry = CallRegistry(settings, qa_config, front_ends, store, self.metrics)
        self.intake = FrameIntake(settings, self.registry, self.offsets, self.clock, front_ends, self.metrics)
        self.segmentation = LegSegmentation(self.metrics)
        self.outputs = CallOutputs(settings, output, sink, self.metrics, live_output)
        self.gate = ReleaseGate(settings, self.outputs, self.tasks, self.clock)
        self.scheduler = TranscriptionScheduler(settings, transcriber, self.budget, self.gate, self.outputs,
                                                self.tasks, self.metrics)
        self.lifecycle = CallLifecycle(settings, self.registry, self.offsets, self.clock, self.segmentation,
                                       self.scheduler, self.gate, self.outputs, self.tasks)
        self.durability = CallDurability(settings, self.registry, self.offsets, store, sink, self.tasks,
                                         self.metrics)
        # Frames of partitions whose checkpoints are being read wait here, not in front of every other
        # partition's (waiting.py); one frame batch at a time, whether the agent or the timer brings it.
        self.waiting = WaitingFrames()
        self._frames_lock = asyncio.Lock()

    # ---- state the app, health checks and tests look at ----------------------------------------
    @property
    def calls(self) -> dict[str, CallState]:
        """Open calls by id."""
        return self.registry.calls

    @property
    def awaiting_release(self) -> list[CallState]:
        """Completed calls whose outputs are not yet durable."""
        return self.registry.awaiting_release

    @property
    def failures(self) -> list[str]:
        """What failed (a call task, a frame batch): the worker is unhealthy once there is any."""
        return self.tasks.failures

    @property
    def failure_count(self) -> int:
        return self.tasks.failure_count

    @property
    def lag(self) -> Callable[[TopicPartition], int]:
        """Messages not yet consumed on a partition, -1 when unknown (the app sets how it asks Kafka)."""
        return self.lifecycle.lag

    @lag.setter
    def lag(self, lag: Callable[[TopicPartition], int]) -> None:
        self.lifecycle.lag = lag

    # ---- input ---------------------------------------------------------------------------------
    async def on_frame(self, tp: TopicPartition, offset: int, frame: AudioFrame) -> list[RejectedFrame]:
        return await self.on_frames([(tp, offset, frame)])

    async def on_frames(self, frames: Sequence[tuple[TopicPartition, int, AudioFrame]]) -> list[RejectedFrame]:
        """A batch of frames, in consumption order: the VAD scores every leg that got audio in one run.

        Returns the frames rejected as unusable (``FrameError``), for the caller to dead-letter (then
        ``dead_letter_message``); they touch no call state and their seqs stay gaps, filled with silence.
        Any other exception is a bug, not bad input: the caller must treat it as fatal (``fail``).
        """
        if self.registry.replay_floor:  # after a rebalance that kept a partition: skip what was read before
            fresh = [f for f in frames if not self.registry.replayed(f[0], f[1])]
            if len(fresh) < len(frames):
                self.metrics.frames_dropped.labels("read_before_rebalance").inc(len(frames) - len(fresh))
            frames = fresh
        loading = self.registry.loading_partitions()
        if loading and any(tp[1] in loading for tp, _, _ in frames):
            await asyncio.sleep(0)  # a read that needs no waiting (in memory) ends here: nothing to hold
        async with self._frames_lock:
            return await self._take(self.waiting.admit(frames, self.registry.loading_partitions()))

    async def release_waiting(self) -> list[RejectedFrame]:
        """Frames held while their partition's checkpoints were read, once read, when no new batch came to
        take them (the worker's timer calls this); returns those rejected, as ``on_frames`` does."""
        if not self.waiting.ready(self.registry.loading_partitions()):
            return []
        async with self._frames_lock:
            return await self._take(self.waiting.admit([], self.registry.loading_partitions()))

    async def _take(self, frames: Sequence[tuple[TopicPartition, int, AudioFrame]]) -> list[RejectedFrame]:
        if not frames:
            return []
        batch = await self.intake.take(frames)
        for closed in self.segmentation.segment(batch.legs):
            await self.scheduler.submit(closed, batch.consumed_ms)
        calls = batch.calls()
        for call in calls:
            self.gate.release_moved_on(call)
        for audio in batch.legs:
            self.scheduler.after_audio(audio.call, audio.leg)
            await self.lifecycle.finish_if_complete(audio.call)
        self.durability.take_snapshots(calls)
        return batch.rejected

    async def on_event(self, tp: TopicPartition, offset: int, event: CallEvent) -> None:
        if self.registry.replayed(tp, offset):
            return  # read again after a rebalance that kept the partition (a hold must not count twice)
        await self.lifecycle.on_event(tp, offset, event)

    def dead_letter_message(
        self, tp: TopicPartition, offset: int, key: bytes | None, raw: bytes, exc: BaseException,
        frame: AudioFrame | None = None,
    ) -> DeadLetter:
        """A reference to an input message that could not be processed (``frame``: it was decoded).
        Its offset stays uncommitted until ``dead_letter_delivered``: a crash before then must not lose it."""
        return self.intake.dead_letter_message(tp, offset, key, raw, exc, frame)

    def dead_letter_delivered(self, tp: TopicPartition, offset: int) -> None:
        """The dead letter of the message at ``tp``/``offset`` is acknowledged by Kafka: it may be committed."""
        self.intake.dead_letter_delivered(tp, offset)

    def fail(self, reason: str) -> None:
        """Something failed that leaves results incomplete (a bug, not bad input): from now on nothing is
        committed, and the worker reports itself unhealthy (so it exits and its input is replayed)."""
        self.tasks.fail(reason)

    # ---- timers --------------------------------------------------------------------------------
    async def tick(self) -> None:
        """Close calls that are due (clock.py), and report the call core's gauges."""
        if not self.registry.suspended:  # a rebalance under way: who closes them is not known yet
            await self.lifecycle.close_due()
            self.outputs.live.send_due(self.calls)
        self.metrics.active_calls.set(len(self.calls))
        self.metrics.active_legs.set(sum(len(c.legs) for c in self.calls.values()))
        self.metrics.inflight_audio_bytes.set(self.budget.used)
        self.metrics.inflight_audio_peak_bytes.set(self.budget.peak)

    async def make_durable(self) -> dict[TopicPartition, int]:
        """Make finished calls and due checkpoints durable; return the offsets that may be committed."""
        return await self.durability.make_durable()

    async def commit_transactions(self, offsets: dict[TopicPartition, int], partitions: set[int],
                                  commit: Callable[[], Awaitable[None]]) -> bool:
        """Exactly once: record what the calls of ``partitions`` have published (a checkpoint record each,
        in their transactions), then ``commit`` (those transactions, with ``offsets``), with no output
        published in between: a transaction holds an output's messages and the record that lists them,
        or none of it. A replay from ``offsets`` then publishes nothing of it again. Nothing is committed
        once a call failed (the worker exits, the next owner replays) or while a rebalance is under way
        (the partitions may have a new owner already). Returns whether it committed."""
        if self.tasks.failures or self.registry.suspended:
            return False
        async with self.outputs.publishing:
            await self.durability.record_published(partitions)
            await commit()
        self.offsets.committed(offsets)
        return True

    async def drain(self) -> None:
        """Finish in-flight inference (on shutdown); calls stay open and will be replayed."""
        await self.lifecycle.drain()

    # ---- rebalance ------------------------------------------------------------------------------
    def on_assigned(self, tps: set[TopicPartition]) -> None:
        """The assignment (the whole new set): the calls of revoked partitions that stayed go on, those
        that moved are dropped; new partitions' checkpoints are read before any of their calls is opened."""
        moved = self.registry.settle_assignment(tps, {tp: o for tp in self.offsets.partitions()
                                                      if (o := self.offsets.consumed_up_to(tp)) is not None})
        if moved:
            self.on_revoked({(t, p) for t in (self.settings.topic_audio, self.settings.topic_call_events)
                             for p in moved})
        self.registry.on_assigned(tps)

    async def settle_ending(self, tps: set[TopicPartition], timeout_s: float) -> None:
        """Before ``tps`` are handed over: let calls already ending there finish (bounded)."""
        await self.lifecycle.settle_ending(tps, timeout_s)

    async def hand_over(self, tps: set[TopicPartition], budget_s: float, commit: Callable[[], Awaitable[None]],
                        store_failing: Callable[[], bool] = lambda: False) -> None:
        """A rebalance revoked ``tps``: let calls ending there finish, make durable and ``commit``, all
        within ``budget_s`` whatever the store or the broker does (the group's rebalance waits for this);
        what is not durable by then is replayed by the next owner from the last commit. Then
        ``on_revoking``. While ``store_failing`` says the store refuses writes (past a first second, which a
        hiccup's retry fits in), waiting on is given up at once: every worker's hand-over would wait out the
        whole budget, and the whole group's calls with it (a kill -9 during a store outage took 8.9 s to
        take over instead of under 1 s)."""
        async def settle_and_commit() -> None:
            await self.settle_ending(tps, min(HANDOVER_SETTLE_S, budget_s / 2))
            await commit()

        began = time.monotonic()
        task = asyncio.ensure_future(settle_and_commit())
        why = ""
        try:
            while not task.done() and not why:
                waited = time.monotonic() - began
                if waited >= budget_s:
                    why = "store or broker slow"
                elif waited >= STORE_HICCUP_S and store_failing():
                    why = "the store refuses writes"
                else:
                    await asyncio.wait({task}, timeout=min(HANDOVER_POLL_S, budget_s - waited))
        finally:
            if not task.done():  # given up here, or this hand-over was cancelled: nothing of it runs on
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if why:
            log.warning("hand-over of %d partitions not durable within %.1f s (%s): the next owner replays "
                        "from the last commit", len(tps), time.monotonic() - began, why)
        elif (exc := task.exception()) is not None:  # the next owner replays from the last commit instead
            log.warning("commit before handing over %d partitions failed: %s", len(tps), describe_error(exc))
        self.on_revoking(tps)

    def on_revoking(self, tps: set[TopicPartition]) -> None:
        """A rebalance revoked ``tps``; the caller made durable and committed what it could first. Calls
        still ending there are stopped (else their QA could be published here and by a next owner); the
        others are kept, paused, until ``on_assigned`` tells which partitions stayed."""
        if not self.settings.keep_calls_on_rebalance:
            self.on_revoked(tps)
            return
        partitions = {p for _, p in tps}
        # Frames held for a partition's checkpoints stay: if it stays here they go first, before newer frames
        # of it fetched before the rebalance (those would otherwise open its calls past the held ones, whose
        # audio, read again from the commit, came too late: silence); if it moves, on_revoked drops them.
        self.registry.suspend(partitions, self.registry.stop_ending(partitions))

    def on_revoked(self, tps: set[TopicPartition]) -> None:
        """Partitions taken away: their calls stop here (their new owner resumes them from their
        checkpoints), and their positions, holds, clocks and checkpoints are forgotten. The caller makes
        durable and commits what it can first (``make_durable``); nothing of these is committed after."""
        partitions = {p for _, p in tps}
        self.waiting.drop(partitions)
        self.registry.suspended -= partitions
        self.registry.drop_partitions(partitions)
        self.durability.forget_partitions(partitions)
        revoked = {(t, p) for t in (self.settings.topic_audio, self.settings.topic_call_events) for p in partitions}
        self.offsets.forget(revoked | set(tps))
        self.clock.forget(revoked | set(tps))

    async def _call_for(self, call_id: str, tp: TopicPartition) -> CallState | None:
        """The open call ``call_id`` (resumed or new), or None once it is finished (tests race two)."""
        return await self.registry.call_for(call_id, tp)
