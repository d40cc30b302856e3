"""The end of a call honours the frame counts its end event announced (pipeline/worker/lifecycle.py,
clock.py ``end_due``): an end event read before the call's last frames, on a caught-up audio partition,
no longer closes the call 2 s later without them; frames that never come keep it open only up to
CALLQA_END_WAIT_MAX_S, and such a close is counted.

The whole core without Kafka (real front end and VAD, in-memory ports). The wall clock the lifecycle
judges by is moved by the test, not waited for.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from pipeline.asr.engine import LegFrontEnd
from pipeline.config import Settings
from pipeline.contracts.messages import AudioFrame, CallEvent, now_ms
from pipeline.ingest.replay import ReplayOptions, load_recording
from pipeline.qa.call import QaConfig
from pipeline.worker import lifecycle
from pipeline.worker.calls import CallProcessor
from pipeline.worker.clock import close_reason
from pipeline.worker.legs import LegState
from pipeline.worker.memory import MemoryPorts
from pipeline.worker.ports import Transcription
from pipeline.worker.reorder import FrameReorderBuffer
from pipeline.worker.state import CallState

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "calls" / "call_01.wav"
FRAME_BYTES, FRAME_MS = 160, 20
AUDIO_TP, EVENTS_TP = ("audio", 0), ("events", 0)
SETTINGS = Settings(topic_audio="audio", topic_call_events="events")
TAIL = 100  # the last 2 s of call_01 (the customer's 17.1-19.3 s segment ends in them)


@pytest.fixture(scope="module")
def legs() -> dict[str, bytes]:
    return load_recording(SAMPLE, ReplayOptions(encoding="mulaw", frame_ms=FRAME_MS)).encoded


class DigestTranscriber:
    idle = False  # no early decodes: each segment decoded once, at its end

    async def transcribe(self, audio_16k: np.ndarray, context: Sequence[int] = ()) -> Transcription:
        digest = hashlib.sha256(audio_16k.astype(np.float32).tobytes()).hexdigest()[:16]
        return Transcription(f"heard {digest}", -0.1, 0.0, 0.9, "fake", 1, 1, 0.0, 0.0)


class WallClock:
    """The lifecycle's wall clock, moved on by the test."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.shift_ms = 0
        monkeypatch.setattr(lifecycle, "now_ms", lambda: now_ms() + self.shift_ms)


class Call:
    def __init__(self, legs: dict[str, bytes]) -> None:
        self.legs = legs
        self.n = len(legs["agent"]) // FRAME_BYTES
        self.ports = MemoryPorts()
        self.processor = CallProcessor(SETTINGS, DigestTranscriber(), self.ports, self.ports,  # type: ignore[arg-type]
                                       lambda rate, enc: LegFrontEnd(rate, enc, SETTINGS),
                                       QaConfig.from_settings(SETTINGS))
        self.offset = 0

    async def frames(self, first: int, last: int) -> None:
        """Both legs' frames ``first`` to ``last`` - 1, 10 per leg a batch."""
        for seq in range(first, last, 10):
            batch = [AudioFrame("c1", leg, s, s * FRAME_MS, 8000, "mulaw",  # type: ignore[arg-type]
                                self.legs[leg][s * FRAME_BYTES:(s + 1) * FRAME_BYTES])
                     for s in range(seq, min(last, seq + 10)) for leg in ("agent", "customer")]
            await self.processor.on_frames([(AUDIO_TP, self.offset + i, f) for i, f in enumerate(batch)])
            self.offset += len(batch)

    async def end(self) -> None:
        await self.processor.on_event(EVENTS_TP, 0, CallEvent("c1", "end", frame_counts={
            "agent": self.n, "customer": self.n}))

    async def finished(self) -> None:
        p = self.processor

        async def done() -> None:
            while p.calls or any(c.pending for c in p.awaiting_release):
                await asyncio.sleep(0.01)

        await asyncio.wait_for(done(), timeout=120)

    def finals(self) -> list[tuple[str, int, int, str]]:
        return sorted((m.leg, m.start_ms, m.end_ms, m.text) for m in self.ports.finals())

    def end_reasons(self) -> list[str]:
        return [row["end_reason"] for table, row in self.ports.rows if table == "calls"]

    def closed_incomplete(self) -> float | None:
        return self.processor.metrics.registry.get_sample_value("callqa_calls_closed_incomplete_total",
                                                                {"how": "end"})


