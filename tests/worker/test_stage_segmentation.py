"""LegSegmentation (pipeline/worker/segmentation.py): legs' audio through one batched VAD run, closed
segments announced to their calls. Real front ends and VAD on a sample call; no Kafka."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.asr.engine import LegFrontEnd
from pipeline.config import Settings
from pipeline.contracts.messages import CallEvent
from pipeline.ingest.replay import ReplayOptions, load_recording
from pipeline.qa.call import CallAnalyzer, QaConfig
from pipeline.worker.intake import LegAudio
from pipeline.worker.legs import LegState
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.segmentation import LegSegmentation
from pipeline.worker.state import CallState

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "calls" / "call_01.wav"
FRAME_BYTES = 160  # 20 ms of mu-law at 8 kHz
FRAMES = 20 * 50  # 20 s
SETTINGS = Settings()


@pytest.fixture(scope="module")
def legs() -> dict[str, bytes]:
    return load_recording(SAMPLE, ReplayOptions(encoding="mulaw", frame_ms=20)).encoded


def _call(names: list[str]) -> CallState:
    call = CallState("c1", analyzer=CallAnalyzer("c1", QaConfig.from_settings(SETTINGS)))
    for name in names:
        call.legs[name] = LegState.open("c1", name, LegFrontEnd(8000, "mulaw", SETTINGS), 20,
                                        SETTINGS.max_segment_ms, SETTINGS.reorder_window_ms)
    return call


def _audio(call: CallState, legs: dict[str, bytes], seqs: range) -> list[LegAudio]:
    """The 16 kHz audio frames ``seqs`` of each of the call's legs let out, as intake hands it on."""
    out = []
    for name, leg in call.legs.items():
        chunks = [leg.release(s, legs[name][s * FRAME_BYTES:(s + 1) * FRAME_BYTES], s * 20) for s in seqs]
        out.append(LegAudio(call, leg, [c for c in chunks if c is not None]))
    return out


def _run(legs: dict[str, bytes], names: list[str]) -> tuple[CallState, list[tuple[str, int, int]]]:
    call, stage, closed = _call(names), LegSegmentation(WorkerMetrics()), []
    for start in range(0, FRAMES, 8):
        closed += stage.segment(_audio(call, legs, range(start, start + 8)))
    return call, [(c.leg.leg, c.seg.start_ms, c.seg.end_ms) for c in closed]


def test_legs_segmented_in_one_vad_run_get_the_segments_each_gets_alone(legs: dict[str, bytes]) -> None:
    call, together = _run(legs, ["agent", "customer"])
    alone = [seg for name in ("agent", "customer") for seg in _run(legs, [name])[1]]
    assert len(together) >= 4 and sorted(together) == sorted(alone)
    # Announced in the order they closed, each unresolved until it is emitted or skipped.
    for name in ("agent", "customer"):
        starts = [start for leg, start, _ in together if leg == name]
        assert call.announced[name] == [f"c1/{name}/{start:09d}" for start in starts]
    assert call.unresolved == {sid for ids in call.announced.values() for sid in ids}


def test_flush_closes_the_open_segment_and_fills_missing_frames_up_to_the_end_events_count(
    legs: dict[str, bytes],
) -> None:
    call, metrics = _call(["agent"]), WorkerMetrics()
    stage, agent = LegSegmentation(metrics), call.legs["agent"]
    seq = 0
    while not agent.front_end.segmenter.in_speech or seq < 50:  # stop in the middle of speech
        stage.segment(_audio(call, legs, range(seq, seq + 1)))
        seq += 1
    call.end = CallEvent("c1", "end", frame_counts={"agent": seq + 5})
    flushed = stage.flush(call)
    assert [c.seg.reason for c in flushed] == ["flush"] and agent.finished
    assert agent.frames_released == seq + 5
    assert metrics.registry.get_sample_value("callqa_gap_frames_total") == 5
    assert call.announced["agent"][-1] == flushed[0].segment_id and flushed[0].segment_id in call.unresolved
    assert stage.flush(call) == []  # a leg finishes once
