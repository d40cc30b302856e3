"""The live benchmark's output: its document (written by ``results.write_result`` as ``live.json`` and a
line of ``live.jsonl``), a PNG plot (``live.png``: latency percentiles and throughput against concurrent
calls), a rich table and a Markdown table for the README naming the machine and the commit."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from pipeline.bench.latency import STAGE_DOC
from pipeline.bench.live import LAG_SLOPE_MAX, LevelConfig
from pipeline.bench.results import record, settings_that_matter
from pipeline.config import Settings
from pipeline.tables import print_figures

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


# ---- tables ---------------------------------------------------------------------------------------------------
def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _cores(w: dict[str, Any]) -> str:
    c = w["cores"]
    return (f"{w['cores_used']:.2f} ({c['event_loop']:.2f}/{c['inference']:.2f}/"
            f"{c.get('native_pools', 0.0) + c['other']:.2f})")


def _table(title: str, *headers: str) -> Table:
    return Table(*headers, title=title, box=box.SIMPLE_HEAD, padding=(0, 1), show_edge=False, collapse_padding=True)


def _calls(lv: dict[str, Any]) -> str:
    """Calls, and a level's variant (v1, v2, ... in the order given) after them."""
    return str(lv["calls"]) + (f" {lv['variant']}" if lv.get("variant") else "")


def level_tables(doc: dict[str, Any]) -> list[Table]:
    """Latency and load per level, then the worker's side; each fits an 80-column terminal."""
    latency = _table("callqa bench live: final latency (s) from end of speech", "calls", "held", "legs", "wrk", "batch",
                     "finals", "P50", "P95", "P99", "speech/s", "lag", "met")
    worker = _table("worker cores kept busy, RSS MB; frames sent late (P99 ms)", "calls", "batch", "cores", "loop",
                    "infer", "native", "other", "RSS", "batch avg", "late")
    for lv in doc["levels"]:
        lat, w, c = lv["latency"], lv["worker"], lv["worker"]["cores"]
        latency.add_row(
            _calls(lv), f"{lv['calls_open']['mean']:.1f}", str(lv["legs"]), str(lv.get("workers", 1)),
            str(lv["max_batch"]),
            str(lat["finals"]), _s(lat["p50_s"]), _s(lat["p95_s"]), _s(lat["p99_s"]),
            f"{lv['throughput']['speech_s_per_s']:.2f}", "growing" if lv["lag"]["growing"] else "flat",
            "[green]yes[/green]" if lv["met"] else "[red]no[/red]",
        )
        worker.add_row(
            _calls(lv), str(lv["max_batch"]), f"{w['cores_used']:.2f}",
            *(f"{c.get(k, 0.0):.2f}" for k in ("event_loop", "inference", "native_pools", "other")),
            "-" if not w["rss_mb"] else f"{w['rss_mb']['max']:.0f}", _s(lv["batches"].get("mean_size")),
            f"{lv['sender']['tick_late']['p99_ms']:.0f}",
        )
    return [latency, worker]


