"""PII redaction of transcript segments, applied before any text leaves the worker (PCI DSS: card numbers
must never be stored in transcripts).

What is replaced, and by which marker:

- [PAN]: 13-19 digits, written or spoken, passing the Luhn check (a 16-digit number failing it is
  left alone: order and account numbers are not cards);
- [SSN]: US social security numbers, written 3-2-4 ("123-45-6789") or any valid 9 digits when a social
  security number was just asked for or mentioned;
- [PHONE]: NANP numbers (10 digits, or 11 starting with 1), "+" international numbers, any 7-15 digits
  when a phone number was just asked for;
- [EMAIL]: written addresses and spoken ones ("john dot smith at example dot com");
- [CVV] / [EXPIRY]: 3-4 digits / a month and year, only when the agent just asked for the security code
  or the expiry date, or a card number was just given (the question may have been misheard: "the code is
  321" right after the card number is its security code). Without that context such short numbers are
  times, amounts and quantities.

- [DOB], [ADDRESS], [ACCOUNT], [ROUTING], [PIN], [NAME]: what callers say about themselves (personal.py):
  street addresses always, a date in date-of-birth context, bank account and routing numbers and PINs in
  theirs, names only with ``qa_redact_names``.

Card context ("card" said by either leg, or a card number just given) also redacts what ASR makes of a
card number read out: a garbled one that fails Luhn, and the chunks of one read in pauses over several
segments ("four one one one ... one one one one"): any run of 4-19 digits there that is not an amount
("$45.20", "150 dollars") or a year ("since 2019") is [PAN].

Context lasts for the segment that mentions the keyword and the next ``context_segments`` segments of the
call (either leg) in time order: the customer answers, and the agent often reads the answer back. It is
judged by segment time, not by the order segments reach the redactor, so what a segment's text becomes
depends only on the segments that started before it (``CallAnalyzer`` in the worker holds segments until
those are known).
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from dataclasses import dataclass, field

from pipeline.qa.numbers import DigitRun, NumberItem, Token, digit_runs, luhn_valid, tokenize
from pipeline.qa.personal import (
    CONTEXT_KEYWORDS,
    MONTHS,
    address_spans,
    date_spans,
    name_spans,
    routing_valid,
)
from pipeline.qa.segment import Segment

MARKERS = ("PAN", "SSN", "PHONE", "EMAIL", "CVV", "EXPIRY", "DOB", "ADDRESS", "ACCOUNT", "ROUTING", "PIN", "NAME")
# A marker already in a segment's text: it was redacted before (a stored final a resumed call is rebuilt from).
_MARKER_IN_TEXT = re.compile(r"\[(" + "|".join(MARKERS) + r")\]")

_CONTEXT_KEYWORDS: dict[str, re.Pattern[str]] = {
    "CVV": re.compile(
        # "secure code", "security G-code", "secure iG code", "secure a G code" (a chaos run's decode of "the
        # security code on the back"): how ASR often renders a security-code question.
        r"\b(security code|cvv2?|cvc|card verification|(three|four|3|4)[- ]digit code|back of the card"
        r"|secur\w*\W+(\w+\W+){0,2}code)\b"
    ),
    "EXPIRY": re.compile(r"\b(expiry|expiration|expires?|valid (thru|through)|exp date)\b"),
    "SSN": re.compile(r"\b(social security|ssn|social)\b"),
    "PHONE": re.compile(r"\b(phone|mobile|cell|call ?back|call me|reach you|telephone)\b"),
    "CARD": re.compile(r"\b(card|visa|mastercard|master card|amex|american express|discover)\b"),
    **CONTEXT_KEYWORDS,
}
# Opened by either leg: a customer says "my card number is" (or "my date of birth is", "my pin is") and reads
# it in chunks after a pause.
_ANY_LEG_CONTEXT = frozenset({"CARD", *CONTEXT_KEYWORDS})
# A card number found opens both: what follows may be its rest, its expiry or its security code.
_AFTER_CARD = frozenset({"CARD", "CARD_GIVEN"})
_MONEY_BEFORE = {"$", "£", "€"}
_MONEY_AFTER = {"dollar", "dollars", "cents", "bucks", "percent", "%", "pounds", "euros", "usd"}
_YEAR_BEFORE = {"in", "since", "from", "until", "till", "year", "of", "back"}
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
    """A segment with its PII replaced by markers, same timing, and how many of each were replaced.

    ``spans``: where the replaced PII was in the text as decoded (character offsets and marker), and
    ``source_chars`` that text's length: what places the PII in the segment's audio (``time_spans``)."""

    segment: Segment
    counts: dict[str, int]
    spans: tuple[tuple[int, int, str], ...] = ()
    source_chars: int = 0

    @property
    def text(self) -> str:
        return self.segment.text

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def time_spans(self, start_ms: int, end_ms: int) -> list[tuple[int, int, str]]:
        """Each replaced span's place in ``[start_ms, end_ms)`` (the audio its text was decoded from), by
        its share of the characters: an estimate the recording's cut widens and checks (pipeline/recordings)."""
        n = max(1, self.source_chars)
        per_char = (end_ms - start_ms) / n
        return [(start_ms + int(a * per_char), start_ms + round(b * per_char), marker) for a, b, marker in self.spans]


