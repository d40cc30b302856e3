"""Bounded replay without Kafka: a call resumed from its checkpoint by a second processor yields the
segments (ids, times, text) of the uninterrupted run, and re-decodes only the audio after the checkpoint.

Real audio (call_01, two legs), the real front end and the real ``CallProcessor``; the transcriber
names each segment by its audio (deterministic), outputs and rows go to in-memory ports, and the
checkpoint store is the in-memory one, shared by the "crashed" and the resuming processor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from pipeline.asr.engine import LegFrontEnd
from pipeline.audio import codecs
from pipeline.audio.files import load_audio
from pipeline.audio.resample import resample
from pipeline.config import Settings
from pipeline.contracts.messages import AudioFrame, CallCheckpoint, CallEvent
from pipeline.qa.call import QaConfig
from pipeline.worker.calls import CallProcessor
from pipeline.worker.checkpoints import MemoryCheckpointStore
from pipeline.worker.memory import MemoryPorts
from pipeline.worker.ports import Transcription

CALL = Path(__file__).resolve().parents[2] / "samples" / "calls" / "call_01.wav"
AUDIO, EVENTS = ("audio", 0), ("events", 0)
FRAME = 160  # 20 ms of mu-law at 8 kHz
BATCH = 25  # frames per leg in one batch (the app takes up to 256 frames at once)


class AudioNamedTranscriber:
    """'len N sum S': a text that is the same for the same audio, whoever decodes it."""

    def __init__(self) -> None:
        self.decoded_s = 0.0

    idle = False  # no early decodes (pipeline/worker/early.py): each segment decoded once, at its end

    async def transcribe(self, audio_16k: np.ndarray, context: Sequence[int] = (), preview: bool = False,
                         ) -> Transcription:
        self.decoded_s += audio_16k.size / 16000
        await asyncio.sleep(0)
        return Transcription(f"len {audio_16k.size} sum {float(np.abs(audio_16k).sum()):.0f}", -0.1, 0.0, 0.9,
                             "fake", 1, 1, 0.0, 0.0)


class Recorder(MemoryPorts):
    def final_spans(self) -> dict[str, tuple[int, int, str]]:
        return {m.segment_id: (m.start_ms, m.end_ms, m.text) for m in self.finals()}


def call_legs() -> dict[str, bytes]:
    """call_01's legs as 8 kHz mu-law."""
    audio = load_audio(CALL)
    return {leg: codecs.encode(resample(audio.samples[i], audio.sample_rate, 8000), "mulaw")
            for i, leg in enumerate(("agent", "customer"))}


@pytest.fixture(scope="module")
def legs() -> dict[str, bytes]:
    return call_legs()


def _processor(store: MemoryCheckpointStore, settings: Settings) -> tuple[CallProcessor, AudioNamedTranscriber,
                                                                           Recorder]:
    transcriber, recorder = AudioNamedTranscriber(), Recorder()
    processor = CallProcessor(settings, transcriber, recorder, recorder,  # type: ignore[arg-type]
                              lambda rate, enc: LegFrontEnd(rate, enc, settings), QaConfig.from_settings(settings),
                              checkpoints=store)  # fmt: skip
    return processor, transcriber, recorder


def _batches(legs: dict[str, bytes]) -> list[list[tuple[tuple[str, int], int, AudioFrame]]]:
    """Both legs' frames interleaved, offsets 1.. (offset 0 is nothing: the start event is on EVENTS)."""
    n = len(legs["agent"]) // FRAME
    frames = [(AUDIO, 2 * seq + i + 1, AudioFrame("c1", leg, seq, seq * 20, 8000, "mulaw",  # type: ignore[arg-type]
                                                  legs[leg][seq * FRAME:(seq + 1) * FRAME]))
              for seq in range(n) for i, leg in enumerate(("agent", "customer"))]
    return [frames[i:i + 2 * BATCH] for i in range(0, len(frames), 2 * BATCH)]


async def _settle(processor: CallProcessor) -> None:
    for _ in range(50):
        await asyncio.sleep(0)
    while any(c.pending for c in [*processor.calls.values(), *processor.awaiting_release]):
        await asyncio.sleep(0.01)


