"""PII redaction of transcript segments, applied before any text leaves the worker (PCI DSS: card numbers
must never be stored in transcripts).

What is replaced, and by which marker:

- [PAN]: 13-19 digits, written or spoken, passing the Luhn check (a 16-digit number failing it is
  left alone: order and account numbers are not cards);
- [SSN]: US social security numbers, written 3-2-4 ("123-45-6789") or any valid 9 digits when a social
  security number was just asked for or mentioned;
- [PHONE]: NANP numbers (10 digits, or 11 starting with 1), "+" international numbers, 7-digit local
  numbers when a phone number was just asked for;
- [EMAIL]: written addresses and spoken ones ("john dot smith at example dot com");
- [CVV] / [EXPIRY]: 3-4 digits / a month and year, only when the agent just asked for the security code
  or the expiry date. Without that context such short numbers are times, amounts and quantities.

Context lasts for the segment that mentions the keyword and the next ``context_segments`` segments of the
call (either leg): the customer answers, and the agent often reads the answer back.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from pipeline.qa.numbers import DigitRun, NumberItem, Token, digit_runs, luhn_valid
from pipeline.qa.segment import Segment

MARKERS = ("PAN", "SSN", "PHONE", "EMAIL", "CVV", "EXPIRY")

_CONTEXT_KEYWORDS: dict[str, re.Pattern[str]] = {
    "CVV": re.compile(
        r"\b(security code|cvv2?|cvc|card verification|(three|four|3|4)[- ]digit code|back of the card)\b"
    ),
    "EXPIRY": re.compile(r"\b(expiry|expiration|expires?|valid (thru|through)|exp date)\b"),
    "SSN": re.compile(r"\b(social security|ssn|social)\b"),
    "PHONE": re.compile(r"\b(phone|mobile|cell|call ?back|reach you|telephone)\b"),
}
MONTHS = (
    "january", "february", "march", "april", "may", "june",
    "july", "august", "september", "october", "november", "december",
)  # fmt: skip
_WRITTEN_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")
_DOT = r"(?:\s+dot\s+|\.)"
_SPOKEN_EMAIL = re.compile(
    r"\b(?P<local>[a-z0-9]+(?:(?:\s+(?:dot|underscore|dash|hyphen)\s+|[._-])[a-z0-9]+)*)\s+at\s+"
    rf"[a-z0-9]+(?:{_DOT}[a-z0-9]+)*{_DOT}(?:com|net|org|edu|gov|io|co|uk|us|ca|info|biz|me)\b",
    re.IGNORECASE,
)
# "visit us at acme dot com" names a web site, not a mailbox.
_NOT_A_MAILBOX = {
    "us",
    "me",
    "you",
    "him",
    "her",
    "them",
    "it",
    "look",
    "online",
    "visit",
    "website",
    "site",
    "is",
}


@dataclass(frozen=True)
class RedactedText:
    """A segment with its PII replaced by markers, same timing, and how many of each were replaced."""

    segment: Segment
    counts: dict[str, int]

    @property
    def text(self) -> str:
        return self.segment.text

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True)
class _Span:
    start: int
    end: int
    marker: str


def _email_spans(text: str) -> list[_Span]:
    spans = [_Span(m.start(), m.end(), "EMAIL") for m in _WRITTEN_EMAIL.finditer(text)]
    for m in _SPOKEN_EMAIL.finditer(text):
        local_words = re.split(r"\s+|[._-]", m.group("local").lower())
        if local_words[-1] not in _NOT_A_MAILBOX:
            spans.append(_Span(m.start(), m.end(), "EMAIL"))
    return spans


def _find_pan(run: DigitRun) -> tuple[int, int] | None:
    """The run itself if it is a card number; in a run too long to be one, its longest card-number stretch.

    A 13-19 digit run said digit by digit that fails Luhn is not searched further: one in ten of its
    sub-stretches would pass by chance, and an order number read out must stay readable. Written groups
    ("4111 1111 1111 1111 7 7") align sub-stretches with the groups, which keeps chance matches rare.
    """
    items = run.items
    grouped = any(len(item.digits) >= 3 for item in items)
    if 13 <= len(run.digits) <= 19 and not grouped:
        return (0, len(items)) if luhn_valid(run.digits) else None
    best: tuple[int, int] | None = None
    for i in range(len(items)):
        length = 0
        for j in range(i, len(items)):
            length += len(items[j].digits)
            if length > 19:
                break
            digits = "".join(item.digits for item in items[i : j + 1])
            longer = best is None or (j - i) > (best[1] - best[0])
            if length >= 13 and longer and luhn_valid(digits):
                best = (i, j + 1)
    return best


def _valid_ssn(digits: str) -> bool:
    area, group, serial = digits[:3], digits[3:5], digits[5:]
    return area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000"


def _nanp(digits: str) -> bool:
    return len(digits) == 10 and digits[0] in "23456789" and digits[3] in "23456789"


def _looks_like_expiry(run: DigitRun) -> bool:
    """Month then year: "12/25", "1225", "oh four twenty six", "four twenty six", "12 2026".

    The year must be said or written as one group (a card's year, 20-49 or 2020-2049): "seven three one"
    said digit by digit is a security code, not July 2031.
    """
    digits, groups = run.digits, run.group_lengths
    if len(digits) not in (3, 4, 6) or (len(groups) > 1 and groups[-1] < 2):
        return False
    if len(digits) == 3 and groups != [1, 2]:  # "123" written as one number is a code, not January 2023
        return False
    month_len = 1 if len(digits) == 3 else 2
    month, year = int(digits[:month_len]), digits[month_len:]
    year_ok = 20 <= int(year[-2:]) <= 49 and (len(year) == 2 or year[:2] == "20")
    return 1 <= month <= 12 and year_ok


@dataclass
class CallRedactor:
    """Redacts the segments of one call in order, remembering what the agent just asked for."""

    context_segments: int = 3
    _context: Counter[str] = field(default_factory=Counter)

    def _update_context(self, segment: Segment) -> set[str]:
        """Context types active for this segment; an agent's question opens them for the next segments."""
        lowered = segment.text.lower()
        mentioned = {kind for kind, pattern in _CONTEXT_KEYWORDS.items() if pattern.search(lowered)}
        active = mentioned | {kind for kind, left in self._context.items() if left > 0}
        for kind in list(self._context):
            self._context[kind] -= 1
        if segment.leg == "agent":
            for kind in mentioned:
                self._context[kind] = self.context_segments
        return active

    def _classify(self, run: DigitRun, tokens: list[Token], context: set[str]) -> list[_Span]:
        pan = _find_pan(run)
        if pan is not None:
            card = _sub_run(run.items[pan[0] : pan[1]], tokens)
            spans = [_Span(card.start, card.end, "PAN")]
            for rest in (run.items[: pan[0]], run.items[pan[1] :]):
                if rest:
                    spans += self._classify(_sub_run(rest, tokens), tokens, context)
            return spans
        marker = self._marker(run, tokens, context)
        if marker is not None:
            return [_Span(run.start, run.end, marker)]
        # A comma may group one number ("4111, 1111, ...") or list several ("731, 12/25"): try the parts.
        parts = _split_at_commas(run, tokens)
        return [span for part in parts if len(parts) > 1 for span in self._classify(part, tokens, context)]

    @staticmethod
    def _marker(run: DigitRun, tokens: list[Token], context: set[str]) -> str | None:
        digits, n = run.digits, len(run.digits)
        after_month = run.items[0].first > 0 and tokens[run.items[0].first - 1].lower in MONTHS
        if "EXPIRY" in context and (_looks_like_expiry(run) or (after_month and n in (2, 4))):
            return "EXPIRY"
        if "CVV" in context and n in (3, 4):
            return "CVV"
        if n == 9 and (run.group_lengths == [3, 2, 4] or "SSN" in context) and _valid_ssn(digits):
            return "SSN"
        if _nanp(digits) or (n == 11 and digits[0] == "1" and _nanp(digits[1:])):
            return "PHONE"
        international = run.items[0].first > 0 and tokens[run.items[0].first - 1].text == "+"
        if (international and 8 <= n <= 15) or (n == 7 and "PHONE" in context):
            return "PHONE"
        return None

    def _number_spans(self, text: str, context: set[str]) -> list[_Span]:
        tokens, runs = digit_runs(text)
        spans: list[_Span] = []
        for run in runs:
            for span in self._classify(run, tokens, context):
                spans.append(_widen(span, text, tokens))
        return spans

    def redact(self, segment: Segment) -> RedactedText:
        context = self._update_context(segment)
        text = segment.text
        emails = _email_spans(text)
        spans = emails + [s for s in self._number_spans(text, context) if not _overlaps(s, emails)]
        counts = Counter(s.marker for s in spans)
        for span in sorted(spans, key=lambda s: s.start, reverse=True):
            text = f"{text[: span.start]}[{span.marker}]{text[span.end :]}"
        return RedactedText(segment.with_text(text), dict(counts))


def _sub_run(items: tuple[NumberItem, ...], tokens: list[Token]) -> DigitRun:
    return DigitRun(items, tokens[items[0].first].start, tokens[items[-1].last].end)


def _split_at_commas(run: DigitRun, tokens: list[Token]) -> list[DigitRun]:
    parts: list[list[NumberItem]] = [[run.items[0]]]
    for previous, item in zip(run.items, run.items[1:], strict=False):
        if any(t.text == "," for t in tokens[previous.last + 1 : item.first]):
            parts.append([])
        parts[-1].append(item)
    return [_sub_run(tuple(part), tokens) for part in parts]


def _overlaps(span: _Span, others: list[_Span]) -> bool:
    return any(span.start < o.end and o.start < span.end for o in others)


def _widen(span: _Span, text: str, tokens: list[Token]) -> _Span:
    """Take in the '(' or '+' opening a phone number, and the month word said before an expiry year."""
    start = span.start
    if start > 0 and text[start - 1] in "(+":
        start -= 1
    if span.marker == "EXPIRY":
        before = [t for t in tokens if t.end <= start]
        if before and before[-1].lower in MONTHS:
            start = before[-1].start
    return _Span(start, span.end, span.marker)
