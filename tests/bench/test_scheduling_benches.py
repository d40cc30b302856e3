"""The scheduling benchmarks' own arithmetic: segment figures and latency classes; the
engine-level traffic they share (pipeline/bench/offered.py) through a real SegmentBatcher."""

from __future__ import annotations

import asyncio

import numpy as np

from pipeline.asr.results import AudioSegment
from pipeline.bench.batch_order import SimulatedRecognizer, run_order
from pipeline.bench.offered import arrivals
from pipeline.bench.offered import percentiles_s as percentiles
from pipeline.bench.segment_counts import segment_figures
from pipeline.config import Settings


def test_segment_figures_count_lengths_cuts_and_encoder_windows() -> None:
    f = segment_figures([1200, 4000, 12500], ["endpoint", "endpoint", "max_length"], recordings=2, bucket_s=5.0)
    assert f["segments"] == 3 and f["segments_per_recording"] == 1.5
    assert f["over_10_s"] == 1 and f["cut_at_max_length"] == 1
    assert f["encoder_window_s"] == 5 + 5 + 15  # each length rounded up to the 5 s bucket
    assert f["length_s"]["max"] == 12.5 and f["audio_s"] == 17.7


def test_segment_figures_of_no_segments() -> None:
    assert segment_figures([], [], recordings=4, bucket_s=5.0) == {"segments": 0, "recordings": 4}


def test_percentiles_of_latencies() -> None:
    p = percentiles([float(x) for x in range(1, 101)])
    assert p["n"] == 100 and p["p50_s"] == 50.5 and p["max_s"] == 100.0
    assert percentiles([]) == {"n": 0}


def _segments(lengths_s: list[float]) -> list[AudioSegment]:
    return [AudioSegment(0, int(x * 1000), np.zeros(int(x * 16000), dtype=np.float32)) for x in lengths_s]


def test_arrivals_carry_the_offered_audio_per_second_or_come_all_at_once() -> None:
    segments = _segments([2.0] * 400)
    at = arrivals(segments, 4.0, seed=3)  # 4 audio s per s of 2 s segments: 2 segments per s
    assert np.all(np.diff(at) >= 0) and 180 < at[-1] < 220
    assert np.array_equal(at, arrivals(segments, 4.0, seed=3)) and not np.array_equal(at, arrivals(segments, 4.0))
    assert not arrivals(segments, None).any()


def test_a_backlog_is_decoded_in_full_batches_and_every_segment_once() -> None:
    settings = Settings(max_batch=4, batch_order="shortest")  # type: ignore[call-arg]
    segments = _segments([1.0, 2.0, 4.0, 9.0] * 3)
    backlog = asyncio.run(run_order(SimulatedRecognizer(5.0), segments, arrivals(segments, None), settings))
    assert backlog["latency"]["n"] == 12 and backlog["mean_batch_per_segment"] >= 3.0  # batches of up to 4
    assert sum(c["n"] for c in backlog["by_length"].values()) == 12 and backlog["by_length"]["long"]["n"] == 3
