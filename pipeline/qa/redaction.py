"""PII redaction of transcript segments, applied before any text leaves the worker (PCI DSS: card data must
never be stored in transcripts or recordings).

What is replaced, and by which marker: [PAN] card numbers, [EXPIRY], [CVV], [SSN] (whole, in pieces, the
last four), [DOB], [ADDRESS] (streets of any name and type, PO boxes, units, ZIP codes), [ACCOUNT],
[ROUTING], [IBAN], [PIN], [PASSWORD] (passcode, password and security answers), [EMAIL], [PHONE], and
[NAME] with ``qa_redact_names``.

Two things decide what a number is:

- **The dialogue** (exchange.py): either leg naming what is asked for or given opens a sensitive exchange
  for the call, and it stays open through chunks, backchannels, digressions, holds and read-backs until
  the topic changes or the talk moves elsewhere for ``idle_ms``. While one is open every number either
  leg says, in any form (digits, words, "oh", "double", "hundred", "to"/"for" beside digits, mixed), is
  redacted under the marker of what was asked for last; chunks of a card number read over several
  segments are joined (Luhn) to tell the number from the expiry and code that follow it.
- **Its shape**, everywhere: a Luhn-valid 13-19 digit card number, a 3-2-4 social, a NANP or "+"
  phone number, an e-mail, a street address, a PO box, a written IBAN. And, so that no chunk of a card
  read without any card word leaves the worker before the rest shows what it was, a bare group of four
  digits that can start a card number (3, 4, 5, 6 or 2221-2720) is redacted at once and opens the
  payment exchange (the first chunk cannot wait: segments are published when released).

What is not personal stays readable, in an exchange too, because QA reads it: amounts and prices ("$45.20",
"150 dollars", "the total is 80"), times ("3 pm", "at two thirty"), durations and counts ("3 to 5
business days", "two items", "one moment"), menu options ("press 1"), years ("since 2019"), dates outside
a date-of-birth or expiry question, and order, claim and policy numbers (naming one also ends an exchange).

Context is judged by segment time, not by the order segments reach the redactor: the state after each
segment is kept in time order, and a segment is judged with the state of the one before it in time
(``CallAnalyzer`` in the worker releases segments in time order anyway).
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from dataclasses import dataclass, field, replace

from pipeline.qa.exchange import (
    NOT_PERSONAL_LABEL,
    Cues,
    ExchangeState,
    ValueDigest,
    cues,
    named,
    value_digest,
)
from pipeline.qa.numbers import (
    TEENS,
    TENS,
    UNITS,
    DigitRun,
    NumberItem,
    Token,
    digit_runs,
    luhn_valid,
    tokenize,
)
from pipeline.qa.personal import MONTHS, address_spans, date_spans, name_spans, routing_valid
from pipeline.qa.segment import Segment

MARKERS = ("PAN", "SSN", "PHONE", "EMAIL", "CVV", "EXPIRY", "DOB", "ADDRESS", "ACCOUNT", "ROUTING", "IBAN", "PIN",
           "PASSWORD", "NAME")
# A marker already in a segment's text: it was redacted before (a stored final a resumed call is rebuilt from).
_MARKER_IN_TEXT = re.compile(r"\[(" + "|".join(MARKERS) + r")\]")
CARD_DATA = frozenset({"PAN", "EXPIRY", "CVV"})

_NUMBER_WORDS = {*UNITS, *TEENS, *TENS, "hundred", "thousand", "double", "triple"}
_MONEY_BEFORE = {"$", "£", "€"}
_MONEY_AFTER = {"dollar", "dollars", "cents", "cent", "bucks", "percent", "%", "pounds", "euros", "usd", "quid",
                "grand", "k"}
# Words that say the number after them is money or a count, not an identifier ("the total is 80").
_AMOUNT_BEFORE = {"total", "balance", "amount", "cost", "costs", "price", "owe", "owed", "fee", "charge", "charged",
                  "bill", "refund", "credit", "paid", "pay", "payment", "premium", "deductible", "rate", "about",
                  "around", "approximately", "roughly", "maybe", "only", "just", "over", "under", "least", "most",
                  "than", "were", "up"}
_MENU_BEFORE = {"press", "option", "dial", "extension", "ext", "step", "level", "tier", "floor", "page", "line",
                "chapter", "section", "number", "channel", "gate", "aisle", "terminal", "platform", "version",
                "plan", "package", "day", "week", "year", "age", "aged", "size", "grade", "class", "top"}
_UNIT_AFTER = {
    "minute", "minutes", "min", "mins", "hour", "hours", "hrs", "day", "days", "week", "weeks", "month", "months",
    "year", "years", "yrs", "second", "seconds", "sec", "secs", "moment", "moments", "business", "working",
    "night", "nights", "time", "times", "item", "items", "person", "people", "of", "or", "ish", "more", "less",
    "calls", "call", "line", "lines", "licence", "licences", "license", "licenses", "ticket", "tickets", "box",
    "boxes", "bag", "bags", "order", "orders", "payment", "payments", "installment", "installments", "gig",
    "gigs", "gb", "mb", "mbps", "megabytes", "gigabytes", "miles", "mile", "km", "kilometers", "feet", "foot",
    "inches", "kids", "children", "adults", "rooms", "devices", "phones", "accounts", "cards", "units", "pieces",
    "bottles", "doses", "tablets", "steps", "pages", "points", "stars", "degrees", "percent", "users", "seats",
    "computers", "laptops", "tvs", "lbs", "kg", "ounces", "oz", "liters", "gallons", "am", "pm", "a", "p",
    "o'clock", "oclock", "thirty", "fifteen", "forty-five", "to", "th", "st", "nd", "rd", "and", "x", "copies",
    "emails", "texts", "messages", "attempts", "tries", "plus", "members", "dependents", "cars", "vehicles",
    "trips", "weekdays", "episodes", "channels", "bars", "rings", "apps", "things", "questions",
    "issues", "problems", "bills", "invoices", "visits", "appointments", "locations", "stores", "floors",
    "digit", "digits", "letters", "characters", "numbers",
}
_TIME_AFTER = {"am", "pm", "a", "p", "o'clock", "oclock", "noon", "midnight"}
_YEAR_BEFORE = {"in", "since", "from", "until", "till", "year", "of", "back", "by", "before", "after", "around"}
_WRITTEN_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")
_DOT = r"(?:\s+dot\s+|\.)"
_SPOKEN_EMAIL = re.compile(
    r"\b(?P<local>[a-z0-9]+(?:(?:\s+(?:dot|underscore|dash|hyphen)\s+|[._-])[a-z0-9]+)*)\s+at\s+"
    rf"[a-z0-9]+(?:{_DOT}[a-z0-9]+)*{_DOT}(?:com|net|org|edu|gov|io|co|uk|us|ca|info|biz|me)\b",
    re.IGNORECASE,
)
# In an e-mail exchange: a mailbox said with spelled letters or an unheard domain ("j smith at gmail").
_AT = re.compile(r"@|\sat\s", re.IGNORECASE)
_ASKED_EMAIL = re.compile(
    r"\b(?:[a-z0-9]+[\s._-]+){0,8}?[a-z0-9]+\s+(?:at|@)\s+[a-z0-9]+(?:(?:\s+dot\s+|\.)[a-z0-9]+)*", re.IGNORECASE
)
# "visit us at acme dot com" names a web site, not a mailbox.
_NOT_A_MAILBOX = {"us", "me", "you", "him", "her", "them", "it", "look", "online", "visit", "website", "site", "is"}
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?:\s?[A-Z0-9]{4}){2,7}(?:\s?[A-Z0-9]{1,4})?\b")
_PO_BOX = re.compile(r"\b(?:p\.?\s?o\.?\s?box|post office box|box number)\s*(?:number\s*)?[#:]?\s*"
                     r"(?:\d+|(?:[a-z]+[\s-]*){1,8}?)(?=[.,?!]|$|\s+(?:and|in|thanks|thank|please)\b)", re.IGNORECASE)
# What an answer starts with before the answer itself ("yes, it's ..."): a password answer starts after it.
_ANSWER_START = {"yes", "yeah", "yep", "sure", "okay", "ok", "um", "uh", "it's", "its", "it", "is", "my", "the",
                 "password", "passphrase", "passcode", "answer", "security", "word", "that's", "thats", "would",
                 "be", "i", "think", "so", "well", "oh", "no", "wait", "actually", "sorry", "should", "that",
                 "mother's", "maiden", "name", "question", "memorable", "secret", "a", "an", "and", "er", "hmm"}
# A card's issuer digit: what a group of four said alone must start with to be a card's first chunk.
_CARD_START = ("3", "4", "5", "6")


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


@dataclass(frozen=True)
class _Judging:
    """What one segment's numbers are judged with."""

    text: str
    tokens: list[Token]
    state: ExchangeState
    labels: list[tuple[int, str | None]]  # (end offset, marker) of what the segment names; None: not personal
    label_starts: tuple[int, ...] = ()  # where the sensitive things it names start

    @property
    def open(self) -> bool:
        return bool(self.state.open)

    def label_before(self, offset: int) -> tuple[str | None, bool]:
        """The nearest thing named before ``offset`` in this segment: (marker or None, found)."""
        before = [(at, marker) for at, marker in self.labels if at < offset]
        return (before[-1][1], True) if before else (None, False)

    @property
    def focus(self) -> str | None:
        return self.state.focus


