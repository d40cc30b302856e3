"""Exactly once without Kafka: a worker that dies between commits, and the one that replays its call from
the committed offsets and checkpoints, together commit each final segment and the QA result once.

Kafka's part is modelled by ``Transactions``: what is published and every checkpoint written is pending
until a commit, and a crash drops what is pending (the next owner's producer aborts it). The rest is the
real ``CallProcessor`` on real audio (call_01), as in test_checkpoints.py.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable
from typing import Any

import pytest

from pipeline.config import Settings
from pipeline.contracts.messages import CallCheckpoint, CallEvent, CallQA, Message, TranscriptSegment
from pipeline.worker.calls import CallProcessor
from pipeline.worker.checkpoints import MemoryCheckpointStore, due_checkpoint
from tests.worker.test_checkpoints import AUDIO, EVENTS, FRAME, _batches, _processor, _settle, call_legs

# Leg snapshots 15 s of audio apart: finals are committed well before a checkpoint covers them, so a
# replay decodes committed finals again (the case exactly once is about).
SETTINGS = Settings(commit_interval_s=1.0, checkpoint_interval_ms=15_000, topic_audio=AUDIO[0],
                    topic_call_events=EVENTS[0])


@pytest.fixture(scope="module")
def legs() -> dict[str, bytes]:
    return call_legs()


class Transactions:
    """One partition's transaction: messages and checkpoints pending until ``commit``, dropped by ``abort``."""

    def __init__(self) -> None:
        self.committed: list[Message] = []
        self.store = MemoryCheckpointStore()  # what a read_committed reader of the checkpoint topic sees
        self._messages: list[Message] = []
        self._checkpoints: list[tuple[int, str, CallCheckpoint | None]] = []

    async def publish(self, topic: str, key: str, message: Message | None, partition: int = 0) -> Awaitable[Any]:
        if message is not None:  # a tombstone (the live-calls topic) holds nothing this test counts
            self._messages.append(message)
        return _done()

    async def save(self, partition: int, call_id: str, checkpoint: CallCheckpoint | None) -> Awaitable[Any]:
        self._checkpoints.append((partition, call_id, checkpoint))
        return _done()

    async def load(self, partition: int) -> dict[str, CallCheckpoint]:
        return await self.store.load(partition)

    async def commit(self) -> None:
        self.committed += self._messages
        for partition, call_id, checkpoint in self._checkpoints:
            await (await self.store.save(partition, call_id, checkpoint))
        self.abort()

    def abort(self) -> None:
        self._messages, self._checkpoints = [], []

    def finals(self) -> list[str]:
        return [m.segment_id for m in self.committed if isinstance(m, TranscriptSegment) and m.is_final]


def _done() -> asyncio.Future[None]:
    delivered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    delivered.set_result(None)
    return delivered


def _worker(kafka: Transactions, settings: Settings = SETTINGS) -> CallProcessor:
    processor, _, _ = _processor(kafka, settings)  # type: ignore[arg-type]
    # Outputs and checkpoints go through the transaction; rows stay in the processor's memory sink.
    processor.outputs.output = kafka
    return processor


async def _commit(processor: CallProcessor, kafka: Transactions) -> dict[tuple[str, int], int]:
    offsets = await processor.make_durable()
    await processor.commit_transactions(offsets, {0}, kafka.commit)
    return offsets


async def test_a_replay_after_a_crash_commits_each_final_and_the_qa_once(legs: dict[str, bytes]) -> None:
    n = len(legs["agent"]) // FRAME
    batches = _batches(legs)
    start = CallEvent("c1", "start", legs=["agent", "customer"], tenant="acme")
    end = CallEvent("c1", "end", frame_counts={"agent": n, "customer": n})

    reference_kafka = Transactions()
    reference = _worker(reference_kafka)
    await reference.on_event(EVENTS, 0, start)
    for batch in batches:
        await reference.on_frames(batch)
        await _settle(reference)
    await reference.on_event(EVENTS, 1, end)
    await _settle(reference)
    await _commit(reference, reference_kafka)
    want = reference_kafka.finals()
    assert len(want) >= 4 and len(set(want)) == len(want)

    # The first owner commits every second batch and dies with a batch's outputs uncommitted.
    kafka = Transactions()
    first = _worker(kafka)
    await first.on_event(EVENTS, 0, start)
    crash_at = int(len(batches) * 0.7)
    committed: dict[tuple[str, int], int] = {AUDIO: 0, EVENTS: 0}
    for k, batch in enumerate(batches[:crash_at]):
        await first.on_frames(batch)
        await _settle(first)
        if k % 2 == 1:
            committed.update(await _commit(first, kafka))
    for batch in batches[crash_at:]:  # on, uncommitted, until a final is published: then the crash
        await first.on_frames(batch)
        await _settle(first)
        if any(isinstance(m, TranscriptSegment) and m.is_final for m in kafka._messages):
            break
    lost = sum(1 for m in kafka._messages if isinstance(m, TranscriptSegment) and m.is_final)
    kafka.abort()  # the next owner's producer aborts what the dead one left open
    before = kafka.finals()
    assert before, "some finals were committed before the crash"

    second = _worker(kafka)
    replay = [[f for f in batch if f[1] >= committed[AUDIO]] for batch in batches]
    for batch in [b for b in replay if b]:
        await second.on_frames(batch)
        await _settle(second)
    await second.on_event(EVENTS, 1, end)
    await _settle(second)
    await _commit(second, kafka)

    counts = Counter(kafka.finals())
    assert sorted(counts) == sorted(want), "the finals committed are those of the uninterrupted run"
    assert [s for s, k in counts.items() if k > 1] == [], "a final committed twice"
    qa = [m for m in kafka.committed if isinstance(m, CallQA)]
    assert len(qa) == 1
    # The case exactly once is about: the replay decoded (and stored again) finals committed already.
    stored_again = {row["segment_id"] for table, row in second.outputs.sink.rows if table == "segments"}  # type: ignore[attr-defined]
    assert set(before) & stored_again, "the replay decoded none of the committed finals: nothing was tested"
    assert lost > 0, "the crash left nothing uncommitted: nothing was tested"
    assert kafka.store.partitions[0] == {} or kafka.store.partitions[0]["c1"].status == "finished"


