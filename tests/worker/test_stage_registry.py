"""CallRegistry (pipeline/worker/registry.py): which calls a worker holds, opened new or from checkpoints,
and what a rebalance takes away. In-memory checkpoint store; no Kafka."""

from __future__ import annotations

import asyncio

from pipeline.asr.engine import LegFrontEnd
from pipeline.config import Settings
from pipeline.contracts.messages import CallCheckpoint, CheckpointSegment
from pipeline.qa.call import QaConfig
from pipeline.worker.checkpoints import MemoryCheckpointStore
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.registry import CallRegistry

AUDIO, EVENTS = ("audio", 3), ("events", 3)


def _no_front_end(rate: int, encoding: str) -> LegFrontEnd:
    raise AssertionError("no leg is opened here")


def _registry(store: MemoryCheckpointStore | None = None) -> tuple[CallRegistry, MemoryCheckpointStore, WorkerMetrics]:
    settings, metrics = Settings(topic_audio="audio", topic_call_events="events"), WorkerMetrics()
    store = store or MemoryCheckpointStore()
    return CallRegistry(settings, QaConfig.from_settings(settings), _no_front_end, store, metrics), store, metrics


async def test_a_new_call_opens_once_on_its_audio_partition_with_an_analyzer() -> None:
    registry, _, _ = _registry()
    call = await registry.call_for("c1", EVENTS)  # an event may come first: the call is on audio partition 3
    assert call is not None and call.analyzer is not None and call.audio_tp == AUDIO
    assert await registry.call_for("c1", AUDIO) is call and registry.calls == {"c1": call}


async def test_two_agents_opening_one_call_at_once_get_the_same_call() -> None:
    registry, _, _ = _registry()
    a, b = await asyncio.gather(registry.call_for("c1", AUDIO), registry.call_for("c1", EVENTS))
    assert a is b is registry.calls["c1"]


async def test_a_call_finished_before_is_not_opened_again() -> None:
    store = MemoryCheckpointStore()
    await (await store.save(3, "c1", CallCheckpoint("c1", "finished")))
    registry, _, _ = _registry(store)
    assert await registry.call_for("c1", AUDIO) is None
    assert await registry.call_for("c1", AUDIO) is None and "c1" in registry.finished and not registry.calls


async def test_a_call_resumes_from_its_checkpoint_with_its_segments() -> None:
    store = MemoryCheckpointStore()
    segment = CheckpointSegment("c1/agent/000000000", "agent", 0, 900, "hello")
    await (await store.save(3, "c1", CallCheckpoint("c1", "open", segments=[segment], segments_done=1)))
    registry, _, metrics = _registry(store)
    call = await registry.call_for("c1", AUDIO)
    assert call is not None and call.segments_done == 1 and call.announced == {"agent": ["c1/agent/000000000"]}
    assert call.analyzer is not None and [s.text for s in call.analyzer.segments] == ["hello"]
    assert metrics.registry.get_sample_value("callqa_calls_resumed_total") == 1


async def test_a_call_closed_for_inactivity_is_finished_once_and_its_late_frames_open_nothing() -> None:
    registry, _, _ = _registry()
    call = await registry.call_for("c1", AUDIO)
    assert call is not None
    registry.retire(call, "timeout")
    assert not registry.calls and registry.awaiting_release == [call] and call.end_reason == "timeout"
    assert await registry.call_for("c1", AUDIO) is None and "c1" in registry.finished


async def test_a_closed_record_of_an_older_version_is_read_as_finished() -> None:
    store = MemoryCheckpointStore()
    await (await store.save(3, "c1", CallCheckpoint("c1", "closed", end_reason="timeout")))
    registry, _, metrics = _registry(store)
    assert await registry.call_for("c1", AUDIO) is None and not registry.calls
    assert metrics.registry.get_sample_value("callqa_calls_resumed_total") == 0
    # It is the new owner's to delete (a tombstone) once its commits pass the call's input.
    assert [(p, c.call_id) for p, c in registry.inherited_finished] == [(3, "c1")]


async def test_a_call_that_ended_stays_finished() -> None:
    registry, _, _ = _registry()
    call = await registry.call_for("c1", AUDIO)
    assert call is not None
    registry.retire(call, "end")
    assert await registry.call_for("c1", AUDIO) is None and registry.awaiting_release == [call]


async def test_revoked_partitions_take_their_calls_and_input_of_them_is_ignored() -> None:
    registry, _, metrics = _registry()
    registry.on_assigned({AUDIO, EVENTS, ("audio", 4), ("events", 4)})
    kept, dropped = await registry.call_for("c4", ("audio", 4)), await registry.call_for("c3", AUDIO)
    assert kept is not None and dropped is not None
    waiting = asyncio.create_task(asyncio.Event().wait())
    dropped.pending.add(waiting)
    registry.drop_partitions({3})
    await asyncio.sleep(0)
    assert registry.calls == {"c4": kept} and dropped.finishing and waiting.cancelled()
    assert not registry.owns(AUDIO) and registry.owns(("audio", 4))
    assert metrics.registry.get_sample_value("callqa_calls_dropped_on_revoke_total") == 1


