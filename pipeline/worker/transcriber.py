"""The worker's view of the shared SegmentBatcher: audio in, a Transcription out, hot model reload."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipeline.asr.batcher import BatcherDeadError, ModelVersionError, SegmentBatcher
from pipeline.asr.canary import ModelCanaryError
from pipeline.asr.engine import Engine
from pipeline.asr.manifest import MANIFEST_FILE, ModelFormatError, ModelIntegrityError, model_versions
from pipeline.asr.results import AudioSegment
from pipeline.asr.signing import SIGNATURE_FILE, ModelSignatureError
from pipeline.config import Settings
from pipeline.worker.metrics import WorkerMetrics
from pipeline.worker.ports import TranscriberDeadError, Transcription

log = logging.getLogger("callqa.worker")


class BatcherTranscriber:
    def __init__(self, engine: Engine, metrics: WorkerMetrics) -> None:
        self.engine = engine
        self.batcher: SegmentBatcher = engine.new_batcher()
        self.metrics = metrics
        self._refused: set[str] = set()  # fingerprints of refused version folders
        metrics.model_version.set(self.batcher.recognizer.version)
        # Read at each scrape: a value set at submit time goes stale when submits stop (the live
        # benchmark's drain check read a last "1 queued" forever).
        metrics.batcher_queue_depth.set_function(lambda: self.batcher.queued)

    @classmethod
    def from_settings(cls, settings: Settings, metrics: WorkerMetrics) -> BatcherTranscriber:
        return cls(Engine.load(settings.model, settings=settings, defer=True), metrics)

    async def start(self) -> None:
        await self.batcher.start()

    @property
    def error(self) -> BaseException | None:
        """Why the shared batcher's collector died (see ``SegmentBatcher.error``), or None."""
        return self.batcher.error

    async def close(self) -> None:
        await self.batcher.close()

    @property
    def idle(self) -> bool:
        return self.batcher.idle

    async def transcribe(self, audio_16k: np.ndarray, context: Sequence[int] = (), preview: bool = False,
                         ) -> Transcription:
        n_ms = len(audio_16k) // 16
        try:
            r = await self.batcher.submit(AudioSegment(0, n_ms, audio_16k), context, preview=preview)
        except BatcherDeadError as exc:
            raise TranscriberDeadError(str(exc)) from exc
        self.metrics.inference_seconds.observe(r.timings.inference_ms / 1000)
        return Transcription(
            text=r.text, avg_logprob=r.avg_logprob, no_speech_prob=r.no_speech_prob, confidence=r.confidence,
            model_name=r.model, model_version=r.model_version, batch_size=r.timings.batch_size,
            batcher_wait_ms=r.timings.queue_wait_ms, inference_ms=r.timings.inference_ms,
            is_silence=r.is_silence, tokens=r.tokens,
        )

    async def reload_if_newer(self) -> bool:
        """Swap to a newer built version of the running model; in-flight batches finish on the old one.
        A version refused (not newer, altered, unsigned or wrongly signed, failed canary) is logged and
        counted once, and looked at again only when its folder changes (e.g. signed after the build)."""
        settings = self.engine.settings
        running = self.batcher.recognizer
        versions = model_versions(Path(settings.models_dir), running.name)
        if not versions or versions[-1] == running.version:
            return False
        folder = Path(settings.models_dir) / running.name / str(versions[-1])
        looked_at = folder_fingerprint(folder)
        if looked_at in self._refused:
            return False
        try:
            recognizer = await self.batcher.reload(folder, settings)
        except (ModelVersionError, ModelIntegrityError) as exc:
            self._refused.add(looked_at)  # said once, not at every look
            self.metrics.model_reloads_refused.labels(refusal_reason(exc)).inc()
            log.warning("model reload refused: %s", exc)
            return False
        log.warning("model %s: now version %d (was %d)", recognizer.name, recognizer.version, running.version)
        self.metrics.model_version.set(recognizer.version)
        return True


def refusal_reason(exc: Exception) -> str:
    """The metric label of a refused reload (one of metrics.MODEL_REFUSAL_REASONS)."""
    for kind, reason in (
        (ModelVersionError, "version"),
        (ModelFormatError, "format"),
        (ModelSignatureError, "signature"),
        (ModelCanaryError, "canary"),
    ):
        if isinstance(exc, kind):
            return reason
    return "integrity"


def folder_fingerprint(folder: Path) -> str:
    """What a version folder holds, cheaply: its manifest and signature bytes, and each file's size and
    modification time. A refused folder that is then fixed (signed, rebuilt) gets a new fingerprint."""
    digest = hashlib.sha256(str(folder).encode())
    for name in (MANIFEST_FILE, SIGNATURE_FILE):
        with contextlib.suppress(OSError):
            digest.update(name.encode() + (folder / name).read_bytes())
    with contextlib.suppress(OSError):
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            info = entry.stat()
            digest.update(f"{entry.name}:{info.st_size}:{info.st_mtime_ns};".encode())
    return digest.hexdigest()