@dataclass(frozen=True)
class RedactedTurn:
    """A final whose audio holds what its text redacts: the spans' estimated times in the leg's audio
    (``RedactedText.time_spans``) and how many digits its redacted text kept, which the recording's cut
    is checked against (pipeline/recordings/cuts.py)."""

    leg: str
    start_ms: int
    end_ms: int
    cuts: tuple[tuple[int, int, str], ...]
    digits_kept: int


def redacted_turn(segment: Segment, redacted: RedactedText) -> RedactedTurn | None:
    """The turn to cut from the recording, or None when the segment said nothing redacted. A segment whose
    text came redacted already (a call resumed from its stored finals) has no times for its markers: the
    whole segment is cut."""
    if redacted.spans:
        cuts = tuple(redacted.time_spans(segment.start_ms, segment.end_ms))
    else:
        cuts = tuple((segment.start_ms, segment.end_ms, m) for m in dict.fromkeys(_MARKER_IN_TEXT.findall(segment.text)))
    if not cuts:
        return None
    kept = sum(len(run.digits) for run in digit_runs(redacted.text)[1])
    return RedactedTurn(segment.leg, segment.start_ms, segment.end_ms, cuts, kept)


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


@dataclass(frozen=True)
class _Seen:
    """A redacted segment's place in the call and the context it opens for the segments after it."""

    order: tuple[int, int, str]
    opens: frozenset[str]


def _order(segment: Segment) -> tuple[int, int, str]:
    """Time order of a call's segments (agent first on a tie: a question precedes its answer)."""
    return (segment.start_ms, 0 if segment.leg == "agent" else 1, segment.segment_id)


@dataclass
class CallRedactor:
    """Redacts the segments of one call, remembering by segment time what was asked and given."""

    context_segments: int = 3
    names: bool = False  # qa_redact_names: personal names too
    _seen: list[_Seen] = field(default_factory=list)  # sorted by order

    def _context_for(self, segment: Segment) -> tuple[set[str], set[str]]:
        """(active, mentioned): context active for this segment, and the keywords the segment says."""
        # Markers out first: a resumed call's stored text says "[DOB]", "[PIN]", "[ADDRESS]", which would
        # otherwise open the contexts of the words they replaced (and did, in the chaos test: a card number
        # three segments later became [DOB] live and [PAN] offline).
        lowered = _MARKER_IN_TEXT.sub(" ", segment.text).lower()
        mentioned = {kind for kind, pattern in _CONTEXT_KEYWORDS.items() if pattern.search(lowered)}
        at = bisect.bisect_left([seen.order for seen in self._seen], _order(segment))
        before = self._seen[max(0, at - self.context_segments) : at]
        return mentioned.union(*(seen.opens for seen in before)), mentioned

    def _remember(self, segment: Segment, mentioned: set[str], counts: dict[str, int]) -> None:
        opens = set(mentioned) if segment.leg == "agent" else mentioned & _ANY_LEG_CONTEXT
        # A card number, or its expiry read in card context, keeps the card open: the security code is
        # usually asked for after the expiry, often more than ``context_segments`` after the number.
        if counts.get("PAN") or counts.get("EXPIRY"):
            opens |= _AFTER_CARD
        bisect.insort(self._seen, _Seen(_order(segment), frozenset(opens)), key=lambda seen: seen.order)

    def _classify(self, run: DigitRun, tokens: list[Token], context: set[str]) -> list[_Span]:
        pan = _find_pan(run)
        if pan is not None:
            card = _sub_run(run.items[pan[0] : pan[1]], tokens)
            spans = [_Span(card.start, card.end, "PAN")]
            # Digits around a card number in one run are more of it as ASR heard it (an extra or repeated
            # group), or its expiry and code: judge them as after a card.
            for rest in (run.items[: pan[0]], run.items[pan[1] :]):
                if rest:
                    spans += self._classify(_sub_run(rest, tokens), tokens, context | _AFTER_CARD)
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
        personal = _personal_marker(digits, run.group_lengths, context)
        if personal is not None:
            return personal
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
        if (international and 8 <= n <= 15) or (7 <= n <= 15 and "PHONE" in context):
            return "PHONE"
        return _card_marker(run, tokens, context)

    def _number_spans(self, text: str, context: set[str]) -> list[_Span]:
        tokens, runs = digit_runs(text)
        spans: list[_Span] = []
        for run in runs:
            for span in self._classify(run, tokens, context):
                spans.append(_widen(span, text, tokens))
        return spans

    def redact(self, segment: Segment, *, remember: bool = True, assume_context: bool = False) -> RedactedText:
        """The segment with its PII replaced. ``remember=False`` (a partial) leaves the call's context as is;
        ``assume_context`` redacts as if every context were open (when what came before is not known yet)."""
        context, mentioned = self._context_for(segment)
        if assume_context:
            context |= set(_CONTEXT_KEYWORDS) | _AFTER_CARD
        text = segment.text
        spans = _email_spans(text)
        spans += [s for s in _address_and_names(text, context, self.names) if not _overlaps(s, spans)]
        # Dates last: a card number read out while a date of birth is still in context is a [PAN], whatever
        # the date finder would make of a run of numbers. But a year inside a date with its month ("the second of
        # July, 1990") is the date's, though a card is in context too.
        dates = _dates_of_birth(text, context)
        with_month = [d for d in dates if any(t.lower in MONTHS for t in tokenize(text[d.start:d.end]))]
        spans += [s for s in self._number_spans(text, context)
                  if not _overlaps(s, spans) and not any(d.start <= s.start and s.end <= d.end for d in with_month)]
        spans += [s for s in dates if not _overlaps(s, spans)]
        counts = Counter(s.marker for s in spans)
        found = tuple(sorted((s.start, s.end, s.marker) for s in spans))
        for span in sorted(spans, key=lambda s: s.start, reverse=True):
            text = f"{text[: span.start]}[{span.marker}]{text[span.end :]}"
        if remember:
            # What the text held redacted already counts too: a call resumed from its stored finals must
            # keep the card open after "[PAN]" as after the digits, or the expiry or code after it leaks.
            self._remember(segment, mentioned, counts + Counter(_MARKER_IN_TEXT.findall(segment.text)))
        return RedactedText(segment.with_text(text), dict(counts), found, len(segment.text))