async def reference(legs: dict[str, bytes]) -> list[tuple[str, int, int, str]]:
    """Every frame before the end event."""
    call = Call(legs)
    await call.frames(0, call.n)
    await call.end()
    await call.finished()
    return call.finals()


async def test_an_end_event_before_the_last_frames_waits_for_them_and_the_last_segment_is_stored(
    legs: dict[str, bytes], monkeypatch: pytest.MonkeyPatch,
) -> None:
    expected = await reference(legs)
    wall = WallClock(monkeypatch)
    call = Call(legs)
    await call.frames(0, call.n - TAIL)
    await call.end()  # its last 2 s of frames are still in flight
    # The partition is caught up (lag 0, nothing read for longer than the grace) and the grace after the
    # end event has passed: the call closed here before, and lost its last segment.
    wall.shift_ms = SETTINGS.end_grace_ms + 3_000
    await call.processor.tick()
    assert not call.processor.calls["c1"].finishing
    await call.frames(call.n - TAIL, call.n)  # the last frames: the call closes with them
    await call.finished()
    assert call.finals() == expected and expected[-1][:2] == ("customer", 17_140)
    assert call.end_reasons() == ["end"] and call.closed_incomplete() == 0


async def test_frames_that_never_come_keep_the_call_open_only_up_to_the_bound(
    legs: dict[str, bytes], monkeypatch: pytest.MonkeyPatch,
) -> None:
    expected = await reference(legs)
    wall = WallClock(monkeypatch)
    call = Call(legs)
    await call.frames(0, call.n - TAIL)
    await call.end()  # its last 2 s of frames never come
    wall.shift_ms = int(SETTINGS.end_wait_max_s * 1000) - 1_000
    await call.processor.tick()
    assert not call.processor.calls["c1"].finishing and call.closed_incomplete() == 0
    wall.shift_ms = int(SETTINGS.end_wait_max_s * 1000) + 1_000
    await call.processor.tick()
    await call.finished()
    assert call.end_reasons() == ["end"] and call.closed_incomplete() == 1
    # What came is stored; the cut segment is closed where the missing frames were filled with silence.
    assert call.finals()[:-1] == expected[:-1]


