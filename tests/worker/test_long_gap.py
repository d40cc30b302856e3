"""A long gap in a leg's frames (a hold: the gateway sends nothing) is a boundary, not synthetic frames.

The worker's core (real front end and VAD, fake ports and transcriber, no Kafka) takes a leg with a
20-minute hold as cheaply as one with a 2 s gap: the hold's samples are neither made nor resampled nor
scored, only counted. Its finals are the offline analysis's (``Engine.leg_segments``, the path of
`callqa analyze`, which takes the hold's digital silence sample by sample), at their call time; and
through Kafka, a held library call's stored finals are its offline analysis's.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import pytest

from pipeline.analyze import analyze_recordings
from pipeline.asr.engine import Engine, LegFrontEnd
from pipeline.asr.recognizer import Recognizer
from pipeline.audio import codecs
from pipeline.audio.resample import StreamResampler
from pipeline.broker.producer import ContractProducer
from pipeline.config import Settings
from pipeline.contracts import Serde
from pipeline.contracts.messages import AudioFrame, CallEvent, TranscriptSegment
from pipeline.eval.call_library import LIBRARY_DIR, holds_of, load_manifest
from pipeline.ingest.replay import ReplayOptions, TelephonyReplay, load_recording
from pipeline.qa.call import QaConfig
from pipeline.segmentation.vad import load_vad
from pipeline.worker.calls import CallProcessor
from pipeline.worker.checkpoints import leg_checkpoint, leg_is_quiet, restore_leg
from pipeline.worker.legs import LegState
from pipeline.worker.memory import MemoryPorts
from pipeline.worker.ports import Transcription

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "calls" / "call_01.wav"
HELD_CALL = LIBRARY_DIR / "23_long_complaint.wav"  # on hold for 20 s, digital silence in the file
FRAME_BYTES = 160  # 20 ms of mu-law at 8 kHz
SPEECH_FRAMES = 400  # 8 s of the agent's leg before the gap and again after it
HOLD_FRAMES = 60_000  # 20 minutes
AUDIO_TP, EVENTS_TP = ("audio", 0), ("events", 0)


def _digest(audio_16k: np.ndarray) -> str:
    return hashlib.sha256(audio_16k.astype(np.float32).tobytes()).hexdigest()[:16]


class FakeTranscriber:
    """Says what it heard by a digest of the audio: finals compare sample for sample."""

    idle = False

    async def transcribe(self, audio_16k: np.ndarray, context: Sequence[int] = ()) -> Transcription:
        return Transcription(f"heard {_digest(audio_16k)}", -0.1, 0.0, 0.9, "fake", 1, 1, 0.0, 0.0)


@dataclass
class Work:
    """What went through the leg's resampler and VAD."""

    resampled: int = 0  # input samples
    largest: int = 0  # the largest chunk resampled at once
    scored: int = 0  # VAD windows

    def count(self, monkeypatch: pytest.MonkeyPatch, settings: Settings) -> None:
        vad, process = load_vad(settings.vad_model_path), StreamResampler.process
        score = vad.score

        def counted_process(resampler: StreamResampler, chunk: np.ndarray) -> np.ndarray:
            self.resampled += len(chunk)
            self.largest = max(self.largest, len(chunk))
            return process(resampler, chunk)

        def counted_score(inputs: np.ndarray, state: np.ndarray, *rate: int) -> tuple[np.ndarray, np.ndarray]:
            self.scored += len(inputs)
            return score(inputs, state, *rate)

        monkeypatch.setattr(StreamResampler, "process", counted_process)
        monkeypatch.setattr(vad, "score", counted_score)


@dataclass
class HeldCall:
    finals: list[tuple[int, int, str]]  # (start_ms, end_ms, text) of the agent leg
    resume: Work  # from the first frame after the gap to the call's end
    gap_frames: float


@pytest.fixture(scope="module")
def agent() -> bytes:
    return load_recording(SAMPLE, ReplayOptions(encoding="mulaw", frame_ms=20)).encoded["agent"][
        : SPEECH_FRAMES * FRAME_BYTES]


def _frame(seq: int, payload: bytes) -> AudioFrame:
    return AudioFrame("c1", "agent", seq, seq * 20, 8000, "mulaw", payload, produced_at_ms=seq * 20)


