"""Redaction that does not depend on arrival order, card context after a misheard question, card numbers
read in chunks or garbled by ASR, and the analyzer's gate that releases a call's segments in time order."""

from __future__ import annotations

import itertools

import pytest

from pipeline.qa.call import CallAnalyzer, QaConfig
from pipeline.qa.redaction import CallRedactor
from pipeline.qa.segment import Segment

# A payment exchange: the agent's CVV question is misheard ("the three did you go"), the card is read
# in two chunks, then the code and the expiry follow; an amount is said afterwards.
CALL = [
    Segment("c", "agent", "a1", 0, 2000, "Can I have the card number please?"),
    Segment("c", "customer", "c1", 2500, 5000, "four one one one one one one one"),
    Segment("c", "customer", "c2", 5500, 8000, "one one one one one one one one"),
    Segment("c", "agent", "a2", 8500, 10000, "And the three did you go on the back?"),
    Segment("c", "customer", "c3", 10500, 12000, "the code is 321"),
    Segment("c", "customer", "c4", 12500, 14000, "oh four twenty six"),
    Segment("c", "agent", "a3", 14500, 17000, "Thanks, I've charged $45.20 to it on the 4th of May."),
]
EXPECTED = {
    "a1": "Can I have the card number please?",
    "c1": "[PAN]",
    "c2": "[PAN]",
    "a2": "And the three did you go on the back?",
    "c3": "the code is [CVV]",
    "c4": "[EXPIRY]",
    "a3": "Thanks, I've charged $45.20 to it on the 4th of May.",
}


def _redact_all(segments: list[Segment]) -> dict[str, str]:
    redactor = CallRedactor()
    return {s.segment_id: redactor.redact(s).text for s in segments}


def test_card_chunks_code_and_expiry_after_a_misheard_question() -> None:
    assert _redact_all(CALL) == EXPECTED


@pytest.mark.slow
def test_analyzer_gives_the_same_text_for_every_arrival_order(qa_config: QaConfig) -> None:
    """Decoding orders of the call (every 5th of the 5040, and the reverse, to keep it to seconds):
    identical stored text, released in time order."""
    orders = [*itertools.islice(itertools.permutations(CALL), 0, None, 5), CALL[::-1]]
    for order in orders:
        analyzer = CallAnalyzer("c", qa_config)
        for s in CALL:  # submitted in time order, as the VAD closes them
            analyzer.expect(s.leg, s.segment_id, s.start_ms)
        released = [a for s in order for a in analyzer.complete(s)]
        assert [a.redacted.segment.segment_id for a in released] == [s.segment_id for s in CALL]
        assert {a.redacted.segment.segment_id: a.redacted.text for a in released} == EXPECTED


def test_answer_is_held_until_the_question_is_decoded(qa_config: QaConfig) -> None:
    analyzer = CallAnalyzer("c", qa_config)
    question = Segment("c", "agent", "q", 0, 2000, "What's the security code?")
    answer = Segment("c", "customer", "r", 2500, 4000, "it's 731")
    analyzer.expect("agent", "q", 0)
    analyzer.expect("customer", "r", 2500)
    assert analyzer.complete(answer) == []  # the question may still change what the answer becomes
    assert [a.redacted.text for a in analyzer.complete(question)] == [question.text, "it's [CVV]"]


def test_answer_is_held_while_the_other_leg_may_still_start_before_it(qa_config: QaConfig) -> None:
    """The agent's question still open (or not yet heard) holds an answer that started after it."""
    analyzer = CallAnalyzer("c", qa_config)
    analyzer.expect("customer", "r", 2500)
    answer = Segment("c", "customer", "r", 2500, 4000, "it's 731")
    assert analyzer.complete(answer, {"agent": 0, "customer": 4000}) == []
    analyzer.expect("agent", "q", 0)
    question = Segment("c", "agent", "q", 0, 2600, "and the CVV?")
    released = analyzer.complete(question, {"agent": 5000, "customer": 5000})
    assert [a.redacted.text for a in released] == ["and the CVV?", "it's [CVV]"]


def test_skipped_and_unfinished_segments_do_not_block_forever(qa_config: QaConfig) -> None:
    analyzer = CallAnalyzer("c", qa_config)
    analyzer.expect("agent", "silence", 0)
    analyzer.expect("customer", "r", 1000)
    analyzer.expect("agent", "lost", 1500)
    analyzer.expect("customer", "r2", 2000)
    assert analyzer.complete(Segment("c", "customer", "r", 1000, 1400, "hello")) == []
    assert [a.redacted.text for a in analyzer.skip("silence")] == ["hello"]
    assert analyzer.complete(Segment("c", "customer", "r2", 2000, 2400, "bye")) == []  # "lost" pending
    assert [a.redacted.text for a in analyzer.flush()] == ["bye"]


