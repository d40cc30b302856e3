"""Scorecards (rules/scorecards/*.yaml): weighted questions answered from rule findings and metrics.

Like an AWS Contact Lens evaluation form or a CCAI Insights QA scorecard: each question has a weight and
is answered either by a rule (did its phrases occur, where) or by a metric check ("non_talk_pct < 20").
The score is the weight of the passed questions over the weight of the applicable ones, in percent. A
failed automatic-fail question fails the whole call: score 0, ``auto_failed`` true, as Contact Lens does.
A metric the call does not have (no customer speech, so no response time) makes its question not
applicable: ``passed`` None, left out of the score.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pipeline.qa.metrics import ConversationMetrics
from pipeline.qa.rules import QaEvent, RuleSet
from pipeline.qa.sentiment import SENTIMENT_METRICS, CallSentiment
from pipeline.qa.yaml_source import YamlNode, compose_file

Expectation = Literal["present", "absent"]
_OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
}  # fmt: skip
_CHECK = re.compile(r"^\s*([a-z_]+)\s*(<=|>=|==|!=|<|>)\s*(-?\d+(?:\.\d+)?)\s*$")
# Conversation metrics, and the legs' sentiment (customer_sentiment_end, ...: pipeline/qa/sentiment.py).
METRIC_NAMES = frozenset(ConversationMetrics.__dataclass_fields__) | SENTIMENT_METRICS


@dataclass(frozen=True)
class MetricCheck:
    metric: str
    op: str
    value: float

    def passes(self, actual: float) -> bool:
        return _OPERATORS[self.op](actual, self.value)

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.value:g}"


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    weight: float
    rule: str | None = None
    expect: Expectation = "present"
    check: MetricCheck | None = None
    auto_fail: bool = False
    rule_type: str = ""  # the rule's type: a must rule with no event at all was not applicable


@dataclass(frozen=True)
class Scorecard:
    name: str
    questions: tuple[Question, ...]
    file: str = ""


@dataclass(frozen=True)
class ScoreItem:
    question: str
    weight: float
    passed: bool | None  # None: not applicable to this call
    rationale: str
    auto_fail: bool = False


@dataclass(frozen=True)
class CallQaResult:
    call_id: str
    score_pct: float
    auto_failed: bool
    items: list[ScoreItem]
    metrics: dict[str, float]
    events: list[QaEvent] = field(default_factory=list)
    scorecard: str = ""
    sentiment: CallSentiment | None = None
    categories: tuple[str, ...] = ()  # the call's categories (pipeline/qa/categories.py), set at call end


def _parse_check(node: YamlNode) -> MetricCheck:
    text = node.string("check")
    match = _CHECK.match(text)
    if match is None:
        raise node.fail(f"check must read '<metric> <op> <number>', e.g. 'non_talk_pct < 20'; got {text!r}")
    if match.group(1) not in METRIC_NAMES:
        raise node.fail(f"unknown metric {match.group(1)!r} (known: {', '.join(sorted(METRIC_NAMES))})")
    return MetricCheck(match.group(1), match.group(2), float(match.group(3)))


def _parse_question(node: YamlNode, rule_set: RuleSet, index: int) -> Question:
    keys = node.mapping("question", {"question", "weight"}, {"id", "rule", "expect", "check", "auto_fail"})
    if ("rule" in keys) == ("check" in keys):
        raise node.fail("a question needs exactly one of 'rule' or 'check'")
    rule_name = keys["rule"].string("rule") if "rule" in keys else None
    expect: Expectation | None = None
    rule_type = ""
    if rule_name is not None:
        rule = rule_set.by_name(rule_name)
        if rule is None:
            raise keys["rule"].fail(
                f"unknown rule {rule_name!r} (known: {', '.join(sorted(rule_set.names))})"
            )
        expect = "present" if rule.type == "must" else "absent"
        rule_type = rule.type
    if "expect" in keys:
        if rule_name is None:
            raise keys["expect"].fail("'expect' only applies to a rule question")
        expect = keys["expect"].choice("expect", ("present", "absent"))  # type: ignore[assignment]
    return Question(
        id=keys["id"].string("id") if "id" in keys else f"q{index + 1}",
        question=keys["question"].string("question"),
        weight=keys["weight"].number("weight", low=0),
        rule=rule_name,
        expect=expect or "present",
        check=_parse_check(keys["check"]) if "check" in keys else None,
        auto_fail=keys["auto_fail"].boolean("auto_fail") if "auto_fail" in keys else False,
        rule_type=rule_type,
    )


def load_scorecard(path: str | Path, rule_set: RuleSet) -> Scorecard:
    """A scorecard file, checked against the rules it names; errors carry file and line."""
    root = compose_file(Path(path))
    keys = root.mapping("scorecard", {"name", "questions"}, {"version", "description"})
    if "version" in keys and keys["version"].number("version") != 1:
        raise keys["version"].fail("only version 1 is supported")
    questions = tuple(
        _parse_question(node, rule_set, i) for i, node in enumerate(keys["questions"].sequence("questions"))
    )
    if sum(q.weight for q in questions) <= 0 and not any(q.auto_fail for q in questions):
        raise keys["questions"].fail("questions must carry some weight")
    return Scorecard(keys["name"].string("name"), questions, str(path))


def _at(event: QaEvent) -> str:
    said = f" ({event.leg})" if event.leg else ""
    quote = f": {event.text!r}" if event.text else ""
    return f"{event.kind} at {event.offset_ms / 1000:.1f} s{said}{quote}"


def _answer_rule(question: Question, events: Sequence[QaEvent]) -> tuple[bool | None, str]:
    if question.rule_type == "must" and not any(e.rule == question.rule for e in events):
        # A must rule is always met or missing, except a sentiment rule on a leg that never spoke.
        return None, f"not applicable: rule {question.rule} had nothing to judge on this call"
    mine = [e for e in events if e.rule == question.rule and e.kind != "missing"]
    found = bool(mine)
    passed = found if question.expect == "present" else not found
    if not found:
        return passed, f"rule {question.rule}: not found"
    where = "; ".join(_at(e) for e in mine[:3]) + (f"; and {len(mine) - 3} more" if len(mine) > 3 else "")
    return passed, f"rule {question.rule}: {where}"


def _answer_check(check: MetricCheck, metrics: dict[str, float]) -> tuple[bool | None, str]:
    if check.metric not in metrics:
        return None, f"not applicable: {check.metric} is undefined for this call"
    actual = metrics[check.metric]
    return check.passes(actual), f"{check.metric} = {actual:.4g} (expected {check})"


def score_call(
    call_id: str, scorecard: Scorecard, metrics: ConversationMetrics, events: list[QaEvent],
    sentiment: CallSentiment | None = None,
) -> CallQaResult:
    """Answer every question; ``metrics`` of the result holds the conversation metrics and the sentiment's."""
    values = metrics.as_dict() | (sentiment.as_metrics() if sentiment is not None else {})
    items: list[ScoreItem] = []
    for question in scorecard.questions:
        if question.check is not None:
            passed, rationale = _answer_check(question.check, values)
        else:
            passed, rationale = _answer_rule(question, events)
        items.append(ScoreItem(question.question, question.weight, passed, rationale, question.auto_fail))
    score, auto_failed = score_of(items)
    return CallQaResult(call_id, score, auto_failed, items, values, events, scorecard.name, sentiment)


def score_of(items: Sequence[ScoreItem]) -> tuple[float, bool]:
    """The score (0-100, two decimals) and automatic fail of answered items: the weight of the items passed over
    the weight of the applicable ones (``passed`` None: not applicable); 0 when an auto-fail item failed."""
    auto_failed = any(item.auto_fail and item.passed is False for item in items)
    applicable = [item for item in items if item.passed is not None]
    total = sum(item.weight for item in applicable)
    earned = sum(item.weight for item in applicable if item.passed)
    score = 0.0 if auto_failed else (100.0 * earned / total if total > 0 else 100.0)
    return round(score, 2), auto_failed
