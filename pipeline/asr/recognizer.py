"""One loaded model version turning a batch of speech segments into transcripts (synchronous).

Both the sync engine path and the async SegmentBatcher call `Recognizer.recognize`; a bad segment (empty,
non-finite, too long) or a failure while decoding it yields an exception in its own slot only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

import numpy as np

from pipeline.asr.blas_threads import limit_blas_threads
from pipeline.asr.decoding import DecodeOptions, GreedyDecoder, WindowPolicy
from pipeline.asr.onnx_model import WhisperOnnx
from pipeline.asr.results import SegmentAudio, SegmentTimings, TranscriptResult
from pipeline.asr.signing import trusted_key
from pipeline.audio.mel import SAMPLE_RATE, log_mel_spectrogram
from pipeline.config.asr import AsrSettings

MAX_SEGMENT_S = 30.0

class DecodedText(Protocol):
    """What a model family's decoder gives per row (Whisper's ``DecodedSegment``, Moonshine's ``MoonshineDecoded``)."""

    @property
    def tokens(self) -> Sequence[int]: ...
    @property
    def text(self) -> str: ...
    @property
    def avg_logprob(self) -> float: ...
    @property
    def no_speech_prob(self) -> float: ...


SegmentOutcome = Callable[[int, "TranscriptResult | Exception"], None]
"""Called (in the inference thread) with a segment's index in the batch and its outcome, once final."""


class SegmentRejectedError(ValueError):
    """A segment's audio cannot be transcribed (empty, not finite, longer than Whisper's 30 s window)."""


def decode_options(settings: AsrSettings, model: WhisperOnnx) -> DecodeOptions:
    return DecodeOptions(
        window=WindowPolicy(settings.window_bucket_s),
        max_tokens_per_second=settings.max_tokens_per_second,
        full_window_retry=settings.full_window_retry,
        compression_ratio_max=settings.compression_ratio_max,
        retry_bucket_s=settings.retry_window_bucket_s,
        suppress_ids=tuple(model.manifest.suppress_ids),
        suppress_ids_begin=tuple(model.manifest.suppress_ids_begin),
        context_tokens=settings.context_tokens,
        beam_size=settings.beam_size,
        min_tokens_per_second=settings.min_tokens_per_second,
        retry_whole_twice=settings.retry_whole_twice,
        retry_logprob=settings.retry_logprob,
    )


def wide_encoder_threads(setting: int) -> int:
    """Threads of the idle-time encoder: the setting, or (0) every core this process may run on."""
    if setting > 0:
        return setting
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def segment_features(segment: SegmentAudio) -> np.ndarray:
    """Log-mel [n_mels, frames] of a segment's 16 kHz audio, after checking it is usable."""
    return log_mel_spectrogram(checked_audio(segment))


def checked_audio(segment: SegmentAudio) -> np.ndarray:
    """A segment's 16 kHz samples as float32, after checking they are usable (SegmentRejectedError)."""
    audio = np.asarray(segment.audio)
    if audio.ndim != 1 or audio.size < SAMPLE_RATE // 100:
        raise SegmentRejectedError(
            f"segment {segment.start_ms}-{segment.end_ms} ms: need mono audio of >= 10 ms"
        )
    if audio.size > MAX_SEGMENT_S * SAMPLE_RATE:
        raise SegmentRejectedError(
            f"segment {segment.start_ms}-{segment.end_ms} ms: longer than {MAX_SEGMENT_S} s"
        )
    if not np.isfinite(audio).all():
        raise SegmentRejectedError(f"segment {segment.start_ms}-{segment.end_ms} ms: audio has NaN or inf")
    return audio.astype(np.float32, copy=False)


