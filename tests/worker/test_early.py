"""Early decoding (pipeline/worker/early.py) in the worker's call core: real front end and VAD, fake ports.

A final decoded early must be the final decoded at its endpoint: same segments, same samples, same text.
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
from pipeline.worker.memory import MemoryPorts
from pipeline.worker.ports import Transcription

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "calls" / "call_01.wav"
FRAME_BYTES = 160  # 20 ms of mu-law at 8 kHz
AUDIO_TP, EVENTS_TP = ("audio", 0), ("events", 0)


class DigestTranscriber:
    """Names the audio it heard by a digest; ``idle`` is what the batcher would say."""

    def __init__(self, idle: bool) -> None:
        self.idle = idle
        self.heard: list[str] = []

    async def transcribe(self, audio_16k: np.ndarray, context: Sequence[int] = ()) -> Transcription:
        await asyncio.sleep(0.002)  # a batch takes time: frames keep coming meanwhile
        digest = hashlib.sha256(audio_16k.astype(np.float32).tobytes()).hexdigest()[:16]
        self.heard.append(digest)
        return Transcription(f"heard {digest}", -0.1, 0.0, 0.9, "fake", 1, 1, 0.0, 0.0)


@pytest.fixture(scope="module")
def legs() -> dict[str, bytes]:
    return load_recording(SAMPLE, ReplayOptions(encoding="mulaw", frame_ms=20)).encoded


async def _run(legs: dict[str, bytes], idle: bool) -> tuple[CallProcessor, MemoryPorts, DigestTranscriber]:
    settings = Settings(early_decode=True)
    ports, transcriber = MemoryPorts(), DigestTranscriber(idle)
    processor = CallProcessor(settings, transcriber, ports, ports,  # type: ignore[arg-type]
                              lambda rate, enc: LegFrontEnd(rate, enc, settings), QaConfig.from_settings(settings))
    await processor.on_event(EVENTS_TP, 0, CallEvent("c1", "start", legs=["agent", "customer"]))
    n = min(len(p) for p in legs.values()) // FRAME_BYTES
    offset = 0
    for seq in range(0, n, 4):  # 80 ms of both legs per batch, as a live consumer takes them
        batch = []
        for s in range(seq, min(seq + 4, n)):
            for leg in ("agent", "customer"):
                frame = AudioFrame("c1", leg, s, s * 20, 8000, "mulaw",  # type: ignore[arg-type]
                                   legs[leg][s * FRAME_BYTES:(s + 1) * FRAME_BYTES])
                batch.append((AUDIO_TP, offset, frame))
                offset += 1
        await processor.on_frames(batch)
        await asyncio.sleep(0)  # let decodes run between batches
    await processor.on_event(EVENTS_TP, 1, CallEvent("c1", "end", frame_counts={"agent": n, "customer": n}))

    async def done() -> None:
        while processor.calls or any(c.pending for c in processor.awaiting_release):
            await asyncio.sleep(0.01)

    await asyncio.wait_for(done(), timeout=120)
    return processor, ports, transcriber


def _finals(ports: MemoryPorts) -> list[tuple[str, str, int, int, str]]:
    return sorted((m.segment_id, m.leg, m.start_ms, m.end_ms, m.text) for m in ports.messages
                  if isinstance(m, TranscriptSegment) and m.is_final)


def _count(processor: CallProcessor, outcome: str) -> float:
    value = processor.metrics.registry.get_sample_value("callqa_early_decodes_total", {"outcome": outcome})
    return value or 0.0


async def test_early_decoded_finals_are_the_finals_decoded_at_the_endpoint(legs: dict[str, bytes]) -> None:
    _, reference, ref_transcriber = await _run(legs, idle=False)
    processor, ports, transcriber = await _run(legs, idle=True)
    assert len(_finals(reference)) >= 6
    assert _finals(ports) == _finals(reference)
    used, started, overtaken = (_count(processor, o) for o in ("used", "started", "overtaken"))
    assert used >= len(_finals(reference)) // 2  # most segments close at their endpoint
    assert started == used + overtaken
    # A used early decode is the final's decode: no segment is decoded twice for it.
    assert len(transcriber.heard) <= len(ref_transcriber.heard) + overtaken


async def test_no_early_decode_while_the_batcher_is_busy(legs: dict[str, bytes]) -> None:
    processor, _, transcriber = await _run(legs, idle=False)
    assert _count(processor, "started") == 0
    assert len(transcriber.heard) == len(set(transcriber.heard))


@pytest.mark.parametrize(("early_decode", "processes", "on"), [
    (None, 2, True), (None, 0, False),  # unset: on only when decodes leave the event loop's GIL
    (False, 2, False), (True, 0, True),  # set: as set
])
def test_early_decoding_is_on_by_default_where_batches_decode_in_child_processes(
    early_decode: bool | None, processes: int, on: bool
) -> None:
    from pipeline.worker.early import early_decode_enabled

    assert Settings().early_decode is None
    assert early_decode_enabled(Settings(early_decode=early_decode, inference_processes=processes)) is on
