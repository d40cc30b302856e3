"""Accuracy per evaluation set and telephony condition, ours beside the reference implementation.

Ours is the worker's path (``systems.Ours``: each recording as a leg through the VAD segmenter, segments
of many recordings decoded together in batches of ``max_batch``, the no-speech rule applied). The reference
is faster-whisper on the same CTranslate2 weights the model is built from (int8, greedy, 30 s windows each
after the previous window's text, no timestamps): what a user would otherwise run. Both get the same 16 kHz audio of each utterance under
each condition. Reported per (set, condition, system): corpus WER, and, where the set's references say
numbers, digit-sequence accuracy (a sequence is exact when the hypothesis says exactly the reference's
digits, in order) and the digit error rate.

The sets: ``eval`` (pipeline.eval.dataset, 20 wide-band recordings), ``asterisk`` (the Asterisk core
prompts, 8 kHz telephony recordings of a professional voice), ``library-numbers`` (the call library's
spoken card, date, code and phone numbers, when the library is built) and ``library-legs`` (each leg of
each library call whole: conversation, where a leg's previous text is context).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from pipeline.eval.call_library import LibraryNotBuilt, leg_utterances, number_utterances
from pipeline.eval.conditions import CONDITIONS, conditioned
from pipeline.eval.dataset import EvalUtterance, load_asterisk_set, load_eval_set
from pipeline.eval.numbers import DigitAccuracy, digit_accuracy, spoken_digits
from pipeline.eval.wer import word_errors

SETS: dict[str, Callable[[], list[EvalUtterance]]] = {
    "eval": load_eval_set,
    "asterisk": load_asterisk_set,
    "library-numbers": number_utterances,
    "library-legs": leg_utterances,
}


class Transcriber(Protocol):
    """A system under evaluation: a name, and texts for utterances (one text per utterance, in order)."""

    name: str

    def transcribe(self, utterances: Sequence[EvalUtterance]) -> list[str]: ...


@dataclass(frozen=True)
class AccuracyRow:
    """One system on one set under one condition."""

    set: str
    condition: str
    system: str
    utterances: int
    audio_s: float
    reference_words: int
    word_errors: int
    digit_sequences: int
    digit_sequences_exact: int
    reference_digits: int
    digit_errors: int
    wall_s: float

    @property
    def wer(self) -> float:
        return self.word_errors / self.reference_words if self.reference_words else 0.0

    @property
    def digits_exact_rate(self) -> float | None:
        return self.digit_sequences_exact / self.digit_sequences if self.digit_sequences else None

    def as_json(self) -> dict[str, Any]:
        rate = self.digits_exact_rate
        return {**asdict(self), "wer": round(self.wer, 4),
                "digits_exact_rate": None if rate is None else round(rate, 4),
                "digit_error_rate": round(self.digit_errors / self.reference_digits, 4) if self.reference_digits
                else None,
                "audio_s_per_wall_s": round(self.audio_s / self.wall_s, 2) if self.wall_s > 0 else None}


def load_sets(names: Iterable[str]) -> dict[str, list[EvalUtterance]]:
    """The named sets; a set whose source is missing raises with the one line that says what to install."""
    unknown = [n for n in names if n not in SETS]
    if unknown:
        raise ValueError(f"unknown set(s) {', '.join(unknown)}; expected some of {', '.join(SETS)}")
    try:
        return {name: SETS[name]() for name in names}
    except LibraryNotBuilt as exc:
        raise LibraryNotBuilt(f"sets library-numbers and library-legs: {exc}") from exc


def score(set_name: str, condition: str, system: str, utterances: Sequence[EvalUtterance], texts: Sequence[str],
          wall_s: float) -> AccuracyRow:
    errors = words = 0
    for u, text in zip(utterances, texts, strict=True):
        counted = word_errors(u.reference, text)
        errors += counted.errors
        words += counted.reference_words
    digits = digit_score(utterances, texts)
    return AccuracyRow(set_name, condition, system, len(utterances), round(sum(u.duration_s for u in utterances), 2),
                       words, errors, digits.sequences, digits.exact, digits.reference_digits, digits.digit_errors,
                       round(wall_s, 2))


def digit_score(utterances: Sequence[EvalUtterance], texts: Sequence[str]) -> DigitAccuracy:
    """Digit-sequence accuracy over the utterances whose reference says digits."""
    pairs = [(spoken_digits(u.reference), text) for u, text in zip(utterances, texts, strict=True)]
    return digit_accuracy([(ref, text) for ref, text in pairs if ref])


def evaluate(systems: Sequence[Transcriber], sets: dict[str, list[EvalUtterance]], conditions: Sequence[str],
             progress: Callable[[str], None] = lambda _: None) -> list[AccuracyRow]:
    """Every system on every set under every condition, one after the other."""
    unknown = [c for c in conditions if c not in CONDITIONS]
    if unknown:
        raise ValueError(f"unknown condition(s) {', '.join(unknown)}; expected some of {', '.join(CONDITIONS)}")
    rows = []
    for set_name, utterances in sets.items():
        for condition in conditions:
            audio = conditioned(utterances, condition)
            for system in systems:
                progress(f"{system.name}: {set_name} ({len(audio)} utterances), {condition}")
                started = time.perf_counter()
                texts = system.transcribe(audio)
                rows.append(score(set_name, condition, system.name, audio, texts, time.perf_counter() - started))
    return rows


# ---- the report ------------------------------------------------------------------------------------------
def comparison(rows: Sequence[AccuracyRow], ours: str = "ours", reference: str = "faster-whisper") -> list[dict[str, Any]]:
    """Per (set, condition): each system's WER and digit accuracy side by side, and ours minus the reference
    in WER points (the issue's goal: at most +0.5)."""
    table: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        entry = table.setdefault((row.set, row.condition), {"set": row.set, "condition": row.condition,
                                                             "words": row.reference_words,
                                                             "digit_sequences": row.digit_sequences})
        entry[f"wer_{row.system}"] = round(row.wer, 4)
        entry[f"digits_exact_{row.system}"] = None if row.digits_exact_rate is None else round(row.digits_exact_rate, 4)
    for entry in table.values():
        if f"wer_{ours}" in entry and f"wer_{reference}" in entry:
            entry["wer_points_over_reference"] = round(100 * (entry[f"wer_{ours}"] - entry[f"wer_{reference}"]), 2)
    return list(table.values())