async def test_a_rebalance_keeps_the_calls_of_partitions_that_come_back_and_drops_those_that_moved() -> None:
    registry, _, metrics = _registry()
    registry.on_assigned({AUDIO, EVENTS, ("audio", 4), ("events", 4)})
    stays, moves = await registry.call_for("c3", AUDIO), await registry.call_for("c4", ("audio", 4))
    assert stays is not None and moves is not None
    registry.suspend({3, 4}, registry.stop_ending({3, 4}))
    assert registry.calls == {"c3": stays, "c4": moves}  # paused, not dropped, until the assignment
    consumed = {AUDIO: 120, EVENTS: 7, ("audio", 4): 50, ("events", 4): 2}
    moved = registry.settle_assignment({AUDIO, EVENTS}, consumed)
    assert moved == {4} and not registry.suspended
    assert metrics.registry.get_sample_value("callqa_calls_kept_on_rebalance_total") == 1
    # Input of the kept partition read again from the last commit is skipped up to where it was read.
    assert registry.replayed(AUDIO, 119) and not registry.replayed(AUDIO, 120)
    assert registry.replayed(EVENTS, 6) and not registry.replayed(("audio", 4), 10)


async def test_a_call_still_ending_at_a_revocation_is_stopped_and_its_partition_is_read_again() -> None:
    store = MemoryCheckpointStore()
    segment = CheckpointSegment("c3/agent/000000000", "agent", 0, 900, "hello")
    await (await store.save(3, "c3", CallCheckpoint("c3", "open", segments=[segment], segments_done=1)))
    registry, _, _ = _registry(store)
    registry.on_assigned({AUDIO, EVENTS})
    ending = await registry.call_for("c3", AUDIO)
    assert ending is not None and ending.segments_done == 1
    ending.finishing = True
    registry.suspend({3}, registry.stop_ending({3}))
    assert not registry.calls and "c3" not in registry.finished
    registry.settle_assignment({AUDIO, EVENTS}, {AUDIO: 120, EVENTS: 7})
    registry.on_assigned({AUDIO, EVENTS})
    # Its input must reach the call again: no replay floor there, and it reopens from its checkpoint (read
    # again: the first read was used up when it opened), not as a new call whose first seconds are gone.
    assert not registry.replayed(AUDIO, 0) and not registry.replayed(EVENTS, 0)
    reopened = await registry.call_for("c3", AUDIO)
    assert reopened is not None and reopened is not ending and reopened.segments_done == 1


async def test_a_resumed_call_keeps_its_holds_through_the_checkpoint_topics_encoding() -> None:
    from pipeline.contracts import Serde
    from pipeline.qa.call import CallAnalyzer
    from pipeline.worker.checkpoints import call_checkpoint
    from pipeline.worker.state import CallState

    held = CallState("c1")
    held.analyzer = CallAnalyzer("c1", QaConfig.from_settings(Settings()))
    held.holds_ms, held.held_from_ms, held.resumed_at_ms = [(10_000, 40_000)], 70_000, 1_700_000_040_000
    serde = Serde.from_settings()
    record = serde.decode(serde.encode(call_checkpoint(held, "open")), CallCheckpoint)
    store = MemoryCheckpointStore()
    await (await store.save(3, "c1", record))
    registry, _, _ = _registry(store)
    call = await registry.call_for("c1", AUDIO)
    # Their events are behind the commit once the checkpoint is durable: only the checkpoint brings them back.
    assert call is not None and call.holds_ms == [(10_000, 40_000)] and call.held_from_ms == 70_000
    assert call.resumed_at_ms == 1_700_000_040_000 and call.hold_intervals(90_000) == [(10_000, 40_000), (70_000, 90_000)]


async def test_a_partition_revoked_while_its_checkpoints_are_read_opens_no_call() -> None:
    # A batch that waited for the read must not open (and so consume and later commit) a call of a
    # partition this worker no longer owns: its next owner reads that input from the commit.
    gate = asyncio.Event()

    class SlowStore(MemoryCheckpointStore):
        async def load(self, partition: int) -> dict[str, CallCheckpoint]:
            await gate.wait()
            return await super().load(partition)

    registry, _, _ = _registry(SlowStore())
    registry.on_assigned({AUDIO, EVENTS, ("audio", 4), ("events", 4)})
    waiting = asyncio.create_task(registry.call_for("c3", AUDIO))
    await asyncio.sleep(0)
    registry.on_assigned({("audio", 4), ("events", 4)})  # partition 3 is someone else's now
    registry.drop_partitions({3})
    gate.set()
    assert await waiting is None and not registry.calls and "c3" not in registry.finished
