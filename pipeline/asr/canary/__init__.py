"""The canary: a known utterance a model version must transcribe before it takes traffic.

Signatures and sha256s prove who built a model and that its files are the ones built, not that it
works: a correctly signed build from broken weights, or one whose graphs no longer suit this code,
would otherwise go live and write wrong transcripts for every call. So `Engine.load` (at start) and
`SegmentBatcher.reload` (hot swap) first run the new recognizer on `canary.ulaw` (a real recording
shipped inside the package, see README.md here) and refuse the model when the normalised text is
further than `model_canary_max_wer` from the known transcript; on a hot swap the old model keeps serving.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from pipeline.asr.manifest import ModelIntegrityError
from pipeline.asr.recognizer import Recognizer
from pipeline.asr.recognizers import load_recognizer
from pipeline.asr.results import AudioSegment
from pipeline.audio.files import load_audio
from pipeline.audio.mel import SAMPLE_RATE
from pipeline.audio.resample import resample
from pipeline.config.asr import AsrSettings
from pipeline.eval.wer import word_errors

CANARY_AUDIO = Path(__file__).with_name("canary.ulaw")
CANARY_RATE = 8000
CANARY_TRANSCRIPT = (
    "and mister john dashwood had then leisure to consider how much there might be prudently in his "
    "power to do for them"
)
HEARD_CHARS = 80  # a broken model can babble up to its token cap; the log line stays one short line


class ModelCanaryError(ModelIntegrityError):
    """A model transcribed the canary utterance wrongly (or failed on it): it must not take traffic."""


@dataclass(frozen=True)
class CanaryResult:
    text: str
    wer: float


@lru_cache(maxsize=1)
def canary_audio_16k() -> np.ndarray:
    """The canary as the recognizer takes audio: mono float32 at 16 kHz."""
    audio = load_audio(CANARY_AUDIO)
    return resample(audio.mono(), audio.sample_rate, SAMPLE_RATE)


def run_canary(recognizer: Recognizer, max_wer: float) -> CanaryResult:
    """Transcribe the canary with `recognizer`; ModelCanaryError naming the folder if it is wrong."""
    audio = canary_audio_16k()
    where = recognizer.model.folder
    slot = recognizer.recognize([AudioSegment(0, audio.size * 1000 // SAMPLE_RATE, audio)])[0]
    if isinstance(slot, Exception):
        raise ModelCanaryError(f"{where}: refused: canary inference failed ({type(slot).__name__}: {slot})")
    wer = word_errors(CANARY_TRANSCRIPT, slot.text).wer
    if wer > max_wer:
        heard = slot.text.strip()
        heard = heard if len(heard) <= HEARD_CHARS else heard[:HEARD_CHARS] + "…"
        raise ModelCanaryError(
            f"{where}: refused: canary WER {wer:.0%} > {max_wer:.0%} (heard {heard!r})"
        )
    return CanaryResult(slot.text, wer)


def load_checked(folder: Path, settings: AsrSettings) -> Recognizer:
    """Load a model version (signature and sha256s checked) and, unless switched off, run the canary.
    Every refusal is a ModelIntegrityError, so a hot swap refuses it and keeps the running model."""
    try:
        recognizer = load_recognizer(folder, settings)
    except ModelIntegrityError:
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. a signed, intact folder whose graphs ONNX Runtime rejects
        reason = (str(exc).strip().splitlines() or [""])[0][:200]
        raise ModelIntegrityError(f"{folder}: refused: cannot load it ({type(exc).__name__}: {reason})") from exc
    if settings.model_canary:
        run_canary(recognizer, settings.model_canary_max_wer)
    return recognizer
