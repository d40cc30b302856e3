"""Checkpoints and commits: a call's input offsets are released only up to what is durable.

That is its checkpoint (checkpoints.py; taken between segments, written once the segments before it are
produced, acknowledged by Kafka and flushed into ClickHouse), and at its end its "finished" record (ended,
aborted or closed for inactivity alike). A crash or a rebalance therefore replays an open call from its
last checkpoint (at most an open segment per leg and a commit interval of audio) and, the pipeline being
deterministic, yields the same segment ids, which the ReplacingMergeTree tables deduplicate.

A "finished" record carries the positions after all of its call's input (audio and events). It is
deleted (a tombstone on the compacted topic) once the commits of whoever owns the partition have passed
both: no replay can reach the call then. The worker that finished the call does that; if the partition
moved first, its next owner does, from the positions in the record. So the checkpoint topic holds one
record per open call, plus finished calls whose input is not yet committed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import Any

from pipeline.config import Settings
from pipeline.contracts.messages import CallCheckpoint
from pipeline.store.base import RowSink
from pipeline.worker.checkpoints import (
    CheckpointStore,
    LegSnapshot,
    call_checkpoint,
    checkpoint_written,
    due_checkpoint,
    leg_is_quiet,
    leg_position_ms,
    published_record,
    take_leg_snapshot,
)
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.offsets import OffsetTracker, TopicPartition
from pipeline.worker.registry import CallRegistry
from pipeline.worker.state import CallState
from pipeline.worker.tasks import CallTasks


@dataclass(frozen=True)
class FinishedRecord:
    """A finished call's record, to delete once the commit is past these positions of its input."""

    call_id: str
    audio_tp: TopicPartition
    audio_end: int
    events_tp: TopicPartition
    events_end: int


