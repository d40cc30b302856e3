"""One load level of the live benchmark, the search over levels, and the comparisons at the found load.

A level: fresh topics and consumer group, real `callqa worker` processes in that group (one by default;
each with its own web port and its own embedded store in the run's folder, pinned with taskset to its share
of the cores given), the traffic of N calls sent
in real time for a warm-up, a steady window and a short tail (so segments whose speech ended in the
window can close), then a drain until the worker is idle. Everything is measured over the steady
window: final latency from the end of speech, throughput, the worker's CPU per part, RSS, consumer lag,
batch sizes, and the calls actually open.

A level is met when its finals' P99 latency is at most ``p99_max_s``, the lag is not growing over the
window (the worker does not fall further behind the live audio: the least-squares slope of how many
seconds of audio it is behind stays under LAG_SLOPE_MAX), it drained, and finals came.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from pipeline.bench import probes
from pipeline.bench.desk import TurnStream, start_desk
from pipeline.bench.latency import (
    FinalSeen,
    MatchedFinal,
    batch_sizes,
    match_finals,
    stages,
    turns_in_window,
    unique_finals,
    window_latency,
    window_visible_latency,
    written_in,
)
from pipeline.bench.sender import LiveSender, SendReport
from pipeline.bench.topics import TranscriptTap
from pipeline.bench.traffic import (
    FRAME_MS,
    CallPlan,
    NoiseBed,
    TrafficSpec,
    TurnLibrary,
    mean_open,
    plan_traffic,
)
from pipeline.bench.variants import settings_variant
from pipeline.bench.word_times import ALIGNER, TurnKey, WordTime, library_word_times
from pipeline.bench.words_on_screen import ShownTurn, summary, words_shown
from pipeline.bench.workers import Background, BenchError, WorkerGroup, WorkerProcess, share_cores
from pipeline.broker.local import free_port
from pipeline.broker.producer import ContractProducer
from pipeline.config import Settings
from pipeline.contracts import Serde
from pipeline.worker.metrics import DELAY_BUCKETS, PARTIAL_OUTCOMES

# "Lag not growing": the worker falls behind the live audio by less than 1 s per 100 s of window.
LAG_SLOPE_MAX = 0.01
FRAMES_PER_S_PER_LEG = 1000 // FRAME_MS
# No new final for this long, with nothing lagging or queued: the worker is idle. Longer than a batch takes
# unless the level is far over its capacity (then P99 fails whether or not its last finals are counted).
DRAIN_QUIET_S = 8.0
ASSIGNMENT_TIMEOUT_S = 90.0
# From the end of a spoken word to its first showing on a supervisor's screen (partials on).
WORDS_P99_GOAL_S = 1.5


@dataclass(frozen=True)
class LevelConfig:
    calls: int
    cores: tuple[int, ...]
    warmup_s: float = 30.0
    hold_s: float = 120.0
    tail_s: float = 5.0
    drain_timeout_s: float = 90.0
    sample_s: float = 2.0
    seed: int = 1
    max_batch: int | None = None  # None: the worker's own setting
    p99_max_s: float = 1.5
    # A `callqa desk` follows the level's topics and a stream client notes when each spoken word first
    # reaches it (``words_on_screen``); worth it with partials on (CALLQA_PARTIAL_INTERVAL_MS).
    desk: bool = False
    workers: int = 1  # worker processes in the level's consumer group, the cores shared out among them
    # A --variant: worker settings (name, value as written) over the environment's, and its label.
    overrides: tuple[tuple[str, str], ...] = ()
    variant: str = ""

    @property
    def worker_cores(self) -> list[tuple[int, ...]]:
        return share_cores(self.cores, self.workers)

    @property
    def traffic(self) -> TrafficSpec:
        return TrafficSpec(self.calls, seed=self.seed)

    @property
    def horizon_s(self) -> float:
        return self.warmup_s + self.hold_s + self.tail_s

    @property
    def label(self) -> str:
        return (f"{self.calls} calls" + ("" if self.workers == 1 else f", {self.workers} workers")
                + ("" if self.max_batch is None else f", max_batch {self.max_batch}")
                + (f", {self.variant}" if self.variant else ""))

    def worker_overrides(self) -> dict[str, str]:
        """The workers' settings beside the environment's: the variant's, then ``max_batch``."""
        return {**dict(self.overrides), **({} if self.max_batch is None else {"max_batch": str(self.max_batch)})}

    def settings(self) -> Settings:
        """The workers' settings: the environment's, the variant's over them, then ``max_batch``."""
        settings = Settings()
        if self.overrides:
            settings = settings_variant(settings, ",".join(f"{k}={v}" for k, v in self.overrides))[1]
        return settings if self.max_batch is None else settings.model_copy(update={"max_batch": self.max_batch})


