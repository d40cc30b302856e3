"""Finals held for a leg that sends nothing are bounded by stream time (pipeline/worker/state.py
``watermarks``, release.py, CALLQA_HELD_FINAL_MAX_MS); a leg whose audio comes later still is stored all
the same, and the call's QA does not depend on the order of release (pipeline/qa/call.py ``finalize``).

The whole core without Kafka (real front end and VAD, in-memory ports); stream time is the audio fed, so
nothing here depends on how fast the machine is.
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
from pipeline.contracts.messages import AudioFrame, CallEvent, CallQA, now_ms
from pipeline.ingest.replay import ReplayOptions, load_recording
from pipeline.qa.call import CallAnalyzer, QaConfig
from pipeline.qa.segment import Segment
from pipeline.worker.calls import CallProcessor
from pipeline.worker.memory import MemoryPorts
from pipeline.worker.ports import Transcription

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "calls" / "call_01.wav"
FRAME_BYTES, FRAME_MS, BATCH_FRAMES = 160, 20, 10  # 20 ms of mu-law at 8 kHz; 200 ms per batch
AUDIO_TP, EVENTS_TP = ("audio", 0), ("events", 0)
SILENCE = b"\xff" * FRAME_BYTES  # mu-law zero
T0 = now_ms()  # producer time of the calls' first frames


@pytest.fixture(scope="module")
def legs() -> dict[str, bytes]:
    """call_01 (20 s): agent speech at 0.3-3.3, 4.8-8.0 and 9.6-16.7 s; customer at 3.3-4.3, 7.0-8.4 and
    17.1-19.3 s."""
    return load_recording(SAMPLE, ReplayOptions(encoding="mulaw", frame_ms=FRAME_MS)).encoded


class LetterTranscriber:
    """Says what it heard by a digest of the audio, in letters (no digit the redactor could take for a
    number, so the text does not depend on redaction context)."""

    idle = False  # no early decodes: each segment decoded once, at its end

    async def transcribe(self, audio_16k: np.ndarray, context: Sequence[int] = ()) -> Transcription:
        digest = hashlib.sha256(audio_16k.astype(np.float32).tobytes()).hexdigest()[:16]
        return Transcription("heard " + digest.translate(str.maketrans("0123456789", "ghijklmnop")),
                             -0.1, 0.0, 0.9, "fake", 1, 1, 0.0, 0.0)


class Run:
    """One call fed to a core batch by batch; which finals were out after each batch."""

    def __init__(self, held_final_max_ms: int = 2000) -> None:
        self.settings = Settings(topic_audio="audio", topic_call_events="events",
                                 held_final_max_ms=held_final_max_ms)
        self.ports = MemoryPorts()
        self.processor = CallProcessor(self.settings, LetterTranscriber(), self.ports, self.ports,  # type: ignore[arg-type]
                                       lambda rate, enc: LegFrontEnd(rate, enc, self.settings),
                                       QaConfig.from_settings(self.settings))
        self.offset = 0
        self.published_at: dict[str, int] = {}  # final's segment id -> agent audio fed (ms) when it was out

    async def frames(self, frames: list[AudioFrame], agent_ms: int) -> None:
        await self.processor.on_frames([(AUDIO_TP, self.offset + i, f) for i, f in enumerate(frames)])
        self.offset += len(frames)
        await self.settled()
        for final in self.ports.finals():
            self.published_at.setdefault(final.segment_id, agent_ms)

    async def settled(self) -> None:
        calls = self.processor
        while any(c.pending for c in [*calls.calls.values(), *calls.awaiting_release]):
            await asyncio.gather(*[t for c in [*calls.calls.values(), *calls.awaiting_release] for t in c.pending])

    async def end(self, counts: dict[str, int], agent_ms: int) -> None:
        await self.processor.on_event(EVENTS_TP, 0, CallEvent("c1", "end", frame_counts=counts))
        await asyncio.wait_for(self.settled(), timeout=120)
        assert not self.processor.calls
        for final in self.ports.finals():
            self.published_at.setdefault(final.segment_id, agent_ms)

    def finals(self) -> list[tuple[str, int, int, str]]:
        return sorted((m.leg, m.start_ms, m.end_ms, m.text) for m in self.ports.finals())

    def qa(self) -> CallQA:
        [qa] = [m for m in self.ports.messages if isinstance(m, CallQA)]
        return qa


def frame(legs: dict[str, bytes], leg: str, seq: int, payload: bytes | None = None, call_id: str = "c1") -> AudioFrame:
    audio = legs[leg][seq * FRAME_BYTES:(seq + 1) * FRAME_BYTES] if payload is None else payload
    return AudioFrame(call_id, leg, seq, seq * FRAME_MS, 8000, "mulaw", audio,  # type: ignore[arg-type]
                      produced_at_ms=T0 + seq * FRAME_MS)


async def agent_with_silent_customer(legs: dict[str, bytes], run: Run, customer_frames: int) -> None:
    """The agent's whole leg; the customer sends ``customer_frames`` frames of silence, then nothing."""
    n = len(legs["agent"]) // FRAME_BYTES
    for seq in range(0, n, BATCH_FRAMES):
        batch = [frame(legs, "agent", s) for s in range(seq, min(n, seq + BATCH_FRAMES))]
        batch += [frame(legs, "customer", s, SILENCE) for s in range(seq, min(customer_frames, seq + BATCH_FRAMES))]
        await run.frames(batch, min(n, seq + BATCH_FRAMES) * FRAME_MS)
    counts = {"agent": n, **({"customer": customer_frames} if customer_frames else {})}
    await run.end(counts, n * FRAME_MS)


