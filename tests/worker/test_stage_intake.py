"""FrameIntake (pipeline/worker/intake.py): frames checked, matched to their calls and put in order.
Real leg front ends; in-memory checkpoint store; no Kafka."""

from __future__ import annotations

from pipeline.asr.engine import LegFrontEnd
from pipeline.config import Settings
from pipeline.contracts.messages import AudioFrame
from pipeline.qa.call import QaConfig
from pipeline.worker.checkpoints import MemoryCheckpointStore
from pipeline.worker.clock import StreamClock
from pipeline.worker.intake import FrameIntake
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.offsets import OffsetTracker
from pipeline.worker.registry import CallRegistry

TP = ("audio", 0)
SILENCE = b"\xff" * 160  # 20 ms of mu-law silence at 8 kHz


def _intake() -> tuple[FrameIntake, CallRegistry, OffsetTracker, WorkerMetrics]:
    # The keypad detector holds a leg's first 66-100 ms back (tests/audio/test_dtmf.py): off here, where three
    # 20 ms frames must come out of the jitter buffer as audio.
    settings, metrics, offsets = Settings(topic_audio="audio", keypad_tones=False), WorkerMetrics(), OffsetTracker()

    def front_end(rate: int, encoding: str) -> LegFrontEnd:
        return LegFrontEnd(rate, encoding, settings)

    registry = CallRegistry(settings, QaConfig.from_settings(settings), front_end, MemoryCheckpointStore(), metrics)
    return FrameIntake(settings, registry, offsets, StreamClock(), front_end, metrics), registry, offsets, metrics


def _frame(seq: int, leg: str = "agent", call_id: str = "c1", **changes: object) -> AudioFrame:
    fields = {"call_id": call_id, "leg": leg, "seq": seq, "start_ms": seq * 20, "produced_at_ms": 1_000 + seq * 20,
              "sample_rate": 8000, "encoding": "mulaw", "payload": SILENCE, **changes}
    return AudioFrame(**fields)  # type: ignore[arg-type]


def _dropped(metrics: WorkerMetrics, reason: str) -> float:
    return metrics.registry.get_sample_value("callqa_frames_dropped_total", {"reason": reason}) or 0.0


async def test_frames_come_out_of_their_legs_in_order_and_duplicates_are_dropped() -> None:
    intake, registry, _, metrics = _intake()
    batch = await intake.take([(TP, i, f) for i, f in enumerate(
        [_frame(0), _frame(2), _frame(0, "customer"), _frame(1), _frame(1)])])
    assert [(a.call.call_id, a.leg.leg) for a in batch.legs] == [("c1", "agent"), ("c1", "customer")]
    agent = registry.calls["c1"].legs["agent"]
    assert agent.frames_released == 3 and agent.reorder.held == 0  # 0, then 1 and the waiting 2
    assert sum(len(c) for c in batch.legs[0].chunks) > 0 and batch.rejected == []
    assert _dropped(metrics, "duplicate") == 1
    assert batch.calls() == [registry.calls["c1"]]


async def test_a_frame_ahead_of_its_leg_waits_in_the_jitter_buffer() -> None:
    intake, registry, _, _ = _intake()
    batch = await intake.take([(TP, 0, _frame(0)), (TP, 1, _frame(3))])
    agent = registry.calls["c1"].legs["agent"]
    assert agent.frames_released == 1 and agent.reorder.held == 1 and len(batch.legs) == 1


async def test_a_bad_frame_is_rejected_alone_and_holds_its_offset_until_its_dead_letter_is_delivered() -> None:
    intake, registry, offsets, metrics = _intake()
    registry.remember_finished("done")
    batch = await intake.take([(TP, 0, _frame(0, sample_rate=12_345)), (TP, 1, _frame(0, call_id="done"))])
    assert [r.error.problem for r in batch.rejected] == ["unsupported sample rate 12345"]
    assert not registry.calls and batch.legs == []
    assert _dropped(metrics, "after_call_end") == 1  # consumed, dropped, not held
    assert offsets.committable() == {TP: 0}
    letter = intake.dead_letter_message(TP, 0, b"c1", b"raw", batch.rejected[0].error, batch.rejected[0].frame)
    assert letter.error_type == "FrameError"
    intake.dead_letter_delivered(TP, 0)
    assert offsets.committable() == {TP: 2}


async def test_a_frame_unlike_its_legs_earlier_frames_is_rejected() -> None:
    intake, _, _, _ = _intake()
    await intake.take([(TP, 0, _frame(0))])
    batch = await intake.take([(TP, 1, _frame(1, encoding="pcm16", payload=b"\0" * 320)),
                               (TP, 2, _frame(10_000_000))])
    assert [r.error.problem.split(" (")[0] for r in batch.rejected] == [
        "8000 Hz pcm16 differs from the leg's earlier frames",
        "seq is 9999999 frames ahead of the leg",
    ]


async def test_a_jump_over_an_announced_hold_is_taken_however_long_the_hold() -> None:
    """Twice the inactivity timeout (40 min by default) is the most a leg may jump without a hold; a hold
    the call announced may last longer (a caller parked for an hour), and its frames are not corrupt."""
    intake, registry, _, _ = _intake()
    await intake.take([(TP, 0, _frame(0))])
    call = registry.calls["c1"]
    jump = 60 * 60 * 50  # an hour of 20 ms frames
    refused = await intake.take([(TP, 1, _frame(jump))])
    assert [r.error.problem.split(" (")[0] for r in refused.rejected] == [f"seq is {jump - 1} frames ahead of the leg"]
    call.held_from_ms = 40  # the hold event read; its resume not yet (another topic)
    assert (await intake.take([(TP, 2, _frame(jump))])).rejected == []
    call.holds_ms, call.held_from_ms = [(40, jump * 20)], None  # and once it is read, the same
    assert (await intake.take([(TP, 3, _frame(jump + 1))])).rejected == []
    far = jump + 60 * 60 * 50  # an hour past the resume with no hold: corrupt again
    assert len((await intake.take([(TP, 4, _frame(far))])).rejected) == 1


async def test_frames_of_partitions_not_owned_are_not_taken() -> None:
    intake, registry, offsets, metrics = _intake()
    registry.on_assigned({("audio", 1)})
    batch = await intake.take([(TP, 0, _frame(0))])
    assert batch.legs == [] and not registry.calls and offsets.partitions() == []
    assert metrics.registry.get_sample_value("callqa_frames_total") == 0
