"""Digit sequences in ASR text, written ("4111 1111") or spoken ("four one double one", "oh four").

Callers read card numbers digit by digit, in groups ("forty one eleven"), with "oh" for zero and
"double"/"triple" for repeats; ASR writes some of it as numerals and some as words. This module turns a
text into runs of digits, each with the character span it covers, so the redactor can decide what a run is
(card, SSN, phone, CVV, expiry) and replace exactly that span.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

UNITS = {
    "zero": 0, "oh": 0, "o": 0, "one": 1, "two": 2, "three": 3, "four": 4,
    "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
}  # fmt: skip
TEENS = {
    "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15,
    "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19,
}  # fmt: skip
TENS = {
    "twenty": 20,
    "thirty": 30,
    "forty": 40,
    "fifty": 50,
    "sixty": 60,
    "seventy": 70,
    "eighty": 80,
    "ninety": 90,
}
REPEATS = {"double": 2, "triple": 3}
# Tokens that may sit between the groups of one number ("4111-1111", "555.123.4567", "12/25", "four dash two";
# "9:28": an expiry "oh nine twenty-eight" that a model wrote as a time).
# Fillers too: "four one one one, um, one one one one" is one number read with a pause.
SEPARATORS = {"-", ".", ",", "/", ":", "(", ")", "dash", "hyphen", "um", "uh", "er", "erm", "ah", "hmm"}

_TOKEN = re.compile(r"\d+|[A-Za-z]+(?:'[A-Za-z]+)?|[^\sA-Za-z\d]")


@dataclass(frozen=True)
class Token:
    text: str
    start: int
    end: int

    @property
    def lower(self) -> str:
        return self.text.lower()


@dataclass(frozen=True)
class NumberItem:
    """One number as said or written: its digits and the tokens it spans."""

    digits: str
    first: int  # index of its first token
    last: int  # index of its last token


@dataclass(frozen=True)
class DigitRun:
    """Numbers that follow each other with only separators between them: one candidate identifier."""

    items: tuple[NumberItem, ...]
    start: int  # character offsets in the text
    end: int

    @property
    def digits(self) -> str:
        return "".join(item.digits for item in self.items)

    @property
    def group_lengths(self) -> list[int]:
        return [len(item.digits) for item in self.items]


def tokenize(text: str) -> list[Token]:
    return [Token(m.group(), m.start(), m.end()) for m in _TOKEN.finditer(text)]


def _unit_at(tokens: list[Token], i: int) -> int | None:
    if i >= len(tokens):
        return None
    word = tokens[i].lower
    if word in UNITS:
        return UNITS[word]
    return int(word) if word.isdigit() and len(word) == 1 else None


def _tens_value(tokens: list[Token], i: int) -> tuple[str, int] | None:
    """'forty one' -> ('41', 2 tokens), 'forty' -> ('40', 1), 'eleven' -> ('11', 1)."""
    word = tokens[i].lower
    if word in TEENS:
        return str(TEENS[word]), 1
    if word in TENS:
        unit = _unit_at(tokens, i + 1) if i + 1 < len(tokens) and tokens[i + 1].lower in UNITS else None
        if unit is not None and unit > 0 and tokens[i + 1].lower not in ("oh", "o"):
            return str(TENS[word] + unit), 2
        return str(TENS[word]), 1
    return None


def _item_at(tokens: list[Token], i: int) -> NumberItem | None:
    """The number starting at token i, or None."""
    word = tokens[i].lower
    if word.isdigit():
        return NumberItem(word, i, i)
    if word in REPEATS:
        unit = _unit_at(tokens, i + 1)
        return NumberItem(str(unit) * REPEATS[word], i, i + 1) if unit is not None else None
    tens = _tens_value(tokens, i)
    if tens is not None:
        return NumberItem(tens[0], i, i + tens[1] - 1)
    if word in UNITS:
        return _hundreds_or_unit(tokens, i)
    return None


def _hundreds_or_unit(tokens: list[Token], i: int) -> NumberItem:
    """'four hundred twelve' -> 412 (said of CVVs); a lone unit word is one digit."""
    unit = UNITS[tokens[i].lower]
    if i + 1 >= len(tokens) or tokens[i + 1].lower != "hundred" or unit == 0:
        return NumberItem(str(unit), i, i)
    j = i + 2
    if j < len(tokens) and tokens[j].lower == "and":
        j += 1
    rest = _tens_value(tokens, j) if j < len(tokens) else None
    if rest is not None:
        return NumberItem(f"{unit}{int(rest[0]):02d}", i, j + rest[1] - 1)
    tail = _unit_at(tokens, j) if j < len(tokens) and tokens[j].lower in UNITS else None
    if tail is not None:
        return NumberItem(f"{unit}0{tail}", i, j)
    return NumberItem(f"{unit}00", i, i + 1)


def number_items(tokens: list[Token]) -> list[NumberItem]:
    items: list[NumberItem] = []
    i = 0
    while i < len(tokens):
        item = _item_at(tokens, i)
        if item is None:
            i += 1
            continue
        items.append(item)
        i = item.last + 1
    return items


def digit_runs(text: str) -> tuple[list[Token], list[DigitRun]]:
    """The tokens of text and its runs of numbers joined only by separators."""
    tokens = tokenize(text)
    runs: list[list[NumberItem]] = []
    for item in number_items(tokens):
        if runs and all(t.lower in SEPARATORS for t in tokens[runs[-1][-1].last + 1 : item.first]):
            runs[-1].append(item)
        else:
            runs.append([item])
    return tokens, [
        DigitRun(tuple(run), tokens[run[0].first].start, tokens[run[-1].last].end) for run in runs
    ]


def luhn_valid(digits: str) -> bool:
    """The Luhn checksum every payment card number carries."""
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = int(char)
        if position % 2 == 1:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0