def _email_spans(text: str, asked: bool) -> list[_Span]:
    if _AT.search(text) is None:  # every mailbox has its "@" or its "at": most segments have neither
        return []
    spans = [_Span(m.start(), m.end(), "EMAIL") for m in _WRITTEN_EMAIL.finditer(text)]
    for m in _SPOKEN_EMAIL.finditer(text):
        local_words = re.split(r"\s+|[._-]", m.group("local").lower())
        if local_words[-1] not in _NOT_A_MAILBOX:
            spans.append(_Span(m.start(), m.end(), "EMAIL"))
    if asked:
        for m in _ASKED_EMAIL.finditer(text):
            start = _after_answer_start(text, m.start(), m.end())
            if start < m.end() and not _overlaps(_Span(start, m.end(), "EMAIL"), spans):
                spans.append(_Span(start, m.end(), "EMAIL"))
    return spans


def _after_answer_start(text: str, start: int, end: int) -> int:
    """Where the answer itself begins in ``text[start:end]``, past "yes it's", "my password is"."""
    for m in re.finditer(r"[\w'@.-]+", text[start:end]):
        if m.group().lower().strip(".,") not in _ANSWER_START:
            return start + m.start()
    return end


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
class RedactionMemory:
    """What the redactor knows that the redacted text no longer says: whether a whole card number was given
    (its chunks are all "[PAN]" now) and the values said as words (by digest), for read-backs. A call's
    checkpoint carries it: rebuilt from the stored text alone, a resumed call would judge an expiry after
    the card as more of the card, and would keep a password read back after the resume."""

    card_given: bool = False
    said: tuple[ValueDigest, ...] = ()


