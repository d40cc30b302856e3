"""Word error rate with the text normalisation that makes Whisper output comparable to references.

Normalisation: lower case; "&" -> "and", "%" -> "percent"; hyphens and slashes become spaces; other
punctuation goes (apostrophes too, on both sides alike); "mr" -> "mister" (and mrs, dr); numbers are
spelt out, ordinals too ("13th" -> "thirteenth"). A number in the hypothesis may be read as a cardinal ("10" -> "ten"), digit by digit
("2934" -> "two nine three four") or, with four digits, as two pairs ("nineteen eighty four"): each
reading is tried and the one closest to the reference counts, because the reference spells out what
the speaker said and the digits alone do not say which reading that was.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.eval.numbers import cardinal, ordinal, spellings

ABBREVIATIONS = {"mr": "mister", "mrs": "missus", "dr": "doctor"}
# Beyond this many number tokens in one hypothesis, only the cardinal reading is tried.
MAX_READING_COMBINATIONS = 256

_THOUSANDS_SEPARATOR = re.compile(r"(?<=\d),(?=\d{3}\b)")
_ORDINAL = re.compile(r"\b(\d+)(?:st|nd|rd|th)\b")
_DECIMAL = re.compile(r"(\d+)\.(\d+)")
_NUMBER_WITH_UNIT = re.compile(r"(\d)([a-z])")  # "10m" -> "10 m", "5th" stays readable
_PUNCTUATION = re.compile(r"[^\w\s]|_")


@dataclass(frozen=True)
class WordErrors:
    """Edit counts of one or many hypotheses against their references."""

    substitutions: int
    deletions: int
    insertions: int
    reference_words: int

    @property
    def errors(self) -> int:
        return self.substitutions + self.deletions + self.insertions

    @property
    def wer(self) -> float:
        return self.errors / self.reference_words if self.reference_words else float(self.errors > 0)

    def __add__(self, other: WordErrors) -> WordErrors:
        return WordErrors(
            self.substitutions + other.substitutions,
            self.deletions + other.deletions,
            self.insertions + other.insertions,
            self.reference_words + other.reference_words,
        )


def tokens(text: str) -> list[str]:
    """Lower-case words with punctuation removed; numbers are left as digit strings."""
    text = text.lower().replace("&", " and ").replace("%", " percent ")
    text = _THOUSANDS_SEPARATOR.sub("", text)
    text = _ORDINAL.sub(lambda m: " ".join(ordinal(int(m[1]))), text)
    text = _DECIMAL.sub(r"\1 point \2", text)
    text = re.sub(r"[-/]", " ", text)
    text = _NUMBER_WITH_UNIT.sub(r"\1 \2", text)
    text = _PUNCTUATION.sub("", text)
    return [ABBREVIATIONS.get(word, word) for word in text.split()]


def normalize_text(text: str) -> str:
    """``text`` normalised, numbers spelt as cardinals (the form references use)."""
    return " ".join(_spell(tokens(text), {}))


def word_errors(reference: str, hypothesis: str) -> WordErrors:
    """Edits turning the normalised reference into the best reading of the normalised hypothesis."""
    ref = _spell(tokens(reference), {})
    best: WordErrors | None = None
    for hyp in _readings(tokens(hypothesis)):
        counts = _align(ref, hyp)
        if best is None or counts.errors < best.errors:
            best = counts
    assert best is not None
    return best


def word_error_rate(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """Corpus WER: all edits over all reference words."""
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    total = WordErrors(0, 0, 0, 0)
    for ref, hyp in zip(references, hypotheses, strict=True):
        total = total + word_errors(ref, hyp)
    return total.wer


def _readings(words: list[str]) -> list[list[str]]:
    numbers = [w for w in words if w.isdigit()]
    options = [spellings(n) for n in numbers]
    combinations = 1
    for o in options:
        combinations *= len(o)
    if combinations > MAX_READING_COMBINATIONS:
        return [_spell(words, {})]
    readings = []
    for choice in itertools.product(*options):
        readings.append(_spell(words, dict(enumerate(choice))))
    return readings


def _spell(words: list[str], chosen: dict[int, list[str]]) -> list[str]:
    """Words with the k-th number replaced by ``chosen[k]`` (its cardinal when not chosen)."""
    spelt: list[str] = []
    k = 0
    for word in words:
        if word.isdigit():
            spelt.extend(chosen.get(k) or cardinal(int(word)))
            k += 1
        else:
            spelt.append(word)
    return spelt


def _align(ref: list[str], hyp: list[str]) -> WordErrors:
    """Levenshtein alignment over words, counting each kind of edit on one cheapest path."""
    # cost[j] holds (errors, substitutions, deletions, insertions) for ref[:i] vs hyp[:j]
    previous = [(j, 0, 0, j) for j in range(len(hyp) + 1)]
    for i, ref_word in enumerate(ref, start=1):
        current = [(i, 0, i, 0)]
        for j, hyp_word in enumerate(hyp, start=1):
            e, s, d, n = previous[j - 1]
            match = (e, s, d, n) if ref_word == hyp_word else (e + 1, s + 1, d, n)
            e, s, d, n = previous[j]
            deletion = (e + 1, s, d + 1, n)
            e, s, d, n = current[j - 1]
            insertion = (e + 1, s, d, n + 1)
            current.append(min(match, deletion, insertion))
        previous = current
    _, substitutions, deletions, insertions = previous[-1]
    return WordErrors(substitutions, deletions, insertions, len(ref))
