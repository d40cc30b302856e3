"""`callqa bench scale-out`: workers in one consumer group, real broker, real worker processes.

Measured in one run, on fresh topics per part (12 audio partitions by default):
1. throughput: the same backlog of N two-leg library calls (replayed as fast as possible, spread evenly
   over the workers' partitions) through 1 worker pinned to core 0, then through 2 workers of one consumer
   group pinned to cores 0 and 1; call-audio seconds finished per wall second, from the first frame sent
   to every call durable in a store. The ratio is the scale-out efficiency (goal >= 1.8); the same ratio
   from the workers' CPU seconds shows what the machine's sharing of the cores takes off it.
2. rebalance pause: worker A under live load (one call per partition, replayed in real time; workers not
   pinned); worker B joins; seconds from B's web port answering until both produce final transcripts
   again, from their /metrics every 0.5 s (goal <= 10 s); and the leg audio both fed their segmenters
   beyond the calls' own (re-decoded because of the rebalance), with calls kept across it (the default)
   and, run again, with every call dropped on revocation (CALLQA_KEEP_CALLS_ON_REBALANCE=false).
3. re-decoded audio after a crash: one long call, replayed fast up to its last minutes and then in real
   time; the worker is killed (SIGKILL) near its end and restarted on the same store; re-decoded audio =
   fed before the kill + fed after the restart - the call's audio (callqa_leg_audio_seconds_total), against
   n_legs * (max_segment + commit interval + checkpoint interval).
A part that fails is reported with one line (and the workers' logs are kept), the others still run.
Prints a table. Result: ``scale-out``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka.admin import AdminClient
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pipeline.bench.results import RESULTS, ROOT, record, settings_that_matter, utc_stamp, write_result
from pipeline.broker.groups import GroupNotStableError, group_assignment
from pipeline.broker.groups import wait_for_members as members_settled
from pipeline.broker.local import LocalKafka, free_port
from pipeline.broker.producer import ContractProducer
from pipeline.broker.security import ClientErrors, admin_client
from pipeline.broker.topics import ensure_topics
from pipeline.config import Settings
from pipeline.contracts import Serde
from pipeline.eval.call_library import LIBRARY_DIR, holds_of, load_manifest
from pipeline.ingest.replay import (
    TELEPHONY_RATE,
    CallRecording,
    ReplayOptions,
    ReplayReport,
    TelephonyReplay,
    load_recording,
)
from pipeline.worker.process import WorkerProcess, worker_env

console = Console()

OPTIONS = ReplayOptions(encoding="mulaw", frame_ms=20)
POLL_S = 0.5
FINAL_SEGMENTS = "callqa_segments_total"  # label kind="final" (pipeline/worker/metrics.py)
LEG_AUDIO = "callqa_leg_audio_seconds_total"  # audio fed to the legs' segmenters
# Library calls longer than this are left out of the throughput and live loads, so no single call's tail
# decides when a run ends.
MAX_LOAD_CALL_MS = 100_000


class PartFailed(RuntimeError):
    """A part could not be measured; the message is one line saying why, ``partial`` what was measured."""

    def __init__(self, message: str, partial: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.partial = partial or {}


# ---- machine, topics, workers ---------------------------------------------------------------------------
def topic_fields() -> list[str]:
    """Every topic setting (including any added later, e.g. checkpoints), so a part's topics are all fresh."""
    return [name for name in Settings.model_fields if name.startswith("topic_")]


@dataclass
class Group:
    """One part's fresh topics, consumer group and workers; logs and stores live under ``work``."""

    name: str
    work: Path
    overrides: dict[str, str]
    settings: Settings = field(init=False)
    topics: dict[str, str] = field(init=False)
    workers: list[WorkerProcess] = field(default_factory=list)
    admin: AdminClient = field(init=False)

    def __post_init__(self) -> None:
        prefix = f"bench.scale.{self.name}.{uuid.uuid4().hex[:6]}"
        self.topics = {t: f"{prefix}.{t.removeprefix('topic_')}" for t in topic_fields()}
        self.settings = Settings(**self.topics, worker_id=prefix)  # type: ignore[arg-type]
        ensure_topics(self.settings)
        self.admin = admin_client(self.settings, ClientErrors(self.settings))

    @property
    def group_id(self) -> str:
        return self.settings.worker_id

    def start_worker(self, label: str, cpus: str = "", store: str | None = None) -> WorkerProcess:
        """Start a worker of this group; ``store`` names its embedded store folder (default: its label)."""
        port = free_port()
        chdb = (self.work / self.name / f"store-{store or label}").resolve()
        env = worker_env({**self.topics, "worker_id": self.group_id, "web_port": str(port),
                          "bootstrap_servers": self.settings.bootstrap, "clickhouse_url": f"chdb://{chdb}",
                          "model_watch_interval_s": "0", **self.overrides})
        worker = WorkerProcess(env, port, self.work / self.name / f"{label}.log", cpus=cpus)
        self.workers.append(worker)
        try:
            worker.start()
        except RuntimeError as exc:
            raise PartFailed(f"worker {label} did not start: {last_error(worker)}") from exc
        return worker

    def stop(self) -> None:
        for worker in self.workers:
            with suppress(Exception):
                worker.stop()

    def delete_topics(self) -> None:
        for future in self.admin.delete_topics(list(self.topics.values()), operation_timeout=30).values():
            with suppress(Exception):
                future.result()


