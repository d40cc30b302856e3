"""Sensitive exchanges of a call: what the dialogue is about, for the redactor (redaction.py).

Callers do not give a card number in the segment after the question: they read it in chunks with the
agent's "mm hmm" between them, go to fetch the card, get put on hold, correct themselves, and the agent
reads it back. So a keyword does not open redaction for a count of segments; it opens an *exchange* for
the call (payment, identity, bank details, address, PIN or password, contact details), and the exchange
stays open while the dialogue stays on it:

- either leg opens it by naming what is asked for or given ("card number", "the code on the back",
  "last four of your social", "routing", "where do you live", "security password");
- acknowledgements, fillers and digressions ("mm hmm", "go ahead", "sorry, one moment, let me grab my
  wallet") keep it open without counting, and so does a hold (no speech comes during one);
- anything sensitive said (a number, a keyword) keeps it open;
- a clear change of topic closes it ("is there anything else", "your payment went through", an order or
  claim number named), and so does a stretch of talk with nothing sensitive in it
  (``idle_ms`` of speech, ``CALLQA_QA_EXCHANGE_IDLE_MS``): call time the parties spend on something else.

While an exchange is open, every number either leg says is redacted (the answer, and the agent's
read-back) unless it is plainly not personal (an amount, a time of day, a duration or a count: see
redaction.py), under the marker of what was asked for last (``focus``).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace

# What names each marker: a question, or the caller's own "my card number is". Lower-cased text.
ASKS: dict[str, re.Pattern[str]] = {
    "PAN": re.compile(
        r"\b(card|visa|master ?card|amex|american express|discover|long number"
        r"|number on the front|sixteen digits?|16 digits?)\b"
    ),
    "EXPIRY": re.compile(r"\b(expiry|expiration|expires?|expire|valid (thru|through)|exp date|xire)\b"),
    # "secure code", "security G-code", "secure iG code": how ASR often renders a security-code question.
    "CVV": re.compile(
        r"\b(security code|cvv2?|cvc|card verification|(three|four|3|4)[- ]digit (code|number)|back of the card"
        r"|on the back|secur\w*\W+(\w+\W+){0,2}code|verification (code|number))\b"
    ),
    "SSN": re.compile(r"\b(social security|ssn|social|s s n|tax id|taxpayer)\b"),
    # "data birth", "date a birth": how ASR often hears "date of birth" on a phone line.
    "DOB": re.compile(r"\b((date|data) (of |a )?birth|birth ?date|d\.?o\.?b|birthday|born)\b"),
    # "email address" is EMAIL's, not a place.
    "ADDRESS": re.compile(
        r"\b((?<!email )(?<!e-mail )address|zip( code)?|post ?code|postal code|where do you live"
        r"|p\.? ?o\.? box|post office box|mailing|shipping to|billing to)\b"
    ),
    "ACCOUNT": re.compile(r"\b(bank account|account number|checking|savings|acct|account no)\b"),
    "ROUTING": re.compile(r"\b(routing( number)?|aba|sort code|transit number)\b"),
    "IBAN": re.compile(r"\b(iban|swift|bic)\b"),
    "PIN": re.compile(r"\b(pin( number| code)?|passcode|pass code|access code|one[- ]time code|otp)\b"),
    "PASSWORD": re.compile(
        r"\b(password|pass ?phrase|pass word|security (question|answer|word)|secret (word|answer|question)"
        r"|memorable (word|answer)|maiden name|mother'?s maiden)\b"
    ),
    "PHONE": re.compile(
        r"\b(phone|mobile|cell|call ?back|call me|reach you|telephone|best number|contact number)\b"
    ),
    "EMAIL": re.compile(r"\b(e-?mail|email)\b"),
    "NAME": re.compile(r"\b(your (full |first |last )?name|name on the (card|account)|surname|spell (your|the) name)\b"),
}
# Markers one exchange holds: naming one opens the others (the expiry is asked after the card number).
EXCHANGES: dict[str, frozenset[str]] = {
    "payment": frozenset({"PAN", "EXPIRY", "CVV"}),
    "identity": frozenset({"SSN", "DOB"}),
    "bank": frozenset({"ACCOUNT", "ROUTING", "IBAN"}),
    "address": frozenset({"ADDRESS"}),
    "secret": frozenset({"PIN", "PASSWORD"}),
    "contact": frozenset({"PHONE", "EMAIL"}),
    "name": frozenset({"NAME"}),
}
EXCHANGE_OF = {marker: name for name, markers in EXCHANGES.items() for marker in markers}

# A change of topic: the exchange is over.
_CLOSES = re.compile(
    r"\b(anything else|is that all|that's all|that is all|moving on|move on to|thank(s| you) for calling"
    r"|have a (good|great|nice|lovely) (day|evening|one)|you'?re all set|all set|"
    r"(has|have) been (processed|approved|updated|verified|applied|changed|saved)|went through"
    r"|(payment|transaction) (is|was) (processed|successful|complete|approved)|verification (is )?complete"
    r"|now (about|regarding|let's|let me ask|on to)|let's (talk about|move on|look at)|back to (your|the)"
    r"|the reason (for|i'm calling|i am calling))\b"
)
# A number that names a thing, not a person: order, claim, policy numbers stay readable outside an exchange.
NOT_PERSONAL_LABEL = re.compile(
    r"\b(order|claim|policy|confirmation|reference|ticket|case|tracking|invoice|booking|reservation|model"
    r"|serial|flight|room|extension|ext|item|product|part|sku|version|incident|quote|store|branch)"
    r"( number| no| id| #|#)?\b"
)
# Acknowledgements, fillers, and the digressions of a caller fetching a card: they keep an exchange open.
_BACKCHANNEL_WORDS = {
    "mm", "hmm", "mhm", "uh", "huh", "um", "umm", "ah", "er", "erm", "oh", "okay", "ok", "yes", "yeah", "yep",
    "yup", "sure", "right", "alright", "go", "ahead", "on", "got", "it", "perfect", "great", "thanks", "thank",
    "you", "and", "then", "next", "continue", "please", "sorry", "correct", "that's", "thats", "so", "well",
    "wait", "no", "one", "sec", "second", "moment", "minute", "just", "a", "hold", "hang", "let", "me", "get",
    "grab", "find", "check", "the", "my", "i", "have", "here", "bear", "with", "is", "what", "was", "that",
    "again", "repeat", "say", "ready", "when", "you're", "youre", "good", "fine", "still", "there", "hello",
    "of", "to", "for", "sorry,", "um,", "uh,", "mm-hmm", "uh-huh", "all", "wallet", "purse", "card", "sorry.",
    "where", "it's", "its", "looking", "see", "lost", "can", "hear", "do", "did", "catch", "last", "part",
}
_DIGRESSION = re.compile(
    r"\b(one moment|one sec(ond)?|just a (sec|second|moment|minute)|hold on|hang on|bear with me|let me (get|grab|find"
    r"|check|look)|my (wallet|purse|bag)|where did i|i('ve| have) (got )?it here|take your time|no rush|no problem"
    r"|still there|can you hear me|sorry about that|didn'?t catch|say (that|it) again|repeat that|found it"
    r"|here it is|got it (now|here)|i'?m (here|back|ready)|ready when you are)\b"
)
_WORD = re.compile(r"[a-z']+")


@dataclass(frozen=True)
class Cues:
    """What one segment says about the dialogue."""

    asks: tuple[str, ...]  # markers it names, in the order they are said
    closes: bool  # a change of topic
    keeps: bool  # an acknowledgement, a filler or a digression
    label: bool  # names an order, claim or policy number (not personal data)


# Any of ASKS at all: most segments name nothing, and one search says so for the price of one pattern.
_ANY_ASK = re.compile("|".join(f"(?:{pattern.pattern})" for pattern in ASKS.values()))


def named(text: str) -> list[tuple[int, int, str]]:
    """(start, end, marker) of each thing ``text`` names, in order."""
    if _ANY_ASK.search(text) is None:
        return []
    return sorted((m.start(), m.end(), marker) for marker, pattern in ASKS.items() for m in pattern.finditer(text))


def cues(text: str, found: list[tuple[int, int, str]] | None = None) -> Cues:
    """The cues of a segment's lower-cased text (markers from earlier redaction already taken out);
    ``found``: ``named(text)`` when the caller has it already."""
    asks = tuple(dict.fromkeys(marker for _, _, marker in (named(text) if found is None else found)))
    words = _WORD.findall(text)
    keeps = bool(_DIGRESSION.search(text)) or (len(words) <= 6 and all(w in _BACKCHANNEL_WORDS for w in words))
    return Cues(asks, bool(_CLOSES.search(text)), keeps, bool(NOT_PERSONAL_LABEL.search(text)))


@dataclass(frozen=True)
class ValueDigest:
    """A value said as words, known by a keyed digest of its distinctive words (never the words): what a
    checkpoint carries so that a resumed call still redacts the value's read-back."""

    marker: str
    words: int  # how many distinctive words the value has
    digest: str  # hex SHA-256 over the salt and the words (see value_digest)

    def encoded(self) -> str:
        return f"{self.marker}:{self.words}:{self.digest}"

    @classmethod
    def decoded(cls, text: str) -> ValueDigest:
        """Raises ValueError naming the text when it is not ``MARKER:N:HEX``."""
        parts = text.split(":")
        if len(parts) != 3 or not parts[1].isascii() or not parts[1].isdigit() or not parts[0]:
            raise ValueError(f"not a value digest (MARKER:N:HEX): {text[:40]!r}")
        return cls(parts[0], int(parts[1]), parts[2])