@pytest.mark.parametrize("held_final_max_ms", [2000, 5000])
async def test_a_silent_leg_holds_the_other_legs_finals_at_most_the_bound_of_stream_time(
    legs: dict[str, bytes], held_final_max_ms: int,
) -> None:
    # Reference: no customer leg at all, so nothing holds the agent's finals but their own decoding.
    alone = Run(held_final_max_ms)
    await agent_with_silent_customer(legs, alone, customer_frames=0)
    # The customer sends 1 s of silence, then nothing (one-way media, silence suppression).
    silent = Run(held_final_max_ms)
    await agent_with_silent_customer(legs, silent, customer_frames=50)
    assert silent.finals() == alone.finals() and len(alone.finals()) == 3
    call_end_ms = len(legs["agent"]) // FRAME_BYTES * FRAME_MS
    delays = {seg: silent.published_at[seg] - alone.published_at[seg] for seg in alone.published_at}
    # Each final out within the bound (plus one batch) of stream time after it would have been, and all
    # of them before the call's end.
    assert all(0 <= d <= held_final_max_ms + BATCH_FRAMES * FRAME_MS for d in delays.values()), delays
    assert all(at < call_end_ms for at in silent.published_at.values()), silent.published_at
    if held_final_max_ms == 5000:  # the 4.8 s segment ends at 8 s: held until 9.8 s of the agent's audio
        assert max(delays.values()) > 0


async def test_without_the_bound_a_silent_leg_holds_the_other_legs_finals_until_the_end(
    legs: dict[str, bytes],
) -> None:
    """What the bound prevents (and that the test above can fail): held until the call ends."""
    unbounded = Run(held_final_max_ms=10**9)
    await agent_with_silent_customer(legs, unbounded, customer_frames=50)
    call_end_ms = len(legs["agent"]) // FRAME_BYTES * FRAME_MS
    held = sorted(seg for seg, at in unbounded.published_at.items() if at == call_end_ms)
    assert held == ["c1/agent/000004788", "c1/agent/000009620"]


