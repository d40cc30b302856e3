"""What callers say about themselves, found in ASR text for the redactor (redaction.py): street addresses,
dates of birth, and the context words that make a bare number a bank account, a routing number or a PIN.

ASR writes numbers as words or numerals at will and drops punctuation ("the third of march nineteen
eighty four and twelve oak street"), so these work on words:

- [ADDRESS]: a house number (numerals, or up to six number words) then at most three name words then a
  street type ("12 Oak Street", "four twenty one elm avenue apartment 3"), always: the shape is rare
  elsewhere, and "10 minutes down the road" is kept out by the words a street name is never made of;
- [DOB]: in date-of-birth context, a date said any way ("the third of March 1984", "march 3rd 84",
  "oh three oh three nineteen eighty four", "3/3/1984"): the run of date words around a month or two
  numbers. Dates elsewhere (appointments, due dates) are left alone;
- [ACCOUNT], [ROUTING], [PIN] and a ZIP code in [ADDRESS]: digit runs in their context (redaction.py's
  ``_personal_marker``), this module only names the context words;
- [NAME], only with ``qa_redact_names``: up to three words after "my name is", or the short answer to a
  question for a name.

Measured on hand-labelled ASR-style turns (tests/qa/data/personal_pii.yaml, tests/qa/test_personal_redaction.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pipeline.qa.numbers import TEENS, TENS, UNITS, Token

MONTHS = (
    "january", "february", "march", "april", "may", "june",
    "july", "august", "september", "october", "november", "december",
)  # fmt: skip

# Context words (lower-cased text) that make what follows, in the next few segments, personal data.
CONTEXT_KEYWORDS: dict[str, re.Pattern[str]] = {
    # "data birth", "date a birth": how ASR often hears "date of birth" on a phone line.
    "DOB": re.compile(r"\b((date|data) (of |a )?birth|birth ?date|d\.?o\.?b|birthday|born)\b"),
    # "email address" is EMAIL's, not a place.
    "ADDRESS": re.compile(r"\b((?<!email )(?<!e-mail )address|zip( code)?|post ?code|postal code)\b"),
    "BANK": re.compile(r"\b(bank account|account number|checking|savings|iban)\b"),
    "ROUTING": re.compile(r"\b(routing( number)?|aba|sort code|transit number)\b"),
    "PIN": re.compile(r"\b(pin( number| code)?|passcode|pass code)\b"),
    "NAME": re.compile(r"\b(your (full |first |last )?name|name on the (card|account)|surname|spell (your|the) name)\b"),
}

_NUMBER_WORDS = {*UNITS, *TEENS, *TENS, "hundred", "thousand"}
# A house number: numerals, or up to ten number words ("one two three double four five").
_HOUSE_WORDS = "|".join(sorted(_NUMBER_WORDS | {"double", "triple"}))
_NUMBER = rf"(?:\d+[a-z]?|(?:{_HOUSE_WORDS})(?:[\s-]+(?:{_HOUSE_WORDS})){{0,9}})"
_SUFFIXES = ("street", "st", "avenue", "ave", "road", "rd", "lane", "ln", "drive", "dr", "boulevard", "blvd",
             "court", "ct", "way", "place", "pl", "terrace", "circle", "crescent", "close", "parkway", "highway",
             "square", "trail", "row")
# Words a street's name is never made of: "10 minutes down the road", "2 of them on the way".
_NOT_A_NAME = {"the", "a", "an", "to", "of", "in", "on", "at", "up", "down", "my", "your", "our", "their", "this",
               "that", "and", "or", "is", "was", "it", "minutes", "minute", "hours", "hour", "days", "day",
               "weeks", "week", "months", "years", "dollars", "times", "more", "other", "same", "whole", "by",
               "for", "from", "with", "all", "just", "only", "miles", "blocks", "houses", "doors"}
_ADDRESS = re.compile(
    rf"\b(?P<house>{_NUMBER})\s+(?P<name>(?:[a-z]+\s+){{0,3}}?)(?:{'|'.join(_SUFFIXES)})\b"
    r"(?:\s*,?\s*(?:apartment|apt|unit|suite|flat)\s+(?:\d+[a-z]?|[a-z]+))?",
    re.IGNORECASE,
)
_ORDINALS = {
    "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth", "eleventh",
    "twelfth", "thirteenth", "fourteenth", "fifteenth", "sixteenth", "seventeenth", "eighteenth", "nineteenth",
    "twentieth", "thirtieth",
}
_DATE_WORDS = {*MONTHS, *_ORDINALS, *_NUMBER_WORDS, "of", "the", "st", "nd", "rd", "th"}  # "3rd": "3", "rd"
_DATE_SEPARATORS = {"/", "-", ".", ","}
_NUMERAL_DATE = re.compile(r"^\d{1,4}(st|nd|rd|th)?$")


@dataclass(frozen=True)
class PersonalSpan:
    start: int
    end: int
    marker: str


# Just after an address was asked for or given: a house number and a name ASR did not hear as a street ("22 May
# Post-Reet" for "22 Maple Street"), up to the next pause in the text. The name must start with a capital, which
# keeps "22 boxes" out.
_HOUSE_IN_CONTEXT = re.compile(rf"\b(?P<house>{_NUMBER})\s+(?P<name>[A-Z][\w'-]*(?:[ \t]+[A-Za-z][\w'-]*){{0,2}})",
                               re.IGNORECASE)


def address_spans(text: str, context: set[str] | frozenset[str] = frozenset()) -> list[PersonalSpan]:
    """Street addresses (a number, a name, a street word); in ADDRESS context also a number and a capitalised name."""
    spans = []
    for m in _ADDRESS.finditer(text):
        name = m.group("name").lower().split()
        if any(word in _NOT_A_NAME for word in name):
            continue
        spans.append(PersonalSpan(m.start(), m.end(), "ADDRESS"))
    if "ADDRESS" in context:
        for m in _HOUSE_IN_CONTEXT.finditer(text):
            name = m.group("name")
            words = name.lower().split()
            if (not name[0].isupper() or words[0] in _NOT_A_NAME or words[0] in _NUMBER_WORDS
                    or any(a.start < m.end() and m.start() < a.end for a in spans)):
                continue
            spans.append(PersonalSpan(m.start(), m.end(), "ADDRESS"))
    return spans


def date_spans(tokens: list[Token]) -> list[PersonalSpan]:
    """Runs of date words that hold a month, or two numbers, and a number: the dates said in the text."""
    spans = []
    i = 0
    while i < len(tokens):
        if not _date_token(tokens[i]):
            i += 1
            continue
        j = i
        while j + 1 < len(tokens) and (_date_token(tokens[j + 1]) or _joining_and(tokens, j + 1)):
            j += 1
        run = tokens[i:j + 1]
        while run and run[0].lower in ("of", "the", *_DATE_SEPARATORS):
            run = run[1:]
        while run and run[-1].lower in ("of", "the", *_DATE_SEPARATORS):
            run = run[:-1]
        numbers = sum(1 for t in run if _NUMERAL_DATE.match(t.lower) or t.lower in _NUMBER_WORDS
                      or t.lower in _ORDINALS)
        has_month = any(t.lower in MONTHS for t in run)
        # A date has at most eight digits (dd mm yyyy): a longer run of numerals is another number.
        digits = sum(len(t.text) for t in run if t.text.isdigit())
        if run and numbers >= 1 and (has_month or numbers >= 2) and digits <= 8:
            spans.append(PersonalSpan(run[0].start, run[-1].end, "DOB"))
        i = j + 1
    return spans


def _joining_and(tokens: list[Token], i: int) -> bool:
    """"and" inside a number said in words ("two thousand and one"), not between two things said."""
    return (tokens[i].lower == "and" and i + 1 < len(tokens) and tokens[i - 1].lower in _NUMBER_WORDS
            and tokens[i + 1].lower in _NUMBER_WORDS)


def _date_token(token: Token) -> bool:
    word = token.lower
    return word in _DATE_WORDS or word in _DATE_SEPARATORS or bool(_NUMERAL_DATE.match(word)) \
        or (word.endswith(("st", "nd", "rd", "th")) and word[:-2].isdigit())


# What an answer to "your name?" starts with before the name, and words a name is never made of.
_ANSWER_START = {"yes", "yeah", "yep", "sure", "okay", "ok", "um", "uh", "it's", "it", "is", "its", "my", "name",
                 "name's", "that's", "thats", "the", "on", "card", "account", "so", "well", "oh"}
_NOT_A_NAME_WORD = _NOT_A_NAME | _ANSWER_START | _NUMBER_WORDS | {"i", "i'm", "sorry", "please", "thanks", "thank",
                                                                  "you", "calling", "about", "here", "speaking"}


def name_spans(tokens: list[Token], context: set[str]) -> list[PersonalSpan]:
    """[NAME] (only with qa_redact_names): up to three name words after "my name is", or the answer to a
    question for a name (a short answer: its words after "yes, it's")."""
    words = [t for t in tokens if t.text[:1].isalpha()]
    spans: list[PersonalSpan] = []
    for i, t in enumerate(words[:-1]):
        if t.lower == "name" and words[i + 1].lower == "is" or t.lower == "name's":
            start = i + (2 if t.lower == "name" else 1)
            spans += _name_after(words, start)
    if "NAME" in context and len(words) <= 6 and not spans:
        start = 0
        while start < len(words) and words[start].lower in _ANSWER_START:
            start += 1
        spans += _name_after(words, start)
    return spans


def _name_after(words: list[Token], start: int) -> list[PersonalSpan]:
    end = start
    while end < len(words) and end - start < 3 and words[end].lower not in _NOT_A_NAME_WORD:
        end += 1
    return [PersonalSpan(words[start].start, words[end - 1].end, "NAME")] if end > start else []


def routing_valid(digits: str) -> bool:
    """An ABA routing number's checksum (3-7-1 weights): a 9-digit number in routing context that fails it
    is still redacted as an account number, not a routing number."""
    if len(digits) != 9 or not digits.isdigit():
        return False
    weights = (3, 7, 1) * 3
    return sum(int(d) * w for d, w in zip(digits, weights, strict=True)) % 10 == 0