@dataclass
class LevelRun:
    """A measured level: its figures (``result``, JSON-ready) and what the comparisons need."""

    config: LevelConfig
    result: dict[str, Any]
    plans: list[CallPlan] = field(repr=False)
    window_finals: list[FinalSeen] = field(repr=False)  # written inside the steady window

    @property
    def met(self) -> bool:
        return bool(self.result["met"])


# ---- the pieces of a level -------------------------------------------------------------------------------
# ---- a level ---------------------------------------------------------------------------------------------
@dataclass
class Watch:
    """What the level loop collects while the traffic runs and the worker drains."""

    samples: list[probes.MetricsSample] = field(default_factory=list)
    cpu_start: tuple[float, dict[int, probes.CpuSnapshot]] | None = None  # per worker pid
    cpu_end: tuple[float, dict[int, probes.CpuSnapshot]] | None = None
    thread_names: dict[int, dict[int, str]] = field(default_factory=dict)  # pid -> thread id -> Python name
    drained_after_s: float | None = None

    def start_window(self, pids: list[int]) -> None:
        self.cpu_start = (time.monotonic(), {pid: probes.cpu_snapshot(pid) for pid in pids})
        self.thread_names = {pid: probes.python_thread_names(pid) for pid in pids}

    def end_window(self, pids: list[int]) -> None:
        self.cpu_end = (time.monotonic(), {pid: probes.cpu_snapshot(pid) for pid in pids})
        # Names again: a pool's threads start when first needed, maybe after the window began.
        for pid in pids:
            self.thread_names.setdefault(pid, {}).update(probes.python_thread_names(pid))

    def cpu(self) -> probes.CpuSplit:
        """The workers' CPU over the window, added up."""
        assert self.cpu_start is not None and self.cpu_end is not None
        wall = self.cpu_end[0] - self.cpu_start[0]
        return probes.CpuSplit.combined([
            probes.cpu_split(pid, before, self.cpu_end[1][pid], wall, self.thread_names.get(pid, {}))
            for pid, before in self.cpu_start[1].items()])

    def sample(self, workers: WorkerGroup, t_s: float) -> probes.MetricsSample | None:
        """One scrape of every worker, added up; None when one of them did not answer in time (BenchError
        when one has exited)."""
        workers.check()
        sample = probes.scrape([(w.web_port, w.pid) for w in workers.workers], workers.settings.topic_audio, t_s)
        if sample is not None:
            self.samples.append(sample)
        return sample


def run_level(config: LevelConfig, library: TurnLibrary, work: Path, console: Console) -> LevelRun:
    prefix = f"bench.live.{config.calls}c{'' if config.max_batch is None else f'.b{config.max_batch}'}" \
             f"{'.v' if config.variant else ''}.{uuid.uuid4().hex[:6]}"
    plans = plan_traffic(library, config.traffic, config.horizon_s, prefix)
    with WorkerGroup.fresh(prefix, work / prefix, config.worker_overrides()) as workers:
        with console.status(f"{config.label}: starting {config.workers} worker(s) (model, VAD, store, consumer group)..."):
            workers.start_pinned(config.workers, config.cores, ASSIGNMENT_TIMEOUT_S)
        settings = workers.settings
        serde = Serde.from_settings(settings.schema_registry_url)
        tap = TranscriptTap(settings, serde)
        tap.start()
        screen: ScreenWatch | None = None
        try:
            if config.desk:
                screen = ScreenWatch.start(workers, work / prefix)
            sender = LiveSender(ContractProducer.from_settings(settings, serde), settings.topic_audio,
                                  settings.topic_call_events, library, NoiseBed(config.traffic.max_call_s),
                                  config.settings().audio_message_ms)
            report, watch = drive(config, workers, sender, plans, tap, console)
            finals = tap.finals()
            passed = postcall_figures(workers.workers, console) if config.settings().post_call_model else None
            partials = partial_figures(workers.workers) if config.settings().partial_interval_ms > 0 else None
        finally:
            tap.stop()
            if screen is not None:
                screen.stop()
        run = measure(config, plans, finals, report, watch)
        if passed is not None:
            run.result["postcall"] = passed
        if partials is not None:
            run.result["partials"] = partials
        if screen is not None:
            run.result["words_on_screen"] = screen.figures(config, plans, report, library_word_times(
                library, (t.source for p in plans for t in p.turns), console))
        return run


