"""The worker's view of the shared SegmentBatcher: audio in, a Transcription out, hot model reload."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from pipeline.asr.batcher import ModelVersionError, SegmentBatcher
from pipeline.asr.engine import Engine
from pipeline.asr.manifest import ModelIntegrityError, model_versions
from pipeline.asr.results import AudioSegment
from pipeline.config import Settings
from pipeline.worker.calls import Transcription
from pipeline.worker.metrics import WorkerMetrics

log = logging.getLogger("callqa.worker")


class BatcherTranscriber:
    def __init__(self, engine: Engine, metrics: WorkerMetrics) -> None:
        self.engine = engine
        self.batcher: SegmentBatcher = engine.new_batcher()
        self.metrics = metrics
        self._refused: set[int] = set()
        metrics.model_version.set(self.batcher.recognizer.version)

    @classmethod
    def from_settings(cls, settings: Settings, metrics: WorkerMetrics) -> BatcherTranscriber:
        return cls(Engine.load(settings.model, settings=settings), metrics)

    async def start(self) -> None:
        await self.batcher.start()

    async def close(self) -> None:
        await self.batcher.close()

    async def transcribe(self, audio_16k: np.ndarray) -> Transcription:
        self.metrics.batcher_queue_depth.set(self.batcher.queued)
        n_ms = len(audio_16k) // 16
        r = await self.batcher.submit(AudioSegment(0, n_ms, audio_16k))
        self.metrics.inference_seconds.observe(r.timings.inference_ms / 1000)
        return Transcription(
            text=r.text, avg_logprob=r.avg_logprob, no_speech_prob=r.no_speech_prob, confidence=r.confidence,
            model_name=r.model, model_version=r.model_version, batch_size=r.timings.batch_size,
            batcher_wait_ms=r.timings.queue_wait_ms, inference_ms=r.timings.inference_ms,
            is_silence=r.is_silence,
        )

    async def reload_if_newer(self) -> bool:
        """Swap to a newer built version of the running model; in-flight batches finish on the old one."""
        settings = self.engine.settings
        running = self.batcher.recognizer
        versions = model_versions(Path(settings.models_dir), running.name)
        if not versions or versions[-1] == running.version or versions[-1] in self._refused:
            return False
        folder = Path(settings.models_dir) / running.name / str(versions[-1])
        try:
            recognizer = await self.batcher.reload(folder, settings)
        except (ModelVersionError, ModelIntegrityError) as exc:  # lower version, tampered, old format
            self._refused.add(versions[-1])  # said once, not at every look
            log.warning("model reload refused: %s", exc)
            return False
        log.warning("model %s: now version %d (was %d)", recognizer.name, recognizer.version, running.version)
        self.metrics.model_version.set(recognizer.version)
        return True
