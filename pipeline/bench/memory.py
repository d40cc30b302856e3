"""`callqa bench memory`: the worker's memory per live leg, with legs added to ONE running worker.

One worker (pinned like the live benchmark's, on fresh topics), idle first, then ``step_calls`` calls
(2 legs each) added at once every ``step_s`` seconds, ``steps`` times; every call lasts past the end, so
the legs add up: 0, N, 2N, ... live legs. The worker's resident memory (/proc) and its own
``callqa_active_legs`` are sampled every 2 s; a step's figure is the median over its last ``window_s``
seconds, and its floor (the least sample: a batch's transient buffers come and go with the batch, not
the legs). Per leg = the RSS a step added / the legs it added (by the worker's own count). The step from
0 legs also pays for first use (the inference arena, the VAD's sessions, the store's first writes):
the goal (<= 2 MB per leg) is judged on the floors of the later steps, where only legs were added.

What holding a leg costs before its speech is decoded is measured apart (``at_connect``): the RSS in the
first CONNECT_S seconds after a step's calls connect against the seconds just before. Whatever a step
adds beyond that comes with decoding: the open segments' audio, the calls' text, and the inference
engine's working memory, which grows with the batch shapes a higher load brings (the whole worker's
high-water mark, not the legs').
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from pipeline.bench import probes
from pipeline.bench.results import RESULTS, record, run_folder, settings_that_matter, utc_stamp, write_result
from pipeline.bench.sender import LiveSender, SendReport
from pipeline.bench.traffic import CallPlan, NoiseBed, TrafficSpec, TurnLibrary, arriving
from pipeline.bench.workers import Background, WorkerGroup, shared_broker
from pipeline.broker.producer import ContractProducer
from pipeline.config import Settings
from pipeline.contracts import Serde

GOAL_MB_PER_LEG = 2.0
SAMPLE_S = 2.0
CONNECT_S = 8.0  # after a step's calls connect: their legs are held, little of their speech decoded yet


@dataclass(frozen=True)
class MemoryOptions:
    step_calls: int = 6  # calls added per step (2 legs each)
    steps: int = 3
    idle_s: float = 30.0  # before the first calls: the 0-legs figure
    step_s: float = 80.0  # each step's length; its last window_s seconds are its figure
    window_s: float = 30.0
    cores: tuple[int, ...] = (0,)
    seed: int = 1
    out: Path = RESULTS

    @property
    def horizon_s(self) -> float:
        return self.idle_s + self.steps * self.step_s

    def step_starts(self) -> list[float]:
        """When each step begins (s of traffic time): 0 legs at 0, then one step of calls each step_s."""
        return [0.0, *(self.idle_s + k * self.step_s for k in range(self.steps))]

    def step_ends(self) -> list[float]:
        return [*self.step_starts()[1:], self.horizon_s]


def step_plans(library: TurnLibrary, options: MemoryOptions, id_prefix: str) -> list[CallPlan]:
    """``step_calls`` calls arriving at the start of each step, each lasting past the horizon (seeded)."""
    rng = np.random.default_rng(options.seed)
    length_s = options.horizon_s + 30.0  # still open when the traffic stops: no call's state goes away
    spec = TrafficSpec(options.step_calls, seed=options.seed, min_call_s=length_s, max_call_s=length_s + 60.0)
    plans: list[CallPlan] = []
    for start in options.step_starts()[1:]:
        plans += [arriving(rng, library, spec, f"{id_prefix}-{len(plans) + i:05d}", start)
                  for i in range(options.step_calls)]
    return plans


@dataclass(frozen=True)
class Sample:
    t_s: float
    rss_bytes: int
    legs: float  # the worker's callqa_active_legs
    finals: float
    queue: float


def step_figures(samples: Sequence[Sample], ends: Sequence[float], window_s: float) -> list[dict[str, Any]]:
    """Per step: the median RSS and live legs over the last ``window_s`` seconds before its end."""
    steps = []
    for i, end in enumerate(ends):
        window = [s for s in samples if end - window_s <= s.t_s < end]
        if not window:
            raise ValueError(f"no sample in step {i}'s window ({end - window_s:g}-{end:g} s)")
        steps.append({"step": i, "legs": round(statistics.median(s.legs for s in window), 1),
                      "rss_mb": round(statistics.median(s.rss_bytes for s in window) / 2**20, 2),
                      "rss_mb_floor": round(min(s.rss_bytes for s in window) / 2**20, 2),
                      "rss_mb_max": round(max(s.rss_bytes for s in window) / 2**20, 2),
                      # Segments waiting for inference: a step whose queue is not empty at its median is over
                      # the worker's capacity, and its memory is queued audio, not legs.
                      "queue_median": statistics.median(s.queue for s in window),
                      "backlog": statistics.median(s.queue for s in window) > 0,
                      "samples": len(window)})
    return steps


def per_leg(steps: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each step against the one before: MB added / legs added, by the floors and by the medians (None
    where no legs were added)."""
    out = []
    for before, after in zip(steps, steps[1:], strict=False):
        legs = after["legs"] - before["legs"]
        floor, median = (after[k] - before[k] for k in ("rss_mb_floor", "rss_mb"))
        out.append({"from_legs": before["legs"], "to_legs": after["legs"], "rss_mb_added": round(floor, 2),
                    "mb_per_leg": round(floor / legs, 3) if legs > 0 else None, "backlog": after.get("backlog", False),
                    "rss_mb_added_median": round(median, 2),
                    "mb_per_leg_median": round(median / legs, 3) if legs > 0 else None})
    return out


