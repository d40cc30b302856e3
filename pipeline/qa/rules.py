"""Phrase rules (rules/*.yaml) and their evaluation on a live call.

A rule (an AWS Contact Lens "category", a CCAI "highlighter") is a list of phrases, the leg they must be
said on, an optional time window and what finding them means:

- ``must``: the call should contain one (met / missing, known at call end);
- ``must_not``: the call should contain none (each match is a violation, raised while the call is live);
- ``detect``: a match is worth an alert while the call is live (intent: cancellation, escalation).

The file format is documented in rules/README.md. ``RuleEngine`` evaluates one call: ``on_segment``
returns the events worth raising now, ``finalize`` the complete evaluation once the call has ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pipeline.qa.matching import Phrase, PhraseMatch, bigrams, normalise_words
from pipeline.qa.segment import Segment
from pipeline.qa.yaml_source import RulesError, YamlNode, compose_file

RuleType = Literal["must", "must_not", "detect"]
LegFilter = Literal["agent", "customer", "any"]
MatchMode = Literal["exact", "fuzzy"]
EventKind = Literal["match", "missing", "violation", "alert"]
RULE_TYPES: tuple[str, ...] = ("must", "must_not", "detect")
LEG_FILTERS: tuple[str, ...] = ("agent", "customer", "any")
MATCH_MODES: tuple[str, ...] = ("exact", "fuzzy")
SEVERITIES: tuple[str, ...] = ("info", "warning", "critical")
DEFAULT_SEVERITY: dict[str, str] = {"must": "warning", "must_not": "critical", "detect": "info"}


@dataclass(frozen=True)
class TimeWindow:
    """Where in the call a rule looks: the first N ms, the last N ms, or [from, to) ms; all None = whole call."""

    first_ms: int | None = None
    last_ms: int | None = None
    from_ms: int | None = None
    to_ms: int | None = None

    @property
    def needs_call_end(self) -> bool:
        """A 'last N seconds' window is only known once the call has ended."""
        return self.last_ms is not None

    def contains(self, offset_ms: int, call_end_ms: int | None) -> bool:
        if self.first_ms is not None and offset_ms >= self.first_ms:
            return False
        if self.from_ms is not None and offset_ms < self.from_ms:
            return False
        if self.to_ms is not None and offset_ms >= self.to_ms:
            return False
        return not (
            self.last_ms is not None and (call_end_ms is None or offset_ms < call_end_ms - self.last_ms)
        )

    def describe(self) -> str:
        if self.first_ms is not None:
            return f"in the first {self.first_ms / 1000:g} s"
        if self.last_ms is not None:
            return f"in the last {self.last_ms / 1000:g} s"
        if self.from_ms is not None or self.to_ms is not None:
            return f"between {(self.from_ms or 0) / 1000:g} s and {self.to_ms / 1000 if self.to_ms else 'the end'} s"
        return "anywhere in the call"


@dataclass(frozen=True)
class Rule:
    name: str
    category: str
    type: RuleType
    leg: LegFilter
    match: MatchMode
    phrases: tuple[Phrase, ...]
    window: TimeWindow = TimeWindow()
    threshold: float | None = None
    severity: str = "warning"
    description: str = ""
    file: str = ""
    line: int = 0

    def applies_to(self, segment: Segment) -> bool:
        return self.leg == "any" or self.leg == segment.leg


@dataclass(frozen=True)
class RuleSet:
    rules: tuple[Rule, ...]

    def by_name(self, name: str) -> Rule | None:
        return next((r for r in self.rules if r.name == name), None)

    @property
    def names(self) -> set[str]:
        return {r.name for r in self.rules}


@dataclass(frozen=True)
class QaEvent:
    """A finding of a rule on a call (fields after the AWS Contact Lens 'point of interest')."""

    rule: str
    category: str
    leg: str
    kind: EventKind
    offset_ms: int
    text: str
    severity: str
    phrase: str = ""
    segment_id: str = ""
    similarity: float = 1.0


_RULE_KEYS = {"name", "category", "type", "phrases"}
_RULE_OPTIONAL = {"leg", "match", "window", "threshold", "severity", "description"}


def _parse_window(node: YamlNode) -> TimeWindow:
    keys = node.mapping("window", set(), {"first_s", "last_s", "from_s", "to_s"})
    if not keys:
        raise node.fail("window must name first_s, last_s, or from_s/to_s")
    if len({"first_s", "last_s", "from_s"} & keys.keys()) > 1 or (
        "to_s" in keys and keys.keys() & {"first_s", "last_s"}
    ):
        raise node.fail("window takes one of: first_s, last_s, or from_s/to_s")
    ms = {k: int(v.number(f"window.{k}", low=0) * 1000) for k, v in keys.items()}
    if "to_s" in ms and ms["to_s"] <= ms.get("from_s", 0):
        raise keys["to_s"].fail("window.to_s must be after from_s")
    return TimeWindow(ms.get("first_s"), ms.get("last_s"), ms.get("from_s"), ms.get("to_s"))


def _parse_phrases(node: YamlNode) -> tuple[Phrase, ...]:
    phrases = []
    for item in node.sequence("phrases"):
        phrase = Phrase.parse(item.string("phrase"))
        if not phrase.words:
            raise item.fail(f"phrase {phrase.text!r} has no words")
        phrases.append(phrase)
    return tuple(phrases)


def parse_rule(node: YamlNode) -> Rule:
    keys = node.mapping("rule", _RULE_KEYS, _RULE_OPTIONAL)
    rule_type = keys["type"].choice("type", RULE_TYPES)
    return Rule(
        name=keys["name"].string("name"),
        category=keys["category"].string("category"),
        type=rule_type,  # type: ignore[arg-type]
        leg=keys["leg"].choice("leg", LEG_FILTERS) if "leg" in keys else "any",  # type: ignore[arg-type]
        match=keys["match"].choice("match", MATCH_MODES) if "match" in keys else "fuzzy",  # type: ignore[arg-type]
        phrases=_parse_phrases(keys["phrases"]),
        window=_parse_window(keys["window"]) if "window" in keys else TimeWindow(),
        threshold=keys["threshold"].number("threshold", 0.5, 1.0) if "threshold" in keys else None,
        severity=keys["severity"].choice("severity", SEVERITIES)
        if "severity" in keys
        else DEFAULT_SEVERITY[rule_type],
        description=keys["description"].string("description") if "description" in keys else "",
        file=node.file,
        line=node.line,
    )


def load_rules_file(path: Path) -> list[Rule]:
    root = compose_file(path).mapping("rules file", {"rules"}, {"version"})
    if "version" in root and root["version"].number("version") != 1:
        raise root["version"].fail("only version 1 is supported")
    return [parse_rule(node) for node in root["rules"].sequence("rules")]


def load_rules(rules_dir: str | Path) -> RuleSet:
    """Every rule of the *.yaml / *.yml files directly in rules_dir (scorecards live in a sub-folder)."""
    folder = Path(rules_dir)
    if not folder.is_dir():
        raise RulesError(folder, 0, "rules folder does not exist")
    rules: list[Rule] = []
    seen: dict[str, Rule] = {}
    for path in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]):
        for rule in load_rules_file(path):
            if rule.name in seen:
                first = seen[rule.name]
                raise RulesError(
                    path, rule.line, f"rule {rule.name!r} already defined at {first.file}:{first.line}"
                )
            seen[rule.name] = rule
            rules.append(rule)
    return RuleSet(tuple(rules))


@dataclass
class _Hit:
    rule: Rule
    segment: Segment
    match: PhraseMatch
    offset_ms: int


def _word_offset_ms(segment: Segment, word_index: int, word_count: int) -> int:
    """Where in the segment a word is, assuming words are spread evenly: segments carry no word timings."""
    if word_count == 0:
        return segment.start_ms
    return segment.start_ms + segment.duration_ms * word_index // word_count


@dataclass
class RuleEngine:
    """Evaluates a rule set on one call, segment by segment."""

    rule_set: RuleSet
    fuzzy_threshold: float = 0.8
    _hits: list[_Hit] = field(default_factory=list)
    _last_end_ms: int = 0

    def _find(self, rule: Rule, words: list[str], text_bigrams: set[str]) -> PhraseMatch | None:
        best: PhraseMatch | None = None
        threshold = rule.threshold or self.fuzzy_threshold
        for phrase in rule.phrases:
            if rule.match == "exact":
                found = phrase.find_exact(words)
            else:
                found = phrase.find_fuzzy(words, threshold, text_bigrams)
            # The closest phrase wins; among equals, the one said first (its offset is reported).
            if found is not None and (
                best is None or (-found.similarity, found.word_index) < (-best.similarity, best.word_index)
            ):
                best = found
        return best

    def _event(self, hit: _Hit, kind: EventKind) -> QaEvent:
        return QaEvent(
            rule=hit.rule.name,
            category=hit.rule.category,
            leg=hit.segment.leg,
            kind=kind,
            offset_ms=hit.offset_ms,
            text=hit.segment.text,
            severity=hit.rule.severity,
            phrase=hit.match.phrase,
            segment_id=hit.segment.segment_id,
            similarity=round(hit.match.similarity, 3),
        )

    def _settled(self, rule: Rule, segment: Segment) -> bool:
        """A must rule needs one match: once met, or once its window is over, later segments can't change it."""
        if rule.type != "must" or rule.window.needs_call_end:
            return False
        window_over = rule.window.first_ms is not None and segment.start_ms >= rule.window.first_ms
        window_over |= rule.window.to_ms is not None and segment.start_ms >= rule.window.to_ms
        return window_over or any(
            h.rule is rule and rule.window.contains(h.offset_ms, None) for h in self._hits
        )

    def on_segment(self, segment: Segment) -> list[QaEvent]:
        """Match the segment against every rule; return the events to raise while the call is live."""
        self._last_end_ms = max(self._last_end_ms, segment.end_ms)
        words = normalise_words(segment.text)
        text_bigrams = bigrams(words)
        live: list[QaEvent] = []
        for rule in self.rule_set.rules:
            if not rule.applies_to(segment) or self._settled(rule, segment):
                continue
            found = self._find(rule, words, text_bigrams)
            if found is None:
                continue
            total_words = len(words)
            hit = _Hit(rule, segment, found, _word_offset_ms(segment, found.word_index, total_words))
            self._hits.append(hit)
            if (
                rule.type != "must"
                and not rule.window.needs_call_end
                and rule.window.contains(hit.offset_ms, None)
            ):
                live.append(self._event(hit, "violation" if rule.type == "must_not" else "alert"))
        return live

    def finalize(self, call_end_ms: int | None = None) -> list[QaEvent]:
        """The complete evaluation at call end: every rule's findings, and each must rule met or missing."""
        end = max(call_end_ms or 0, self._last_end_ms)
        events: list[QaEvent] = []
        for rule in self.rule_set.rules:
            hits = sorted(
                (h for h in self._hits if h.rule is rule and rule.window.contains(h.offset_ms, end)),
                key=lambda h: h.offset_ms,
            )
            if rule.type == "must":
                events.append(self._event(hits[0], "match") if hits else self._missing(rule, end))
            else:
                kind: EventKind = "violation" if rule.type == "must_not" else "alert"
                events.extend(self._event(h, kind) for h in hits)
        return sorted(events, key=lambda e: (e.offset_ms, e.rule))

    @staticmethod
    def _missing(rule: Rule, call_end_ms: int) -> QaEvent:
        # A missing phrase has no place in the call; the end of its window is when it became missing.
        offset = rule.window.first_ms or rule.window.to_ms or call_end_ms
        leg = rule.leg if rule.leg != "any" else ""
        return QaEvent(rule.name, rule.category, leg, "missing", min(offset, call_end_ms), "", rule.severity)