def last_error(worker: WorkerProcess) -> str:
    """The line of the worker's log that says why it failed, for a one-line report: faust's crash reason
    or first ERROR line (what follows is mostly shutdown noise), else the last line naming an error."""
    lines = [ln.strip() for ln in worker.log_tail(400).splitlines() if ln.strip()]
    for marker in ("Crashed reason=", "[ERROR]", "[CRITICAL]"):
        first = next((ln for ln in lines if marker in ln), None)
        if first is not None:
            return f"{first[:300]} (log: {worker.log_path.relative_to(ROOT)})"
    errors = [ln for ln in lines if "rror" in ln or "Exception" in ln]
    text = (errors or lines or ["(empty log)"])[-1]
    return f"{text[:300]} (log: {worker.log_path.relative_to(ROOT)})"


def alive(worker: WorkerProcess, label: str) -> None:
    if worker.proc is None or worker.proc.poll() is not None:
        code = None if worker.proc is None else worker.proc.returncode
        raise PartFailed(f"worker {label} exited ({code}): {last_error(worker)}")


def metric(worker: WorkerProcess, label: str, name: str, **labels: str) -> float:
    alive(worker, label)
    try:
        return worker.metric(name, **labels)
    except OSError as exc:
        if worker.proc is not None:  # a crashed faust worker takes a few seconds to exit
            with suppress(subprocess.TimeoutExpired):
                worker.proc.wait(timeout=15)
        alive(worker, label)
        raise PartFailed(f"worker {label}'s /metrics did not answer ({exc}): {last_error(worker)}") from exc


def exports(worker: WorkerProcess, name: str) -> bool:
    return any(line.startswith(name) for line in worker.metrics_text().splitlines())


@contextmanager
def group_of(name: str, work: Path, overrides: dict[str, str]) -> Iterator[Group]:
    group = Group(name, work, overrides)
    try:
        yield group
    finally:
        group.stop()
        with suppress(Exception):
            group.delete_topics()


# ---- the consumer group, seen from Kafka ----------------------------------------------------------------
def assignment(group: Group) -> tuple[str, list[set[int]]]:
    """The group's state and each member's audio partitions (empty list while the group is unknown)."""
    return group_assignment(group.admin, group.group_id, group.settings.topic_audio)


def wait_for_members(group: Group, count: int, timeout_s: float = 120.0) -> list[set[int]]:
    """Wait until ``count`` members hold every audio partition between them, in a stable group."""
    def check() -> None:
        for i, worker in enumerate(group.workers):
            alive(worker, f"#{i}")

    try:
        return members_settled(group.admin, group.group_id, group.settings.topic_audio,
                               group.settings.audio_partitions, count, timeout_s, check)
    except GroupNotStableError as exc:
        raise PartFailed(str(exc)) from exc


# ---- calls: ids on chosen partitions, replay with a live tail ------------------------------------------
def partition_of(call_id: str, partitions: int) -> int:
    # librdkafka's default partitioner (consistent_random): CRC-32 of the key modulo the partition count.
    return zlib.crc32(call_id.encode()) % partitions


def call_id_on(partition: int, partitions: int, stem: str) -> str:
    for salt in range(100_000):
        call_id = f"{stem}-{salt}"
        if partition_of(call_id, partitions) == partition:
            return call_id
    raise AssertionError("unreachable: CRC-32 spreads over any partition count")


def library(max_ms: int = MAX_LOAD_CALL_MS) -> list[CallRecording]:
    """The library calls up to ``max_ms`` long, holds honoured (no frames there), in manifest order."""
    manifest = load_manifest()
    recordings = []
    for call in manifest["calls"]:
        if call["duration_ms"] <= max_ms:
            rec = load_recording(LIBRARY_DIR / call["file"], OPTIONS)
            rec.holds_ms = holds_of(call)
            recordings.append(rec)
    return recordings


