"""A migrated callqa database filled from real QA output on fixture calls, for the dashboard queries."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from clickhouse_connect.driver.client import Client

from pipeline.qa.call import CallAnalyzer, QaConfig
from pipeline.qa.categories import load_categories
from pipeline.qa.rules import load_rules
from pipeline.qa.scorecard import CallQaResult, load_scorecard
from pipeline.qa.segment import Segment
from pipeline.store.client import connect
from pipeline.store.migrations import migrate

REPO = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)

_GREETING = "Good morning, thank you for calling Acme, this call may be recorded for quality purposes."
# (call_id, tenant, agent_id, end_reason, [(leg, start_s, end_s, text)], call end s)
CALLS = [
    ("call-good", "acme", "agent-1", "end", [
        ("agent", 0, 6, _GREETING),
        ("customer", 6.5, 10, "Hi, I have a question about my bill."),
        ("agent", 10.5, 14, "Of course, can you confirm your date of birth?"),
        ("customer", 14.5, 17, "The fourth of May."),
        ("agent", 17.5, 25, "Thanks, I removed the charge for you."),
        ("agent", 27.5, 32, "Is there anything else I can help you with? Have a great day."),
    ], 33),
    ("call-rude", "acme", "agent-2", "end", [
        ("agent", 0, 4, "Yeah, what do you want?"),
        ("customer", 4.5, 12, "My card 4111 1111 1111 1111 was charged twice, I want to speak to the manager"),
        ("agent", 11, 15, "That's not my problem, whatever."),
        ("customer", 22, 25, "Then cancel my account."),
    ], 26),
    ("call-quiet", "globex", "agent-1", "timeout", [
        ("agent", 0, 5, _GREETING),
        ("customer", 5.5, 9, "Hello, my email is john dot smith at example dot com"),
        ("agent", 20, 24, "Can you confirm your date of birth please?"),
        ("customer", 40, 43, "Sorry, I was away. It's the first of June."),
        ("agent", 43.5, 47, "Thank you, have a nice day."),
    ], 48),
    ("call-short", "globex", "agent-3", "end", [
        ("customer", 0, 3, "Hello? Is this the billing line?"),
        ("agent", 2, 6, "Yes it is, how can I help you?"),
        ("customer", 6.5, 8, "Never mind, bye."),
    ], 9),
]  # fmt: skip


# The quiet call's customer was put on hold while the agent looked something up (the hold panels).
HOLDS = {"call-quiet": [(10_000, 18_000)]}


@dataclass
class FilledDatabase:
    client: Client
    database: str
    results: dict[str, CallQaResult]
    segments: dict[str, list[Segment]]


def _analyze(config: QaConfig, call_id: str, lines, end_s: float):  # type: ignore[no-untyped-def]
    analyzer = CallAnalyzer(call_id, config)
    redactions = []
    for i, (leg, start, end, text) in enumerate(lines):
        out = analyzer.process(
            Segment(call_id, leg, f"{call_id}-{i:03d}", int(start * 1000), int(end * 1000), text)
        )
        redactions.append(out.redacted.total)
    return analyzer, redactions, analyzer.finalize(int(end_s * 1000), HOLDS.get(call_id, ()))


def _insert(client: Client, db: str, table: str, rows: list[dict]) -> None:  # type: ignore[type-arg]
    columns = list(rows[0])
    client.insert(table, [[row[c] for c in columns] for row in rows], column_names=columns, database=db)


def _fill(client: Client, db: str, config: QaConfig) -> FilledDatabase:
    calls, segments, latency, call_qa, events = [], [], [], [], []
    results: dict[str, CallQaResult] = {}
    texts: dict[str, list[Segment]] = {}
    for n, (call_id, tenant, agent, reason, lines, end_s) in enumerate(CALLS):
        started = T0 + timedelta(minutes=7 * n)
        ended = started + timedelta(seconds=end_s)
        analyzer, redactions, result = _analyze(config, call_id, lines, end_s)
        results[call_id], texts[call_id] = result, analyzer.segments
        calls.append(
            dict(
                call_id=call_id,
                tenant=tenant,
                agent_id=agent,
                queue="billing",
                direction="inbound",
                legs=["agent", "customer"],
                started_at=started,
                ended_at=ended,
                end_reason=reason,
                segments=len(lines),
                audio_ms=int(end_s * 2000),
                updated_at=ended,
                categories=list(result.categories),  # as the worker writes them at call end
            )
        )
        for i, (segment, redacted) in enumerate(zip(analyzer.segments, redactions, strict=True)):
            produced = started + timedelta(milliseconds=segment.end_ms + 300)
            segments.append(
                dict(
                    segment_id=segment.segment_id,
                    call_id=call_id,
                    leg=segment.leg,
                    start_ms=segment.start_ms,
                    end_ms=segment.end_ms,
                    text=segment.text,
                    confidence=0.9,
                    avg_logprob=-0.3,
                    no_speech_prob=0.01,
                    is_final=1,
                    model_name="tiny.en",
                    model_version=1,
                    redactions=redacted,
                    produced_at=produced,
                )
            )
            # Latency derived from the segment: longer utterances take longer to decode.
            inference = 20.0 + segment.duration_ms / 50
            latency.append(
                dict(
                    segment_id=segment.segment_id,
                    call_id=call_id,
                    leg=segment.leg,
                    batch_size=1 + i % 4,
                    batcher_wait_ms=5.0 * (i % 3),
                    inference_ms=inference,
                    frame_to_consume_ms=3.0,
                    end_to_end_ms=3.0 + 5.0 * (i % 3) + inference,
                    worker_id=f"worker-{n % 2}",
                    measured_at=produced,
                )
            )
        applicable = [item for item in result.items if item.passed is not None]
        call_qa.append(
            {
                "call_id": call_id,
                "tenant": tenant,
                "agent_id": agent,
                "score_pct": result.score_pct,
                "auto_failed": int(result.auto_failed),
                "metrics": result.metrics,
                "items.question": [i.question for i in applicable],
                "items.weight": [i.weight for i in applicable],
                "items.passed": [int(bool(i.passed)) for i in applicable],
                "items.rationale": [i.rationale for i in applicable],
                "computed_at": ended,
            }
        )
        for event in result.events:
            events.append(
                dict(
                    call_id=call_id,
                    rule=event.rule,
                    category=event.category,
                    leg=event.leg,
                    kind=event.kind,
                    offset_ms=event.offset_ms,
                    text=event.text,
                    severity=event.severity,
                    detected_at=started + timedelta(milliseconds=event.offset_ms),
                )
            )
    for table, rows in (
        ("calls", calls),
        ("segments", segments),
        ("latency", latency),
        ("call_qa", call_qa),
        ("qa_events", events),
    ):
        _insert(client, db, table, rows)
        _insert(client, db, table, rows[:2])  # an at-least-once replay: dashboards must not count it twice
    return FilledDatabase(client, db, results, texts)


@pytest.fixture(scope="module")
def filled_db(chdb_path: str) -> Iterator[FilledDatabase]:
    rule_set = load_rules(REPO / "rules")
    config = QaConfig(rule_set, load_scorecard(REPO / "rules" / "scorecards" / "default.yaml", rule_set),
                      categories=load_categories(REPO / "rules", rule_set))
    database = f"dash_{datetime.now().strftime('%H%M%S%f')}"
    client = connect(f"chdb://{chdb_path}", database)
    migrate(client, database)
    yield _fill(client, database, config)
    client.command(f"DROP DATABASE IF EXISTS {database}")
