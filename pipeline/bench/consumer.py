"""`callqa bench consumer`: what faust's per-message path costs against a batch consumer in the same faust app.

The same audio (calls of line noise, 8 kHz μ-law, ``CallStream`` messages of 20 and of 200 ms, sent
by ``ContractProducer`` to a fresh topic of the audio's partitions) is read by a faust app, a process per run:
``agent``, the worker's ``take_events`` agent with its settings and consumer, or ``batch``, a confluent-kafka
``consume(frame_batch_max, within)`` loop in a thread the app's task starts, each batch handed to the event loop
through a queue of 4. Per message in both: an Avro decode into ``AudioFrame``; per batch a no-op handler. Two
traffics: a backlog read whole, and ``live_calls`` calls sent in real time (idle costs between messages count,
as they do in a worker). From the first message handled to the last: the process's CPU (every thread), its
event loop thread's, wall time; medians of ``repeat`` runs, paths interleaved; each run checks every message
came once.
"""

from __future__ import annotations

import asyncio
import json
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust
from confluent_kafka import Consumer, KafkaException
from faust.worker import Worker
from rich.console import Console

from pipeline.bench.results import RESULTS, record, run_folder, settings_that_matter, utc_stamp, write_result
from pipeline.bench.sender import CallStream
from pipeline.bench.traffic import FRAME_MS, CallPlan, NoiseBed, TurnLibrary
from pipeline.bench.workers import BenchError, shared_broker, why_stopped
from pipeline.broker.consumer import use_worker_consumer
from pipeline.broker.groups import wait_for_members
from pipeline.broker.producer import ContractProducer
from pipeline.broker.security import ClientErrors, admin_client, faust_credentials, kafka_config
from pipeline.broker.topics import TopicSpec, ensure_topics
from pipeline.config import Settings, get_settings
from pipeline.contracts import AudioFrame, Serde

PATHS = ("agent", "batch")
CALL_S = 10  # each call's length: 6000 s of leg audio are 300 calls of 2 legs, over every partition
Batch = list[tuple[Any, ...]]  # partition, offset, value


@dataclass(frozen=True)
class ConsumerBenchOptions:
    audio_s: float = 6000.0  # the backlog's leg audio per span (300,000 messages of 20 ms, 30,000 of 200 ms)
    live_calls: int = 28  # calls sent in real time (bench live's 28 calls on 2 cores); 0: no live runs
    live_s: float = 20.0
    spans_ms: tuple[int, ...] = (20, 200)
    repeat: int = 3
    out: Path = RESULTS / "consumer"
    settings: Settings = field(default_factory=get_settings)


def produce(settings: Settings, topic: str, span_ms: int, calls: int, call_ms: int, realtime: bool) -> int:
    """``calls`` calls of line noise in messages of ``span_ms``, interleaved as they happen (in real time or
    at once); the messages sent."""
    n, call_ms = span_ms // FRAME_MS, round(call_ms / FRAME_MS) * FRAME_MS
    streams = [CallStream.render(CallPlan(f"consumer-{i:03d}", 0.0, call_ms, (), call_ms, noise_offset=811 * i),
                                 TurnLibrary((), {}), NoiseBed(call_ms / 1000), n) for i in range(calls)]
    producer, sent, end = ContractProducer.from_settings(settings, Serde.from_settings(settings.schema_registry_url)), 0, 0
    began = time.monotonic()
    while not all(s.done for s in streams):
        end += n
        time.sleep(max(0.0, began + end * FRAME_MS / 1000 - time.monotonic()) if realtime else 0.0)
        for frame in (f for s in streams for f in s.frames_until(end)):
            producer.send(topic, frame.call_id, frame)
            sent += 1
    producer.flush()
    return sent