async def _held_call(agent: bytes, gap_frames: int, monkeypatch: pytest.MonkeyPatch) -> HeldCall:
    """8 s of speech, ``gap_frames`` frames that never come, the same 8 s again, in batches of 16 frames."""
    settings, ports = Settings(), MemoryPorts()
    processor = CallProcessor(settings, FakeTranscriber(), ports, ports,  # type: ignore[arg-type]
                              lambda rate, enc: LegFrontEnd(rate, enc, settings), QaConfig.from_settings(settings))
    await processor.on_event(EVENTS_TP, 0, CallEvent("c1", "start", legs=["agent"]))
    payloads = [agent[k * FRAME_BYTES:(k + 1) * FRAME_BYTES] for k in range(SPEECH_FRAMES)]
    before = [_frame(k, p) for k, p in enumerate(payloads)]
    after = [_frame(SPEECH_FRAMES + gap_frames + k, p) for k, p in enumerate(payloads)]
    for part in (before, after):
        if part is after:
            resume = Work()
            resume.count(monkeypatch, settings)
        offset = part[0].seq
        for start in range(0, len(part), 16):
            await processor.on_frames([(AUDIO_TP, offset + start + i, f) for i, f in enumerate(part[start:start + 16])])
    total = 2 * SPEECH_FRAMES + gap_frames
    await processor.on_event(EVENTS_TP, 1, CallEvent("c1", "end", frame_counts={"agent": total}))

    async def done() -> None:
        while processor.calls or any(c.pending for c in processor.awaiting_release):
            await asyncio.sleep(0.01)

    await asyncio.wait_for(done(), timeout=120)
    monkeypatch.undo()
    assert processor.failures == []
    finals = sorted((m.start_ms, m.end_ms, m.text) for m in ports.messages
                    if isinstance(m, TranscriptSegment) and m.is_final)
    return HeldCall(finals, resume, processor.metrics.gap_frames._value.get())


def _offline(agent: bytes, gap_frames: int) -> list[tuple[int, int, str]]:
    """The same leg as `callqa analyze` takes it: the whole recording, the hold as its digital silence."""
    silence = codecs.encode(np.zeros(gap_frames * 160, dtype=np.float32), "mulaw")
    samples = codecs.decode(agent + silence + agent, "mulaw")
    engine = Engine(cast(Recognizer, None), Settings())  # segmentation only: no model
    return [(s.start_ms, s.end_ms, f"heard {_digest(s.audio)}") for s in engine.leg_segments(samples, 8000)]