def value_digest(salt: str, words: str) -> str:
    """The digest of a value's distinctive words, salted by the call (the same words in two calls differ)."""
    return hashlib.sha256(f"{salt}\0{words}".encode()).hexdigest()


@dataclass(frozen=True)
class ExchangeState:
    """The call's open exchanges as of one segment.

    ``focus``: the marker asked for last (what an answer's numbers are); ``asked_by``: the leg that named
    it (a password is the other leg's answer); ``idle_ms``: talk since anything sensitive was said;
    ``card_digits``: digits given while the card number was the focus, joined over segments (the card's
    chunks), which tells a card number complete (Luhn) from one still being read; ``card_complete``: a
    whole card number was given, known without its digits (a call resumed from its checkpoint)."""

    open: frozenset[str] = frozenset()
    focus: str | None = None
    asked_by: str = ""
    idle_ms: int = 0
    card_digits: str = ""
    card_complete: bool = False
    said: tuple[tuple[str, str], ...] = ()  # (words, marker): what was redacted as words, for read-backs
    # The same for a resumed call, as ValueDigest: its words are known only by their digest.
    said_digests: tuple[ValueDigest, ...] = ()

    def opened(self, markers: tuple[str, ...], leg: str) -> ExchangeState:
        """Naming ``markers`` opens their exchanges and moves the focus to the last one named."""
        if not markers:
            return self
        opens = set(self.open)
        for marker in markers:
            opens |= EXCHANGES[EXCHANGE_OF[marker]]
        focus = markers[-1]
        # "the card number and the expiry": the first thing asked is what the answer starts with.
        if focus in ("EXPIRY", "CVV") and "PAN" in markers and self.focus != "PAN":
            focus = "PAN"
        card = focus in ("PAN", "EXPIRY", "CVV")
        return replace(self, open=frozenset(opens), focus=focus, asked_by=leg, idle_ms=0,
                       card_digits=self.card_digits if card else "", card_complete=self.card_complete and card)

    def closed(self) -> ExchangeState:
        # What was said as words stays known for the call: an agent reads a password or street back later.
        return ExchangeState(said=self.said, said_digests=self.said_digests)

    def after(self, duration_ms: int, sensitive: bool, keeps: bool, idle_limit_ms: int) -> ExchangeState:
        """After a segment: sensitive talk keeps the exchange open; a backchannel or digression neither
        keeps nor ends it; other talk adds to the idle time, which ends the exchange past the limit."""
        if not self.open:
            return self
        if sensitive:
            return self if self.idle_ms == 0 else replace(self, idle_ms=0)
        if keeps:
            return self
        idle = self.idle_ms + max(0, duration_ms)
        return self.closed() if idle > idle_limit_ms else replace(self, idle_ms=idle)
