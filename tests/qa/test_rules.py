"""Rule evaluation (must, must_not, detect; legs; windows; exact and fuzzy) and rules-file validation."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from pipeline.qa.matching import Phrase, bounded_edit_distance
from pipeline.qa.rules import RuleEngine, RuleSet, load_rules, load_rules_file
from pipeline.qa.yaml_source import RulesError


def _kinds(events, rule):  # type: ignore[no-untyped-def]
    return [e.kind for e in events if e.rule == rule]


def test_shipped_rules_load(rule_set: RuleSet) -> None:
    assert {"greeting", "recording_disclosure", "identity_verification", "closing", "prohibited_language",
            "escalation_request", "cancellation_intent"} <= rule_set.names  # fmt: skip


def test_must_rule_met_in_window_and_missing_outside(rule_set: RuleSet, seg) -> None:  # type: ignore[no-untyped-def]
    on_time = RuleEngine(rule_set)
    on_time.on_segment(seg("agent", 1, 4, "Good morning, thank you for calling Acme."))
    events = on_time.finalize(120_000)
    greeting = next(e for e in events if e.rule == "greeting")
    assert (greeting.kind, greeting.leg, greeting.offset_ms) == ("match", "agent", 1000)

    late = RuleEngine(rule_set)
    late.on_segment(seg("agent", 45, 48, "Good morning, thank you for calling Acme."))
    missing = next(e for e in late.finalize(120_000) if e.rule == "greeting")
    assert (missing.kind, missing.offset_ms) == ("missing", 30_000)  # became missing when its window closed


def test_must_rule_on_wrong_leg_is_missing(rule_set: RuleSet, seg) -> None:  # type: ignore[no-untyped-def]
    engine = RuleEngine(rule_set)
    engine.on_segment(seg("customer", 1, 4, "this call is being recorded by me, good morning"))
    events = engine.finalize(60_000)
    assert _kinds(events, "recording_disclosure") == ["missing"] and _kinds(events, "greeting") == ["missing"]


def test_last_seconds_window_needs_call_end(rule_set: RuleSet, seg) -> None:  # type: ignore[no-untyped-def]
    early_only = RuleEngine(rule_set)
    early_only.on_segment(seg("agent", 2, 5, "have a great day"))
    early_only.on_segment(seg("customer", 100, 110, "ok bye"))
    assert _kinds(early_only.finalize(115_000), "closing") == ["missing"]  # said at 2 s of a 115 s call

    at_end = RuleEngine(rule_set)
    at_end.on_segment(seg("customer", 100, 103, "thanks"))
    at_end.on_segment(seg("agent", 104, 110, "Is there anything else I can help you with? Have a great day."))
    events = at_end.finalize(115_000)
    assert _kinds(events, "closing") == ["match"]


def test_must_not_violation_is_raised_live(rule_set: RuleSet, seg) -> None:  # type: ignore[no-untyped-def]
    engine = RuleEngine(rule_set)
    assert engine.on_segment(seg("agent", 1, 3, "How can I help you?")) == []
    live = engine.on_segment(seg("agent", 20, 24, "Look, that's not my problem, sir."))
    assert [(e.rule, e.kind, e.severity, e.leg) for e in live] == [
        ("prohibited_language", "violation", "critical", "agent")
    ]
    assert 20_000 <= live[0].offset_ms < 24_000 and "not my problem" in live[0].text
    assert _kinds(engine.finalize(), "prohibited_language") == ["violation"]


def test_must_not_ignores_the_other_leg(rule_set: RuleSet, seg) -> None:  # type: ignore[no-untyped-def]
    engine = RuleEngine(rule_set)
    assert engine.on_segment(seg("customer", 1, 3, "whatever, this is stupid")) == []
    assert _kinds(engine.finalize(), "prohibited_language") == []


def test_exact_rule_rejects_near_miss(rule_set: RuleSet, seg) -> None:  # type: ignore[no-untyped-def]
    engine = RuleEngine(rule_set)
    assert engine.on_segment(seg("agent", 1, 3, "that is not a problem at all")) == []


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("I want to speak to the manager right now", "escalation_request"),  # "the" for "a"
        ("can I speak to a manger please", "escalation_request"),  # letters dropped by ASR
        ("I'd like to cancel my acount", "cancellation_intent"),
    ],
)
def test_intent_detected_live_despite_asr_errors(rule_set: RuleSet, seg, text: str, rule: str) -> None:  # type: ignore[no-untyped-def]
    engine = RuleEngine(rule_set)
    live = engine.on_segment(seg("customer", 5, 9, text))
    assert [(e.rule, e.kind, e.leg) for e in live] == [(rule, "alert", "customer")]
    assert 0.8 <= live[0].similarity < 1.0


def test_misheard_disclosure_still_meets_must_rule(rule_set: RuleSet, seg) -> None:  # type: ignore[no-untyped-def]
    engine = RuleEngine(rule_set)
    engine.on_segment(
        seg("agent", 0, 6, "Thanks for calling. Calls are recorded for quality and trading purposes.")
    )
    met = next(e for e in engine.finalize(60_000) if e.rule == "recording_disclosure")
    assert met.kind == "match" and met.similarity < 1.0


def test_unrelated_text_does_not_match(rule_set: RuleSet, seg) -> None:  # type: ignore[no-untyped-def]
    engine = RuleEngine(rule_set)
    assert engine.on_segment(seg("customer", 5, 9, "I want to pay my bill with a new card today")) == []
    assert engine.on_segment(seg("customer", 10, 14, "speak slowly to the manual please")) == []


def test_fuzzy_threshold_is_a_setting(rule_set: RuleSet, seg) -> None:  # type: ignore[no-untyped-def]
    strict = RuleEngine(rule_set, fuzzy_threshold=0.95)
    assert strict.on_segment(seg("customer", 5, 9, "I want to speak to the manager")) == []


def test_edit_distance_and_phrase_windows() -> None:
    assert bounded_edit_distance("kitten", "sitting", 5) == 3
    assert bounded_edit_distance("kitten", "sitting", 2) == 3  # over the limit: limit + 1
    assert bounded_edit_distance("abc", "abc", 0) == 0
    found = Phrase.parse("speak to a manager").find_fuzzy(
        ["i", "want", "to", "speak", "to", "the", "manager", "now"], 0.8
    )
    assert found is not None and found.matched == "speak to the manager" and found.word_index == 3


def _write(tmp_path: Path, body: str, name: str = "r.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body).lstrip("\n"))
    return path


_GOOD_RULE = """
version: 1
rules:
  - name: hello
    category: courtesy
    type: must
    phrases: [hello]