class Recognizer:
    """A model version and its greedy decoder; `recognize` may run in several threads at once."""

    def __init__(self, model: WhisperOnnx, options: DecodeOptions) -> None:
        self.model = model
        self.decoder = GreedyDecoder(model, options)

    @classmethod
    def load(cls, folder: Path, settings: AsrSettings) -> Recognizer:
        """Load a Whisper model version; signed by the trusted key when settings name one. (A folder of
        either family: ``pipeline.asr.recognizers.load_recognizer``.) The loading process's BLAS pool is
        limited to ``settings.blas_threads`` (blas_threads.py: a process that loads a recognizer decodes
        with it)."""
        limit_blas_threads(settings.blas_threads)
        model = WhisperOnnx.load(folder, settings.graphs_for("whisper"), settings.intra_op_threads, trusted_key(settings),
                                 wide_encoder_threads(settings.idle_encoder_threads))
        return cls(model, decode_options(settings, model))

    @property
    def name(self) -> str:
        return self.model.manifest.name

    @property
    def version(self) -> int:
        return self.model.manifest.version

    @property
    def window(self) -> WindowPolicy:
        """How long an encoder window each segment gets (the batcher groups segments by it)."""
        return self.decoder.options.window

    def recognize(
        self,
        segments: Sequence[SegmentAudio],
        queue_waits_ms: Sequence[float] | None = None,
        wide: bool = False,
        on_result: SegmentOutcome | None = None,
        contexts: Sequence[Sequence[int]] | None = None,
    ) -> list[TranscriptResult | Exception]:
        """Transcribe the segments as one batch; each slot holds its result or its own exception.
        ``wide``: nothing else waits for the cores, so the encoder may use them all (same text).
        ``on_result``: hears of each slot as soon as it is final (at most once per slot), so a caller
        can hand a short segment's text on while a long one in the same batch still decodes.
        ``contexts``: per segment, the tokens of its leg's previous text (see ``LegContext``), or none."""
        waits = list(queue_waits_ms) if queue_waits_ms is not None else [0.0] * len(segments)
        told: set[int] = set()

        def tell(i: int, outcome: TranscriptResult | Exception) -> TranscriptResult | Exception:
            if isinstance(outcome, TranscriptResult):
                outcome = replace(outcome, timings=replace(outcome.timings, queue_wait_ms=waits[i]))
            if on_result is not None and i not in told:
                told.add(i)
                on_result(i, outcome)
            return outcome

        def tell_row(row: int, outcome: TranscriptResult | Exception) -> None:
            tell(usable[row], outcome)

        slots: list[TranscriptResult | Exception] = []
        usable: list[int] = []
        mels: list[np.ndarray] = []
        for i, segment in enumerate(segments):
            try:
                mels.append(self._features(segment))
                usable.append(i)
                slots.append(SegmentRejectedError("not decoded"))
            except Exception as exc:  # noqa: BLE001 - any bad input fails only its own slot
                slots.append(tell(i, exc))
        decoded = self._decode_isolating(
            mels, [segments[i] for i in usable], wide, tell_row if on_result is not None else None,
            [contexts[i] for i in usable] if contexts is not None else None,
        )
        for i, result in zip(usable, decoded, strict=True):
            slots[i] = tell(i, result)
        return slots

    def _features(self, segment: SegmentAudio) -> np.ndarray:
        """What the model's ``_decode`` takes for a segment: Whisper's log-mel."""
        return segment_features(segment)

    def _decode_isolating(
        self,
        mels: list[np.ndarray],
        segments: list[SegmentAudio],
        wide: bool = False,
        on_result: SegmentOutcome | None = None,
        contexts: Sequence[Sequence[int]] | None = None,
    ) -> list[TranscriptResult | Exception]:
        """Decode together; if the batch fails, decode each alone so only the culprit fails. (A row told
        final before the failure keeps that result: its decoding had ended.)"""
        if not mels:
            return []
        try:
            return list(self._decode(mels, segments, wide, on_result, contexts))
        except Exception as exc:  # noqa: BLE001
            if len(mels) == 1:
                return [exc]
        out: list[TranscriptResult | Exception] = []
        for row, (mel, segment) in enumerate(zip(mels, segments, strict=True)):
            alone = _renumbered(on_result, row)
            out.extend(self._decode_isolating(
                [mel], [segment], wide, alone, [contexts[row]] if contexts is not None else None
            ))
        return out

    def _decode(
        self,
        mels: list[np.ndarray],
        segments: list[SegmentAudio],
        wide: bool = False,
        on_result: SegmentOutcome | None = None,
        contexts: Sequence[Sequence[int]] | None = None,
    ) -> list[TranscriptResult]:
        started = time.perf_counter()

        def result(row: int, decoded: DecodedText) -> TranscriptResult:
            timings = SegmentTimings(batch_size=len(mels), inference_ms=(time.perf_counter() - started) * 1000)
            return self._result(decoded, segments[row], timings)

        def final(row: int, decoded: DecodedText) -> None:
            if on_result is not None:
                on_result(row, result(row, decoded))

        decoded = self._decode_rows(mels, segments, wide, final, contexts)
        return [result(row, d) for row, d in enumerate(decoded)]

    def _decode_rows(
        self,
        mels: list[np.ndarray],
        segments: list[SegmentAudio],
        wide: bool,
        final: Callable[[int, DecodedText], None],
        contexts: Sequence[Sequence[int]] | None,
    ) -> Sequence[DecodedText]:
        """The model family's decoding of one batch; ``final`` is told each row as soon as it is final."""
        decoded, _ = self.decoder.decode(
            mels, [np.asarray(s.audio).size / SAMPLE_RATE for s in segments], wide, final, contexts
        )
        return decoded

    def _result(
        self, decoded: DecodedText, segment: SegmentAudio, timings: SegmentTimings
    ) -> TranscriptResult:
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


def _renumbered(on_result: SegmentOutcome | None, row: int) -> SegmentOutcome | None:
    """``on_result`` for a one-segment sub-batch that is the batch's row ``row``."""
    if on_result is None:
        return None
    return lambda _, outcome: on_result(row, outcome)
