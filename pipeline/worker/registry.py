"""Which calls this worker holds, and in what state: open, awaiting release, closed, finished.

A call is opened on its first frame or event: new, or resumed from its checkpoint (read once per audio
partition, on assignment or at the partition's first message), or reopened from memory when frames come
after it was closed for inactivity. A call whose checkpoint says "finished" is not opened again: its
results are stored already, so replayed input of it is dropped. Partitions taken away in a rebalance
take their calls with them (their next owner resumes them from their checkpoints).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable

from pipeline.asr.engine import LegFrontEnd
from pipeline.config import Settings
from pipeline.contracts.messages import CallCheckpoint
from pipeline.qa.call import CallAnalyzer, QaConfig
from pipeline.worker.checkpoints import CheckpointStore, call_checkpoint, restore_call
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.offsets import TopicPartition
from pipeline.worker.state import CallState
from pipeline.worker.tasks import stop_call

log = logging.getLogger("callqa.worker")

# Calls closed for inactivity that this process can still reopen from memory (their checkpoints are
# on the checkpoint topic too, for another owner).
MAX_CLOSED_CALLS = 10_000
MAX_FINISHED_CALLS = 100_000  # ids of recently finished calls whose late input is dropped


class CallRegistry:
    """The calls of the partitions this worker owns, by id."""

    def __init__(self, settings: Settings, qa_config: QaConfig, front_ends: Callable[[int, str], LegFrontEnd],
                 checkpoints: CheckpointStore, metrics: WorkerMetrics) -> None:
        self.settings = settings
        self.qa_config = qa_config
        self.front_ends = front_ends
        self.checkpoints = checkpoints
        self.metrics = metrics
        self.calls: dict[str, CallState] = {}
        self.finished: OrderedDict[str, None] = OrderedDict()  # recently finished calls (bounded)
        self.awaiting_release: list[CallState] = []  # completed, until their outputs are durable
        # Calls closed for inactivity, by id: (audio partition, checkpoint); reopened if frames still come.
        self.closed: OrderedDict[str, tuple[int, CallCheckpoint]] = OrderedDict()
        # Where calls resume after a crash or rebalance, read per audio partition.
        self.resume_points: dict[int, dict[str, CallCheckpoint]] = {}
        self._loading: dict[int, asyncio.Task[None]] = {}
        # Partitions this worker owns (None: not told, e.g. without Kafka): input of others is ignored,
        # such as a batch that was already taken when its partition was revoked.
        self.owned: set[int] | None = None

    def owns(self, tp: TopicPartition) -> bool:
        return self.owned is None or tp[1] in self.owned

    async def call_for(self, call_id: str, tp: TopicPartition) -> CallState | None:
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
            self.remember_finished(call_id)  # frames of a call whose results are stored already
            return None
        if checkpoint is None:
            call = CallState(call_id)
            call.analyzer = CallAnalyzer(call_id, self.qa_config)
        else:
            call = self._resume(checkpoint)
        call.audio_tp = (self.settings.topic_audio, tp[1])
        self.calls[call_id] = call
        return call

    def retire(self, call: CallState, how: str) -> None:
        """The call's results are out: it leaves the open calls and awaits release (durability)."""
        if how == "timeout" and call.audio_tp is not None:
            # Frames may still come (a hold longer than the timeout): keep what resuming the call needs.
            call.closed_checkpoint = call_checkpoint(call, "closed", end_reason=how)
            self.closed[call.call_id] = (call.audio_tp[1], call.closed_checkpoint)
            while len(self.closed) > MAX_CLOSED_CALLS:
                self.closed.popitem(last=False)
        else:
            self.remember_finished(call.call_id)
        call.legs.clear()  # audio buffers and VAD state are not needed while the call awaits release
        del self.calls[call.call_id]
        self.awaiting_release.append(call)

    def remember_finished(self, call_id: str) -> None:
        self.finished[call_id] = None
        while len(self.finished) > MAX_FINISHED_CALLS:
            self.finished.popitem(last=False)

    def on_assigned(self, tps: set[TopicPartition]) -> None:
        """New partitions: read their checkpoints before any of their calls is opened."""
        self.metrics.rebalances.inc()
        self.owned = {p for _, p in tps}  # an assignment is the whole new set
        for topic, partition in tps:
            if topic == self.settings.topic_audio and partition not in self._loading:
                self._loading[partition] = asyncio.create_task(self._load_resume_points(partition))

    def ending_tasks(self, partitions: set[int]) -> list[asyncio.Task[None]]:
        """The pending tasks of calls already ending on ``partitions``."""
        return [t for c in [*self.calls.values(), *self.awaiting_release]
                if c.finishing and c.audio_tp is not None and c.audio_tp[1] in partitions for t in c.pending]

    def drop_partitions(self, partitions: set[int]) -> None:
        """Partitions taken away: their calls stop here, their closed calls and checkpoints are forgotten."""
        if self.owned is not None:
            self.owned -= partitions

        def on_revoked_partition(call: CallState) -> bool:
            return call.audio_tp is not None and call.audio_tp[1] in partitions

        for call in [c for c in self.calls.values() if on_revoked_partition(c)]:
            stop_call(call)
            del self.calls[call.call_id]
            self.metrics.calls_dropped.inc()
        for call in [c for c in self.awaiting_release if on_revoked_partition(c)]:
            stop_call(call)
            self.awaiting_release.remove(call)
        for call_id in [k for k, (p, _) in self.closed.items() if p in partitions]:
            del self.closed[call_id]
        for partition in partitions:
            self.resume_points.pop(partition, None)
            loading = self._loading.pop(partition, None)
            if loading is not None:
                loading.cancel()

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
