"""The benchmarks' one way to run workers: `callqa worker` child processes, pinned, grouped, restarted.

``WorkerProcess`` is one worker: its own web port (``/metrics``, ``/api/query`` with the bearer token
``worker_env`` gives it), log file and embedded store (chdb admits one process per folder, so whoever
started it reads results through its API, or from the folder once it has stopped). ``WorkerGroup`` is a
consumer group of them on one set of topics, fresh ones for a run that must not share its load: started
(each pinned with taskset to the cores given), restarted in place after a fault, stopped, its topics
deleted. ``shared_broker`` is the broker they all use. Tests start their workers with the same classes.

A worker given a ``fault_file`` runs through ``pipeline.bench.store_fault``: its store refuses every insert
while that file exists, which is how the chaos benchmark takes a store away with no server to stop.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.bench import probes
from pipeline.broker.groups import GroupNotStableError, group_assignment, wait_for_members
from pipeline.broker.local import LocalKafka, free_port
from pipeline.broker.security import ClientErrors, KafkaUnavailableError, admin_client, cluster_metadata
from pipeline.broker.topics import drop_topics, ensure_topics
from pipeline.config import Settings
from pipeline.report import WorkerApiSource
from pipeline.worker.instance_lock import STANDBY_READY

TOPIC_FIELDS = tuple(name for name in Settings.model_fields if name.startswith("topic_"))
# Log lines that say why a worker stopped, most telling first: faust's crash reason, the health check's
# verdict, the first error (what follows an error is mostly shutdown noise).
WHY_MARKERS = ("Crashed reason=", "worker unhealthy", "[ERROR]", "[CRITICAL]")


class BenchError(RuntimeError):
    """A run (or a part of one) could not be measured; the message is one line saying why, and ``partial``
    holds what was measured before."""

    def __init__(self, message: str, partial: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.partial = partial or {}


def worker_env(overrides: Mapping[str, str]) -> dict[str, str]:
    """This process's environment with CALLQA_ settings overridden (keys without the prefix), and a
    random API token unless one is configured (this process's environment or ``overrides``)."""
    env = dict(os.environ)
    env.setdefault("CALLQA_API_TOKEN", secrets.token_urlsafe(32))
    env.update({f"CALLQA_{k.upper()}": str(v) for k, v in overrides.items()})
    return env


@dataclass
class WorkerProcess:
    env: dict[str, str] = field(repr=False)  # holds the API token
    web_port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    loglevel: str = "info"
    # CPU list for `taskset -c` (e.g. "0" or "0,1"); empty: not pinned. Benchmarks pin each worker to
    # its own cores to measure it apart from the scheduler's spreading.
    cpus: str = ""
    fault_file: Path | None = None  # the store refuses inserts while this file exists (store_fault.py)

    @property
    def label(self) -> str:
        return self.log_path.stem

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"worker {self.label} is not started"
        return self.proc.pid

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def api(self) -> WorkerApiSource:
        """A client of this worker's /api/query, with its token."""
        return WorkerApiSource(self.base_url, self.env.get("CALLQA_API_TOKEN", ""))

    def new_web_port(self) -> None:
        """Serve on another free port from the next start (a worker restarted elsewhere)."""
        self.web_port = free_port()
        self.env["CALLQA_WEB_PORT"] = str(self.web_port)

    def start(self, timeout_s: float = 120.0) -> None:
        """Start the worker and return once its web port answers; raises a one-line RuntimeError."""
        self._spawn()
        self._wait_web(time.monotonic() + timeout_s)

    def spawn(self) -> None:
        """Start the worker and return at once (``wait_serving`` waits for its web port)."""
        self._spawn()

    def wait_serving(self, timeout_s: float = 120.0) -> None:
        """Until the started worker's web port answers; raises a one-line RuntimeError."""
        self._wait_web(time.monotonic() + timeout_s)

    def hand_over(self, timeout_s: float = 120.0) -> tuple[int | None, float]:
        """Restart a static member by hand-over, as a rolling deployment with a standby does: its successor
        (same settings and instance id, a new web port) starts beside it and loads its model; once it stands
        by, this one gets SIGTERM, and the successor takes over when it exits (pipeline/worker/instance_lock.py).
        Returns the old process's exit status and the seconds from its SIGTERM to the successor serving."""
        assert self.proc is not None and self.env.get("CALLQA_WORKER_INSTANCE_ID"), "hand-over needs a static member"
        old, seen = self.proc, self.log_path.stat().st_size if self.log_path.exists() else 0
        self.new_web_port()
        self._spawn()
        deadline = time.monotonic() + timeout_s
        while STANDBY_READY not in self._log_since(seen):
            if old.poll() is not None:
                break  # the old one is gone already: its successor takes the instance at once
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.label}'s successor exited at start ({self.proc.returncode}): "
                                   f"{self.why()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker {self.label}'s successor did not stand by in {timeout_s:.0f} s: {self.why()}")
            time.sleep(0.1)
        began = time.monotonic()
        with suppress(ProcessLookupError):
            os.killpg(old.pid, signal.SIGTERM)
        try:
            old.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(old.pid, signal.SIGKILL)
            old.wait(timeout=30)
        self._wait_web(deadline)
        return old.returncode, time.monotonic() - began

    def _log_since(self, offset: int) -> str:
        with open(self.log_path, "rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")

    def _spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        entry = ["pipeline.bench.store_fault", str(self.fault_file)] if self.fault_file else ["pipeline.cli"]
        command = [sys.executable, "-m", *entry, "worker", "--loglevel", self.loglevel]
        if self.cpus:
            command = ["taskset", "-c", self.cpus, *command]  # taskset execs the worker: same pid
        self.proc = subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def _wait_web(self, deadline: float) -> None:
        assert self.proc is not None
        timeout_s = deadline - time.monotonic()
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.label} exited at start ({self.proc.returncode}): {self.why()}")
            try:
                self.metrics_text()
                return
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)  # a restart's pause is measured to the answer: a coarse poll would add to it
        raise RuntimeError(f"worker {self.label}'s web API did not come up in {timeout_s:.0f} s: {self.why()}")

    def kill9(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self, timeout_s: float = 60.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def alive(self) -> bool:
        """Started and not exited."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def exit_code(self) -> int | None:
        """The exit status once the process ended (negative: killed by that signal); None while it runs."""
        return None if self.proc is None else self.proc.poll()

    @property
    def group(self) -> str:
        """The consumer group (the faust app id) this worker joins."""
        return self.env.get("CALLQA_WORKER_ID", "callqa-worker")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def why(self) -> str:
        """The log line that says why the worker stopped or failed, and where its log is (``why_stopped``)."""
        return why_stopped(self.log_path)

    def metrics_text(self) -> str:
        return probes.fetch_metrics(self.web_port)

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a metric's samples whose labels include ``labels`` (0 when absent)."""
        return probes.metric(self.metrics_text(), name, **labels)

    def query(self, sql: str, **params: Any) -> list[dict[str, Any]]:
        return self.api().rows(sql, params)

    def store_rows(self, sql: str, **params: Any) -> list[dict[str, Any]]:
        """Rows of a read-only query on this worker's store: through its API while it runs, else
        straight from its embedded store folder in a child process (chdb opens one folder per process,
        and the caller may hold another). Values come back as the API gives them (JSON)."""
        if self.alive():
            return self.query(sql, **params)
        script = (
            "import json, sys\n"
            "from pipeline.config import get_settings\n"
            "from pipeline.report import StoreSource\n"
            "sql, params = json.load(sys.stdin)\n"
            "print(json.dumps(StoreSource(get_settings()).rows(sql, params), default=str))\n"
        )
        done = subprocess.run(  # noqa: S603 - our own interpreter and script
            [sys.executable, "-c", script], input=json.dumps([sql, params]).encode(), env=self.env,
            capture_output=True, timeout=120, check=False,
        )
        if done.returncode != 0:
            last = (done.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"reading the store of stopped worker {self.label} failed: {last}")
        rows: list[dict[str, Any]] = json.loads(done.stdout)
        return rows

    def wait_for_calls(self, call_ids: list[str], timeout_s: float = 180.0) -> list[dict[str, Any]]:
        """Wait until every call is finished in the store with all its segments; returns the call rows."""
        ids = ",".join(call_ids)
        deadline = time.monotonic() + timeout_s
        rows: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            rows = self.query(
                "SELECT call_id, end_reason, segments FROM calls_deduped "
                "WHERE has(splitByChar(',', {ids:String}), call_id) AND end_reason != ''", ids=ids,
            )
            if len(rows) == len(call_ids):
                # The call row can land before its segments (separate inserts): wait for those too.
                stored = self.query("SELECT count() AS n FROM segments_deduped WHERE is_final = 1 AND "
                                    "has(splitByChar(',', {ids:String}), call_id)", ids=ids)[0]["n"]
                if stored >= sum(int(r["segments"]) for r in rows):
                    return rows
            if not self.alive():
                raise RuntimeError(f"worker {self.label} died ({self.exit_code}): {self.why()}")
            time.sleep(0.5)
        raise TimeoutError(f"calls not finished in {timeout_s:.0f} s ({len(rows)}/{len(call_ids)}): {self.why()}")


def why_stopped(log_path: Path) -> str:
    """The line of a child process's log that says why it stopped or failed (faust's crash reason, the health
    check's verdict, the first error; else the last error or line), and where the log is: one line for a
    report, the log (kept) holds the rest."""
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    lines = [ln.strip() for ln in text.splitlines()[-400:] if ln.strip()]
    marked = next((ln for marker in WHY_MARKERS for ln in lines if marker in ln), None)
    errors = [ln for ln in lines if "rror" in ln or "Exception" in ln]
    return f"{(marked or (errors or lines or ['(empty log)'])[-1])[:300]} (log: {log_path})"


def topic_names(prefix: str) -> dict[str, str]:
    """Every topic setting (checkpoints included, and any added later) under ``prefix``: a run's own."""
    return {name: f"{prefix}.{name.removeprefix('topic_')}" for name in TOPIC_FIELDS}


class WorkerGroup:
    """Workers of one consumer group on one broker and set of topics (``settings``), each with its own
    store, log and faust folder under ``work`` (logs stay; stores and faust folders are removed when the
    group is left, unless ``keep_stores``). As a context manager: stopped on exit, its topics deleted when
    it made them (``fresh``)."""

    def __init__(self, settings: Settings, work: Path, overrides: Mapping[str, str] | None = None, *,
                 fault_file: Path | None = None, keep_stores: bool = False, own_topics: bool = False) -> None:
        self.settings, self.work, self.overrides = settings, work, dict(overrides or {})
        self.fault_file, self.keep_stores, self.own_topics = fault_file, keep_stores, own_topics
        self.workers: list[WorkerProcess] = []
        self.admin = admin_client(settings, ClientErrors(settings))

    @classmethod
    def fresh(cls, prefix: str, work: Path, overrides: Mapping[str, str] | None = None) -> WorkerGroup:
        """A group on topics of its own named ``prefix.*`` (created now), its consumer group ``prefix``."""
        settings = Settings(**topic_names(prefix), worker_id=prefix)  # type: ignore[arg-type]
        ensure_topics(settings)
        return cls(settings, work, overrides, own_topics=True)

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        for worker in self.workers:
            with suppress(Exception):
                worker.stop()
        if self.own_topics:
            with suppress(Exception):
                drop_topics(self.admin, self.settings.worker_id, timeout_s=30)
        if not self.keep_stores:
            for folder in [*self.work.glob("store-*"), *self.work.glob("faust-*")]:
                shutil.rmtree(folder, ignore_errors=True)

    def start(self, label: str, cpus: str = "", store: str | None = None, timeout_s: float = 120.0,
              overrides: Mapping[str, str] | None = None) -> WorkerProcess:
        """Start worker ``label`` pinned to ``cpus``; ``store`` names its store folder (default: its label,
        so two workers given one name share a store, as one host restarted does); ``overrides``: settings of
        this worker alone, over the group's."""
        s = self.settings
        env = worker_env({**{name: getattr(s, name) for name in TOPIC_FIELDS}, "worker_id": s.worker_id,
                          "bootstrap_servers": s.bootstrap, "kafka_security_protocol": s.kafka_security_protocol,
                          "clickhouse_url": f"chdb://{(self.work / f'store-{store or label}').resolve()}",
                          "model_watch_interval_s": "0",  # no hot reload in the middle of a measurement
                          **self.overrides, **(overrides or {})})
        env["FAUST_DATADIR"] = str((self.work / f"faust-{label}").resolve())  # not in the working folder
        worker = WorkerProcess(env, 0, self.work / f"{label}.log", cpus=cpus, fault_file=self.fault_file)
        self.workers.append(worker)
        self.restart(worker, timeout_s)
        return worker

    def start_pinned(self, count: int, cores: tuple[int, ...], timeout_s: float = 120.0,
                     overrides: Callable[[str], Mapping[str, str]] | None = None) -> list[WorkerProcess]:
        """``count`` workers w0, w1, ..., each pinned to its share of ``cores`` (``share_cores``) with its own
        settings (``overrides(label)``), once the group holds every audio partition between them (frames sent
        before would only queue up)."""
        for i, mine in enumerate(share_cores(cores, count)):
            self.start(f"w{i}", cpus=",".join(map(str, mine)), overrides=overrides(f"w{i}") if overrides else None)
        self.wait_members(count, timeout_s)
        return self.workers

    def restart(self, worker: WorkerProcess, timeout_s: float = 120.0) -> None:
        """(Re)start a worker of the group in place: its store, log and cores, on a new web port."""
        worker.new_web_port()
        try:
            worker.start(timeout_s)
        except RuntimeError as exc:
            raise BenchError(str(exc)) from exc

    def hand_over(self, worker: WorkerProcess, timeout_s: float = 120.0) -> tuple[int | None, float]:
        """Restart a static member by hand-over to a standby (``WorkerProcess.hand_over``)."""
        try:
            return worker.hand_over(timeout_s)
        except RuntimeError as exc:
            raise BenchError(str(exc)) from exc

    def alive(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.alive()]

    def check(self, *workers: WorkerProcess) -> None:
        """BenchError naming why, when one of ``workers`` (default: every worker started) has exited."""
        for worker in workers or tuple(self.workers):
            if not worker.alive():
                raise BenchError(f"worker {worker.label} exited ({worker.exit_code}): {worker.why()}")

    def metric(self, worker: WorkerProcess, name: str, **labels: str) -> float:
        """A worker's metric, or a BenchError saying why it cannot be read (the worker exited, or its
        /metrics did not answer)."""
        self.check(worker)
        try:
            return worker.metric(name, **labels)
        except OSError as exc:
            with suppress(subprocess.TimeoutExpired):  # a crashed faust worker takes a few seconds to exit
                worker.proc.wait(timeout=15)  # type: ignore[union-attr]
            self.check(worker)
            raise BenchError(f"worker {worker.label}'s /metrics did not answer ({exc}): {worker.why()}") from exc

    def assignment(self) -> tuple[str, list[set[int]]]:
        """The group's state and each member's audio partitions (empty while the group is unknown)."""
        return group_assignment(self.admin, self.settings.worker_id, self.settings.topic_audio)

    def wait_members(self, count: int, timeout_s: float = 120.0) -> list[set[int]]:
        """Until ``count`` members hold every audio partition between them in a stable group (frames sent
        before would only queue up); each member's partitions."""
        try:
            return wait_for_members(self.admin, self.settings.worker_id, self.settings.topic_audio,
                                    self.settings.audio_partitions, count, timeout_s, self.check)
        except GroupNotStableError as exc:
            raise BenchError(f"{exc} (logs: {self.work})") from exc


def share_cores(cores: tuple[int, ...], workers: int) -> list[tuple[int, ...]]:
    """Each worker's cores: fewer workers than cores split them (0,2 | 1,3); more share them round robin;
    none given, none pinned."""
    if not cores:
        return [()] * workers
    if workers <= len(cores):
        return [cores[i::workers] for i in range(workers)]
    return [(cores[i % len(cores)],) for i in range(workers)]


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


@contextmanager
def shared_broker(say: Callable[[str], None] = print) -> Iterator[Settings]:
    """The broker a benchmark's workers use. The local one (CALLQA_BOOTSTRAP_SERVERS empty) is started when
    none runs, and stopped again at the end if this started it; a broker named by CALLQA_BOOTSTRAP_SERVERS
    must be up already: when it does not answer, one line says so before anything else starts."""
    settings = Settings()
    if settings.bootstrap_servers:
        try:  # a refused login or TLS handshake raises its own one-line KafkaSecurityError
            cluster_metadata(admin_client(settings, errors := ClientErrors(settings)), errors, 15.0)
        except KafkaUnavailableError as exc:
            raise BenchError(f"no Kafka broker answers at {settings.bootstrap} (CALLQA_BOOTSTRAP_SERVERS): start "
                             "it, or unset CALLQA_BOOTSTRAP_SERVERS to use the local one") from exc
        yield settings
        return
    kafka = LocalKafka(settings)
    started = kafka.start()
    if not started.already_running:
        say(f"no Kafka broker was running: started the local one at {settings.bootstrap} for this run "
            f"(`callqa broker start` keeps one up)")
    try:
        yield settings
    finally:
        if not started.already_running:
            kafka.stop()


class Background(threading.Thread):
    """Runs ``fn(stop)`` in a thread; ``check()`` raises its exception in the caller's as a one-line
    BenchError. As a context manager it runs for the block and is stopped (``stop`` set) and joined on the
    way out, whatever happened."""

    def __init__(self, name: str, fn: Callable[[threading.Event], Any]) -> None:
        super().__init__(name=name, daemon=True)
        self.fn = fn
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.fn(self.stop)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller by check()
            self.error = exc

    def check(self) -> None:
        if self.error is not None:
            raise BenchError(f"{self.name} failed: {one_line(self.error)}") from self.error

    def __enter__(self) -> Background:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.join(timeout=30)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"
