"""Fixtures that run the real worker (`callqa worker`) as a process against the real broker.

The worker owns its embedded ClickHouse folder (chdb admits one process per folder), so tests read
results through the worker's own read-only web API, as `callqa report` does.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pipeline.config import Settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class WorkerProcess:
    settings: Settings
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = field(default=0)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.settings.web_port}"

    def start(self) -> None:
        self.starts += 1
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "worker", "--loglevel", "info"],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                self.metrics_text()
                return
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)
        raise RuntimeError(f"worker web API did not come up: {self.log_tail()}")

    def kill9(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"{self.base_url}/metrics", timeout=5) as resp:
            return str(resp.read().decode())

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a metric's samples whose labels include ``labels`` (0 when absent)."""
        total = 0.0
        for line in self.metrics_text().splitlines():
            if not line.startswith(name):
                continue
            head, _, value = line.rpartition(" ")
            series, _, label_text = head.partition("{")
            if series != name:
                continue
            if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
                total += float(value)
        return total

    def query(self, sql: str, **params: Any) -> list[dict[str, Any]]:
        args = {"sql": sql, **{f"param_{k}": str(v) for k, v in params.items()}}
        try:
            with urllib.request.urlopen(f"{self.base_url}/api/query?{urllib.parse.urlencode(args)}", timeout=60) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as exc:
            raise AssertionError(exc.read().decode()) from exc
        return [dict(zip(body["columns"], row, strict=True)) for row in body["rows"]]

    def wait_for_calls(self, call_ids: list[str], timeout_s: float = 180.0) -> list[dict[str, Any]]:
        """Wait until every call is finished in the store; returns their rows."""
        deadline = time.monotonic() + timeout_s
        rows: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            rows = self.query(
                "SELECT call_id, end_reason, segments FROM calls FINAL WHERE has(splitByChar(',', {ids:String}), call_id)"
                " AND end_reason != ''", ids=",".join(call_ids),
            )
            if len(rows) == len(call_ids):
                # The call row can land before its segments (separate inserts): wait for those too.
                stored = self.query(
                    "SELECT count() AS n FROM segments FINAL WHERE has(splitByChar(',', {ids:String}), call_id)",
                    ids=",".join(call_ids),
                )[0]["n"]
                if stored >= sum(int(r["segments"]) for r in rows):
                    return rows
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"worker died: {self.log_tail()}")
            time.sleep(1.0)
        raise AssertionError(f"calls not finished in {timeout_s:.0f} s ({len(rows)}/{len(call_ids)}): {self.log_tail()}")


@pytest.fixture
def worker_env(kafka_settings: Settings, tmp_path: Path) -> Iterator[dict[str, str]]:
    env = dict(os.environ)
    env.update({
        "CALLQA_BOOTSTRAP_SERVERS": kafka_settings.bootstrap,
        "CALLQA_TOPIC_AUDIO": kafka_settings.topic_audio,
        "CALLQA_TOPIC_CALL_EVENTS": kafka_settings.topic_call_events,
        "CALLQA_TOPIC_TRANSCRIPTS": kafka_settings.topic_transcripts,
        "CALLQA_TOPIC_LATENCY": kafka_settings.topic_latency,
        "CALLQA_TOPIC_QA": kafka_settings.topic_qa,
        "CALLQA_TOPIC_DEAD_LETTERS": kafka_settings.topic_dead_letters,
        "CALLQA_WORKER_ID": kafka_settings.worker_id,
        "CALLQA_CLICKHOUSE_URL": f"chdb://{(tmp_path / 'chdb').resolve()}",
        "CALLQA_WEB_PORT": str(free_port()),
        "CALLQA_COMMIT_INTERVAL_S": "1.0",
        "CALLQA_MODEL_WATCH_INTERVAL_S": "0",
        "CALLQA_QUANTIZATION": "fp32",
    })
    yield env


@pytest.fixture
def start_worker(worker_env: dict[str, str], tmp_path: Path) -> Iterator[Any]:
    started: list[WorkerProcess] = []

    def start(**overrides: str) -> WorkerProcess:
        env = {**worker_env, **{f"CALLQA_{k.upper()}": v for k, v in overrides.items()}}
        settings = Settings(**{k[len("CALLQA_"):].lower(): v for k, v in env.items()  # type: ignore[arg-type]
                               if k.startswith("CALLQA_") and k != "CALLQA_CONFIG"})
        w = WorkerProcess(settings, env, tmp_path / f"worker{len(started)}.log")
        w.start()
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()
