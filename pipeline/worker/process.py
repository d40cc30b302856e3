"""A `callqa worker` child process and its read-only web API: used by `make demo`, tests and benchmarks.

The worker owns its embedded ClickHouse folder (chdb admits one process per folder), so whoever
started it reads results through its /api/query, as `callqa report` does, with the bearer token in
its environment (``worker_env`` gives each worker a random one unless CALLQA_API_TOKEN is set).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.broker.security import kafka_config
from pipeline.config.broker import BrokerSettings
from pipeline.report import WorkerApiSource

if TYPE_CHECKING:
    from pipeline.contracts.messages import CallQA
    from pipeline.qa.scorecard import CallQaResult


@dataclass
class WorkerProcess:
    env: dict[str, str] = field(repr=False)  # holds the API token
    web_port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    loglevel: str = "info"
    # CPU list for `taskset -c` (e.g. "0" or "0,1"); empty: not pinned. Benchmarks pin each worker to
    # its own core to measure scale-out apart from the scheduler's spreading.
    cpus: str = ""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def api(self) -> WorkerApiSource:
        """A client of this worker's /api/query, with its token."""
        return WorkerApiSource(self.base_url, self.env.get("CALLQA_API_TOKEN", ""))

    def start(self, timeout_s: float = 120.0) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        command = [sys.executable, "-m", "pipeline.cli", "worker", "--loglevel", self.loglevel]
        if self.cpus:
            command = ["taskset", "-c", self.cpus, *command]  # taskset execs the worker: same pid
        self.proc = subprocess.Popen(
            command,
            env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                self.metrics_text()
                return
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)
        raise RuntimeError(f"worker web API did not come up in {timeout_s:.0f} s: {self.log_tail()}")

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
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"{self.base_url}/metrics", timeout=5) as resp:  # noqa: S310 - loopback
            return str(resp.read().decode())

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a metric's samples whose labels include ``labels`` (0 when absent)."""
        total = 0.0
        for line in self.metrics_text().splitlines():
            head, _, value = line.rpartition(" ")
            series, _, label_text = head.partition("{")
            if series == name and all(f'{k}="{v}"' in label_text for k, v in labels.items()):
                total += float(value)
        return total

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
            raise RuntimeError(f"reading the store of stopped worker {self.log_path.stem} failed: {last}")
        rows: list[dict[str, Any]] = json.loads(done.stdout)
        return rows

    def wait_for_calls(self, call_ids: list[str], timeout_s: float = 180.0) -> list[dict[str, Any]]:
        """Wait until every call is finished in the store with all its segments; returns the call rows."""
        ids = ",".join(call_ids)
        deadline = time.monotonic() + timeout_s
        rows: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            rows = self.query(
                "SELECT call_id, end_reason, segments FROM calls FINAL "
                "WHERE has(splitByChar(',', {ids:String}), call_id) AND end_reason != ''", ids=ids,
            )
            if len(rows) == len(call_ids):
                # The call row can land before its segments (separate inserts): wait for those too.
                stored = self.query("SELECT count() AS n FROM segments FINAL WHERE is_final = 1 AND "
                                    "has(splitByChar(',', {ids:String}), call_id)", ids=ids)[0]["n"]
                if stored >= sum(int(r["segments"]) for r in rows):
                    return rows
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"worker died: {self.log_tail()}")
            time.sleep(0.5)
        raise TimeoutError(f"calls not finished in {timeout_s:.0f} s ({len(rows)}/{len(call_ids)}): {self.log_tail()}")


def worker_env(overrides: dict[str, str]) -> dict[str, str]:
    """This process's environment with CALLQA_ settings overridden (keys without the prefix), and a
    random API token unless one is configured (this process's environment or ``overrides``)."""
    env = dict(os.environ)
    env.setdefault("CALLQA_API_TOKEN", secrets.token_urlsafe(32))
    env.update({f"CALLQA_{k.upper()}": str(v) for k, v in overrides.items()})
    return env


