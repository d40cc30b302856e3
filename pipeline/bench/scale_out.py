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
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pipeline.bench.results import RESULTS, record, run_folder, settings_that_matter, utc_stamp, write_result
from pipeline.bench.sender import call_s, leg_audio_s, load_library, replay
from pipeline.bench.stores import GroupCalls, GroupStores
from pipeline.bench.workers import Background, BenchError, WorkerGroup, WorkerProcess, one_line, shared_broker
from pipeline.config import Settings
from pipeline.ingest.replay import TELEPHONY_RATE, CallRecording

console = Console()

POLL_S = 0.5
FINAL_SEGMENTS = "callqa_segments_total"  # label kind="final" (pipeline/worker/metrics.py)
LEG_AUDIO = "callqa_leg_audio_seconds_total"  # audio fed to the legs' segmenters


def group(name: str, work: Path, overrides: dict[str, str] | None = None) -> WorkerGroup:
    """One part's workers, on fresh topics and in a consumer group of their own."""
    return WorkerGroup.fresh(f"bench.scale.{name}.{uuid.uuid4().hex[:6]}", work / name, overrides)


# ---- calls on chosen partitions, and when they are done --------------------------------------------------
def partition_of(call_id: str, partitions: int) -> int:
    # librdkafka's default partitioner (consistent_random): CRC-32 of the key modulo the partition count.
    return zlib.crc32(call_id.encode()) % partitions


def call_id_on(partition: int, partitions: int, stem: str) -> str:
    for salt in range(100_000):
        call_id = f"{stem}-{salt}"
        if partition_of(call_id, partitions) == partition:
            return call_id
    raise AssertionError("unreachable: CRC-32 spreads over any partition count")


def balanced_calls(recordings: list[CallRecording], n_calls: int, members: list[set[int]], partitions: int,
                   stem: str) -> list[tuple[str, CallRecording]]:
    """N calls (the library in turn), each on a partition of the member with the least audio so far (largest
    calls first), round robin over that member's partitions: every member gets the same share of the load."""
    load = [recordings[i % len(recordings)] for i in range(n_calls)]
    order = sorted(range(n_calls), key=lambda i: -call_s(load[i]))
    owned = [sorted(m) for m in members]
    given = [0.0] * len(members)
    taken = [0] * len(members)
    calls: list[tuple[str, CallRecording]] = [("", load[0])] * n_calls
    for i in order:
        m = given.index(min(given))
        partition = owned[m][taken[m] % len(owned[m])]
        calls[i] = (call_id_on(partition, partitions, f"{stem}-{i:04d}"), load[i])
        given[m] += call_s(load[i])
        taken[m] += 1
    return calls


