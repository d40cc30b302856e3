"""PII redaction on transcript fixtures: written and spoken numbers, Luhn, context-dependent CVV/expiry."""

from __future__ import annotations

import pytest

from pipeline.qa.numbers import digit_runs, luhn_valid
from pipeline.qa.redaction import CallRedactor
from pipeline.qa.segment import Segment

# Well-known test card numbers (Luhn-valid) and one digit changed (Luhn-invalid).
VISA = "4111 1111 1111 1111"
AMEX = "3782 822463 10005"
NOT_A_CARD = "4111 1111 1111 1112"


def _one(text: str, leg: str = "customer") -> tuple[str, dict[str, int]]:
    out = CallRedactor().redact(Segment("c", leg, "s1", 1000, 4000, text))  # type: ignore[arg-type]
    return out.text, out.counts


def test_luhn() -> None:
    assert luhn_valid(VISA.replace(" ", "")) and luhn_valid(AMEX.replace(" ", ""))
    assert not luhn_valid(NOT_A_CARD.replace(" ", ""))


@pytest.mark.parametrize(
    "said",
    [
        VISA,
        VISA.replace(" ", "-"),
        VISA.replace(" ", ""),
        "4111, 1111, 1111, 1111",
        AMEX,
        "four one one one one one one one one one one one one one one one",
        "four one double one, one one one one, triple one one, one one one one",
        "forty one eleven eleven eleven eleven eleven eleven eleven",
        "three seven eight two eight two two four six three one oh oh oh five",
        "4111 1111 one one one one 1111",
    ],
)
def test_card_numbers_written_or_spoken_are_redacted(said: str) -> None:
    text, counts = _one(f"sure my card number is {said} okay")
    assert text == "sure my card number is [PAN] okay"
    assert counts == {"PAN": 1}


@pytest.mark.parametrize(
    "said", [NOT_A_CARD, "four one one one one one one one one one one one one one one two"]
)
def test_luhn_invalid_sixteen_digits_are_not_a_card(said: str) -> None:
    text, counts = _one(f"my order number is {said}")
    assert "[PAN]" not in text and "PAN" not in counts


def test_card_followed_by_more_digits_keeps_card_span() -> None:
    text, counts = _one(f"it's {VISA} 7 7")
    assert text == "it's [PAN] 7 7" and counts == {"PAN": 1}


def test_ssn_written_and_spoken_when_asked() -> None:
    assert _one("my social is 123-45-6789") == ("my social is [SSN]", {"SSN": 1})
    redactor = CallRedactor()
    redactor.redact(Segment("c", "agent", "s1", 0, 2000, "Can I have your social security number?"))
    spoken = redactor.redact(
        Segment("c", "customer", "s2", 2500, 6000, "sure it's one two three four five six seven eight nine")
    )
    assert spoken.text == "sure it's [SSN]" and spoken.counts == {"SSN": 1}


def test_nine_digits_without_context_or_grouping_stay() -> None:
    assert _one("reference 123456789 please")[1] == {}
    assert _one("it's 666-12-3456")[1] == {}  # not a valid SSN area number


@pytest.mark.parametrize(
    "said",
    [
        "(415) 555-2671",
        "415-555-2671",
        "415.555.2671",
        "4155552671",
        "+1 415 555 2671",
        "1 415 555 2671",
        "four one five five five five two six seven one",
        "+44 20 7946 0958",
    ],
)
def test_phone_numbers(said: str) -> None:
    text, counts = _one(f"call me on {said} tomorrow")
    assert text == "call me on [PHONE] tomorrow" and counts == {"PHONE": 1}


def test_local_phone_number_needs_context() -> None:
    assert _one("the total was 5552671 points")[1] == {}
    assert _one("my phone is 555 2671")[0] == "my phone is [PHONE]"


@pytest.mark.parametrize(
    ("said", "expected"),
    [
        ("john.smith@example.com", "[EMAIL]"),
        ("j_doe+bills@mail.example.co.uk", "[EMAIL]"),
        ("john dot smith at example dot com", "[EMAIL]"),
        ("jsmith at gmail.com", "[EMAIL]"),
        ("mary underscore jones at yahoo dot co dot uk", "[EMAIL]"),
    ],
)
def test_email_addresses(said: str, expected: str) -> None:
    text, counts = _one(f"it is {said} thanks")
    assert text == f"it is {expected} thanks" and counts == {"EMAIL": 1}


def test_web_site_is_not_an_email() -> None:
    assert _one("you can visit us at acme dot com", leg="agent")[1] == {}


def test_cvv_and_expiry_only_after_agent_asks() -> None:
    answer = "it's oh four twenty six, and then seven three one"
    assert _one(answer)[1] == {}  # without the question these are just numbers

    redactor = CallRedactor()
    asked = redactor.redact(
        Segment("c", "agent", "s1", 0, 3000, "And the expiry date and the security code on the back?")
    )
    assert asked.counts == {}
    out = redactor.redact(Segment("c", "customer", "s2", 3500, 8000, answer))
    assert out.text == "it's [EXPIRY], and then [CVV]"
    assert out.counts == {"EXPIRY": 1, "CVV": 1}
    readback = redactor.redact(
        Segment("c", "agent", "s3", 8500, 11000, "Thanks: April twenty twenty six, 731, 12/25.")
    )
    assert readback.text == "Thanks: [EXPIRY], [CVV], [EXPIRY]."
    assert (out.segment.start_ms, out.segment.end_ms, out.segment.segment_id) == (3500, 8000, "s2")


