"""`make demo`: a handful of contact-center calls of the call library through the whole pipeline, live.

Starts a worker and a `callqa gateway` beside it, sends four library calls (samples/calls/library/)
through the gateway as Twilio Media Streams, concurrently in real time, as a contact center would (a
compliant card payment, a call without identity check, a rude agent, an escalation), prints redacted
transcripts and live QA alerts as they arrive on their topics (where ``CALLQA_FINAL_MODEL`` sets a
post-call pass, waits for it and prints each call's live and final score), then each call's QA report (its final revision) read back from ClickHouse (through the worker's
API), writes the call pages as static files (`callqa report --html`:
``.callqa/demo/pages/index.html``, a timeline, the coloured transcript and the scorecard per call) and prints
their path, and stops the gateway and the worker it started. Run with the broker up and the library built
(the Makefile does both).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from rich.console import Console
from rich.table import Table

from pipeline.bench.workers import WorkerProcess, worker_env
from pipeline.broker.security import kafka_config
from pipeline.broker.topics import ensure_topics
from pipeline.config import Settings, get_settings
from pipeline.contracts import QaAlert, Serde, TranscriptSegment
from pipeline.eval.call_library import LIBRARY_DIR, LibraryNotBuilt, holds_of, load_manifest
from pipeline.gateway.process import GatewayProcess
from pipeline.gateway.simulate import SimulateOptions, new_call_id, run_with_progress
from pipeline.ingest.replay import CallRecording, ReplayOptions, load_recording
from pipeline.report import render_report, write_html
from pipeline.tables import print_table

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
    # The post-call pass only where it is set (off by default: no shipped model measures better than the live one).
    env = worker_env({"final_model": settings.final_model})
    worker = WorkerProcess(env, settings.web_port, settings.state_dir / "demo" / "worker.log")
    with console.status("starting the worker (model, VAD, ClickHouse, Kafka group)..."):
        worker.start()
    assert worker.proc is not None
    console.print(f"worker up (pid {worker.proc.pid}), log in {worker.log_path}")
    return worker


REVISIONS_SQL = """
SELECT call_id, revision, score_pct, auto_failed, computed_at FROM call_qa FINAL
WHERE has(splitByChar(',', {ids:String}), call_id) ORDER BY call_id, revision
"""


def show_revisions(worker: WorkerProcess, call_ids: list[str], timeout_s: float = 180.0) -> None:
    """Wait for each call's post-call revision and print its score beside the live one."""
    ids = ",".join(call_ids)
    deadline = time.monotonic() + timeout_s
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        rows = worker.query(REVISIONS_SQL, ids=ids)
        if sum(1 for r in rows if r["revision"] >= 1) >= len(call_ids):
            break
        time.sleep(1.0)
    table = Table("call", "live score", "final score (post-call pass)", title="live and final revisions")
    for call_id in call_ids:
        scores = {r["revision"]: r for r in rows if r["call_id"] == call_id}
        final = scores[max(scores)] if len(scores) > 1 else None
        table.add_row(call_id, _score(scores.get(0)), _score(final) if final else "not yet")
    print_table(console, table)


RECORDINGS_SQL = """
SELECT call_id, bytes, duration_ms, cuts FROM recordings FINAL WHERE has(splitByChar(',', {ids:String}), call_id) ORDER BY call_id
"""


def show_recordings(worker: WorkerProcess, call_ids: list[str], settings: Settings, timeout_s: float = 60.0) -> None:
    """Wait for the calls' redacted recordings and list them: size, length, what was silenced."""
    deadline = time.monotonic() + timeout_s
    rows: list[dict[str, Any]] = []
    while True:
        rows = worker.query(RECORDINGS_SQL, ids=",".join(call_ids))
        if len(rows) >= len(call_ids) or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    table = Table("call", "length", "size", "silenced", title=f"redacted recordings in {settings.recordings_location}")
    for r in rows:
        kinds = " ".join(c["kind"] for c in r["cuts"])
        table.add_row(r["call_id"], f"{r['duration_ms'] / 1000:.0f} s", f"{r['bytes'] / 1024:.0f} kB",
                      f"{len(r['cuts'])} ({kinds})" if r["cuts"] else "nothing")
    print_table(console, table)


