"""`make demo`: a handful of contact-center calls of the call library through the whole pipeline, live.

Starts a worker, replays four library calls (samples/calls/library/) concurrently in real time (a
compliant card payment, a call without identity check, a rude agent, an escalation), prints redacted
transcripts and live QA alerts as they arrive on their topics, then each call's QA report read back from
ClickHouse (through the worker's API), and stops the worker it started. Run with the broker up and the
library built (the Makefile does both).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import replace

from confluent_kafka import Consumer, TopicPartition
from rich.console import Console

from pipeline.broker.producer import ContractProducer
from pipeline.broker.security import kafka_config
from pipeline.broker.topics import ensure_topics
from pipeline.config import Settings, get_settings
from pipeline.contracts import QaAlert, Serde, TranscriptSegment
from pipeline.eval.call_library import LIBRARY_DIR, LibraryNotBuilt, holds_of, load_manifest
from pipeline.ingest.replay import CallRecording, ReplayOptions, TelephonyReplay, load_recording
from pipeline.report import render_report
from pipeline.worker.process import WorkerProcess, worker_env

# Short library calls (about a minute each) whose scores differ: 100, 85, 0 (auto-fail), 90.
DEMO_CALLS = ("02_card_payment", "04_no_identity_check", "05_rude_agent", "07_escalation_manager")
console = Console()


def demo_recordings(options: ReplayOptions) -> list[CallRecording]:
    """The demo's library calls, with their holds (ranges where the replay sends no frames)."""
    calls = {c["id"]: c for c in load_manifest()["calls"]}
    recordings = []
    for name in DEMO_CALLS:
        rec = load_recording(LIBRARY_DIR / calls[name]["file"], options)
        rec.holds_ms = holds_of(calls[name])
        recordings.append(rec)
    return recordings


def start_worker(settings: Settings) -> WorkerProcess:
    worker = WorkerProcess(worker_env({}), settings.web_port, settings.state_dir / "demo" / "worker.log")
    with console.status("starting the worker (model, VAD, ClickHouse, Kafka group)..."):
        worker.start()
    assert worker.proc is not None
    console.print(f"worker up (pid {worker.proc.pid}), log in {worker.log_path}")
    return worker


def tail_outputs(settings: Settings, serde: Serde, prefix: str, stop: threading.Event) -> None:
    """Print each final transcript and live QA alert of the demo's calls as it arrives."""
    consumer = Consumer({**kafka_config(settings), "group.id": f"callqa-demo-{os.getpid()}",
                         "enable.auto.commit": False})
    parts = []
    for topic in (settings.topic_transcripts, settings.topic_qa):
        md = consumer.list_topics(topic, timeout=10).topics[topic]
        for p in md.partitions:
            high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            parts.append(TopicPartition(topic, p, high))
    consumer.assign(parts)
    start = time.monotonic()
    while not stop.is_set():
        msg = consumer.poll(0.3)
        value = None if msg is None or msg.error() else msg.value()
        if not value:
            continue
        m = serde.decode_any(value)
        if isinstance(m, TranscriptSegment) and m.call_id.startswith(prefix):
            colour = "cyan" if m.leg == "agent" else "magenta"
            # The segment's last frame was produced about (end - start) after its first one.
            delay = m.produced_at_ms - m.first_frame_produced_at_ms - (m.end_ms - m.start_ms)
            console.print(f"[dim]{time.monotonic() - start:5.1f}s[/dim] {m.call_id} "
                          f"[{colour}]{m.leg:8s}[/{colour}] {m.start_ms / 1000:5.1f}-{m.end_ms / 1000:5.1f}  {m.text}"
                          f"  [dim](after speech end: {delay} ms, batch {m.batch_size})[/dim]")
        elif isinstance(m, QaAlert) and m.call_id.startswith(prefix):
            console.print(f"      [yellow]QA alert[/yellow] {m.call_id} {m.rule} ({m.leg}, "
                          f"{m.offset_ms / 1000:.1f} s): {m.text}")
    consumer.close()


def main() -> int:
    settings = get_settings()
    options = ReplayOptions(encoding="mulaw", realtime=True)
    try:
        recordings = demo_recordings(options)
    except (LibraryNotBuilt, KeyError) as exc:
        console.print(f"[red]demo: {exc}[/red]")
        return 1
    ensure_topics(settings)
    serde = Serde.from_settings(settings.schema_registry_url)
    worker = start_worker(settings)
    stop = threading.Event()
    prefix = f"demo{int(time.time())}"
    try:
        player = TelephonyReplay(ContractProducer.from_settings(settings, serde), settings.topic_audio,
                                 settings.topic_call_events)
        tail = threading.Thread(target=tail_outputs, args=(settings, serde, prefix, stop), daemon=True)
        tail.start()
        time.sleep(2)  # the tail holds its start offsets before the first call begins
        console.print(f"replaying {len(recordings)} library calls at once in real time (μ-law, 20 ms frames): "
                      + ", ".join(DEMO_CALLS))
        report = player.run(recordings, replace(options, call_id_prefix=prefix))
        api = worker.api()  # with the random API token worker_env gave the worker
        with console.status("waiting for the calls to be finalised..."):
            worker.wait_for_calls(report.call_ids, timeout_s=120)
            time.sleep(2)  # let the tail print the last QA messages
        stop.set()
        tail.join(timeout=5)
        for call_id in report.call_ids:
            render_report(api, settings.clickhouse_database, console, call_id=call_id)
        return 0
    finally:
        stop.set()
        worker.stop()


if __name__ == "__main__":
    sys.exit(main())