def test_an_exchange_ends_after_talk_on_something_else_not_after_a_count_of_segments() -> None:
    """Backchannels and a digression keep the security-code question open however many segments they take;
    20 s of talk about something else (an idle limit of 15 s) ends it."""
    redactor = CallRedactor(idle_ms=15_000)
    turns = [("agent", 0, 2_000, "What's the CVV?"), ("customer", 2_500, 3_000, "sorry one moment"),
             ("agent", 3_500, 4_000, "sure, take your time"), ("customer", 4_500, 5_000, "okay"),
             ("agent", 5_500, 6_000, "mm hmm"), ("customer", 6_500, 8_000, "it's 123"),
             ("agent", 9_000, 29_000, "Great. I see you also had trouble with the router last week, did the technician"
              " fix the wiring in the basement and the signal upstairs?"),
             ("customer", 30_000, 31_000, "it's 123")]
    texts = [redactor.redact(Segment("c", leg, f"s{start}", start, end, text)).text  # type: ignore[arg-type]
             for leg, start, end, text in turns]
    assert texts[5] == "it's [CVV]"
    assert texts[7] == "it's 123"


def test_customer_asking_does_not_open_context() -> None:
    redactor = CallRedactor()
    redactor.redact(Segment("c", "customer", "s1", 0, 1000, "where is the security code?"))
    assert redactor.redact(Segment("c", "agent", "s2", 1000, 2000, "you owe 123 dollars")).counts == {}


def test_several_kinds_in_one_segment() -> None:
    text, counts = _one(f"card {VISA}, email a.b@c.org, phone 415 555 2671, ssn 078-05-1120")
    assert text == "card [PAN], email [EMAIL], phone [PHONE], ssn [SSN]"
    assert counts == {"PAN": 1, "EMAIL": 1, "PHONE": 1, "SSN": 1}


def test_ordinary_speech_is_untouched() -> None:
    said = "Oh I see, one moment please, I paid 150 dollars at 3 pm on the 12th for two items."
    assert _one(said) == (said, {})


def test_spoken_number_parsing() -> None:
    _, runs = digit_runs("oh four twenty six, double five, four hundred twelve, nineteen")
    assert [item.digits for item in runs[0].items] == ["0", "4", "26", "55", "412", "19"]


def _call(turns: list[tuple[str, int, str]]) -> list[str]:
    redactor = CallRedactor()
    return [redactor.redact(Segment("c", leg, f"c/{leg}/{t:09d}", t, t + 1500, text)).text  # type: ignore[arg-type]
            for leg, t, text in turns]


def test_security_code_after_the_expiry_is_redacted_when_its_question_was_misheard() -> None:
    # Seen end to end (library call 12): the code comes four segments after the card, past the expiry,
    # and ASR lost the question entirely; the expiry keeps the card's context open.
    texts = _call([("customer", 31_572, VISA), ("agent", 34_164, "Thank you, and the XIRE date."),
                   ("customer", 36_788, "twelve twenty six"), ("agent", 38_676, "and the thing on the back?"),
                   ("customer", 41_396, "seven three nine")])
    assert texts[0] == "[PAN]" and texts[2] == "[EXPIRY]" and texts[4] == "[CVV]"


@pytest.mark.parametrize("question", ["and the secure G-code on the back.", "and the secure iG code",
                                      "what's the security code", "And the secure a G code on the back."])
def test_garbled_security_code_question_opens_cvv_context(question: str) -> None:
    texts = _call([("agent", 1_000, question), ("customer", 3_000, "591")])
    assert texts[1] == "[CVV]"


def test_without_card_or_code_context_a_three_digit_answer_stays() -> None:
    texts = _call([("agent", 1_000, "how many licences do you need?"), ("customer", 3_000, "591")])
    assert texts[1] == "591"


@pytest.mark.parametrize("heard", [
    # Seen end to end: ASR looped on the ones of 6011 1111 1111 1117 after the Luhn-valid part.
    "6 0 1 1 1 1 1 1 1 1 1 1 1 1 1 7, 111, 111, 111, 111, 111, 111, 111, 111, 111,",
    "111, 6011 1111 1111 1117 1111 1111",
    "card number 6011 1111 1111 1117 1111 1111 1111 1111",  # 32 digits: too long for a card, yet one
])
def test_no_digit_of_a_garbled_card_read_out_stays_readable(heard: str) -> None:
    texts = _call([("agent", 1_000, "can I have the card number please?"), ("customer", 3_000, heard)])
    assert "[PAN]" in texts[1] and not any(ch.isdigit() for ch in texts[1]), texts[1]


def test_an_expiry_a_model_wrote_as_a_time_is_redacted_but_a_time_elsewhere_is_not() -> None:
    # "oh nine twenty-eight" came out of Moonshine as "Oh, 9:28."; a time said without the question stays.
    assert _one("call me back at 9:28 please")[1] == {}
    redactor = CallRedactor()
    redactor.redact(Segment("c", "agent", "s1", 0, 3000, "And the expiry date?"))
    out = redactor.redact(Segment("c", "customer", "s2", 3500, 5000, "Oh, 9:28."))
    assert (out.text, out.counts) == ("[EXPIRY].", {"EXPIRY": 1})
