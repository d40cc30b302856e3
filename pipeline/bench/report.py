"""The live benchmark's output: its document (written by ``results.write_result`` as ``live.json`` and a
line of ``live.jsonl``) and a PNG plot (``live.png``: latency percentiles and throughput against concurrent
calls). Its tables, on the console and in bench/README.md, are the ``live`` spec of tables.py."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from pipeline.bench.latency import STAGE_DOC
from pipeline.bench.live import LAG_SLOPE_MAX, LevelConfig
from pipeline.bench.results import record, settings_that_matter
from pipeline.config import Settings

DEFINITIONS = {
    "stages": STAGE_DOC,
    "latency": "per final segment: the Kafka timestamp of its transcript record - the wall time its speech ended "
               "(the traffic's start + the call's arrival + the end of the ground-truth turn it overlaps most, "
               "the time that turn's last frame was due; a final the segmenter closed inside its turn: its own "
               "end). Percentiles over the finals whose speech ended in the steady window.",
    "throughput": "pipeline throughput: speech audio seconds decoded per wall second = the audio length "
                  "(end_ms - start_ms) of the finals whose transcript was written in the steady window / the "
                  "window's length",
    "engine_ceiling": "the same segments (cut from the generated legs where the worker cut them, 16 kHz) decoded "
                      "by the engine alone (no Kafka, no worker: Engine.transcribe_segments, batches of max_batch "
                      "in the order the worker wrote them, on the same cores): audio seconds / wall second",
    "pipeline_efficiency": "pipeline throughput at the found load / engine ceiling",
    "lag_growing": f"the least-squares slope, over the window, of how far the worker is behind the live audio "
                   f"(frames behind the audio topic's end / the frame rate of the calls open) exceeds "
                   f"{LAG_SLOPE_MAX} s per s",
    "legs_per_core": "2 x the most concurrent calls whose level met the criteria / the cores the workers were "
                     "pinned to (taskset)",
    "gemm_gflops_per_core": "machine.gemm_gflops_per_core: fp32 GEMM GFLOP/s of one of the pinned cores (numpy "
                            "matmul of tiny.en's layer shapes, one thread, pinned; mean over the cores, the faster "
                            "of the run's start and end)",
    "legs_per_core_normalized": "legs_per_core x 200 / machine.gemm_gflops_per_core: capacity on a machine of "
                                "200 GFLOP/s per core, comparable across the CPUs these machines come with",
    "cpu_s_per_speech_s": "the workers' CPU seconds in the window (all threads; inference; event loop) / the "
                          "speech audio seconds of the finals written in it",
    "variants": "--variant: the same traffic (seed, calls) at the level (with --search: the found load) with the "
                "variant's worker settings; cpu_ratio_to_base = its CPU per speech second / the base level's",
    "cores_used": "the workers' CPU seconds in the window (added up when there are several) / the window's length (event loop: its main thread; "
                  "inference: the asr-batch* threads; native_pools: threads without a name of their own, e.g. "
                  "ONNX Runtime's extra intra-op threads; other: the rest of the process)",
}


# ---- the document ----------------------------------------------------------------------------------------
def document(config: LevelConfig, levels: list[dict[str, Any]], *, stamp: str, search: dict[str, Any] | None,
             batching: dict[str, Any] | None, engine: dict[str, Any] | None,
             variants: list[dict[str, Any]] | None = None,
             machine_measured: dict[str, Any] | None = None) -> dict[str, Any]:
    spec = config.traffic
    return record("live", settings_that_matter(Settings()), {
        "traffic": {**{k: v for k, v in asdict(spec).items() if k != "calls"}, "mean_call_s": spec.mean_call_s,
                    "frame_ms": 20, "encoding": "mulaw", "sample_rate": 8000,
                    "arrivals": "Poisson, rate calls / mean_call_s; the level's calls in progress at the start"},
        "criteria": {"p99_max_s": config.p99_max_s, "hold_s": config.hold_s, "lag_slope_max_s_per_s": LAG_SLOPE_MAX},
        "definitions": DEFINITIONS,
        "levels": levels, "search": search, "batching": batching, "engine_alone": engine, "variants": variants,
    }, started=stamp, machine_measured=machine_measured)


# ---- plot ---------------------------------------------------------------------------------------------------
def plot(doc: dict[str, Any], path: Path) -> Path:
    """P50/P95/P99 final latency (left axis) and throughput (right axis) against concurrent calls."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    batched = sorted((lv for lv in doc["levels"] if (lv["max_batch"] != 1 or not doc.get("batching"))
                      and not lv.get("variant")),
                     key=lambda lv: lv["calls"])
    calls = [lv["calls"] for lv in batched]
    fig, left = plt.subplots(figsize=(8, 4.8), dpi=110)
    for q, style in (("p50", "o-"), ("p95", "s-"), ("p99", "^-")):
        left.plot(calls, [nan_if_none(lv["latency"][f"{q}_s"]) for lv in batched], style, label=f"{q.upper()} latency")
    left.axhline(doc["criteria"]["p99_max_s"], color="grey", linestyle="--", linewidth=1,
                 label=f"P99 bound {doc['criteria']['p99_max_s']:g} s")
    single = [lv for lv in doc["levels"] if lv["max_batch"] == 1 and doc.get("batching") and not lv.get("variant")]
    if single:
        left.plot([lv["calls"] for lv in single], [nan_if_none(lv["latency"]["p99_s"]) for lv in single], "x",
                  color="black", markersize=9, label="P99, max_batch 1")
    left.set_xlabel("concurrent calls (target; legs = 2 x calls)")
    left.set_ylabel("final latency from end of speech (s)")
    right = left.twinx()
    right.plot(calls, [lv["throughput"]["speech_s_per_s"] for lv in batched], "d:", color="tab:purple",
               label="throughput")
    right.set_ylabel("speech audio s decoded / wall s")
    left.set_ylim(bottom=0)
    right.set_ylim(bottom=0)
    left.set_xlim(0, max([*calls, *(lv["calls"] for lv in single), 1]) * 1.1 + 1)
    left.xaxis.set_major_locator(MaxNLocator(integer=True))
    handles = left.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    left.legend(handles=handles, loc="upper left", fontsize=8)
    m, g = doc["machine"], doc["git"]
    left.set_title(f"callqa bench live: {m['cpu_model']}, {len(batched[0]['cores']) if batched else '?'} cores "
                   f"pinned, {g['commit'][:10]}{' (dirty)' if g['dirty'] else ''}", fontsize=9)
    left.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def nan_if_none(x: float | None) -> float:
    return float("nan") if x is None else x