@dataclass
class CallRedactor:
    """Redacts the segments of one call, following its sensitive exchanges by segment time."""

    idle_ms: int = 30_000  # qa_exchange_idle_ms: talk on something else that ends an exchange
    names: bool = False  # qa_redact_names: personal names too
    salt: str = ""  # the call's id: what a value's digest is salted with (RedactionMemory)
    _states: list[tuple[tuple[int, int, str], ExchangeState]] = field(default_factory=list)  # by time order

    def memory(self, through: tuple[int, int, str] | None = None) -> RedactionMemory:
        """The memory after the segment at time order ``through`` (None: the latest)."""
        at = len(self._states) if through is None else bisect.bisect_right(
            self._states, through, key=lambda entry: entry[0])
        if not at:
            return RedactionMemory()
        state = self._states[at - 1][1]
        said = tuple(ValueDigest(marker, len(words.split()), value_digest(self.salt, words))
                     for words, marker in state.said)
        return RedactionMemory(card_given(state), tuple(dict.fromkeys(said + state.said_digests)))

    def restore(self, memory: RedactionMemory) -> None:
        """Add ``memory`` to the state after the segments processed so far (a call resumed from its stored text)."""
        if not memory.card_given and not memory.said:
            return
        order, state = self._states[-1] if self._states else ((-1, -1, ""), ExchangeState())
        state = replace(state, card_complete=state.card_complete or memory.card_given,
                        said_digests=tuple(dict.fromkeys(state.said_digests + memory.said)))
        if self._states:
            self._states[-1] = (order, state)
        else:
            self._states.append((order, state))

    def _state_before(self, order: tuple[int, int, str]) -> ExchangeState:
        at = bisect.bisect_left(self._states, order, key=lambda entry: entry[0])
        return self._states[at - 1][1] if at else ExchangeState()

    def redact(self, segment: Segment, *, remember: bool = True, assume_context: bool = False) -> RedactedText:
        """The segment with its PII replaced. ``remember=False`` (a partial) leaves the call's state as is;
        ``assume_context`` redacts as if every exchange were open (when what came before is not known yet)."""
        order = segment_order(segment)
        text = segment.text
        stored = Counter(_MARKER_IN_TEXT.findall(text))
        # Markers out first: a resumed call's stored text says "[DOB]", "[PIN]": their words are gone.
        lowered = _MARKER_IN_TEXT.sub(" ", text).lower()
        names_here = named(lowered)
        said = cues(lowered, names_here)
        state = self._state_before(order)
        if (said.closes or (said.label and not said.asks)) and not stored:
            state = state.closed()
        state = state.opened(said.asks, segment.leg)
        if assume_context:
            state = replace(state, open=frozenset(MARKERS), focus=state.focus)
        judging = _Judging(text, tokenize(text), state, _labels(lowered, names_here),
                           tuple(a for a, _, _ in names_here))
        spans = self._spans(judging, segment.leg)
        counts = Counter(s.marker for s in spans)
        if remember:
            after = self._after(state, judging, spans, stored, said, segment)
            bisect.insort(self._states, (order, after), key=lambda entry: entry[0])
        found = tuple(sorted((s.start, s.end, s.marker) for s in spans))
        for span in sorted(spans, key=lambda s: s.start, reverse=True):
            text = f"{text[: span.start]}[{span.marker}]{text[span.end :]}"
        return RedactedText(segment.with_text(text), dict(counts), found, len(segment.text))

    def _spans(self, judging: _Judging, leg: str) -> list[_Span]:
        text, state = judging.text, judging.state
        spans = _email_spans(text, state.focus == "EMAIL")
        spans += [_Span(m.start(), m.end(), "IBAN") for m in _IBAN.finditer(text) if not _overlaps_at(m, spans)]
        spans += [s for s in _address_spans(judging) if not _overlaps(s, spans)]
        if self.names:
            named = "NAME" in state.open or any(marker == "NAME" for _, marker in judging.labels)
            spans += [_Span(p.start, p.end, p.marker) for p in name_spans(judging.tokens, {"NAME"} if named else set())
                      if not _overlaps(_Span(p.start, p.end, p.marker), spans)]
        spans += [s for s in _password_spans(judging, leg) if not _overlaps(s, spans)]
        spans += [s for s in _said_before(judging, self.salt) if not _overlaps(s, spans)]
        # Dates last: a card number read out while a date of birth is still asked for is a [PAN], whatever
        # the date finder would make of a run of numbers. But a year inside a date with its month ("the second of
        # July, 1990") is the date's, though a card is in context too.
        dates = _dates_of_birth(judging)
        with_month = [d for d in dates if any(t.lower in MONTHS for t in tokenize(text[d.start:d.end]))]
        spans += [s for s in _number_spans(judging)
                  if not _overlaps(s, spans) and not any(d.start <= s.start and s.end <= d.end for d in with_month)]
        spans += [s for s in dates if not _overlaps(s, spans)]
        return _merge(spans, text, judging.open)

    def _after(self, state: ExchangeState, judging: _Judging, spans: list[_Span], stored: Counter[str],
               said: Cues, segment: Segment) -> ExchangeState:
        """The call's exchanges after this segment."""
        found = Counter(s.marker for s in spans) + stored
        if found and not state.open:
            # Something sensitive said outside an exchange opens its exchange: a card number's expiry and
            # code follow it, a social's chunks follow its first.
            state = state.opened(tuple(found), segment.leg)
        if state.focus == "PAN" or ("PAN" in found and state.focus in CARD_DATA):
            given = "".join(_digits(judging.text[s.start:s.end]) for s in spans if s.marker == "PAN")
            state = replace(state, card_digits=(state.card_digits + given)[-19:])
        words = tuple((w, s.marker) for s in spans if s.marker in _WORD_VALUES
                      for w in [_value_words(judging.text[s.start:s.end])] if w)
        if words:
            state = replace(state, said=(*state.said, *words)[-16:])
        sensitive = bool(found) or bool(said.asks)
        return state.after(segment.end_ms - segment.start_ms, sensitive, said.keeps, self.idle_ms)