def _address_and_names(text: str, context: set[str], names: bool) -> list[_Span]:
    """Street addresses always; names when asked to (personal.py)."""
    found = address_spans(text, context)
    if names:
        found += [n for n in name_spans(digit_runs(text)[0], context)
                  if not any(n.start < a.end and a.start < n.end for a in found)]
    return [_Span(p.start, p.end, p.marker) for p in found]


def _dates_of_birth(text: str, context: set[str]) -> list[_Span]:
    """Dates said while a date of birth is asked for; not an amount ("one hundred and twenty dollars")."""
    if "DOB" not in context:
        return []
    tokens = digit_runs(text)[0]
    spans = []
    for p in date_spans(tokens):
        inside = [i for i, t in enumerate(tokens) if p.start <= t.start and t.end <= p.end]
        if not (inside and _money_beside(tokens, inside[0], inside[-1])):
            spans.append(_Span(p.start, p.end, p.marker))
    return spans


def _personal_marker(digits: str, groups: list[int], context: set[str]) -> str | None:
    """A bare number in the context that names it: a PIN, a routing number (checksum, else an account), a bank
    account, a ZIP code."""
    n = len(digits)
    if "PIN" in context and 4 <= n <= 6:
        return "PIN"
    if "ROUTING" in context and n == 9:
        return "ROUTING" if routing_valid(digits) else "ACCOUNT"
    if "BANK" in context and 6 <= n <= 17:
        return "ACCOUNT"
    if "ADDRESS" in context and (n == 5 or (n == 9 and groups == [5, 4])):
        return "ADDRESS"
    return None


def _card_marker(run: DigitRun, tokens: list[Token], context: set[str]) -> str | None:
    """In card context: a card's expiry or security code once it was given, else a garbled card or a chunk."""
    if "CARD" not in context or _is_amount(run, tokens) or _is_year(run, tokens):
        return None
    slashed = any(t.text == "/" for t in tokens[run.items[0].first : run.items[-1].last + 1])
    n = len(run.digits)
    if "CARD_GIVEN" in context and _looks_like_expiry(run):
        return "EXPIRY"
    if "CARD_GIVEN" in context and n in (3, 4):
        return "CVV"
    # Any longer run is a card too: ASR repeats groups of a card read out ("111, 111, 111, ..."), making
    # runs of over 19 digits. "12/05" is a date, not a chunk of a card.
    return "PAN" if n >= 4 and not slashed else None


def _is_amount(run: DigitRun, tokens: list[Token]) -> bool:
    """'$45.20', '150 dollars', '12.99': money, which card context must leave readable."""
    cents = len(run.items) == 2 and len(run.items[1].digits) == 2 and any(
        t.text == "." for t in tokens[run.items[0].last + 1 : run.items[1].first]
    )
    return _money_beside(tokens, run.items[0].first, run.items[-1].last) or cents


def _money_beside(tokens: list[Token], first: int, last: int) -> bool:
    """A currency sign just before ``tokens[first]`` or a money word just after ``tokens[last]``."""
    before = tokens[first - 1].text if first > 0 else ""
    after = tokens[last + 1].lower if last + 1 < len(tokens) else ""
    return before in _MONEY_BEFORE or after in _MONEY_AFTER


def _is_year(run: DigitRun, tokens: list[Token]) -> bool:
    """'since 2019', 'in 2024': a year written as one number after a word that introduces one."""
    first = run.items[0].first
    if len(run.items) != 1 or len(run.digits) != 4 or first == 0:
        return False
    return tokens[first - 1].lower in _YEAR_BEFORE and 1950 <= int(run.digits) <= 2049


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
