"""Hold metrics: total and count of a call's holds, overlapping ones once; the call's other metrics unchanged."""

from __future__ import annotations

from pipeline.qa.metrics import compute_metrics
from pipeline.qa.segment import Segment

SEGMENTS = [Segment("c1", "agent", "s1", 0, 2_000, "hello there"),
            Segment("c1", "customer", "s2", 9_000, 10_000, "thanks")]


def test_holds_are_totalled_once_and_counted() -> None:
    m = compute_metrics(SEGMENTS, call_end_ms=12_000, holds_ms=[(2_500, 6_000), (5_000, 8_000), (11_000, 11_000)])
    assert (m.hold_ms, m.holds) == (5_500, 1)
    assert m.as_dict()["hold_ms"] == 5_500.0


def test_a_call_without_holds_reports_zero_and_the_same_other_metrics() -> None:
    plain, held = compute_metrics(SEGMENTS, call_end_ms=12_000), compute_metrics(SEGMENTS, call_end_ms=12_000,
                                                                                 holds_ms=[(3_000, 8_000)])
    assert (plain.hold_ms, plain.holds) == (0, 0)
    assert {k: v for k, v in held.as_dict().items() if k not in ("hold_ms", "holds")} == {
        k: v for k, v in plain.as_dict().items() if k not in ("hold_ms", "holds")}
