"""`callqa bench gateway`: how many live legs one gateway core carries, and at what cost.

For each level, a `callqa gateway` process pinned (taskset) to one core takes N concurrent live legs
(N / 2 Twilio Media Streams calls, both tracks, 20 ms chunks in real time) from simulator processes
pinned to the other core(s), onto topics of its own (the shared topics' workers never see the load).
Over a steady window after a warm-up it measures, from /proc of the gateway's PID, its CPU per leg and
its RSS per leg (above the idle gateway); from its /metrics, the added latency (a frame's audio received
→ Kafka acknowledged, `callqa_gateway_frame_ack_seconds`, percentiles interpolated within the
histogram's buckets); from the simulators, how late they sent (the broker shares the cores: a late
simulator means the offered load was lower than N legs in real time).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import uvloop
from rich.console import Console
from rich.table import Table

from pipeline.bench.results import RESULTS, record, write_result
from pipeline.gateway.process import REPO, GatewayProcess
from pipeline.ingest.replay import CallRecording, ReplayOptions, load_recording
from pipeline.tables import print_table

RECORDING = REPO / "samples" / "calls" / "library" / "built" / "02_card_payment.wav"
FALLBACK = Path("/usr/share/pocketsphinx/test/data/cards/001.wav")
HISTOGRAM = "callqa_gateway_frame_ack_seconds"
TICKS = os.sysconf("SC_CLK_TCK")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


@dataclass(frozen=True)
class GatewayBenchOptions:
    legs: tuple[int, ...] = (200, 500, 800)  # 1000 needs more than the one simulator core of a 2-core machine
    warmup_s: float = 10.0
    window_s: float = 30.0
    gateway_cpus: str = "0"
    simulator_cpus: str = "1"
    simulators: int = 2  # processes; each sends its share of the calls
    out: Path = RESULTS


@dataclass
class LevelResult:
    legs: int
    calls: int
    gateway_cpu_core_fraction: float  # of one core, over the window
    cpu_ms_per_leg_s: float  # gateway CPU ms per leg per second
    legs_per_core: float  # legs carried (acked frames / 50 per s) per core of gateway CPU
    rss_idle_mb: float
    rss_loaded_mb: float
    rss_kb_per_leg: float
    latency_p50_ms: float
    latency_p99_ms: float
    frames_acked_in_window: int
    frames_dropped: int
    simulator_late_p50_ms: float
    simulator_late_p99_ms: float
    simulator_late_max_ms: float
    frames_offered_per_s: float  # what the simulators sent per second over their run (goal: legs x 50)
    calls_lost: int  # streams the gateway closed mid-call (its keepalive ping unanswered: it read too late)
    load_1m: float  # the machine's 1-minute load average at the window's end (2 cores: above 2 is contention)
    histogram: dict[str, float] = field(default_factory=dict)


def run_gateway_bench(options: GatewayBenchOptions, console: Console) -> tuple[dict[str, Any], list[Path]]:
    levels = [_run_level(legs, options, console) for legs in options.legs]
    figures = {"levels": [asdict(level) for level in levels],
               "method": {"protocol": "twilio (both tracks, 20 ms μ-law chunks, real time)",
                          "gateway_cpus": options.gateway_cpus, "simulator_cpus": options.simulator_cpus,
                          "simulators": options.simulators, "warmup_s": options.warmup_s,
                          "window_s": options.window_s,
                          "latency": f"{HISTOGRAM} (frame built from received audio -> acks=all), "
                                     "interpolated within buckets 5/10/20/50/100/250 ms"},
               "goals": {"legs_per_core": 1000, "latency_p99_ms": 50, "rss_kb_per_leg": 100}}
    settings = {"gateway_leg_buffer_s": 2.0, "gateway_send_batch": 2000}
    doc = record("gateway", settings, figures)
    print_levels(levels, console)
    return doc, write_result("gateway", doc, options.out)


def _run_level(legs: int, options: GatewayBenchOptions, console: Console) -> LevelResult:
    calls = max(1, legs // 2)
    run = f"{os.getpid()}-{legs}"
    with tempfile.TemporaryDirectory(prefix="callqa-bench-gateway-") as tmp:
        gateway = GatewayProcess(Path(tmp) / "gateway.log", cpus=options.gateway_cpus, env={
            "CALLQA_TOPIC_AUDIO": "callqa-bench-gateway-audio", "CALLQA_TOPIC_CALL_EVENTS": "callqa-bench-gateway-events",
            "CALLQA_GATEWAY_END_GRACE_S": "1", "CALLQA_GATEWAY_MAX_SESSIONS": str(calls + 100),
            "CALLQA_GATEWAY_DRAIN_S": "0"})
        with console.status(f"{legs} legs: starting the gateway on core(s) {options.gateway_cpus}..."):
            gateway.start()
        try:
            time.sleep(1.0)
            rss_idle = _rss_kb(gateway.pid)
            seconds = options.warmup_s + options.window_s + 5
            senders = _start_senders(gateway, calls, seconds, options, Path(tmp), run)
            with console.status(f"{legs} legs: {options.simulators} simulators connecting {calls} Twilio calls..."):
                _wait_for_sessions(gateway, calls)
            with console.status(f"{legs} legs ({calls} Twilio calls): warm-up {options.warmup_s:.0f} s, "
                                f"then {options.window_s:.0f} s measured..."):
                time.sleep(options.warmup_s)
                cpu0, hist0 = _cpu_ticks(gateway.pid), _histogram(gateway.metrics())
                time.sleep(options.window_s)
                cpu1, hist1 = _cpu_ticks(gateway.pid), _histogram(gateway.metrics())
                rss_loaded = _rss_kb(gateway.pid)
                load = os.getloadavg()[0]
                dropped = _sample(gateway.metrics(), "callqa_gateway_frames_dropped_total")
                reports = [_finish(proc, path) for proc, path in senders]
        finally:
            gateway.stop()
    core = (cpu1 - cpu0) / TICKS / options.window_s
    window = {le: hist1.get(le, 0.0) - hist0.get(le, 0.0) for le in hist1}
    # Legs actually carried (frames acknowledged / 50 per second), not the nominal level: a late simulator
    # offers less than N legs in real time.
    acked = window.get("+Inf", 0.0) / options.window_s
    late = np.concatenate([np.asarray(r["late_ms"]) for r in reports]) if reports else np.zeros(1)
    offered = sum(r["frames"] for r in reports) / max(r["elapsed_s"] for r in reports)
    return LevelResult(
        legs=legs, calls=calls, gateway_cpu_core_fraction=round(core, 3),
        cpu_ms_per_leg_s=round(1000 * core / legs, 3), legs_per_core=round(acked / 50 / core) if core > 0 else 0.0,
        rss_idle_mb=round(rss_idle / 1024, 1), rss_loaded_mb=round(rss_loaded / 1024, 1),
        rss_kb_per_leg=round((rss_loaded - rss_idle) / legs, 1),
        latency_p50_ms=round(1000 * _quantile(window, 0.50), 1), latency_p99_ms=round(1000 * _quantile(window, 0.99), 1),
        frames_acked_in_window=int(window.get("+Inf", 0.0)), frames_dropped=int(dropped),
        simulator_late_p50_ms=round(float(np.percentile(late, 50)), 1),
        simulator_late_p99_ms=round(float(np.percentile(late, 99)), 1),
        simulator_late_max_ms=round(float(late.max()), 1), frames_offered_per_s=round(offered),
        calls_lost=sum(r.get("calls_lost", 0) for r in reports), load_1m=round(load, 2),
        histogram=window)


# ---- the simulator processes --------------------------------------------------------------------------------
def _start_senders(gateway: GatewayProcess, calls: int, seconds: float, options: GatewayBenchOptions, tmp: Path,
                   run: str) -> list[tuple[subprocess.Popen[bytes], Path]]:
    senders = []
    share = [calls // options.simulators + (1 if i < calls % options.simulators else 0)
             for i in range(options.simulators)]
    for i, n in enumerate(s for s in share if s):
        out = tmp / f"sender-{i}.json"
        spec = {"url": gateway.url, "token": gateway.twilio_auth_token, "calls": n, "seconds": seconds, "out": str(out)}
        command = [sys.executable, "-m", "pipeline.bench.gateway", json.dumps(spec)]
        if options.simulator_cpus:
            command = ["taskset", "-c", options.simulator_cpus, *command]
        senders.append((subprocess.Popen(command, cwd=REPO), out))
    return senders


def _wait_for_sessions(gateway: GatewayProcess, calls: int, timeout_s: float = 120.0) -> None:
    """The window starts once every call's stream is open (the simulators load their audio first)."""
    deadline = time.monotonic() + timeout_s
    while _sample(gateway.metrics(), 'callqa_gateway_sessions_active{protocol="twilio"}') < calls:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the simulators did not open {calls} streams in {timeout_s:.0f} s")
        time.sleep(0.5)