@dataclass
class ScreenWatch:
    """A `callqa desk` on the level's topics (the workers' settings and token, a store of its own) and a
    stream client of all calls' turns: what a supervisor's screen is sent, and when."""

    desk: subprocess.Popen[bytes]
    stream: TurnStream
    shown: list[ShownTurn] = field(default_factory=list)
    started_s: float = field(default_factory=time.monotonic)
    core_share: float | None = None  # the desk's CPU over its life (its start included)
    STREAM_MAX_S = "7200"  # one stream for the whole level: a reconnect would only add its gap

    @classmethod
    def start(cls, workers: WorkerGroup, folder: Path) -> ScreenWatch:
        env = {**workers.workers[0].env, "CALLQA_CLICKHOUSE_URL": f"chdb://{(folder / 'store-desk').resolve()}",
               "CALLQA_LIVE_STREAM_MAX_S": cls.STREAM_MAX_S}
        port = free_port()
        desk = start_desk(env, port, folder / "desk.log")
        shown: list[ShownTurn] = []
        stream = TurnStream(port, env["CALLQA_API_TOKEN"], lambda t, at: shown.append(ShownTurn.from_event(t, at)))
        stream.start()
        return cls(desk, stream, shown)

    def stop(self) -> None:
        self.stream.stopped.set()
        with suppress(OSError):
            life = time.monotonic() - self.started_s
            self.core_share = round(probes.cpu_snapshot(self.desk.pid).process_s / life, 3)
        self.desk.send_signal(signal.SIGTERM)
        try:
            self.desk.wait(30)
        except subprocess.TimeoutExpired:
            self.desk.kill()

    def figures(self, config: LevelConfig, plans: list[CallPlan], report: SendReport,
                times: Mapping[TurnKey, tuple[WordTime, ...]]) -> dict[str, Any]:
        wall0 = report.started_wall_s
        window = (wall0 + config.warmup_s, wall0 + config.warmup_s + config.hold_s)
        words = words_shown(plans, times, list(self.shown), wall0)
        return {**summary(words, *window), "goal_p99_s": WORDS_P99_GOAL_S, "aligner": ALIGNER,
                "turn_events": len(self.shown), "desk_core_share": self.core_share}


def partial_figures(workers: list[WorkerProcess]) -> dict[str, Any]:
    """What became of the level's partials (whole run), and their delay (audio captured -> published) as the
    upper bound of the worker histogram's bucket holding P50 / P99."""
    def total(name: str, **labels: str) -> float:
        return sum(w.metric(name, **labels) for w in workers)

    outcomes = {o: int(total("callqa_partials_total", outcome=o)) for o in PARTIAL_OUTCOMES}
    count = total("callqa_partial_delay_seconds_count")
    bounds = [(b, total("callqa_partial_delay_seconds_bucket", le=str(b))) for b in DELAY_BUCKETS]

    def upper(q: float) -> float | None:
        return next((b for b, n in bounds if n >= q * count), None) if count else None

    return {"outcomes": outcomes, "delay_p50_le_s": upper(0.5), "delay_p99_le_s": upper(0.99)}


POSTCALL_DRAIN_S = 300.0