async def test_a_20_minute_hold_costs_what_a_2_s_gap_costs_and_keeps_call_time(
    agent: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = await _held_call(agent, HOLD_FRAMES, monkeypatch)
    short = await _held_call(agent, 100, monkeypatch)  # 2 s
    # Every missing frame is counted, made or not.
    assert (held.gap_frames, short.gap_frames) == (HOLD_FRAMES, 100)
    # The resume after the hold resampled and scored what the resume after 2 s did, give or take a window
    # (2 s of silence is scored whole; of the hold, 2 s and one window): not the hold's 9.6 M samples.
    assert short.resume.scored > 0 and held.resume.scored <= short.resume.scored + 2
    assert held.resume.resampled <= short.resume.resampled + 1000
    assert held.resume.largest < 8000  # no chunk of the hold was made, let alone resampled at once
    # The finals are the offline analysis's, at their call time.
    for call, gap in ((held, HOLD_FRAMES), (short, 100)):
        assert len(call.finals) >= 4 and call.finals == _offline(agent, gap)
    # After the hold the VAD starts afresh and the clock has moved on: the same speech again gives the
    # same segments and samples as the leg's start, 8 s + 20 min later.
    shift = (SPEECH_FRAMES + HOLD_FRAMES) * 20
    first = [f for f in held.finals if f[1] <= SPEECH_FRAMES * 20]
    again = [f for f in held.finals if f[0] >= shift]
    assert first and [(s + shift, e + shift, text) for s, e, text in first] == again[:len(first)]


def _leg_segments(leg: LegState, frames: list[tuple[int, bytes]], total: int | None) -> list[tuple[int, int, str]]:
    """The segments ``frames`` close on ``leg``, as the worker's stages feed them; with ``total``, the leg
    then finished (the call's end)."""
    closed = [s for seq, payload in frames for audio in leg.take(seq, payload, seq * 20)
              for s in leg.front_end.segmenter.take(audio)]
    closed += [] if total is None else leg.finish(total)
    return [(s.start_ms, s.end_ms, _digest(s.audio)) for s in closed]


@pytest.mark.parametrize("kind", ["hold", "zero frames"])
def test_a_leg_checkpointed_in_or_after_long_silence_resumes_as_the_uninterrupted_one(agent: bytes, kind: str) -> None:
    """A hold's gap (20 min, taken by its length) or 3 s of frames of digital silence: a checkpoint taken
    wherever the leg is quiet, before, inside or after the boundary, restores a leg that goes on exactly."""
    settings = Settings()
    speech = [agent[k * FRAME_BYTES:(k + 1) * FRAME_BYTES] for k in range(SPEECH_FRAMES)]
    silent = codecs.encode(np.zeros(160, dtype=np.float32), "mulaw")
    middle = [] if kind == "hold" else [silent] * 150
    gap = HOLD_FRAMES if kind == "hold" else 0
    frames = [(k, p) for k, p in enumerate(speech + middle)]
    frames += [(len(frames) + gap + k, p) for k, p in enumerate(speech)]
    total = frames[-1][0] + 1

    def open_leg() -> LegState:
        return LegState.open("c1", "agent", LegFrontEnd(8000, "mulaw", settings), 20, settings.max_segment_ms,
                             settings.reorder_window_ms)

    reference = _leg_segments(open_leg(), frames, total)
    assert len(reference) >= 4
    checked: set[str] = set()
    for at in range(SPEECH_FRAMES, SPEECH_FRAMES + len(middle) + 40, 7):
        first = open_leg()
        before = _leg_segments(first, frames[:at], None)
        if not leg_is_quiet(first):
            continue
        resumed = restore_leg(leg_checkpoint(first), "c1", LegFrontEnd(8000, "mulaw", settings),
                              settings.max_segment_ms, settings.reorder_window_ms)
        assert before + _leg_segments(resumed, frames[at:], total) == reference, f"checkpoint at frame {at}"
        stream = first.front_end.segmenter.vad_stream
        checked.add("dormant" if stream.dormant else "in the run" if stream.zero_windows else "after")
    # A hold's gap is taken whole with the frame after it: its checkpoints come after the boundary.
    assert checked == ({"after"} if kind == "hold" else {"in the run", "dormant", "after"})


@pytest.mark.broker
@pytest.mark.slow
def test_a_held_library_call_streamed_equals_its_offline_analysis(kafka_settings, start_worker) -> None:  # type: ignore[no-untyped-def]
    """Through Kafka: the replay sends no frame in the hold (20 s), `callqa analyze` takes its digital
    silence sample by sample; both give the same finals, text and bounds."""
    manifest = load_manifest()
    (call,) = [c for c in manifest["calls"] if c["file"] == HELD_CALL.name]
    rec = load_recording(HELD_CALL, ReplayOptions())
    rec.holds_ms = holds_of(call)
    assert rec.holds_ms and rec.holds_ms[0][1] - rec.holds_ms[0][0] > 2 * Settings().gap_boundary_ms
    worker = start_worker()
    player = TelephonyReplay(ContractProducer(kafka_settings.bootstrap, Serde.from_settings()),
                             kafka_settings.topic_audio, kafka_settings.topic_call_events)
    (call_id,) = player.run([rec], ReplayOptions()).call_ids
    worker.wait_for_calls([call_id])
    (offline,) = analyze_recordings([HELD_CALL], Engine.load(), QaConfig.from_settings(Settings()))
    stored = worker.query("SELECT leg, start_ms, end_ms, text FROM segments FINAL WHERE call_id = {c:String} "
                          "AND is_final = 1 ORDER BY start_ms, leg", c=call_id)
    hold_end = rec.holds_ms[0][1]
    assert any(s.start_ms >= hold_end for s in offline.segments)  # speech after the hold is compared too
    assert [(r["leg"], r["start_ms"], r["end_ms"], r["text"]) for r in stored] == [
        (s.leg, s.start_ms, s.end_ms, s.text) for s in offline.segments]
    # The calls row keeps when the call was on hold (the call page draws it), as the replay held it.
    (row,) = worker.query("SELECT holds FROM calls FINAL WHERE call_id = {c:String}", c=call_id)
    assert [(h["start_ms"], h["end_ms"]) for h in row["holds"]] == rec.holds_ms
