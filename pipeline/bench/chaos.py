"""`callqa bench chaos` and the chaos test (tests/worker/test_chaos.py): calls survive churn and outages.

One run, on a Kafka broker of its own (other ports, its own data folder under ``work``: the run restarts
it, which the broker shared by a test session must never be):

- ``workers`` worker processes of one consumer group, each with an embedded store of its own (as separate
  hosts have), all started through ``pipeline.bench.store_fault`` with the same fault file: "the store"
  refuses every insert while that file exists;
- live traffic: library calls without holds, each replayed in real time, a new one every
  ``call_every_s``, so calls are live at every fault;
- faults at the run times ``plan`` gives (from the first call's start): ``kill9`` (a worker killed with
  SIGKILL), ``sigterm`` (a worker stopped with SIGTERM), each on the worker holding the most active calls
  and restarted at once on its store; ``broker`` (the broker stopped with SIGTERM and started again);
  ``store`` (inserts refused for ``outage_s``; the plans put a worker fault inside the outage, so a
  rebalance meets a store that refuses writes). A worker that exits by itself is restarted as a
  supervisor would, and counted;
- at the end, every call finished in some store (or ``finish_timeout_s`` passed), checked against an
  independent reference, `callqa analyze` of the same recordings: each call's stored finals over all
  stores equal the offline segments (leg, bounds, text), each stored once; each call finished in exactly
  one store, its end reason "end", its QA (score, items, events, metrics) equal to the offline QA; no PII
  span of the library's manifest in any topic (the checkpoint topic included: its strings; its audio
  bytes cannot be searched for speech), any table of any store, or any worker log.

Figures: calls, faults, restarts; calls finished exactly once and finals equal to the offline analysis
(goal 100 % each); leg audio re-decoded (fed to segmenters over all worker lives minus the audio sent) per
worker fault, and the worker's own re-decoding metric if it exports one; the longest stall of live finals
(a final's production time minus the wall time its segment's end was sent: calls are replayed in real
time); the checkpoint topic after the run (records, bytes, live keys: latest value per key not a tombstone)
against the calls still open. Result: ``chaos``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from pipeline.analyze import analyze_recordings
from pipeline.asr.engine import Engine
from pipeline.bench import probes
from pipeline.bench.results import RESULTS, record, run_folder, settings_that_matter, utc_stamp, write_result
from pipeline.bench.sender import MAX_LOAD_CALL_MS, REPLAY, call_s, leg_audio_s, library_calls, replay
from pipeline.bench.stores import GroupCalls, GroupStores, QaVerdicts
from pipeline.bench.topics import checkpoint_figures, read_topic
from pipeline.bench.workers import WorkerGroup
from pipeline.broker.groups import group_members, wait_for_takeover
from pipeline.broker.local import LocalKafka, free_port
from pipeline.broker.peers import EVICTED
from pipeline.broker.security import ClientErrors, admin_client
from pipeline.broker.topics import ensure_topics
from pipeline.config import Settings
from pipeline.contracts import Serde
from pipeline.contracts.messages import CallCheckpoint, CallQA, LatencyMetric, QaAlert, TranscriptSegment
from pipeline.eval.call_library import (
    STORE_TABLES,
    TABLE_TEXT_COLUMNS,
    Leak,
    find_leaks,
    message_texts,
    string_values,
)
from pipeline.ingest.replay import CallRecording, load_recording
from pipeline.qa.call import QaConfig

FAULTS = ("kill9", "sigterm", "broker", "store")
# The chaos test's plan (run time s, fault), for ~8 calls started 8 s apart (live from 0 to ~2 minutes):
# a kill -9, the store refusing writes from 35 s to 55 s with a SIGTERM (and its rebalances) inside it, the
# broker restarted, and a last kill -9 while the last calls are live.
TEST_PLAN: tuple[tuple[float, str], ...] = ((15.0, "kill9"), (35.0, "store"), (45.0, "sigterm"),
                                            (70.0, "broker"), (95.0, "kill9"))
LEG_AUDIO = "callqa_leg_audio_seconds_total"  # audio fed to the legs' segmenters
ACTIVE_CALLS = "callqa_active_calls"
# How long a worker fault waits for a fresh reading of a busy worker to hit.
VICTIM_WAIT_S = 30.0
STORE_RETRIES = "callqa_store_retries"
PEERS_WATCHED = "callqa_peers_watched"
ASSIGNMENTS = "callqa_rebalances_total"
# How long a kill -9 waits for a group its peers can evict from (see ``Faults._evictable``).
EVICTABLE_WAIT_S = 30.0
# A store outage lasts its planned time and until every worker alive at its start has had an insert refused
# (so it reached the sink of each), at most this many times its planned time.
OUTAGE_MAX_FACTOR = 5.0
REDECODED = re.compile(r"callqa_\w*re_?decod\w*")  # the worker's own re-decoding counter, if it has one
MAX_CALL_MS = MAX_LOAD_CALL_MS  # the longest library call replayed by default
IDS = "has(splitByChar(',', {ids:String}), call_id)"


@dataclass(frozen=True)
class ChaosOptions:
    work: Path  # broker data, worker logs and stores
    calls: int = 8
    call_names: tuple[str, ...] = ()  # library call ids to cycle through (default: every call without holds)
    workers: int = 3
    call_every_s: float = 8.0
    plan: tuple[tuple[float, str], ...] = TEST_PLAN  # (run time s, fault), in time order
    outage_s: float = 20.0
    finish_timeout_s: float = 300.0
    # The wait for the calls ends this long after the run began (None: only finish_timeout_s bounds it), so the
    # run's account is written inside a caller's own timeout: a replay stuck delivering (300 s) once kept the
    # wait from starting and pytest's 600 s ended the run with no account.
    budget_s: float | None = None
    overrides: dict[str, str] = field(default_factory=dict)  # more worker settings (keys without CALLQA_)
    say: Callable[[str], None] = print

    def __post_init__(self) -> None:
        unknown = [f for _, f in self.plan if f not in FAULTS]
        if unknown or self.calls < 1 or self.workers < 2:
            raise ValueError(f"faults are {', '.join(FAULTS)} (got {unknown}); calls >= 1, workers >= 2")


# ---- the run's broker, workers and traffic ----------------------------------------------------------------
def private_broker(folder: Path) -> LocalKafka:
    """A broker on free ports with its own data folder, on the jars the shared broker resolved."""
    settings = Settings(state_dir=folder, kafka_port=free_port(), kafka_controller_port=free_port(),
                        bootstrap_servers="", kafka_local_listener="PLAINTEXT",
                        kafka_security_protocol="PLAINTEXT")
    kafka = LocalKafka(settings)
    shared = LocalKafka(Settings())
    shared.install()
    kafka.libs.parent.mkdir(parents=True, exist_ok=True)
    if not kafka.libs.exists():
        os.symlink(shared.libs.resolve(), kafka.libs)
    return kafka


@dataclass
class Life:
    """One worker process from its start to its end: how it ended and its last metrics (sums by name)."""

    slot: int
    pid: int
    started_s: float
    ended_s: float | None = None
    ended_by: str = ""
    metrics: dict[str, float] = field(default_factory=dict)


class Workers:
    """The group's worker slots, each restarted in place (same store and log) after a fault or an exit, and
    every life of each: when it started and ended, how, and its last metrics."""

    def __init__(self, settings: Settings, work: Path, overrides: dict[str, str], say: Callable[[str], None]) -> None:
        self.began = time.monotonic()
        self.began_wall_ms = time.time() * 1000  # the same moment on the clock Kafka timestamps use
        self.say = say
        self.fault_file = work / "store-refuses-writes"
        # A refused insert is retried after at most 5 s, not 30 s: the run ends sooner after the outage.
        self.group = WorkerGroup(settings, work, {"commit_interval_s": "1.0", "store_retry_backoff_max_s": "5",
                                                  **overrides}, fault_file=self.fault_file, keep_stores=True)
        self.slots = self.group.workers
        self.lives: list[Life] = []
        self.unplanned: list[str] = []
        self.stopping: set[int] = set()  # slots being stopped (SIGTERM) in the background: not exited by themselves

    def now(self) -> float:
        return round(time.monotonic() - self.began, 1)

    def start(self, slot: int) -> None:
        """Start a slot's worker and wait until it serves (the run's first workers)."""
        if slot < len(self.slots):
            self.group.restart(self.slots[slot], timeout_s=300)
        else:
            self.group.start(f"worker{slot}", timeout_s=300)
        self.lives.append(Life(slot, self.slots[slot].pid, self.now()))

    def restart_soon(self, slot: int) -> None:
        """Restart a slot's worker without waiting for it to serve, as systemd would: the run's clock and
        its next faults go on meanwhile (a restart that blocked the loop for 35 s on a busy machine put the
        store outage and the SIGTERM planned 6 s apart at one moment). One that exits at start is seen by
        ``supervise`` and started again."""
        worker = self.slots[slot]
        worker.new_web_port()
        worker.spawn()
        self.lives.append(Life(slot, worker.pid, self.now()))

    def store_retries(self, slot: int) -> tuple[int, float] | None:
        """(pid, inserts the store refused and were retried so far) of a live slot's worker, None if dead."""
        worker = self.slots[slot]
        if not worker.alive():
            return None
        return worker.pid, self.life(slot).metrics.get(STORE_RETRIES, 0.0)

    def life(self, slot: int) -> Life:
        return next(x for x in reversed(self.lives) if x.slot == slot)

    def poll(self, slot: int) -> bool:
        """Keep the slot's last metrics (a busy worker may not answer: the last page read stays); whether
        they were read now."""
        worker = self.slots[slot]
        if worker.alive():
            with suppress(OSError):
                self.life(slot).metrics = probes.metric_sums(worker.metrics_text())
                return True
        return False

    def poll_all(self) -> set[int]:
        """Every slot's metrics; the slots read now."""
        return {slot for slot in range(len(self.slots)) if self.poll(slot)}

    def ended(self, slot: int, how: str) -> None:
        life = self.life(slot)
        life.ended_s, life.ended_by = self.now(), how

    def busiest(self, turn: int, read: set[int] | None = None) -> int:
        """The live worker with the most active calls (ties: in turn), so a fault costs real work; with
        ``read``, only those slots' figures count (the others' may be stale)."""
        def active(slot: int) -> float:
            serving = self.slots[slot].alive() and slot not in self.stopping and (read is None or slot in read)
            return self.life(slot).metrics.get(ACTIVE_CALLS, 0.0) if serving else -1.0

        n = len(self.slots)
        order = [(turn + k) % n for k in range(n)]
        return max(order, key=lambda s: (active(s), -order.index(s)))

    def busy_victim(self, turn: int, wait_s: float = VICTIM_WAIT_S) -> int:
        """The busiest worker by metrics read just now, waiting (bounded) while none reads busy. A worker that
        does not answer keeps its last page and one just restarted has none: chosen on those, a kill once hit
        a worker with no call (a fault that tests nothing). Past the bound, the busiest there is: the run's
        check then says the fault hit an idle worker."""
        deadline = time.monotonic() + wait_s
        while True:
            read = self.poll_all()
            slot = self.busiest(turn, read)
            if (slot in read and self.life(slot).metrics.get(ACTIVE_CALLS, 0.0) > 0) or time.monotonic() > deadline:
                return slot
            time.sleep(1.0)

    def supervise(self) -> None:
        """Restart a worker that exited by itself, as systemd or Docker would, and note why it exited."""
        for slot, worker in enumerate(self.slots):
            if worker.proc is not None and not worker.alive() and slot not in self.stopping:
                self.unplanned.append(f"{self.now():.0f} s: worker{slot} exited ({worker.exit_code}): {worker.why()}")
                self.say(f"  {self.now():6.1f} s  worker{slot} exited by itself ({worker.exit_code}): restarted")
                self.ended(slot, f"exited {worker.exit_code}")
                self.restart_soon(slot)

    def stop_all(self) -> None:
        self.poll_all()
        for slot, worker in enumerate(self.slots):
            if worker.alive():
                worker.stop()
                self.ended(slot, "end of run")