async def test_behind_another_producers_newer_frames_do_not_close_a_call_whose_last_frames_are_still_coming(
    legs: dict[str, bytes], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Kafka orders a partition per producer only. After a broker restart, a producer that reconnected
    sooner (another call's, another gateway's) appends frames produced after this call's end event, while
    this call's last frames, produced before it, still wait in their own producer's queue. The chaos test
    lost a call's last two finals so (CI of stop 32): the call closed at end + grace of that stream time."""
    expected = await reference(legs)
    wall = WallClock(monkeypatch)
    call = Call(legs)
    await call.frames(0, call.n - TAIL)
    await call.end()  # its last 2 s of frames are still in its producer's queue
    newer = AudioFrame("c2", "agent", 0, 0, 8000, "mulaw", legs["agent"][:FRAME_BYTES],  # type: ignore[arg-type]
                       produced_at_ms=now_ms() + 3 * SETTINGS.end_grace_ms)
    await call.processor.on_frames([(AUDIO_TP, call.offset, newer)])
    call.offset += 1
    call.processor.lag = lambda tp: 400  # the reconnected producers' backlog is still being read
    wall.shift_ms = 3 * SETTINGS.end_grace_ms
    await call.processor.tick()
    assert not call.processor.calls["c1"].finishing
    await call.frames(call.n - TAIL, call.n)  # the late producer's frames: the call closes with them
    await call.processor.on_event(EVENTS_TP, 1, CallEvent("c2", "end", frame_counts={"agent": 1}))
    await call.finished()
    assert call.finals() == expected and expected[-1][:2] == ("customer", 17_140)  # c2's 20 ms holds no speech
    assert call.closed_incomplete() == 0


T0 = 1_000_000
GRACE_MS, TIMEOUT_MS, WAIT_MS = 2_000, 1_200_000.0, 30_000.0


def _ended_call(have: dict[str, int], announced: dict[str, int]) -> CallState:
    """An ended call whose legs received ``have`` frames of the ``announced`` ones."""
    call = CallState("c1", last_frame_produced_ms=T0, last_activity_ms=T0, opened_at_ms=T0, end_consumed_ms=T0)
    call.end = CallEvent("c1", "end", at_ms=T0, frame_counts=announced)
    for name, n in have.items():
        leg = call.legs[name] = LegState("c1", name, None, 20, FrameReorderBuffer(4), 100)  # type: ignore[arg-type]
        leg.frames_released = n
    return call


def test_frames_missing_per_leg_a_leg_that_never_sent_its_frames_included() -> None:
    assert _ended_call({"agent": 500}, {"agent": 500, "customer": 0}).frames_missing() == {}
    assert _ended_call({"agent": 480}, {"agent": 500, "customer": 300}).frames_missing() == {"agent": 20,
                                                                                           "customer": 300}


def test_caught_up_without_its_frames_a_call_waits_the_bound_of_wall_time_not_the_grace() -> None:
    call = _ended_call({"agent": 480}, {"agent": 500})
    idle = GRACE_MS  # nothing read from the partition for the grace: caught up
    assert close_reason(call, 0, T0, T0 + GRACE_MS, TIMEOUT_MS, GRACE_MS, idle, WAIT_MS) is None
    assert close_reason(call, 0, T0, T0 + int(WAIT_MS) - 1, TIMEOUT_MS, GRACE_MS, idle, WAIT_MS) is None
    assert close_reason(call, 0, T0, T0 + int(WAIT_MS), TIMEOUT_MS, GRACE_MS, idle, WAIT_MS) == "end"
    # With all its frames, the grace is enough (as before).
    complete = _ended_call({"agent": 500}, {"agent": 500})
    assert close_reason(complete, 0, T0, T0 + GRACE_MS, TIMEOUT_MS, GRACE_MS, idle, WAIT_MS) == "end"


def test_a_busy_partition_at_lag_zero_past_the_end_still_waits_the_bound_for_missing_frames() -> None:
    call = _ended_call({"agent": 480}, {"agent": 500})
    # Other calls' frames keep coming (not idle), stream time is past the end and its grace.
    busy, past = 40, T0 + 10 * GRACE_MS
    assert close_reason(call, 0, past, T0 + 5_000, TIMEOUT_MS, GRACE_MS, busy, WAIT_MS) is None
    assert close_reason(call, 0, past, T0 + int(WAIT_MS), TIMEOUT_MS, GRACE_MS, busy, WAIT_MS) == "end"
    # Behind (messages unread), the partition's stream time decides, but past the end by the bound, not
    # the grace: another producer's frames can carry it past the end before this call's last ones come.
    assert close_reason(call, 50, past, T0 + 5_000, TIMEOUT_MS, GRACE_MS, busy, WAIT_MS) is None
    assert close_reason(call, 50, T0 + int(WAIT_MS) - 1, T0 + 5_000, TIMEOUT_MS, GRACE_MS, busy, WAIT_MS) is None
    assert close_reason(call, 50, T0 + int(WAIT_MS), T0 + 5_000, TIMEOUT_MS, GRACE_MS, busy, WAIT_MS) == "end"
    # With all its frames, behind, the grace of stream time is enough (as before).
    complete = _ended_call({"agent": 500}, {"agent": 500})
    assert close_reason(complete, 50, T0 + GRACE_MS, T0 + 5_000, TIMEOUT_MS, GRACE_MS, busy, WAIT_MS) == "end"
