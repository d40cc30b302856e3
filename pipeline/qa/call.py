"""Per-call QA: redact each segment, match rules live, score the call when it ends.

The streaming worker keeps one ``CallAnalyzer`` per open call and feeds it final segments as they
arrive; ``QaConfig`` (rules, scorecard, settings) is loaded once per worker and shared by all calls.

Segments of a call's two legs finish decoding in any order, but redaction context is judged by time (the
agent's question before the customer's answer). So the worker announces each segment when it is
submitted (``expect``), hands it over when decoded (``complete``, or ``skip`` for silence and failures),
and gets segments back only in time order, each once every segment that started before it is known:
the stored text is the same whatever order decoding finished in, and no segment is published before the
context that redacts it.

The worker may still have to release a segment after later ones (a leg whose audio came later than the
other legs' by more than ``CALLQA_HELD_FINAL_MAX_MS``: pipeline/worker/release.py). It is redacted with
the context before it in time, as always; its live alerts come late; and ``finalize`` evaluates the rules
again over all segments in time order, so the call's QA is the one a call released in order would get.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from pipeline.config.qa import QaSettings
from pipeline.qa.categories import Category, categorize, load_categories
from pipeline.qa.metrics import compute_metrics
from pipeline.qa.redaction import (
    CallRedactor,
    RedactedText,
    RedactedTurn,
    RedactionMemory,
    redacted_turn,
    segment_order,
)
from pipeline.qa.rules import QaEvent, RuleEngine, RuleSet, load_rules
from pipeline.qa.scorecard import CallQaResult, Scorecard, load_scorecard, score_call
from pipeline.qa.segment import Segment
from pipeline.qa.sentiment import CallSentiment, call_sentiment, score_text


@dataclass(frozen=True)
class QaConfig:
    """What every call of a worker is evaluated with."""

    rule_set: RuleSet
    scorecard: Scorecard
    silence_threshold_ms: int = 5000
    interruption_min_overlap_ms: int = 500
    fuzzy_threshold: float = 0.8
    redaction_enabled: bool = True
    exchange_idle_ms: int = 30_000
    redact_names: bool = False
    categories: tuple[Category, ...] = ()  # rules/categories/*.yaml

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
            exchange_idle_ms=settings.qa_exchange_idle_ms,
            redact_names=settings.qa_redact_names,
            categories=load_categories(settings.rules_dir, rule_set),
        )


@dataclass(frozen=True)
class AnalyzedSegment:
    redacted: RedactedText
    events: list[QaEvent]
    sentiment: float = 0.0  # of the redacted text, −5..+5 (pipeline/qa/sentiment.py)


@dataclass
class _Expected:
    order: tuple[int, int, str]
    segment: Segment | None = None  # set once decoded
    skipped: bool = False


@dataclass
class CallAnalyzer:
    """QA state of one call. Segments must be final; they may arrive interleaved across legs."""

    call_id: str
    config: QaConfig
    segments: list[Segment] = field(default_factory=list)
    redaction_counts: dict[str, int] = field(default_factory=dict)
    sentiments: dict[str, float] = field(default_factory=dict)  # segment id -> score of its redacted text
    redacted_turns: list[RedactedTurn] = field(default_factory=list)  # what the call's recording cuts
    # The live alerts raised so far, in the order they fired: a call resumed from a checkpoint raises those
    # of its restored segments again here (not on the topic), so the live desk's count survives a take-over.
    alerts: list[QaEvent] = field(default_factory=list)
    _redactor: CallRedactor = field(init=False)
    _rules: RuleEngine = field(init=False)
    _expected: list[_Expected] = field(default_factory=list)  # submitted, not yet released; time order
    _last_order: tuple[int, int] = (-1, -1)  # (start, leg) of the latest segment processed
    _out_of_order: bool = False  # a segment was processed after a later one (see finalize)

    def __post_init__(self) -> None:
        self._redactor = CallRedactor(self.config.exchange_idle_ms, names=self.config.redact_names, salt=self.call_id)
        self._rules = RuleEngine(self.config.rule_set, self.config.fuzzy_threshold)

    def redact(self, segment: Segment) -> RedactedText:
        """The segment as it may leave the worker (unchanged only when redaction is switched off)."""
        if not self.config.redaction_enabled:
            return RedactedText(segment, {})
        return self._redactor.redact(segment)

    def redaction_memory(self, through: Segment | None = None) -> RedactionMemory:
        """What a checkpoint keeps of the redactor beside the stored text, as of ``through`` (None: now)."""
        return self._redactor.memory(None if through is None else segment_order(through))

    def restore_redaction(self, memory: RedactionMemory) -> None:
        """After the stored segments were processed again (a resumed call): what their text no longer says."""
        self._redactor.restore(memory)

    def redact_partial(self, segment: Segment, watermarks: Mapping[str, int] | None = None) -> RedactedText:
        """Redact a partial (still growing) segment without advancing the call's redaction context.

        The final version of the segment goes through ``process`` later; a partial must not count
        as one of the segments the agent's question keeps the CVV/expiry context open for. A partial is
        not held: while a segment that started before it is still undecoded (or, per ``watermarks``,
        another leg may still start one before it), it is redacted as if every context were open.
        """
        if not self.config.redaction_enabled:
            return RedactedText(segment, {})
        unknown = any(e.order[0] <= segment.start_ms and not e.skipped for e in self._expected) or any(
            mark <= segment.start_ms for leg, mark in (watermarks or {}).items() if leg != segment.leg
        )
        return self._redactor.redact(segment, remember=False, assume_context=unknown)

    def expect(self, leg: str, segment_id: str, start_ms: int) -> None:
        """A segment was submitted for decoding: later segments wait for it (see ``complete``)."""
        entry = _Expected((start_ms, 0 if leg == "agent" else 1, segment_id))
        bisect.insort(self._expected, entry, key=lambda e: e.order)

    def complete(self, segment: Segment, watermarks: Mapping[str, int] | None = None) -> list[AnalyzedSegment]:
        """A decoded segment; returns the segments now released (redacted, matched), in time order.

        ``watermarks``: per leg, the time before which every segment of that leg has been submitted
        (the worker's VAD position); a segment is held until every leg has passed its start, so an
        agent's question still being spoken or decoded redacts the answer given over it.
        """
        entry = self._entry(segment.segment_id)
        if entry is None:  # not announced (offline use): analysed now
            return [self.process(segment)]
        entry.segment = segment
        return self.release(watermarks)

    def skip(self, segment_id: str, watermarks: Mapping[str, int] | None = None) -> list[AnalyzedSegment]:
        """An announced segment that yields no text (silence, failed decoding): it no longer holds others."""
        entry = self._entry(segment_id)
        if entry is not None:
            entry.skipped = True
        return self.release(watermarks)

    def release(self, watermarks: Mapping[str, int] | None = None) -> list[AnalyzedSegment]:
        """Process the decoded segments that nothing earlier is still pending for, in time order."""
        out: list[AnalyzedSegment] = []
        while self._expected:
            head = self._expected[0]
            if head.skipped:
                self._expected.pop(0)
                continue
            if head.segment is None or any(mark <= head.order[0] for mark in (watermarks or {}).values()):
                break
            self._expected.pop(0)
            out.append(self.process(head.segment))
        return out

    def flush(self) -> list[AnalyzedSegment]:
        """At call end: every decoded segment still held, in time order (the rest never came)."""
        done = [e.segment for e in self._expected if e.segment is not None and not e.skipped]
        self._expected.clear()
        return [self.process(segment) for segment in done]

    def _entry(self, segment_id: str) -> _Expected | None:
        return next((e for e in self._expected if e.order[2] == segment_id), None)

    def process(self, segment: Segment) -> AnalyzedSegment:
        """Redact, keep and match one segment: the text to store and publish, and the alerts to raise now."""
        if segment.call_id != self.call_id:
            raise ValueError(f"segment of call {segment.call_id} given to analyzer of call {self.call_id}")
        order = _time_order(segment)
        self._out_of_order |= order < self._last_order
        self._last_order = max(self._last_order, order)
        redacted = self.redact(segment)
        for marker, count in redacted.counts.items():
            self.redaction_counts[marker] = self.redaction_counts.get(marker, 0) + count
        self.segments.append(redacted.segment)
        turn = redacted_turn(segment, redacted) if self.config.redaction_enabled else None
        if turn is not None:
            self.redacted_turns.append(turn)
        score = self.sentiments[segment.segment_id] = score_text(redacted.segment.text)
        events = self._rules.on_segment(redacted.segment, score)
        self.alerts.extend(events)
        return AnalyzedSegment(redacted, events, score)

    def add_segment(self, segment: Segment) -> list[QaEvent]:
        """Redact first, then match: returns the alerts to raise while the call is live (violations, intents)."""
        return self.process(segment).events

    def finalize(self, call_end_ms: int | None = None, holds_ms: Sequence[tuple[int, int]] = (),
                 pauses_ms: Sequence[tuple[int, int]] = ()) -> CallQaResult:
        """Metrics, complete rule evaluation and score of the ended call (``holds_ms``: its holds, ``pauses_ms``:
        its secure pauses, call time)."""
        metrics = compute_metrics(
            self.segments,
            call_end_ms=call_end_ms,
            holds_ms=holds_ms,
            pauses_ms=pauses_ms,
            silence_threshold_ms=self.config.silence_threshold_ms,
            interruption_min_overlap_ms=self.config.interruption_min_overlap_ms,
        )
        rules = self._rules
        if self._out_of_order:
            # Rule state depends on the order segments came in (a must rule met stops matching later
            # ones): evaluate again in time order, as the offline analysis does.
            rules = RuleEngine(self.config.rule_set, self.config.fuzzy_threshold)
            for segment in sorted(self.segments, key=_time_order):
                rules.on_segment(segment, self.sentiments.get(segment.segment_id))
        events = rules.finalize(metrics.duration_ms)
        result = score_call(self.call_id, self.config.scorecard, metrics, events, self.sentiment())
        return replace(result, categories=tuple(categorize(events, self.config.categories)))

    def sentiment(self) -> CallSentiment:
        """Each leg's sentiment over the segments so far, in time order."""
        ordered = sorted(self.segments, key=_time_order)
        return call_sentiment([(s.leg, self.sentiments.get(s.segment_id, 0.0)) for s in ordered])


def _time_order(segment: Segment) -> tuple[int, int]:
    """Where a segment stands in the call: by start, the agent's first (as ``expect`` and ``callqa analyze``)."""
    return segment.start_ms, 0 if segment.leg == "agent" else 1
