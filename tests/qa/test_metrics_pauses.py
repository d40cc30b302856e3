"""Secure pause metrics: a paused span (the call's capture paused, no audio) is neither talk nor silence nor
a hold. Expectations worked out by hand below each call."""

from __future__ import annotations

import pytest

from pipeline.qa.metrics import compute_metrics
from pipeline.qa.segment import Segment

# agent talks 0-2 s, customer 9-10 s; the call lasts 12 s.
SEGMENTS = [Segment("c1", "agent", "s1", 0, 2_000, "hello there"),
            Segment("c1", "customer", "s2", 9_000, 10_000, "thanks")]


def test_a_paused_span_is_left_out_of_talk_and_silence() -> None:
    m = compute_metrics(SEGMENTS, call_end_ms=12_000, pauses_ms=[(3_000, 8_000)], silence_threshold_ms=5_000)
    # Talk: 2 s + 1 s. Paused 5 s of the 12: 7 s captured, of which 3 s talk, so 4 s non-talk.
    assert (m.duration_ms, m.talk_ms, m.paused_ms, m.pauses) == (12_000, 3_000, 5_000, 1)
    assert m.non_talk_ms == 4_000
    assert m.non_talk_pct == pytest.approx(100 * 4 / 7)
    assert m.agent_talk_pct == pytest.approx(100 * 2 / 7)
    assert m.customer_talk_pct == pytest.approx(100 * 1 / 7)
    # The 7 s gap 2-9 s is cut by the pause into 2-3 s and 8-9 s: 1 s each, no silence over 5 s.
    assert (m.silence_count, m.longest_silence_ms, m.silence_avg_ms) == (0, 1_000, 0.0)
    assert (m.hold_ms, m.holds) == (0, 0)  # not a hold
    assert m.as_dict()["paused_ms"] == 5_000.0


def test_without_the_pause_the_same_gap_is_one_long_silence() -> None:
    m = compute_metrics(SEGMENTS, call_end_ms=12_000, silence_threshold_ms=5_000)
    assert (m.non_talk_ms, m.silence_count, m.longest_silence_ms, m.paused_ms, m.pauses) == (9_000, 1, 7_000, 0, 0)
    assert m.agent_talk_pct == pytest.approx(100 * 2 / 12)


def test_each_part_of_a_gap_around_a_pause_is_judged_alone() -> None:
    segments = [Segment("c1", "agent", "s1", 0, 1_000, "card please"),
                Segment("c1", "customer", "s2", 30_000, 31_000, "done")]
    # Gap 1-30 s; paused 8-20 s (and 19-22 s, overlapping: one pause of 8-22 s). Parts: 1-8 s (7 s) and
    # 22-30 s (8 s), both over the 5 s threshold.
    m = compute_metrics(segments, call_end_ms=31_000, pauses_ms=[(8_000, 20_000), (19_000, 22_000)],
                        silence_threshold_ms=5_000)
    assert (m.paused_ms, m.pauses) == (14_000, 1)
    assert (m.silence_count, m.longest_silence_ms, m.silence_avg_ms) == (2, 8_000, 7_500.0)
    # 31 s less 14 s paused = 17 s captured; 2 s talk; 15 s non-talk.
    assert m.non_talk_ms == 15_000 and m.non_talk_pct == pytest.approx(100 * 15 / 17)


def test_holds_and_pauses_are_counted_apart() -> None:
    m = compute_metrics(SEGMENTS, call_end_ms=12_000, holds_ms=[(2_500, 3_000)], pauses_ms=[(3_000, 8_000)])
    assert (m.hold_ms, m.holds, m.paused_ms, m.pauses) == (500, 1, 5_000, 1)


def test_a_pause_past_the_calls_end_counts_up_to_the_end_only() -> None:
    m = compute_metrics(SEGMENTS, call_end_ms=12_000, pauses_ms=[(11_000, 15_000)])
    # Paused 11-12 s: 1 s; 11 s captured, 3 s talk, 8 s non-talk (2-9 s and 10-11 s).
    assert (m.paused_ms, m.non_talk_ms, m.longest_silence_ms) == (1_000, 8_000, 7_000)
