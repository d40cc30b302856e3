"""`callqa bench live` from end to end: one level (or the search), the comparisons, the output files."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from pipeline.bench import report
from pipeline.bench.live import (
    LevelConfig,
    LevelRun,
    batching_gain,
    engine_alone,
    run_level,
    search,
    with_batch,
)
from pipeline.bench.results import RESULTS, utc_stamp, write_result
from pipeline.bench.traffic import TurnLibrary
from pipeline.broker.local import LocalKafka
from pipeline.config import Settings


@dataclass(frozen=True)
class BenchOptions:
    level: LevelConfig  # the level to run, or the search's template (its calls: where the search starts)
    search: bool = False
    compare: bool = False  # batch size 1 and the engine alone at the level (the search does it at the found load)
    max_calls: int = 256
    resolution: float = 0.1
    out: Path = RESULTS


def parse_cores(text: str) -> tuple[int, ...]:
    """A taskset CPU list ("0", "0,1", "0-3,6") as core numbers; empty: every core this process may use."""
    if not text.strip():
        return tuple(sorted(os.sched_getaffinity(0)))
    cores: set[int] = set()
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            raise ValueError(f"--cores {text!r}: use a CPU list such as 0 or 0,1 or 0-3")
        cores.update(range(int(first), int(last or first) + 1))
    unknown = cores - os.sched_getaffinity(0)
    if unknown:
        raise ValueError(f"--cores {text!r}: core(s) {sorted(unknown)} not available here "
                         f"(available: {sorted(os.sched_getaffinity(0))})")
    return tuple(sorted(cores))


def run_benchmark(options: BenchOptions, console: Console) -> tuple[dict[str, Any], list[Path]]:
    """Run what the options ask for; returns the JSON document and the files written."""
    stamp = utc_stamp()
    work = Settings().state_dir / "bench" / f"live-{stamp}"  # worker logs stay here; stores are removed
    library = TurnLibrary.load()
    kafka = LocalKafka(Settings())
    started = kafka.start()  # the running broker when there is one
    try:
        levels, search_doc, found = run_levels(options, library, work, console)
        batching = engine = None
        if found is not None and (options.search or options.compare):
            console.print(f"at {found.config.calls} calls: the same traffic with max_batch 1")
            single = run_level(with_batch(found.config, 1), library, work, console)
            levels.append(single)
            print_level(single, console)
            batching = batching_gain(found, single)
            with console.status("the engine alone on the same segments..."):
                engine = engine_alone(found, library)
    finally:
        if not started.already_running:
            kafka.stop()
    doc = report.document(options.level, [lv.result for lv in levels], stamp=stamp, search=search_doc,
                          batching=batching, engine=engine)
    doc["worker_logs"] = str(work)
    paths = write_result("live", doc, options.out)
    paths.append(report.plot(doc, options.out / "live.png"))
    return doc, paths


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
