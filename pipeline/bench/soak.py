"""`callqa bench soak`: live traffic for a long time, a worker restarted every few minutes; does anything grow?

One run on the shared broker, built from the live benchmark's parts (traffic plan, sender, transcript tap,
worker group, probes): ``workers`` workers in one consumer group, each pinned to its share of the cores;
the first one runs throughout (its memory and open files are the ones that must stay flat), the others are
stopped with SIGTERM and started again in turn every ``restart_every_s``, as a rolling deployment does.
By default each worker has a static group membership (its instance id, as a StatefulSet pod's name, and
a session above a restart's length): a restart moves no partition and pauses only the restarted worker's
calls, the deployment the worker's README recommends; ``static_membership=False``: every stop and start
rebalances the group and calls move under load. A static member is restarted by hand-over (``standby``):
its successor starts first and loads its model beside it, and takes over the instance when the old one,
then stopped, exits (pipeline/worker/instance_lock.py); ``standby=False``: stopped, then started. The first restart comes half a period after the warm-up,
so each compared window of whole periods holds as many restarts as the other (with the first one a
period after the warm-up, the last window of an hour held two and the first one). The traffic is the live benchmark's 2-6 minute calls,
exactly ``calls`` open at every moment (a new call on a line as soon as its last one ends: with Poisson
arrivals the first hour-long run went from about 10 to over 20 open calls, and its figures followed the
load, not time); by default 70 % of the capacity the latest `callqa bench live --search` found with the model
the workers run.

Every ``interval_s`` one row of the time series: each worker's RSS, open files and threads, the audio lag,
the finals whose speech ended in that interval (count and P99 latency), the calls open, the checkpoint
topic's offsets (watermarks) and every topic's bytes on the broker's disk (local broker only); at the
end the checkpoint topic as compaction leaves it (live keys: calls still open).
The calls still open when the traffic stops are ended there (a turn that ended a moment before would
otherwise wait for its endpoint's silence, which never comes). After the traffic, a drain; then the
verdict against the goals: the long-lived worker's RSS grows at most ``RSS_GROWTH_MAX_PCT`` from the first
``COMPARE_S`` (after the warm-up) to the last; the finals' P99 of the last ``COMPARE_S`` is within
``P99_DRIFT_MAX_PCT`` of the first's; each restart's next minute has a P99 within ``AFTER_RESTART_MAX_RATIO``
times the P99 between restarts (each restart's row names its slowest finals and their stages); nothing lost: every turn whose speech ended before the traffic
stopped got a final. Result: ``soak``.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import Consumer, TopicPartition
from rich.console import Console

from pipeline.bench import probes
from pipeline.bench.latency import MatchedFinal, match_finals, turns_in_window, unique_finals, window_latency
from pipeline.bench.results import RESULTS, read_history, record, run_folder, utc_stamp, write_result
from pipeline.bench.sender import LiveSender, SendReport
from pipeline.bench.topics import TranscriptTap, checkpoint_figures, read_topic
from pipeline.bench.traffic import CallPlan, NoiseBed, TrafficSpec, TurnLibrary, plan_steady_traffic
from pipeline.bench.workers import Background, WorkerGroup, WorkerProcess, shared_broker
from pipeline.broker.local import LocalKafka
from pipeline.broker.producer import ContractProducer
from pipeline.config import Settings
from pipeline.contracts import Serde

CAPACITY_SHARE = 0.7  # of the latest found capacity, when --calls is not given
DEFAULT_CALLS = 6  # when no capacity was ever found
RSS_GROWTH_MAX_PCT = 5.0
P99_DRIFT_MAX_PCT = 20.0
COMPARE_S = 600.0  # the first and the last ten minutes (or a third of a shorter run) are compared
STATIC_SESSION_S = 45.0  # a static member's session: well above a restart (5-6 s), so none is evicted
AFTER_RESTART_S = 60.0  # each restart's row: the P99 of the finals whose speech ended this long after it
# A restart's minute may be this much slower than the time between restarts (P99 over P99): its calls wait
# for the hand-over and the catch-up, but a deployment should not be seen on the supervisors' screens.
AFTER_RESTART_MAX_RATIO = 1.5
SLOWEST_SHOWN = 5  # per restart, the slowest finals after it, with where their time went
DRAIN_S = 120.0


@dataclass(frozen=True)
class SoakConfig:
    minutes: float
    calls: int
    cores: tuple[int, ...]
    workers: int = 2
    restart_every_s: float = 300.0
    interval_s: float = 60.0
    warmup_s: float = 60.0
    seed: int = 1
    static_membership: bool = True
    standby: bool = True  # with static_membership: a restart hands over to a standby (started first)

    @property
    def traffic_s(self) -> float:
        return self.warmup_s + self.minutes * 60

    @property
    def compare_s(self) -> float:
        return min(COMPARE_S, self.minutes * 60 / 3)

    def restart_times(self) -> list[float]:
        """When the restarts are due (s from the traffic's start): half a period after the warm-up, then
        every period while traffic runs, so windows of whole periods hold equally many."""
        if self.workers < 2:
            return []
        first = self.warmup_s + self.restart_every_s / 2
        return [float(t) for t in np.arange(first, self.traffic_s, self.restart_every_s)]

    def worker_overrides(self, prefix: str, label: str) -> dict[str, str]:
        """A worker's own settings: its static membership id and a session that outlasts its restart."""
        if not self.static_membership:
            return {}
        return {"worker_instance_id": f"{prefix}-{label}", "kafka_session_timeout_s": f"{STATIC_SESSION_S:g}"}



def default_calls(model: str, out: Path = RESULTS) -> tuple[int, str]:
    """70 % of the concurrent calls the latest `bench live --search` with ``model`` held, and where that figure
    comes from. Another model's capacity is no guide: tiny.en's 20 calls overloaded Moonshine base workers."""
    for doc in reversed(read_history("live", out)):
        found = (doc.get("search") or {}).get("calls") or 0
        if found > 0 and (doc.get("settings") or {}).get("model") == model:
            return (max(1, round(CAPACITY_SHARE * found)),
                    f"70 % of {found} calls found by bench live with {model} on {doc['started']}")
    return DEFAULT_CALLS, f"no capacity found by bench live with {model} yet: {DEFAULT_CALLS} calls"


class SoakRun:
    """The workers, the traffic and the samples of one soak."""

    def __init__(self, config: SoakConfig, workers: WorkerGroup, plans: list[CallPlan], tap: TranscriptTap,
                 say: Callable[[str], None]) -> None:
        self.config, self.workers, self.plans, self.tap, self.say = config, workers, plans, tap, say
        self.rows: list[dict[str, Any]] = []
        self.restarts: list[dict[str, Any]] = []
        self.unplanned_exits: list[dict[str, Any]] = []
        self.report = SendReport()
        local = LocalKafka(workers.settings)
        self.data_dir: Path | None = local.data_dir if not workers.settings.bootstrap_servers else None

    def now(self) -> float:
        return time.time() - self.report.started_wall_s if self.report.started_wall_s else 0.0

    def drive(self, sender: LiveSender) -> None:
        """Send the traffic; every interval a row, every restart period the next worker restarted."""
        config = self.config
        traffic = Background("the traffic sender", lambda stop: sender.run(self.plans, config.traffic_s, stop,
                                                                           self.report, end_open=True))
        next_row, due, turn = config.interval_s, config.restart_times(), 0
        with traffic:
            while traffic.is_alive():
                t = self.now()
                if t >= next_row:
                    self.rows.append(self.sample(t, t - config.interval_s))
                    self.say(row_line(self.rows[-1]))
                    next_row += config.interval_s
                if turn < len(due) and t >= due[turn]:
                    self.restart(self.workers.workers[1 + turn % (config.workers - 1)], t)
                    turn += 1
                self.revive(t)
                time.sleep(0.5)
        traffic.check()

    def revive(self, t: float) -> None:
        """A worker that exited by itself is started again, as a supervisor would, and counted: a soak
        goes on to show what followed, and is not met."""
        for worker in self.workers.workers:
            if not worker.alive():
                code, why = worker.exit_code, worker.why()
                self.workers.restart(worker)
                self.unplanned_exits.append({"t_s": round(t, 1), "worker": worker.label, "exit_code": code,
                                             "why": why})
                self.say(f"  {t:7.1f} s  {worker.label} exited by itself ({code}): {why}; started again")

    def restart(self, worker: WorkerProcess, t: float) -> None:
        """Restart ``worker``; ``took_s``: from its SIGTERM to its successor serving, the pause its calls see."""
        began = time.monotonic()
        if self.config.standby and self.config.static_membership:
            code, took_s = self.workers.hand_over(worker)
            how = "handed over to a standby"
        else:
            worker.stop()
            code = worker.exit_code
            self.workers.restart(worker)
            took_s, how = time.monotonic() - began, "stopped, then started"
        # standby_s: the successor loading beside the serving worker, before the SIGTERM (0 without a standby).
        self.restarts.append({"t_s": round(t, 1), "worker": worker.label, "exit_code": code,
                              "took_s": round(took_s, 2),
                              "standby_s": round(time.monotonic() - began - took_s, 2)})
        self.say(f"  {t:7.1f} s  restarted {worker.label} ({how}; SIGTERM exit {code}, back after "
                 f"{self.restarts[-1]['took_s']} s)")

    def sample(self, t: float, since: float) -> dict[str, Any]:
        self.revive(t)
        metrics = probes.scrape([(w.web_port, w.pid) for w in self.workers.workers], self.workers.settings.topic_audio,
                                t)
        wall0 = self.report.started_wall_s
        matched = match_finals(self.tap.finals(), {p.call_id: p for p in self.plans}, wall0)
        latency = window_latency(matched, wall0 + since, wall0 + t)
        return {
            "t_s": round(t, 1),
            "rss_mb": {w.label: probes.mb(probes.rss_bytes(w.pid)) for w in self.workers.workers if w.alive()},
            "open_files": {w.label: _count(f"/proc/{w.pid}/fd") for w in self.workers.workers if w.alive()},
            "threads": {w.label: _count(f"/proc/{w.pid}/task") for w in self.workers.workers if w.alive()},
            "audio_lag_frames": None if metrics is None else metrics.audio_lag,
            "finals": latency.count, "p99_s": None if latency.p99_s is None else round(latency.p99_s, 3),
            "calls_open": sum(1 for p in self.plans if p.arrival_s <= t < p.end_s),
            # Offsets between the watermarks: records written and not yet past retention (compaction removes
            # records inside that span without moving it; what it left is read once, at the end). Reading the
            # topic every interval would load the machine being measured.
            "checkpoint_offsets": self.offsets_kept(self.workers.settings.topic_checkpoints),
            "topic_bytes": self.topic_bytes(),
        }

    def offsets_kept(self, topic: str) -> int | None:
        """Offsets between each partition's low and high watermark."""
        with suppress(Exception):
            consumer = Consumer({"bootstrap.servers": self.workers.settings.bootstrap,
                                 "group.id": f"soak-{uuid.uuid4().hex}", "enable.auto.commit": False})
            try:
                partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
                marks = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in partitions]
                return sum(hi - lo for lo, hi in marks)
            finally:
                consumer.close()
        return None

    def topic_bytes(self) -> dict[str, int] | None:
        """Bytes of log segments on the local broker's disk per topic of this run (None with a broker elsewhere)."""
        if self.data_dir is None:
            return None
        prefix = self.workers.settings.worker_id
        sizes: dict[str, int] = {}
        for folder in self.data_dir.glob(f"{prefix}.*-*"):
            topic = folder.name.rsplit("-", 1)[0].removeprefix(prefix + ".")
            # Log segments only: index files are preallocated (10 MB each) whatever the topic holds.
            sizes[topic] = sizes.get(topic, 0) + sum(f.stat().st_size for f in folder.glob("*.log"))
        return dict(sorted(sizes.items()))