def _finish(proc: subprocess.Popen[bytes], out: Path) -> dict[str, Any]:
    if proc.wait() != 0 or not out.exists():
        raise RuntimeError(f"a simulator process failed (exit {proc.returncode})")
    return dict(json.loads(out.read_text()))


def bench_recording(seconds: float) -> CallRecording:
    """A library call (or a test recording) repeated to ``seconds``, both legs."""
    path = RECORDING if RECORDING.exists() else FALLBACK
    rec = load_recording(path, ReplayOptions(encoding="mulaw"))
    n = int(seconds * 8000)
    encoded = {leg: (rec.encoded.get(leg) or next(iter(rec.encoded.values()))) for leg in ("agent", "customer")}
    rec.encoded = {leg: (audio * (n // len(audio) + 1))[:n] for leg, audio in encoded.items()}
    rec.legs = {leg: np.zeros(0, np.float32) for leg in rec.encoded}  # only the encoded bytes are sent
    return rec


def sender_main(spec: dict[str, Any]) -> None:
    """One simulator process: its calls, starts spread over a second, lateness written as JSON."""
    from pipeline.gateway.simulate import SimulateOptions, simulate

    rec = bench_recording(spec["seconds"])
    options = SimulateOptions("twilio", url=spec["url"], calls=spec["calls"], realtime=True,
                              twilio_auth_token=spec["token"], stagger_s=1.0 / spec["calls"], keep_going=True)
    report = uvloop.run(simulate([rec], options))
    late_ms = np.asarray(report.lateness_s) * 1000
    sample = late_ms[:: max(1, len(late_ms) // 20000)]  # a sample is enough for the percentiles
    Path(spec["out"]).write_text(json.dumps({"late_ms": [round(float(x), 2) for x in sample],
                                             "frames": report.frames_sent, "elapsed_s": report.elapsed_s,
                                             "calls_lost": len(report.failures)}))


# ---- what the gateway's /proc and /metrics say ----------------------------------------------------------------
def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])  # utime + stime (fields 14 and 15 of stat)


def _rss_kb(pid: int) -> float:
    return float(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_KB


def _histogram(exposition: str) -> dict[str, float]:
    """The ack-latency histogram's cumulative bucket counts, by upper bound ("0.005", ..., "+Inf")."""
    counts = {}
    for line in exposition.splitlines():
        if line.startswith(f"{HISTOGRAM}_bucket{{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            counts[le] = float(line.rsplit(" ", 1)[1])
    return counts


def _sample(exposition: str, name: str) -> float:
    for line in exposition.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def _quantile(buckets: dict[str, float], q: float) -> float:
    """A quantile of a cumulative histogram, linear within its bucket (as Prometheus's histogram_quantile)."""
    total = buckets.get("+Inf", 0.0)
    if total <= 0:
        return 0.0
    rank, lower, below = q * total, 0.0, 0.0
    for le, count in sorted(((le, c) for le, c in buckets.items() if le != "+Inf"), key=lambda x: float(x[0])):
        upper = float(le)
        if count >= rank:
            return lower + (upper - lower) * (rank - below) / max(count - below, 1e-9)
        lower, below = upper, count
    return lower  # beyond the last finite bucket: its bound (a floor)


def print_levels(levels: list[LevelResult], console: Console) -> None:
    """The levels as a table whose figures stay whole at 80 columns (the simulator's columns go first)."""
    table = Table(title="callqa bench gateway: Twilio legs through one gateway core")
    for title in ("legs", "cores", "legs/core", "KB/leg", "P50 ms", "P99 ms", "dropped", "lost",
                  "sim late P99", "offered/s", "load"):
        table.add_column(title, justify="right", no_wrap=True)
    for r in levels:
        table.add_row(str(r.legs), f"{r.gateway_cpu_core_fraction:.2f}", f"{r.legs_per_core:,.0f}",
                      f"{r.rss_kb_per_leg:.0f}", f"{r.latency_p50_ms:.1f}", f"{r.latency_p99_ms:.1f}",
                      f"{r.frames_dropped:,}", str(r.calls_lost), f"{r.simulator_late_p99_ms:.0f} ms",
                      f"{r.frames_offered_per_s:,.0f}/{r.legs * 50:,}", f"{r.load_1m:.1f}")
    print_table(console, table, optional=("offered/s", "sim late P99", "load"),
                all_columns="bench/results/gateway.json has every column")


if __name__ == "__main__":
    sender_main(json.loads(sys.argv[1]))