@pytest.mark.parametrize(
    "said",
    [
        "my card number is four one one one one one one one one one one one one one one two",
        "card number 4111 1111 1111 112",  # a digit lost by ASR: 15 digits, Luhn fails
        "my card number is four one double one, um, triple one one, one one one one, one one one one",
        "on the card: oh four, double five, triple seven, two",
    ],
)
def test_garbled_and_spoken_card_numbers_in_card_context(said: str) -> None:
    text = _redact_all([Segment("c", "customer", "s", 0, 5000, said)])["s"]
    assert "[PAN]" in text, text
    assert not any(word in text for word in ("one", "four", "1111", "double", "triple")), text


@pytest.mark.parametrize(
    "said",
    [
        "I'll put $45.20 on the card",
        "the card costs 150 dollars a year",
        "I've had this card since 2019",
        "your new card arrives on the 4th of May, in 7 to 10 days",
        "that's 12.99 on your card",
    ],
)
def test_card_context_leaves_amounts_dates_and_counts(said: str) -> None:
    assert _redact_all([Segment("c", "agent", "s", 0, 5000, said)])["s"] == said


def test_order_numbers_without_card_context_stay_readable() -> None:
    said = "my order number is four one one one one one one one one one one one one one one two"
    assert _redact_all([Segment("c", "customer", "s", 0, 5000, said)])["s"] == said


def test_partial_does_not_open_context() -> None:
    redactor = CallRedactor()
    redactor.redact(Segment("c", "agent", "q", 0, 1000, "What's the CVV?"), remember=False)
    assert redactor.redact(Segment("c", "customer", "r", 1500, 2000, "it's 123")).text == "it's 123"


def test_partial_over_an_undecoded_question_is_redacted_as_if_asked(qa_config: QaConfig) -> None:
    """A partial is published at once: while the question before it is unknown it assumes the worst."""
    analyzer = CallAnalyzer("c", qa_config)
    analyzer.expect("agent", "q", 0)
    partial = Segment("c", "customer", "r", 2500, 3000, "it's 731")
    assert analyzer.redact_partial(partial).text == "it's [CVV]"
    analyzer.skip("q")  # the question turned out to be silence: nothing before the partial is unknown
    assert analyzer.redact_partial(partial).text == "it's 731"
    assert analyzer.redact_partial(partial, {"agent": 1000, "customer": 2500}).text == "it's [CVV]"


def test_phone_number_said_with_oh_after_call_me_and_a_slashed_date_in_card_context() -> None:
    texts = _redact_all([
        Segment("c", "customer", "p", 0, 4000, "call me on oh two oh seven nine four six oh nine five eight"),
        Segment("c", "agent", "d", 5000, 8000, "your card was issued on 12/05"),
    ])  # fmt: skip
    assert texts == {"p": "call me on [PHONE]", "d": "your card was issued on 12/05"}


def test_a_call_resumed_from_its_redacted_finals_keeps_the_card_context(qa_config: QaConfig) -> None:
    """A worker taking over a call rebuilds its redaction context from the stored finals, whose card numbers
    are already "[PAN]": the card's exchange must still be open, or an expiry or code said after it leaks (a
    chaos run stored "L227", the expiry "oh two twenty seven", after a kill -9 moved call 12 between its card
    number and its expiry)."""
    said = [
        Segment("c", "agent", "a1", 0, 2000, "Thank you. The premium is forty nine dollars. What is the card number?"),
        Segment("c", "customer", "c1", 2500, 5000, "Let me get my card. It is 4012, 8888."),
        Segment("c", "customer", "c2", 7500, 9000, "8888, 1881."),
        Segment("c", "agent", "a2", 9500, 11000, "Thank you. And the expiry date?"),
    ]
    answer = Segment("c", "customer", "c3", 11500, 12500, "L227")
    whole = CallAnalyzer("c", qa_config)
    stored = [whole.process(s).redacted.segment for s in said]
    assert [s.text for s in stored[1:3]] == ["Let me get my card. It is [PAN].", "[PAN]."]
    expected = whole.process(answer).redacted.segment.text

    resumed = CallAnalyzer("c", qa_config)  # as pipeline/worker/checkpoints.py restores a call
    for segment in stored:
        resumed.process(segment)
    assert expected == "L[EXPIRY]"
    assert resumed.process(answer).redacted.segment.text == expected
