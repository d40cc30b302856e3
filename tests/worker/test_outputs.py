"""Messages and rows built from a call's results."""

from __future__ import annotations

from datetime import UTC, datetime

from pipeline.contracts.messages import CallEvent
from pipeline.qa.rules import QaEvent
from pipeline.qa.scorecard import CallQaResult, ScoreItem
from pipeline.worker.outputs import call_qa_message, call_qa_row, call_row, qa_event_row, to_datetime
from pipeline.worker.state import CallState

EVENT = QaEvent("greeting", "compliance", "agent", "missing", -5, "no greeting", "high")


def _result() -> CallQaResult:
    items = [ScoreItem("Greets?", 10, True, "said hello"), ScoreItem("Holds?", 5, None, "no hold"),
             ScoreItem("Verifies?", 20, False, "never asked", auto_fail=True)]
    return CallQaResult("c1", 0.0, True, items, {"talk_pct": 61}, [EVENT], "default")


def test_items_not_applicable_to_the_call_are_not_scored() -> None:
    start = CallEvent("c1", "start", tenant="acme", agent_id="a7", queue="claims")
    qa = call_qa_message("c1", _result(), start)
    assert [i.question for i in qa.items] == ["Greets?", "Verifies?"]
    assert (qa.tenant, qa.agent_id, qa.auto_failed, qa.metrics) == ("acme", "a7", True, {"talk_pct": 61.0})
    assert [e.rule for e in qa.events] == ["greeting"]
    row = call_qa_row(qa)
    assert row["items.passed"] == [1, 0] and row["auto_failed"] == 1


def test_a_call_without_a_start_event_gets_empty_tenant_and_inbound_direction() -> None:
    qa = call_qa_message("c1", _result(), None)
    call = CallState("c1", started_at_ms=1_700_000_000_000, segments_done=3)
    row = call_row(call, qa, None, "timeout", 42_000, 1_700_000_060_000)
    assert (row["tenant"], row["queue"], row["direction"], row["end_reason"]) == ("", "", "inbound", "timeout")
    assert row["ended_at"] - row["started_at"] == to_datetime(60_000) - to_datetime(0)
    assert (row["segments"], row["audio_ms"]) == (3, 42_000)


def test_event_offsets_before_the_call_are_stored_as_zero() -> None:
    assert qa_event_row("c1", EVENT)["offset_ms"] == 0


def test_times_are_aware_utc() -> None:
    assert to_datetime(1_500) == datetime(1970, 1, 1, 0, 0, 1, 500_000, tzinfo=UTC)
