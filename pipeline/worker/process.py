"""A `callqa worker` child process and its read-only web API: used by `make demo`, tests and benchmarks.

The worker owns its embedded ClickHouse folder (chdb admits one process per folder), so whoever
started it reads results through its /api/query, as `callqa report` does, with the bearer token in
its environment (``worker_env`` gives each worker a random one unless CALLQA_API_TOKEN is set).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.broker.security import kafka_config
from pipeline.config.broker import BrokerSettings
from pipeline.report import WorkerApiSource

if TYPE_CHECKING:
    pass


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
                "SELECT call_id, end_reason, segments FROM calls_deduped "
                "WHERE has(splitByChar(',', {ids:String}), call_id) AND end_reason != ''", ids=ids,
            )
            if len(rows) == len(call_ids):
                # The call row can land before its segments (separate inserts): wait for those too.
                stored = self.query("SELECT count() AS n FROM segments_deduped WHERE is_final = 1 AND "
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
