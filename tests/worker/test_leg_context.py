"""Previous text per leg (CALLQA_CONTEXT_TOKENS) in the worker's call core: real front end and VAD, a
fake transcriber that records the context each segment was submitted with."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from pipeline.asr.engine import LegFrontEnd
from pipeline.config import Settings
from pipeline.contracts.messages import AudioFrame, CallEvent
from pipeline.ingest.replay import ReplayOptions, load_recording
from pipeline.qa.call import QaConfig
from pipeline.worker.calls import CallProcessor
from pipeline.worker.memory import MemoryPorts
from pipeline.worker.ports import Transcription

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "calls" / "call_01.wav"
FRAME_BYTES = 160  # 20 ms of mu-law at 8 kHz


class ContextRecorder:
    """Gives every segment one token of its own and remembers what context it came with."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, tuple[int, ...]]] = []  # (the segment's token, its context)

    async def transcribe(self, audio_16k: np.ndarray, context: Sequence[int] = (), preview: bool = False,
                         ) -> Transcription:
        token = 1000 + len(self.calls)
        self.calls.append((token, tuple(context)))
        await asyncio.sleep(0)
        return Transcription(f"said {token}", -0.1, 0.0, 0.9, "fake", 1, 1, 0.0, 0.0, tokens=(token,))


async def _run(context_tokens: int) -> ContextRecorder:
    legs = load_recording(SAMPLE, ReplayOptions(encoding="mulaw", frame_ms=20)).encoded
    settings = Settings(context_tokens=context_tokens)
    ports, transcriber = MemoryPorts(), ContextRecorder()
    processor = CallProcessor(settings, transcriber, ports, ports,  # type: ignore[arg-type]
                              lambda rate, enc: LegFrontEnd(rate, enc, settings), QaConfig.from_settings(settings))
    await processor.on_event(("events", 0), 0, CallEvent("c1", "start", legs=["agent", "customer"]))
    n = min(len(p) for p in legs.values()) // FRAME_BYTES
    offset = 0
    for seq in range(0, n, 4):
        batch = []
        for s in range(seq, min(seq + 4, n)):
            for leg in ("agent", "customer"):
                frame = AudioFrame("c1", leg, s, s * 20, 8000, "mulaw",  # type: ignore[arg-type]
                                   legs[leg][s * FRAME_BYTES:(s + 1) * FRAME_BYTES])
                batch.append((("audio", 0), offset, frame))
                offset += 1
        await processor.on_frames(batch)
        await asyncio.sleep(0)
    await processor.on_event(("events", 0), 1, CallEvent("c1", "end", frame_counts={"agent": n, "customer": n}))

    async def done() -> None:
        while processor.calls or any(c.pending for c in processor.awaiting_release):
            await asyncio.sleep(0.01)

    await asyncio.wait_for(done(), timeout=120)
    return transcriber


@pytest.mark.parametrize("context_tokens", [0, 32])
async def test_each_segment_is_decoded_after_its_own_legs_previous_finals(context_tokens: int) -> None:
    recorder = await _run(context_tokens)
    assert len(recorder.calls) >= 6
    if context_tokens == 0:
        assert all(context == () for _, context in recorder.calls)
        return
    with_context = [(token, context) for token, context in recorder.calls if context]
    assert len(with_context) >= len(recorder.calls) // 2  # all but each leg's first, within 30 s gaps
    for token, context in with_context:
        # earlier segments' tokens, in order, none of them its own
        assert list(context) == sorted(context) and all(t < token for t in context)
    # a segment, its context and that context's segments are one leg: the relation splits the call's
    # segments into at least two groups (agent, customer); mixing legs would join them into one
    group = {token: token for token, _ in recorder.calls}

    def root(t: int) -> int:
        while group[t] != t:
            t = group[t]
        return t

    for token, context in with_context:
        for t in context:
            group[root(t)] = root(token)
    assert len({root(t) for t, _ in recorder.calls}) >= 2