async def test_a_call_that_sends_nothing_at_all_is_moved_on_by_its_partitions_stream_time(
    legs: dict[str, bytes],
) -> None:
    run = Run(held_final_max_ms=5000)
    # The agent up to just after its 4.8-8.0 s segment, the customer 1 s of silence; then neither sends.
    for seq in range(0, 420, BATCH_FRAMES):
        batch = [frame(legs, "agent", s) for s in range(seq, seq + BATCH_FRAMES)]
        batch += [frame(legs, "customer", s, SILENCE) for s in range(seq, min(50, seq + BATCH_FRAMES))]
        await run.frames(batch, (seq + BATCH_FRAMES) * FRAME_MS)
    second = "c1/agent/000004788"
    assert second not in run.published_at  # held: the customer may still start a segment before it

    async def other_call_until(ms: int) -> None:
        """Another call on the same audio partition moves the partition's stream time on."""
        await run.processor.on_frames([(AUDIO_TP, run.offset, AudioFrame(
            "c2", "agent", ms // FRAME_MS, ms, 8000, "mulaw", SILENCE, produced_at_ms=T0 + ms))])  # type: ignore[arg-type]
        run.offset += 1
        await run.processor.tick()
        await run.settled()

    await other_call_until(8_400 + 500)
    assert second not in {f.segment_id for f in run.ports.finals()}
    await other_call_until(8_400 + 6_000)  # 6 s of stream time in which c1 sent nothing
    assert second in {f.segment_id for f in run.ports.finals()}
    assert "c1" in run.processor.calls  # released while the call is open, not by its end


async def test_a_leg_whose_audio_comes_later_than_the_bound_is_stored_and_the_qa_is_the_same(
    legs: dict[str, bytes],
) -> None:
    n = len(legs["agent"]) // FRAME_BYTES

    async def feed(run: Run, order: list[tuple[str, int]]) -> None:
        for i in range(0, len(order), 2 * BATCH_FRAMES):
            batch = [frame(legs, leg, seq) for leg, seq in order[i:i + 2 * BATCH_FRAMES]]
            await run.frames(batch, max(s for leg, s in order[:i + 2 * BATCH_FRAMES] if leg == "agent") * FRAME_MS)
        await run.end({"agent": n, "customer": n}, n * FRAME_MS)

    interleaved = [(leg, seq) for seq in range(n) for leg in ("agent", "customer")]
    in_order = Run()
    await feed(in_order, interleaved)
    # The customer's frames from 1 s to 12 s come only after the agent's first 12 s.
    late = [(leg, seq) for leg, seq in interleaved if not (leg == "customer" and 50 <= seq < 600)]
    late = late[:late.index(("agent", 599)) + 1] + [("customer", s) for s in range(50, 600)] + \
        late[late.index(("agent", 599)) + 1:]
    out_of_order = Run()
    await feed(out_of_order, late)

    def publishing_order(run: Run) -> list[tuple[int, str]]:
        return [(m.start_ms, m.leg) for m in run.ports.finals()]

    # The customer's 3.3 s segment went out after the agent's 4.8 s one (released 2 s of stream time
    # after the customer went quiet), and still every final is stored, with the same bounds and text.
    assert publishing_order(in_order) == sorted(publishing_order(in_order))
    assert publishing_order(out_of_order) != sorted(publishing_order(out_of_order))
    assert out_of_order.finals() == in_order.finals() and len(in_order.finals()) == 6
    a, b = in_order.qa(), out_of_order.qa()
    assert (b.score_pct, b.auto_failed, b.metrics, b.items, b.events) == (a.score_pct, a.auto_failed, a.metrics,
                                                                        a.items, a.events)


def test_the_calls_qa_is_evaluated_in_time_order_whatever_order_segments_were_released_in() -> None:
    """A must rule met twice: matched at its first time in the call, even if the later one came first."""
    config = QaConfig.from_settings(Settings())
    asked = [Segment("c1", "agent", f"c1/agent/{start:09d}", start, start + 2000,
                     "can you confirm your date of birth please") for start in (1_000, 40_000)]
    in_order, reversed_order = CallAnalyzer("c1", config), CallAnalyzer("c1", config)
    for segment in asked:
        in_order.process(segment)
    for segment in reversed(asked):
        reversed_order.process(segment)
    expected = in_order.finalize(60_000)
    [match] = [e for e in expected.events if e.rule == "identity_verification"]
    assert match.kind == "match" and match.offset_ms < 40_000
    assert reversed_order.finalize(60_000) == expected