def audio_s(rec: CallRecording) -> float:
    frame = rec.sample_rate * OPTIONS.frame_ms // 1000
    return max(rec.frame_count(leg, frame) for leg in rec.legs) * OPTIONS.frame_ms / 1000


def balanced_calls(recordings: list[CallRecording], n_calls: int, members: list[set[int]], partitions: int,
                   stem: str) -> list[tuple[str, CallRecording]]:
    """N calls (the library in turn), each on a partition of the member with the least audio so far (largest
    calls first), round robin over that member's partitions: every member gets the same share of the load."""
    load = [recordings[i % len(recordings)] for i in range(n_calls)]
    order = sorted(range(n_calls), key=lambda i: -audio_s(load[i]))
    owned = [sorted(m) for m in members]
    given = [0.0] * len(members)
    taken = [0] * len(members)
    calls: list[tuple[str, CallRecording]] = [("", load[0])] * n_calls
    for i in order:
        m = given.index(min(given))
        partition = owned[m][taken[m] % len(owned[m])]
        calls[i] = (call_id_on(partition, partitions, f"{stem}-{i:04d}"), load[i])
        given[m] += audio_s(load[i])
        taken[m] += 1
    return calls


@dataclass
class LiveClock:
    """When a replay began sending at the pace of real time (set once it does), and from which call time."""

    from_s: float
    started_at: float | None = None

    def call_time(self) -> float | None:
        return None if self.started_at is None else self.from_s + time.monotonic() - self.started_at


def replay(settings: Settings, calls: list[tuple[str, CallRecording]], live_from_s: float | None,
           clock: LiveClock | None = None, stop: threading.Event | None = None) -> ReplayReport:
    """Send the calls with the ids given: everything before ``live_from_s`` of the calls' time as fast as
    possible, the rest in real time (None: all fast; 0: all in real time); ``stop`` aborts the calls."""
    player = TelephonyReplay(ContractProducer.from_settings(settings, Serde.from_settings()),
                             settings.topic_audio, settings.topic_call_events)

    def went_live(at: float) -> None:
        if clock is not None:
            clock.started_at = at

    return player.run([rec for _, rec in calls], replace(OPTIONS, calls=len(calls)),
                      call_ids=[call_id for call_id, _ in calls], live_from_s=live_from_s, on_live=went_live,
                      stop=stop)


class Background(threading.Thread):
    """Runs ``fn(stop)`` in a thread; ``check()`` re-raises its exception as a one-line PartFailed."""

    def __init__(self, name: str, fn: Callable[[threading.Event], Any]) -> None:
        super().__init__(name=name, daemon=True)
        self.fn = fn
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.fn(self.stop)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread by check()
            self.error = exc

    def check(self) -> None:
        if self.error is not None:
            raise PartFailed(f"{self.name} failed: {one_line(self.error)}") from self.error


@contextmanager
def background(name: str, fn: Callable[[threading.Event], Any]) -> Iterator[Background]:
    """A Background thread that is stopped (its calls aborted) when the block is left, whatever happened."""
    thread = Background(name, fn)
    thread.start()
    try:
        yield thread
    finally:
        thread.stop.set()
        thread.join(timeout=30)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


# ---- finished calls, over every worker's store ------------------------------------------------------------
IDS = "has(splitByChar(',', {ids:String}), call_id)"


@dataclass
class Finished:
    """Which store finished which call, and every final segment id each store holds for those calls."""

    by_worker: list[set[str]]
    segment_ids: list[set[str]]
    expected_segments: dict[str, int]

    def complete(self, call_ids: list[str]) -> bool:
        done = set().union(*self.by_worker)
        return all(c in done for c in call_ids) and self.all_segments() >= sum(self.expected_segments.values())

    def all_segments(self) -> int:
        return len(set().union(*self.segment_ids))

    def finished_more_than_once(self) -> int:
        return sum(1 for c in self.expected_segments if sum(c in w for w in self.by_worker) > 1)

    def segments_in_several_stores(self) -> int:
        seen: dict[str, int] = {}
        for ids in self.segment_ids:
            for s in ids:
                seen[s] = seen.get(s, 0) + 1
        return sum(1 for n in seen.values() if n > 1)