def wait_finished(workers: WorkerGroup, call_ids: list[str], timeout_s: float, what: str,
                  sender: Background | None = None) -> GroupCalls:
    """Every call finished in the stores of the group's live workers (a progress bar meanwhile); a failed
    sender or worker ends the wait with its one line."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(what, total=len(call_ids))

        def seen(calls: GroupCalls) -> None:
            if sender is not None:
                sender.check()
            progress.update(task, completed=len(calls.finished))

        try:
            return GroupStores(workers.alive()).wait_finished(call_ids, timeout_s, seen)
        except TimeoutError as exc:
            raise BenchError(f"{what}: {exc}") from exc


# ---- part 1: scale-out efficiency --------------------------------------------------------------------------
def throughput_run(work: Path, label: str, cores: list[str], recordings: list[CallRecording],
                   n_calls: int) -> dict[str, Any]:
    with group(label, work) as workers:
        for i, core in enumerate(cores):
            workers.start(f"worker{i}", cpus=core)
        members = workers.wait_members(len(cores))
        calls = balanced_calls(recordings, n_calls, members, workers.settings.audio_partitions, label)

        def cpu_s() -> list[float]:
            return [workers.metric(w, "process_cpu_seconds_total") for w in workers.workers]

        worker_cpu = cpu_s()  # start-up left out
        cpu_before = time.process_time()
        began = time.monotonic()
        report = replay(workers.settings, calls, live_from_s=None)
        replay_cpu = time.process_time() - cpu_before
        state = wait_finished(workers, report.call_ids, 300 + sum(call_s(r) for _, r in calls), f"{label}: calls")
        wall = time.monotonic() - began
        used = [after - before for after, before in zip(cpu_s(), worker_cpu, strict=True)]
        seconds = {c: call_s(r) for c, r in calls}
        total = sum(seconds.values())
        shares = [sum(seconds[c] for c, stores in state.finished_in.items() if i in stores) / total
                  for i in range(len(cores))]
        return {
            "workers": len(cores), "cores": cores, "calls": n_calls, "call_audio_s": round(total, 1),
            "wall_s": round(wall, 2), "call_audio_s_per_wall_s": round(total / wall, 2),
            "replay_s": round(report.elapsed_s, 2), "replay_cpu_s": round(replay_cpu, 2),
            "audio_share_per_worker": [round(s, 3) for s in shares],
            # CPU seconds each worker used during the run, and per wall second (1.0 = its core kept busy)
            "worker_cpu_s": [round(u, 1) for u in used], "worker_cpu_per_wall_s": [round(u / wall, 2) for u in used],
            "segments": sum(len(s) for s in state.segments.values()),
            "finished_more_than_once": sum(1 for stores in state.finished_in.values() if len(stores) > 1),
        }


def part_throughput(work: Path, n_calls: int) -> dict[str, Any]:
    if shutil.which("taskset") is None or (os.cpu_count() or 1) < 2:
        raise BenchError("needs taskset and at least 2 cores to pin each worker to its own core")
    recordings = load_library()
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
    workers: WorkerGroup
    a_lag_at_join: float = 0.0
    samples: list[dict[str, Any]] = field(default_factory=list)
    stable_s: float | None = None
    a_resumed_s: float | None = None
    b_resumed_s: float | None = None
    a_at_stable: float = 0.0

    def sample(self, t: float) -> None:
        fa, fb = (self.workers.metric(w, FINAL_SEGMENTS, kind="final") for w in (self.a, self.b))
        state, members = self.workers.assignment()
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
    recordings = sorted(load_library(), key=call_s, reverse=True)
    name = "rebalance" if keep_calls else "rebalance-drop"
    with group(name, work, {"keep_calls_on_rebalance": str(keep_calls).lower()}) as workers:
        a = workers.start("A")
        workers.wait_members(1)
        partitions = workers.settings.audio_partitions
        # Call i on partition i % partitions: one call per partition (the default), so both workers get
        # calls whatever the split, and each has finals often enough to time the pause to a second or so.
        calls = [(call_id_on(i % partitions, partitions, f"live-{i:04d}"), recordings[i % len(recordings)])
                 for i in range(n_calls)]
        with Background("live replay", lambda stop: replay(workers.settings, calls, 0.0, stop=stop)) as live:
            window = min(call_s(r) for _, r in calls) - join_after_s
            watch = watch_join(workers, a, live, join_after_s, window)
            members = workers.assignment()[1]
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
                raise BenchError(f"both workers not producing finals while the calls lasted (A after "
                                 f"{watch.a_resumed_s} s, B after {watch.b_resumed_s} s)", result)
            pause = max(watch.a_resumed_s, watch.b_resumed_s)
            result.update(pause_s=round(pause, 2), met=pause <= 10.0)
            console.print(f"  both producing {pause:.1f} s after B joined; waiting for the live calls to end")
            state = wait_finished(workers, [c for c, _ in calls], 300 + max(call_s(r) for _, r in calls),
                                  "rebalance: live calls", sender=live)

        # One join is one rebalance for A (B's first assignment drops nothing): what both fed their
        # segmenters beyond the calls' own leg audio was decoded again because of it.
        def total(name: str) -> float:
            return sum(workers.metric(w, name) for w in workers.alive())

        fed_s = total(LEG_AUDIO)
        calls_audio_s = sum(2 * call_s(r) for _, r in calls)
        # After a handover a call may be in both stores: the new owner replays from its checkpoint.
        result.update(leg_audio_fed_s=round(fed_s, 1), calls_leg_audio_s=round(calls_audio_s, 1),
                      redecoded_leg_audio_s=round(fed_s - calls_audio_s, 1),
                      calls_kept=total("callqa_calls_kept_on_rebalance_total"),
                      calls_dropped=total("callqa_calls_dropped_on_revoke_total"),
                      calls_finished=len(state.finished),
                      calls_finished_in_both_stores=sum(1 for s in state.finished_in.values() if len(s) > 1),
                      final_segments=len(state.copies), segments_in_both_stores=state.several_copies())
        return result


def rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def watch_join(workers: WorkerGroup, a: WorkerProcess, live: Background, join_after_s: float,
               window_s: float) -> PauseWatch:
    """A under live load for ``join_after_s``, then B joins; samples until both produce or ``window_s``."""
    with console.status(f"  live calls on worker A; B joins after {join_after_s:.0f} s"):
        until = time.monotonic() + join_after_s
        while time.monotonic() < until:
            live.check()
            workers.metric(a, FINAL_SEGMENTS, kind="final")
            time.sleep(POLL_S)
        lag = workers.metric(a, "callqa_consumer_lag")  # A keeps up with the live load when this stays small
        b = workers.start("B")
        joined = time.monotonic()
        watch = PauseWatch(a, b, workers, a_lag_at_join=lag)
        while not watch.done() and time.monotonic() - joined < window_s:
            live.check()
            watch.sample(time.monotonic() - joined)
            time.sleep(POLL_S)
    return watch


# ---- part 3: re-decoded audio after kill -9 ---------------------------------------------------------------
def long_call(seconds: float) -> CallRecording:
    """One call of ``seconds``: the library's calls back to back (holds included as silence, so every frame
    of both legs is sent and the call's audio is exactly its length)."""
    recordings = load_library(max_ms=10**9)
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
    rec.encode("mulaw")
    return rec