def committed_offsets(settings: BrokerSettings, group: str, topic: str) -> dict[int, int]:
    """The offsets ``group`` has committed on each partition of ``topic`` (partitions without a commit
    are left out). Asks the group coordinator without joining the group, so no rebalance is caused."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**kafka_config(settings), "group.id": group, "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        asked = [TopicPartition(topic, p) for p in sorted(partitions)]
        return {tp.partition: tp.offset for tp in consumer.committed(asked, timeout=10) if tp.offset >= 0}
    finally:
        consumer.close()


_FINISHED_SQL = ("SELECT call_id, end_reason, segments FROM calls FINAL "
                 "WHERE has(splitByChar(',', {ids:String}), call_id) AND end_reason != ''")
_FINAL_SEGMENTS_SQL = ("SELECT call_id, segment_id, leg, start_ms, end_ms, text FROM segments FINAL "
                       "WHERE is_final = 1 AND has(splitByChar(',', {ids:String}), call_id)")


_QA_SQL = ("SELECT call_id, score_pct, auto_failed, metrics, `items.question` AS q, `items.passed` AS p "
           "FROM call_qa FINAL WHERE has(splitByChar(',', {ids:String}), call_id)")
_QA_EVENTS_SQL = ("SELECT call_id, rule, kind FROM qa_events FINAL "
                  "WHERE has(splitByChar(',', {ids:String}), call_id)")


@dataclass(frozen=True)
class QaVerdicts:
    """A call's QA as the stream stores it and `callqa analyze` reports it, in one comparable form."""

    score_pct: float
    auto_failed: bool
    items: tuple[tuple[str, bool], ...]  # the applicable scorecard items (question, passed), in card order
    events: tuple[tuple[str, str], ...]  # (rule, kind) of every QA event, sorted
    metrics: dict[str, float]

    @classmethod
    def of_result(cls, qa: CallQaResult | CallQA) -> QaVerdicts:
        """From a QA result (``CallAnalysis.qa`` of `callqa analyze`) or a CallQA message; like the store,
        it keeps the applicable items only."""
        return cls(float(qa.score_pct), bool(qa.auto_failed),
                   tuple((i.question, bool(i.passed)) for i in qa.items if i.passed is not None),
                   tuple(sorted((e.rule, e.kind) for e in qa.events)), dict(qa.metrics))

    @classmethod
    def of_rows(cls, qa: dict[str, Any], events: list[dict[str, Any]]) -> QaVerdicts:
        """From a call_qa row and the call's qa_events rows of one store."""
        return cls(float(qa["score_pct"]), bool(qa["auto_failed"]),
                   tuple((q, bool(p)) for q, p in zip(qa["q"], qa["p"], strict=True)),
                   tuple(sorted((e["rule"], e["kind"]) for e in events)),
                   {k: float(v) for k, v in (qa["metrics"] or {}).items()})

    def differences(self, reference: QaVerdicts) -> list[str]:
        """What differs from ``reference``; the score is a Float32 column, metrics compared to 1e-6."""
        out = []
        if abs(self.score_pct - reference.score_pct) > 1e-3 or self.auto_failed != reference.auto_failed:
            out.append(f"score {self.score_pct:g}{' auto-failed' * self.auto_failed}, reference "
                       f"{reference.score_pct:g}{' auto-failed' * reference.auto_failed}")
        if self.items != reference.items:
            out.append(f"items (question, passed) {list(self.items)} != reference {list(reference.items)}")
        if self.events != reference.events:
            out.append(f"events (rule, kind) {list(self.events)} != reference {list(reference.events)}")
        for name in sorted(set(self.metrics) | set(reference.metrics)):
            got, want = self.metrics.get(name), reference.metrics.get(name)
            if got is None or want is None or not math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9):
                out.append(f"metric {name} = {got}, reference {want}")
        return out


