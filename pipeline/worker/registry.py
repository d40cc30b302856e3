"""Which calls this worker holds, and in what state: open, awaiting release, finished.

A call is opened on its first frame or event: new, or resumed from its checkpoint (read once per audio
partition, on assignment or at the partition's first message). A call whose checkpoint says "finished"
is not opened again: its results are stored already, so replayed input of it is dropped. A call closed
for inactivity is finished like one that ended: it is finished once, whoever closes it; frames of it that
still come are dropped and counted (``after_call_end``), as after an end event.

Rebalances (faust's consumer is eager: every rebalance revokes every partition): the calls of revoked
partitions are kept, paused, until the new assignment arrives (``suspend``); then only the calls of
partitions that moved are dropped (their next owner resumes them from their checkpoints), and the input
that is fetched again from the last commit on a partition that stayed is skipped up to where this worker
had read it (``replayed``): those calls' state already holds it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from pipeline.asr.engine import LegFrontEnd
from pipeline.config import Settings
from pipeline.contracts.messages import CallCheckpoint
from pipeline.qa.call import CallAnalyzer, QaConfig
from pipeline.worker.checkpoints import CheckpointStore, restore_call
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.offsets import TopicPartition
from pipeline.worker.state import CallState
from pipeline.worker.tasks import stop_call

log = logging.getLogger("callqa.worker")

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
        # Where calls resume after a crash or rebalance, read per audio partition.
        self.resume_points: dict[int, dict[str, CallCheckpoint]] = {}
        self._loading: dict[int, asyncio.Task[None]] = {}
        # Partitions this worker owns (None: not told, e.g. without Kafka): input of others is ignored,
        # such as a batch that was already taken when its partition was revoked.
        self.owned: set[int] | None = None
        # Partitions revoked by the rebalance under way, whose calls wait for the next assignment.
        self.suspended: set[int] = set()
        self._unfloored: set[int] = set()  # suspended partitions where a call had to be stopped
        # Per input partition kept across a rebalance: the first offset this worker has not read; input
        # below it, fetched again from the last commit, is already in its calls' state.
        self.replay_floor: dict[TopicPartition, int] = {}
        # "finished" records read from the checkpoint topic that this worker should delete (a previous
        # owner could not: its commit had not passed the call's input when the partition moved).
        self.inherited_finished: list[tuple[int, CallCheckpoint]] = []

    def owns(self, tp: TopicPartition) -> bool:
        return self.owned is None or tp[1] in self.owned

    async def call_for(self, call_id: str, tp: TopicPartition) -> CallState | None:
        """The open call ``call_id`` (resumed from its checkpoint, or new), or None once it is finished (or
        its partition was revoked while this waited for the partition's checkpoints: check ``owns``)."""
        call = self.calls.get(call_id)
        if call is not None:
            return call
        if call_id in self.finished:
            return None
        await self._resume_points_ready(tp[1])
        if not self.owns(tp):
            return None  # revoked while this waited: its next owner opens the call (the caller consumes nothing)
        # The audio and the events agent both run this; the other may have opened the call while this
        # one waited for the partition's checkpoints, so look again (no await from here on).
        call = self.calls.get(call_id)
        if call is not None or call_id in self.finished:
            return call
        checkpoint = self.resume_points.get(tp[1], {}).pop(call_id, None)
        if checkpoint is not None and checkpoint.status != "open":
            # "finished", or "closed" (an inactivity close written by an older version, which reopened
            # such calls): either way its results are stored, and it is not finished a second time.
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
        call.end_reason = how
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
        self.inherited_finished = [(p, c) for p, c in self.inherited_finished if p not in partitions]
        self.replay_floor = {tp: o for tp, o in self.replay_floor.items() if tp[1] not in partitions}
        for partition in partitions:
            self.resume_points.pop(partition, None)
            loading = self._loading.pop(partition, None)
            if loading is not None:
                loading.cancel()

    def _resume(self, checkpoint: CallCheckpoint) -> CallState:
        call = restore_call(checkpoint, self.qa_config, self.front_ends, self.settings.max_segment_ms,
                            self.settings.reorder_window_ms)
        self.metrics.calls_resumed.inc()
        return call

    # ---- rebalances ------------------------------------------------------------------------------
    def suspend(self, partitions: set[int], ending: set[int]) -> None:
        """Partitions revoked, the next assignment not known yet: their calls stay, paused (no closes, no
        checkpoints) until ``on_assigned``. ``ending``: partitions where a call still ending was stopped
        (see ``stop_ending``); they get no replay floor, since that call's input must be read again."""
        self.suspended |= partitions
        self._unfloored |= ending

    def stop_ending(self, partitions: set[int]) -> set[int]:
        """Calls still ending on ``partitions`` after the hand-over's settle time are stopped, as a moved
        call is (their QA could otherwise be published here and by the next owner); the partitions where
        that happened are returned."""
        hit: set[int] = set()
        for call in [c for c in self.calls.values() if c.finishing and _on(c, partitions)]:
            stop_call(call)
            del self.calls[call.call_id]
            self.finished.pop(call.call_id, None)
            hit.add(call.audio_tp[1])  # type: ignore[index]
            self.metrics.calls_dropped.inc()
        for call in [c for c in self.awaiting_release if c.pending and _on(c, partitions)]:
            stop_call(call)
            self.awaiting_release.remove(call)
            self.finished.pop(call.call_id, None)
            hit.add(call.audio_tp[1])  # type: ignore[index]
        # Their checkpoints were used up when they opened: read the partitions' checkpoints again at the
        # assignment, so a stopped call reopens from its checkpoint (where the commit replays it from), not
        # new from there with its first part missing. Calls still open there stay as they are.
        # (Not cancelled: a partition with calls has read its checkpoints already, and a read still going
        # would only read them again.)
        for partition in hit:
            self.resume_points.pop(partition, None)
            self._loading.pop(partition, None)
        return hit

    def settle_assignment(self, tps: set[TopicPartition], consumed: dict[TopicPartition, int]) -> set[int]:
        """The assignment after a revocation: returns the suspended partitions that moved (for the caller to
        drop); the calls of those that stayed go on, and their input read again is skipped up to
        ``consumed`` (one past the last offset read, per partition)."""
        partitions = {p for _, p in tps}
        moved = self.suspended - partitions
        kept = self.suspended & partitions
        self.replay_floor = {tp: o for tp, o in consumed.items() if tp[1] in kept and tp[1] not in self._unfloored}
        kept_calls = sum(1 for c in self.calls.values() if _on(c, kept))
        self.metrics.calls_kept.inc(kept_calls)
        self.suspended = set()
        self._unfloored = set()
        return moved

    def replayed(self, tp: TopicPartition, offset: int) -> bool:
        """Input this worker read before a rebalance that kept its partition: its calls hold it already."""
        floor = self.replay_floor.get(tp)
        return floor is not None and offset < floor

    def loading_partitions(self) -> set[int]:
        """The partitions whose checkpoints are being read now (an assignment announced them)."""
        return {partition for partition, task in self._loading.items() if not task.done()}

    async def _resume_points_ready(self, partition: int) -> None:
        """Wait until the checkpoints of ``partition`` are read (read now if no assignment announced it)."""
        loading = self._loading.get(partition)
        if loading is None:
            loading = self._loading[partition] = asyncio.create_task(self._load_resume_points(partition))
        try:
            await asyncio.shield(loading)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not loading.cancelled() or (current is not None and current.cancelling()):
                raise
            # The read was cancelled because the partition was revoked (drop_partitions): not an error of
            # the batch that waited for it; the caller sees the partition is no longer owned.

    async def _load_resume_points(self, partition: int) -> None:
        began = time.monotonic()
        points = await self.checkpoints.load(partition)
        self.metrics.checkpoint_load_seconds.observe(time.monotonic() - began)
        self.resume_points[partition] = points
        self.inherited_finished += [(partition, c) for c in points.values() if c.status != "open"]


def _on(call: CallState, partitions: set[int]) -> bool:
    return call.audio_tp is not None and call.audio_tp[1] in partitions
