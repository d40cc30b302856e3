"""Fixtures of the call-page tests: a migrated store filled from real QA output on a few scripted calls,
read through the same checked read-only query path the worker's pages use."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from clickhouse_connect.driver.client import Client

from pipeline.qa.call import CallAnalyzer, QaConfig
from pipeline.qa.categories import load_categories
from pipeline.qa.rules import load_rules
from pipeline.qa.scorecard import CallQaResult, load_scorecard
from pipeline.qa.segment import Segment
from pipeline.store.client import connect
from pipeline.store.migrations import migrate
from pipeline.store.queries import run_readonly_query

REPO = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
CARD = "4111 1111 1111 1111"
_GREETING = "Good morning, thank you for calling Acme, this call may be recorded for quality purposes."
# (call_id, agent, queue, [(leg, start_s, end_s, text)], call end s or None while open)
CALLS = [
    ("call-good", "agent-1", "billing", [
        ("agent", 0, 6, _GREETING),
        ("customer", 6.5, 10, "Hi, I have a question about my bill."),
        ("agent", 10.5, 14, "Of course, can you confirm your date of birth?"),
        ("customer", 14.5, 17, "The fourth of May."),
        ("agent", 17.5, 25, "Thanks, I removed the charge for you."),
        ("agent", 31.5, 36, "Is there anything else I can help you with? Have a great day."),
    ], 37),
    ("call-rude", "agent-2", "sales", [
        ("agent", 0, 4, "Yeah, what do you want?"),
        ("customer", 4.5, 12, f"My card {CARD} was charged twice, I want to speak to the manager"),
        ("agent", 11, 15, "That's not my problem, whatever."),
        ("customer", 22, 25, "Then cancel my account <script>alert(document.cookie)</script>."),
    ], 26),
    ("call-open", "agent-1", "sales", [
        ("agent", 0, 3, "Hello, you are through to Acme."),
    ], None),
]  # fmt: skip
# The calls put on hold, as the worker stores them: when (call time, ms), not only for how long.
HOLDS = {"call-good": [(25_500, 31_000)]}


@dataclass
class FilledStore:
    client: Client
    database: str
    results: dict[str, CallQaResult]
    started: dict[str, datetime]


class StoreRows:
    """A RowSource on the test's store through ``run_readonly_query``: the check and limits of /api/query."""

    def __init__(self, client: Client, database: str) -> None:
        self.client, self.database = client, database

    def rows(self, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        result = run_readonly_query(sql, params, client=self.client, database=self.database)
        assert not result.truncated
        return [dict(zip(result.columns, row, strict=True)) for row in result.rows]


def _insert(client: Client, db: str, table: str, rows: list[dict[str, Any]]) -> None:
    columns = list(rows[0])
    client.insert(table, [[row[c] for c in columns] for row in rows], column_names=columns, database=db)


def fill(client: Client, db: str, config: QaConfig) -> FilledStore:
    calls, segments, call_qa, events = [], [], [], []
    results: dict[str, CallQaResult] = {}
    started_at: dict[str, datetime] = {}
    for n, (call_id, agent, queue, lines, end_s) in enumerate(CALLS):
        started = started_at[call_id] = T0 + timedelta(days=n, minutes=7 * n)
        analyzer = CallAnalyzer(call_id, config)
        for i, (leg, start, end, text) in enumerate(lines):
            analyzer.process(Segment(call_id, leg, f"{call_id}-{i:03d}", int(start * 1000), int(end * 1000), text))
        calls.append(dict(call_id=call_id, tenant="acme", agent_id=agent, queue=queue, direction="inbound",
                          legs=["agent", "customer"], started_at=started,
                          ended_at=None if end_s is None else started + timedelta(seconds=end_s),
                          end_reason="" if end_s is None else "end", segments=len(lines),
                          audio_ms=int((end_s or 3) * 2000), updated_at=started + timedelta(seconds=end_s or 3),
                          hold_ms=sum(b - a for a, b in HOLDS.get(call_id, [])), holds=HOLDS.get(call_id, []),
                          categories=[]))
        for segment in analyzer.segments:  # redacted, as the worker stores them
            segments.append(dict(segment_id=segment.segment_id, call_id=call_id, leg=segment.leg,
                                 start_ms=segment.start_ms, end_ms=segment.end_ms, text=segment.text,
                                 confidence=0.9, avg_logprob=-0.3, no_speech_prob=0.01, is_final=1,
                                 model_name="tiny.en", model_version=1, redactions=0,
                                 produced_at=started + timedelta(milliseconds=segment.end_ms + 300)))
        if end_s is None:
            continue  # an open call: no QA yet
        result = results[call_id] = analyzer.finalize(int(end_s * 1000), HOLDS.get(call_id, []))
        calls[-1]["categories"] = list(result.categories)  # as the worker writes them at call end
        applicable = [item for item in result.items if item.passed is not None]
        call_qa.append({"call_id": call_id, "tenant": "acme", "agent_id": agent, "score_pct": result.score_pct,
                        "auto_failed": int(result.auto_failed), "metrics": result.metrics,
                        "items.question": [i.question for i in applicable],
                        "items.weight": [i.weight for i in applicable],
                        "items.passed": [int(bool(i.passed)) for i in applicable],
                        "items.rationale": [i.rationale for i in applicable],
                        "computed_at": started + timedelta(seconds=end_s)})
        events += [dict(call_id=call_id, rule=e.rule, category=e.category, leg=e.leg, kind=e.kind,
                        offset_ms=e.offset_ms, text=e.text, severity=e.severity,
                        detected_at=started + timedelta(milliseconds=e.offset_ms)) for e in result.events]
    for table, rows in (("calls", calls), ("segments", segments), ("call_qa", call_qa), ("qa_events", events)):
        _insert(client, db, table, rows)
        _insert(client, db, table, rows[:1])  # an at-least-once replay: pages must show it once
    return FilledStore(client, db, results, started_at)


@pytest.fixture(scope="module")
def qa_config() -> QaConfig:
    rule_set = load_rules(REPO / "rules")
    return QaConfig(rule_set, load_scorecard(REPO / "rules" / "scorecards" / "default.yaml", rule_set),
                    categories=load_categories(REPO / "rules", rule_set))


@pytest.fixture
def filled(chdb_path: str, unique_name: str, qa_config: QaConfig) -> Iterator[FilledStore]:
    client = connect(f"chdb://{chdb_path}", unique_name)
    migrate(client, unique_name)
    yield fill(client, unique_name, qa_config)
    client.command(f"DROP DATABASE IF EXISTS {unique_name}")


@pytest.fixture
def source(filled: FilledStore) -> StoreRows:
    return StoreRows(filled.client, filled.database)


CHROMIUM = next((p for p in (shutil.which("chromium-headless-shell"), "/usr/lib/chromium/chromium-headless-shell")
                 if p and Path(p).is_file()), None)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's chromium-headless-shell, driven by Playwright (the browser tests' one browser per module)."""
    from playwright.sync_api import sync_playwright

    assert CHROMIUM, "chromium-headless-shell is not installed: `make system` installs it"
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()