def run_soak(config: SoakConfig, console: Console, out: Path = RESULTS) -> tuple[dict[str, Any], list[Path]]:
    stamp = utc_stamp()
    work = run_folder("soak", stamp)
    library = TurnLibrary.load()
    prefix = f"bench.soak.{config.calls}c.{uuid.uuid4().hex[:6]}"
    plans = plan_steady_traffic(library, TrafficSpec(config.calls, seed=config.seed), config.traffic_s, prefix)
    with shared_broker(console.print), WorkerGroup.fresh(prefix, work / prefix) as workers:
        with console.status(f"starting {config.workers} workers..."):
            workers.start_pinned(config.workers, config.cores,
                                 overrides=lambda label: config.worker_overrides(prefix, label))
        settings = workers.settings
        serde = Serde.from_settings(settings.schema_registry_url)
        tap = TranscriptTap(settings, serde)
        tap.start()
        try:
            run = SoakRun(config, workers, plans, tap, console.print)
            console.print(f"{config.calls} calls for {config.minutes:g} min after a {config.warmup_s:g} s warm-up; "
                          f"{config.workers} workers, one restarted every {config.restart_every_s:g} s")
            sender = LiveSender(ContractProducer.from_settings(settings, serde), settings.topic_audio,
                                settings.topic_call_events, library, NoiseBed(TrafficSpec(config.calls).max_call_s),
                                Settings().audio_message_ms)
            run.drive(sender)
            drain(run)
            figures = soak_figures(config, run)
            figures["checkpoint_topic"] = {k: v for k, v in checkpoint_figures(
                read_topic(settings, settings.topic_checkpoints)).items() if k != "live_calls"}
        finally:
            tap.stop()
    figures["worker_logs"] = str(work)
    doc = record("soak", {"calls": config.calls, "minutes": config.minutes, "workers": config.workers,
                          "restart_every_s": config.restart_every_s, "interval_s": config.interval_s,
                          "warmup_s": config.warmup_s, "cores": list(config.cores), "seed": config.seed,
                          "static_membership": config.static_membership, "standby": config.standby},
                 figures, started=stamp)
    return doc, write_result("soak", doc, out)


