"""`callqa bench gateway`'s readings of the gateway: the ack-latency histogram from /metrics, its
percentiles, and the gateway's CPU and RSS from /proc; a small SIPREC run and the JSON it writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.bench.gateway import HISTOGRAM
from pipeline.bench.probes import cpu_seconds, histogram, quantile, rss_bytes
from pipeline.gateway.metrics import GatewayMetrics

REPO = Path(__file__).resolve().parents[2]


def test_percentiles_of_the_gateways_own_histogram() -> None:
    metrics = GatewayMetrics()
    metrics.ack_latency.observe_many(np.array([0.003] * 30))
    metrics.ack_latency.observe_many(np.array([0.005] * 20 + [0.015] * 49 + [0.2]))  # 0.005 is in le="0.005"
    buckets = histogram(metrics.exposition().decode(), HISTOGRAM)
    assert buckets["+Inf"] == 100 and buckets["0.005"] == 50 and buckets["0.02"] == 99
    assert quantile(buckets, 0.50) == 0.005  # the 50th of 100 is the last in (0, 5 ms]
    assert 0.01 < quantile(buckets, 0.99) <= 0.02  # inside (10, 20 ms], linear within it
    assert metrics.value("callqa_gateway_frame_ack_seconds_count") == 100
    assert abs(metrics.value("callqa_gateway_frame_ack_seconds_sum") - (0.09 + 0.1 + 0.735 + 0.2)) < 1e-9
    assert quantile({"0.005": 0.0, "+Inf": 0.0}, 0.99) == 0.0  # no frames: nothing to say


def test_cpu_and_rss_of_a_process() -> None:
    assert cpu_seconds(os.getpid()) > 0
    assert 10_000 * 1024 < rss_bytes(os.getpid()) < 10_000_000 * 1024


@pytest.mark.broker
def test_a_small_siprec_run_writes_its_figures_per_session(broker: str, tmp_path: Path) -> None:
    """`callqa bench gateway --protocol siprec` at 4 sessions (8 RTP streams) for a few seconds: a real gateway
    process, one simulator process (RecordingLoad), the result under its own name (no timing asserts)."""
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "bench", "gateway", "--protocol", "siprec",
                           "--legs", "8", "--warmup-s", "1", "--window-s", "3", "--simulators", "1",
                           "--gateway-cpus", "", "--simulator-cpus", "", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "COLUMNS": "160"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not (tmp_path / "gateway.json").exists()  # the Twilio figures are not overwritten
    doc = json.loads((tmp_path / "gateway-siprec.json").read_text())
    assert doc["protocol"] == "siprec" and doc["benchmark"] == "callqa bench gateway --protocol siprec"
    assert doc["goals"]["sessions_per_core"] == 500 and doc["goals"]["rss_kb_per_session"] == 64
    (level,) = doc["levels"]
    assert (level["legs"], level["calls"], level["sessions"], level["calls_lost"]) == (8, 4, 4, 0)
    assert level["frames_acked_in_window"] > 0 and level["frames_offered_per_s"] > 0
    assert level["rtp_packets_audio"] > 0 and level["sessions_per_core"] == round(level["legs_per_core"] / 2)
    assert level["rss_kb_per_session"] == round(2 * level["rss_kb_per_leg"], 1)
    assert 0 <= level["simulator_late_p50_ms"] <= level["simulator_late_p99_ms"] <= level["simulator_late_max_ms"]
    assert level["latency_p50_ms"] <= level["latency_p99_ms"] and "sessions per core" in done.stdout
