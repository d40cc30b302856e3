"""The messages' revision field (which pass of a call) on transcripts and QA results. Defaulted, so
messages of earlier producers read as the live pass (0), and a post-call pass's messages round-trip."""

from __future__ import annotations

from collections.abc import Callable

from pipeline.contracts import CallQA, Serde, TranscriptSegment
from pipeline.worker.outputs import call_qa_row, segment_row


def test_messages_written_before_revisions_are_the_live_pass(written_before: Callable[..., bytes]) -> None:
    serde = Serde.from_settings()
    segment = serde.decode(written_before(TranscriptSegment.SCHEMA, "revision", {
        "segment_id": "c/agent/1", "call_id": "c", "leg": "agent", "start_ms": 0, "end_ms": 900, "text": "hi",
        "is_final": True, "confidence": 0.5, "avg_logprob": -0.5, "no_speech_prob": 0.0, "model_name": "m",
        "model_version": 1, "produced_at_ms": 5, "sentiment": 1.5}), TranscriptSegment)
    assert (segment.text, segment.sentiment, segment.revision) == ("hi", 1.5, 0)
    qa = serde.decode(written_before(CallQA.SCHEMA, "revision", {
        "call_id": "c", "score_pct": 90.0, "auto_failed": False, "metrics": {}, "items": [], "events": [],
        "computed_at_ms": 5, "hold_ms": 3000, "holds": [{"start_ms": 0, "end_ms": 3000}]}), CallQA)
    assert (qa.score_pct, qa.hold_ms, qa.revision) == (90.0, 3000, 0)


def test_a_post_call_pass_round_trips_and_reaches_its_rows() -> None:
    serde = Serde.from_settings()
    segment = TranscriptSegment("c/customer/1", "c", "customer", 0, 900, "My card number is redacted.", True, 0.5,
                                -0.25, 0.0, "moonshine-base", 1, produced_at_ms=5, revision=1)
    assert serde.decode_any(serde.encode(segment)) == segment
    qa = CallQA("c", 95.0, False, {}, [], [], computed_at_ms=5, revision=1)
    assert serde.decode_any(serde.encode(qa)) == qa
    assert segment_row(segment)["revision"] == 1 and call_qa_row(qa)["revision"] == 1
