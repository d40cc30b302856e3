"""Figures that survive a changing machine, without a broker: the pinned cores' fp32 GEMM
speed, capacity normalised by it, the workers' CPU seconds per speech second, and `bench live --variant`."""

from __future__ import annotations

import os

import pytest

from pipeline.bench import probes
from pipeline.bench.benchmark import machine_figures, variant_config, variant_figures
from pipeline.bench.live import LevelConfig, LevelRun, cpu_per_speech
from pipeline.bench.probes import INFERENCE_THREAD_PREFIX, MAIN, CpuSnapshot, cpu_split
from pipeline.bench.results import record
from pipeline.bench.variants import BadVariant, worker_overrides
from pipeline.config import Settings


def test_gemm_gflops_is_all_products_flops_over_all_their_time() -> None:
    # 2*10*20*30 = 12,000 flops in 1 us, and 2*1*1*1000 = 2,000 in 1 us: 14,000 flops in 2 us = 7 GFLOP/s.
    assert probes.gemm_gflops([(10, 20, 30), (1, 1, 1000)], [1e-6, 1e-6]) == pytest.approx(7.0)
    with pytest.raises(ValueError, match="no time"):
        probes.gemm_gflops([(10, 20, 30)], [0.0])
    with pytest.raises(ValueError, match="one time per shape"):
        probes.gemm_gflops([(10, 20, 30)], [1e-6, 1e-6])


def test_the_gemm_probe_measures_a_pinned_core() -> None:
    core = min(os.sched_getaffinity(0))
    gflops = probes.core_gemm_gflops(core, [(64, 384, 384)], repeats=2, min_s=0.01)
    assert gflops > 0
    speed = probes.machine_speed([core], [(64, 384, 384)], repeats=1)
    assert speed["gemm_gflops_per_core"] > 0 and list(speed["gemm_gflops_by_core"]) == [str(core)]
    with pytest.raises(RuntimeError, match="core 100000"):  # a core this machine does not have
        probes.core_gemm_gflops(100000, [(8, 8, 8)], repeats=1, min_s=0.001)


def test_capacity_is_normalised_to_200_gflops_per_core() -> None:
    assert probes.normalised_per_core(20.0, 100.0) == pytest.approx(40.0)  # a slow machine: worth more
    assert probes.normalised_per_core(20.0, 400.0) == pytest.approx(10.0)
    assert probes.normalised_per_core(20.0, None) is None and probes.normalised_per_core(20.0, 0.0) is None


def test_each_core_s_faster_gemm_figure_of_the_run_s_start_and_end_is_the_machine_s() -> None:
    # Another job on core 1 at the start, on core 0 at the end: each core's own best.
    start = {"gemm_gflops_per_core": 75.0, "gemm_gflops_by_core": {"0": 100.0, "1": 50.0}}
    end = {"gemm_gflops_per_core": 80.0, "gemm_gflops_by_core": {"0": 60.0, "1": 100.0}}
    figures = machine_figures([start, end])
    assert figures["gemm_gflops_per_core"] == 100.0 and figures["gemm_gflops_by_core"] == {"0": 100.0, "1": 100.0}
    assert figures["gemm_gflops_per_core_at"] == {"start": 75.0, "end": 80.0}
    assert machine_figures([]) == {}
    doc = record("live", {}, {"levels": []}, machine_measured=figures)
    assert doc["machine"]["gemm_gflops_per_core"] == 100.0 and doc["machine"]["cpu_flags"] is not None


def test_cpu_seconds_per_speech_second_come_from_the_worker_s_threads() -> None:
    pid = 100
    before = CpuSnapshot(50.0, {pid: ("callqa", 20.0), 101: ("asr-batch_0", 25.0), 102: ("callqa", 5.0)})
    after = CpuSnapshot(110.0, {pid: ("callqa", 35.0), 101: ("asr-batch_0", 65.0), 102: ("callqa", 7.0),
                                103: ("asr-batch_1", 3.0)})  # a thread born in the window: all of its time
    split = cpu_split(pid, before, after, 60.0, {})
    assert split.total_s == pytest.approx(60.0)
    assert split.by_label[MAIN] == pytest.approx(15.0) and split.inference_s == pytest.approx(43.0)
    per = cpu_per_speech(split, speech_s=120.0)
    assert per == {"total": 0.5, "inference": pytest.approx(43 / 120, abs=1e-4), "event_loop": 0.125}
    assert cpu_per_speech(split, speech_s=0.0) == {"total": None, "inference": None, "event_loop": None}
    assert INFERENCE_THREAD_PREFIX in split.by_label