async def _commit(processor: CallProcessor) -> dict[tuple[str, int], int]:
    offsets = await processor.make_durable()
    processor.offsets.committed(offsets)
    return offsets


async def _finish(processor: CallProcessor, n: int) -> None:
    await processor.on_event(EVENTS, 1, CallEvent("c1", "end", frame_counts={"agent": n, "customer": n}))
    await _settle(processor)
    await _commit(processor)


async def test_resumed_call_matches_the_uninterrupted_one(legs: dict[str, bytes]) -> None:
    settings = Settings(commit_interval_s=1.0, topic_audio=AUDIO[0], topic_call_events=EVENTS[0])
    n = len(legs["agent"]) // FRAME
    batches = _batches(legs)

    reference, _, ref_out = _processor(MemoryCheckpointStore(), settings)
    await reference.on_event(EVENTS, 0, CallEvent("c1", "start", legs=["agent", "customer"], tenant="acme"))
    for batch in batches:
        await reference.on_frames(batch)
        await _settle(reference)
    await _finish(reference, n)
    want = ref_out.final_spans()
    assert len(want) >= 4

    # The first owner: commits every 50 frames per leg (1 s of audio), "crashes" at 70 % of the call.
    store = MemoryCheckpointStore()
    first, _, first_out = _processor(store, settings)
    await first.on_event(EVENTS, 0, CallEvent("c1", "start", legs=["agent", "customer"], tenant="acme"))
    crash_at = int(len(batches) * 0.7)
    committed: dict[tuple[str, int], int] = {}
    for k, batch in enumerate(batches[:crash_at]):
        await first.on_frames(batch)
        await _settle(first)
        if k % 2 == 1:
            committed.update(await _commit(first))
    checkpoint = store.partitions[0]["c1"]
    assert checkpoint.status == "open" and checkpoint.legs and checkpoint.tenant == "acme"
    assert committed[AUDIO] > 1, "offsets advanced past the call's first frame while it was open"
    assert committed[EVENTS] == 1, "the start event is in the checkpoint, so it was committed past"

    # The next owner reads from the committed offsets: the checkpoint covers what is before them.
    second, transcriber, second_out = _processor(store, settings)
    replay = [[f for f in batch if f[1] >= committed[AUDIO]] for batch in batches]
    for batch in [b for b in replay if b]:
        await second.on_frames(batch)
        await _settle(second)
    await _finish(second, n)
    assert second.metrics.calls_resumed._value.get() == 1
    # Legs are snapshotted apart: replayed frames of the leg whose snapshot is newer are skipped by seq.
    assert second.metrics.frames_dropped.labels("before_checkpoint")._value.get() > 0

    got = {**first_out.final_spans(), **second_out.final_spans()}
    assert got == want, "same segment ids, times and texts as the uninterrupted run"
    # Re-decoded audio: what both decoded, less the call's speech: at most the open segments at the
    # checkpoint plus a commit interval (here 2 batches = 1 s per leg) and the checkpoint spacing.
    overlap = set(first_out.final_spans()) & set(second_out.final_spans())
    redecoded_s = sum((want[s][1] - want[s][0]) / 1000 for s in overlap)
    bound_s = 2 * (settings.max_segment_ms + 1000 * settings.commit_interval_s + settings.checkpoint_interval_ms) / 1000
    assert redecoded_s <= bound_s, f"{redecoded_s:.1f} s of speech decoded twice (bound {bound_s:.1f} s)"
    assert transcriber.decoded_s < sum((e - s) / 1000 for s, e, _ in want.values())

    # The call row of the resumed owner counts every segment of the call, and QA saw all of them.
    calls = [r for t, r in second_out.rows if t == "calls"]
    assert calls and calls[-1]["segments"] == len(want)
    assert store.partitions[0]["c1"].status == "finished"
    # Once the commit has passed all of the call's input, no replay can reach it: the record goes.
    await _commit(second)
    assert "c1" not in store.partitions[0]


async def test_finished_record_drops_a_replayed_tail(legs: dict[str, bytes]) -> None:
    settings = Settings(topic_audio=AUDIO[0], topic_call_events=EVENTS[0])
    store = MemoryCheckpointStore()
    store.partitions[0] = {"c1": CallCheckpoint("c1", "finished")}
    processor, transcriber, out = _processor(store, settings)
    for batch in _batches(legs)[:4]:
        await processor.on_frames(batch)
    await _settle(processor)
    assert transcriber.decoded_s == 0 and not out.messages and not processor.calls
    assert processor.metrics.frames_dropped.labels("after_call_end")._value.get() == 8 * BATCH


