"""`callqa analyze` (offline) and the streaming worker give one call the same segments, text and QA."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.analyze import analyze_recordings
from pipeline.asr.engine import Engine
from pipeline.broker.producer import ContractProducer
from pipeline.config import Settings
from pipeline.contracts import Serde
from pipeline.ingest.replay import ReplayOptions, TelephonyReplay, load_recording
from pipeline.qa.call import QaConfig

pytestmark = [pytest.mark.broker, pytest.mark.slow]

# A library call with a card number, its expiry and security code, and rules that fire: redaction and
# verdicts are compared too, not only segments (the set-up builds the library).
CALL = Path(__file__).resolve().parents[2] / "samples" / "calls" / "library" / "built" / "02_card_payment.wav"


def test_offline_analysis_equals_what_the_worker_stores_for_the_replayed_call(
    kafka_settings, start_worker  # type: ignore[no-untyped-def]
) -> None:
    worker = start_worker()
    player = TelephonyReplay(ContractProducer(kafka_settings.bootstrap, Serde.from_settings()),
                             kafka_settings.topic_audio, kafka_settings.topic_call_events)
    (call_id,) = player.run([load_recording(CALL, ReplayOptions())], ReplayOptions()).call_ids
    worker.wait_for_calls([call_id])
    (offline,) = analyze_recordings([CALL], Engine.load(), QaConfig.from_settings(Settings()))

    stored = worker.query("SELECT leg, start_ms, end_ms, text FROM segments FINAL WHERE call_id = {c:String} "
                          "AND is_final = 1 ORDER BY start_ms, leg", c=call_id)
    assert len(offline.segments) >= 4 and {s.leg for s in offline.segments} == {"agent", "customer"}
    assert [(r["leg"], r["start_ms"], r["end_ms"], r["text"]) for r in stored] == [
        (s.leg, s.start_ms, s.end_ms, s.text) for s in offline.segments
    ]
    (qa,) = worker.query("SELECT score_pct, auto_failed, metrics, `items.question` AS q, `items.passed` AS p "
                         "FROM call_qa FINAL WHERE call_id = {c:String}", c=call_id)
    assert (qa["score_pct"], bool(qa["auto_failed"])) == (offline.qa.score_pct, offline.qa.auto_failed)
    # the worker stores the applicable items only
    assert list(zip(qa["q"], map(bool, qa["p"]), strict=True)) == [
        (i.question, i.passed) for i in offline.qa.items if i.passed is not None
    ]
    assert qa["metrics"] == pytest.approx(offline.qa.metrics)
    events = worker.query("SELECT rule, kind FROM qa_events FINAL WHERE call_id = {c:String} ORDER BY rule, kind",
                          c=call_id)
    assert [(e["rule"], e["kind"]) for e in events] == sorted((e.rule, e.kind) for e in offline.qa.events)
    assert events and any("[PAN]" in s.text for s in offline.segments)
    (row,) = worker.query("SELECT categories FROM calls_deduped WHERE call_id = {c:String}", c=call_id)
    assert row["categories"] == list(offline.qa.categories)  # the call's categories, stored with its calls row