async def test_a_record_lists_finals_published_after_the_snapshots_and_not_those_before(
        legs: dict[str, bytes]) -> None:
    kafka = Transactions()
    worker = _worker(kafka)
    await worker.on_event(EVENTS, 0, CallEvent("c1", "start", legs=["agent", "customer"]))
    batches = _batches(legs)
    for batch in batches[: len(batches) // 2]:
        await worker.on_frames(batch)
        await _settle(worker)
        await _commit(worker, kafka)
    record = kafka.store.partitions[0]["c1"]
    call = worker.calls["c1"]
    covered = {s.segment_id for s in record.segments}
    assert call.published, "segments were published"
    assert set(record.published) == call.published - covered
    assert not covered & set(record.published)
    assert not call.unrecorded


class SlowDeliveries(Transactions):
    """Checkpoint records are acknowledged only when the test says so (a broker round trip)."""

    def __init__(self) -> None:
        super().__init__()
        self.unacknowledged: list[asyncio.Future[None]] = []

    async def save(self, partition: int, call_id: str, checkpoint: CallCheckpoint | None) -> Awaitable[Any]:
        await super().save(partition, call_id, checkpoint)
        delivered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.unacknowledged.append(delivered)
        return delivered

    def acknowledge(self) -> None:
        for delivered in self.unacknowledged:
            if not delivered.done():
                delivered.set_result(None)


async def test_a_record_of_what_was_published_never_repeats_a_checkpoint_older_than_one_sent(
        legs: dict[str, bytes]) -> None:
    kafka = SlowDeliveries()
    worker = _worker(kafka, Settings(commit_interval_s=1.0, topic_audio=AUDIO[0], topic_call_events=EVENTS[0]))
    await worker.on_event(EVENTS, 0, CallEvent("c1", "start", legs=["agent", "customer"]))
    call = worker.calls["c1"]
    batches = iter(_batches(legs))
    first_checkpoint = False
    while True:  # until a second checkpoint is due, the first one written and acknowledged
        await worker.on_frames(next(batches))
        await _settle(worker)
        if due_checkpoint(call) is not None and first_checkpoint:
            break
        if due_checkpoint(call) is not None:
            durable = asyncio.create_task(worker.make_durable())
            while not kafka.unacknowledged or not all(d.done() for d in kafka.unacknowledged):
                kafka.acknowledge()
                await asyncio.sleep(0)
            await durable
            first_checkpoint = bool(call.durable_legs)
    old_legs = {name: snap.state.next_seq for name, snap in call.durable_legs.items()}

    # The second checkpoint is sent; before it is acknowledged (its hold has not moved yet), the commit
    # timer records a segment published meanwhile.
    durable = asyncio.create_task(worker.make_durable())
    while not any(not d.done() for d in kafka.unacknowledged):
        await asyncio.sleep(0)
    call.published.add("c1/agent/published-meanwhile")
    call.unrecorded = True
    await worker.commit_transactions({}, {0}, kafka.commit)
    kafka.acknowledge()
    offsets = await durable
    worker.tasks.failures.append("a call failed")  # the worker exits: nothing is committed, none counted
    assert not await worker.commit_transactions(offsets, {0}, kafka.commit)
    worker.tasks.failures.clear()
    assert await worker.commit_transactions(offsets, {0}, kafka.commit)

    newest = {name: snap.state.next_seq for name, snap in call.durable_legs.items()}
    assert newest != old_legs, "the second checkpoint moved the legs on"
    record = kafka.store.partitions[0]["c1"]
    assert {leg.leg: leg.next_seq for leg in record.legs} == newest, (
        "the last record must resume where the committed offsets do, not from the older checkpoint")
    assert "c1/agent/published-meanwhile" in record.published