async def test_revoked_partition_forgets_its_calls_and_offsets(legs: dict[str, bytes]) -> None:
    settings = Settings(topic_audio=AUDIO[0], topic_call_events=EVENTS[0])
    processor, _, _ = _processor(MemoryCheckpointStore(), settings)
    processor.on_assigned({AUDIO, EVENTS})
    for batch in _batches(legs)[:6]:
        await processor.on_frames(batch)
    assert "c1" in processor.calls
    processor.on_revoked({AUDIO, EVENTS})
    assert not processor.calls and processor.offsets.partitions() == []
    assert await processor.make_durable() == {}
    # Input of a partition no longer owned (a batch taken before the revocation) is ignored.
    await processor.on_frames(_batches(legs)[6])
    assert not processor.calls and processor.offsets.partitions() == []


async def test_two_agents_opening_the_same_call_at_once_share_one_state() -> None:
    class SlowStore(MemoryCheckpointStore):
        async def load(self, partition: int) -> dict[str, CallCheckpoint]:
            await asyncio.sleep(0.01)  # both agents wait here for the partition's checkpoints
            return await super().load(partition)

    settings = Settings()
    processor, _, _ = _processor(SlowStore(), settings)
    a, b = await asyncio.gather(processor._call_for("c1", AUDIO), processor._call_for("c1", EVENTS))
    assert a is not None and a is b
    assert processor.calls == {"c1": a}


