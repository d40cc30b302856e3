"""Per-call QA: redact each segment, match rules live, score the call when it ends.

The streaming worker keeps one ``CallAnalyzer`` per open call and feeds it final segments as they
arrive; ``QaConfig`` (rules, scorecard, settings) is loaded once per worker and shared by all calls.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from pipeline.config.qa import QaSettings
from pipeline.qa.metrics import compute_metrics
from pipeline.qa.redaction import CallRedactor, RedactedText
from pipeline.qa.rules import QaEvent, RuleEngine, RuleSet, load_rules
from pipeline.qa.scorecard import CallQaResult, Scorecard, load_scorecard, score_call
from pipeline.qa.segment import Segment


@dataclass(frozen=True)
class QaConfig:
    """What every call of a worker is evaluated with."""

    rule_set: RuleSet
    scorecard: Scorecard
    silence_threshold_ms: int = 5000
    interruption_min_overlap_ms: int = 500
    fuzzy_threshold: float = 0.8
    redaction_enabled: bool = True
    redaction_context_segments: int = 3

    @classmethod
    def from_settings(cls, settings: QaSettings) -> QaConfig:
        rule_set = load_rules(settings.rules_dir)
        return cls(
            rule_set=rule_set,
            scorecard=load_scorecard(Path(settings.qa_scorecard_file), rule_set),
            silence_threshold_ms=settings.qa_silence_threshold_ms,
            interruption_min_overlap_ms=settings.qa_interruption_min_overlap_ms,
            fuzzy_threshold=settings.qa_fuzzy_threshold,
            redaction_enabled=settings.qa_redaction_enabled,
            redaction_context_segments=settings.qa_redaction_context_segments,
        )


@dataclass(frozen=True)
class AnalyzedSegment:
    redacted: RedactedText
    events: list[QaEvent]


@dataclass
class CallAnalyzer:
    """QA state of one call. Segments must be final; they may arrive interleaved across legs."""

    call_id: str
    config: QaConfig
    segments: list[Segment] = field(default_factory=list)
    redaction_counts: dict[str, int] = field(default_factory=dict)
    _redactor: CallRedactor = field(init=False)
    _rules: RuleEngine = field(init=False)

    def __post_init__(self) -> None:
        self._redactor = CallRedactor(self.config.redaction_context_segments)
        self._rules = RuleEngine(self.config.rule_set, self.config.fuzzy_threshold)

    def redact(self, segment: Segment) -> RedactedText:
        """The segment as it may leave the worker (unchanged only when redaction is switched off)."""
        if not self.config.redaction_enabled:
            return RedactedText(segment, {})
        return self._redactor.redact(segment)

    def redact_partial(self, segment: Segment) -> RedactedText:
        """Redact a partial (still growing) segment without advancing the call's redaction context.

        The final version of the segment goes through ``process`` later; a partial must not count
        as one of the segments the agent's question keeps the CVV/expiry context open for.
        """
        if not self.config.redaction_enabled:
            return RedactedText(segment, {})
        return replace(self._redactor, _context=Counter(self._redactor._context)).redact(segment)

    def process(self, segment: Segment) -> AnalyzedSegment:
        """Redact, keep and match one segment: the text to store and publish, and the alerts to raise now."""
        if segment.call_id != self.call_id:
            raise ValueError(f"segment of call {segment.call_id} given to analyzer of call {self.call_id}")
        redacted = self.redact(segment)
        for marker, count in redacted.counts.items():
            self.redaction_counts[marker] = self.redaction_counts.get(marker, 0) + count
        self.segments.append(redacted.segment)
        return AnalyzedSegment(redacted, self._rules.on_segment(redacted.segment))

    def add_segment(self, segment: Segment) -> list[QaEvent]:
        """Redact first, then match: returns the alerts to raise while the call is live (violations, intents)."""
        return self.process(segment).events

    def finalize(self, call_end_ms: int | None = None) -> CallQaResult:
        """Metrics, complete rule evaluation and score of the ended call."""
        metrics = compute_metrics(
            self.segments,
            call_end_ms=call_end_ms,
            silence_threshold_ms=self.config.silence_threshold_ms,
            interruption_min_overlap_ms=self.config.interruption_min_overlap_ms,
        )
        events = self._rules.finalize(metrics.duration_ms)
        return score_call(self.call_id, self.config.scorecard, metrics, events)
