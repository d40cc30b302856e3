"""Spelling numbers out in English words, so "10" and "ten" compare equal in WER."""

from __future__ import annotations

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
