"""`callqa bench end-to-end`: the whole pipeline on a backlog, real broker, real worker, real store.

Measured in one run, on the sample calls (``samples/calls/*.wav``, cycled), each scenario on fresh topics
with its own worker and embedded store:
- capacity: N calls replayed as fast as possible; call-audio seconds the worker finishes per wall
  second (= concurrent real-time calls it could sustain), at max_batch 16, at max_batch 1, and int8 at
  max_batch 16: what batching and quantization give once the worker is saturated;
- real-time latency: K calls replayed in real time at once; end-to-end delay per final segment (last
  frame of the segment produced -> transcript produced) P50/P95/P99, batch sizes. ``callqa bench live``
  measures this better (Poisson arrivals, latency from the end of speech, a steady window); it stays here
  so the scenarios of one run can be compared.
Result: ``end-to-end``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from pipeline.bench.results import RESULTS, ROOT, record, run_folder, settings_that_matter, write_result
from pipeline.bench.sender import REPLAY, call_s, replay
from pipeline.bench.workers import WorkerGroup, shared_broker
from pipeline.config import Settings
from pipeline.ingest.replay import CallRecording, load_recording

SAMPLE_CALLS = ROOT / "samples" / "calls"


@dataclass(frozen=True)
class EndToEndOptions:
    calls: int = 24  # calls of the capacity runs
    realtime_calls: int = 6  # concurrent real-time calls of the latency run (keep it under the capacity)
    out: Path = RESULTS


@dataclass(frozen=True)
class Scenario:
    name: str
    calls: int
    realtime: bool
    overrides: dict[str, str] = field(default_factory=dict)  # worker settings, as environment values


def scenarios(options: EndToEndOptions) -> list[Scenario]:
    return [
        Scenario("capacity_batch16", options.calls, False, {"max_batch": "16"}),
        Scenario("capacity_batch1", options.calls, False, {"max_batch": "1"}),
        Scenario("capacity_int8_batch16", options.calls, False, {"max_batch": "16", "quantization": "int8"}),
        Scenario("realtime_latency", options.realtime_calls, True, {"max_batch": "16"}),
    ]


def run_end_to_end(options: EndToEndOptions, console: Console) -> tuple[dict[str, Any], list[Path]]:
    work = run_folder("end-to-end")  # the workers' logs stay; their stores are removed
    recordings = [load_recording(p, REPLAY) for p in sorted(SAMPLE_CALLS.glob("*.wav"))]
    results: list[dict[str, Any]] = []
    with shared_broker(console.print):
        for scenario in scenarios(options):
            pace = "real time" if scenario.realtime else "as fast as possible"
            console.print(f"[bold]{scenario.name}[/bold]: {scenario.calls} calls, {pace}")
            results.append(run_scenario(scenario, recordings, work, console))
    ratio = results[0]["call_audio_s_per_wall_s"] / results[1]["call_audio_s_per_wall_s"]
    int8 = results[2]["call_audio_s_per_wall_s"] / results[0]["call_audio_s_per_wall_s"]
    console.print(f"batching in the live pipeline: {ratio:.2f}x the throughput of max_batch 1")
    console.print(f"int8 instead of fp32: {int8:.2f}x the throughput")
    doc = record("end-to-end", settings_that_matter(Settings()), {
        "results": results, "batch16_vs_batch1": round(ratio, 2), "int8_vs_fp32": round(int8, 2),
    })
    return doc, write_result("end-to-end", doc, options.out)


def run_scenario(scenario: Scenario, recordings: list[CallRecording], work: Path, console: Console) -> dict[str, Any]:
    """One scenario on topics and a worker of its own: every topic fresh, checkpoints included."""
    prefix = f"bench.{scenario.name}.{uuid.uuid4().hex[:6]}"
    with WorkerGroup.fresh(prefix, work / scenario.name, scenario.overrides) as workers:
        with console.status(f"  {scenario.name}: starting the worker..."):
            worker = workers.start("worker")
        calls = [(f"{prefix}-{i:04d}", recordings[i % len(recordings)]) for i in range(scenario.calls)]
        began = time.monotonic()
        with console.status(f"  {scenario.name}: replaying, then waiting for every call in the store..."):
            report = replay(workers.settings, calls, 0.0 if scenario.realtime else None)
            worker.wait_for_calls(report.call_ids, timeout_s=1800)
        wall = time.monotonic() - began
        audio_s = sum(call_s(rec) for _, rec in calls)
        lat = worker.query(
            "SELECT count() AS n, quantile(0.5)(end_to_end_ms) AS p50, quantile(0.95)(end_to_end_ms) AS p95, "
            "quantile(0.99)(end_to_end_ms) AS p99, avg(batch_size) AS batch, max(batch_size) AS max_batch, "
            "quantile(0.5)(inference_ms) AS inference_p50 FROM latency FINAL"
        )[0]
        return {
            "scenario": scenario.name, "calls": scenario.calls, "realtime": scenario.realtime,
            "settings": scenario.overrides, "wall_s": round(wall, 2), "call_audio_s": round(audio_s, 1),
            "call_audio_s_per_wall_s": round(audio_s / wall, 2), "segments": lat["n"],
            "end_to_end_ms": {k: round(float(lat[k]), 1) for k in ("p50", "p95", "p99")},
            "mean_batch": round(float(lat["batch"]), 2), "max_batch": lat["max_batch"],
            "inference_ms_p50": round(float(lat["inference_p50"]), 1),
            "rss_mb_at_end": round(worker.metric("process_resident_memory_bytes") / 2**20, 1),
        }