@dataclass
class GroupCalls:
    """Some calls as a consumer group's workers stored them, over all their stores."""

    finished: dict[str, list[dict[str, Any]]]  # call id -> its finished call rows (one per store that has one)
    segments: dict[str, dict[str, dict[str, Any]]]  # call id -> segment id -> final segment row (any store)
    stores_of: dict[str, set[int]]  # call id -> index of each worker whose store holds a final segment of it
    finished_in: dict[str, set[int]]  # call id -> index of each worker whose store has it finished

    def unfinished(self, call_ids: list[str]) -> list[str]:
        """Calls without a finished row in any store, or with fewer segments stored than a row counts
        (the call row and its segments are separate inserts: the row may land first)."""
        return [c for c in call_ids if not self.finished.get(c) or
                len(self.segments.get(c, {})) < max(int(r["segments"]) for r in self.finished[c])]

    def inconsistencies(self, call_ids: list[str]) -> list[str]:
        """Where stored segments disagree with their call rows: a row counting another number of segments
        than there are distinct final segment ids over all stores (lost, or stored twice under another
        id), or two segments of one leg overlapping in time (the same speech transcribed twice)."""
        problems: list[str] = []
        for call_id in call_ids:
            segments = self.segments.get(call_id, {})
            for row in self.finished.get(call_id, []):
                if int(row["segments"]) != len(segments):
                    problems.append(f"{call_id}: call row counts {row['segments']} segments, "
                                    f"the stores hold {len(segments)} distinct ones")
            by_leg: dict[str, list[tuple[int, int, str]]] = {}
            for seg_id, seg in segments.items():
                by_leg.setdefault(seg["leg"], []).append((int(seg["start_ms"]), int(seg["end_ms"]), seg_id))
            for spans in by_leg.values():
                spans.sort()
                problems += [f"{call_id}: {a[2]} [{a[0]}, {a[1]}) overlaps {b[2]} [{b[0]}, {b[1]})"
                             for a, b in zip(spans, spans[1:], strict=False) if b[0] < a[1]]
        return problems

    def differences(self, expected: dict[str, list[tuple[str, int, int, str]]]) -> list[str]:
        """Where each call's stored finals differ from an independent reference (call id -> its
        (leg, start_ms, end_ms, text) in time order, e.g. from ``callqa analyze`` of the same recording):
        a final lost, added, stored twice or with other bounds or text, and call rows counting another
        number of segments than the reference has."""
        problems: list[str] = []
        for call_id, want in expected.items():
            # Counted, not set-compared: the same speech stored under two segment ids is a difference too.
            stored = Counter((s["leg"], int(s["start_ms"]), int(s["end_ms"]), s["text"])
                             for s in self.segments.get(call_id, {}).values())
            missing = sorted((Counter(want) - stored).elements())
            extra = sorted((stored - Counter(want)).elements())
            problems += [f"{call_id}: reference final not stored: {m}" for m in missing]
            problems += [f"{call_id}: stored final not in the reference: {e}" for e in extra]
            problems += [f"{call_id}: a call row counts {r['segments']} segments, the reference has {len(want)}"
                         for r in self.finished.get(call_id, []) if int(r["segments"]) != len(want)]
        return problems


@dataclass
class GroupStores:
    """Reads the stores of one consumer group's workers (each has an embedded store of its own).
    A stopped worker's store cannot change any more: it is read once."""

    workers: list[WorkerProcess]
    _stopped: dict[tuple[int, int, str], tuple[list[dict[str, Any]], list[dict[str, Any]]]] = field(
        default_factory=dict, repr=False)

    def read(self, call_ids: list[str]) -> GroupCalls:
        calls = GroupCalls({}, {}, {}, {})
        for index, worker in enumerate(self.workers):
            finished, segments = self._rows(worker, ",".join(call_ids))
            for row in finished:
                calls.finished.setdefault(row["call_id"], []).append(row)
                calls.finished_in.setdefault(row["call_id"], set()).add(index)
            for row in segments:
                calls.segments.setdefault(row["call_id"], {})[row["segment_id"]] = row
                calls.stores_of.setdefault(row["call_id"], set()).add(index)
        return calls

    def read_verdicts(self, call_ids: list[str]) -> dict[str, list[QaVerdicts]]:
        """Each call's QA in every store that holds a QA row of it (one entry per such store): a call
        finished once has one; its events are those the finishing worker wrote beside its QA row."""
        ids = ",".join(call_ids)
        out: dict[str, list[QaVerdicts]] = {}
        for worker in self.workers:
            events: dict[str, list[dict[str, Any]]] = {}
            for row in worker.store_rows(_QA_EVENTS_SQL, ids=ids):
                events.setdefault(row["call_id"], []).append(row)
            for row in worker.store_rows(_QA_SQL, ids=ids):
                out.setdefault(row["call_id"], []).append(QaVerdicts.of_rows(row, events.get(row["call_id"], [])))
        return out

    def wait_finished(self, call_ids: list[str], timeout_s: float = 240.0) -> GroupCalls:
        """Wait until every call is finished in some store with all its segments stored."""
        deadline = time.monotonic() + timeout_s
        while True:
            calls = self.read(call_ids)
            missing = calls.unfinished(call_ids)
            if not missing:
                return calls
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(missing)} of {len(call_ids)} calls not finished in any store within "
                                   f"{timeout_s:.0f} s: {', '.join(missing)}")
            time.sleep(1.0)

    def _rows(self, worker: WorkerProcess, ids: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        key = (id(worker), worker.proc.pid if worker.proc is not None else 0, ids)
        if key in self._stopped:
            return self._stopped[key]
        was_alive = worker.alive()
        rows = worker.store_rows(_FINISHED_SQL, ids=ids), worker.store_rows(_FINAL_SEGMENTS_SQL, ids=ids)
        if not was_alive:
            self._stopped[key] = rows
        return rows
