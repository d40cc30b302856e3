"""Audio messages longer than 20 ms (``audio_message_ms``) through the worker's call core (real front end
and VAD; fake ports and transcriber, no Kafka).

A leg's audio packed into 200 ms messages must give the segments, sample for sample, that 20 ms
messages give: the worker decodes and resamples each leg's messages of a batch in one go, and a missing
message is that much silence, as its ten 20 ms frames missing would be.
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
from pipeline.contracts.messages import AudioFrame, CallEvent, TranscriptSegment
from pipeline.ingest.replay import ReplayOptions, load_recording
from pipeline.qa.call import QaConfig
from pipeline.worker.calls import CallProcessor
from pipeline.worker.legs import LegState
from pipeline.worker.memory import MemoryPorts
from pipeline.worker.ports import Transcription

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "calls" / "call_01.wav"
SECONDS = 12
BYTES_PER_MS = 8  # mu-law at 8 kHz
AUDIO_TP, EVENTS_TP = ("audio", 0), ("events", 0)


@pytest.fixture(scope="module")
def legs() -> dict[str, bytes]:
    rec = load_recording(SAMPLE, ReplayOptions(encoding="mulaw", frame_ms=20))
    return {leg: payload[: SECONDS * 8000] for leg, payload in rec.encoded.items()}


class DigestTranscriber:
    """Says what it heard by a digest of the audio: two runs compare sample for sample."""

    idle = False  # no early decodes: each segment decoded once, at its end

    async def transcribe(self, audio_16k: np.ndarray, context: Sequence[int] = ()) -> Transcription:
        digest = hashlib.sha256(audio_16k.astype(np.float32).tobytes()).hexdigest()[:16]
        return Transcription(f"heard {digest}", -0.1, 0.0, 0.9, "fake", 1, 1, 0.0, 0.0)


async def _finals(legs: dict[str, bytes], message_ms: int, missing_ms: tuple[int, int] = (0, 0),
                  batch: int = 16) -> list[tuple[str, int, int, str]]:
    """The call sent as ``message_ms`` messages in batches of ``batch``; the agent's messages inside
    ``missing_ms`` [from, to) never come. Its finals: (leg, start, end, digest of the audio)."""
    settings = Settings()
    ports = MemoryPorts()
    processor = CallProcessor(settings, DigestTranscriber(), ports, ports,  # type: ignore[arg-type]
                              lambda rate, enc: LegFrontEnd(rate, enc, settings), QaConfig.from_settings(settings))
    await processor.on_event(EVENTS_TP, 0, CallEvent("c1", "start", legs=["agent", "customer"]))
    size = message_ms * BYTES_PER_MS
    count = -(-SECONDS * 1000 // message_ms)
    frames = [AudioFrame("c1", leg, seq, seq * message_ms, 8000, "mulaw", legs[leg][seq * size:(seq + 1) * size])  # type: ignore[arg-type]
              for seq in range(count) for leg in ("agent", "customer")
              if not (leg == "agent" and missing_ms[0] <= seq * message_ms < missing_ms[1])]
    for start in range(0, len(frames), batch):
        await processor.on_frames([(AUDIO_TP, start + i, f) for i, f in enumerate(frames[start:start + batch])])
    await processor.on_event(EVENTS_TP, 1, CallEvent("c1", "end", frame_counts={"agent": count, "customer": count}))

    async def done() -> None:
        while processor.calls or any(c.pending for c in processor.awaiting_release):
            await asyncio.sleep(0.01)

    await asyncio.wait_for(done(), timeout=120)
    return sorted((m.leg, m.start_ms, m.end_ms, m.text) for m in ports.messages
                  if isinstance(m, TranscriptSegment) and m.is_final)


async def test_200_ms_messages_give_the_segments_20_ms_frames_give_sample_for_sample(legs: dict[str, bytes]) -> None:
    frames = await _finals(legs, 20)
    assert len(frames) >= 3
    assert await _finals(legs, 200) == frames
    assert await _finals(legs, 200, batch=1) == frames  # one message a batch: the same, decoded apart


async def test_a_missing_200_ms_message_is_200_ms_of_silence_as_its_ten_frames_would_be(legs: dict[str, bytes]) -> None:
    gap = (2000, 2200)  # inside the agent's first turn
    frames = await _finals(legs, 20, missing_ms=gap)
    assert frames != await _finals(legs, 20)  # the gap changes what the agent's segment holds
    assert await _finals(legs, 200, missing_ms=gap) == frames


def test_a_leg_waits_for_a_missing_message_the_reorder_window_s_audio_not_ten_messages() -> None:
    settings = Settings()  # reorder_window_ms 200: ten 20 ms frames, one 200 ms message
    frames = LegState.open("c1", "agent", LegFrontEnd(8000, "mulaw", settings), 20, settings.max_segment_ms,
                           settings.reorder_window_ms)
    messages = LegState.open("c1", "agent", LegFrontEnd(8000, "mulaw", settings), 200, settings.max_segment_ms,
                             settings.reorder_window_ms)
    assert (frames.reorder.window, messages.reorder.window) == (10, 1)
    # A window of 400 ms is two 200 ms messages: a missing one is filled once 400 ms of audio past it came.
    leg = LegState.open("c1", "agent", LegFrontEnd(8000, "mulaw", settings), 200, settings.max_segment_ms, 400)
    message = b"\xff" * 1600
    assert [r.seq for r in leg.push(0, message, 0)] == [0]
    assert leg.push(2, message, 0) == []  # message 1 may still come: held
    released = leg.push(3, message, 0)
    assert [(r.seq, r.payload is None) for r in released] == [(1, True), (2, False), (3, False)]
