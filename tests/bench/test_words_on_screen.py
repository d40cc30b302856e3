"""When each spoken word first reached the screen (`words_on_screen`): expectations worked out by hand from a
made-up call, word times and stream events (no library, no aligner)."""

from __future__ import annotations

import pytest

from pipeline.bench.traffic import CallPlan, LibraryTurn, Turn
from pipeline.bench.word_times import WordTime, turn_key
from pipeline.bench.words_on_screen import ShownTurn, summary, words_shown

WALL0 = 1000.0
SOURCE = LibraryTurn("lib-a", "customer", 40_000, 42_000, "Hello my card number")  # type: ignore[arg-type]
AGENT_SOURCE = LibraryTurn("lib-a", "agent", 50_000, 51_000, "card please")  # type: ignore[arg-type]
# Ends in ms from the library turn's start.
TIMES = {turn_key(SOURCE): (WordTime("hello", 300), WordTime("my", 600), WordTime("card", 1200),
                            WordTime("number", 1800)),
         turn_key(AGENT_SOURCE): (WordTime("card", 400), WordTime("please", 800))}
# Placed on the call at 2.0 s (customer) and 5.0 s (agent); the call arrives 10 s into the traffic.
PLAN = CallPlan("c1", 10.0, 60_000, (Turn("customer", 2000, 4000, SOURCE.text, SOURCE),  # type: ignore[arg-type]
                                     Turn("agent", 5000, 6000, AGENT_SOURCE.text, AGENT_SOURCE)), 60_000)  # type: ignore[arg-type]


def shown(leg: str, start: int, end: int, text: str, final: bool, received: float) -> ShownTurn:
    return ShownTurn("c1", leg, start, end, text, final, WALL0 + received)


def test_each_word_is_timed_from_its_end_to_the_first_event_that_shows_it() -> None:
    events = [
        # The first partial covers 2.0-3.0 s of the call: hello (ends 12.3 s) and my (12.6 s) are in it.
        shown("customer", 2000, 3000, "Hello, my", False, 13.5),
        # The agent's final says "card" too, but on the other leg: it shows none of the customer's words.
        shown("agent", 5000, 6000, "Card, please.", True, 16.6),
        # The final: "cart" is not what was said, so "card" is never shown; "number" (ends 13.8 s) is.
        shown("customer", 2000, 4000, "Hello, my cart number.", True, 15.0),
        # A replay of the partial, later: changes nothing.
        shown("customer", 2000, 3000, "Hello, my", False, 20.0),
    ]
    words = {(w.leg, w.word): w for w in words_shown([PLAN], TIMES, events, WALL0)}
    assert words["customer", "hello"].spoken_s == pytest.approx(WALL0 + 12.3)
    assert words["customer", "hello"].latency_s == pytest.approx(1.2)
    assert words["customer", "hello"].by_partial
    assert words["customer", "my"].latency_s == pytest.approx(0.9)
    assert words["customer", "card"].shown_s is None
    assert words["customer", "number"].latency_s == pytest.approx(1.2)
    assert not words["customer", "number"].by_partial
    assert words["agent", "card"].latency_s == pytest.approx(16.6 - 15.4)
    assert words["agent", "please"].latency_s == pytest.approx(16.6 - 15.8)


def test_a_word_is_not_shown_by_an_event_whose_audio_ended_before_it_was_spoken() -> None:
    # The partial covers 2.0-2.4 s: only "hello" (ends 2.3 s into the call) was spoken in it. Its text says
    # "number" (a guess the recogniser made): that is not "number" shown, which is spoken at 3.8 s.
    events = [shown("customer", 2000, 2400, "hello number", False, 13.0),
              shown("customer", 2000, 4000, "hello my card number", True, 14.5)]
    words = {w.word: w for w in words_shown([PLAN], TIMES, events, WALL0) if w.leg == "customer"}
    assert words["hello"].latency_s == pytest.approx(0.7) and words["hello"].by_partial
    assert words["number"].latency_s == pytest.approx(0.7) and not words["number"].by_partial


def test_the_summary_counts_the_window_s_words_and_their_percentiles() -> None:
    events = [shown("customer", 2000, 3000, "hello my", False, 13.5),
              shown("customer", 2000, 4000, "hello my card number", True, 15.0)]
    words = words_shown([PLAN], TIMES, events, WALL0)
    # Window 12.5-20 s: my (12.6), card (13.2), number (13.8), the agent's two (15.4, 15.8; never shown).
    got = summary(words, WALL0 + 12.5, WALL0 + 20.0)
    assert got["words_spoken"] == 5 and got["words_shown"] == 3 and got["first_by_partial"] == 1
    # Delays 0.9 (my, partial), 1.8 (card), 1.2 (number): the median is 1.2, the largest 1.8.
    assert got["first_shown"]["p50_s"] == pytest.approx(1.2) and got["first_shown"]["max_s"] == pytest.approx(1.8)
    assert got["first_shown_by_partial"]["p50_s"] == pytest.approx(0.9)