def _digits(text: str) -> str:
    return "".join(run.digits for run in digit_runs(text, lenient=True)[1])


def card_given(state: ExchangeState) -> bool:
    """A whole card number was given in this exchange (its chunks joined pass Luhn)."""
    digits = state.card_digits
    return state.card_complete or any(13 <= len(digits) - i <= 19 and luhn_valid(digits[i:]) for i in range(len(digits)))


def _labels(lowered: str, named_here: list[tuple[int, int, str]]) -> list[tuple[int, str | None]]:
    """What the segment names and where: the markers of exchange.ASKS, and non-personal numbers (order...)."""
    found: list[tuple[int, str | None]] = [(end, marker) for _, end, marker in named_here]
    found += [(m.end(), None) for m in NOT_PERSONAL_LABEL.finditer(lowered)]
    return sorted(found, key=lambda entry: entry[0])


def _number_spans(judging: _Judging) -> list[_Span]:
    tokens, runs = digit_runs(judging.text, lenient=judging.open)
    spans: list[_Span] = []
    for run in runs:
        for span in _classify(run, tokens, judging, after_card=False):
            spans.append(_widen(span, judging.text, tokens))
    return spans


def _classify(run: DigitRun, tokens: list[Token], judging: _Judging, after_card: bool) -> list[_Span]:
    pan = _find_pan(run)
    if pan is not None:
        card = _sub_run(run.items[pan[0] : pan[1]], tokens)
        spans = [_Span(card.start, card.end, "PAN")]
        # Digits around a card number in one run are more of it as ASR heard it (an extra or repeated
        # group), or its expiry and code: judge them as after a card.
        for rest in (run.items[: pan[0]], run.items[pan[1] :]):
            if rest:
                spans += _classify(_sub_run(rest, tokens), tokens, judging, after_card=True)
        return spans
    parts = _split_at_commas(run, tokens)
    if len(parts) > 1 and (judging.open or after_card):
        # "April 2026, 731, 12/25": a read-back lists several things; judge each.
        return [span for part in parts for span in _classify(part, tokens, judging, after_card)]
    marker = _marker(run, tokens, judging, after_card)
    if marker is not None:
        return [_Span(run.start, run.end, marker)]
    # A comma may group one number ("4111, 1111, ...") or list several ("731, 12/25"): try the parts.
    return [span for part in parts if len(parts) > 1 for span in _classify(part, tokens, judging, after_card)]


