"""What the ASR hands back for one speech segment."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

# faster-whisper's rule for dropping a segment as silence: both must hold.
NO_SPEECH_THRESHOLD = 0.6
LOGPROB_THRESHOLD = -1.0


class SegmentAudio(Protocol):
    """A closed speech segment: pipeline.segmentation.SpeechSegment satisfies it."""

    @property
    def start_ms(self) -> int: ...

    @property
    def end_ms(self) -> int: ...

    @property
    def audio(self) -> np.ndarray: ...


@dataclass(frozen=True)
class AudioSegment:
    """A plain SegmentAudio, for callers that have audio but no segmenter (files, tests)."""

    start_ms: int
    end_ms: int
    audio: np.ndarray


@dataclass(frozen=True)
class SegmentTimings:
    """Where one segment's time went: waiting in the batcher, then inference, from its batch's start until
    its own result was final (a row that ends early is released while the rest of its batch decodes)."""

    queue_wait_ms: float = 0.0
    batch_size: int = 1
    inference_ms: float = 0.0


@dataclass(frozen=True)
class TranscriptResult:
    start_ms: int
    end_ms: int
    text: str
    avg_logprob: float
    no_speech_prob: float
    model: str
    model_version: int
    tokens: tuple[int, ...] = ()
    timings: SegmentTimings = field(default_factory=SegmentTimings)
    channel: int = 0  # channel of a multi-channel file (stereo calls: one leg per channel)

    @property
    def confidence(self) -> float:
        """Geometric-mean token probability, 0..1."""
        return float(min(1.0, math.exp(self.avg_logprob)))

    @property
    def is_silence(self) -> bool:
        """faster-whisper's no-speech rule: likely no speech and a low-confidence decode."""
        return self.no_speech_prob > NO_SPEECH_THRESHOLD and self.avg_logprob < LOGPROB_THRESHOLD

    def as_dict(self) -> dict[str, object]:
        return {
            "start_ms": self.start_ms,
            "end_ms": self.end_ms,
            "text": self.text,
            "avg_logprob": round(self.avg_logprob, 4),
            "no_speech_prob": round(self.no_speech_prob, 4),
            "confidence": round(self.confidence, 4),
            "model": self.model,
            "model_version": self.model_version,
            "tokens": list(self.tokens),
            "channel": self.channel,
            "timings": {k: round(v, 2) if isinstance(v, float) else v for k, v in vars(self.timings).items()},
        }
