"""One Moonshine model version behind the Recognizer contract the SegmentBatcher, the canary, the engine
and the evaluation use: segments in (16 kHz samples), ``TranscriptResult``s out, a bad segment failing
only its own slot. ``Recognizer.load`` returns one for a folder whose manifest says ``family: moonshine``.

What differs from Whisper: the samples go in as they are (no log-mel, no window: the encoder's cost
follows the audio); decoding is greedy only (``beam_size`` is Whisper's); there is no previous-text
prompt (``contexts`` are ignored); no longer window exists to retry a looping row in, so a row stopped by
the token cap or a loop keeps its text cut to the loop's first copy.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipeline.asr.decoding import WindowPolicy
from pipeline.asr.moonshine_model import MoonshineDecoded, MoonshineDecoder, MoonshineOnnx, MoonshineOptions
from pipeline.asr.recognizer import Recognizer, SegmentOutcome, checked_audio
from pipeline.asr.results import SegmentAudio, SegmentTimings, TranscriptResult
from pipeline.asr.signing import trusted_key
from pipeline.config.asr import AsrSettings


def moonshine_options(settings: AsrSettings) -> MoonshineOptions:
    return MoonshineOptions(
        window=WindowPolicy(settings.window_bucket_s),
        compression_ratio_max=settings.compression_ratio_max,
    )


class MoonshineRecognizer(Recognizer):
    """A Moonshine version and its batched greedy decoder; ``recognize`` may run in several threads."""

    model: MoonshineOnnx  # type: ignore[assignment]
    decoder: MoonshineDecoder  # type: ignore[assignment]

    def __init__(self, model: MoonshineOnnx, options: MoonshineOptions) -> None:
        self.model = model
        self.decoder = MoonshineDecoder(model, options)

    @classmethod
    def load(cls, folder: Path, settings: AsrSettings) -> MoonshineRecognizer:
        model = MoonshineOnnx.load(folder, settings.quantization, settings.intra_op_threads, trusted_key(settings))
        return cls(model, moonshine_options(settings))

    def _features(self, segment: SegmentAudio) -> np.ndarray:
        return checked_audio(segment)

    def _decode(
        self,
        mels: list[np.ndarray],
        segments: list[SegmentAudio],
        wide: bool = False,
        on_result: SegmentOutcome | None = None,
        contexts: Sequence[Sequence[int]] | None = None,
    ) -> list[TranscriptResult]:
        # ``mels`` holds each segment's samples here (``_features``); ``wide`` and ``contexts`` are Whisper's.
        started = time.perf_counter()

        def result(row: int, decoded: MoonshineDecoded) -> TranscriptResult:
            timings = SegmentTimings(batch_size=len(mels), inference_ms=(time.perf_counter() - started) * 1000)
            segment = segments[row]
            return TranscriptResult(
                start_ms=segment.start_ms,
                end_ms=segment.end_ms,
                text=decoded.text,
                avg_logprob=decoded.avg_logprob,
                no_speech_prob=decoded.no_speech_prob,
                model=self.name,
                model_version=self.version,
                tokens=tuple(decoded.tokens),
                timings=timings,
            )

        def final(row: int, decoded: MoonshineDecoded) -> None:
            if on_result is not None:
                on_result(row, result(row, decoded))

        decoded = self.decoder.decode(mels, final)
        return [result(row, d) for row, d in enumerate(decoded)]

