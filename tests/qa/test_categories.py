"""Call categories (pipeline/qa/categories.py): combinations of rules, checked at load against the rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.qa.categories import Category, categorize, load_categories
from pipeline.qa.rules import QaEvent, load_rules
from pipeline.qa.yaml_source import RulesError

RULES = Path(__file__).resolve().parents[2] / "rules"


def event(rule: str, kind: str) -> QaEvent:
    return QaEvent(rule, "x", "customer", kind, 1000, "", "info")  # type: ignore[arg-type]


def test_a_category_holds_on_the_rules_that_held() -> None:
    escalation = Category("escalation_unresolved", "", all=("escalation_request",), none=("closing",))
    either = Category("intent", "", any=("cancellation_intent", "escalation_request"))
    no_disclosure = Category("no_disclosure", "", none=("recording_disclosure",))
    categories = (escalation, either, no_disclosure)
    asked = [event("escalation_request", "alert"), event("recording_disclosure", "match")]
    assert categorize(asked, categories) == ["escalation_unresolved", "intent"]
    closed = [*asked, event("closing", "match")]
    assert categorize(closed, categories) == ["intent"]
    # A must rule "missing" did not hold: the disclosure was never said.
    assert categorize([event("recording_disclosure", "missing")], categories) == ["no_disclosure"]


def test_the_shipped_categories_load_against_the_shipped_rules() -> None:
    categories = load_categories(RULES, load_rules(RULES))
    assert {c.name for c in categories} >= {"cancellation", "escalation", "no_disclosure"}
    assert all(c.description for c in categories)


@pytest.mark.parametrize(("text", "error"), [
    ("categories:\n  - name: a\n    any: [no_such_rule]\n", r"default.yaml:3: no rule named 'no_such_rule'"),
    ("categories:\n  - name: a\n", r"default.yaml:2: a category needs rules"),
    ("categories:\n  - name: a\n    any: [greeting]\n  - name: a\n    any: [closing]\n",
     r"default.yaml:4: category 'a' already defined at .*default.yaml:2"),
    ("categories:\n  - name: a\n    anyof: [greeting]\n", r"anyof"),
])
def test_a_bad_categories_file_names_the_file_line_and_what(tmp_path: Path, text: str, error: str) -> None:
    (tmp_path / "categories").mkdir()
    (tmp_path / "categories" / "default.yaml").write_text(text)
    with pytest.raises(RulesError, match=error):
        load_categories(tmp_path, load_rules(RULES))
    assert load_categories(tmp_path / "nowhere", load_rules(RULES)) == ()
