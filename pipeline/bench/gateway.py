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
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import uvloop
from rich.console import Console
from rich.table import Table

from pipeline.bench import probes
from pipeline.bench.results import RESULTS, record, run_folder, utc_stamp, write_result
from pipeline.bench.workers import shared_broker
from pipeline.gateway.process import REPO, GatewayProcess
from pipeline.ingest.replay import CallRecording, ReplayOptions, load_recording
from pipeline.tables import print_table

RECORDING = REPO / "samples" / "calls" / "library" / "built" / "02_card_payment.wav"
FALLBACK = Path("/usr/share/pocketsphinx/test/data/cards/001.wav")
HISTOGRAM = "callqa_gateway_frame_ack_seconds"


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
    stamp = utc_stamp()
    work = run_folder("gateway", stamp)  # the gateway's and simulators' logs and reports stay here
    with shared_broker(console.print):
        levels = [_run_level(legs, options, work / f"{legs}-legs", console) for legs in options.legs]
    figures = {"levels": [asdict(level) for level in levels],
               "method": {"protocol": "twilio (both tracks, 20 ms μ-law chunks, real time)",
                          "gateway_cpus": options.gateway_cpus, "simulator_cpus": options.simulator_cpus,
                          "simulators": options.simulators, "warmup_s": options.warmup_s,
                          "window_s": options.window_s,
                          "latency": f"{HISTOGRAM} (frame built from received audio -> acks=all), "
                                     "interpolated within buckets 5/10/20/50/100/250 ms"},
               "goals": {"legs_per_core": 1000, "latency_p99_ms": 50, "rss_kb_per_leg": 100},
               "logs": str(work)}
    settings = {"gateway_leg_buffer_s": 2.0, "gateway_send_batch": 2000}
    doc = record("gateway", settings, figures, started=stamp)
    print_levels(levels, console)
    return doc, write_result("gateway", doc, options.out)


def _run_level(legs: int, options: GatewayBenchOptions, work: Path, console: Console) -> LevelResult:
    calls = max(1, legs // 2)
    gateway = GatewayProcess(work / "gateway.log", cpus=options.gateway_cpus, env={
        "CALLQA_TOPIC_AUDIO": "callqa-bench-gateway-audio", "CALLQA_TOPIC_CALL_EVENTS": "callqa-bench-gateway-events",
        "CALLQA_GATEWAY_END_GRACE_S": "1", "CALLQA_GATEWAY_MAX_SESSIONS": str(calls + 100),
        "CALLQA_GATEWAY_DRAIN_S": "0"})
    with console.status(f"{legs} legs: starting the gateway on core(s) {options.gateway_cpus}..."):
        gateway.start()
    try:
        time.sleep(1.0)
        rss_idle = probes.rss_bytes(gateway.pid) / 1024
        seconds = options.warmup_s + options.window_s + 5
        senders = _start_senders(gateway, calls, seconds, options, work)
        with console.status(f"{legs} legs: {options.simulators} simulators connecting {calls} Twilio calls..."):
            _wait_for_sessions(gateway, calls)
        with console.status(f"{legs} legs ({calls} Twilio calls): warm-up {options.warmup_s:.0f} s, "
                            f"then {options.window_s:.0f} s measured..."):
            time.sleep(options.warmup_s)
            cpu0, hist0 = probes.cpu_seconds(gateway.pid), probes.histogram(gateway.metrics(), HISTOGRAM)
            time.sleep(options.window_s)
            cpu1, hist1 = probes.cpu_seconds(gateway.pid), probes.histogram(gateway.metrics(), HISTOGRAM)
            rss_loaded = probes.rss_bytes(gateway.pid) / 1024
            load = os.getloadavg()[0]
            dropped = probes.metric(gateway.metrics(), "callqa_gateway_frames_dropped_total")
            reports = [_finish(proc, path) for proc, path in senders]
    finally:
        gateway.stop()
    core = (cpu1 - cpu0) / options.window_s
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
        latency_p50_ms=round(1000 * probes.quantile(window, 0.50), 1),
        latency_p99_ms=round(1000 * probes.quantile(window, 0.99), 1),
        frames_acked_in_window=int(window.get("+Inf", 0.0)), frames_dropped=int(dropped),
        simulator_late_p50_ms=round(float(np.percentile(late, 50)), 1),
        simulator_late_p99_ms=round(float(np.percentile(late, 99)), 1),
        simulator_late_max_ms=round(float(late.max()), 1), frames_offered_per_s=round(offered),
        calls_lost=sum(r.get("calls_lost", 0) for r in reports), load_1m=round(load, 2),
        histogram=window)


# ---- the simulator processes --------------------------------------------------------------------------------
def _start_senders(gateway: GatewayProcess, calls: int, seconds: float, options: GatewayBenchOptions,
                   work: Path) -> list[tuple[subprocess.Popen[bytes], Path]]:
    senders = []
    share = [calls // options.simulators + (1 if i < calls % options.simulators else 0)
             for i in range(options.simulators)]
    for i, n in enumerate(s for s in share if s):
        out = (work / f"simulator-{i}.json").resolve()
        spec = {"url": gateway.url, "token": gateway.twilio_auth_token, "calls": n, "seconds": seconds, "out": str(out)}
        command = [sys.executable, "-m", "pipeline.bench.gateway", json.dumps(spec)]
        if options.simulator_cpus:
            command = ["taskset", "-c", options.simulator_cpus, *command]
        with (work / f"simulator-{i}.log").open("wb") as log:
            senders.append((subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT), out))
    return senders


def _wait_for_sessions(gateway: GatewayProcess, calls: int, timeout_s: float = 120.0) -> None:
    """The window starts once every call's stream is open (the simulators load their audio first)."""
    deadline = time.monotonic() + timeout_s
    while probes.metric(gateway.metrics(), "callqa_gateway_sessions_active", protocol="twilio") < calls:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the simulators did not open {calls} streams in {timeout_s:.0f} s; see "
                               f"{gateway.log_path.parent}")
        time.sleep(0.5)


def _finish(proc: subprocess.Popen[bytes], out: Path) -> dict[str, Any]:
    if proc.wait() != 0 or not out.exists():
        raise RuntimeError(f"a simulator process failed (exit {proc.returncode}); see {out.with_suffix('.log')}")
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