def finished(workers: list[WorkerProcess], call_ids: list[str]) -> Finished:
    ids = ",".join(call_ids)
    by_worker: list[set[str]] = []
    segment_ids: list[set[str]] = []
    expected: dict[str, int] = {}
    for i, worker in enumerate(workers):
        alive(worker, f"#{i}")
        rows = worker.query(f"SELECT call_id, segments FROM calls_deduped WHERE {IDS} AND end_reason != ''",
                            ids=ids)
        by_worker.append({r["call_id"] for r in rows})
        for r in rows:  # a call finished twice (after a handover) says its segment count each time
            expected[r["call_id"]] = max(expected.get(r["call_id"], 0), int(r["segments"]))
        segs = worker.query(f"SELECT call_id, segment_id FROM segments_deduped WHERE is_final = 1 AND {IDS}",
                            ids=ids)
        segment_ids.append({f"{r['call_id']}/{r['segment_id']}" for r in segs})
    return Finished(by_worker, segment_ids, expected)


def live_workers(group: Group) -> list[WorkerProcess]:
    return [w for w in group.workers if w.proc is not None and w.proc.poll() is None]


def wait_finished(group: Group, call_ids: list[str], timeout_s: float, what: str,
                  background: Background | None = None) -> Finished:
    deadline = time.monotonic() + timeout_s
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(what, total=len(call_ids))
        while time.monotonic() < deadline:
            if background is not None:
                background.check()
            state = finished(live_workers(group), call_ids)
            progress.update(task, completed=len(set().union(*state.by_worker)))
            if state.complete(call_ids):
                return state
            time.sleep(1.0)
    raise PartFailed(f"{what}: not all {len(call_ids)} calls finished in {timeout_s:.0f} s")


# ---- part 1: scale-out efficiency --------------------------------------------------------------------------
def throughput_run(work: Path, label: str, cores: list[str], recordings: list[CallRecording],
                   n_calls: int) -> dict[str, Any]:
    with group_of(label, work, {}) as group:
        for i, core in enumerate(cores):
            group.start_worker(f"worker{i}", cpus=core)
        members = wait_for_members(group, len(cores))
        calls = balanced_calls(recordings, n_calls, members, group.settings.audio_partitions, label)
        worker_cpu = [w.metric("process_cpu_seconds_total") for w in group.workers]  # start-up left out
        cpu_before = time.process_time()
        began = time.monotonic()
        report = replay(group.settings, calls, live_from_s=None)
        replay_cpu = time.process_time() - cpu_before
        state = wait_finished(group, report.call_ids, 300 + sum(audio_s(r) for _, r in calls), f"{label}: calls")
        wall = time.monotonic() - began
        seconds = {c: audio_s(r) for c, r in calls}
        total = sum(seconds.values())
        shares = [sum(seconds[c] for c in done) / total for done in state.by_worker]
        return {
            "workers": len(cores), "cores": cores, "calls": n_calls, "call_audio_s": round(total, 1),
            "wall_s": round(wall, 2), "call_audio_s_per_wall_s": round(total / wall, 2),
            "replay_s": round(report.elapsed_s, 2), "replay_cpu_s": round(replay_cpu, 2),
            "audio_share_per_worker": [round(s, 3) for s in shares],
            # CPU seconds each worker used during the run, and per wall second (1.0 = its core kept busy)
            "worker_cpu_s": [round(w.metric("process_cpu_seconds_total") - c, 1)
                             for w, c in zip(group.workers, worker_cpu, strict=True)],
            "worker_cpu_per_wall_s": [round((w.metric("process_cpu_seconds_total") - c) / wall, 2)
                                      for w, c in zip(group.workers, worker_cpu, strict=True)],
            "segments": state.all_segments(), "finished_more_than_once": state.finished_more_than_once(),
        }


def part_throughput(work: Path, n_calls: int) -> dict[str, Any]:
    if shutil.which("taskset") is None or (os.cpu_count() or 1) < 2:
        raise PartFailed("needs taskset and at least 2 cores to pin each worker to its own core")
    recordings = library()
    one = throughput_run(work, "one", ["0"], recordings, n_calls)
    console.print(f"  1 worker (core 0): {one['call_audio_s_per_wall_s']:.2f} call-audio s / s")
    two = throughput_run(work, "two", ["0", "1"], recordings, n_calls)
    console.print(f"  2 workers (cores 0, 1): {two['call_audio_s_per_wall_s']:.2f} call-audio s / s")
    ratio = two["call_audio_s_per_wall_s"] / one["call_audio_s_per_wall_s"]
    # The same ratio with each worker's CPU seconds in place of the wall time: what it would be if the
    # pinned cores were the workers' alone (here the broker, the replay and other processes run on them).
    by_cpu = one["worker_cpu_s"][0] / max(two["worker_cpu_s"])
    return {"one_worker": one, "two_workers": two, "ratio": round(ratio, 2), "ratio_by_worker_cpu": round(by_cpu, 2),
            "goal": ">= 1.8", "met": ratio >= 1.8}


