"""`callqa bench redaction`: what redacting a final costs the worker, per segment on one core.

Every turn of the call library (its scripts' text, both legs, in call order) goes through a fresh
``CallRedactor`` per call, as a worker's analyzer would redact the finals; each segment is timed alone. The
tokenizer's caches are emptied before each round, so each text is new to it as a live final is. The goal
(``GOAL_MS``) is what the worker can spend per final without the redactor showing in a final's latency.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from pipeline.bench.results import RESULTS, record, write_result
from pipeline.eval.call_library import LIBRARY_DIR, load_manifest
from pipeline.qa import numbers
from pipeline.qa.redaction import CallRedactor
from pipeline.qa.segment import Segment

GOAL_MS = 0.2


@dataclass(frozen=True)
class RedactionBenchOptions:
    rounds: int = 20  # the library's turns redacted this many times
    core: int | None = None  # pin the run to this core (None: where the scheduler puts it)
    out: Path = RESULTS


def library_calls(folder: Path = LIBRARY_DIR) -> list[list[Segment]]:
    """Each library call's turns as final segments, in call order."""
    return [[Segment(call["id"], turn["leg"], f"{call['id']}/{i:04d}", turn["start_ms"], turn["end_ms"], turn["text"])
             for i, turn in enumerate(call["turns"])] for call in load_manifest(folder)["calls"]]


def time_rounds(calls: list[list[Segment]], rounds: int) -> list[float]:
    """Milliseconds of each segment's redaction, every round."""
    timings: list[float] = []
    for _ in range(rounds):
        numbers.clear_caches()
        for segments in calls:
            redactor = CallRedactor(salt=segments[0].call_id)
            for segment in segments:
                began = time.perf_counter_ns()
                redactor.redact(segment)
                timings.append((time.perf_counter_ns() - began) / 1e6)
    return timings


def run_redaction(options: RedactionBenchOptions, console: Console) -> tuple[dict[str, Any], list[Path]]:
    if options.core is not None:
        os.sched_setaffinity(0, {options.core})
    calls = library_calls()
    console.print(f"{sum(map(len, calls))} library turns in {len(calls)} calls, {options.rounds} rounds")
    time_rounds(calls, 1)  # imports and compiled patterns warm, as in a running worker
    timings = sorted(time_rounds(calls, options.rounds))
    mean = statistics.fmean(timings)
    figures = {
        "segments_timed": len(timings),
        "mean_ms": round(mean, 4),
        "p50_ms": round(timings[len(timings) // 2], 4),
        "p99_ms": round(timings[int(len(timings) * 0.99)], 4),
        "max_ms": round(timings[-1], 4),
        "segments_per_core_s": round(1000 / mean),
        "goal_mean_ms": GOAL_MS,
        "goal_met": mean <= GOAL_MS,
    }
    doc = record("redaction", {"rounds": options.rounds, "core": options.core}, figures)
    return doc, write_result("redaction", doc, options.out)
