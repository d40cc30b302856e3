"""Sentiment per segment, per leg and per call; sentiment rules (at start/end/call, sharp drop) and their
scorecard answers. No broker: the analyzer as the worker and `callqa analyze` use it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

from pipeline.qa.call import CallAnalyzer, QaConfig
from pipeline.qa.rules import RuleSet, load_rules, load_rules_file
from pipeline.qa.scorecard import load_scorecard
from pipeline.qa.sentiment import (
    LegSentiment,
    call_sentiment,
    drop_of,
    edge_turns,
    is_sharp_drop,
    label,
    load_lexicon,
    score_text,
    trend_of,
)
from pipeline.qa.yaml_source import RulesError
from tests.qa.conftest import SegmentFactory

PLAIN = SentimentIntensityAnalyzer()


def test_a_score_is_vaders_compound_on_the_minus_five_to_five_scale() -> None:
    for text in ("This is the worst service I have ever had.", "Thank you so much, that is wonderful.",
                 "The tenth of October, nineteen sixty five."):
        assert score_text(text) == round(PLAIN.polarity_scores(text)["compound"] * 5, 1)
    assert score_text("This is the worst service I have ever had.") < -2.5
    assert score_text("Thank you so much, that is wonderful.") > 2.5
    assert score_text("") == score_text("   ") == 0.0


def test_answer_particles_carry_no_feeling_and_no_thank_you_is_a_polite_decline() -> None:
    # Plain VADER scores these: "No that is all." -1.5, "Sure, it is ..." +1.6, "Okay." +1.1, "Yes, please." +3.1
    assert PLAIN.polarity_scores("No that is all.")["compound"] < -0.05
    for text in ("No that is all.", "Sure, it is the fourth of May.", "Okay.", "Yes, please."):
        assert score_text(text) == 0.0, text
    # The decline of "anything else?" is a formula, not thanks for something (the library's labels: neutral).
    # It was scored as "No, thank you" (+1.8) until the contact-center lexicon made the phrase neutral.
    assert PLAIN.polarity_scores("No thank you.")["compound"] < -0.05  # VADER alone: thanks negated
    assert score_text("No thank you.") == score_text("No, thank you.") == score_text("No thanks.") == 0.0
    assert score_text("No, thank you. That was wonderful.") > 1.0  # feeling said besides the decline still counts
    assert score_text("That is no good.") < -1.0  # "no" still negates what is not thanks


def test_the_contact_center_lexicon_reads_plain_complaints_and_neutral_requests() -> None:
    lexicon = load_lexicon()
    assert lexicon.words and lexicon.phrases and all(-4 <= v <= 4 for v in lexicon.entries().values())
    # Complaints of service failure without a word VADER knows as negative: VADER alone scores them 0 or above.
    for text in ("I sent the documents two weeks ago and nobody has called me back.",
                 "I already sent it. I want to speak to a manager.", "I have been waiting for a month."):
        assert PLAIN.polarity_scores(text)["compound"] >= 0.0, text
        assert label(score_text(text)) == "negative", text
    # Requests and the call's subject: VADER alone reads them as feeling (like +1.5, damage -2.2).
    for text in ("Hi, I would like to pay my premium.", "Does my policy cover water damage?"):
        assert abs(PLAIN.polarity_scores(text)["compound"]) > 0.2, text
        assert label(score_text(text)) == "neutral", text
    # A phrase matches across a comma and in any case; its words inside other words do not.
    assert score_text("NOBODY, called me.") == score_text("nobody called me.") < -1.0
    assert score_text("The attic is at least ten years old.") < 0 <= score_text("The attic is atleast old.")


@pytest.mark.parametrize(("score", "expected"), [(-1.0, "negative"), (-0.9, "neutral"), (0.0, "neutral"),
                                                 (0.9, "neutral"), (1.0, "positive"), (4.2, "positive")])
def test_a_turn_is_neutral_within_one_point(score: float, expected: str) -> None:
    assert label(score) == expected


def test_start_and_end_are_the_first_and_last_third_of_a_legs_turns() -> None:
    assert [edge_turns(n) for n in (0, 1, 2, 3, 4, 6, 7, 9, 10)] == [0, 1, 1, 1, 2, 2, 3, 3, 4]
    leg = LegSentiment.of("customer", [-3.0, -1.0, 0.0, 0.0, 2.0, 4.0, 0.0])  # thirds of 3 turns
    assert (leg.turns, leg.start, leg.end, leg.overall) == (7, round(-4 / 3, 2), 2.0, 0.29)
    assert leg.change == 3.33 and leg.trend == "improving"
    assert LegSentiment.of("agent", [1.0]).trend == "steady"  # one turn is its own start and end
    assert [trend_of(c) for c in (1.0, 0.99, -0.99, -1.0)] == ["improving", "steady", "steady", "worsening"]
    silent = call_sentiment([("agent", 2.0)])
    assert silent.leg("customer").turns == 0 and "customer_sentiment" not in silent.as_metrics()
    assert silent.as_metrics()["agent_sentiment_end"] == 2.0


def test_a_sharp_drop_is_two_points_below_the_best_of_the_two_turns_before_and_negative() -> None:
    assert drop_of([2.0, 0.0, -1.0], 3) == 3.0 and is_sharp_drop([2.0, 0.0, -1.0], 2, 3)
    assert not is_sharp_drop([4.0, 1.5], 2, 3)  # fell 2.5 points, but still content: not an alert
    assert not is_sharp_drop([2.0, 0.0, 0.0, -1.0], 2, 3)  # the +2 is four turns back
    assert not is_sharp_drop([-3.0], 2, 3) and drop_of([-3.0], 3) == 0.0  # a first turn has nothing to fall from


def test_the_analyzer_scores_the_redacted_text_and_reports_both_legs(qa_config: QaConfig, seg: SegmentFactory) -> None:
    analyzer = CallAnalyzer("c1", qa_config)
    analyzer.process(seg("agent", 0, 4, "Thank you for calling. What is the card number?"))
    card = analyzer.process(seg("customer", 5, 9, "It is 4111 1111 1111 1111, a terrible card."))
    assert "[PAN]" in card.redacted.text and card.sentiment == score_text(card.redacted.text)
    for i, text in enumerate(["This is awful.", "Okay.", "Thank you, that is wonderful news."]):
        analyzer.process(seg("customer", 10 + 5 * i, 13 + 5 * i, text))
    result = analyzer.finalize(30_000)
    customer = result.sentiment.leg("customer") if result.sentiment else None
    assert customer is not None and customer.turns == 4 and customer.trend == "improving"
    for name in ("customer_sentiment", "customer_sentiment_start", "customer_sentiment_end", "agent_sentiment_end"):
        assert name in result.metrics
    assert result.metrics["customer_sentiment_end"] == customer.end > 1.0


RULES = """
version: 1
rules:
  - name: happy_end
    category: experience
    type: must
    leg: customer
    sentiment: {at: end, min: 0}
  - name: drop
    category: experience
    type: detect
    leg: customer
    sentiment: {drop: 2}
  - name: calm_start
    category: experience
    type: must_not
    leg: customer
    sentiment: {at: start, max: -1.5}
