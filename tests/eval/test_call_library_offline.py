"""Five library calls through `callqa analyze` (the worker's segmentation, ASR and QA, without Kafka), against
expectations written here by hand from the scripts and rules/, not by the code under test.

The manifest's expectations are computed by pipeline/qa from the script text when the library is built, so
a QA change regenerates them: they guard the ASR (`callqa bench check`'s ``library-offline`` runs all 23
calls against them), not the QA. These are read off the scripts (samples/calls/library/scripts/) by a
person: turns counted, pauses and overlaps added up, the rules' phrases (rules/*.yaml) looked up in the
agent's and the customer's words. Where synthesis and the VAD blur a figure (a turn's start by tens of
ms, a comma's pause) the bound says so; counts are exact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.analyze import CallAnalysis, analyze_recordings
from pipeline.asr.engine import Engine
from pipeline.eval.call_library import LIBRARY_DIR
from pipeline.qa.call import QaConfig
from pipeline.qa.rules import load_rules
from pipeline.qa.scorecard import load_scorecard

REPO = Path(__file__).resolve().parents[2]
RULES = ("greeting", "recording_disclosure", "identity_verification", "prohibited_language", "closing",
         "escalation_request", "cancellation_intent")
# Scorecard items checked (rules/scorecards/default.yaml ids); customer_sentiment is left to the sentiment
# tests (tests/eval/test_sentiment_agreement.py), response_time where a turn is talked over.
ITEMS = ("greeting", "recording_disclosure", "identity_verification", "prohibited_language", "closing",
         "no_escalation", "silence", "long_silences", "overtalk", "interruptions", "response_time")
GOOD_CALL = {"greeting", "recording_disclosure", "identity_verification", "closing"}

EXPECTED: dict[str, dict[str, Any]] = {
    # No "this call may be recorded" anywhere: an auto-fail item, so the call scores 0.
    "03_missing_disclosure": {
        "present": GOOD_CALL - {"recording_disclosure"}, "failing": {"recording_disclosure"}, "auto_failed": True,
        # A C A C A C A C A C A C A(2) C A: the agent's two turns in a row are one run.
        "metrics": {"turn_count": (15, 15), "overtalk_count": (0, 0), "silence_count": (0, 0)},
    },
    # "Well, that's not my problem." and "Whatever.": prohibited (exact match), an auto-fail item.
    "05_rude_agent": {
        "present": GOOD_CALL | {"prohibited_language"}, "failing": {"prohibited_language"}, "auto_failed": True,
        # A C A C A C A C A C A C(2) A C A C: "Fine." and the next question are one customer run.
        "metrics": {"turn_count": (16, 16), "overtalk_count": (0, 0), "silence_count": (0, 0)},
    },
    # "I want to cancel my account", then "cancel the service": detected; otherwise a good call.
    "09_cancellation": {
        "present": GOOD_CALL | {"cancellation_intent"}, "failing": set(), "auto_failed": False,
        # A C A C A C A C A C(2) A(2) C A
        "metrics": {"turn_count": (13, 13), "overtalk_count": (0, 0), "silence_count": (0, 0)},
    },
    # Pauses of 4.0 (the first answer), 7.0, 8.0, 7.5 and 6.0 s: four over the 5 s threshold, and about
    # 36 s of a ~75 s call without talk.
    "16_dead_air": {
        "present": GOOD_CALL, "failing": {"silence", "long_silences", "response_time"}, "auto_failed": False,
        "metrics": {"silence_count": (4, 4), "longest_silence_ms": (7400, 8700),
                    "first_agent_response_ms": (3400, 4700), "non_talk_pct": (35, 65), "overtalk_count": (0, 0)},
    },
    # Seven overlaps: the agent starts 3.0, 3.5, 3.0, 2.5, 1.5 and 2.0 s before the customer ends (six
    # interruptions), the customer 0.8 s before the agent ends once; 16.3 s talked over in all, and each
    # overlap up to 0.45 s longer in segments (the VAD keeps 300 ms before an onset and 150 ms after speech).
    "17_overtalk": {
        "present": GOOD_CALL, "failing": {"overtalk", "interruptions"}, "auto_failed": False,
        "unchecked": {"response_time"},
        "metrics": {"overtalk_count": (7, 7), "overtalk_ms": (15_000, 19_500), "agent_interruptions": (6, 6),
                    "customer_interruptions": (1, 1)},
    },
}


@pytest.fixture(scope="module")
def analyses() -> dict[str, CallAnalysis]:
    rule_set = load_rules(REPO / "rules")
    config = QaConfig(rule_set, load_scorecard(REPO / "rules" / "scorecards" / "default.yaml", rule_set))
    done = analyze_recordings([LIBRARY_DIR / f"{name}.wav" for name in EXPECTED], Engine.load(), config)
    return {a.call_id: a for a in done}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_rules_items_and_metrics_as_a_reader_of_the_script_expects(name: str, analyses: dict[str, CallAnalysis]) -> None:
    expected, a = EXPECTED[name], analyses[name]
    found = {rule for rule, v in a.rule_verdicts().items() if v["verdict"] in ("met", "violated", "detected")}
    assert found & set(RULES) == expected["present"], f"rules found: {sorted(found)}"

    ids = _question_ids()
    checked = set(ITEMS) - expected.get("unchecked", set())
    failing = {ids[i.question] for i in a.qa.items if i.passed is False and ids[i.question] in checked}
    passing = {ids[i.question] for i in a.qa.items if i.passed is True and ids[i.question] in checked}
    assert failing == expected["failing"], [(ids[i.question], i.rationale) for i in a.qa.items]
    assert passing == checked - expected["failing"]
    assert a.qa.auto_failed is expected["auto_failed"]
    assert (a.qa.score_pct == 0.0) is expected["auto_failed"]

    for metric, (low, high) in expected["metrics"].items():
        assert low <= a.qa.metrics[metric] <= high, f"{metric} = {a.qa.metrics[metric]}, expected {low}..{high}"


def _question_ids() -> dict[str, str]:
    rule_set = load_rules(REPO / "rules")
    card = load_scorecard(REPO / "rules" / "scorecards" / "default.yaml", rule_set)
    return {q.question: q.id for q in card.questions}
