"""Phrase rules (rules/*.yaml) and their evaluation on a live call.

A rule (an AWS Contact Lens "category", a CCAI "highlighter") is a list of phrases, the leg they must be
said on, an optional time window and what finding them means:

- ``must``: the call should contain one (met / missing, known at call end);
- ``must_not``: the call should contain none (each match is a violation, raised while the call is live);
- ``detect``: a match is worth an alert while the call is live (intent: cancellation, escalation).

A rule may test sentiment instead of phrases (``sentiment:``, pipeline/qa/sentiment.py): a leg's score at
the start, end or over the whole call within bounds (evaluated at call end), or a sharp drop of the
leg's score (raised live, like a detect rule).

The file format is documented in rules/README.md. ``RuleEngine`` evaluates one call: ``on_segment``
returns the events worth raising now, ``finalize`` the complete evaluation once the call has ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pipeline.qa.matching import Phrase, PhraseMatch, bigrams, normalise_words
from pipeline.qa.segment import Leg, Segment
from pipeline.qa.sentiment import SCALE, LegSentiment, drop_of, edge_turns, is_sharp_drop, score_text
from pipeline.qa.yaml_source import RulesError, YamlNode, compose_file

RuleType = Literal["must", "must_not", "detect"]
LegFilter = Literal["agent", "customer", "any"]
MatchMode = Literal["exact", "fuzzy"]
EventKind = Literal["match", "missing", "violation", "alert"]
SentimentAt = Literal["start", "end", "call"]
SENTIMENT_AT: tuple[str, ...] = ("start", "end", "call")
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
class SentimentCondition:
    """What a sentiment rule tests: the leg's score ``at`` the start, end or over the call within
    [min, max] (inclusive; either may be absent), or a sharp drop: a negative turn ``drop`` points or more
    below the best of the leg's previous ``turns - 1`` turns (pipeline/qa/sentiment.py)."""

    at: SentimentAt | None = None
    min: float | None = None
    max: float | None = None
    drop: float | None = None
    turns: int = 3

    @property
    def live(self) -> bool:
        return self.drop is not None

    def metric(self, leg: str) -> str:
        """The CallQA metric the condition reads: customer_sentiment, customer_sentiment_end, ..."""
        return f"{leg}_sentiment" + ("" if self.at == "call" else f"_{self.at}")

    def holds(self, value: float) -> bool:
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)

    def describe(self, leg: str) -> str:
        if self.live:
            return f"a drop of {self.drop:g} points within {self.turns} {leg} turns"
        bounds = [f"{self.metric(leg)} >= {self.min:g}"] if self.min is not None else []
        bounds += [f"{self.metric(leg)} <= {self.max:g}"] if self.max is not None else []
        return " and ".join(bounds)


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
    sentiment: SentimentCondition | None = None
    # Where its live alerts are sent: names of webhooks in CALLQA_WEBHOOKS (pipeline/notify/).
    notify: tuple[str, ...] = ()

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


_RULE_KEYS = {"name", "category", "type"}
_RULE_OPTIONAL = {"phrases", "sentiment", "leg", "match", "window", "threshold", "severity", "description", "notify"}
# What a sentiment rule may be: bounds at call end for must/must_not, a live drop for detect/must_not.
_SENTIMENT_TYPES = {"at": ("must", "must_not"), "drop": ("detect", "must_not")}


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


def _parse_sentiment(node: YamlNode, rule_type: str, leg: str, keys: dict[str, YamlNode]) -> SentimentCondition:
    fields = node.mapping("sentiment", set(), {"at", "min", "max", "drop", "turns"})
    form = "drop" if "drop" in fields else "at"
    if ("at" in fields) == ("drop" in fields):
        raise node.fail("sentiment takes either 'at' (start, end, call) with min/max, or 'drop' with turns")
    if rule_type not in _SENTIMENT_TYPES[form]:
        raise keys["type"].fail(f"a sentiment rule with '{form}' must be of type {' or '.join(_SENTIMENT_TYPES[form])}")
    if leg == "any":
        raise node.fail("a sentiment rule needs leg: agent or customer (each leg has its own sentiment)")
    for key in ("window", "match", "threshold"):
        if key in keys:
            raise keys[key].fail(f"'{key}' applies to phrases, not to a sentiment rule")
    if form == "drop":
        if fields.keys() & {"min", "max"}:
            raise node.fail("'min'/'max' go with 'at', not with 'drop'")
        turns = int(fields["turns"].number("sentiment.turns", 2, 20)) if "turns" in fields else 3
        return SentimentCondition(drop=fields["drop"].number("sentiment.drop", 0.1, 2 * SCALE), turns=turns)
    if "turns" in fields:
        raise fields["turns"].fail("'turns' goes with 'drop', not with 'at'")
    if not fields.keys() & {"min", "max"}:
        raise node.fail("a sentiment rule with 'at' needs min, max or both")
    bounds = {k: fields[k].number(f"sentiment.{k}", -SCALE, SCALE) for k in ("min", "max") if k in fields}
    if bounds.get("min", -SCALE) > bounds.get("max", SCALE):
        raise node.fail("sentiment.min must not be above sentiment.max")
    at = fields["at"].choice("sentiment.at", SENTIMENT_AT)
    return SentimentCondition(at=at, min=bounds.get("min"), max=bounds.get("max"))  # type: ignore[arg-type]