"""


def _config(tmp_path: Path, rules: str = RULES, questions: str = "") -> QaConfig:
    (tmp_path / "r.yaml").write_text(textwrap.dedent(rules))
    rule_set = load_rules(tmp_path)
    card = tmp_path / "card.yaml"
    card.write_text("name: t\nquestions:\n  - id: end\n    question: Happy at the end?\n    rule: happy_end\n"
                    "    weight: 10\n" + questions)
    return QaConfig(rule_set, load_scorecard(card, rule_set))


def test_sentiment_rules_at_call_end_and_the_scorecard_answer(tmp_path: Path, seg: SegmentFactory) -> None:
    config = _config(tmp_path, questions="  - id: check\n    question: End >= 1?\n    check: customer_sentiment_end >= 1\n"
                                         "    weight: 10\n")
    analyzer = CallAnalyzer("c1", config)
    texts = ["This is a disgrace, I am furious.", "The fifth of May.", "Okay.", "That is wonderful, thank you."]
    for i, text in enumerate(texts):
        analyzer.process(seg("customer", 5 * i, 5 * i + 3, text))
    result = analyzer.finalize(20_000)
    events = {e.rule: e for e in result.events}
    assert events["happy_end"].kind == "match" and events["happy_end"].leg == "customer"
    assert events["happy_end"].offset_ms == 10_000  # the first of the last third (2 of 4 turns)
    assert events["happy_end"].text.startswith("customer_sentiment_end = ")
    assert events["calm_start"].kind == "violation"  # started at or below -1.5 (-3.9 and 0)
    assert [i.passed for i in result.items] == [True, True]
    assert result.score_pct == 100.0


def test_a_sentiment_rule_on_a_silent_leg_is_not_applicable(tmp_path: Path, seg: SegmentFactory) -> None:
    analyzer = CallAnalyzer("c1", _config(tmp_path))
    analyzer.process(seg("agent", 0, 3, "Hello?"))
    result = analyzer.finalize(10_000)
    assert not [e for e in result.events if e.rule == "happy_end"]
    assert result.items[0].passed is None and "not applicable" in result.items[0].rationale


def test_a_sharp_drop_is_a_live_alert_once_per_falling_run(tmp_path: Path, seg: SegmentFactory) -> None:
    analyzer = CallAnalyzer("c1", _config(tmp_path))
    texts = ["Great, thanks.", "Fine.", "This is terrible.", "This is the worst, awful.", "Okay.", "Okay.",
             "Okay.", "This is a disgrace."]
    live = [analyzer.process(seg("customer", 5 * i, 5 * i + 3, t)).events for i, t in enumerate(texts)]
    raised = [i for i, events in enumerate(live) if any(e.rule == "drop" for e in events)]
    assert raised == [2, 7]  # turn 3 fell too, but is the same run; turn 8 falls from 0 (neutral) to negative
    alert = live[2][0]
    assert (alert.kind, alert.leg, alert.text, alert.offset_ms) == ("alert", "customer", "This is terrible.", 10_000)
    finals = [e for e in analyzer.finalize(50_000).events if e.rule == "drop"]
    assert [e.offset_ms for e in finals] == [10_000, 35_000]


def test_out_of_order_segments_get_the_same_sentiment_verdicts(tmp_path: Path, seg: SegmentFactory) -> None:
    config = _config(tmp_path)
    texts = [(0, "This is a disgrace."), (5, "The fifth of May."), (10, "Thank you, wonderful.")]
    in_order, shuffled = CallAnalyzer("c1", config), CallAnalyzer("c1", config)
    segments = [seg("customer", at, at + 3, text) for at, text in texts]
    for s in segments:
        in_order.process(s)
    for s in reversed(segments):
        shuffled.process(s)
    a, b = in_order.finalize(20_000), shuffled.finalize(20_000)
    assert a.sentiment == b.sentiment and [(e.rule, e.kind) for e in a.events] == [(e.rule, e.kind) for e in b.events]


@pytest.mark.parametrize(("rule", "line", "reason"), [
    ("    type: must\n    leg: customer\n    sentiment: {at: end}\n", 6, "needs min, max or both"),
    ("    type: must\n    leg: any\n    sentiment: {at: end, min: 0}\n", 6, "needs leg: agent or customer"),
    ("    type: detect\n    leg: customer\n    sentiment: {at: end, min: 0}\n", 4, "must be of type must or must_not"),
    ("    type: must\n    leg: customer\n    sentiment: {drop: 2}\n", 4, "must be of type detect or must_not"),
    ("    type: must\n    leg: customer\n    sentiment: {at: end, min: 6}\n", 6, "within [-5.0, 5.0]"),
    ("    type: must\n    leg: customer\n    sentiment: {at: middle, min: 0}\n", 6, "sentiment.at must be one of"),
    ("    type: must\n    leg: customer\n    window: {first_s: 30}\n    sentiment: {at: end, min: 0}\n", 6,
     "'window' applies to phrases"),
    ("    type: must\n    leg: customer\n    phrases: [x]\n    sentiment: {at: end, min: 0}\n", 7,
     "either phrases or sentiment"),
    ("    type: must\n    leg: customer\n", 2, "lacks required key(s): phrases (or sentiment)"),
])
def test_malformed_sentiment_rules_name_file_and_line(tmp_path: Path, rule: str, line: int, reason: str) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("rules:\n  - name: a\n    category: c\n" + rule)
    with pytest.raises(RulesError) as caught:
        load_rules_file(path)
    assert (caught.value.line, reason in caught.value.reason) == (line, True), caught.value


def test_the_shipped_rules_have_a_sentiment_rule_a_drop_alert_and_a_scorecard_item(rule_set: RuleSet,
                                                                                  qa_config: QaConfig) -> None:
    end, drop = rule_set.by_name("customer_sentiment_end"), rule_set.by_name("customer_sentiment_drop")
    assert end is not None and end.sentiment is not None and (end.sentiment.at, end.sentiment.min) == ("end", 0)
    assert drop is not None and drop.sentiment is not None and drop.sentiment.live and drop.type == "detect"
    assert "customer_sentiment_end" in {q.rule for q in qa_config.scorecard.questions}