def _marker(run: DigitRun, tokens: list[Token], judging: _Judging, after_card: bool) -> str | None:
    """What a run of numbers is, or None when it stays readable."""
    label, labelled = judging.label_before(run.start)
    focus = label if labelled and label is not None else judging.focus
    asked = focus is not None and (labelled or judging.open)
    if _not_personal(run, tokens, focus if asked else None):
        return None
    if len(run.digits) == 1 and any(0 <= at - run.end <= 30 for at in judging.label_starts):
        return None  # "the three digit code", "last four of your social": what is asked for, not an answer
    if labelled and label is None and not after_card:
        return None  # "my order number is 55123"
    if after_card and not judging.open and not asked and len(run.digits) < 3:
        return None  # "4111 1111 1111 1111 7 7": the card, then something else
    if asked or after_card or judging.open:
        return _asked_marker(run, focus, judging, after_card)
    return _shape_marker(run, tokens)


def _asked_marker(run: DigitRun, focus: str | None, judging: _Judging, after_card: bool) -> str:
    """The marker of a number said while ``focus`` is asked for (its exchange open or named just before)."""
    digits, n = run.digits, len(run.digits)
    given = after_card or card_given(judging.state)
    if focus in CARD_DATA or (focus is None and given):
        if n >= 12 or (focus == "PAN" and not given):
            return "PAN"
        if _looks_like_expiry(run) or (_after_month(run, judging.tokens) and n in (2, 4)):
            return "EXPIRY"
        if focus in ("EXPIRY", "CVV"):
            # The answer to the question asked: the same marker for a call resumed from its stored text, where
            # "[PAN]" no longer says whether the card number was complete.
            return focus
        return "CVV" if n in (3, 4) and (focus == "CVV" or given) else (focus or "PAN")
    if focus == "ROUTING":
        return "ROUTING" if n != 9 or routing_valid(digits) else "ACCOUNT"
    if focus in ("ACCOUNT", "IBAN") and n == 9 and routing_valid(digits) and "ROUTING" in judging.state.open:
        return "ACCOUNT"
    if focus == "PASSWORD":
        return "PIN"
    if focus is None or focus == "NAME":
        return _fallback_marker(run, judging.state.open)
    return focus


