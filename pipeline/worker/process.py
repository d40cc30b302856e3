"""A `callqa worker` child process and its read-only web API: used by `make demo`, tests and benchmarks.

The worker owns its embedded ClickHouse folder (chdb admits one process per folder), so whoever
started it reads results through its /api/query, as `callqa report` does, with the bearer token in
its environment (``worker_env`` gives each worker a random one unless CALLQA_API_TOKEN is set).
"""

from __future__ import annotations

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
from typing import Any

from pipeline.report import WorkerApiSource


@dataclass
class WorkerProcess:
    env: dict[str, str] = field(repr=False)  # holds the API token
    web_port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    loglevel: str = "info"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def api(self) -> WorkerApiSource:
        """A client of this worker's /api/query, with its token."""
        return WorkerApiSource(self.base_url, self.env.get("CALLQA_API_TOKEN", ""))

    def start(self, timeout_s: float = 120.0) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "worker", "--loglevel", self.loglevel],
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