@dataclass
class Traffic:
    """The calls, each replayed in real time on a thread of its own, started ``every_s`` apart."""

    settings: Settings
    calls: list[tuple[str, CallRecording]]
    every_s: float
    live_wall_ms: dict[str, float] = field(default_factory=dict)  # call -> wall time its replay began sending
    errors: list[str] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    say: Callable[[str], None] = lambda _: None  # a replay's failure, said when it happens

    def start(self) -> threading.Thread:
        starter = threading.Thread(target=self._start_calls, name="chaos-traffic", daemon=True)
        starter.start()
        return starter

    def _start_calls(self) -> None:
        began = time.monotonic()
        for i, (call_id, rec) in enumerate(self.calls):
            time.sleep(max(0.0, began + i * self.every_s - time.monotonic()))
            thread = threading.Thread(target=self._replay, args=(call_id, rec), name=call_id, daemon=True)
            thread.start()
            self.threads.append(thread)

    def _replay(self, call_id: str, rec: CallRecording) -> None:
        def live() -> None:
            self.live_wall_ms[call_id] = time.time() * 1000

        try:
            replay(self.settings, [(call_id, rec)], 0.0, live)
        except Exception as exc:  # noqa: BLE001 - reported with the run's problems
            self.errors.append(f"replay of {call_id}: {type(exc).__name__}: {exc}")
            self.say(self.errors[-1])

    def done(self, starter: threading.Thread) -> bool:
        return not starter.is_alive() and not any(t.is_alive() for t in self.threads)


