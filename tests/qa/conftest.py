"""Fixtures of the call QA tests: the shipped rules and scorecard, and a segment builder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.qa.call import QaConfig
from pipeline.qa.rules import RuleSet, load_rules
from pipeline.qa.scorecard import load_scorecard
from pipeline.qa.segment import Leg, Segment

REPO = Path(__file__).resolve().parents[2]
RULES_DIR = REPO / "rules"
SCORECARD = RULES_DIR / "scorecards" / "default.yaml"

SegmentFactory = Callable[..., Segment]


@pytest.fixture(scope="session")
def rule_set() -> RuleSet:
    return load_rules(RULES_DIR)


@pytest.fixture(scope="session")
def qa_config(rule_set: RuleSet) -> QaConfig:
    return QaConfig(rule_set=rule_set, scorecard=load_scorecard(SCORECARD, rule_set))


@pytest.fixture
def seg() -> SegmentFactory:
    """seg(leg, start_s, end_s, text): a segment of call 'c1' with a running segment id."""
    counter = iter(range(1, 10_000))

    def make(
        leg: Leg, start_s: float, end_s: float, text: str = "hello there", call_id: str = "c1"
    ) -> Segment:
        return Segment(call_id, leg, f"s{next(counter)}", round(start_s * 1000), round(end_s * 1000), text)

    return make