# ---- part 2: rebalance pause -----------------------------------------------------------------------------
@dataclass
class PauseWatch:
    """Final-transcript counts of A and B and the group's state, sampled every POLL_S from B's join."""

    a: WorkerProcess
    b: WorkerProcess
    group: Group
    a_lag_at_join: float = 0.0
    samples: list[dict[str, Any]] = field(default_factory=list)
    stable_s: float | None = None
    a_resumed_s: float | None = None
    b_resumed_s: float | None = None
    a_at_stable: float = 0.0

    def sample(self, t: float) -> None:
        fa = metric(self.a, "A", FINAL_SEGMENTS, kind="final")
        fb = metric(self.b, "B", FINAL_SEGMENTS, kind="final")
        state, members = assignment(self.group)
        self.samples.append({"t_s": round(t, 2), "a_finals": int(fa), "b_finals": int(fb), "group": state,
                             "members": len(members)})
        if self.stable_s is None and state == "STABLE" and len(members) == 2:
            self.stable_s, self.a_at_stable = t, fa
        if self.stable_s is not None and self.a_resumed_s is None and fa > self.a_at_stable:
            self.a_resumed_s = t
        if self.b_resumed_s is None and fb > 0:
            self.b_resumed_s = t

    def done(self) -> bool:
        return self.a_resumed_s is not None and self.b_resumed_s is not None

    def longest_gap_a(self) -> float:
        """A's longest stretch without a new final, over the samples (the pause A saw)."""
        gap, last_t, last_n = 0.0, 0.0, -1.0
        for s in self.samples:
            if s["a_finals"] != last_n:
                gap, last_t, last_n = max(gap, s["t_s"] - last_t), s["t_s"], s["a_finals"]
        return max(gap, self.samples[-1]["t_s"] - last_t) if self.samples else 0.0


def part_rebalance(work: Path, n_calls: int, join_after_s: float) -> dict[str, Any]:
    """The join measured twice, side by side: calls kept across the rebalance (the default), then every
    call dropped on revocation as before (CALLQA_KEEP_CALLS_ON_REBALANCE=false); the figures of the first
    run, and for both the leg audio fed to segmenters beyond the calls' own (re-decoded)."""
    kept = join_once(work, n_calls, join_after_s, keep_calls=True)
    dropped = join_once(work, n_calls, join_after_s, keep_calls=False)
    return {**kept, "redecoded_per_rebalance_s": {"calls_kept": kept["redecoded_leg_audio_s"],
                                                  "every_call_dropped": dropped["redecoded_leg_audio_s"]},
            "calls_dropped_run": {k: dropped[k] for k in ("pause_s", "redecoded_leg_audio_s", "calls_kept",
                                                          "calls_dropped", "calls_finished_in_both_stores")}}