def parse_rule(node: YamlNode) -> Rule:
    keys = node.mapping("rule", _RULE_KEYS, _RULE_OPTIONAL)
    if "phrases" not in keys and "sentiment" not in keys:
        raise node.fail("rule lacks required key(s): phrases (or sentiment)")
    if "phrases" in keys and "sentiment" in keys:
        raise keys["sentiment"].fail("a rule tests either phrases or sentiment, not both")
    rule_type = keys["type"].choice("type", RULE_TYPES)
    leg = keys["leg"].choice("leg", LEG_FILTERS) if "leg" in keys else "any"
    sentiment = _parse_sentiment(keys["sentiment"], rule_type, leg, keys) if "sentiment" in keys else None
    return Rule(
        name=keys["name"].string("name"),
        category=keys["category"].string("category"),
        type=rule_type,  # type: ignore[arg-type]
        leg=leg,  # type: ignore[arg-type]
        match=keys["match"].choice("match", MATCH_MODES) if "match" in keys else "fuzzy",  # type: ignore[arg-type]
        phrases=_parse_phrases(keys["phrases"]) if "phrases" in keys else (),
        window=_parse_window(keys["window"]) if "window" in keys else TimeWindow(),
        threshold=keys["threshold"].number("threshold", 0.5, 1.0) if "threshold" in keys else None,
        severity=keys["severity"].choice("severity", SEVERITIES)
        if "severity" in keys
        else DEFAULT_SEVERITY[rule_type],
        description=keys["description"].string("description") if "description" in keys else "",
        file=node.file,
        line=node.line,
        sentiment=sentiment,
        notify=notify_targets(keys["notify"]) if "notify" in keys else (),
    )


def notify_targets(node: YamlNode) -> tuple[str, ...]:
    """A rule's or category's ``notify:``: webhook names (CALLQA_WEBHOOKS), checked against the settings when
    the notifier starts."""
    names = tuple(n.string("webhook name in notify") for n in node.sequence("notify"))
    bad = [n for n in names if not n or not n.replace("-", "").replace("_", "").isalnum()]
    if bad:
        raise node.fail(f"notify names webhooks by name (letters, digits, - and _): {', '.join(map(repr, bad))}")
    return names


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
    _scored: list[tuple[Segment, float]] = field(default_factory=list)  # arrival order
    _dropping: dict[str, bool] = field(default_factory=dict)  # drop rule -> its leg's last turn met it

    @property
    def uses_sentiment(self) -> bool:
        return any(r.sentiment is not None for r in self.rule_set.rules)

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

    def on_segment(self, segment: Segment, sentiment: float | None = None) -> list[QaEvent]:
        """Match the segment against every rule; return the events to raise while the call is live.

        ``sentiment``: the segment's score when the caller has it already (else scored here, if needed).
        """
        self._last_end_ms = max(self._last_end_ms, segment.end_ms)
        words = normalise_words(segment.text)
        text_bigrams = bigrams(words)
        live: list[QaEvent] = []
        if self.uses_sentiment:
            self._scored.append((segment, score_text(segment.text) if sentiment is None else sentiment))
        for rule in self.rule_set.rules:
            if rule.sentiment is not None:
                if rule.sentiment.live and rule.applies_to(segment):
                    live += self._drop(rule, rule.sentiment, segment)
                continue
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

    def _drop(self, rule: Rule, cond: SentimentCondition, segment: Segment) -> list[QaEvent]:
        """A sharp drop on the leg's latest turn, once per falling run (pipeline/qa/sentiment.py)."""
        assert cond.drop is not None
        scores = [score for s, score in self._scored if s.leg == segment.leg]
        meets = is_sharp_drop(scores, cond.drop, cond.turns)
        raise_now = meets and not self._dropping.get(rule.name, False)
        self._dropping[rule.name] = meets
        if not raise_now:
            return []
        fell = drop_of(scores, cond.turns)
        found = PhraseMatch(f"fell {fell:g} points to {scores[-1]:g}", "", 0, 0, 1.0)
        hit = _Hit(rule, segment, found, segment.start_ms)
        self._hits.append(hit)
        return [self._event(hit, "violation" if rule.type == "must_not" else "alert")]

    def _sentiment_at(self, rule: Rule, cond: SentimentCondition) -> list[QaEvent]:
        """A start/end/call sentiment rule at call end: met (or violated) on the leg's turns in time order.

        A leg that never spoke has no sentiment: no event, so a scorecard question on it is not applicable.
        """
        turns = sorted(((s, score) for s, score in self._scored if s.leg == rule.leg),
                       key=lambda t: (t[0].start_ms, t[0].end_ms))
        if not turns:
            return []
        leg: Leg = rule.leg  # type: ignore[assignment]
        summary = LegSentiment.of(leg, [score for _, score in turns])
        value = {"start": summary.start, "end": summary.end, "call": summary.overall}[cond.at or "call"]
        # The evidence is where the measured span begins: the leg's first turn, or the first of its last third.
        first = turns[len(turns) - edge_turns(len(turns)) if cond.at == "end" else 0][0]
        holds = cond.holds(value)
        if rule.type == "must_not" and not holds:
            return []
        kind: EventKind = ("match" if holds else "missing") if rule.type == "must" else "violation"
        text = f"{cond.metric(rule.leg)} = {value:g} (expected {cond.describe(rule.leg)})"
        return [QaEvent(rule.name, rule.category, rule.leg, kind, first.start_ms, text, rule.severity,
                        segment_id=first.segment_id)]

    def finalize(self, call_end_ms: int | None = None) -> list[QaEvent]:
        """The complete evaluation at call end: every rule's findings, and each must rule met or missing."""
        end = max(call_end_ms or 0, self._last_end_ms)
        events: list[QaEvent] = []
        for rule in self.rule_set.rules:
            if rule.sentiment is not None and not rule.sentiment.live:
                events.extend(self._sentiment_at(rule, rule.sentiment))
                continue
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