def _fallback_marker(run: DigitRun, open_markers: frozenset[str]) -> str:
    """A number while exchanges are open but none asked for numbers: named by its shape."""
    n = len(run.digits)
    for marker, fits in (("PAN", n >= 13), ("SSN", n == 9), ("PHONE", n in (10, 11)), ("ACCOUNT", n >= 6),
                         ("PIN", 4 <= n <= 6), ("CVV", n == 3)):
        if fits and marker in open_markers:
            return marker
    preferred = ("PAN", "SSN", "ACCOUNT", "ROUTING", "PIN", "PHONE", "DOB", "ADDRESS", "CVV", "EXPIRY", "IBAN")
    return next((m for m in preferred if m in open_markers), "PAN")


def _shape_marker(run: DigitRun, tokens: list[Token]) -> str | None:
    """Outside any exchange: what a number is by its shape alone."""
    digits, n = run.digits, len(run.digits)
    if n == 9 and run.group_lengths == [3, 2, 4] and _valid_ssn(digits):
        return "SSN"
    if _nanp(digits) or (n == 11 and digits[0] == "1" and _nanp(digits[1:])):
        return "PHONE"
    international = run.items[0].first > 0 and tokens[run.items[0].first - 1].text == "+"
    if international and 8 <= n <= 15:
        return "PHONE"
    if n == 4 and (digits.startswith(_CARD_START) or 2221 <= int(digits) <= 2720) and not _is_year(run, tokens) \
            and _stands_alone(run, tokens):
        return "PAN"  # a card's first chunk, read before any card word: redacted before the rest shows it
    return None


def _stands_alone(run: DigitRun, tokens: list[Token]) -> bool:
    """Said as numbers, not glued to letters ("b4949ee" is an identifier ASR or a test wrote, not a chunk)."""
    first, last = tokens[run.items[0].first], tokens[run.items[-1].last]
    glued_before = run.items[0].first > 0 and tokens[run.items[0].first - 1].end == first.start \
        and tokens[run.items[0].first - 1].text[0].isalpha()
    glued_after = run.items[-1].last + 1 < len(tokens) and tokens[run.items[-1].last + 1].start == last.end \
        and tokens[run.items[-1].last + 1].text[0].isalpha()
    return not (glued_before or glued_after)


