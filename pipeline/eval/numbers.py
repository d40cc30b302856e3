"""Numbers in evaluation: spelt out in English words, so "10" and "ten" compare equal in WER; and the
digit-sequence accuracy of spoken numbers (card, phone and security-code digits: exact sequences and a
digit error rate), the measure that shows whether ASR keeps the digits redaction needs to see."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
        "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
SCALES = [(10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand")]


def cardinal(n: int) -> list[str]:
    """``n`` >= 0 as cardinal words: 2934 -> two thousand nine hundred thirty four."""
    if n < 20:
        return [ONES[n]]
    if n < 100:
        return [TENS[n // 10]] + ([ONES[n % 10]] if n % 10 else [])
    if n < 1000:
        return [ONES[n // 100], "hundred"] + (cardinal(n % 100) if n % 100 else [])
    for value, name in SCALES:
        if n >= value:
            return cardinal(n // value) + [name] + (cardinal(n % value) if n % value else [])
    raise AssertionError("unreachable")  # pragma: no cover


# Ordinals whose spelling is not cardinal + "th".
_IRREGULAR_ORDINALS = {"one": "first", "two": "second", "three": "third", "five": "fifth", "eight": "eighth",
                       "nine": "ninth", "twelve": "twelfth"}


def ordinal(n: int) -> list[str]:
    """``n`` >= 0 as ordinal words: 13 -> thirteenth, 21 -> twenty first, 100 -> one hundredth."""
    words = cardinal(n)
    last = words[-1]
    if last in _IRREGULAR_ORDINALS:
        words[-1] = _IRREGULAR_ORDINALS[last]
    elif last.endswith("y"):
        words[-1] = last[:-1] + "ieth"
    else:
        words[-1] = last + "th"
    return words


def digit_by_digit(digits: str) -> list[str]:
    """Each digit as its own word: 2934 -> two nine three four."""
    return [ONES[int(d)] for d in digits]


def paired(digits: str) -> list[str] | None:
    """Four digits read as two pairs, as years and room numbers are (1984 -> nineteen eighty four)."""
    if len(digits) != 4 or digits[0] == "0" or digits[2] == "0":
        return None
    return cardinal(int(digits[:2])) + cardinal(int(digits[2:]))


def spellings(digits: str) -> list[list[str]]:
    """The distinct ways a digit string may be spoken."""
    options = [cardinal(int(digits)), digit_by_digit(digits)]
    pairs = paired(digits)
    if pairs:
        options.append(pairs)
    unique: list[list[str]] = []
    for option in options:
        if option not in unique:
            unique.append(option)
    return unique


def spoken_digits(text: str) -> str:
    """Every digit ``text`` says, written or spoken ("four one double one, oh 5" -> "411105"), in order.

    Uses the redactor's reading of numbers (``pipeline.qa.numbers``), so what is measured here is what
    redaction sees.
    """
    from pipeline.qa.numbers import digit_runs  # the QA reader; imported here to keep eval's imports light

    return "".join(run.digits for run in digit_runs(text)[1])


def digit_edit_distance(reference: str, hypothesis: str) -> int:
    """Digits substituted, dropped or added (Levenshtein over the two digit strings)."""
    previous = list(range(len(hypothesis) + 1))
    for i, ref in enumerate(reference, 1):
        current = [i]
        for j, hyp in enumerate(hypothesis, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref != hyp)))
        previous = current
    return previous[-1]


@dataclass(frozen=True)
class DigitAccuracy:
    """Digit-sequence accuracy of spoken numbers: how many came out exactly, and the digit error rate."""

    sequences: int
    exact: int
    digit_errors: int
    reference_digits: int

    @property
    def exact_rate(self) -> float:
        return self.exact / self.sequences if self.sequences else 1.0

    @property
    def digit_error_rate(self) -> float:
        return self.digit_errors / self.reference_digits if self.reference_digits else 0.0


def digit_accuracy(pairs: Sequence[tuple[str, str]]) -> DigitAccuracy:
    """Score (reference digits, hypothesis text) pairs: the hypothesis's digits are read from its text."""
    exact = errors = total = 0
    for reference, text in pairs:
        said = spoken_digits(text)
        exact += said == reference
        errors += digit_edit_distance(reference, said)
        total += len(reference)
    return DigitAccuracy(len(pairs), exact, errors, total)