def test_cpu_seconds_of_a_live_process_only_grow() -> None:
    before = probes.cpu_snapshot(os.getpid())
    sum(i * i for i in range(300_000))
    after = probes.cpu_snapshot(os.getpid())
    assert after.process_s >= before.process_s and os.getpid() in after.threads


def test_a_variant_is_checked_settings_for_the_worker_s_environment() -> None:
    assert worker_overrides("max_batch=8, endpoint_silence_ms=400") == {"max_batch": "8",
                                                                         "endpoint_silence_ms": "400"}
    for bad in ("max_batch", "no_such_setting=1", "max_batch=lots", "max_batch=8,16"):
        with pytest.raises(BadVariant):
            worker_overrides(bad)
    # a value with commas: the pieces without "=" go on the value before them
    assert worker_overrides("hot_words=Harbor Mutual, Linda Carter,max_batch=4") == {
        "hot_words": "Harbor Mutual,Linda Carter", "max_batch": "4"}


def test_a_variant_level_runs_the_same_traffic_with_its_settings() -> None:
    base = LevelConfig(calls=4, cores=(0,), seed=3)
    varied = variant_config(base, "max_batch=4,endpoint_silence_ms=400")
    assert varied.traffic == base.traffic and varied.calls == base.calls  # the same calls
    assert varied.settings().max_batch == 4 and varied.settings().endpoint_silence_ms == 400
    assert base.settings().endpoint_silence_ms == Settings().endpoint_silence_ms
    assert "max_batch=4" in varied.label
    # max_batch of the level (the batch-1 comparison) wins over the variant's
    assert LevelConfig(calls=1, cores=(0,), max_batch=1, overrides=(("max_batch", "4"),)).settings().max_batch == 1


def _run(config: LevelConfig, cpu_total: float | None, p99: float) -> LevelRun:
    result = {"met": True, "why_not": [], "latency": {"p99_s": p99}, "throughput": {"speech_s_per_s": 10.0},
              "worker": {"cpu_s_per_speech_s": {"total": cpu_total}}}
    return LevelRun(config, result, [], [])


def test_a_variant_s_cpu_is_compared_with_its_base_level() -> None:
    base = LevelConfig(calls=4, cores=(0,))
    figures = variant_figures(_run(base, 0.08, 1.2), _run(variant_config(base, "max_batch=4"), 0.04, 1.0), None)
    assert figures["cpu_ratio_to_base"] == 0.5 and figures["settings"] == {"max_batch": "4"}
    assert (figures["p99_s"], figures["base_p99_s"]) == (1.0, 1.2)
    assert variant_figures(_run(base, 0.08, 1.2), _run(base, None, 1.0), None)["cpu_ratio_to_base"] is None


def test_the_live_tables_say_legs_per_core_normalised_cpu_per_speech_second_and_each_variant() -> None:
    from pipeline.bench.tables import grids

    level = {"calls": 20, "max_batch": 16, "variant": None,
             "worker": {"cpu_s_per_speech_s": {"total": 0.1, "inference": 0.04, "event_loop": 0.03}}}
    varied = {**level, "variant": "quantization=int8row",
              "worker": {"cpu_s_per_speech_s": {"total": 0.05, "inference": 0.02, "event_loop": 0.03}}}
    doc = {"machine": {"gemm_gflops_per_core": 100.0},
           "search": {"calls": 20, "legs": 40, "cores": 2, "legs_per_core": 20.0, "legs_per_core_normalized": 40.0},
           "levels": [level, varied],
           "variants": [{"variant": "quantization=int8row", "calls": 20, "cpu_s_per_speech_s": 0.05,
                         "base_cpu_s_per_speech_s": 0.1, "cpu_ratio_to_base": 0.5, "p99_s": 1.2, "base_p99_s": 1.4,
                         "met": True}]}
    summary, levels, _cores, variants = grids(doc, "live")
    assert ["legs per core", "20"] in summary.rows and ["at 200 GFLOP/s per core", "40.0"] in summary.rows
    assert [row[:4] for row in levels.rows] == [["20", "–", "16", "default"], ["20", "–", "16", "`quantization=int8row`"]]
    assert levels.rows[0][levels.headers.index("CPU s per speech s")] == "0.1000"
    assert variants.rows == [["quantization=int8row", "20", "0.0500", "0.1000", "0.500", "1.20", "1.40", "yes"]]