def consume(path: str, topic: str, expected: int, result: Path, group: str) -> None:
    """One run in this process: a faust app reads ``topic`` by ``path`` (consumer group ``group``) until each
    of ``expected`` messages came, writes its figures to ``result`` and stops (SIGTERM: faust's own stop)."""
    s, seen, marks = get_settings(), set[tuple[int, int]](), dict[str, Any](messages=0)
    serde, within = Serde.from_settings(s.schema_registry_url), s.frame_batch_within_ms / 1000
    app = faust.App(group if path == "agent" else f"{group}.app", broker=f"kafka://{s.bootstrap}",
                    broker_credentials=faust_credentials(s), store="memory://", web_enabled=False,
                    datadir=str(result.with_suffix(".faust")), consumer_auto_offset_reset="earliest",
                    stream_buffer_maxsize=s.stream_buffer_maxsize, broker_max_poll_records=s.max_poll_records)
    use_worker_consumer(app, s.fetch_min_bytes, s.fetch_max_wait_ms)

    async def handled(frames: list[AudioFrame]) -> None:  # the Kafka-free core's place: nothing
        pass

    async def handle(batch: Batch) -> None:
        first = marks.setdefault("first", (time.perf_counter(), time.process_time(), time.thread_time()))
        await handled([serde.decode(value, AudioFrame) for _, _, value in batch])
        seen.update((p, o) for p, o, _ in batch)
        marks["messages"] += len(batch)
        if len(seen) >= expected and "wall_s" not in marks:
            now = (time.perf_counter(), time.process_time(), time.thread_time())
            marks.update({k: b - a for k, a, b in zip(("wall_s", "cpu_s", "event_loop_cpu_s"), first, now, strict=True)})
            del marks["first"]
            result.write_text(json.dumps({**marks, "distinct": len(seen)}))
            signal.raise_signal(signal.SIGTERM)

    if path == "agent":  # the worker's consume_audio, less the core
        @app.agent(app.topic(topic, key_serializer="raw", value_serializer="raw", acks=False))
        async def frames(stream: Any) -> None:
            async for events in stream.take_events(s.frame_batch_max, within=within):
                await handle([(e.message.partition, e.message.offset, e.message.value) for e in events])
    else:
        def fetch(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Batch]) -> None:
            consumer = Consumer({**kafka_config(s), "group.id": group, "auto.offset.reset": "earliest",
                                 "enable.auto.commit": False, "fetch.min.bytes": s.fetch_min_bytes,
                                 "fetch.wait.max.ms": s.fetch_max_wait_ms})
            consumer.subscribe([topic])
            while True:
                if batch := [(m.partition(), m.offset(), m.value()) for m in consumer.consume(s.frame_batch_max, within)
                             if m.error() is None]:
                    asyncio.run_coroutine_threadsafe(queue.put(batch), loop).result()

        @app.task
        async def batches() -> None:
            queue: asyncio.Queue[Batch] = asyncio.Queue(4)
            threading.Thread(target=fetch, args=(asyncio.get_running_loop(), queue), daemon=True).start()
            while True:
                await handle(await queue.get())
    Worker(app, loglevel="warning", quiet=True, redirect_stdouts=False).execute_from_commandline()


@contextmanager
def fresh_topic(settings: Settings, admin: Any, span: int) -> Iterator[str]:
    topic = f"bench.consumer-{uuid.uuid4().hex[:8]}-{span}ms"
    ensure_topics(settings, [TopicSpec(topic, settings.audio_partitions, 3600_000, "bench consumer")])
    try:
        yield topic
    finally:
        for future in admin.delete_topics([topic]).values():
            future.result()


def one_run(settings: Settings, admin: Any, path: str, topic: str, result: Path, expected: int,
            live: tuple[int, int, int] | None) -> dict[str, Any]:
    """A consuming process; ``live`` (span, calls, call ms): the traffic it reads, sent in real time once it
    holds the topic's partitions."""
    group, log = f"bench-consumer-{uuid.uuid4().hex}", result.with_suffix(".log")

    def alive() -> None:
        if child.poll() is not None:
            raise BenchError(f"{path} run exited ({child.returncode}): {why_stopped(log)}")

    with log.open("w") as out:
        child = subprocess.Popen([sys.executable, "-m", "pipeline.bench.consumer", path, topic, str(expected),
                                  str(result), group], stdout=out, stderr=out)
        try:
            if live is not None:
                wait_for_members(admin, group, topic, settings.audio_partitions, 1, 120.0, alive)
                produce(settings, topic, *live, realtime=True)
            child.wait(timeout=300)
        finally:
            child.kill()
            leader = f"{group if path == 'agent' else group + '.app'}-__assignor-__leader"  # faust's, one per app id
            for future in admin.delete_topics([leader]).values():
                with suppress(KafkaException):
                    future.result()
    if not result.exists():
        raise BenchError(f"{path} run: no result (exit {child.returncode}): {why_stopped(log)}")
    return dict(json.loads(result.read_text()), produced=expected)


