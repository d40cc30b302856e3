"""`callqa gateway` as a child process: for the demo and the benchmark, which run a gateway beside the
worker on a free port, with credentials of their own, and stop it by its PID."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class GatewayProcess:
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)  # CALLQA_* settings on top of this process's environment
    cpus: str = ""  # `taskset -c` CPU list; empty: not pinned
    port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)  # /metrics (CALLQA_GATEWAY_METRICS_PORT)
    sip_port: int | None = None  # also SIPREC on this port (--sip-port), UDP and TCP
    # Generated per run: the gateway checks Twilio signatures with it, the simulator signs with it.
    twilio_auth_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "the gateway is not started"
        return self.proc.pid

    def start(self, timeout_s: float = 60.0) -> None:
        command = [sys.executable, "-m", "pipeline.cli", "gateway", "--port", str(self.port), "--loglevel", "warning"]
        if self.sip_port is not None:
            command += ["--sip-port", str(self.sip_port)]
        if self.cpus:
            command = ["taskset", "-c", self.cpus, *command]  # taskset execs the gateway: same pid
        env = {**os.environ, **self.env, "CALLQA_TWILIO_AUTH_TOKEN": self.twilio_auth_token,
               "CALLQA_GATEWAY_METRICS_PORT": str(self.metrics_port)}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while not self.healthy():
            if self.proc.poll() is not None:
                raise RuntimeError(f"the gateway exited at start (exit {self.proc.returncode}): {self.why()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the gateway did not answer /healthz in {timeout_s:.0f} s: {self.why()}")
            time.sleep(0.2)

    def why(self) -> str:
        """The gateway log's last error line (else its last line), and where the log is: one line."""
        lines = [ln.strip() for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        errors = [ln for ln in lines if "error" in ln.lower()]
        return f"{(errors or lines or ['(empty log)'])[-1][:300]} (log: {self.log_path})"

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            return str(r.read().decode())

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGTERM (the gateway drains: every open call gets its end event), then SIGKILL if it hangs."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
