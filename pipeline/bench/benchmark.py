"""`callqa bench live` from end to end: one level (or the search), the comparisons, the output files."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from pipeline.bench import probes, report
from pipeline.bench.live import (
    LevelConfig,
    LevelRun,
    batching_gain,
    engine_alone,
    run_level,
    search,
    with_batch,
)
from pipeline.bench.results import RESULTS, run_folder, utc_stamp, write_result
from pipeline.bench.traffic import TurnLibrary
from pipeline.bench.variants import worker_overrides
from pipeline.bench.workers import shared_broker


@dataclass(frozen=True)
class BenchOptions:
    level: LevelConfig  # the level to run, or the search's template (its calls: where the search starts)
    search: bool = False
    compare: bool = False  # batch size 1 and the engine alone at the level (the search does it at the found load)
    max_calls: int = 256
    resolution: float = 0.1
    out: Path = RESULTS
    variants: tuple[str, ...] = ()  # --variant specs, each run at the level (or the found load) beside it
    gemm: bool = True  # measure the pinned cores' fp32 GEMM speed at the start and the end


def variant_config(config: LevelConfig, spec: str) -> LevelConfig:
    """The level with a --variant's settings (checked: raises variants.BadVariant)."""
    overrides = worker_overrides(spec)
    return replace(config, overrides=tuple(overrides.items()), variant=spec)


def run_benchmark(options: BenchOptions, console: Console) -> tuple[dict[str, Any], list[Path]]:
    """Run what the options ask for; returns the JSON document and the files written."""
    stamp = utc_stamp()
    work = run_folder("live", stamp)  # worker logs stay here; stores are removed
    variant_levels = [variant_config(options.level, spec) for spec in options.variants]  # bad specs fail first
    library = TurnLibrary.load()
    speed = [gemm_probe(options, console)] if options.gemm else []
    with shared_broker(console.print):
        levels, search_doc, found = run_levels(options, library, work, console)
        batching = engine = None
        compared: list[tuple[LevelRun, dict[str, Any] | None]] = []
        at_load = found is not None and (options.search or options.compare)
        if found is not None and at_load:
            console.print(f"at {found.config.calls} calls: the same traffic with max_batch 1")
            single = run_level(with_batch(found.config, 1), library, work, console)
            levels.append(single)
            print_level(single, console)
            batching = batching_gain(found, single)
            with console.status("the engine alone on the same segments..."):
                engine = engine_alone(found, library)
        if found is None and variant_levels:
            console.print("no level met the criteria: the variants are not run")
        if found is not None:
            for template in variant_levels:  # the same traffic (seed, calls) with the variant's settings
                run = run_level(replace(template, calls=found.config.calls), library, work, console)
                levels.append(run)
                print_level(run, console)
                alone = None
                if at_load:
                    with console.status(f"the engine alone with {run.config.variant}..."):
                        alone = engine_alone(run, library)
                compared.append((run, alone))
    if speed:
        speed.append(gemm_probe(options, console))
    machine = machine_figures(speed)
    gemm = machine.get("gemm_gflops_per_core")
    if search_doc is not None:
        search_doc["legs_per_core_normalized"] = rounded(probes.normalised_per_core(search_doc["legs_per_core"], gemm))
        search_doc["normalized_to_gflops_per_core"] = probes.REFERENCE_GFLOPS_PER_CORE
    for figures in (engine, *(alone for _, alone in compared)):
        if figures is not None:
            per_core = figures["speech_s_per_s"] / len(figures["cores"])
            figures["speech_s_per_s_per_core_normalized"] = rounded(probes.normalised_per_core(per_core, gemm))
    variants = ([variant_figures(found, run, alone) for run, alone in compared]
                if found is not None and compared else None)
    doc = report.document(options.level, [lv.result for lv in levels], stamp=stamp, search=search_doc,
                          batching=batching, engine=engine, variants=variants, machine_measured=machine)
    doc["worker_logs"] = str(work)
    paths = write_result("live", doc, options.out)
    try:
        paths.append(report.plot(doc, options.out / "live.png"))
    except ModuleNotFoundError as exc:  # matplotlib comes with the bench extra, not the product
        console.print(f"no live.png: {exc.name} is not installed (`pip install -e '.[bench]'`)")
    return doc, paths


