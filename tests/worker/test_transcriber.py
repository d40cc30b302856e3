"""BatcherTranscriber's metrics: the queue-depth gauge is read when scraped, not set at submit."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np

from pipeline.asr.engine import Engine
from pipeline.asr.results import SegmentTimings, TranscriptResult
from pipeline.config import Settings
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.transcriber import BatcherTranscriber


class EchoRecognizer:
    """Says "ok" for every segment (no model: this is about the transcriber's bookkeeping)."""

    name, version = "echo", 1
    window = SimpleNamespace(window_frames=lambda frames: 3000)

    def recognize(self, segments: Any, waits: Any = None, wide: bool = False, on_result: Any = None,
                  contexts: Any = None) -> list[Any]:
        return [TranscriptResult(s.start_ms, s.end_ms, "ok", -0.1, 0.0, self.name, self.version, (), SegmentTimings())
                for s in segments]


def queue_depth(metrics: WorkerMetrics) -> float | None:
    return metrics.registry.get_sample_value("callqa_batcher_queue_depth")


async def test_queue_depth_is_what_waits_now_also_after_the_last_submit() -> None:
    metrics = WorkerMetrics()
    transcriber = BatcherTranscriber(Engine(EchoRecognizer(), Settings()), metrics)  # type: ignore[arg-type]
    audio = np.zeros(16000, np.float32)
    waiting = [asyncio.create_task(transcriber.transcribe(audio)) for _ in range(3)]
    await asyncio.sleep(0.05)  # the batcher has not started: all three wait in its queue
    assert queue_depth(metrics) == 3
    await transcriber.start()
    results = await asyncio.wait_for(asyncio.gather(*waiting), 10)
    await transcriber.close()
    assert [r.text for r in results] == ["ok"] * 3
    assert queue_depth(metrics) == 0  # set at submit time, it would still read 2
