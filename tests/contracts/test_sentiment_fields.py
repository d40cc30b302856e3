"""The sentiment fields: sentiment on a final, the call's sentiment, monologue and hold figures on CallQA.
Both are optional with defaults, so messages of producers from before read as zeros and new ones round-trip."""

from __future__ import annotations

from collections.abc import Callable

from pipeline.contracts import CallQA, Serde, TranscriptSegment


def test_messages_of_earlier_producers_read_with_zero_sentiment(written_before: Callable[..., bytes]) -> None:
    serde = Serde.from_settings()
    segment = serde.decode(written_before(TranscriptSegment.SCHEMA, "sentiment", {
        "segment_id": "c/agent/1", "call_id": "c", "leg": "agent", "start_ms": 0, "end_ms": 900, "text": "hi",
        "is_final": True, "confidence": 0.5, "avg_logprob": -0.5, "no_speech_prob": 0.0, "model_name": "m",
        "model_version": 1, "produced_at_ms": 5}), TranscriptSegment)
    assert segment.text == "hi" and segment.sentiment == 0.0
    qa = serde.decode(written_before(CallQA.SCHEMA, "customer_sentiment", {
        "call_id": "c", "score_pct": 90.0, "auto_failed": False, "metrics": {"hold_ms": 20000.0}, "items": [],
        "events": [], "computed_at_ms": 5}), CallQA)
    assert (qa.customer_sentiment, qa.customer_sentiment_start, qa.customer_sentiment_end,
            qa.agent_sentiment_start, qa.agent_sentiment_end, qa.longest_monologue_ms, qa.hold_ms) == (0, 0, 0, 0, 0, 0, 0)


def test_the_new_fields_round_trip_exactly() -> None:
    serde = Serde.from_settings()
    segment = TranscriptSegment("c/customer/1", "c", "customer", 0, 900, "Thank you so much.", True, 0.5, -0.5, 0.0,
                                "m", 1, produced_at_ms=5, sentiment=2.7)
    assert serde.decode_any(serde.encode(segment)) == segment
    qa = CallQA("c", 80.0, False, {}, [], [], computed_at_ms=5, customer_sentiment=-0.54,
                customer_sentiment_start=-1.38, customer_sentiment_end=0.58, agent_sentiment_start=1.7,
                agent_sentiment_end=1.03, longest_monologue_ms=38050, hold_ms=20000)
    assert serde.decode_any(serde.encode(qa)) == qa