"""


@pytest.mark.parametrize(
    ("body", "line", "reason"),
    [
        ("rules:\n  - name: a\n    phrases: [x\n", 4, "invalid YAML"),
        (
            "rules:\n  - name: a\n    category: c\n    type: should\n    phrases: [x]\n",
            4,
            "type must be one of",
        ),
        (
            "rules:\n  - name: a\n    category: c\n    type: must\n    phrase: [x]\n",
            5,
            "unknown key 'phrase'",
        ),
        ("rules:\n  - name: a\n    category: c\n    type: must\n", 2, "lacks required key(s): phrases"),
        (
            "rules:\n  - name: a\n    category: c\n    type: must\n    leg: both\n    phrases: [x]\n",
            5,
            "leg must be",
        ),
        ("rules:\n  - name: a\n    category: c\n    type: must\n    phrases: []\n", 5, "must not be empty"),
        ("rules:\n  - name: a\n    category: c\n    type: must\n    phrases: ['!!']\n", 5, "has no words"),
        (
            "rules:\n  - name: a\n    category: c\n    type: must\n    window: {first_s: 30, last_s: 10}\n"
            "    phrases: [x]\n",
            5,
            "window takes one of",
        ),
        (
            "rules:\n  - name: a\n    category: c\n    type: must\n    window: {first_s: soon}\n"
            "    phrases: [x]\n",
            5,
            "must be a number",
        ),
        (
            "rules:\n  - name: a\n    category: c\n    type: must\n    threshold: 2\n    phrases: [x]\n",
            5,
            "within",
        ),
        ("rules: {name: a}\n", 1, "rules must be a list"),
        ("", 1, "empty"),
    ],
)
def test_malformed_rules_file_names_file_line_and_reason(
    tmp_path: Path, body: str, line: int, reason: str
) -> None:
    path = _write(tmp_path, body)
    with pytest.raises(RulesError) as caught:
        load_rules_file(path)
    assert (caught.value.file, caught.value.line) == (str(path), line)
    assert reason in caught.value.reason
    assert str(caught.value).startswith(f"{path}:{line}: ")


def test_duplicate_rule_across_files(tmp_path: Path) -> None:
    _write(tmp_path, _GOOD_RULE, "a.yaml")
    second = _write(tmp_path, "# the same rule again\n" + _GOOD_RULE.lstrip("\n"), "b.yaml")
    with pytest.raises(RulesError) as caught:
        load_rules(tmp_path)
    assert (caught.value.file, caught.value.line) == (str(second), 4)
    assert "already defined" in caught.value.reason


def test_defaults_of_a_minimal_rule(tmp_path: Path) -> None:
    _write(tmp_path, _GOOD_RULE)
    (rule,) = load_rules(tmp_path).rules
    assert (rule.leg, rule.match, rule.severity, rule.window.describe()) == (
        "any",
        "fuzzy",
        "warning",
        "anywhere in the call",
    )