def postcall_figures(workers: list[WorkerProcess], console: Console) -> dict[str, Any]:
    """The post-call pass over the level's finished calls (after the drain, waiting up to POSTCALL_DRAIN_S for
    its jobs): calls done, the pass's CPU, and calls per core-hour (calls of this traffic's length)."""
    def total(name: str, **labels: str) -> float:
        return sum(w.metric(name, **labels) for w in workers)

    began = time.monotonic()
    with console.status("post-call pass: waiting for its jobs..."):
        while (total("callqa_postcall_calls_total") < total("callqa_postcall_jobs_total")
               and time.monotonic() - began < POSTCALL_DRAIN_S):
            time.sleep(1.0)
    cpu_s, written = total("callqa_postcall_cpu_seconds_total"), total("callqa_postcall_calls_total", outcome="written")
    audio_s = total("callqa_postcall_audio_seconds_total")
    read = {whose: total("callqa_postcall_read_bytes_total", whose=whose) for whose in ("call", "other")}
    return {
        "jobs": int(total("callqa_postcall_jobs_total")), "written": int(written),
        "no_audio": int(total("callqa_postcall_calls_total", outcome="no_audio")),
        "failed": int(total("callqa_postcall_calls_total", outcome="failed")),
        "waited_after_drain_s": round(time.monotonic() - began, 1),
        "cpu_s": round(cpu_s, 2), "leg_audio_s": round(audio_s, 1),
        "cpu_s_per_leg_audio_s": round(cpu_s / audio_s, 4) if audio_s else None,
        "calls_per_core_hour": round(written * 3600 / cpu_s, 1) if cpu_s else None,
        "read_bytes": {k: int(v) for k, v in read.items()},
        "read_amplification": round((read["call"] + read["other"]) / read["call"], 2) if read["call"] else None,
    }


