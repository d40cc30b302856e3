"""Error isolation in the worker's call core (real front end and VAD; fake ports, no Kafka).

One bad frame affects only itself: it is rejected before it touches any state, its seq stays a gap the
jitter buffer fills with silence, and every other frame of its batch is processed as if it had simply
been missing. A call task that raises is a bug: the call is never released and the worker is unhealthy.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.asr.engine import LegFrontEnd
from pipeline.config import Settings
from pipeline.contracts.messages import AudioFrame, CallEvent, TranscriptSegment
from pipeline.ingest.replay import ReplayOptions, load_recording
from pipeline.qa.call import QaConfig
from pipeline.worker.calls import CallProcessor
from pipeline.worker.frames import RejectedFrame
from pipeline.worker.health import WorkerHealth
from pipeline.worker.memory import MemoryPorts
from pipeline.worker.ports import Transcription

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "calls" / "call_01.wav"
FRAME_BYTES = 160  # 20 ms of mu-law at 8 kHz
SECONDS = 8
AUDIO_TP, EVENTS_TP = ("audio", 0), ("events", 0)


@pytest.fixture(scope="module")
def legs() -> dict[str, bytes]:
    rec = load_recording(SAMPLE, ReplayOptions(encoding="mulaw", frame_ms=20))
    return {leg: payload[: SECONDS * 8000] for leg, payload in rec.encoded.items()}


class FakeTranscriber:
    """Says what it heard by a digest of the audio, so two runs can be compared sample for sample."""

    def __init__(self) -> None:
        self.heard: list[str] = []

    idle = False  # no early decodes (pipeline/worker/early.py): each segment decoded once, at its end

    async def transcribe(self, audio_16k: np.ndarray, context: Sequence[int] = (), preview: bool = False,
                         ) -> Transcription:
        digest = hashlib.sha256(audio_16k.astype(np.float32).tobytes()).hexdigest()[:16]
        self.heard.append(digest)
        return Transcription(f"heard {digest}", -0.1, 0.0, 0.9, "fake", 1, 1, 0.0, 0.0)


class Recorder(MemoryPorts):
    """The in-memory ports; ``fail_table``: writes to that table raise (a bug downstream)."""

    def __init__(self, fail_table: str = "") -> None:
        super().__init__()
        self.fail_table = fail_table

    async def write(self, table: str, rows: Any) -> None:
        if table == self.fail_table:
            raise RuntimeError(f"cannot map rows of {table}")
        await super().write(table, rows)


def _processor(recorder: Recorder, transcriber: FakeTranscriber) -> CallProcessor:
    settings = Settings()
    return CallProcessor(settings, transcriber, recorder, recorder,  # type: ignore[arg-type]
                         lambda rate, enc: LegFrontEnd(rate, enc, settings), QaConfig.from_settings(settings))


def _good(leg: str, seq: int, legs: dict[str, bytes]) -> AudioFrame:
    return AudioFrame("c1", leg, seq, seq * 20, 8000, "mulaw",  # type: ignore[arg-type]
                      legs[leg][seq * FRAME_BYTES:(seq + 1) * FRAME_BYTES])


# Frames that take the place of good ones (the good frame never comes), one of each kind of defect.
BROKEN: dict[tuple[str, int], dict[str, Any]] = {
    ("agent", 30): {"sample_rate": 0},
    ("agent", 61): {"sample_rate": 12_345},
    ("customer", 95): {"encoding": "opus"},
    ("customer", 130): {"payload": b""},
    ("agent", 170): {"encoding": "pcm16", "payload": b"\0" * 161},  # odd-length pcm16
    ("customer", 200): {"payload": b"\xff" * 8001},  # longer than a second
    ("agent", 240): {"leg": "supervisor"},
    ("customer", 260): {"encoding": "pcm16", "payload": b"\0" * 320},  # fine alone, not the leg's encoding
}


async def _run(legs: dict[str, bytes], bad: bool) -> tuple[CallProcessor, Recorder, FakeTranscriber, list[RejectedFrame]]:
    """The call in batches of 16 frames; the BROKEN seqs are missing, or (``bad``) broken frames instead,
    plus a frame with a negative seq."""
    recorder, transcriber = Recorder(), FakeTranscriber()
    processor = _processor(recorder, transcriber)
    await processor.on_event(EVENTS_TP, 0, CallEvent("c1", "start", legs=["agent", "customer"]))
    frames: list[AudioFrame] = []
    n = SECONDS * 50
    for seq in range(n):
        for leg in ("agent", "customer"):
            defect = BROKEN.get((leg, seq))
            if defect is None:
                frames.append(_good(leg, seq, legs))
            elif bad:
                frames.append(AudioFrame(**{**_good(leg, seq, legs).__dict__, **defect}))
        if bad and seq == 100:
            frames.append(AudioFrame(**{**_good("agent", 0, legs).__dict__, "seq": -1}))
    rejected: list[RejectedFrame] = []
    for start in range(0, len(frames), 16):
        batch = [(AUDIO_TP, start + i, f) for i, f in enumerate(frames[start:start + 16])]
        rejected += await processor.on_frames(batch)
    await processor.on_event(EVENTS_TP, 1, CallEvent("c1", "end", frame_counts={"agent": n, "customer": n}))
    await _finished(processor)
    return processor, recorder, transcriber, rejected


async def _finished(processor: CallProcessor) -> None:
    async def done() -> None:
        while processor.calls or any(c.pending for c in processor.awaiting_release):
            await asyncio.sleep(0.01)

    await asyncio.wait_for(done(), timeout=120)  # a call that never completes fails, not hangs


async def _settled(processor: CallProcessor) -> None:
    async def done() -> None:
        while any(c.pending for c in [*processor.calls.values(), *processor.awaiting_release]):
            await asyncio.sleep(0.01)

    await asyncio.wait_for(done(), timeout=120)


def _finals(recorder: Recorder) -> list[tuple[str, str, int, int, str]]:
    return sorted((m.segment_id, m.leg, m.start_ms, m.end_ms, m.text) for m in recorder.messages
                  if isinstance(m, TranscriptSegment) and m.is_final)


async def test_bad_frames_are_rejected_alone_and_the_rest_is_processed_as_if_they_were_missing(
    legs: dict[str, bytes],
) -> None:
    _, reference, ref_heard, none_rejected = await _run(legs, bad=False)
    processor, recorder, heard, rejected = await _run(legs, bad=True)
    assert none_rejected == []
    # Only the bad frames: each named with what is wrong with it.
    problems = {(r.frame.leg, r.frame.seq): r.error.problem for r in rejected}
    assert problems == {
        ("agent", 30): "unsupported sample rate 0",
        ("agent", 61): "unsupported sample rate 12345",
        ("customer", 95): "unknown encoding 'opus'",
        ("customer", 130): "empty payload",
        ("agent", 170): "161 bytes is not a whole number of pcm16 samples",
        ("customer", 200): "8001 samples is longer than 1000 ms",
        ("supervisor", 240): "unknown leg (known: agent, customer)",
        ("customer", 260): "8000 Hz pcm16 differs from the leg's earlier frames (8000 Hz mulaw)",
        ("agent", -1): "negative seq",
    }
    # Every good frame's audio was transcribed exactly as without the bad ones: same segments, same
    # timestamps, same samples (the transcriber's digest), and the call ended normally.
    finals = _finals(recorder)
    assert len(finals) >= 2 and finals == _finals(reference)
    assert sorted(heard.heard) == sorted(ref_heard.heard)
    assert [r["end_reason"] for t, r in recorder.rows if t == "calls"] == ["end"]
    assert processor.failures == []


async def test_a_rejected_frame_holds_the_commit_until_its_dead_letter_is_delivered(legs: dict[str, bytes]) -> None:
    processor, _, _, rejected = await _run(legs, bad=True)
    first = min(r.offset for r in rejected)
    # The call is done and released: only the frames on their way to the dead-letter topic hold the commit.
    assert (await processor.make_durable())[AUDIO_TP] == first
    for r in rejected:
        letter = processor.dead_letter_message(r.tp, r.offset, b"c1", b"", r.error, r.frame)
        assert letter.error_type == "FrameError" and r.error.problem in letter.reason
        processor.dead_letter_delivered(r.tp, r.offset)
    assert (await processor.make_durable())[AUDIO_TP] == processor.offsets.consumed_up_to(AUDIO_TP)


@pytest.mark.parametrize("fail_table, task", [("call_qa", "finish"), ("latency", "segment")])
async def test_a_failing_call_task_fails_the_call_it_is_never_released_and_the_worker_is_unhealthy(
    legs: dict[str, bytes], fail_table: str, task: str,
) -> None:
    recorder, transcriber = Recorder(fail_table=fail_table), FakeTranscriber()
    processor = _processor(recorder, transcriber)
    await processor.on_event(EVENTS_TP, 0, CallEvent("c1", "start", legs=["agent"]))
    n = SECONDS * 50
    await processor.on_frames([(AUDIO_TP, seq, _good("agent", seq, legs)) for seq in range(n)])
    await processor.on_event(EVENTS_TP, 1, CallEvent("c1", "end", frame_counts={"agent": n}))
    await _settled(processor)  # every task has run: the failed ones too
    expected = f"call c1: {task} task failed: RuntimeError: cannot map rows of {fail_table}"
    assert processor.failures and set(processor.failures) == {expected}
    assert processor.metrics.task_failures.labels(task)._value.get() == len(processor.failures)
    assert sum(processor.metrics.task_failures.labels(k)._value.get() for k in ("segment", "emit", "finish",
                                                                               "partial")) == len(processor.failures)
    # Some of its outputs were published, but the call is not complete: its offsets stay uncommitted.
    assert any(isinstance(m, TranscriptSegment) for m in recorder.messages)
    assert await processor.make_durable() == {}
    assert processor.offsets.committable() == {AUDIO_TP: 0, EVENTS_TP: 0}  # held at the call's first message
    health = WorkerHealth({}, lambda: processor.failures)
    assert health.report() == (503, {"status": "failing", "reasons": processor.failures})