def summary_lines(doc: dict[str, Any]) -> list[str]:
    lines = []
    if doc.get("search"):
        s = doc["search"]
        lines.append(f"most concurrent calls met: {s['calls']} ({s['legs']} legs) on {s['cores']} cores = "
                     f"[bold]{s['legs_per_core']} legs per core[/bold]" if s["calls"] else
                     "no level met the criteria, not even 1 call")
    if doc.get("batching"):
        b = doc["batching"]
        batch1 = "met" if b["batch1_keeps_up"] else "not met: " + "; ".join(b["batch1"]["why_not"])
        lines.append(f"batching gain at {b['calls']} calls: {b['throughput_ratio']}x the throughput of max_batch 1 "
                     f"(that level {batch1}); per inference-CPU second {b['per_inference_cpu_ratio']}x")
    if doc.get("engine_alone"):
        e = doc["engine_alone"]
        lines.append(f"engine alone: {e['speech_s_per_s']} speech s/s on {len(e['cores'])} cores; pipeline "
                     f"{e['pipeline_speech_s_per_s']} -> efficiency {e['pipeline_efficiency']}")
    gemm = doc["machine"].get("gemm_gflops_per_core")
    if gemm:
        line = f"fp32 GEMM {gemm} GFLOP/s per pinned core"
        if doc.get("search") and doc["search"].get("legs_per_core_normalized") is not None:
            line += (f": {doc['search']['legs_per_core']} legs per core = [bold]"
                     f"{doc['search']['legs_per_core_normalized']} legs per core at 200 GFLOP/s per core[/bold]")
        lines.append(line)
    for lv in doc["levels"]:
        per = lv["worker"].get("cpu_s_per_speech_s") or {}
        if per.get("total") is not None:
            lines.append(f"{_calls(lv)} calls (max_batch {lv['max_batch']}): worker CPU s per speech s "
                         f"{per['total']} (inference {per['inference']}, event loop {per['event_loop']})")
    for v in doc.get("variants") or []:
        lines.append(f"variant {v['variant']} at {v['calls']} calls: CPU per speech s {v['cpu_s_per_speech_s']} "
                     f"against {v['base_cpu_s_per_speech_s']} ({v['cpu_ratio_to_base']}x), P99 {_s(v['p99_s'])} s "
                     f"against {_s(v['base_p99_s'])} s, {'met' if v['met'] else 'not met'}")
    return lines


def markdown(doc: dict[str, Any]) -> str:
    """A README table: machine and commit, then one row per level."""
    m, g = doc["machine"], doc["git"]
    head = (f"`callqa bench live`, {doc['started']}: {m['cpu_model']} (family {m.get('cpu_family', '?')} model "
            f"{m.get('cpu_model_number', '?')}, {' '.join(m.get('cpu_flags', []))}; {m['cores']} cores), commit "
            f"`{g['commit'][:10]}`{' (uncommitted changes)' if g['dirty'] else ''}, model {doc['settings'].get('model')} "
            f"{doc['settings'].get('quantization')}, calls of {doc['traffic']['min_call_s']:g}-"
            f"{doc['traffic']['max_call_s']:g} s arriving as a Poisson process, {doc['criteria']['hold_s']:g} s "
            f"steady window" + (f", fp32 GEMM {m['gemm_gflops_per_core']} GFLOP/s per pinned core."
                                if m.get("gemm_gflops_per_core") else "."))
    rows = ["| calls (held) | legs | pinned cores (workers) | max batch | P50 s | P95 s | P99 s | speech s/s | lag growing "
            "| worker cores (loop/inference/rest) | RSS MB | met |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|:--|:--|---:|:--|"]
    for lv in doc["levels"]:
        lat, w = lv["latency"], lv["worker"]
        rows.append(
            f"| {_calls(lv)} ({lv['calls_open']['mean']:.1f}) | {lv['legs']} | {len(lv['cores'])} ({lv.get('workers', 1)}) "
            f"| {lv['max_batch']} "
            f"| {_s(lat['p50_s'])} | {_s(lat['p95_s'])} | {_s(lat['p99_s'])} "
            f"| {lv['throughput']['speech_s_per_s']:.2f} | {'yes' if lv['lag']['growing'] else 'no'} "
            f"| {_cores(w)} | {'-' if not w['rss_mb'] else round(w['rss_mb']['max'])} "
            f"| {'yes' if lv['met'] else 'no: ' + '; '.join(lv['why_not'])} |")
    tail = [line.replace("[bold]", "**").replace("[/bold]", "**") for line in summary_lines(doc)]
    return "\n".join([head, "", *rows, *([""] + tail if tail else [])])


def print_report(doc: dict[str, Any], console: Console) -> None:
    for table in level_tables(doc):
        print_figures(console, table)
    for line in summary_lines(doc):
        console.print(line)
    console.print("\n[bold]README table[/bold] (Markdown):\n")
    console.print(markdown(doc), markup=False, highlight=False, soft_wrap=True)