def drive(config: LevelConfig, workers: WorkerGroup, traffic: LiveSender, plans: list[CallPlan],
          tap: TranscriptTap, console: Console) -> tuple[SendReport, Watch]:
    """Send the traffic while sampling the workers; take CPU snapshots at the window's ends; then drain."""
    pids = [w.pid for w in workers.workers]
    report, watch = SendReport(), Watch()
    sender = Background("the traffic sender", lambda stop: traffic.run(plans, config.horizon_s, stop, report))
    window_end = config.warmup_s + config.hold_s
    columns = (TextColumn("[bold]{task.description}[/bold]"), BarColumn(), TextColumn("{task.fields[phase]}"),
               TextColumn("finals {task.fields[finals]}, lag {task.fields[lag]} frames"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(config.label, total=config.horizon_s, phase="warm-up", finals=0, lag="-")
        next_sample = 0.0
        with sender:
            while sender.is_alive():
                t = time.time() - report.started_wall_s if report.started_wall_s else 0.0
                if t >= next_sample:
                    sample = watch.sample(workers, t)
                    next_sample = t + config.sample_s
                    if sample is not None:
                        progress.update(task, lag=sample.audio_lag if sample.audio_lag is not None else "-")
                if watch.cpu_start is None and t >= config.warmup_s:
                    watch.start_window(pids)
                if watch.cpu_end is None and t >= window_end:
                    watch.end_window(pids)
                phase = "warm-up" if t < config.warmup_s else "steady" if t < window_end else "tail"
                progress.update(task, completed=min(t, config.horizon_s), phase=phase, finals=len(tap.finals()))
                workers.check()
                time.sleep(0.1)
        sender.check()
        if watch.cpu_end is None:  # the tail is shorter than a loop turn: the window ended with the traffic
            watch.end_window(pids)
        progress.update(task, phase="draining")
        watch.drained_after_s = drain(config, workers, tap, watch, report.started_wall_s)
    return report, watch


def drain(config: LevelConfig, workers: WorkerGroup, tap: TranscriptTap, watch: Watch,
          started_wall_s: float) -> float | None:
    """Seconds until the workers are idle (nothing lagging or queued, no new final for DRAIN_QUIET_S), or None
    when it did not get there within the drain timeout."""
    began = time.monotonic()
    count, quiet_since = len(tap.finals()), time.monotonic()
    while time.monotonic() - began < config.drain_timeout_s:
        time.sleep(1.0)
        sample = watch.sample(workers, time.time() - started_wall_s)
        now_count = len(tap.finals())
        if now_count != count:
            count, quiet_since = now_count, time.monotonic()
        idle = sample is not None and not sample.audio_lag and not sample.queue_depth
        if idle and time.monotonic() - quiet_since >= DRAIN_QUIET_S:
            return time.monotonic() - began
    return None


# ---- figures of a level ----------------------------------------------------------------------------------
def measure(config: LevelConfig, plans: list[CallPlan], finals: list[FinalSeen], report: SendReport,
            watch: Watch) -> LevelRun:
    """A level's figures over its steady window, JSON-ready."""
    if watch.cpu_start is None or watch.cpu_end is None:
        raise BenchError("the traffic stopped before the steady window began")
    wall0 = report.started_wall_s
    window = (wall0 + config.warmup_s, wall0 + config.warmup_s + config.hold_s)  # wall clock
    finals = unique_finals(finals)
    matched = match_finals(finals, {p.call_id: p for p in plans}, wall0)
    latency = window_latency(matched, *window)
    written = written_in(finals, *window)
    speech_s = sum(f.audio_s for f in written)
    cpu = watch.cpu()
    in_window = [s for s in watch.samples if config.warmup_s <= s.t_s <= config.warmup_s + config.hold_s]
    timeline = lag_timeline(watch.samples, plans)
    slope = lag_slope(timeline, config.warmup_s, config.warmup_s + config.hold_s)
    calls_mean, calls_min, calls_max = mean_open(plans, config.warmup_s, config.warmup_s + config.hold_s)
    why_not = verdict(config, latency.p99_s, slope, watch.drained_after_s, latency.count)
    result: dict[str, Any] = {
        "calls": config.calls, "legs": 2 * config.calls, "max_batch": config.settings().max_batch,
        "variant": config.variant or None, "settings_changed": dict(config.overrides),
        "cores": list(config.cores), "workers": config.workers,
        "worker_cores": [list(c) for c in config.worker_cores], "seed": config.seed,
        "window_s": {"warmup": config.warmup_s, "hold": config.hold_s, "tail": config.tail_s},
        "calls_open": {"mean": round(calls_mean, 2), "min": calls_min, "max": calls_max},
        "legs_open_mean": round(2 * calls_mean, 2),
        "calls_started": len(report.started), "calls_ended": len(report.ended),
        "latency": latency.as_json(),
        "read_committed_latency": window_visible_latency(matched, *window).as_json(),
        "stages": stages(matched, *window),
        "finals": finals_figures(finals, matched, written, turns_in_window(plans, matched, wall0, *window)),
        "throughput": {"speech_s_per_s": round(speech_s / config.hold_s, 3),
                       "finals_per_s": round(len(written) / config.hold_s, 3)},
        "worker": worker_figures(cpu, in_window, speech_s),
        "lag": {"slope_s_per_s": None if slope is None else round(slope, 4),
                "growing": slope is None or slope > LAG_SLOPE_MAX,
                "max_frames": max((s["lag_frames"] for s in timeline if s["lag_frames"] is not None), default=None)},
        "batches": {**batch_sizes(written), f"{probes.BATCH_SIZE}_histogram":
                    probes.histogram_between(in_window[0], in_window[-1]) if len(in_window) >= 2 else None},
        "sender": {"frames_sent": report.frames_sent, "events_sent": report.events_sent,
                    "tick_late": report.lateness()},
        "drain": {"drained": watch.drained_after_s is not None,
                  "after_s": None if watch.drained_after_s is None else round(watch.drained_after_s, 1)},
        "met": not why_not, "why_not": why_not,
        "timeline": timeline,
    }
    return LevelRun(config, result, plans, written)


def finals_figures(finals: list[FinalSeen], matched: list[MatchedFinal], written: list[FinalSeen],
                   turns: tuple[int, int]) -> dict[str, int]:
    return {
        "received": len(finals), "matched": sum(1 for m in matched if m.turn is not None),
        "unmatched": sum(1 for m in matched if m.turn is None), "split_turns": sum(1 for m in matched if m.split),
        "written_in_window": len(written),
        # Turns whose speech ended in the window, and those no final was matched to (lost, or decoded as
        # silence): a sanity figure, near 0 when every turn is transcribed.
        "turns_in_window": turns[0], "turns_without_final": turns[1],
    }


def worker_figures(cpu: probes.CpuSplit, in_window: list[probes.MetricsSample], speech_s: float) -> dict[str, Any]:
    rss = [s.rss_bytes for s in in_window if s.rss_bytes]
    return {
        **cpu.as_json(),
        "cpu_s_per_speech_s": cpu_per_speech(cpu, speech_s),
        "rss_mb": {"start": probes.mb(rss[0]), "end": probes.mb(rss[-1]), "max": probes.mb(max(rss))} if rss else None,
        # What the inference thread gets done per CPU second: compares batching policies at any load.
        "speech_s_per_inference_cpu_s": round(speech_s / cpu.inference_s, 2) if cpu.inference_s else None,
    }


def cpu_per_speech(cpu: probes.CpuSplit, speech_s: float) -> dict[str, float | None]:
    """The workers' CPU seconds in the window per second of speech they decoded in it: all of it, and the
    inference threads' and the event loop's shares (what a setting that saves work shows at any load)."""
    def per(seconds: float) -> float | None:
        x = probes.cpu_s_per_speech_s(seconds, speech_s)
        return None if x is None else round(x, 4)

    return {"total": per(cpu.total_s), "inference": per(cpu.inference_s), "event_loop": per(cpu.event_loop_s)}


def lag_timeline(samples: Sequence[probes.MetricsSample], plans: Sequence[CallPlan]) -> list[dict[str, Any]]:
    """Per sample: frames the worker is behind, and as seconds of the live audio (frames / the frame rate
    of the calls open then), its queue, calls and memory."""
    out = []
    for s in samples:
        open_calls = sum(1 for p in plans if p.open_at(s.t_s))
        rate = 2 * open_calls * FRAMES_PER_S_PER_LEG
        behind = None if s.audio_lag is None or rate == 0 else s.audio_lag / rate
        out.append({"t_s": round(s.t_s, 1), "lag_frames": s.audio_lag,
                    "behind_s": None if behind is None else round(behind, 3), "queue": s.queue_depth,
                    "worker_calls": s.active_calls, "calls_open": open_calls, "rss_mb": probes.mb(s.rss_bytes)})
    return out


def lag_slope(timeline: Sequence[dict[str, Any]], from_s: float, to_s: float) -> float | None:
    """Least-squares slope of seconds-behind over the window (s per s); None with fewer than 3 samples."""
    points = [(s["t_s"], s["behind_s"]) for s in timeline if from_s <= s["t_s"] <= to_s and s["behind_s"] is not None]
    if len(points) < 3:
        return None
    t, behind = np.asarray(points, dtype=float).T
    return float(np.polyfit(t, behind, 1)[0])


def verdict(config: LevelConfig, p99: float | None, slope: float | None, drained_after: float | None,
            finals: int) -> list[str]:
    """Why a level is not met (empty: met)."""
    why = []
    if finals == 0:
        why.append("no final whose speech ended in the window")
    elif p99 is not None and p99 > config.p99_max_s:
        why.append(f"P99 {p99:.2f} s > {config.p99_max_s:g} s")
    if slope is None:
        why.append("too few lag samples in the window")
    elif slope > LAG_SLOPE_MAX:
        why.append(f"lag growing ({slope * 100:.1f} s behind per 100 s)")
    if drained_after is None:
        why.append(f"not drained {config.drain_timeout_s:g} s after the traffic stopped")
    return why


# ---- search and comparisons ------------------------------------------------------------------------------
def search(run: Callable[[int], LevelRun], start: int, max_calls: int, resolution: float) -> tuple[LevelRun | None, list[LevelRun]]:
    """The most calls whose level is met: double from ``start`` until a level fails (or ``max_calls``),
    then bisect between the last met and the first failed until they are within ``resolution`` of the
    met one (at least 1 call). Returns that level (None if even 1 call fails) and every level run."""
    tried: dict[int, LevelRun] = {}

    def met(n: int) -> bool:
        tried[n] = run(n)
        return tried[n].met

    lo, hi, n = 0, max_calls + 1, max(1, min(start, max_calls))
    while n < hi:
        if not met(n):
            hi = n
        else:
            lo = n
            if n == max_calls:
                break
            n = min(2 * n, max_calls)
    while hi - lo > max(1, int(lo * resolution)):
        mid = (lo + hi) // 2
        if met(mid):
            lo = mid
        else:
            hi = mid
    return tried.get(lo), [tried[k] for k in sorted(tried)]


def batching_gain(batched: LevelRun, single: LevelRun) -> dict[str, Any]:
    """Dynamic batching against batch size 1 on the same traffic."""
    t_b, t_1 = (r.result["throughput"]["speech_s_per_s"] for r in (batched, single))
    e_b, e_1 = (r.result["worker"]["speech_s_per_inference_cpu_s"] for r in (batched, single))
    return {
        "calls": batched.config.calls, "max_batch": batched.result["max_batch"],
        "throughput_ratio": round(t_b / t_1, 2) if t_1 else None,
        "per_inference_cpu_ratio": round(e_b / e_1, 2) if e_b and e_1 else None,
        "batch1": {k: single.result[k] for k in ("latency", "throughput", "lag", "met", "why_not")},
        "batch1_keeps_up": single.met,
        "definition": "throughput_ratio (the gain): speech seconds of finals written per wall second in the steady "
                      "window, dynamic batching / max_batch 1, the same traffic (seed) at this load. When batch "
                      "size 1 keeps up too it is about 1 and says little: per_inference_cpu_ratio (speech seconds "
                      "per CPU second of the inference thread, batched / batch 1) then shows what batching saves.",
    }


def engine_alone(run: LevelRun, library: TurnLibrary, max_speech_s: float = 600.0) -> dict[str, Any]:
    """The engine alone (no Kafka, no worker) on the segments the worker decoded in the level's window:
    each cut from the generated leg where the worker cut it, at 16 kHz as the worker's resampler gives it,
    decoded in batches of max_batch in the order the worker wrote them, on the level's cores."""
    from pipeline.asr.engine import Engine

    segments = window_segments(run, library, max_speech_s)
    # The level's own (its variant's) settings, at the max_batch its figures were measured with.
    settings = run.config.settings().model_copy(update={"max_batch": run.result["max_batch"]})
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(run.config.cores))  # this thread, and the ONNX Runtime threads it creates
    try:
        engine = Engine.load(settings=settings)
        engine.transcribe_segments(segments[: settings.max_batch])  # warm-up: first-run allocations
        wall, cpu = time.perf_counter(), time.process_time()
        engine.transcribe_segments(segments, keep_silence=True)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        os.sched_setaffinity(0, affinity)
    speech_s = sum(s.audio.size for s in segments) / 16000
    pipeline = run.result["throughput"]["speech_s_per_s"]
    ceiling = speech_s / wall if wall > 0 else 0.0
    return {
        "calls": run.config.calls, "segments": len(segments), "speech_s": round(speech_s, 1), "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2), "max_batch": settings.max_batch, "cores": list(run.config.cores),
        "variant": run.config.variant or None,
        "speech_s_per_s": round(ceiling, 2), "pipeline_speech_s_per_s": pipeline,
        "cpu_s_per_speech_s": None if not speech_s else round(cpu / speech_s, 4),
        "pipeline_efficiency": round(pipeline / ceiling, 3) if ceiling else None,
    }


def window_segments(run: LevelRun, library: TurnLibrary, max_speech_s: float) -> list[Any]:
    """The audio of the finals written in the window (the first ``max_speech_s`` seconds of them)."""
    from pipeline.asr.results import AudioSegment
    from pipeline.audio import codecs
    from pipeline.audio.resample import StreamResampler
    from pipeline.bench.traffic import render_leg

    chosen: list[FinalSeen] = []
    total = 0.0
    for final in sorted(run.window_finals, key=lambda f: f.written_s):
        if total >= max_speech_s:
            break
        chosen.append(final)
        total += final.audio_s
    by_id = {p.call_id: p for p in run.plans}
    noise = NoiseBed(run.config.traffic.max_call_s)
    audio: dict[int, Any] = {}
    for call_id, leg in sorted({(f.call_id, f.leg) for f in chosen}):
        samples = codecs.decode(render_leg(by_id[call_id], leg, library, noise), "mulaw")
        resampler = StreamResampler(8000, 16000)
        leg_16k = np.concatenate([resampler.process(samples), resampler.flush()])
        for i, f in enumerate(chosen):  # one leg's 16 kHz audio at a time: slice it, then let it go
            if (f.call_id, f.leg) == (call_id, leg):
                audio[i] = AudioSegment(f.start_ms, f.end_ms, leg_16k[f.start_ms * 16:f.end_ms * 16].copy())
    return [audio[i] for i in range(len(chosen))]


def with_batch(config: LevelConfig, max_batch: int) -> LevelConfig:
    return replace(config, max_batch=max_batch)
