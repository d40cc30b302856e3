"""The scheduling benchmarks' own arithmetic (issue 25 item 3): segment figures and latency classes."""

from __future__ import annotations

from pipeline.bench.batch_order import percentiles
from pipeline.bench.segment_counts import segment_figures


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