def _score(row: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    return f"{float(row['score_pct']):.1f}" + (" AUTO-FAIL" if row["auto_failed"] else "")


def start_gateway(settings: Settings) -> GatewayProcess:
    # A short end grace: the demo's calls end once; nothing will continue them after a transfer.
    gateway = GatewayProcess(settings.state_dir / "demo" / "gateway.log", env={"CALLQA_GATEWAY_END_GRACE_S": "1"})
    with console.status("starting the gateway (Twilio Media Streams, AudioHook)..."):
        gateway.start()
    console.print(f"gateway up (pid {gateway.pid}) on {gateway.url}, log in {gateway.log_path}")
    return gateway


def tail_outputs(settings: Settings, serde: Serde, call_ids: set[str], stop: threading.Event) -> None:
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
        if isinstance(m, TranscriptSegment) and m.call_id in call_ids and m.revision == 0:  # live finals
            colour = "cyan" if m.leg == "agent" else "magenta"
            # The segment's last frame was produced about (end - start) after its first one.
            delay = m.produced_at_ms - m.first_frame_produced_at_ms - (m.end_ms - m.start_ms)
            console.print(f"[dim]{time.monotonic() - start:5.1f}s[/dim] {m.call_id} "
                          f"[{colour}]{m.leg:8s}[/{colour}] {m.start_ms / 1000:5.1f}-{m.end_ms / 1000:5.1f}  {m.text}"
                          f"  [dim](after speech end: {delay} ms, batch {m.batch_size})[/dim]")
        elif isinstance(m, QaAlert) and m.call_id in call_ids:
            console.print(f"      [yellow]QA alert[/yellow] {m.call_id} {m.rule} ({m.leg}, "
                          f"{m.offset_ms / 1000:.1f} s): {m.text}")
    consumer.close()


def main() -> int:
    settings = get_settings()
    options = ReplayOptions(encoding="mulaw", realtime=True, frame_ms=settings.audio_message_ms)
    try:
        recordings = demo_recordings(options)
    except (LibraryNotBuilt, KeyError) as exc:
        console.print(f"[red]demo: {exc}[/red]")
        return 1
    ensure_topics(settings)
    serde = Serde.from_settings(settings.schema_registry_url)
    worker = start_worker(settings)
    stop = threading.Event()
    gateway: GatewayProcess | None = None
    try:
        gateway = start_gateway(settings)
        # Twilio's callSids, made here so the tail knows the demo's calls before they begin
        call_ids = tuple(new_call_id("twilio") for _ in recordings)
        tail = threading.Thread(target=tail_outputs, args=(settings, serde, set(call_ids), stop), daemon=True)
        tail.start()
        time.sleep(2)  # the tail holds its start offsets before the first call begins
        console.print(f"sending {len(recordings)} library calls at once through the gateway as Twilio Media "
                      "Streams, in real time (μ-law, 20 ms chunks, both tracks): " + ", ".join(DEMO_CALLS))
        report = run_with_progress(recordings, SimulateOptions(
            "twilio", url=gateway.url, realtime=True, twilio_auth_token=gateway.twilio_auth_token,
            call_ids=call_ids), console)
        api = worker.api()  # with the random API token worker_env gave the worker
        with console.status("waiting for the calls to be finalised..."):
            worker.wait_for_calls(report.call_ids, timeout_s=120)
            time.sleep(2)  # let the tail print the last QA messages
        if settings.post_call_model:
            with console.status("post-call pass: the calls transcribed again by the accurate model..."):
                show_revisions(worker, report.call_ids)
        if settings.recordings:
            with console.status("the calls' redacted recordings..."):
                show_recordings(worker, report.call_ids, settings)
        stop.set()
        tail.join(timeout=5)
        for call_id in report.call_ids:
            render_report(api, settings.clickhouse_database, console, call_id=call_id)
        pages, count = write_html(api, settings, settings.state_dir / "demo" / "pages")
        console.print(f"{count} call pages (open in a browser, no server needed): {pages.resolve().as_uri()}",
                      soft_wrap=True)
        return 0
    finally:
        stop.set()
        if gateway is not None:
            gateway.stop()
        worker.stop()


if __name__ == "__main__":
    sys.exit(main())