def at_connect(samples: Sequence[Sample], starts: Sequence[float], connect_s: float = CONNECT_S) -> list[dict[str, Any]]:
    """Per step after the first: what its legs cost to hold before their speech is decoded, the median RSS
    of the samples 1 s to ``connect_s`` after the step's calls connect against the last 6 s before them."""
    out = []
    for start in starts[1:]:
        before = [s for s in samples if start - 6.0 <= s.t_s < start]
        after = [s for s in samples if start + 1.0 <= s.t_s < start + connect_s]
        if not before or not after:
            continue
        legs = statistics.median(s.legs for s in after) - statistics.median(s.legs for s in before)
        added = (statistics.median(s.rss_bytes for s in after) - statistics.median(s.rss_bytes for s in before)) / 2**20
        out.append({"at_s": start, "legs_added": legs, "rss_mb_added": round(added, 2),
                    "mb_per_leg": round(added / legs, 3) if legs > 0 else None})
    return out


def verdict(per_step: Sequence[dict[str, Any]], goal_mb: float = GOAL_MB_PER_LEG) -> dict[str, Any]:
    """The figure the goal is judged on: legs added to a worker that already holds legs (every step after
    the first, legs and MB added up, by the floors), so first-use allocations do not count as the legs'."""
    later = [s for s in per_step[1:] if s["mb_per_leg"] is not None and not s.get("backlog")]
    if not later:
        return {"mb_per_leg": None, "goal_mb_per_leg": goal_mb, "met": None}
    legs = sum(s["to_legs"] - s["from_legs"] for s in later)
    mb = sum(s["rss_mb_added"] for s in later) / legs
    median = sum(s["rss_mb_added_median"] for s in later) / legs
    return {"mb_per_leg": round(mb, 3), "mb_per_leg_median": round(median, 3), "goal_mb_per_leg": goal_mb,
            "met": mb <= goal_mb, "from_legs": later[0]["from_legs"], "to_legs": later[-1]["to_legs"]}


def run_memory(options: MemoryOptions, console: Console) -> tuple[dict[str, Any], list[Path]]:
    stamp = utc_stamp()
    work = run_folder("memory", stamp)
    library = TurnLibrary.load()
    prefix = f"bench.memory.{uuid.uuid4().hex[:6]}"
    plans = step_plans(library, options, prefix)
    samples: list[Sample] = []
    report = SendReport()
    with shared_broker(console.print), WorkerGroup.fresh(prefix, work) as workers:
        with console.status("starting the worker (model, VAD, store, consumer group)..."):
            (worker,) = workers.start_pinned(1, options.cores)
        settings = workers.settings
        sender = LiveSender(ContractProducer.from_settings(settings, Serde.from_settings(settings.schema_registry_url)),
                            settings.topic_audio, settings.topic_call_events, library, NoiseBed(length_limit(plans)),
                            settings.audio_message_ms)
        next_step = 1
        with Background("the traffic sender", lambda stop: sender.run(plans, options.horizon_s, stop, report)) as thread:
            while thread.is_alive():
                t = time.time() - report.started_wall_s if report.started_wall_s else 0.0
                workers.check()
                sample = probes.scrape([(worker.web_port, worker.pid)], settings.topic_audio, t)
                if sample is not None:
                    samples.append(Sample(t, sample.rss_bytes, sample.active_legs, sample.finals, sample.queue_depth))
                if next_step < len(options.step_starts()) and t >= options.step_starts()[next_step]:
                    console.print(f"  t={t:.0f} s: {options.step_calls} more calls "
                                  f"({2 * options.step_calls * next_step} legs)")
                    next_step += 1
                time.sleep(SAMPLE_S)
        thread.check()
    steps = step_figures(samples, options.step_ends(), options.window_s)
    per_step = per_leg(steps)
    doc = record("memory", settings_that_matter(Settings()), {
        "options": {"step_calls": options.step_calls, "steps": options.steps, "idle_s": options.idle_s,
                    "step_s": options.step_s, "window_s": options.window_s, "cores": list(options.cores),
                    "seed": options.seed},
        # The allocator's tuning, where the environment sets it (the worker inherits it): RSS depends on it.
        "environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("MALLOC_", "GLIBC_TUNABLES"))},
        "steps": steps, "per_step": per_step, "result": verdict(per_step),
        "at_connect": at_connect(samples, options.step_starts()),
        "sender": {"frames_sent": report.frames_sent, "tick_late": report.lateness()},
        "timeline": [{"t_s": round(s.t_s, 1), "rss_mb": round(s.rss_bytes / 2**20, 2), "legs": s.legs,
                      "finals": s.finals, "queue": s.queue} for s in samples],
        "definitions": {
            "steps": "0 legs (the worker idle after start), then step_calls calls (2 legs each) added at once at "
                     "the start of each step, none ending; per step the median RSS (/proc/<pid>/status VmRSS) "
                     "and the worker's callqa_active_legs over its last window_s seconds",
            "per_step": "RSS added / legs added, each step against the one before: mb_per_leg by the windows' "
                        "floors (least sample: without a batch's transient buffers), mb_per_leg_median by medians",
            "at_connect": "per step: median RSS 1-8 s after its calls connected - the 6 s before, / legs added: "
                          "what holding a leg costs before its speech is decoded",
            "result": "mb_per_leg over the steps after the first (legs added to a worker already holding legs and "
                      "having decoded: first-use allocations are the first step's) and without a backlog (a step "
                      "whose batcher queue's median is not 0 is over capacity: its memory is queued audio), by the "
                      "floors, against the goal",
        },
        "worker_logs": str(work),
    }, started=stamp)
    return doc, write_result("memory", doc, options.out)


def length_limit(plans: Sequence[CallPlan]) -> float:
    """The longest call (s): the noise bed must cover it."""
    return max(p.duration_ms for p in plans) / 1000 + 1.0


def _mb(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"
