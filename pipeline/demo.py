"""`make demo`: the sample calls through the real broker, shown as they arrive.

Run with the broker started (the Makefile does that). Later stages of the pipeline extend this demo.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from rich.console import Console
from rich.table import Table

from pipeline.broker.producer import ContractProducer
from pipeline.broker.topics import ensure_topics
from pipeline.config import get_settings
from pipeline.contracts import AudioFrame, CallEvent, Serde
from pipeline.ingest.replay import ReplayOptions, TelephonyReplay, load_recording

SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "calls"
console = Console()


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "callqa-demo-offsets"})
    md = consumer.list_topics(topic, timeout=10).topics[topic]
    out = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in md.partitions}
    consumer.close()
    return out


def main() -> int:
    settings = get_settings()
    files = sorted(SAMPLES.glob("*.wav"))
    if not files:
        console.print(f"[red]no sample calls in {SAMPLES}[/red]")
        return 1
    ensure_topics(settings)
    serde = Serde.from_settings(settings.schema_registry_url)
    start = {t: end_offsets(settings.bootstrap, t) for t in (settings.topic_audio, settings.topic_call_events)}
    options = ReplayOptions(encoding="mulaw", realtime=False)
    recordings = [load_recording(f, options) for f in files]
    console.print(f"replaying {len(files)} sample calls into {settings.bootstrap} ...")
    report = TelephonyReplay(ContractProducer(settings.bootstrap, serde), settings.topic_audio,
                             settings.topic_call_events).run(recordings, options)
    console.print(f"sent {report.frames_sent} frames in {report.elapsed_s:.2f} s ({report.frames_per_s:,.0f} frames/s)")

    frames: Counter[tuple[str, str]] = Counter()
    events: Counter[tuple[str, str]] = Counter()
    partitions: dict[str, int] = {}
    consumer = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": "callqa-demo",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(t, p, o) for t, offs in start.items() for p, o in offs.items()])
    expected = report.frames_sent + report.events_sent
    got = 0
    while got < expected:
        msg = consumer.poll(5.0)
        if msg is None:
            break
        value = msg.value()
        if msg.error() or value is None:
            continue
        got += 1
        decoded = serde.decode_any(value)
        if isinstance(decoded, AudioFrame):
            frames[(decoded.call_id, decoded.leg)] += 1
            partitions[decoded.call_id] = msg.partition() or 0
        elif isinstance(decoded, CallEvent):
            events[(decoded.call_id, decoded.event_type)] += 1
    consumer.close()

    table = Table("call", "partition", "agent frames", "customer frames", "start", "end", title="arrived in Kafka")
    for call_id in report.call_ids:
        table.add_row(call_id, str(partitions.get(call_id, "-")), str(frames[(call_id, "agent")]),
                      str(frames[(call_id, "customer")]), str(events[(call_id, "start")]), str(events[(call_id, "end")]))
    console.print(table)
    console.print(f"{got} of {expected} messages read back")
    return 0 if got == expected else 1


if __name__ == "__main__":
    sys.exit(main())