def gemm_probe(options: BenchOptions, console: Console) -> dict[str, Any]:
    with console.status("fp32 GEMM speed of the pinned cores..."):
        return probes.machine_speed(options.level.cores)


def machine_figures(speed: list[dict[str, Any]]) -> dict[str, Any]:
    """The GEMM probe's figures for the document's ``machine``: each core at the faster of the run's start
    and end (its speed with the least of others' work on it; on a shared machine one core may be busy at
    the start and the other at the end), their mean, and each probe's."""
    if not speed:
        return {}
    by_core = {core: max(s["gemm_gflops_by_core"][core] for s in speed) for core in speed[0]["gemm_gflops_by_core"]}
    return {**speed[0], "gemm_gflops_per_core": round(sum(by_core.values()) / len(by_core), 1),
            "gemm_gflops_by_core": by_core,
            "gemm_gflops_per_core_at": {"start": speed[0]["gemm_gflops_per_core"],
                                        "end": speed[-1]["gemm_gflops_per_core"]},
            "gemm_gflops_by_core_at": {"start": speed[0]["gemm_gflops_by_core"],
                                       "end": speed[-1]["gemm_gflops_by_core"]}}


def variant_figures(base: LevelRun, run: LevelRun, alone: dict[str, Any] | None) -> dict[str, Any]:
    """A --variant beside the level it varies, on the same traffic: CPU per speech second (and its ratio to
    the base), latency, whether the level was met, and the engine alone with its settings."""
    def cpu(r: LevelRun) -> float | None:
        return r.result["worker"]["cpu_s_per_speech_s"]["total"]

    ratio = probes.cpu_s_per_speech_s(cpu(run) or 0.0, cpu(base) or 0.0) if cpu(run) is not None else None
    return {
        "variant": run.config.variant, "settings": dict(run.config.overrides), "calls": run.config.calls,
        "met": run.met, "why_not": run.result["why_not"], "p99_s": run.result["latency"]["p99_s"],
        "base_p99_s": base.result["latency"]["p99_s"],
        "speech_s_per_s": run.result["throughput"]["speech_s_per_s"],
        "cpu_s_per_speech_s": cpu(run), "base_cpu_s_per_speech_s": cpu(base),
        "cpu_ratio_to_base": rounded(ratio, 3), "engine_alone": alone,
    }


def rounded(x: float | None, digits: int = 2) -> float | None:
    return None if x is None else round(x, digits)


def run_levels(options: BenchOptions, library: TurnLibrary, work: Path,
               console: Console) -> tuple[list[LevelRun], dict[str, Any] | None, LevelRun | None]:
    """The one level, or the search: (levels run, the search's summary, the level the comparisons use)."""
    def one(calls: int) -> LevelRun:
        run = run_level(replace(options.level, calls=calls), library, work, console)
        print_level(run, console)
        return run

    if not options.search:
        run = one(options.level.calls)
        return [run], None, run
    best, tried = search(one, options.level.calls, options.max_calls, options.resolution)
    cores = len(options.level.cores)
    summary = {
        "calls": best.config.calls if best else 0, "legs": 2 * best.config.calls if best else 0, "cores": cores,
        "legs_per_core": round(2 * best.config.calls / cores, 2) if best else 0.0,
        "levels_tried": [r.config.calls for r in tried], "start": options.level.calls,
        "max_calls": options.max_calls, "resolution": options.resolution,
        "capped": bool(best and best.config.calls == options.max_calls),
    }
    return tried, summary, best


def print_level(run: LevelRun, console: Console) -> None:
    r = run.result
    lat = r["latency"]
    verdict = "[green]met[/green]" if r["met"] else f"[red]not met[/red]: {'; '.join(r['why_not'])}"
    p = " / ".join("-" if lat[k] is None else f"{lat[k]:.2f}" for k in ("p50_s", "p95_s", "p99_s"))
    console.print(f"  {run.config.label}: {lat['finals']} finals, P50/P95/P99 {p} s, "
                  f"{r['throughput']['speech_s_per_s']:.2f} speech s/s, worker {r['worker']['cores_used']:.2f} cores "
                  f"-> {verdict}")
