"""The live benchmark's view of a group of workers: each worker's share of the cores, and the group's
scrapes and CPU as the sum of its members' (no broker needed)."""

from __future__ import annotations

import pytest

from pipeline.bench.live import LevelConfig
from pipeline.bench.probes import INFERENCE_THREAD_PREFIX, MAIN, UNNAMED, CpuSplit, MetricsSample


@pytest.mark.parametrize(("cores", "workers", "expected"), [
    ((0, 1), 1, [(0, 1)]),
    ((0, 1), 2, [(0,), (1,)]),
    ((0, 1, 2, 3), 2, [(0, 2), (1, 3)]),
    ((0, 1), 3, [(0,), (1,), (0,)]),
])
def test_workers_share_out_the_level_s_cores(cores: tuple[int, ...], workers: int,
                                             expected: list[tuple[int, ...]]) -> None:
    assert LevelConfig(calls=1, cores=cores, workers=workers).worker_cores == expected


def _sample(lag: int | None, queue: float, calls: float, buckets: dict[float, float], rss: int) -> MetricsSample:
    return MetricsSample(10.0, lag, queue, calls, 2 * calls, 7.0, buckets, sum(buckets.values()), 3.0, rss)


def test_a_group_s_scrape_adds_up_its_workers() -> None:
    a = _sample(120, 2.0, 3.0, {1.0: 4.0, 2.0: 6.0}, 100)
    b = _sample(None, 1.0, 2.0, {1.0: 1.0, 4.0: 2.0}, 50)
    group = MetricsSample.combined([a, b])
    assert group.audio_lag == 120  # a worker not reporting yet adds nothing
    assert (group.queue_depth, group.active_calls, group.active_legs) == (3.0, 5.0, 10.0)
    assert group.batch_buckets == {1.0: 5.0, 2.0: 6.0, 4.0: 2.0}
    assert (group.finals, group.rss_bytes) == (14.0, 150)
    assert MetricsSample.combined([b, b]).audio_lag is None


def test_a_group_s_cpu_adds_up_its_workers_over_the_same_window() -> None:
    a = CpuSplit(100.0, 80.0, {MAIN: 30.0, INFERENCE_THREAD_PREFIX: 50.0}, "thread name")
    b = CpuSplit(100.0, 60.0, {MAIN: 20.0, INFERENCE_THREAD_PREFIX: 35.0, UNNAMED: 5.0}, "thread name")
    group = CpuSplit.combined([a, b])
    assert group.cores_used == pytest.approx(1.4)
    assert group.by_label == {MAIN: 50.0, INFERENCE_THREAD_PREFIX: 85.0, UNNAMED: 5.0}
    assert group.inference_by == "thread name"