def fed(workers: WorkerGroup, worker: WorkerProcess) -> tuple[float, float]:
    """Leg audio a worker fed to its segmenters, and consumed (messages of the replay's span), in seconds."""
    message_s = workers.settings.audio_message_ms / 1000
    return workers.metric(worker, LEG_AUDIO), workers.metric(worker, "callqa_frames_total") * message_s


def part_crash(work: Path, call_s: float, live_tail_s: float, kill_before_end_s: float) -> dict[str, Any]:
    rec = long_call(call_s)
    n_legs = len(rec.legs)
    total = leg_audio_s(rec)
    kill_at = call_s - kill_before_end_s
    live_from = call_s - live_tail_s
    with group("crash", work) as workers:
        first = workers.start("first", store="shared")
        workers.wait_members(1)
        call_id = call_id_on(0, workers.settings.audio_partitions, "long")
        live_at: list[float] = []  # when the replay began sending in real time (monotonic)

        def call_time() -> float:
            return live_from + time.monotonic() - live_at[0] if live_at else 0.0

        def send(stop: threading.Event) -> None:
            replay(workers.settings, [(call_id, rec)], live_from, lambda: live_at.append(time.monotonic()), stop)

        with Background("long-call replay", send) as sender:
            with console.status(f"  a {call_s:.0f} s call: fast, then its last {live_tail_s:.0f} s live; "
                                f"kill -9 at {kill_at:.0f} s"):
                while call_time() < kill_at:
                    sender.check()
                    workers.check(first)
                    time.sleep(0.1)
                fed_before, consumed_before = fed(workers, first)
                first.kill9()
            behind = call_time() - consumed_before / n_legs
            console.print(f"  killed at call time {kill_at:.0f} s, {behind:.1f} s behind live; restarting")
            restarted = workers.start("restarted", store="shared")
            wait_finished(workers, [call_id], 300 + live_tail_s + call_s, "crash: the long call", sender=sender)
            fed_after, consumed_after = fed(workers, restarted)
    settings = Settings()
    interval = settings.checkpoint_interval_ms / 1000
    bound = n_legs * (settings.max_segment_ms / 1000 + settings.commit_interval_s + interval)
    redecoded = fed_before + fed_after - total
    return {
        "call_s": call_s, "legs": n_legs, "live_tail_s": live_tail_s, "killed_at_call_s": kill_at,
        "behind_live_at_kill_s": round(behind, 2), "leg_audio_s": round(total, 1),
        "fed_before_kill_s": fed_before, "fed_after_restart_s": fed_after,
        "consumed_before_kill_s": consumed_before, "consumed_after_restart_s": consumed_after,
        "reconsumed_s": round(consumed_before + consumed_after - total, 1), "bound_s": round(bound, 1),
        "bound": f"{n_legs} legs x (max_segment {settings.max_segment_ms / 1000:g} s + commit_interval_s "
                 f"{settings.commit_interval_s:g} s + checkpoint_interval_ms {interval:g} s)",
        "redecoded_s": round(redecoded, 1), "met": redecoded <= bound,
    }


# ---- the run -----------------------------------------------------------------------------------------------
def run_part(name: str, fn: Callable[[], dict[str, Any]], work: Path) -> dict[str, Any]:
    console.print(f"[bold]{name}[/bold]")
    began = time.monotonic()
    try:
        result = {"status": "ok", **fn()}
    except Exception as exc:  # noqa: BLE001 - a failed part is reported, the others still run
        detail = str(exc) if isinstance(exc, BenchError) else one_line(exc)
        console.print(f"  [red]failed[/red]: {detail}")
        partial = exc.partial if isinstance(exc, BenchError) else {}
        result = {**partial, "status": "failed", "error": detail, "logs": str(work)}
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


def run_scale_out(options: ScaleOutOptions) -> tuple[dict[str, Any], list[Path]]:
    size = sizes(options)
    stamp = utc_stamp()
    work = run_folder("scale-out", stamp)  # worker logs stay here; stores are removed
    notes = [f"{os.cpu_count()} cores: the replay producer and the Kafka broker are not pinned; they share the "
             "cores with the workers (pinned, one core each, in the throughput part only), so the 2-worker run "
             "competes with them on both cores"]
    console.print(f"[dim]{notes[0]}[/dim]")
    parts: dict[str, dict[str, Any]] = {}
    with shared_broker(console.print):
        if options.throughput:
            parts["throughput"] = run_part("throughput", lambda: part_throughput(work, size["calls"]), work)
        if options.rebalance:
            parts["rebalance"] = run_part("rebalance", lambda: part_rebalance(
                work, size["live_calls"], size["join_after_s"]), work)
        if options.crash:
            parts["crash"] = run_part("crash", lambda: part_crash(
                work, size["call_s"], size["live_tail_s"], size["kill_before_end_s"]), work)
    doc = record("scale-out", settings_that_matter(Settings()), {
        "taskset": shutil.which("taskset") is not None, "quick": options.quick, "sizes": size, "notes": notes,
        "worker_logs": str(work), "parts": parts,
    }, started=stamp)
    return doc, write_result("scale-out", doc, options.out)
