"""The call processor's ports: where messages go and who transcribes segments (fakes in unit tests)."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from pipeline.contracts.messages import Message


class OutputPort(Protocol):
    """Where contract messages go (Kafka in the worker). Returns an awaitable that resolves on delivery."""

    async def publish(self, topic: str, key: str, message: Message | None, partition: int) -> Awaitable[Any]:
        """``partition``: the input (audio) partition whose input the message accounts for: with exactly
        once, it goes in that partition's transaction. ``message`` None: a tombstone for ``key`` (a
        compacted topic's record deleted)."""
        ...


@dataclass(frozen=True)
class Transcription:
    text: str
    avg_logprob: float
    no_speech_prob: float
    confidence: float
    model_name: str
    model_version: int
    batch_size: int
    batcher_wait_ms: float
    inference_ms: float
    is_silence: bool = False  # Whisper's no-speech verdict: no transcript is emitted
    tokens: tuple[int, ...] = ()  # the text's token ids: the leg's context for its next segment


class TranscriberDeadError(RuntimeError):
    """The transcriber cannot transcribe anything any more (its batcher died): no segment's fault."""


class SegmentTranscriber(Protocol):
    """The shared micro-batcher, seen from the worker: waits (back-pressure) when its queue is full."""

    async def transcribe(self, audio_16k: np.ndarray, context: Sequence[int] = (), preview: bool = False,
                         ) -> Transcription:
        """``context``: tokens of the leg's previous text to decode after (empty: none). ``preview``: a
        partial transcript, which gives way to finals and may be dropped (``PreviewDroppedError``)."""
        ...

    @property
    def idle(self) -> bool:
        """Nothing queued or being decoded: spare capacity (early decoding uses only that)."""
        ...