def _not_personal(run: DigitRun, tokens: list[Token], focus: str | None) -> bool:
    """An amount, a time, a duration or count, a menu option, a year or a date that nobody asked a date of
    birth or an expiry for: readable, in an exchange too."""
    first, last = run.items[0].first, run.items[-1].last
    before = tokens[first - 1].lower if first > 0 else ""
    after = _next_word(tokens, last)
    if _is_amount(run, tokens) or before in _AMOUNT_BEFORE:
        return True
    dated = focus in ("DOB", "EXPIRY") or (focus in CARD_DATA and _card_year(run, tokens))
    if after in _TIME_AFTER and not dated and after not in ("a", "p"):
        return True
    if after in ("a", "p") and _next_word(tokens, last + 1) in ("m", "."):
        return True
    if after in _UNIT_AFTER and after not in ("and", "to", "or", "of") and not (dated and after in ("th", "st", "nd", "rd")):
        return True
    if after in ("to", "or") and len(run.digits) <= 2 and _next_word(tokens, last + 1).isdigit() is False \
            and _next_word(tokens, last + 2) in _UNIT_AFTER and not dated:
        return True  # "3 to 5 business days"
    if after == "of" and _next_word(tokens, last + 1) in ("us", "them", "those", "these", "each", "the"):
        return True
    if before in _MENU_BEFORE and len(run.digits) <= 2:
        return True
    if dated:
        return False
    slashed = [t.text for t in tokens[first : last + 1]].count("/")
    if slashed and len(run.digits) <= 8 and not (focus in CARD_DATA and _looks_like_expiry(run)):
        return True  # "issued on 12/05": a date, unless a card's expiry is being read
    if _is_year(run, tokens) or after in MONTHS or before in MONTHS or after in ("th", "st", "nd", "rd"):
        return True
    # "9:28": a time, unless an expiry or a birth date was asked for (a model writes "oh nine twenty-eight" so)
    return ":" in [t.text for t in tokens[first : last + 1]] and len(run.items) == 2 and len(run.digits) <= 4


def _card_year(run: DigitRun, tokens: list[Token]) -> bool:
    """A month and a card's year ("April twenty twenty six", "may 27"): an expiry, while a card is discussed."""
    year = run.digits[-2:]
    return _after_month(run, tokens) and len(run.digits) in (2, 4) and 20 <= int(year) <= 49


def _next_word(tokens: list[Token], index: int) -> str:
    return tokens[index + 1].lower if index + 1 < len(tokens) else ""


def _after_month(run: DigitRun, tokens: list[Token]) -> bool:
    return run.items[0].first > 0 and tokens[run.items[0].first - 1].lower in MONTHS


def _address_spans(judging: _Judging) -> list[_Span]:
    """Street addresses and PO boxes always; in an address exchange, the answer from its house number on."""
    text = judging.text
    found = [_Span(p.start, p.end, p.marker) for p in address_spans(text, judging.state.open)]
    found += [_Span(m.start(), m.end(), "ADDRESS") for m in _PO_BOX.finditer(text) if not _overlaps_at(m, found)]
    if judging.state.focus != "ADDRESS":
        return found
    # A street of a type no list holds, a house number of many words: from the first number to the end
    # of the sentence ("it's 4 2 1 7 Kingsgate Ridge, apartment 5"). A date said before it is not its start.
    tokens, runs = digit_runs(text, lenient=True)
    dates = date_spans(tokens) if "DOB" in judging.state.open else []
    runs = [r for r in runs if not any(d.start <= r.start < d.end for d in dates)
            and not _not_personal(r, tokens, "ADDRESS")]
    starts = [r.start for r in runs] + [s.start for s in found]
    if not starts:
        return found
    start = min(starts)
    end = re.search(r"[.?!](\s|$)", text[start:])
    answer = _Span(start, start + end.start() if end else len(text.rstrip()), "ADDRESS")
    return [answer] + [s for s in found if not _overlaps(s, [answer])]


def _password_spans(judging: _Judging, leg: str) -> list[_Span]:
    """A password or security answer: the answering leg's words after "yes it's", to the sentence's end;
    or what follows "my password is" in the same segment."""
    text, state = judging.text, judging.state
    label_at = next((at for at, marker in judging.labels if marker == "PASSWORD"), None)
    if label_at is not None:
        m = re.search(r"\b(is|was|it's|its|be)\s+", text[label_at:].lower())
        if m is None:
            return []
        start = label_at + m.end()
    elif state.focus == "PASSWORD" and leg != state.asked_by and not text.rstrip().endswith("?"):
        start = 0
    else:
        return []
    end_match = re.search(r"[.?!](\s|$)", text[start:])
    end = start + end_match.start() if end_match else len(text.rstrip())
    start = _after_answer_start(text, start, end)
    if start >= end or cues(text[start:end].lower()).keeps:
        return []
    return [_Span(start, end, "PASSWORD")]