class CallDurability:
    """Takes leg snapshots, writes checkpoints and finished records, and moves the calls' holds on input."""

    def __init__(self, settings: Settings, registry: CallRegistry, offsets: OffsetTracker,
                 checkpoints: CheckpointStore, sink: RowSink, tasks: CallTasks, metrics: WorkerMetrics) -> None:
        self.settings = settings
        self.registry = registry
        self.offsets = offsets
        self.checkpoints = checkpoints
        self.sink = sink
        self.tasks = tasks
        self.metrics = metrics
        self._forgettable: list[FinishedRecord] = []
        self._lock = asyncio.Lock()

    def take_snapshots(self, calls: Iterable[CallState]) -> None:
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

    async def make_durable(self) -> dict[TopicPartition, int]:
        """Make finished calls and due checkpoints durable, move the offsets they hold; return what may
        be committed.

        Order matters: a call's outputs are acknowledged by Kafka and flushed into ClickHouse, then its
        checkpoint (or "finished" record) is acknowledged, and only then its hold on the input moves.
        """
        async with self._lock:
            if self.tasks.failures:  # results may be incomplete: nothing more is committed; a restart replays
                return {}
            if self.registry.suspended:  # a rebalance is under way: nothing moves until its assignment
                return {}
            self._inherit_finished()
            await self._forget_committed()
            ready = [c for c in self.registry.awaiting_release if not c.pending and not c.failed]
            due = [(c, legs) for c in self.registry.calls.values() if not c.finishing and not c.failed
                   if (legs := due_checkpoint(c)) is not None]
            if not ready and not due:
                return self.offsets.committable()
            calls = ready + [c for c, _ in due]
            delivered: list[Awaitable[Any]] = [d for call in calls for d in call.deliveries]
            await asyncio.gather(*delivered)
            # Dropped only once awaited: a hand-over that gives up here (bounded) leaves them to the next try.
            done = {id(d) for d in delivered}
            for call in calls:
                call.deliveries = [d for d in call.deliveries if id(d) not in done]
            await self.sink.flush()
            # A rebalance may have moved partitions while this waited: their calls were dropped here and are
            # their next owner's (replayed from the last commit); a record for one would find no transaction
            # (a worker crashed on that in a scale-out test).
            due = [(c, legs) for c, legs in due if self.registry.calls.get(c.call_id) is c]
            ready = [c for c in ready if c in self.registry.awaiting_release]
            saved = [await self._save(c, self._recorded(call_checkpoint(c, "open", legs), c, legs)) for c, legs in due]
            saved += [await self._save(c, self._finished_record(c)) for c in ready]
            await asyncio.gather(*saved)
            for call, legs in due:
                self._checkpointed(call, legs)
            for call in ready:
                if call in self.registry.awaiting_release:  # else handed over in a rebalance meanwhile
                    self._released(call)
            return self.offsets.committable()

    async def record_published(self, partitions: set[int]) -> None:
        """Exactly once: for each call on ``partitions`` that published since its last record, its latest
        checkpoint again with what it has published (``published_record``), in the same transaction as
        those outputs. Its hold on the input does not move: a replay from the commit decodes those
        segments again and publishes none of them. The caller holds ``CallOutputs.publishing``."""
        calls = [c for c in [*self.registry.calls.values(), *self.registry.awaiting_release]
                 if c.unrecorded and not c.failed and c.audio_tp is not None and c.audio_tp[1] in partitions]
        for call in calls:
            await self._save(call, self._recorded(published_record(call), call))
            self.metrics.checkpoints.labels("published").inc()

    @staticmethod
    def _recorded(checkpoint: CallCheckpoint, call: CallState,
                  legs: dict[str, LegSnapshot] | None = None) -> CallCheckpoint:
        """``checkpoint`` (with ``legs``, a new one) lists what ``call`` has published so far (taken in the
        same step: nothing is published in between)."""
        call.unrecorded = False
        if legs is not None:
            call.recorded_legs = dict(legs)
        return checkpoint

    def forget_partitions(self, partitions: set[int]) -> None:
        """Partitions taken away: their finished records are their next owner's to delete."""
        self._forgettable = [f for f in self._forgettable if f.audio_tp[1] not in partitions]

    async def _save(self, call: CallState, checkpoint: CallCheckpoint) -> Awaitable[Any]:
        assert call.audio_tp is not None
        return await self.checkpoints.save(call.audio_tp[1], call.call_id, checkpoint)

    def _checkpointed(self, call: CallState, legs: dict[str, LegSnapshot]) -> None:
        """An open call's checkpoint is durable: its hold on the input moves up to what the checkpoint needs."""
        if self.registry.calls.get(call.call_id) is not call:
            return  # ended or handed over meanwhile: its later record or new owner takes over
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

    def _finished_record(self, call: CallState) -> CallCheckpoint:
        """The call's "finished" record, with the positions after all of its input."""
        assert call.audio_tp is not None
        record = call_checkpoint(call, "finished", end_reason=call.end_reason)
        record.resume_offset = self.offsets.consumed_up_to(call.audio_tp) or 0
        record.events_end_offset = self.offsets.consumed_up_to(self._events_tp(call.audio_tp[1])) or 0
        return record

    def _events_tp(self, partition: int) -> TopicPartition:
        return (self.settings.topic_call_events, partition)

    def _released(self, call: CallState) -> None:
        """A finished call is durable: its input offsets are free, its record deleted once committed past."""
        assert call.audio_tp is not None
        events_tp = self._events_tp(call.audio_tp[1])
        self.offsets.release(call.call_id)
        self.registry.awaiting_release.remove(call)
        self.metrics.checkpoints.labels("finished").inc()
        # Every frame and event of it is before these positions (frames after its end are dropped).
        self._forgettable.append(FinishedRecord(
            call.call_id, call.audio_tp, self.offsets.consumed_up_to(call.audio_tp) or 0,
            events_tp, self.offsets.consumed_up_to(events_tp) or 0))

    def _inherit_finished(self) -> None:
        """Finished records read on assignment (a previous owner's): deleted here once committed past.
        One without positions (an older version's) waits for positions this worker has read to."""
        waiting: list[tuple[int, CallCheckpoint]] = []
        for partition, record in self.registry.inherited_finished:
            audio_tp, events_tp = (self.settings.topic_audio, partition), self._events_tp(partition)
            audio_end, events_end = record.resume_offset, record.events_end_offset
            if audio_end < 0 or events_end < 0:
                audio_end, events_end = (self.offsets.consumed_up_to(audio_tp) or -1,
                                         self.offsets.consumed_up_to(events_tp) or -1)
            if audio_end < 0 or events_end < 0:
                waiting.append((partition, record))
                continue
            self._forgettable.append(FinishedRecord(record.call_id, audio_tp, audio_end, events_tp, events_end))
        self.registry.inherited_finished = waiting

    async def _forget_committed(self) -> None:
        """Delete the "finished" records of calls whose input is all committed: no replay can reach it."""
        keep: list[FinishedRecord] = []
        forget: list[FinishedRecord] = []
        for record in self._forgettable:
            done = (self.offsets.committed_at(record.audio_tp) >= record.audio_end
                    and self.offsets.committed_at(record.events_tp) >= record.events_end)
            (forget if done else keep).append(record)
        self._forgettable = keep
        await asyncio.gather(*[await self.checkpoints.save(r.audio_tp[1], r.call_id, None) for r in forget])
