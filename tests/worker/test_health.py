"""GET /health and the exit of an unhealthy worker: unit checks, then a real worker process whose
batcher dies, which must exit non-zero (for a supervisor to restart it) instead of hanging on."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.asr.batcher import BatcherDeadError, SegmentBatcher
from pipeline.asr.results import AudioSegment
from pipeline.bench.workers import WorkerProcess, worker_env
from pipeline.broker.groups import committed_offsets
from pipeline.broker.local import free_port
from pipeline.broker.producer import ContractProducer
from pipeline.config import Settings
from pipeline.contracts import Serde
from pipeline.ingest.replay import ReplayOptions, TelephonyReplay, load_recording
from pipeline.store.sink import ClickHouseSink
from pipeline.worker.health import WorkerHealth

SAMPLES = Path(__file__).resolve().parents[2] / "samples" / "calls"


class Part:
    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


def test_health_lists_every_reason_and_asks_for_one_exit() -> None:
    failures: list[str] = []
    parts = {"batcher": Part(), "store sink": Part()}
    health = WorkerHealth(parts, lambda: failures)
    assert health.report() == (200, {"status": "ok", "reasons": []})
    assert health.exit_reason() is None
    parts["store sink"].error = RuntimeError("flushing\nstopped")
    failures.append("call c1: emit task failed: KeyError: 'x'")
    assert health.report() == (503, {"status": "failing", "reasons": [
        "store sink died: RuntimeError: flushing stopped", "call c1: emit task failed: KeyError: 'x'"]})
    first = health.exit_reason()
    assert first is not None and "store sink died" in str(first)
    assert health.exit_reason() is None  # the exit is under way: said once


class ShortRecognizer:
    """A recognizer with a bug: it returns fewer results than it got segments."""

    name, version = "short", 1

    def recognize(self, segments: Any, waits: Any = None, wide: bool = False, on_result: Any = None,
                  contexts: Any = None) -> list[Any]:
        return []


class OneWindow:
    def window_frames(self, frames: int) -> int:
        return 3000


async def test_a_batcher_whose_collector_died_says_why_and_refuses_new_segments() -> None:
    batcher = SegmentBatcher(ShortRecognizer(), window=OneWindow(), max_wait_ms=1)  # type: ignore[arg-type]
    await batcher.start()
    assert batcher.error is None
    segment = AudioSegment(0, 1000, np.zeros(16000, np.float32))
    waiting = asyncio.create_task(batcher.submit(segment))
    for _ in range(500):
        if batcher.error is not None:
            break
        await asyncio.sleep(0.01)
    assert isinstance(batcher.error, ValueError)  # zip(strict=True) of 1 segment and 0 results
    assert not waiting.done()  # its segment will never be transcribed: why the worker must exit
    with pytest.raises(BatcherDeadError):
        await batcher.submit(segment)
    waiting.cancel()
    await asyncio.wait_for(batcher.close(), 10)  # no collector to hand the close to: it does not hang
    assert batcher.error is None


async def test_a_sink_whose_flushing_task_is_gone_says_so_until_it_is_closed(tmp_path: Path) -> None:
    sink = ClickHouseSink(f"chdb://{tmp_path / 'store'}", "callqa")
    assert sink.error is None
    sink._ensure_started()
    assert sink._task is not None and sink.error is None
    sink._task.cancel()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert "cancelled" in str(sink.error)


# ---- a real worker process ----------------------------------------------------------------------
# Injected into the worker's interpreter only (sitecustomize on its PYTHONPATH): the batcher's
# collector raises at its first batch, a stand-in for any bug that kills it.
FAULT = '''
from pipeline.asr.batcher import SegmentBatcher

def _take_batch(self, *args):
    raise RuntimeError("injected collector fault")

SegmentBatcher._take_batch = _take_batch
'''


def _get_health(worker: WorkerProcess) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"{worker.base_url}/health", timeout=5) as resp:  # noqa: S310 - loopback
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.broker
@pytest.mark.slow
def test_a_worker_whose_batcher_dies_exits_non_zero(kafka_settings: Settings, tmp_path: Path) -> None:
    fault_dir = tmp_path / "fault"
    fault_dir.mkdir()
    (fault_dir / "sitecustomize.py").write_text(FAULT)
    port = free_port()
    env = worker_env({
        "bootstrap_servers": kafka_settings.bootstrap, "worker_id": kafka_settings.worker_id,
        "topic_audio": kafka_settings.topic_audio, "topic_call_events": kafka_settings.topic_call_events,
        "topic_transcripts": kafka_settings.topic_transcripts, "topic_latency": kafka_settings.topic_latency,
        "topic_qa": kafka_settings.topic_qa, "topic_dead_letters": kafka_settings.topic_dead_letters,
        "topic_checkpoints": kafka_settings.topic_checkpoints,
        "clickhouse_url": f"chdb://{(tmp_path / 'chdb').resolve()}", "web_port": str(port),
        "model_watch_interval_s": "0",
    })
    env["PYTHONPATH"] = str(fault_dir)
    worker = WorkerProcess(env, port, tmp_path / "worker.log")
    worker.start()
    try:
        # Fine while no batch has run: /health is open (no token) and says so.
        assert _get_health(worker) == (200, {"status": "ok", "reasons": []})
        rec = load_recording(SAMPLES / "call_01.wav", ReplayOptions(encoding="mulaw"))
        player = TelephonyReplay(ContractProducer(kafka_settings.bootstrap, Serde.from_settings()),
                                 kafka_settings.topic_audio, kafka_settings.topic_call_events)
        player.run([rec], ReplayOptions(encoding="mulaw"))
        deadline = time.monotonic() + 180  # generous: the first segment, 1 s of timer, a bounded stop
        while worker.alive() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert worker.exit_code is not None, f"worker still running: {worker.log_tail()}"
        assert worker.exit_code != 0
        log = worker.log_text()
        assert "worker unhealthy, exiting for a restart: batcher died: RuntimeError: injected collector fault" in log
    finally:
        worker.stop()


@pytest.mark.broker
@pytest.mark.slow
def test_a_dead_letter_the_broker_refuses_stops_the_worker_and_commits_nothing_past_it(
        kafka_settings: Settings, start_worker: Any) -> None:
    """An undecodable frame whose dead letter cannot be published is neither processed nor dead-lettered:
    the worker must exit non-zero with nothing committed past it (it used to raise out of the audio agent,
    which faust restarted quietly, and the other frames of its batch were lost)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient({"bootstrap.servers": kafka_settings.bootstrap})
    refuse_letters = ConfigResource(  # any dead letter is larger than 64 bytes
        ConfigResource.Type.TOPIC, kafka_settings.topic_dead_letters,
        incremental_configs=[ConfigEntry("max.message.bytes", "64", incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([refuse_letters]).values():
        future.result(30)
    worker = start_worker(unhealthy_exit_timeout_s="6")
    producer = Producer({"bootstrap.servers": kafka_settings.bootstrap})
    delivered: list[Any] = []
    producer.produce(kafka_settings.topic_audio, key=b"call-undecodable", value=b"\x00not an audio frame",
                     on_delivery=lambda err, msg: delivered.append(msg))
    assert producer.flush(30) == 0 and delivered
    bad = delivered[0]

    deadline = time.monotonic() + 120
    while worker.alive() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert worker.exit_code is not None, f"worker still running: {worker.log_tail()}"
    assert worker.exit_code != 0
    assert f"dead letter of {kafka_settings.topic_audio}[{bad.partition()}]@{bad.offset()} failed" in worker.log_text()
    committed = committed_offsets(kafka_settings, kafka_settings.worker_id, kafka_settings.topic_audio)
    assert committed.get(bad.partition(), 0) <= bad.offset()  # the next worker reads it again