async def test_an_end_event_read_before_the_checkpoint_stays_uncommitted(legs: dict[str, bytes]) -> None:
    """In a backlog the end event is read long before the call's last frames: a checkpoint does not carry
    it, so its offset must stay held until the call is finished, or a new owner would never end the call."""
    settings = Settings(topic_audio=AUDIO[0], topic_call_events=EVENTS[0])
    n = len(legs["agent"]) // FRAME
    batches = _batches(legs)
    processor, _, _ = _processor(MemoryCheckpointStore(), settings)
    await processor.on_event(EVENTS, 0, CallEvent("c1", "start", legs=["agent", "customer"]))
    await processor.on_event(EVENTS, 1, CallEvent("c1", "end", frame_counts={"agent": n, "customer": n}))
    committed: dict[tuple[str, int], int] = {}
    for batch in batches[: len(batches) // 2]:
        await processor.on_frames(batch)
        await _settle(processor)
        committed.update(await _commit(processor))
    assert committed[AUDIO] > 1 and committed[EVENTS] == 1, committed  # start covered, end still held
    for batch in batches[len(batches) // 2:]:
        await processor.on_frames(batch)
        await _settle(processor)
    await _settle(processor)
    committed.update(await _commit(processor))
    assert committed[EVENTS] == 2 and not processor.calls


async def test_a_rebalance_that_gives_the_partition_back_keeps_the_call_and_decodes_nothing_again(
        legs: dict[str, bytes]) -> None:
    settings = Settings(commit_interval_s=1.0, topic_audio=AUDIO[0], topic_call_events=EVENTS[0])
    n = len(legs["agent"]) // FRAME
    batches = _batches(legs)
    reference, ref_transcriber, ref_out = _processor(MemoryCheckpointStore(), settings)
    await reference.on_event(EVENTS, 0, CallEvent("c1", "start", legs=["agent", "customer"]))
    for batch in batches:
        await reference.on_frames(batch)
        await _settle(reference)
    await _finish(reference, n)

    processor, transcriber, out = _processor(MemoryCheckpointStore(), settings)
    processor.on_assigned({AUDIO, EVENTS})
    await processor.on_event(EVENTS, 0, CallEvent("c1", "start", legs=["agent", "customer"]))
    half = len(batches) // 2
    for batch in batches[:half]:
        await processor.on_frames(batch)
        await _settle(processor)
    committed = await _commit(processor)
    call = processor.calls["c1"]
    decoded_before = transcriber.decoded_s
    # An eager rebalance: every partition revoked, then the same ones assigned back.
    processor.on_revoking({AUDIO, EVENTS})
    processor.on_assigned({AUDIO, EVENTS})
    assert processor.calls == {"c1": call}
    # faust fetches again from the last commit: what this worker had read is skipped, not decoded again.
    replay_from = committed.get(AUDIO, 0)
    for batch in batches[:half]:
        await processor.on_frames([f for f in batch if f[1] >= replay_from])
        await _settle(processor)
    await processor.on_event(EVENTS, 0, CallEvent("c1", "start", legs=["agent", "customer"]))
    assert transcriber.decoded_s == decoded_before
    skipped = processor.metrics.frames_dropped.labels("read_before_rebalance")._value.get()
    assert skipped == sum(1 for b in batches[:half] for f in b if f[1] >= replay_from) > 0
    for batch in batches[half:]:
        await processor.on_frames(batch)
        await _settle(processor)
    await _finish(processor, n)
    assert out.final_spans() == ref_out.final_spans()
    assert transcriber.decoded_s == pytest.approx(ref_transcriber.decoded_s)
    assert processor.metrics.calls_kept._value.get() == 1


async def test_a_rebalance_that_moves_the_partition_drops_the_call_at_the_assignment(legs: dict[str, bytes]) -> None:
    settings = Settings(topic_audio=AUDIO[0], topic_call_events=EVENTS[0])
    processor, _, _ = _processor(MemoryCheckpointStore(), settings)
    processor.on_assigned({AUDIO, EVENTS, ("audio", 1), ("events", 1)})
    for batch in _batches(legs)[:6]:
        await processor.on_frames(batch)
    processor.on_revoking({AUDIO, EVENTS, ("audio", 1), ("events", 1)})
    assert "c1" in processor.calls and await processor.make_durable() == {}  # paused until the assignment
    processor.on_assigned({("audio", 1), ("events", 1)})
    assert not processor.calls and AUDIO not in processor.offsets.partitions()
    assert processor.metrics.calls_dropped._value.get() == 1


async def test_a_store_that_never_flushes_does_not_hold_the_hand_over_and_nothing_is_committed(
        legs: dict[str, bytes]) -> None:
    class Outage(Recorder):
        async def flush(self) -> None:
            await asyncio.Event().wait()  # a ClickHouse outage: the flush never returns

    settings = Settings(topic_audio=AUDIO[0], topic_call_events=EVENTS[0])
    transcriber, outage = AudioNamedTranscriber(), Outage()
    processor = CallProcessor(settings, transcriber, outage, outage,  # type: ignore[arg-type]
                              lambda rate, enc: LegFrontEnd(rate, enc, settings), QaConfig.from_settings(settings),
                              checkpoints=MemoryCheckpointStore())  # fmt: skip
    processor.on_assigned({AUDIO, EVENTS})
    await processor.on_event(EVENTS, 0, CallEvent("c1", "start", legs=["agent", "customer"]))
    for batch in _batches(legs):
        await processor.on_frames(batch)
        await _settle(processor)
    n = len(legs["agent"]) // FRAME
    await processor.on_event(EVENTS, 1, CallEvent("c1", "end", frame_counts={"agent": n, "customer": n}))
    await _settle(processor)
    assert processor.awaiting_release  # finished, its rows not durable: the store is down
    committed: list[dict[tuple[str, int], int]] = []

    async def commit() -> None:
        committed.append(await processor.make_durable())

    # Bounded: the hand-over gives up on the flush (the outer limit only stops a hung test).
    await asyncio.wait_for(processor.hand_over({AUDIO, EVENTS}, 0.5, commit), 30)
    assert committed == [] and processor.registry.suspended == {0}
    # A store known to refuse writes is not waited for the whole budget (600 s here: the outer limit fails it).
    processor.on_assigned({AUDIO, EVENTS})
    await asyncio.wait_for(processor.hand_over({AUDIO, EVENTS}, 600.0, commit, store_failing=lambda: True), 30)
    assert committed == [] and processor.registry.suspended == {0}
    processor.on_assigned({("audio", 1), ("events", 1)})  # the partition moved: its next owner replays it
    assert not processor.awaiting_release and not processor.calls and processor.offsets.partitions() == []
