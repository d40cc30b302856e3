"""One Moonshine model version behind the Recognizer contract the SegmentBatcher, the canary, the engine
and the evaluation use: segments in (16 kHz samples), ``TranscriptResult``s out, a bad segment failing
only its own slot. ``load_recognizer`` (recognizers.py) returns one for a folder whose manifest says
``family: moonshine``.

What differs from Whisper: the samples go in as they are (no log-mel, no window: the encoder's cost
follows the audio); decoding is greedy only (``beam_size`` is Whisper's); there is no previous-text
prompt (``contexts`` are ignored: a contact center's vocabulary goes in as hot words instead,
``CALLQA_HOT_WORDS``, hot_words.py); no longer window exists to retry a looping row in, so a row stopped by
the token cap or a loop keeps its text cut to the loop's first copy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from pipeline.asr.blas_threads import limit_blas_threads
from pipeline.asr.decoding import WindowPolicy
from pipeline.asr.hot_words import hot_word_list
from pipeline.asr.moonshine_model import MoonshineDecoder, MoonshineOnnx, MoonshineOptions
from pipeline.asr.recognizer import DecodedText, Recognizer, checked_audio
from pipeline.asr.results import SegmentAudio
from pipeline.asr.signing import trusted_key
from pipeline.config.asr import AsrSettings


def moonshine_options(settings: AsrSettings) -> MoonshineOptions:
    return MoonshineOptions(
        window=WindowPolicy(settings.window_bucket_s),
        compression_ratio_max=settings.compression_ratio_max,
        tail_pad_s=settings.moonshine_tail_pad_ms / 1000,
        hot_words=hot_word_list(settings.hot_words),
        hot_word_boost=settings.hot_word_boost,
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
        """Load a Moonshine model version, as ``Recognizer.load`` loads Whisper's (BLAS pool limited too)."""
        limit_blas_threads(settings.blas_threads)
        model = MoonshineOnnx.load(folder, settings.graphs_for("moonshine"), settings.intra_op_threads, trusted_key(settings))
        return cls(model, moonshine_options(settings))

    def _features(self, segment: SegmentAudio) -> np.ndarray:
        return checked_audio(segment)

    def _decode_rows(
        self,
        mels: list[np.ndarray],
        segments: list[SegmentAudio],
        wide: bool,
        final: Callable[[int, DecodedText], None],
        contexts: Sequence[Sequence[int]] | None,
    ) -> Sequence[DecodedText]:
        # ``mels`` holds each segment's samples here (``_features``); ``wide`` and ``contexts`` are Whisper's.
        return self.decoder.decode(mels, final)

