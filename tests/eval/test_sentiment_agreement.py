"""The sentiment scorer against the call library's labels, on the scripts' text (no audio, no model).

Issue 27's goal was ≥ 85 % of labelled turns and every call's trend right. VADER does not get there on
these labels (measured below: 74.5 % of turns, 13 of 23 trends; VADER as shipped, ±0.05: 64.7 %): it
misses complaints said without loaded words ("nobody has called me back") and reads requests and thanks
as feeling. The assertions keep what it reaches, so a change to the scorer that loses agreement fails.
"""

from __future__ import annotations

from pipeline.eval.sentiment import baseline_agreement, evaluate_scripts, load_labels
from pipeline.qa.sentiment import LABELS, TRENDS

REACHED_TURNS = 137 / 184  # 74.5 %
REACHED_TRENDS = 13
BASELINE = 119 / 184  # 64.7 %: VADER's whole lexicon and its documented ±0.05 compound band


def test_every_customer_turn_and_every_call_is_labelled() -> None:
    labels = load_labels()
    assert len(labels) >= 23
    for call, (trend, turns) in labels.items():
        assert trend in TRENDS, call
        for leg, text, mood in turns:
            assert (mood in LABELS) == (leg == "customer"), (call, text)


def test_agreement_with_the_labels_on_the_scripts_text() -> None:
    report = evaluate_scripts()
    print("\n" + "\n".join(report.lines()))
    baseline = baseline_agreement()
    print(f"VADER as shipped (±0.05 compound): {baseline:.1%}")
    assert len(report.turns) == 184 and len(report.calls) == 23
    assert report.agreement >= REACHED_TURNS, f"{report.agreement:.1%} of turns agree, < {REACHED_TURNS:.1%}"
    assert report.trends_right >= REACHED_TRENDS
    assert report.agreement > baseline == BASELINE  # the particles and the band are worth their place
