"""Accuracy on the 20 real evaluation utterances in the three telephony conditions, against faster-whisper
on the same audio and weights (int8, greedy)."""

from __future__ import annotations

import pytest

from pipeline.asr.recognizer import Recognizer
from pipeline.asr.results import AudioSegment, TranscriptResult
from pipeline.eval.dataset import EvalUtterance
from pipeline.eval.wer import word_error_rate

MAX_WER = 0.08
MAX_WORSE_THAN_REFERENCE = 0.02


def _ours(recognizer: Recognizer, utterances: list[EvalUtterance]) -> list[str]:
    segments = [AudioSegment(0, int(u.duration_s * 1000), u.audio) for u in utterances]
    slots = recognizer.recognize(segments)
    assert all(isinstance(s, TranscriptResult) for s in slots)
    return [s.text for s in slots if isinstance(s, TranscriptResult)]


@pytest.mark.parametrize("condition", ["16k", "8k", "8k-mulaw"])
def test_wer_within_target_and_close_to_faster_whisper(
    recognizer: Recognizer, faster_whisper_int8, eval_sets: dict[str, list[EvalUtterance]], condition: str
) -> None:
    utterances = eval_sets[condition]
    references = [u.reference for u in utterances]
    ours = word_error_rate(references, _ours(recognizer, utterances))
    theirs_text = [
        " ".join(
            s.text
            for s in faster_whisper_int8.transcribe(u.audio, beam_size=1, condition_on_previous_text=False)[0]
        )
        for u in utterances
    ]
    theirs = word_error_rate(references, theirs_text)
    print(f"{condition}: ours {ours:.3f}, faster-whisper {theirs:.3f}")
    assert ours <= MAX_WER
    assert ours <= theirs + MAX_WORSE_THAN_REFERENCE
