"""Engine-level: batches decoded in-process (1 or 2 inference threads) against child processes (1 or 2,
``CALLQA_INFERENCE_PROCESSES``), the same segments through the same SegmentBatcher.

    .venv/bin/python -m pipeline.bench.inference_process [--repeat 3] [--rounds 2] [--out DIR]

Per configuration: speech seconds per wall second over a backlog (every segment submitted at once, so
batches of max_batch), the same at a Poisson load (latency P50/P99 from submit to transcript), the CPU of
this process and of the children, and the event loop's lag: a coroutine that asks to wake every 5 ms
records how late it woke. That lag is what the GIL costs the worker's event loop (Kafka, VAD, outputs)
while batches decode. Configurations run in turn, ``--rounds`` times (ABCD ABCD), so a change of load on
a shared machine shows as spread between rounds rather than as a difference between configurations.
Writes ``<out>/inference-process.json`` and a line of ``.jsonl``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.asr.engine import Engine
from pipeline.asr.inference_process import ProcessRecognizer
from pipeline.asr.results import AudioSegment
from pipeline.bench.offered import arrivals, offer
from pipeline.bench.probes import cpu_seconds
from pipeline.bench.results import RESULTS, record, settings_that_matter, write_result
from pipeline.config import Settings, get_settings
from pipeline.eval.conditions import conditioned
from pipeline.eval.dataset import load_eval_set

CONFIGS: tuple[tuple[str, dict[str, int]], ...] = (
    ("in-process, 1 thread", {"inference_threads": 1, "inference_processes": 0}),
    ("in-process, 2 threads", {"inference_threads": 2, "inference_processes": 0}),
    ("1 process", {"inference_processes": 1}),
    ("2 processes", {"inference_processes": 2}),
)
TICK_S = 0.005


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


async def _ticker(lags: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        asked = time.perf_counter()
        await asyncio.sleep(TICK_S)
        lags.append((time.perf_counter() - asked - TICK_S) * 1000)


async def one_run(engine: Engine, segments: list[AudioSegment], load: float | None) -> dict[str, Any]:
    """Every segment through a new batcher of the engine's settings: all at once (``load`` None) or as a
    Poisson process of ``load`` speech seconds per second."""
    batcher = engine.new_batcher()
    remote = batcher.recognizer if isinstance(batcher.recognizer, ProcessRecognizer) else None
    children = [pid for pid in (remote.pids if remote else []) if pid is not None]
    await batcher.start()
    # Warm-up: a full batch on every thread or child (first-run allocations; a new child is cold).
    await asyncio.gather(*(batcher.submit(s) for s in segments[: batcher.max_batch * batcher.inference_threads]))
    speech_s = float(sum(s.audio.size for s in segments)) / 16000
    at = arrivals(segments, load)
    lags: list[float] = []
    stop = asyncio.Event()
    ticker = asyncio.create_task(_ticker(lags, stop))
    before = (time.process_time(), [cpu_seconds(pid) for pid in children])
    done, wall = await offer(batcher, segments, at)
    after = (time.process_time(), [cpu_seconds(pid) for pid in children])
    stop.set()
    await ticker
    await batcher.close()
    here_cpu = after[0] - before[0]
    children_cpu = sum(after[1]) - sum(before[1])
    p50, p99 = np.percentile([d.latency_s * 1000 for d in done], [50, 99])
    lag50, lag99 = np.percentile(lags, [50, 99]) if lags else (0.0, 0.0)
    return {
        "speech_s": round(speech_s, 1), "wall_s": round(wall, 2),
        "speech_s_per_wall_s": round(speech_s / wall, 2),
        "cpu_s_this_process": round(here_cpu, 2), "cpu_s_children": round(children_cpu, 2),
        "speech_s_per_cpu_s": round(speech_s / (here_cpu + children_cpu), 2),
        "latency_p50_ms": round(float(p50), 1), "latency_p99_ms": round(float(p99), 1),
        "event_loop_lag_p50_ms": round(float(lag50), 2), "event_loop_lag_p99_ms": round(float(lag99), 2),
        "load_average": load_average(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=3, help="Times the 20 evaluation utterances are repeated.")
    parser.add_argument("--rounds", type=int, default=2, help="Times every configuration runs, in turn.")
    parser.add_argument("--load", type=float, default=0.0,
                        help="Also a Poisson run at this many speech seconds per second (0: backlog only).")
    parser.add_argument("--out", type=Path, default=RESULTS / "inference-process")
    args = parser.parse_args()
    base: Settings = get_settings()
    utterances = conditioned(load_eval_set(), "8k-mulaw") * args.repeat
    segments = [AudioSegment(0, int(u.duration_s * 1000), u.audio) for u in utterances]
    engine = Engine.load(settings=base)
    runs: list[dict[str, Any]] = []
    print(f"{len(segments)} segments, {sum(s.audio.size for s in segments) / 16000:.0f} speech-s; "
          f"load average {load_average()}, {len(os.sched_getaffinity(0))} cores")
    for round_ in range(args.rounds):
        for label, update in CONFIGS:
            config = Engine(engine.recognizer, base.model_copy(update=update))
            for mode, load in (("backlog", None), *((("poisson", args.load),) if args.load else ())):
                figures = asyncio.run(one_run(config, segments, load))
                runs.append({"config": label, "mode": mode, "round": round_, **update, **figures})
                print(f"{label:22} {mode:8} {figures['speech_s_per_wall_s']:6.2f} speech-s/s  "
                      f"cpu here {figures['cpu_s_this_process']:5.1f} s children {figures['cpu_s_children']:5.1f} s  "
                      f"P99 {figures['latency_p99_ms']:7.0f} ms  loop lag P99 {figures['event_loop_lag_p99_ms']:6.1f} ms  "
                      f"load {figures['load_average']}")
    summary: dict[str, dict[str, float]] = {}
    for label, _ in CONFIGS:
        for mode in ("backlog", "poisson"):
            mine = [r for r in runs if r["config"] == label and r["mode"] == mode]
            if mine:
                summary[f"{label}, {mode}"] = {
                    "speech_s_per_wall_s_median": float(np.median([r["speech_s_per_wall_s"] for r in mine])),
                    "event_loop_lag_p99_ms_median": float(np.median([r["event_loop_lag_p99_ms"] for r in mine])),
                    "latency_p99_ms_median": float(np.median([r["latency_p99_ms"] for r in mine])),
                }
    doc = record("inference-process", settings_that_matter(base), {
        "segments": len(segments), "repeat": args.repeat, "rounds": args.rounds, "poisson_load": args.load,
        "cores_available": len(os.sched_getaffinity(0)), "runs": runs, "summary": summary,
    })
    for path in write_result("inference-process", doc, args.out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