# Values said as words, which a read-back repeats: the words stay known to the call (ExchangeState.said).
_WORD_VALUES = frozenset({"PASSWORD", "ADDRESS", "EMAIL", "NAME"})
_COMMON = {"street", "avenue", "road", "lane", "drive", "the", "and", "apartment", "unit", "box", "dot", "at", "com",
           "p", "o", "po", "zip", "suite", "apt", "is", "it's", "my"}


def _value_words(text: str) -> str:
    """The distinctive words of a value said as words ("grandma rose", "kingsgate"), lower-cased."""
    words = [w for w in re.findall(r"[a-z']{3,}", text.lower()) if w not in _COMMON and w not in _NUMBER_WORDS]
    return " ".join(words)


def _said_before(judging: _Judging, salt: str) -> list[_Span]:
    """A value said as words earlier in the call, said again (the agent reading a password back)."""
    spans = []
    for words, marker in judging.state.said:
        pattern = r"\b" + r"\W+(?:\w+\W+){0,3}?".join(re.escape(w) for w in words.split()) + r"\b"
        spans += [_Span(m.start(), m.end(), marker) for m in re.finditer(pattern, judging.text, re.IGNORECASE)]
    if judging.state.said_digests:
        # Known by digest only (said before a resume): each run of as many distinctive words, hashed.
        # Offsets from the text itself (a lower-cased copy may differ in length); the words lower-cased as
        # _value_words has them.
        found = [(m.start(), m.end(), word) for m in re.finditer(r"[A-Za-z']{3,}", judging.text)
                 if (word := m.group().lower()) not in _COMMON and word not in _NUMBER_WORDS]
        for value in judging.state.said_digests:
            for i in range(len(found) - value.words + 1):
                window = found[i : i + value.words]
                if value_digest(salt, " ".join(word for _, _, word in window)) == value.digest:
                    spans.append(_Span(window[0][0], window[-1][1], value.marker))
    return spans


def _dates_of_birth(judging: _Judging) -> list[_Span]:
    """Dates said while a date of birth is asked for; not an amount ("one hundred and twenty dollars")."""
    if "DOB" not in judging.state.open and "DOB" not in [m for _, m in judging.labels]:
        return []
    tokens = digit_runs(judging.text)[0]
    spans = []
    for p in date_spans(tokens):
        inside = [i for i, t in enumerate(tokens) if p.start <= t.start and t.end <= p.end]
        if not (inside and _money_beside(tokens, inside[0], inside[-1])):
            spans.append(_Span(p.start, p.end, p.marker))
    return spans


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


def _overlaps_at(match: re.Match[str], others: list[_Span]) -> bool:
    return _overlaps(_Span(match.start(), match.end(), ""), others)


# Between two spans of one thing read out: separators, fillers and spelled letters ("g b 8 2 w e s t").
_JOIN_GAP = re.compile(r"^(?:[\s,.\-/:]|\b(?:um|uh|er|erm|and|then|dash|[a-z])\b)*$", re.IGNORECASE)


def _merge(spans: list[_Span], text: str, in_exchange: bool) -> list[_Span]:
    """In an exchange, spans of one marker with only separators, fillers or spelled letters between them
    become one: the letters of an IBAN or a postcode read with the digits go with them."""
    if not in_exchange or len(spans) < 2:
        return spans
    ordered = sorted(spans, key=lambda s: s.start)
    merged = [ordered[0]]
    for span in ordered[1:]:
        last = merged[-1]
        if span.marker == last.marker and _JOIN_GAP.match(text[last.end:span.start]):
            merged[-1] = _Span(last.start, span.end, last.marker)
        else:
            merged.append(span)
    return merged


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


def segment_order(segment: Segment) -> tuple[int, int, str]:
    """Time order of a call's segments (agent first on a tie: a question precedes its answer)."""
    return (segment.start_ms, 0 if segment.leg == "agent" else 1, segment.segment_id)