def drain(run: SoakRun) -> None:
    """Until every turn that ended got its final's chance: no new final for 10 s, at most DRAIN_S."""
    began, count, quiet = time.monotonic(), len(run.tap.finals()), time.monotonic()
    while time.monotonic() - began < DRAIN_S and time.monotonic() - quiet < 10.0:
        time.sleep(1.0)
        if len(run.tap.finals()) != count:
            count, quiet = len(run.tap.finals()), time.monotonic()


def soak_figures(config: SoakConfig, run: SoakRun) -> dict[str, Any]:
    wall0 = run.report.started_wall_s
    finals = unique_finals(run.tap.finals())
    matched = match_finals(finals, {p.call_id: p for p in run.plans}, wall0)
    first = (config.warmup_s, config.warmup_s + config.compare_s)
    last = (config.traffic_s - config.compare_s, config.traffic_s)
    p99 = [window_latency(matched, wall0 + a, wall0 + b).p99_s for a, b in (first, last)]
    restarts_in = [sum(1 for r in run.restarts if a <= r["t_s"] < b) for a, b in (first, last)]
    # Between restarts: the finals whose speech ended outside every restart's next minute. A restart's
    # pause sets the window's P99 (its calls wait for the worker to come back and catch up), so this says
    # whether the steady path itself slows down over the hour.
    def steady(m: Any) -> bool:
        return not any(0 <= m.speech_end_s - wall0 - r["t_s"] < AFTER_RESTART_S for r in run.restarts)

    between = [m for m in matched if m.speech_end_s is not None and steady(m)]
    p99_steady = [window_latency(between, wall0 + a, wall0 + b).p99_s for a, b in (first, last)]
    # Does a restart's pause grow over the hour? Each one's P99 of the finals whose speech ended after it.
    restarts = [{**r, "p99_after_s": _round(window_latency(matched, wall0 + r["t_s"],
                                                           wall0 + r["t_s"] + AFTER_RESTART_S).p99_s),
                 "slowest_after": slowest_after(matched, wall0 + r["t_s"])}
                for r in run.restarts]
    steady_all = window_latency(between, wall0 + config.warmup_s, wall0 + config.traffic_s).p99_s
    worst_after = max((r["p99_after_s"] for r in restarts if r["p99_after_s"] is not None), default=None)
    ratio = None if steady_all is None or worst_after is None else round(worst_after / steady_all, 2)
    turns, unheard = turns_in_window(run.plans, matched, wall0, wall0 + config.warmup_s, wall0 + config.traffic_s)
    heard = {(m.final.call_id, id(m.turn)) for m in matched if m.turn is not None}
    missing = [{"call_id": p.call_id, "leg": t.leg, "end_s": round(p.arrival_s + t.end_ms / 1000, 1),
                "ms": t.end_ms - t.start_ms, "text": t.text[:60]}
               for p in run.plans for t in p.turns if (p.call_id, id(t)) not in heard
               and config.warmup_s <= p.arrival_s + t.end_ms / 1000 < config.traffic_s][:20]
    long_lived = run.workers.workers[0].label
    rss = [_mean([r["rss_mb"].get(long_lived) for r in run.rows if a <= r["t_s"] <= b]) for a, b in (first, last)]
    growth = None if None in rss else round(100 * (rss[1] - rss[0]) / rss[0], 2)  # type: ignore[operator]
    # The trend after the first window, where warm-up growth (allocator pools, the store's thread pool)
    # is over: a leak shows as a steady slope here even when the growth between the windows is small.
    later = [(r["t_s"], r["rss_mb"][long_lived]) for r in run.rows
             if r["t_s"] >= first[1] and r["rss_mb"].get(long_lived) is not None]
    slope = (round(float(np.polyfit([t for t, _ in later], [mb for _, mb in later], 1)[0]) * 3600, 1)
             if len(later) >= 3 else None)
    drift = None if None in p99 else round(100 * (p99[1] - p99[0]) / p99[0], 1)  # type: ignore[operator]
    why_not = [why for ok, why in (
        (growth is not None and growth <= RSS_GROWTH_MAX_PCT, f"RSS of {long_lived} grew {growth} %"),
        (drift is not None and drift <= P99_DRIFT_MAX_PCT, f"P99 moved {drift} % from the first window to the last"),
        (ratio is None or ratio <= AFTER_RESTART_MAX_RATIO,
         f"a restart's next minute had P99 {worst_after} s, {ratio}x the {_round(steady_all)} s between restarts"),
        (unheard == 0, f"{unheard} of {turns} turns got no final"),
        (all(r["exit_code"] == 0 for r in run.restarts), "a worker did not exit cleanly on SIGTERM"),
        (not run.unplanned_exits, f"{len(run.unplanned_exits)} unplanned worker exits"),
    ) if not ok]
    return {
        "goals": {"rss_growth_max_pct": RSS_GROWTH_MAX_PCT, "p99_drift_max_pct": P99_DRIFT_MAX_PCT,
                  "compared_s": config.compare_s, "lost_turns": 0,
                  "after_restart_max_ratio": AFTER_RESTART_MAX_RATIO},
        "long_lived_worker": long_lived,
        "rss_mb": {"first": rss[0], "last": rss[1], "growth_pct": growth, "slope_after_first_mb_per_h": slope},
        "p99_s": {"first": _round(p99[0]), "last": _round(p99[1]), "drift_pct": drift,
                  "restarts_in_windows": restarts_in,
                  "between_restarts": {"first": _round(p99_steady[0]), "last": _round(p99_steady[1]),
                                       "whole_run": _round(steady_all)},
                  "worst_after_restart": worst_after, "after_restart_ratio": ratio},
        "turns": {"ended": turns, "without_final": unheard, "without_final_first_20": missing},
        "finals": len(finals), "restarts": restarts, "unplanned_exits": run.unplanned_exits,
        "timeline": run.rows,
        "met": not why_not, "why_not": why_not,
    }


