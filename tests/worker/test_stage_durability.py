"""CallDurability (pipeline/worker/durability.py): offsets are released only up to what is durable, in
order (outputs delivered and stored, then the checkpoint or record, then the hold moves). In-memory
checkpoint store and ports; real leg front ends; no Kafka."""

from __future__ import annotations

import asyncio

from pipeline.asr.engine import LegFrontEnd
from pipeline.config import Settings
from pipeline.contracts.messages import CallCheckpoint
from pipeline.qa.call import QaConfig
from pipeline.worker.checkpoints import MemoryCheckpointStore
from pipeline.worker.durability import CallDurability
from pipeline.worker.legs import LegState
from pipeline.worker.memory import MemoryPorts
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.offsets import OffsetTracker
from pipeline.worker.registry import CallRegistry
from pipeline.worker.state import CallState
from pipeline.worker.tasks import CallTasks

SETTINGS = Settings(topic_audio="audio", topic_call_events="events")
AUDIO, EVENTS = ("audio", 1), ("events", 1)
SILENCE = b"\xff" * 160  # 20 ms of mu-law silence at 8 kHz


class Stage:
    def __init__(self) -> None:
        self.metrics, self.offsets, self.store = WorkerMetrics(), OffsetTracker(), MemoryCheckpointStore()
        self.tasks = CallTasks(self.metrics)
        self.registry = CallRegistry(SETTINGS, QaConfig.from_settings(SETTINGS), self.front_end, self.store,
                                     self.metrics)
        self.durability = CallDurability(SETTINGS, self.registry, self.offsets, self.store, MemoryPorts(),
                                         self.tasks, self.metrics)

    @staticmethod
    def front_end(rate: int, encoding: str) -> LegFrontEnd:
        return LegFrontEnd(rate, encoding, SETTINGS)

    async def open_call(self, frames: int) -> CallState:
        """A call with a start event and ``frames`` frames of silence on its agent leg."""
        call = await self.registry.call_for("c1", AUDIO)
        assert call is not None
        self.offsets.consumed(EVENTS, 0, "c1")
        leg = call.legs["agent"] = LegState.open("c1", "agent", self.front_end(8000, "mulaw"), 20,
                                                 SETTINGS.max_segment_ms, SETTINGS.reorder_window_ms)
        for seq in range(frames):
            self.offsets.consumed(AUDIO, seq, "c1")
            leg.release(seq, SILENCE, seq * 20)
        return call

    def checkpoints(self, status: str) -> float:
        return self.metrics.registry.get_sample_value("callqa_checkpoints_total", {"status": status}) or 0.0


async def test_a_finished_call_is_released_once_its_outputs_are_delivered_and_its_record_saved() -> None:
    stage = Stage()
    call = await stage.open_call(10)
    delivery: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    call.deliveries.append(delivery)
    stage.registry.retire(call, "end")
    durable = asyncio.create_task(stage.durability.make_durable())
    for _ in range(10):
        await asyncio.sleep(0)
    assert not durable.done() and "c1" not in stage.store.partitions.get(1, {})
    delivery.set_result(None)
    assert await durable == {AUDIO: 10, EVENTS: 1}
    assert stage.store.partitions[1]["c1"].status == "finished" and stage.checkpoints("finished") == 1
    assert stage.registry.awaiting_release == []
    # Once the commit has passed all of its input, no replay reaches the call: its record goes.
    stage.offsets.committed({AUDIO: 10, EVENTS: 1})
    await stage.durability.make_durable()
    assert "c1" not in stage.store.partitions[1]


