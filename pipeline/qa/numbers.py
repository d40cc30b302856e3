"""Digit sequences in ASR text, written ("4111 1111") or spoken ("four one double one", "oh four").

Callers read card numbers digit by digit, in groups ("forty one eleven"), with "oh" for zero and
"double"/"triple" for repeats; ASR writes some of it as numerals and some as words. This module turns a
text into runs of digits, each with the character span it covers, so the redactor can decide what a run is
(card, SSN, phone, CVV, expiry) and replace exactly that span.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import NamedTuple

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
_NUMBER_START = {*UNITS, *TEENS, *TENS, *REPEATS, "a"}
# What ASR writes for a digit said on a phone line ("zero to one": 0 2 1; "four for one": 4 4 1): read as the
# digit only beside a digit said alone (``digit_runs(..., lenient=True)``, inside a sensitive exchange), so
# "two for one" in a sentence stays words.
SOUND_ALIKE = {"to": 2, "too": 2, "for": 4, "fore": 4, "won": 1, "ate": 8, "niner": 9, "nought": 0, "naught": 0}
# Tokens that may sit between the groups of one number ("4111-1111", "555.123.4567", "12/25", "four dash two";
# "9:28": an expiry "oh nine twenty-eight" that a model wrote as a time).
# Fillers too: "four one one one, um, one one one one" is one number read with a pause.
SEPARATORS = {"-", ".", ",", "/", ":", "(", ")", "dash", "hyphen", "um", "uh", "er", "erm", "ah", "hmm"}

_TOKEN = re.compile(r"\d+|[A-Za-z]+(?:'[A-Za-z]+)?|[^\sA-Za-z\d]")


class Token(NamedTuple):
    text: str
    start: int
    end: int
    lower: str  # the text lower-cased, once: the readers ask for it tens of times per token


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
    """The words, digit groups and marks of ``text``. Cached: one segment's text is read by several
    finders (numbers, dates, labels), and the callers only read the list."""
    return list(_tokens(text))


def clear_caches() -> None:
    """Forget the texts read so far (a benchmark's rounds each start cold, as a live final is new)."""
    _tokens.cache_clear()
    _digit_runs.cache_clear()


@functools.lru_cache(maxsize=256)
def _tokens(text: str) -> tuple[Token, ...]:
    return tuple(Token(m.group(), m.start(), m.end(), m.group().lower()) for m in _TOKEN.finditer(text))


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
    if not (word.isdigit() or word in _NUMBER_START):
        return None
    thousands = _thousands_at(tokens, i)
    if thousands is not None:
        return thousands
    hundreds = _below_thousand(tokens, i) if not word.isdigit() else None
    if hundreds is not None and any(t.lower == "hundred" for t in tokens[i : hundreds[1] + 1]):
        return NumberItem(str(hundreds[0]), i, hundreds[1])  # "twelve hundred", "a hundred and twenty"
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


def _below_thousand(tokens: list[Token], i: int) -> tuple[int, int] | None:
    """'four hundred and twelve' / 'twelve hundred' / 'forty two' / 'a hundred' -> (value, last token index)."""
    if i >= len(tokens):
        return None
    word = tokens[i].lower
    if word in ("a", "one") and i + 1 < len(tokens) and tokens[i + 1].lower == "hundred":
        head, last = 1, i
    elif word in TEENS or word in TENS:
        tens = _tens_value(tokens, i)
        assert tens is not None
        head, last = int(tens[0]), i + tens[1] - 1
    elif word in UNITS and word not in ("oh", "o"):
        head, last = UNITS[word], i
    elif word.isdigit() and len(word) <= 3:
        head, last = int(word), i
    else:
        return None
    if last + 1 < len(tokens) and tokens[last + 1].lower == "hundred" and 0 < head < 100:
        value, last = head * 100, last + 1
        j = last + 1 + (last + 1 < len(tokens) and tokens[last + 1].lower == "and")
        if j < len(tokens) and (tokens[j].lower in TEENS or tokens[j].lower in TENS):
            rest = _tens_value(tokens, j)
            assert rest is not None
            return value + int(rest[0]), j + rest[1] - 1
        if j < len(tokens) and tokens[j].lower in UNITS and tokens[j].lower not in ("oh", "o"):
            return value + UNITS[tokens[j].lower], j
        return value, last
    return head, last


def _thousands_at(tokens: list[Token], i: int) -> NumberItem | None:
    """'two thousand and one' -> 2001, 'twelve thousand three hundred forty five' -> 12345: only a number
    said with "thousand" (a house number, an amount, a year); the rest is read by ``_item_at``."""
    head = _below_thousand(tokens, i)
    if head is None or head[1] + 1 >= len(tokens) or tokens[head[1] + 1].lower != "thousand":
        return None
    value, last = head[0] * 1000, head[1] + 1
    j = last + 1 + (last + 1 < len(tokens) and tokens[last + 1].lower == "and")
    rest = _below_thousand(tokens, j) if j < len(tokens) and not tokens[j].lower.isdigit() else None
    if rest is not None:
        value, last = value + rest[0], rest[1]
    return NumberItem(str(value), i, last)


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


def _sound_alikes(tokens: list[Token], items: list[NumberItem]) -> list[NumberItem]:
    """``items`` with the sound-alike words ("to", "for") beside a number, and "double for" as two digits;
    again until none is added ("seven to for": both). A turn that is nothing but such words ("for.") is a
    chunk of digits on its own."""
    words = [i for i, t in enumerate(tokens) if t.text[0].isalnum()]
    if not items and words and all(tokens[i].lower in SOUND_ALIKE for i in words):
        return [NumberItem(str(SOUND_ALIKE[tokens[i].lower]), i, i) for i in words]
    while True:
        added = _sound_alikes_once(tokens, items)
        if len(added) == len(items):
            return added
        items = added


def _sound_alikes_once(tokens: list[Token], items: list[NumberItem]) -> list[NumberItem]:
    beside = {item.first - 1 for item in items} | {item.last + 1 for item in items}
    for item in items:  # past a comma or dash too: "4111, for 5123"
        if item.first >= 2 and tokens[item.first - 1].text in ",-":
            beside.add(item.first - 2)
        if item.last + 2 < len(tokens) and tokens[item.last + 1].text in ",-":
            beside.add(item.last + 2)
    taken = {i for item in items for i in range(item.first, item.last + 1)}
    extra = []
    for i, token in enumerate(tokens):
        if token.lower not in SOUND_ALIKE or i in taken:
            continue
        repeat = REPEATS.get(tokens[i - 1].lower) if i > 0 and i - 1 not in taken else None
        if repeat is not None:
            extra.append(NumberItem(str(SOUND_ALIKE[token.lower]) * repeat, i - 1, i))
        elif i in beside:
            extra.append(NumberItem(str(SOUND_ALIKE[token.lower]), i, i))
    return sorted(items + extra, key=lambda item: item.first)


def digit_runs(text: str, lenient: bool = False) -> tuple[list[Token], list[DigitRun]]:
    """The tokens of text and its runs of numbers joined only by separators (``lenient``: sound-alike words
    beside digits count as digits)."""
    tokens, runs = _digit_runs(text, lenient)
    return list(tokens), list(runs)


@functools.lru_cache(maxsize=256)
def _digit_runs(text: str, lenient: bool) -> tuple[tuple[Token, ...], tuple[DigitRun, ...]]:
    tokens = tokenize(text)
    items = number_items(tokens)
    if lenient:
        items = _sound_alikes(tokens, items)
    runs: list[list[NumberItem]] = []
    for item in items:
        if runs and all(t.lower in SEPARATORS for t in tokens[runs[-1][-1].last + 1 : item.first]):
            runs[-1].append(item)
        else:
            runs.append([item])
    return tuple(tokens), tuple(
        DigitRun(tuple(run), tokens[run[0].first].start, tokens[run[-1].last].end) for run in runs
    )


def luhn_valid(digits: str) -> bool:
    """The Luhn checksum every payment card number carries."""
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = int(char)
        if position % 2 == 1:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0