def slowest_after(matched: Sequence[MatchedFinal], at_wall_s: float) -> list[dict[str, Any]]:
    """The slowest finals whose speech ended in the minute after a restart, and where their time went:
    ``close_s`` from the speech's end to the segment's close (the endpoint's silence, and any catch-up of a
    worker behind its audio), ``wait_s`` in the batcher, ``inference_s``, ``after_s`` from the batch to the
    record's write."""
    after = [(m.latency_s, m.speech_end_s, m.final) for m in matched
             if m.speech_end_s is not None and m.latency_s is not None
             and 0 <= m.speech_end_s - at_wall_s < AFTER_RESTART_S]
    shown = []
    for latency, speech_end, f in sorted(after, key=lambda a: a[0], reverse=True)[:SLOWEST_SHOWN]:
        close = None if f.closed_s is None else round(f.closed_s - speech_end, 2)
        done = None if f.closed_s is None else f.closed_s + f.wait_s + f.inference_s
        shown.append({"call_id": f.call_id, "leg": f.leg, "speech_end_after_s": round(speech_end - at_wall_s, 2),
                      "latency_s": round(latency, 2), "close_s": close, "wait_s": round(f.wait_s, 2),
                      "inference_s": round(f.inference_s, 2), "batch": f.batch_size,
                      "after_s": None if done is None else round(f.written_s - done, 2)})
    return shown


def row_line(row: dict[str, Any]) -> str:
    rss = ", ".join(f"{k} {v} MB" for k, v in row["rss_mb"].items())
    files = sum(row["open_files"].values())
    return (f"  {row['t_s']:7.1f} s  RSS {rss}; files {files}; finals {row['finals']}, P99 {row['p99_s']} s; "
            f"lag {row['audio_lag_frames']} frames; checkpoint offsets {row['checkpoint_offsets']}")


def _count(folder: str) -> int | None:
    try:
        return len(os.listdir(folder))
    except OSError:
        return None


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(float(np.mean(present)), 1) if present else None


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)