def join_once(work: Path, n_calls: int, join_after_s: float, keep_calls: bool) -> dict[str, Any]:
    # Not pinned: A alone must keep up with the live load. The longest library calls, so the load lasts.
    recordings = sorted(library(), key=audio_s, reverse=True)
    name = "rebalance" if keep_calls else "rebalance-drop"
    with group_of(name, work, {"keep_calls_on_rebalance": str(keep_calls).lower()}) as group:
        a = group.start_worker("A")
        wait_for_members(group, 1)
        partitions = group.settings.audio_partitions
        # Call i on partition i % partitions: one call per partition (the default), so both workers get
        # calls whatever the split, and each has finals often enough to time the pause to a second or so.
        calls = [(call_id_on(i % partitions, partitions, f"live-{i:04d}"), recordings[i % len(recordings)])
                 for i in range(n_calls)]
        with background("live replay", lambda stop: replay(group.settings, calls, 0.0, stop=stop)) as live:
            window = min(audio_s(r) for _, r in calls) - join_after_s
            watch = watch_join(group, a, live, join_after_s, window)
            members = assignment(group)[1]
            result: dict[str, Any] = {
                "live_calls": n_calls, "join_after_s": join_after_s,
                "live_calls_per_member": [sum(1 for c, _ in calls if partition_of(c, partitions) in m)
                                          for m in members],
                "a_lag_messages_at_join": watch.a_lag_at_join,
                "group_stable_after_join_s": rounded(watch.stable_s),
                "a_producing_after_s": rounded(watch.a_resumed_s), "b_producing_after_s": rounded(watch.b_resumed_s),
                "a_longest_gap_s": round(watch.longest_gap_a(), 2),
                "goal": "<= 10 s", "samples": watch.samples,
            }
            if watch.a_resumed_s is None or watch.b_resumed_s is None:
                raise PartFailed(f"both workers not producing finals while the calls lasted (A after "
                                 f"{watch.a_resumed_s} s, B after {watch.b_resumed_s} s)", result)
            pause = max(watch.a_resumed_s, watch.b_resumed_s)
            result.update(pause_s=round(pause, 2), met=pause <= 10.0)
            console.print(f"  both producing {pause:.1f} s after B joined; waiting for the live calls to end")
            state = wait_finished(group, [c for c, _ in calls], 300 + max(audio_s(r) for _, r in calls),
                                  "rebalance: live calls", background=live)
        # One join is one rebalance for A (B's first assignment drops nothing): what both fed their
        # segmenters beyond the calls' own leg audio was decoded again because of it.
        workers = live_workers(group)
        fed_s = sum(metric(w, label, LEG_AUDIO) for w, label in zip(workers, "AB", strict=False))
        calls_audio_s = sum(2 * audio_s(r) for _, r in calls)
        result.update(leg_audio_fed_s=round(fed_s, 1), calls_leg_audio_s=round(calls_audio_s, 1),
                      redecoded_leg_audio_s=round(fed_s - calls_audio_s, 1),
                      calls_kept=sum(metric(w, label, "callqa_calls_kept_on_rebalance_total")
                                     for w, label in zip(workers, "AB", strict=False)),
                      calls_dropped=sum(metric(w, label, "callqa_calls_dropped_on_revoke_total")
                                        for w, label in zip(workers, "AB", strict=False)))
        # After a handover a call may be in both stores: the new owner replays from its checkpoint.
        result.update(calls_finished=len(set().union(*state.by_worker)),
                      calls_finished_in_both_stores=state.finished_more_than_once(),
                      final_segments=state.all_segments(),
                      segments_in_both_stores=state.segments_in_several_stores())
        return result


def rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def watch_join(group: Group, a: WorkerProcess, live: Background, join_after_s: float,
               window_s: float) -> PauseWatch:
    """A under live load for ``join_after_s``, then B joins; samples until both produce or ``window_s``."""
    with console.status(f"  live calls on worker A; B joins after {join_after_s:.0f} s"):
        until = time.monotonic() + join_after_s
        while time.monotonic() < until:
            live.check()
            metric(a, "A", FINAL_SEGMENTS, kind="final")
            time.sleep(POLL_S)
        lag = metric(a, "A", "callqa_consumer_lag")  # A keeps up with the live load when this stays small
        b = group.start_worker("B")
        joined = time.monotonic()
        watch = PauseWatch(a, b, group, a_lag_at_join=lag)
        while not watch.done() and time.monotonic() - joined < window_s:
            live.check()
            watch.sample(time.monotonic() - joined)
            time.sleep(POLL_S)
    return watch


# ---- part 3: re-decoded audio after kill -9 ---------------------------------------------------------------
def long_call(seconds: float) -> CallRecording:
    """One call of ``seconds``: the library's calls back to back (holds included as silence, so every frame
    of both legs is sent and the call's audio is exactly its length)."""
    recordings = library(max_ms=10**9)
    legs: dict[str, list[np.ndarray]] = {"agent": [], "customer": []}
    want = int(seconds * TELEPHONY_RATE)
    length = 0
    while length < want:
        rec = recordings[len(legs["agent"]) % len(recordings)]
        for leg in legs:
            legs[leg].append(rec.legs[leg])
        length += len(rec.legs["agent"])
    joined = {leg: np.concatenate(parts)[:want] for leg, parts in legs.items()}
    rec = CallRecording(source=f"library looped to {seconds:.0f} s", legs=joined, sample_rate=TELEPHONY_RATE)
    rec.encode(OPTIONS.encoding)
    return rec


def checkpoint_interval(settings: Settings) -> tuple[str, float]:
    """The checkpoint interval setting and its value in seconds (0 when there is none)."""
    for name in Settings.model_fields:
        if "checkpoint" in name and "interval" in name:
            value = float(getattr(settings, name))
            return name, value / 1000 if name.endswith("_ms") else value
    return "", 0.0


@dataclass
class Fed:
    """Leg audio a worker fed to its segmenters (None: the metric is not exported) and consumed (frames)."""

    fed_s: float | None
    consumed_s: float


