"""`callqa bench gateway`: how many live legs one gateway core carries, and at what cost.

For each level, a `callqa gateway` process pinned (taskset) to one core takes N concurrent live legs
(N / 2 Twilio Media Streams calls, both tracks, 20 ms chunks in real time; or with ``--protocol siprec``
N / 2 SIPREC sessions, two PCMU RTP streams each in 20 ms packets, from ``siprec.client.RecordingLoad``: one
event loop per simulator, no thread per session) from simulator processes pinned to the other core(s),
onto topics of its own (the shared topics' workers never see the load).
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
from typing import Any, Literal

import numpy as np
import uvloop
from rich.console import Console

from pipeline.bench import probes
from pipeline.bench.results import RESULTS, record, run_folder, utc_stamp, write_result
from pipeline.bench.workers import shared_broker
from pipeline.config import Settings
from pipeline.gateway.process import REPO, GatewayProcess, free_port
from pipeline.ingest.replay import CallRecording, ReplayOptions, load_recording

RECORDING = REPO / "samples" / "calls" / "library" / "built" / "02_card_payment.wav"
FALLBACK = Path("/usr/share/pocketsphinx/test/data/cards/001.wav")
HISTOGRAM = "callqa_gateway_frame_ack_seconds"
KIND = {"twilio": "Twilio calls", "siprec": "SIPREC sessions"}
SIPREC_SPREAD_S = 3.0  # a simulator's INVITEs are spread over this long (the SRS opens two sockets for each)
METHOD = {"twilio": "twilio (both tracks, 20 ms μ-law chunks, real time)",
          "siprec": f"siprec (INVITE/ACK over UDP spread over {SIPREC_SPREAD_S:.0f} s, 2 PCMU RTP streams per session, "
                    "20 ms packets, real time, BYE at the end)"}


@dataclass(frozen=True)
class GatewayBenchOptions:
    legs: tuple[int, ...] = (200, 500, 800)  # 1000 needs more than the one simulator core of a 2-core machine
    warmup_s: float = 10.0
    window_s: float = 30.0
    gateway_cpus: str = "0"
    simulator_cpus: str = "1"
    simulators: int = 2  # processes; each sends its share of the calls
    out: Path = RESULTS
    protocol: Literal["twilio", "siprec"] = "twilio"  # siprec: a leg is an RTP stream, a call a session


@dataclass
class LevelResult:
    legs: int
    calls: int
    gateway_cpu_core_fraction: float  # of one core, over the window
    cpu_ms_per_leg_s: float  # gateway CPU ms per leg per second
    legs_per_core: float  # legs carried (acked frames / messages per leg s) per core of gateway CPU
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
    stamp, siprec = utc_stamp(), options.protocol == "siprec"
    name = "gateway-siprec" if siprec else "gateway"  # the Twilio figures stay in gateway.json
    work = run_folder(name, stamp)  # the gateway's and simulators' logs and reports stay here
    with shared_broker(console.print):
        runs = [_run_level(legs, options, work / f"{legs}-legs", console) for legs in options.legs]
    goals = {"legs_per_core": 1000, "latency_p99_ms": 50, "rss_kb_per_leg": 32 if siprec else 100}
    figures = {"protocol": options.protocol, "levels": [{**asdict(level), **extra} for level, extra in runs],
               "method": {"protocol": METHOD[options.protocol],
                          "gateway_cpus": options.gateway_cpus, "simulator_cpus": options.simulator_cpus,
                          "simulators": options.simulators, "warmup_s": options.warmup_s,
                          "window_s": options.window_s,
                          "latency": f"{HISTOGRAM} (frame built from received audio -> acks=all), "
                                     "interpolated within buckets 5/10/20/50/100/250 ms"},
               "goals": {**goals, **({"sessions_per_core": 500, "rss_kb_per_session": 64} if siprec else {})},
               "logs": str(work)}
    settings = {"gateway_leg_buffer_s": 2.0, "gateway_send_batch": 2000,
                "audio_message_ms": Settings().audio_message_ms}
    doc = record("gateway --protocol siprec" if siprec else "gateway", settings, figures, started=stamp)
    return doc, write_result(name, doc, options.out)


def _run_level(legs: int, options: GatewayBenchOptions, work: Path,
               console: Console) -> tuple[LevelResult, dict[str, Any]]:
    """A level's figures, and SIPREC's own: per session (its unit: two legs, goal 500 per core at <= 64 KB
    each) and over the whole run the RTP packets taken, never received (a full socket buffer) or too late."""
    calls, kind, siprec = max(1, legs // 2), KIND[options.protocol], options.protocol == "siprec"
    gateway = GatewayProcess(work / "gateway.log", cpus=options.gateway_cpus, env={
        "CALLQA_TOPIC_AUDIO": "callqa-bench-gateway-audio", "CALLQA_TOPIC_CALL_EVENTS": "callqa-bench-gateway-events",
        "CALLQA_GATEWAY_END_GRACE_S": "1", "CALLQA_GATEWAY_MAX_SESSIONS": str(calls + 100),
        "CALLQA_GATEWAY_DRAIN_S": "0", "CALLQA_SIPREC_MAX_SESSIONS": str(calls + 100),
        "CALLQA_SIPREC_SOURCE_INVITES_PER_S": "0"}, sip_port=free_port() if siprec else None)
    with console.status(f"{legs} legs: starting the gateway on core(s) {options.gateway_cpus}..."):
        gateway.start()
    try:
        time.sleep(1.0)
        rss_idle = probes.rss_bytes(gateway.pid) / 1024
        seconds = options.warmup_s + options.window_s + 5 + (SIPREC_SPREAD_S if siprec else 0)
        senders = _start_senders(gateway, calls, seconds, options, work)
        with console.status(f"{legs} legs: {options.simulators} simulators connecting {calls} {kind}..."):
            _wait_for_sessions(gateway, calls, options.protocol)
        with console.status(f"{legs} legs ({calls} {kind}): warm-up {options.warmup_s:.0f} s, "
                            f"then {options.window_s:.0f} s measured..."):
            time.sleep(options.warmup_s)
            cpu0, page0 = probes.cpu_seconds(gateway.pid), gateway.metrics()
            time.sleep(options.window_s)
            cpu1, page1 = probes.cpu_seconds(gateway.pid), gateway.metrics()
            rss_loaded = probes.rss_bytes(gateway.pid) / 1024
            load = os.getloadavg()[0]
            dropped = probes.metric(page1, "callqa_gateway_frames_dropped_total")
            reports = [_finish(proc, path) for proc, path in senders]
            ended = gateway.metrics()  # the sessions' RTP counts are published as they end
    finally:
        gateway.stop()
    core = (cpu1 - cpu0) / options.window_s
    hist0, hist1 = probes.histogram(page0, HISTOGRAM), probes.histogram(page1, HISTOGRAM)
    window = {le: hist1.get(le, 0.0) - hist0.get(le, 0.0) for le in hist1}
    # Legs actually carried (messages acknowledged / a leg's messages per second), not the nominal level: a
    # late simulator offers less than N legs in real time.
    acked = window.get("+Inf", 0.0) / options.window_s / (1000 / Settings().audio_message_ms)
    late = np.concatenate([np.asarray(r["late_ms"]) for r in reports]) if reports else np.zeros(1)
    offered = sum(r["frames"] for r in reports) / max(r["elapsed_s"] for r in reports)
    level = LevelResult(
        legs=legs, calls=calls, gateway_cpu_core_fraction=round(core, 3),
        cpu_ms_per_leg_s=round(1000 * core / legs, 3), legs_per_core=round(acked / core) if core > 0 else 0.0,
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
    if not siprec:
        return level, {}
    return level, {"sessions": calls, "sessions_per_core": round(level.legs_per_core / 2),
                   "rss_kb_per_session": round(2 * level.rss_kb_per_leg, 1),
                   **{f"rtp_packets_{k}": int(probes.metric(ended, "callqa_siprec_rtp_packets_total", outcome=k))
                      for k in ("audio", "lost", "late")}}


# ---- the simulator processes --------------------------------------------------------------------------------
def _start_senders(gateway: GatewayProcess, calls: int, seconds: float, options: GatewayBenchOptions,
                   work: Path) -> list[tuple[subprocess.Popen[bytes], Path]]:
    senders = []
    share = [calls // options.simulators + (1 if i < calls % options.simulators else 0)
             for i in range(options.simulators)]
    for i, n in enumerate(s for s in share if s):
        out = (work / f"simulator-{i}.json").resolve()
        spec = {"url": gateway.url, "token": gateway.twilio_auth_token, "calls": n, "seconds": seconds, "out": str(out),
                "protocol": options.protocol, "sip_port": gateway.sip_port}
        command = [sys.executable, "-m", "pipeline.bench.gateway", json.dumps(spec)]
        if options.simulator_cpus:
            command = ["taskset", "-c", options.simulator_cpus, *command]
        with (work / f"simulator-{i}.log").open("wb") as log:
            senders.append((subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT), out))
    return senders


def _wait_for_sessions(gateway: GatewayProcess, calls: int, protocol: str, timeout_s: float = 120.0) -> None:
    """The window starts once every call's stream is open (the simulators load their audio first)."""
    deadline = time.monotonic() + timeout_s
    name, labels = ("callqa_siprec_sessions_active", {}) if protocol == "siprec" else \
        ("callqa_gateway_sessions_active", {"protocol": protocol})
    while probes.metric(gateway.metrics(), name, **labels) < calls:
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
    """One simulator process: its calls (Twilio: starts spread over a second; SIPREC: over SIPREC_SPREAD_S),
    lateness written as JSON. A frame is 20 ms of one leg (a Twilio media message, an RTP packet)."""
    from pipeline.gateway.simulate import SimulateOptions, simulate

    rec = bench_recording(spec["seconds"])
    if spec.get("protocol") == "siprec":
        from pipeline.audio import codecs
        from pipeline.gateway.siprec.client import RecordingLoad, SrcOptions
        from pipeline.gateway.siprec.rtp_send import packetize

        customer, agent = (packetize(codecs.float_to_pcm16(codecs.decode(rec.encoded[leg], "mulaw")), "pcmu", 0,
                                     ssrc=0x5100 + i) for i, leg in enumerate(("customer", "agent")))
        src = SrcOptions(port=spec["sip_port"], timeout_s=10.0)
        sent = uvloop.run(RecordingLoad(src, customer, agent).run(spec["calls"], SIPREC_SPREAD_S))
        late_s, frames, elapsed, lost = np.asarray(sent.late_s), sent.packets_sent, sent.elapsed_s, len(sent.failures)
    else:
        options = SimulateOptions("twilio", url=spec["url"], calls=spec["calls"], realtime=True,
                                  twilio_auth_token=spec["token"], stagger_s=1.0 / spec["calls"], keep_going=True)
        report = uvloop.run(simulate([rec], options))
        late_s, frames = np.asarray(report.lateness_s), report.frames_sent
        elapsed, lost = report.elapsed_s, len(report.failures)
    late_ms = late_s * 1000
    sample = late_ms[:: max(1, len(late_ms) // 20000)]  # a sample is enough for the percentiles
    Path(spec["out"]).write_text(json.dumps({"late_ms": [round(float(x), 2) for x in sample], "frames": frames,
                                             "elapsed_s": elapsed, "calls_lost": lost}))


if __name__ == "__main__":
    sender_main(json.loads(sys.argv[1]))
