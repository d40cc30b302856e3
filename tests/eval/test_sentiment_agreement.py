"""The sentiment scorer against the call library's labels, on the scripts' text (no audio, no model).

The goal: ≥ 85 % of labelled turns and every call's trend right. VADER with the particles
and the one-point band reached 74.5 % of turns (13 of 23 trends); VADER as shipped, ±0.05: 64.7 %. The
contact-center lexicon (pipeline/qa/sentiment_lexicon.yaml) was chosen on the development half only
(odd-numbered calls); on the held-out half (even-numbered) it went from 70.1 % to 83.9 % of turns, on
all turns from 74.5 % to 91.3 %. Trends: 11 of 23 (13 before; 6 of 11 held out, 5 before): the thirds'
mean does not follow the trend labels even when the labels themselves are scored (9 of 23), so the
trend goal is not reached. The assertions keep what was reached, so a change that loses it fails.
"""

from __future__ import annotations

from pipeline.eval.sentiment import baseline_agreement, evaluate_scripts, half, load_labels
from pipeline.qa.sentiment import LABELS, TRENDS, LegSentiment

REACHED_TURNS = 168 / 184  # 91.3 %, all turns
REACHED_HELD_OUT = 73 / 87  # 83.9 %, the held-out half: the honest figure
REACHED_TRENDS = 11
REACHED_HELD_OUT_TRENDS = 6
BASELINE = 119 / 184  # 64.7 %: VADER's whole lexicon and its documented ±0.05 compound band
POINTS = {"negative": -2.0, "neutral": 0.0, "positive": 2.0}


def test_every_customer_turn_and_every_call_is_labelled() -> None:
    labels = load_labels()
    assert len(labels) >= 23
    for call, (trend, turns) in labels.items():
        assert trend in TRENDS, call
        for leg, text, mood in turns:
            assert (mood in LABELS) == (leg == "customer"), (call, text)


def test_both_halves_hold_every_mood_and_every_trend() -> None:
    labels = load_labels()
    for name in ("dev", "held-out"):
        calls = {call: v for call, v in labels.items() if half(call) == name}
        assert {trend for trend, _ in calls.values()} == set(TRENDS), name
        assert {mood for _, turns in calls.values() for leg, _, mood in turns if leg == "customer"} == set(LABELS)
    assert (half("05_rude_agent"), half("06_agent_does_not_care")) == ("dev", "held-out")


def test_agreement_with_the_labels_on_the_scripts_text() -> None:
    report = evaluate_scripts()
    held_out = report.of_half("held-out")
    print("\n" + "\n".join(report.lines()))
    for name in ("dev", "held-out"):
        print(f"{name} half: {report.of_half(name).summary()}")
    baseline = baseline_agreement()
    print(f"VADER as shipped (±0.05 compound): {baseline:.1%}")
    assert len(report.turns) == 184 and len(report.calls) == 23 and len(held_out.turns) == 87
    assert report.agreement >= REACHED_TURNS, f"{report.agreement:.1%} of turns agree, < {REACHED_TURNS:.1%}"
    assert held_out.agreement >= REACHED_HELD_OUT, f"held out: {held_out.agreement:.1%} < {REACHED_HELD_OUT:.1%}"
    assert report.trends_right >= REACHED_TRENDS and held_out.trends_right >= REACHED_HELD_OUT_TRENDS
    assert report.agreement > baseline == BASELINE  # the particles, the band and the lexicon are worth their place


def test_the_trend_labels_are_not_a_function_of_the_turn_labels_thirds() -> None:
    """Why the trend goal is out of reach of a better turn scorer: the labels themselves, as scores, give
    the right trend in only 9 of 23 calls under the start/end thirds definition (pipeline/qa/sentiment.py)."""
    right = 0
    for trend, turns in load_labels().values():
        scores = [POINTS[mood] for leg, _, mood in turns if leg == "customer"]
        right += LegSentiment.of("customer", scores).trend == trend
    assert right == 9