def fed(worker: WorkerProcess, label: str) -> Fed:
    consumed = metric(worker, label, "callqa_frames_total") * OPTIONS.frame_ms / 1000
    return Fed(metric(worker, label, LEG_AUDIO) if exports(worker, LEG_AUDIO) else None, consumed)


def part_crash(work: Path, call_s: float, live_tail_s: float, kill_before_end_s: float) -> dict[str, Any]:
    rec = long_call(call_s)
    n_legs = len(rec.legs)
    total = n_legs * audio_s(rec)
    kill_at = call_s - kill_before_end_s
    with group_of("crash", work, {}) as group:
        first = group.start_worker("first", store="shared")
        wait_for_members(group, 1)
        call_id = call_id_on(0, group.settings.audio_partitions, "long")
        clock = LiveClock(from_s=call_s - live_tail_s)
        def send(stop: threading.Event) -> ReplayReport:
            return replay(group.settings, [(call_id, rec)], clock.from_s, clock, stop)

        with background("long-call replay", send) as sender:
            with console.status(f"  a {call_s:.0f} s call: fast, then its last {live_tail_s:.0f} s live; "
                                f"kill -9 at {kill_at:.0f} s"):
                while (clock.call_time() or 0.0) < kill_at:
                    sender.check()
                    alive(first, "first")
                    time.sleep(0.1)
                before = fed(first, "first")
                first.kill9()
            behind = (clock.call_time() or 0.0) - before.consumed_s / n_legs
            console.print(f"  killed at call time {kill_at:.0f} s, {behind:.1f} s behind live; restarting")
            restarted = group.start_worker("restarted", store="shared")
            wait_finished(group, [call_id], 300 + live_tail_s + call_s, "crash: the long call", background=sender)
            after = fed(restarted, "restarted")
    settings = Settings()
    name, interval = checkpoint_interval(settings)
    bound = n_legs * (settings.max_segment_ms / 1000 + settings.commit_interval_s + interval)
    reconsumed = before.consumed_s + after.consumed_s - total
    result: dict[str, Any] = {
        "call_s": call_s, "legs": n_legs, "live_tail_s": live_tail_s, "killed_at_call_s": kill_at,
        "behind_live_at_kill_s": round(behind, 2), "leg_audio_s": round(total, 1),
        "fed_before_kill_s": before.fed_s, "fed_after_restart_s": after.fed_s,
        "consumed_before_kill_s": before.consumed_s, "consumed_after_restart_s": after.consumed_s,
        "reconsumed_s": round(reconsumed, 1), "bound_s": round(bound, 1),
        "bound": f"{n_legs} legs x (max_segment {settings.max_segment_ms / 1000:g} s + commit_interval_s "
                 f"{settings.commit_interval_s:g} s + {name or 'checkpoint interval (no setting)'} {interval:g} s)",
    }
    if before.fed_s is None or after.fed_s is None:
        raise PartFailed(f"the worker does not export {LEG_AUDIO}; frames consumed again: {reconsumed:.1f} s of "
                         f"leg audio (bound {bound:.1f} s)", result)
    redecoded = before.fed_s + after.fed_s - total
    result.update(redecoded_s=round(redecoded, 1), met=redecoded <= bound)
    return result


# ---- the run -----------------------------------------------------------------------------------------------
def run_part(name: str, fn: Callable[[], dict[str, Any]], work: Path) -> dict[str, Any]:
    console.print(f"[bold]{name}[/bold]")
    began = time.monotonic()
    try:
        result = {"status": "ok", **fn()}
    except Exception as exc:  # noqa: BLE001 - a failed part is reported, the others still run
        detail = str(exc) if isinstance(exc, PartFailed) else one_line(exc)
        console.print(f"  [red]failed[/red]: {detail}")
        partial = exc.partial if isinstance(exc, PartFailed) else {}
        result = {**partial, "status": "failed", "error": detail, "logs": str(work.relative_to(ROOT))}
    result["part_wall_s"] = round(time.monotonic() - began, 1)
    return result


@dataclass(frozen=True)
class ScaleOutOptions:
    calls: int = 0  # backlog calls of the throughput runs (0: 24, or 4 with quick)
    quick: bool = False  # small smoke sizes (minutes, figures not meaningful)
    live_calls: int = 12  # real-time calls under the rebalance, one per partition
    join_after_s: float = 20.0  # live load on A before B joins
    long_call_s: float = 600.0  # length of the call killed near its end
    live_tail_s: float = 120.0  # its last seconds, sent in real time
    kill_before_end_s: float = 20.0  # kill -9 this long before its end
    throughput: bool = True
    rebalance: bool = True
    crash: bool = True
    out: Path = RESULTS


