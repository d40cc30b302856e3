"""A partition whose checkpoints are being read stalls only itself (pipeline/worker/waiting.py): its
frames wait, in order, while the other partitions' frames go on; once read they go first. Kafka-free:
the call core with a checkpoint store whose read of one partition blocks until the test lets it go."""

from __future__ import annotations

import asyncio

from pipeline.asr.engine import LegFrontEnd
from pipeline.config import Settings
from pipeline.contracts.messages import AudioFrame, CallCheckpoint
from pipeline.qa.call import QaConfig
from pipeline.worker.calls import CallProcessor
from pipeline.worker.checkpoints import MemoryCheckpointStore
from pipeline.worker.memory import MemoryPorts

from .test_checkpoints import AudioNamedTranscriber

SILENCE = b"\xff" * 160


class SlowPartitionStore(MemoryCheckpointStore):
    """Reads partition ``slow`` only once ``release`` is set (a big or far checkpoint topic partition)."""

    def __init__(self, slow: int) -> None:
        super().__init__()
        self.slow = slow
        self.release = asyncio.Event()

    async def load(self, partition: int) -> dict[str, CallCheckpoint]:
        if partition == self.slow:
            await self.release.wait()
        return await super().load(partition)


def _processor(settings: Settings, store: SlowPartitionStore) -> CallProcessor:
    ports = MemoryPorts()
    return CallProcessor(settings, AudioNamedTranscriber(), ports, ports,  # type: ignore[arg-type]
                         lambda rate, enc: LegFrontEnd(rate, enc, settings), QaConfig.from_settings(settings),
                         checkpoints=store)


def frames(partition: int, call_id: str, seqs: range) -> list[tuple[tuple[str, int], int, AudioFrame]]:
    return [(("audio", partition), seq, AudioFrame(call_id, "agent", seq, seq * 20, 8000, "mulaw", SILENCE))
            for seq in seqs]


async def test_frames_of_a_partition_still_reading_its_checkpoints_wait_and_the_others_go_on() -> None:
    settings = Settings(topic_audio="audio", topic_call_events="events")
    store = SlowPartitionStore(slow=1)
    processor = _processor(settings, store)
    processor.on_assigned({("audio", 0), ("audio", 1), ("events", 0), ("events", 1)})
    await asyncio.sleep(0)  # partition 0's read is done; partition 1's waits

    mixed = [f for pair in zip(frames(1, "slow-call", range(0, 10)), frames(0, "fast-call", range(0, 10)),
                               strict=True) for f in pair]
    rejected = await asyncio.wait_for(processor.on_frames(mixed), 5)  # it used to wait for partition 1's read
    assert rejected == [] and len(processor.waiting) == 10
    assert "slow-call" not in processor.calls and processor.calls["fast-call"].legs["agent"].frames_released == 10
    assert ("audio", 1) not in processor.offsets.committable()  # held frames are not consumed

    more = await processor.on_frames(frames(1, "slow-call", range(10, 15)) + frames(0, "fast-call", range(10, 15)))
    assert more == [] and len(processor.waiting) == 15  # behind the held ones, in order
    assert await processor.release_waiting() == []  # still reading: nothing to take
    store.release.set()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert await processor.release_waiting() == [] and len(processor.waiting) == 0
    leg = processor.calls["slow-call"].legs["agent"]
    assert leg.frames_released == 15 and leg.reorder.next_seq == 15  # all of them, in order, none dropped
    assert processor.offsets.committable()[("audio", 1)] == 0  # the open call holds its first frame


async def test_a_revoked_partition_drops_its_held_frames_to_read_them_again() -> None:
    settings = Settings(topic_audio="audio", topic_call_events="events", keep_calls_on_rebalance=False)
    store = SlowPartitionStore(slow=1)
    processor = _processor(settings, store)
    processor.on_assigned({("audio", 1), ("events", 1)})
    await processor.on_frames(frames(1, "slow-call", range(0, 5)))
    assert len(processor.waiting) == 5
    processor.on_revoking({("audio", 1), ("events", 1)})
    assert len(processor.waiting) == 0


async def test_held_frames_of_a_partition_kept_through_a_rebalance_go_before_its_newer_frames() -> None:
    # The chaos test's lost call: frames held while partition 1's checkpoints were read were dropped on the
    # revocation; the partition stayed, a batch of newer frames fetched before the rebalance came first and
    # opened the call there (its first seconds became silence), and the older frames, read again from the
    # commit, came too late. Held frames now stay, in order, until the partition moves.
    settings = Settings(topic_audio="audio", topic_call_events="events")  # calls are kept on a rebalance
    store = SlowPartitionStore(slow=1)
    processor = _processor(settings, store)
    tps = {("audio", 1), ("events", 1)}
    processor.on_assigned(tps)
    await processor.on_frames(frames(1, "slow-call", range(0, 30)))  # more than the jitter buffer's window
    assert len(processor.waiting) == 30
    processor.on_revoking(tps)
    store.release.set()
    await asyncio.sleep(0)
    processor.on_assigned(tps)  # the partition stayed
    assert await processor.on_frames(frames(1, "slow-call", range(30, 40))) == []  # fetched before the rebalance
    assert await processor.on_frames(frames(1, "slow-call", range(0, 40))) == []  # read again from the commit
    leg = processor.calls["slow-call"].legs["agent"]
    assert leg.frames_released == 40 and leg.reorder.stats.late == 0 and leg.reorder.stats.gaps_filled == 0
    assert processor.offsets.committable()[("audio", 1)] == 0  # the call holds its first frame


async def test_held_frames_of_a_partition_that_moves_are_dropped() -> None:
    settings = Settings(topic_audio="audio", topic_call_events="events")
    store = SlowPartitionStore(slow=1)
    processor = _processor(settings, store)
    processor.on_assigned({("audio", 1), ("events", 1), ("audio", 2), ("events", 2)})
    await processor.on_frames(frames(1, "slow-call", range(0, 5)))
    processor.on_revoking({("audio", 1), ("events", 1), ("audio", 2), ("events", 2)})
    processor.on_assigned({("audio", 2), ("events", 2)})  # partition 1 moved
    assert len(processor.waiting) == 0
    store.release.set()
    await asyncio.sleep(0)
    assert await processor.release_waiting() == [] and "slow-call" not in processor.calls
