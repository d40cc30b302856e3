"""`callqa bench gateway`'s readings of the gateway: the ack-latency histogram from /metrics, its
percentiles, and the gateway's CPU and RSS from /proc."""

from __future__ import annotations

import os

import numpy as np

from pipeline.bench.gateway import HISTOGRAM
from pipeline.bench.probes import cpu_seconds, histogram, quantile, rss_bytes
from pipeline.gateway.metrics import GatewayMetrics


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