def sizes(options: ScaleOutOptions) -> dict[str, Any]:
    if options.quick:
        return {"calls": options.calls or 4, "live_calls": options.live_calls, "join_after_s": 10.0,
                "call_s": 90.0, "live_tail_s": 40.0, "kill_before_end_s": 10.0}
    return {"calls": options.calls or 24, "live_calls": options.live_calls, "join_after_s": options.join_after_s,
            "call_s": options.long_call_s, "live_tail_s": options.live_tail_s,
            "kill_before_end_s": options.kill_before_end_s}


def summary_table(parts: dict[str, dict[str, Any]]) -> Table:
    table = Table("goal", "measured", "target", "status", title="callqa scale-out benchmark")
    table.columns[1].overflow = "fold"

    def row(title: str, part: dict[str, Any] | None, value: Callable[[dict[str, Any]], str], target: str) -> None:
        if part is None:
            table.add_row(title, "skipped", target, "")
        elif part["status"] != "ok":
            table.add_row(title, f"[red]{part['error']}[/red]", target, "[red]failed[/red]")
        else:
            status = "[green]met[/green]" if part["met"] else "[yellow]not met[/yellow]"
            table.add_row(title, value(part), target, status)

    row("scale-out: 2 workers / 1, one core each", parts.get("throughput"),
        lambda p: f"{p['ratio']:.2f}x ({p['one_worker']['call_audio_s_per_wall_s']:.2f} -> "
                  f"{p['two_workers']['call_audio_s_per_wall_s']:.2f} call-audio s / s); by the workers' CPU "
                  f"time {p['ratio_by_worker_cpu']:.2f}x (cores not shared)", ">= 1.8x")
    row("rebalance pause: join -> both producing", parts.get("rebalance"),
        lambda p: f"{p['pause_s']:.1f} s (group stable after {p['group_stable_after_join_s']} s, "
                  f"A's longest gap {p['a_longest_gap_s']:.1f} s)", "<= 10 s")
    row("leg audio re-decoded per rebalance (join)", parts.get("rebalance"),
        lambda p: f"{p['redecoded_per_rebalance_s']['calls_kept']:.1f} s with calls kept, "
                  f"{p['redecoded_per_rebalance_s']['every_call_dropped']:.1f} s with every call dropped",
        "kept < dropped")
    row("audio re-decoded after kill -9", parts.get("crash"),
        lambda p: f"{p['redecoded_s']:.1f} s of leg audio ({p['call_s']:.0f} s call, 2 legs)",
        f"<= {parts['crash']['bound_s']:.1f} s" if parts.get("crash", {}).get("bound_s") else "bound")
    return table


def run_scale_out(options: ScaleOutOptions) -> tuple[dict[str, Any], list[Path]]:
    size = sizes(options)
    stamp = utc_stamp()
    work = ROOT / ".callqa" / "bench" / f"scale-out-{stamp}"  # worker logs stay here; stores are removed
    notes = [f"{os.cpu_count()} cores: the replay producer and the Kafka broker are not pinned; they share the "
             "cores with the workers (pinned, one core each, in the throughput part only), so the 2-worker run "
             "competes with them on both cores"]
    console.print(f"[dim]{notes[0]}[/dim]")
    kafka = LocalKafka(Settings())
    started = kafka.start()
    parts: dict[str, dict[str, Any]] = {}
    try:
        if options.throughput:
            parts["throughput"] = run_part("throughput", lambda: part_throughput(work, size["calls"]), work)
        if options.rebalance:
            parts["rebalance"] = run_part("rebalance", lambda: part_rebalance(
                work, size["live_calls"], size["join_after_s"]), work)
        if options.crash:
            parts["crash"] = run_part("crash", lambda: part_crash(
                work, size["call_s"], size["live_tail_s"], size["kill_before_end_s"]), work)
    finally:
        if not started.already_running:
            kafka.stop()
        for store in work.glob("*/store-*"):
            shutil.rmtree(store, ignore_errors=True)
    console.print(summary_table(parts))
    doc = record("scale-out", settings_that_matter(Settings()), {
        "taskset": shutil.which("taskset") is not None, "quick": options.quick, "sizes": size, "notes": notes,
        "worker_logs": str(work.relative_to(ROOT)), "parts": parts,
    }, started=stamp)
    return doc, write_result("scale-out", doc, options.out)