def row(span: int, path: str, traffic: str, sent: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    cpu, loop, wall = (statistics.median(r[k] for r in runs) for k in ("cpu_s", "event_loop_cpu_s", "wall_s"))
    audio_s = sent * span / 1000
    return {"span_ms": span, "traffic": traffic, "path": path, "messages": sent, "audio_s": audio_s,
            "exactly_once": all(r["messages"] == r["distinct"] == sent for r in runs),
            "cpu_s_per_1000_messages": round(1000 * cpu / sent, 4), "cpu_ms_per_audio_s": round(1000 * cpu / audio_s, 3),
            "event_loop_cpu_ms_per_audio_s": round(1000 * loop / audio_s, 3), "messages_per_s": round(sent / wall),
            "cpu_s": round(cpu, 4), "event_loop_cpu_s": round(loop, 4), "wall_s": round(wall, 4)}


def run_consumer(options: ConsumerBenchOptions, console: Console) -> tuple[dict[str, Any], list[Path]]:
    rows, runs, started, o = list[dict[str, Any]](), list[dict[str, Any]](), utc_stamp(), options
    live_ms, calls = round(o.live_s * 1000 / FRAME_MS) * FRAME_MS, max(1, round(o.audio_s / (2 * CALL_S)))
    work = run_folder("consumer", started)  # each run's log and figures stay: an error names its log
    work.mkdir(parents=True, exist_ok=True)
    with shared_broker(console.print) as settings:
        admin = admin_client(settings, ClientErrors(settings))
        for span, live in [(span, live) for span in o.spans_ms for live in (False, True)[:1 + bool(o.live_calls)]]:
            label = f"{o.live_calls} calls live" if live else "backlog"
            with ExitStack() as stack:  # the backlog: one topic per span, produced once
                topic = "" if live else stack.enter_context(fresh_topic(settings, admin, span))
                sent = (2 * o.live_calls * -(-live_ms // span) if live else
                        produce(settings, topic, span, calls, round(o.audio_s * 1000 / (2 * calls)), False))
                for i, path in [(i, p) for i in range(o.repeat) for p in PATHS]:
                    with fresh_topic(settings, admin, span) if live else nullcontext(topic) as read:
                        run = one_run(settings, admin, path, read, work / f"{span}-{'live' if live else 'backlog'}-{path}-{i}.json", sent,
                                      (span, o.live_calls, live_ms) if live else None)
                    runs.append({"span_ms": span, "traffic": label, "path": path, **run})
                    console.print(runs[-1])
            agent, batch = (row(span, p, label, sent, [r for r in runs if (r["span_ms"], r["traffic"], r["path"]) ==
                                                        (span, label, p)]) for p in PATHS)
            rows += [agent, {**batch, **{f"batch_over_agent_{k}": round(batch[f"{k}_s"] / agent[f"{k}_s"], 3)
                                         if agent[f"{k}_s"] else None for k in ("cpu", "event_loop_cpu")}}]
    doc = record("consumer", settings_that_matter(options.settings), {
        "note": f"CPU of the consuming process (every thread) and of its event loop thread from the first message "
                f"handled to the last, the median of {o.repeat} runs; audio s: leg audio",
        "audio_s": o.audio_s, "live_calls": o.live_calls, "live_s": o.live_s, "repeat": o.repeat, "rows": rows,
        "runs": runs, "logs": str(work)}, started=started)
    return doc, write_result("consumer", doc, options.out)


if __name__ == "__main__":
    consume(sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]), sys.argv[5])