async def test_a_call_closed_for_inactivity_leaves_a_finished_record_that_goes_once_committed_past() -> None:
    stage = Stage()
    call = await stage.open_call(10)
    stage.registry.retire(call, "timeout")
    assert await stage.durability.make_durable() == {AUDIO: 10, EVENTS: 1}
    record = stage.store.partitions[1]["c1"]
    assert (record.status, record.end_reason) == ("finished", "timeout") and not record.legs
    assert (record.resume_offset, record.events_end_offset) == (10, 1)  # after all of its input
    stage.offsets.committed({AUDIO: 10, EVENTS: 1})
    await stage.durability.make_durable()
    assert "c1" not in stage.store.partitions[1]


async def test_a_finished_record_inherited_from_a_previous_owner_is_deleted_once_committed_past() -> None:
    stage = Stage()
    await (await stage.store.save(1, "gone", CallCheckpoint("gone", "finished", resume_offset=40, events_end_offset=3)))
    stage.registry.on_assigned({AUDIO, EVENTS})
    assert await stage.registry.call_for("gone", AUDIO) is None  # its replayed input opens nothing
    stage.offsets.consumed(AUDIO, 45, None)
    stage.offsets.consumed(EVENTS, 2, None)
    await stage.durability.make_durable()
    stage.offsets.committed({AUDIO: 46, EVENTS: 3})
    assert "gone" in stage.store.partitions[1]  # the next pass sees the commit
    await stage.durability.make_durable()
    assert "gone" not in stage.store.partitions[1]


async def test_an_open_calls_checkpoint_moves_its_hold_to_the_snapshot() -> None:
    stage = Stage()
    call = await stage.open_call(100)  # 2 s of audio: a checkpoint interval
    assert await stage.durability.make_durable() == {AUDIO: 0, EVENTS: 0}  # held at the call's first messages
    stage.durability.take_snapshots([call])
    assert await stage.durability.make_durable() == {AUDIO: 100, EVENTS: 1}
    record = stage.store.partitions[1]["c1"]
    assert (record.status, record.resume_offset) == ("open", 100) and stage.checkpoints("open") == 1
    assert "c1" in stage.registry.calls  # it goes on


async def test_a_snapshot_waits_for_the_segments_announced_before_it() -> None:
    stage = Stage()
    call = await stage.open_call(100)
    call.announced["agent"], call.unresolved = ["c1/agent/000000000"], {"c1/agent/000000000"}
    stage.durability.take_snapshots([call])
    assert await stage.durability.make_durable() == {AUDIO: 0, EVENTS: 0}
    call.unresolved.clear()  # emitted: its rows are written
    assert await stage.durability.make_durable() == {AUDIO: 100, EVENTS: 1}


async def test_nothing_is_committed_once_anything_failed() -> None:
    stage = Stage()
    call = await stage.open_call(10)
    stage.registry.retire(call, "end")
    stage.tasks.fail("frame batch failed")
    assert await stage.durability.make_durable() == {} and stage.registry.awaiting_release == [call]


async def test_a_failed_call_is_never_released() -> None:
    stage = Stage()
    call = await stage.open_call(10)
    call.failed = True
    stage.registry.retire(call, "end")
    assert await stage.durability.make_durable() == {AUDIO: 0, EVENTS: 0}
    assert stage.registry.awaiting_release == [call] and "c1" not in stage.store.partitions.get(1, {})


async def test_a_call_dropped_while_its_outputs_were_awaited_gets_no_checkpoint() -> None:
    """A rebalance moved the call's partition while make_durable awaited its outputs: no record for it (the
    next owner replays it from the last commit; a record for a partition no longer owned found no
    transaction and crashed a worker in the scale-out test)."""
    stage = Stage()
    call = await stage.open_call(100)
    await stage.durability.make_durable()
    stage.durability.take_snapshots([call])
    delivered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    call.deliveries = [delivered]
    durable = asyncio.create_task(stage.durability.make_durable())
    await asyncio.sleep(0)
    stage.registry.drop_partitions({AUDIO[1]})  # the rebalance moved it meanwhile
    delivered.set_result(None)
    await durable
    assert stage.checkpoints("open") == 0 and "c1" not in stage.store.partitions.get(1, {})