def chosen_calls(options: ChaosOptions) -> list[tuple[dict[str, Any], Path]]:
    """(manifest entry, file) of each call to replay, cycling through the chosen library calls (default:
    every call without holds, so every frame of the file is sent and `callqa analyze` of it is the reference)."""
    picked = library_calls(options.call_names, holds=False)
    return [picked[i % len(picked)] for i in range(options.calls)]


# ---- faults --------------------------------------------------------------------------------------------------
@dataclass
class Faults:
    kafka: LocalKafka
    workers: Workers
    outage_s: float
    done: list[dict[str, Any]] = field(default_factory=list)
    timers: list[threading.Thread] = field(default_factory=list)  # store outages under way
    measuring: list[threading.Thread] = field(default_factory=list)  # take-over times after kills

    def apply(self, kind: str, turn: int) -> None:
        at = self.workers.now()
        began = time.monotonic()
        entry: dict[str, Any] = {"at_s": at, "kind": kind}
        if kind in ("kill9", "sigterm"):
            group = self.workers.group
            admin: AdminClient | None = None
            if kind == "kill9":
                # A client of its own: the run's long-lived admin client timed out on every group
                # description after the broker restart (librdkafka 2.16), which left take-overs unmeasured.
                admin = admin_client(group.settings, ClientErrors(group.settings))
                entry["evictable"] = self._evictable(admin)
            slot = self.workers.busy_victim(turn)  # on fresh metrics: on the last poll's, a kill hit an idle worker
            worker = self.workers.slots[slot]
            entry.update(worker=slot, active_calls=self.workers.life(slot).metrics.get(ACTIVE_CALLS, 0.0))
            if admin is not None:  # a kill
                members: dict[str, set[int]] = {}
                for _ in range(20):  # the coordinator may not answer at once (after a broker restart)
                    state, members = group_members(admin, group.settings.worker_id, group.settings.topic_audio)
                    if members:
                        break
                    time.sleep(0.1)
                worker.kill9()
                entry["exit_code"] = worker.exit_code
                self._measure_takeover(entry, admin, set(members))
                self.workers.ended(slot, kind)
                self.workers.restart_soon(slot)
            else:
                self._stop_soon(slot, entry)
        elif kind == "broker":
            # A worker still stopping cleanly would lose its broker mid-stop (exit 1, seen): its stop ends first.
            while self.workers.stopping and time.monotonic() - began < 90:
                time.sleep(0.5)
            self.kafka.stop()
            entry["down_s"] = round(time.monotonic() - began, 1)
            self.kafka.start()
        else:
            self.workers.poll_all()
            before = {slot: r for slot in range(len(self.workers.slots)) if (r := self.workers.store_retries(slot))}
            self.workers.fault_file.write_text("the store refuses writes\n")
            timer = threading.Thread(target=self._hold_outage, args=(entry, before), name="chaos-outage", daemon=True)
            timer.start()  # daemon: a run that fails mid-outage must not wait for it to end
            self.timers.append(timer)
        entry["took_s"] = round(time.monotonic() - began, 1)
        victim = f" worker{entry['worker']}" if "worker" in entry else ""
        peers = "" if "evictable" not in entry else (
            ", peers watching" if entry["evictable"] else ", not evictable: left to its session")
        self.workers.say(f"  {at:6.1f} s  {kind}{victim} ({entry['took_s']:.0f} s{peers})")
        self.done.append(entry)

    def _stop_soon(self, slot: int, entry: dict[str, Any]) -> None:
        """SIGTERM a slot's worker and, in the background, wait for its exit and restart it: a clean stop
        during a store outage waits out the sink's close (38 s seen), and the faults after it keep their times."""
        worker = self.workers.slots[slot]
        self.workers.stopping.add(slot)
        began = time.monotonic()

        def stop() -> None:
            try:
                worker.stop(timeout_s=90)
                entry["exit_code"], entry["stop_s"] = worker.exit_code, round(time.monotonic() - began, 1)
                self.workers.ended(slot, "sigterm")
                self.workers.restart_soon(slot)
            finally:
                self.workers.stopping.discard(slot)

        thread = threading.Thread(target=stop, name="chaos-sigterm", daemon=True)
        thread.start()
        self.measuring.append(thread)

    def _evictable(self, admin: AdminClient) -> bool:
        """Wait (up to ``EVICTABLE_WAIT_S``) until a killed worker's peers can evict it: the group stable with
        every serving worker a member, and each watching all the others. A kill before that (a peer restarting,
        the coordinator still loading after a broker restart) is rightly left to the session timeout, and
        says nothing of eviction. Whether it came is recorded with the kill."""
        group = self.workers.group
        deadline = time.monotonic() + EVICTABLE_WAIT_S
        while True:
            self.workers.poll_all()
            # Serving: alive, not being stopped, and given partitions at least once (a restart still joining
            # is not waited for: the kill's peers are the members).
            live = [slot for slot, w in enumerate(self.workers.slots) if w.alive() and slot not in self.workers.stopping
                    and self.workers.life(slot).metrics.get(ASSIGNMENTS, 0.0) > 0]
            state, members = group_members(admin, group.settings.worker_id, group.settings.topic_audio)
            watching = [self.workers.life(slot).metrics.get(PEERS_WATCHED, 0.0) for slot in live]
            if state == "STABLE" and len(members) == len(live) and all(n >= len(live) - 1 for n in watching):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)

    def _measure_takeover(self, entry: dict[str, Any], admin: AdminClient, before: set[str]) -> None:
        """In the background (the killed worker restarts meanwhile): how long until the group, without the
        killed member, owns every partition again; ``entry["takeover_s"]`` (None: not within 120 s, or
        the group's members were not known at the kill)."""
        group = self.workers.group
        if not before:
            entry["takeover_s"] = None
            return

        def measure() -> None:
            took = wait_for_takeover(admin, group.settings.worker_id, group.settings.topic_audio,
                                     group.settings.audio_partitions, before)
            entry["takeover_s"] = None if took is None else round(took, 2)

        thread = threading.Thread(target=measure, name="chaos-takeover", daemon=True)
        thread.start()
        self.measuring.append(thread)

    def _hold_outage(self, entry: dict[str, Any], before: dict[int, tuple[int, float]]) -> None:
        """Keep the store refusing writes for ``outage_s`` and until each worker alive at its start had an
        insert refused (its retries rose), or it died; a fixed timer alone let an outage pass without any
        insert inside it when the plan put a SIGTERM and its rebalances there. ``entry["outage_s"]``: how
        long it lasted; ``entry["outage_reached"]``: the workers whose sink it reached."""
        began = time.monotonic()
        reached: set[int] = set()
        while True:
            waited = time.monotonic() - began
            gone = set()
            for slot, (pid, retries) in before.items():
                now = self.workers.store_retries(slot)
                if now is None or now[0] != pid:
                    gone.add(slot)  # killed or restarted since: a new life has no outage to see
                elif now[1] > retries:
                    reached.add(slot)
            if (waited >= self.outage_s and set(before) <= reached | gone) or waited >= self.outage_s * OUTAGE_MAX_FACTOR:
                break
            time.sleep(0.5)
        self.workers.fault_file.unlink(missing_ok=True)
        entry["outage_s"] = round(time.monotonic() - began, 1)
        entry["outage_reached"] = sorted(reached)
        self.workers.say(f"  {self.workers.now():6.1f} s  store writes back after {entry['outage_s']:.0f} s "
                         f"(refused inserts seen on workers {sorted(reached)})")

    def outage_over(self) -> bool:
        return not any(t.is_alive() for t in self.timers)


