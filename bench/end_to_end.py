"""End-to-end benchmark of the streaming pipeline (not a test): real broker, real worker, real store.

Measured in one run, same sample calls:
- capacity: N calls replayed as fast as possible; call-audio seconds the worker finishes per wall
  second (= concurrent real-time calls it could sustain), at max_batch 16 and at max_batch 1;
- real-time latency: K calls replayed in real time at once; end-to-end delay per final segment
  (last frame of the segment produced -> transcript produced) P50/P95/P99, batch sizes.
Prints a table and writes bench/results/end_to_end.json.

    .venv/bin/python bench/end_to_end.py [--calls 24] [--realtime-calls 6]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from pipeline.broker.local import LocalKafka, free_port
from pipeline.broker.producer import ContractProducer
from pipeline.broker.topics import ensure_topics
from pipeline.config import Settings
from pipeline.contracts import Serde
from pipeline.ingest.replay import ReplayOptions, TelephonyReplay, load_recording
from pipeline.worker.process import WorkerProcess, worker_env

ROOT = Path(__file__).resolve().parents[1]
console = Console()



def run_scenario(name: str, calls: int, realtime: bool, overrides: dict[str, str], work: Path) -> dict[str, Any]:
    prefix = f"bench.{name}.{uuid.uuid4().hex[:6]}"
    topics = {f"topic_{t}": f"{prefix}.{t}" for t in ("audio", "call_events", "transcripts", "latency", "qa",
                                                        "dead_letters")}
    settings = Settings(**topics)  # type: ignore[arg-type]
    ensure_topics(settings)
    port = free_port()
    env = worker_env({**topics, "worker_id": prefix, "web_port": str(port),
                      "clickhouse_url": f"chdb://{(work / name / 'chdb').resolve()}", **overrides})
    worker = WorkerProcess(env, port, work / name / "worker.log")
    worker.start()
    try:
        options = ReplayOptions(encoding="mulaw", realtime=realtime, calls=calls)
        recordings = [load_recording(p, options) for p in sorted((ROOT / "samples" / "calls").glob("*.wav"))]
        player = TelephonyReplay(ContractProducer.from_settings(settings, Serde.from_settings()),
                                 settings.topic_audio, settings.topic_call_events)
        began = time.monotonic()
        report = player.run(recordings, options)
        worker.wait_for_calls(report.call_ids, timeout_s=1800)
        wall = time.monotonic() - began
        audio_s = sum(max(n for n in legs.values()) for legs in report.frames_per_leg.values()) * 0.02
        lat = worker.query(
            "SELECT count() AS n, quantile(0.5)(end_to_end_ms) AS p50, quantile(0.95)(end_to_end_ms) AS p95, "
            "quantile(0.99)(end_to_end_ms) AS p99, avg(batch_size) AS batch, max(batch_size) AS max_batch, "
            "quantile(0.5)(inference_ms) AS inference_p50 FROM latency FINAL"
        )[0]
        return {
            "scenario": name, "calls": calls, "realtime": realtime, "settings": overrides,
            "wall_s": round(wall, 2), "call_audio_s": round(audio_s, 1),
            "call_audio_s_per_wall_s": round(audio_s / wall, 2), "segments": lat["n"],
            "end_to_end_ms": {k: round(float(lat[k]), 1) for k in ("p50", "p95", "p99")},
            "mean_batch": round(float(lat["batch"]), 2), "max_batch": lat["max_batch"],
            "inference_ms_p50": round(float(lat["inference_p50"]), 1),
            "rss_mb_at_end": round(worker.metric("process_resident_memory_bytes") / 2**20, 1),
        }
    finally:
        worker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=24, help="calls for the capacity runs")
    parser.add_argument("--realtime-calls", type=int, default=6,
                        help="concurrent real-time calls for the latency run (keep it under the capacity)")
    args = parser.parse_args()
    kafka = LocalKafka(Settings())
    started = kafka.start()
    results = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            plan = [
                ("capacity_batch16", args.calls, False, {"max_batch": "16"}),
                ("capacity_batch1", args.calls, False, {"max_batch": "1"}),
                ("capacity_int8_batch16", args.calls, False, {"max_batch": "16", "quantization": "int8"}),
                ("realtime_latency", args.realtime_calls, True, {"max_batch": "16"}),
            ]
            for name, calls, realtime, overrides in plan:
                console.print(f"[bold]{name}[/bold]: {calls} calls, {'real time' if realtime else 'as fast as possible'}")
                results.append(run_scenario(name, calls, realtime, overrides, work))
    finally:
        if not started.already_running:
            kafka.stop()
    table = Table("scenario", "calls", "wall s", "call-audio s / s", "segments", "e2e P50 ms", "P95", "P99",
                  "mean batch", "RSS MB", title="callqa pipeline benchmark")
    table.columns[0].no_wrap = True
    for r in results:
        e = r["end_to_end_ms"]
        table.add_row(r["scenario"], str(r["calls"]), f"{r['wall_s']:.1f}", f"{r['call_audio_s_per_wall_s']:.2f}",
                      str(r["segments"]), f"{e['p50']:.0f}", f"{e['p95']:.0f}", f"{e['p99']:.0f}",
                      f"{r['mean_batch']:.2f}", f"{r['rss_mb_at_end']:.0f}")
    console.print(table)
    ratio = results[0]["call_audio_s_per_wall_s"] / results[1]["call_audio_s_per_wall_s"]
    console.print(f"batching in the live pipeline: {ratio:.2f}x the throughput of max_batch 1")
    int8 = results[2]["call_audio_s_per_wall_s"] / results[0]["call_audio_s_per_wall_s"]
    console.print(f"int8 instead of fp32: {int8:.2f}x the throughput")
    out = ROOT / "bench" / "results" / "end_to_end.json"
    out.write_text(json.dumps({
        "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()},
        "results": results, "batch16_vs_batch1": round(ratio, 2), "int8_vs_fp32": round(int8, 2),
    }, indent=1) + "\n")
    console.print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
