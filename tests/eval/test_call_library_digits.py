"""Digit-sequence accuracy on the call library's spoken numbers (cards, expiry dates, codes, SSN, phones).

Stored transcripts are redacted, so the numbers are measured offline: each turn that says one is cut from
its leg of the library WAV with 300 ms either side, sent through μ-law as the replay sends it, and
transcribed by the engine's front end (VAD) and recogniser, as a streamed leg is (the ``library-numbers``
guard of `callqa bench check`, whole: 23 spans, about 15 s).
"""

from __future__ import annotations

from pipeline.eval.call_library import number_utterances
from pipeline.eval.guards import numbers_guard


def test_digit_sequence_accuracy_of_the_library_numbers() -> None:
    result = numbers_guard(number_utterances())
    print("\n".join([str(result.figures), *result.details]))
    assert result.met, result.misses()