# ---- reading what the run left ------------------------------------------------------------------------------
@dataclass
class PiiScan:
    spans: dict[str, list[dict[str, Any]]]  # call id -> its manifest PII spans
    leaks: list[Leak] = field(default_factory=list)
    scanned: Counter[str] = field(default_factory=Counter)

    def every_span(self) -> list[dict[str, Any]]:
        return [{**s, "call": c} for c, spans in self.spans.items() for s in spans]

    def record(self, where: str, call: str, texts: list[tuple[str, str]], whole: str) -> None:
        self.leaks += find_leaks(call, self.spans.get(call, []), texts, in_text=True)
        self.leaks += find_leaks(call, self.every_span(), [(where, whole)], in_text=False)

    def topic(self, name: str, messages: list[Any], serde: Serde) -> None:
        for msg in messages:
            if msg.value() is None:
                continue
            self.scanned["messages"] += 1
            where = f"topic {name} offset {msg.partition()}:{msg.offset()}"
            key = (msg.key() or b"").decode(errors="replace")
            try:
                decoded = serde.decode_any(msg.value())
            except Exception:  # noqa: BLE001 - a record no contract reads: searched as text
                self.record(where, key, [], msg.value().decode("utf-8", errors="replace"))
                continue
            call = getattr(decoded, "call_id", "") or key
            self.record(where, call, [(f"{where} {p}", t) for p, t in message_texts(decoded)],
                        string_values(decoded))

    def table(self, store: int, name: str, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self.scanned["rows"] += 1
            texts = []
            for column in TABLE_TEXT_COLUMNS.get(name, []):
                value = row.get(column)
                texts += [(f"store{store} {name}.{column}", str(v))
                          for v in (value if isinstance(value, list) else [value]) if v is not None]
            # Ids and times are the pipeline's own: their digits joined could spell any number.
            own = {k: v for k, v in row.items() if k not in ("segment_id", "call_id") and not k.endswith("_at")}
            self.record(f"store{store} table {name} row", row["call_id"], texts, string_values(own))

    def log(self, path: Path) -> None:
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        self.scanned["log lines"] += len(lines)
        self.leaks += find_leaks("", self.every_span(), [(f"{path.name} line {i + 1}", ln)
                                                         for i, ln in enumerate(lines)], in_text=False)


def stall_figures(transcripts: list[TranscriptSegment], latencies: list[LatencyMetric],
                  live_wall_ms: dict[str, float]) -> dict[str, Any]:
    """How late live finals came: per segment, its first final's production time minus the wall time the
    end of its audio was sent (a real-time replay sends stream time t at the replay's start + t)."""
    first: dict[tuple[str, str], TranscriptSegment] = {}
    for t in transcripts:
        key = (t.call_id, t.segment_id)
        if t.is_final and (key not in first or t.produced_at_ms < first[key].produced_at_ms):
            first[key] = t
    stalls = sorted(((t.produced_at_ms - (live_wall_ms[t.call_id] + t.end_ms)) / 1000, t.call_id, t.segment_id,
                     t.produced_at_ms) for t in first.values() if t.call_id in live_wall_ms)
    e2e: dict[tuple[str, str], float] = {}
    for m in latencies:
        key = (m.call_id, m.segment_id)
        e2e[key] = min(e2e.get(key, float("inf")), m.end_to_end_ms)
    out: dict[str, Any] = {"finals": len(stalls)}
    if stalls:
        worst = stalls[-1]
        out.update(max_s=round(worst[0], 2), p50_s=round(stalls[len(stalls) // 2][0], 2),
                   p99_s=round(stalls[min(len(stalls) - 1, int(0.99 * len(stalls)))][0], 2),
                   worst_segment=worst[2], worst_produced_at_ms=worst[3])
    if e2e:
        out["latency_topic_max_end_to_end_s"] = round(max(e2e.values()) / 1000, 2)
    return out


# ---- the run ---------------------------------------------------------------------------------------------------
@dataclass
class ChaosResult:
    """What one run did and found; ``problems()`` lists each way it fell short of the goals."""

    call_ids: list[str]
    faults: list[dict[str, Any]]
    unplanned_exits: list[str]
    lives: list[Life]
    replay_errors: list[str]
    unfinished: list[str]
    finished_in: dict[str, int]  # call -> stores holding a finished row of it
    end_reasons: dict[str, list[str]]
    qa_results_at: dict[str, list[float]]  # call -> run time (s) of each CallQA result on the QA topic
    call_end_s: dict[str, float]  # call -> run time its end event was due
    differences: list[str]  # stored finals against the offline analysis
    verdict_differences: list[str]
    leaks: list[Leak]
    scanned: dict[str, int]
    fault_log_lines: int  # worker log lines saying the store refused an insert (the outage happened)
    broker_refusals_logged: int  # worker log lines saying the broker refused a connection (its restart was seen)
    evictions_logged: int  # worker log lines saying a peer died and was evicted (pipeline/broker/peers.py)
    checkpoints: dict[str, Any]
    stalls: dict[str, Any]
    sent_leg_audio_s: float
    moved_calls: int  # calls whose finals are in more than one store (handed over mid-call)
    duplicates: list[str] = field(default_factory=list)  # outputs a read_committed consumer saw twice
    wall_s: float = 0.0

    def problems(self) -> list[str]:
        out = [*self.replay_errors]
        out += [f"{c}: not finished in any store" for c in self.unfinished]
        out += [f"{c}: finished in {n} stores" for c, n in self.finished_in.items() if n > 1]
        out += [f"{c}: no QA result on the QA topic" for c in self.call_ids if not self.qa_results_at.get(c)]
        out += [f"{c}: end reasons {r}" for c, r in self.end_reasons.items() if set(r) != {"end"}]
        out += self.differences + self.verdict_differences + self.duplicates
        out += [f"PII {x.kind} of {x.call} ({x.needle}) in {x.where}: {x.excerpt!r}" for x in self.leaks]
        return out

    def counts(self) -> dict[str, int]:
        kinds = Counter(f["kind"] for f in self.faults)
        return {"kills": kinds["kill9"], "sigterms": kinds["sigterm"], "broker_restarts": kinds["broker"],
                "outages": kinds["store"], "restarts": kinds["kill9"] + kinds["sigterm"] + len(self.unplanned_exits),
                "unplanned_exits": len(self.unplanned_exits)}

    def figures(self) -> dict[str, Any]:
        n = len(self.call_ids)
        bad_finals = {d.split(":")[0] for d in self.differences}
        bad_verdicts = {d.split(":")[0] for d in self.verdict_differences}
        once = sum(1 for c in self.call_ids if self.finished_in.get(c) == 1 and len(self.qa_results_at[c]) == 1)
        twice = [{"call": c, "qa_results_at_s": at, "call_end_s": self.call_end_s.get(c),
                  "faults_near": [f"{f['kind']} at {f['at_s']} s" for f in self.faults
                                  if any(abs(f["at_s"] - t) < 30 for t in at)]}
                 for c, at in self.qa_results_at.items() if len(at) > 1]
        metrics = [life.metrics for life in self.lives]
        fed = sum(m.get(LEG_AUDIO, 0.0) for m in metrics)
        worker_faults = self.counts()["restarts"]
        redecoded = fed - self.sent_leg_audio_s
        own = sorted({name for m in metrics for name in m if REDECODED.fullmatch(name)})
        return {
            "calls": n, **self.counts(), "faults": self.faults, "unplanned": self.unplanned_exits,
            # Once: one store holds its finished row and the QA topic one result (a worker restarted on
            # its own store would hide a second finish from the stores; not from the topic).
            "finished_exactly_once_pct": round(100 * once / n, 1),
            "finished_in_one_store_pct": round(100 * sum(1 for v in self.finished_in.values() if v == 1) / n, 1),
            "qa_result_more_than_once": twice,
            "finals_equal_offline_pct": round(100 * (n - len(bad_finals)) / n, 1),
            "verdicts_equal_offline_pct": round(100 * (n - len(bad_verdicts)) / n, 1),
            "calls_moved_between_workers": self.moved_calls,
            # After each kill -9: until the group, without the killed member, owned every partition again.
            "takeover_s": [f.get("takeover_s") for f in self.faults if f["kind"] == "kill9"],
            "peer_evictions_logged": self.evictions_logged,
            "duplicate_outputs": len(self.duplicates),
            "pii_leaks": len(self.leaks), "pii_scanned": self.scanned, "store_refusals_logged": self.fault_log_lines,
            "leg_audio_sent_s": round(self.sent_leg_audio_s, 1), "leg_audio_fed_s": round(fed, 1),
            "redecoded_s": round(redecoded, 1),
            "redecoded_per_worker_fault_s": round(redecoded / worker_faults, 1) if worker_faults else None,
            "redecoded_by_worker_metric_s": {name: round(sum(m.get(name, 0.0) for m in metrics), 1) for name in own},
            "assignments_received": sum(m.get("callqa_rebalances_total", 0.0) for m in metrics),
            "calls_resumed": sum(m.get("callqa_calls_resumed_total", 0.0) for m in metrics),
            "stall": self.stalls, "checkpoint_topic": self.checkpoints, "open_calls_at_end": len(self.unfinished),
            # Per life, what its frames became beside decoding: a take-over that lost audio shows as gap frames
            # (filled with silence) or frames dropped (before a checkpoint, late, after the call's end).
            "worker_lives": [dataclasses.asdict(life) | {"metrics": None} | {
                k: life.metrics.get(f"callqa_{k}_total") for k in ("gap_frames", "frames_dropped", "calls_resumed")}
                for life in self.lives],
            "problems": self.problems()[:50], "wall_s": self.wall_s,
        }


def run_chaos(options: ChaosOptions) -> ChaosResult:
    say = options.say
    options.work.mkdir(parents=True, exist_ok=True)
    kafka = private_broker(options.work / "broker")
    began_run = time.monotonic()
    say(f"private broker on 127.0.0.1:{kafka.settings.kafka_port} ({options.work})")
    kafka.start()
    settings = Settings(bootstrap_servers=kafka.settings.bootstrap, worker_id=f"chaos-{uuid.uuid4().hex[:6]}",
                        kafka_security_protocol="PLAINTEXT")
    workers: Workers | None = None
    try:
        ensure_topics(settings)
        picked = chosen_calls(options)
        recordings = [load_recording(path, REPLAY) for _, path in picked]  # every frame sent, as analyze reads it
        call_ids = [f"{settings.worker_id}-{i:03d}" for i in range(len(picked))]
        workers = Workers(settings, options.work, options.overrides, say)
        for slot in range(options.workers):
            workers.start(slot)
        say(f"{options.workers} workers up after {time.monotonic() - began_run:.0f} s; {len(call_ids)} calls, "
            f"one every {options.call_every_s:g} s; faults {', '.join(f'{k} at {t:g} s' for t, k in options.plan)}")
        traffic = Traffic(settings, list(zip(call_ids, recordings, strict=True)), options.call_every_s,
                          say=lambda line: say(f"  {workers.now():6.1f} s  {line}"))
        result = _churn(options, kafka, workers, traffic, settings, picked, recordings, call_ids,
                        None if options.budget_s is None else began_run + options.budget_s)
    finally:
        if workers is not None:
            with suppress(Exception):
                workers.stop_all()
        kafka.stop()
    result.wall_s = round(time.monotonic() - began_run, 1)
    return result


def broker_refusals(logs: list[str], port: int) -> int:
    """Worker log lines saying the broker on ``port`` refused a connection (aiokafka's words and librdkafka's);
    a peer's refused liveness port is another port."""
    where = f"127.0.0.1', {port})", f"127.0.0.1:{port}"
    return sum(1 for text in logs for line in text.splitlines()
               if ("Connect call failed" in line or "Connection refused" in line) and any(w in line for w in where))


def _churn(options: ChaosOptions, kafka: LocalKafka, workers: Workers, traffic: Traffic, settings: Settings,
           picked: list[tuple[dict[str, Any], Path]], recordings: list[CallRecording],
           call_ids: list[str], budget_ends: float | None = None) -> ChaosResult:
    say = options.say
    faults = Faults(kafka, workers, options.outage_s)
    workers.began, workers.began_wall_ms = time.monotonic(), time.time() * 1000  # run time 0: the first call starts
    starter = traffic.start()
    due = sorted(options.plan)
    stores = GroupStores(workers.slots)
    deadline: float | None = None
    calls: GroupCalls | None = None
    while True:
        workers.supervise()
        workers.poll_all()
        if due and workers.now() >= due[0][0]:
            faults.apply(due.pop(0)[1], len(faults.done))
            continue
        if budget_ends is not None and time.monotonic() > budget_ends:
            sending = [t.name for t in traffic.threads if t.is_alive()]
            traffic.errors += [f"replay of {name}: still sending or delivering when the run's budget ended"
                               for name in sending]
            say(f"  {workers.now():6.1f} s  the run's budget ({options.budget_s:.0f} s) is spent; replays still "
                f"running: {', '.join(sending) or 'none'}; faults not applied: {len(due)}")
            break
        if not due and faults.outage_over() and traffic.done(starter):
            deadline = deadline or time.monotonic() + options.finish_timeout_s
            with suppress(OSError, RuntimeError):
                calls = stores.read(call_ids)
                if not calls.unfinished(call_ids):
                    break
            if time.monotonic() > deadline:
                say(f"  not every call finished within {options.finish_timeout_s:.0f} s of the traffic's end")
                break
        time.sleep(1.0)
    say(f"  {workers.now():6.1f} s  traffic over, calls finished; reading what the run left")
    return _verdict(options, workers, traffic, settings, picked, recordings, call_ids, faults, stores)


def _wait_checkpoints_forgotten(settings: Settings, timeout_s: float = 30.0) -> list[Any]:
    """The checkpoint topic once no call holds a live key (finished records are deleted once committed past),
    or as it is after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        messages = read_topic(settings, settings.topic_checkpoints)
        if checkpoint_figures(messages)["live_keys"] == 0 or time.monotonic() > deadline:
            return messages
        time.sleep(2.0)


@dataclass(frozen=True)
class Offline:
    """The independent reference: `callqa analyze` of each call's recording."""

    finals: dict[str, list[tuple[str, int, int, str]]]  # call -> (leg, start_ms, end_ms, text) in time order
    qa: dict[str, QaVerdicts]


def offline_reference(call_ids: list[str], picked: list[tuple[dict[str, Any], Path]]) -> Offline:
    paths = [path for _, path in picked]
    distinct = sorted(set(paths))
    analyses = dict(zip(distinct, analyze_recordings(distinct, Engine.load(), QaConfig.from_settings(Settings())),
                        strict=True))
    return Offline({c: [(s.leg, s.start_ms, s.end_ms, s.text) for s in analyses[p].segments]
                    for c, p in zip(call_ids, paths, strict=True)},
                   {c: QaVerdicts.of_result(analyses[p].qa) for c, p in zip(call_ids, paths, strict=True)})


def verdict_problems(offline: Offline, stored: dict[str, list[QaVerdicts]],
                     on_topic: dict[str, list[CallQA]]) -> list[str]:
    """Where a call's QA differs from the offline QA: in any store holding it, in any result on the QA topic."""
    out = []
    for c, reference in offline.qa.items():
        for got in stored.get(c, []):
            out += [f"{c}: stored QA: {d}" for d in got.differences(reference)]
        for i, qa in enumerate(on_topic.get(c, [])):
            out += [f"{c}: QA result #{i + 1} on the topic: {d}" for d in QaVerdicts.of_result(qa).differences(reference)]
    return out



def _verdict(options: ChaosOptions, workers: Workers, traffic: Traffic, settings: Settings,
             picked: list[tuple[dict[str, Any], Path]], recordings: list[CallRecording], call_ids: list[str],
             faults: Faults, stores: GroupStores) -> ChaosResult:
    for thread in faults.measuring:  # take-over times and stops: the group settled long ago, or not within 120 s
        thread.join(timeout=120)
    checkpoint_messages = _wait_checkpoints_forgotten(settings)
    workers.poll_all()
    calls = stores.read(call_ids)
    stored_qa = stores.read_verdicts(call_ids)
    scan = PiiScan({c: m["pii"] for c, (m, _) in zip(call_ids, picked, strict=True)})
    for i, worker in enumerate(workers.slots):
        for table in STORE_TABLES:  # no FINAL: superseded rows are stored too until a merge folds them away
            scan.table(i, table, worker.store_rows(f"SELECT * FROM {table} WHERE {IDS}", ids=",".join(call_ids)))
    serde = Serde.from_settings()
    topics = {t: read_topic(settings, t) for t in (settings.topic_transcripts, settings.topic_latency,
                                                    settings.topic_qa, settings.topic_dead_letters)}
    topics[settings.topic_checkpoints] = checkpoint_messages
    workers.stop_all()
    for name, messages in topics.items():
        scan.topic(name, messages, serde)
    for worker in workers.slots:
        scan.log(worker.log_path)
    logs = [worker.log_text() for worker in workers.slots]  # read once for the counts below
    # (Kafka timestamp, message) of the outputs, in time order
    outputs = sorted(((m.timestamp()[1], serde.decode_any(m.value())) for t in (
        settings.topic_transcripts, settings.topic_latency, settings.topic_qa) for m in topics[t]
        if m.value() is not None), key=lambda x: x[0])
    on_topic: dict[str, list[CallQA]] = {}
    results_at: dict[str, list[float]] = {c: [] for c in call_ids}
    for at, message in outputs:
        if isinstance(message, CallQA) and message.call_id in results_at:
            on_topic.setdefault(message.call_id, []).append(message)
            results_at[message.call_id].append(round((at - workers.began_wall_ms) / 1000, 1))
    options.say("  offline analysis of the same recordings (callqa analyze)")
    offline = offline_reference(call_ids, picked)
    return ChaosResult(
        call_ids=call_ids, faults=faults.done, unplanned_exits=workers.unplanned, lives=workers.lives,
        replay_errors=traffic.errors, unfinished=calls.unfinished(call_ids),
        finished_in={c: len(calls.finished.get(c, [])) for c in call_ids},
        end_reasons={c: [r["end_reason"] for r in calls.finished.get(c, [])] for c in call_ids},
        qa_results_at=results_at,
        call_end_s={c: round((traffic.live_wall_ms[c] - workers.began_wall_ms) / 1000 + call_s(r), 1)
                    for c, r in zip(call_ids, recordings, strict=True) if c in traffic.live_wall_ms},
        differences=calls.differences(offline.finals), verdict_differences=verdict_problems(offline, stored_qa, on_topic),
        leaks=scan.leaks, scanned=dict(scan.scanned),
        fault_log_lines=sum(text.count("test fault:") for text in logs),
        broker_refusals_logged=broker_refusals(logs, int(settings.bootstrap_servers.rpartition(":")[2])),
        evictions_logged=sum(text.count(EVICTED) for text in logs),
        checkpoints={**checkpoint_figures(checkpoint_messages),
                     "records_decoded": sum(1 for m in checkpoint_messages if m.value() is not None
                                            and isinstance(_decode(serde, m.value()), CallCheckpoint))},
        stalls=stall_figures([m for _, m in outputs if isinstance(m, TranscriptSegment)],
                             [m for _, m in outputs if isinstance(m, LatencyMetric)], traffic.live_wall_ms),
        sent_leg_audio_s=sum(leg_audio_s(r) for r in recordings),
        moved_calls=sum(1 for c in call_ids if len(calls.stores_of.get(c, set())) > 1),
        duplicates=duplicate_outputs([m for _, m in outputs], set(call_ids)),
    )


def duplicate_outputs(messages: list[Any], call_ids: set[str]) -> list[str]:
    """Outputs of ``call_ids`` a read_committed consumer saw more than once: a final (per revision), its
    latency, a live alert, a call's QA result (per revision)."""
    def identity(m: Any) -> tuple[Any, ...] | None:
        if isinstance(m, TranscriptSegment) and m.is_final:
            return ("final", m.segment_id, m.revision)
        if isinstance(m, LatencyMetric):
            return ("latency", m.segment_id)
        if isinstance(m, QaAlert):
            return ("alert", m.call_id, m.rule, m.leg, m.kind, m.offset_ms)
        if isinstance(m, CallQA):
            return ("QA result", m.call_id, m.revision)
        return None

    seen = Counter(key for m in messages if getattr(m, "call_id", None) in call_ids
                   if (key := identity(m)) is not None)
    return [f"{key[1]}: {key[0]} {key[2:]} on its topic {n} times" for key, n in seen.items() if n > 1]


def _decode(serde: Serde, value: bytes) -> Any:
    try:
        return serde.decode_any(value)
    except Exception:  # noqa: BLE001 - an undecodable record is simply not a CallCheckpoint
        return None


# ---- `callqa bench chaos` ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchChaosOptions:
    duration_s: float = 240.0  # live traffic: calls start over this long
    calls: int = 16
    workers: int = 3
    fault_every_s: float = 30.0
    outage_s: float = 20.0
    keep: bool = False  # keep the stores and broker data (worker logs are always kept)
    out: Path = RESULTS


def bench_plan(duration_s: float, every_s: float, outage_s: float, first_s: float = 15.0) -> tuple[tuple[float, str], ...]:
    """A worker fault every ``every_s`` while calls start (kill -9 and SIGTERM in turn), the broker restarted
    half-way between the first and second, and the store's outage starting ``outage_s / 2`` before the third
    worker fault (the second in a short run), so that fault's rebalance comes while inserts are refused."""
    worker = [first_s + k * every_s for k in range(max(2, int((duration_s - first_s) // every_s) + 1))]
    plan = [(t, "kill9" if k % 2 == 0 else "sigterm") for k, t in enumerate(worker)]
    inside = worker[min(2, len(worker) - 1)]
    plan += [(worker[0] + every_s / 2, "broker"), (max(0.0, inside - outage_s / 2), "store")]
    return tuple(sorted(plan))


def run_bench_chaos(options: BenchChaosOptions, say: Callable[[str], None] = print) -> tuple[dict[str, Any], list[Path]]:
    stamp = utc_stamp()
    work = run_folder("chaos", stamp)
    plan = bench_plan(options.duration_s, options.fault_every_s, options.outage_s)
    chaos = ChaosOptions(work=work, calls=options.calls, workers=options.workers,
                         call_every_s=options.duration_s / options.calls, plan=plan, outage_s=options.outage_s,
                         finish_timeout_s=600.0, say=say)
    try:
        result = run_chaos(chaos)
    finally:
        if not options.keep:
            for folder in [*work.glob("store-*"), *work.glob("faust-*"), work / "broker"]:
                if folder.is_dir():
                    shutil.rmtree(folder, ignore_errors=True)
    figures = result.figures()
    doc = record("chaos", settings_that_matter(Settings()), {
        "options": {k: v for k, v in dataclasses.asdict(options).items() if k != "out"} | {"plan": list(plan)},
        "worker_logs": str(work), **figures,
    }, started=stamp)
    return doc, write_result("chaos", doc, options.out)

