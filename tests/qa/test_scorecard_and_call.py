"""Scorecards (weights, automatic fail, not-applicable checks, validation) and the per-call analyzer."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from pipeline.config import Settings
from pipeline.qa.call import CallAnalyzer, QaConfig
from pipeline.qa.metrics import compute_metrics
from pipeline.qa.rules import RuleEngine, RuleSet
from pipeline.qa.scorecard import load_scorecard, score_call
from pipeline.qa.segment import Segment
from pipeline.qa.yaml_source import RulesError

RULES_DIR = Path(__file__).resolve().parents[2] / "rules"
SCORECARD = RULES_DIR / "scorecards" / "default.yaml"


GOOD_CALL = [
    (
        "agent",
        0,
        6,
        "Good morning, thank you for calling Acme. This call may be recorded for quality purposes.",
    ),
    ("customer", 6.5, 10, "Hi, I have a question about my last bill."),
    ("agent", 10.5, 14, "Of course. Can you confirm your date of birth?"),
    ("customer", 14.5, 17, "It's the fourth of May."),
    ("agent", 17.5, 25, "Thanks, I see the charge and I have removed it for you."),
    ("customer", 25.5, 27, "Great, thanks."),
    ("agent", 27.5, 32, "Is there anything else I can help you with? Have a great day."),
]


def _analyze(config: QaConfig, lines, call_end_s: float):  # type: ignore[no-untyped-def]
    analyzer = CallAnalyzer("c1", config)
    live = []
    for i, (leg, start, end, text) in enumerate(lines):
        live += analyzer.add_segment(Segment("c1", leg, f"s{i}", int(start * 1000), int(end * 1000), text))
    return analyzer, live, analyzer.finalize(int(call_end_s * 1000))


def test_good_call_scores_full_marks(qa_config: QaConfig) -> None:
    _, live, result = _analyze(qa_config, GOOD_CALL, 33)
    assert live == []
    assert (result.call_id, result.score_pct, result.auto_failed) == ("c1", 100.0, False)
    assert all(item.passed for item in result.items)
    greeting = next(i for i in result.items if "greet" in i.question)
    assert greeting.rationale.startswith("rule greeting: match at 0.0 s (agent)")
    assert result.metrics["turn_count"] == 7 and result.metrics["duration_ms"] == 33_000


def test_weights_and_auto_fail(qa_config: QaConfig) -> None:
    # Without the closing, the agent's opening thanks would fall in the last 60 s of a short call: make it long.
    lines = [
        *GOOD_CALL[:-1],
        ("customer", 90, 93, "I want to speak to the manager"),
        ("agent", 93.5, 95, "ok bye"),
    ]
    _, live, result = _analyze(qa_config, lines, 96)
    assert [(e.rule, e.kind) for e in live] == [("escalation_request", "alert")]
    failed = {i.question.split()[-1] for i in result.items if i.passed is False}
    assert failed == {"properly?", "manager?", "call?"}  # closing, escalation, dead air over 20 %
    lost = sum(i.weight for i in result.items if i.passed is False)
    total = sum(i.weight for i in result.items if i.passed is not None)
    assert (lost, total) == (30, 110)  # the customer still ends neutral: that question passes
    assert result.score_pct == round(100 * 80 / 110, 2)
    assert not result.auto_failed

    rude = [*GOOD_CALL, ("agent", 33, 34, "whatever")]
    _, live, result = _analyze(qa_config, rude, 35)
    assert [(e.rule, e.kind) for e in live] == [("prohibited_language", "violation")]
    assert result.auto_failed and result.score_pct == 0.0
    item = next(i for i in result.items if i.auto_fail and i.passed is False)
    assert "violation at 33.0 s (agent): 'whatever'" in item.rationale


def test_undefined_metric_is_not_applicable(rule_set: RuleSet, seg) -> None:  # type: ignore[no-untyped-def]
    scorecard = load_scorecard(SCORECARD, rule_set)
    segments = [seg("agent", 0, 3, "good morning this call may be recorded")]  # the customer never speaks
    engine = RuleEngine(rule_set)
    for s in segments:
        engine.on_segment(s)
    result = score_call("c1", scorecard, compute_metrics(segments), engine.finalize())
    response = next(i for i in result.items if "3 seconds" in i.question)
    assert response.passed is None and "not applicable" in response.rationale


def test_redaction_happens_before_rules_and_storage(qa_config: QaConfig) -> None:
    lines = [("customer", 0, 5, "cancel my account, my card is 4111 1111 1111 1111")]
    analyzer, live, result = _analyze(qa_config, lines, 6)
    assert analyzer.segments[0].text == "cancel my account, my card is [PAN]"
    assert analyzer.redaction_counts == {"PAN": 1}
    assert live[0].text == "cancel my account, my card is [PAN]"
    assert all("4111" not in e.text for e in result.events)


def test_redaction_off_only_when_configured(rule_set: RuleSet) -> None:
    settings = Settings(
        rules_dir=str(RULES_DIR), qa_scorecard_file=str(SCORECARD), qa_redaction_enabled=False
    )
    config = QaConfig.from_settings(settings)
    assert Settings(rules_dir=str(RULES_DIR)).qa_redaction_enabled is True
    analyzer, _, _ = _analyze(config, [("customer", 0, 5, "card 4111 1111 1111 1111")], 6)
    assert analyzer.segments[0].text == "card 4111 1111 1111 1111"


def test_segment_of_another_call_is_refused(qa_config: QaConfig, seg) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="another|of call"):
        CallAnalyzer("c1", qa_config).add_segment(seg("agent", 0, 1, call_id="c2"))


@pytest.mark.parametrize(
    ("body", "line", "reason"),
    [
        (
            "name: x\nquestions:\n  - question: q\n    weight: 1\n    rule: greting\n",
            5,
            "unknown rule 'greting'",
        ),
        (
            "name: x\nquestions:\n  - question: q\n    weight: 1\n    check: silence > lots\n",
            5,
            "check must read",
        ),
        (
            "name: x\nquestions:\n  - question: q\n    weight: 1\n    check: dead_air < 20\n",
            5,
            "unknown metric",
        ),
        ("name: x\nquestions:\n  - question: q\n    weight: 1\n", 3, "exactly one of 'rule' or 'check'"),
        (
            "name: x\nquestions:\n  - question: q\n    weight: -1\n    rule: greeting\n",
            4,
            "weight must be within",
        ),
        (
            "name: x\nquestions:\n  - question: q\n    weight: 1\n    rule: greeting\n    auto_fail: maybe\n",
            6,
            "true or false",
        ),
    ],
)
def test_malformed_scorecard(tmp_path: Path, rule_set: RuleSet, body: str, line: int, reason: str) -> None:
    path = tmp_path / "card.yaml"
    path.write_text(textwrap.dedent(body))
    with pytest.raises(RulesError) as caught:
        load_scorecard(path, rule_set)
    assert (caught.value.file, caught.value.line) == (str(path), line) and reason in caught.value.reason
