"""The timeline's geometry: where speech, overtalk, silence, holds, alerts and sentiment land in the SVG."""

from __future__ import annotations

import pytest

from pipeline.web.timeline import (
    LABEL_W,
    MIN_BOX_W,
    RIGHT_PAD,
    AlertMark,
    Span,
    clock,
    layout,
    silences,
    subtract_intervals,
    tick_step_s,
)

WIDTH = 960.0
PLOT_W = WIDTH - LABEL_W - RIGHT_PAD


def x_of(ms: float, duration_ms: int) -> float:
    return round(LABEL_W + ms / duration_ms * PLOT_W, 1)


def test_speech_lands_on_its_legs_lane_in_proportion_to_time() -> None:
    t = layout(40_000, [Span("agent", 0, 10_000, "turn-0"), Span("customer", 20_000, 40_000, "turn-1")])
    agent, customer = t.of_kind("agent"), t.of_kind("customer")
    assert [(b.x, b.width, b.anchor) for b in agent] == [(LABEL_W, round(PLOT_W / 4, 1), "turn-0")]
    assert [(b.x, b.width, b.anchor) for b in customer] == [(x_of(20_000, 40_000), round(PLOT_W / 2, 1), "turn-1")]
    lanes = {lane.name: lane for lane in t.lanes}
    assert agent[0].y == lanes["agent"].y and customer[0].y == lanes["customer"].y
    assert lanes["agent"].y < lanes["customer"].y < lanes["between"].y
    assert (t.plot_x, t.plot_width) == (LABEL_W, round(PLOT_W, 1))


def test_overtalk_is_where_both_speak_and_silence_only_long_gaps_between_speech() -> None:
    spans = [Span("agent", 1_000, 5_000, "turn-0"), Span("customer", 4_000, 6_000, "turn-1"),
             Span("agent", 12_000, 14_000, "turn-2"), Span("customer", 16_000, 17_000, "turn-3")]
    t = layout(30_000, spans, silence_threshold_ms=5_000)
    assert [(b.start_ms, b.end_ms) for b in t.of_kind("overtalk")] == [(4_000, 5_000)]
    # 6 s -> 12 s is a silence (6 s > 5 s); 14 -> 16 s is not; the lead-in (0-1 s) and tail (17-30 s) are not.
    assert [(b.start_ms, b.end_ms) for b in t.of_kind("silence")] == [(6_000, 12_000)]
    lanes = {lane.name: lane for lane in t.lanes}
    assert {b.y for b in t.of_kind("overtalk") + t.of_kind("silence")} == {lanes["between"].y}


def test_a_hold_is_drawn_as_a_hold_not_as_the_silence_it_also_is() -> None:
    spans = [Span("agent", 0, 2_000, "turn-0"), Span("customer", 30_000, 32_000, "turn-1")]
    t = layout(32_000, spans, holds=[(10_000, 20_000)], silence_threshold_ms=5_000)
    assert [(b.start_ms, b.end_ms) for b in t.of_kind("hold")] == [(10_000, 20_000)]
    assert [(b.start_ms, b.end_ms) for b in t.of_kind("silence")] == [(2_000, 10_000), (20_000, 30_000)]


def test_a_hold_is_a_band_across_both_legs_drawn_beneath_the_speech() -> None:
    spans = [Span("agent", 0, 11_000, "turn-0"), Span("customer", 19_000, 22_000, "turn-1")]
    t = layout(30_000, spans, holds=[(20_000, 25_000), (10_000, 20_000), (3_000, 3_000)])
    lanes = {lane.name: lane for lane in t.lanes}
    [hold] = t.of_kind("hold")  # touching holds are one band; an empty one is none
    assert (hold.start_ms, hold.end_ms, hold.anchor) == (10_000, 25_000, None)
    assert hold.y == lanes["agent"].y
    assert hold.y + hold.height == lanes["between"].y + lanes["between"].height
    assert (hold.x, hold.width) == (t.plot_x + t.plot_width / 3, round(t.plot_width / 2, 1))
    assert t.boxes[0] == hold  # painted first: the agent's turn overlapping it stays on top


def test_a_short_turn_on_a_long_call_stays_visible_and_nothing_leaves_the_plot() -> None:
    t = layout(3_600_000, [Span("agent", 1_000, 1_100, "turn-0"), Span("customer", 3_590_000, 3_700_000, "turn-1")])
    assert t.of_kind("agent")[0].width == MIN_BOX_W
    assert t.duration_ms == 3_700_000  # a turn past the given duration widens the axis
    assert all(b.x >= LABEL_W and b.x + b.width <= WIDTH - RIGHT_PAD + MIN_BOX_W for b in t.boxes)


def test_alerts_are_markers_in_time_order_linked_to_their_turn() -> None:
    alerts = [AlertMark(9_000, "cancellation_intent", "turn-3"), AlertMark(2_000, "escalation_request", None)]
    t = layout(10_000, [Span("agent", 0, 1_000, "turn-0")], alerts=alerts)
    assert [(m.offset_ms, m.x, m.anchor) for m in t.markers] == [(2_000, x_of(2_000, 10_000), None),
                                                                  (9_000, x_of(9_000, 10_000), "turn-3")]
    assert all(m.y1 < t.lanes[0].y and m.y2 >= t.lanes[-1].y + t.lanes[-1].height for m in t.markers)


def test_sentiment_lane_only_when_turns_carry_sentiment() -> None:
    plain = layout(10_000, [Span("agent", 0, 2_000, "turn-0")])
    assert [lane.name for lane in plain.lanes] == ["agent", "customer", "between"]
    assert plain.sentiment == () and plain.sentiment_zero_y is None

    spans = [Span("agent", 0, 2_000, "turn-0", 0.0), Span("customer", 2_000, 4_000, "turn-1", 5.0),
             Span("customer", 4_000, 6_000, "turn-2", -9.0), Span("agent", 6_000, 8_000, "turn-3", None)]
    t = layout(10_000, spans)
    lane = t.lanes[-1]
    assert lane.name == "sentiment" and t.height > plain.height
    lines = {line.leg: line.points for line in t.sentiment}
    top, middle, bottom = lane.y, lane.y + lane.height / 2, lane.y + lane.height
    assert lines["agent"] == ((x_of(1_000, 10_000), middle),)  # the unscored turn is left out
    # +5 at the top; −9 is off the scale and held at its bottom
    assert lines["customer"] == ((x_of(3_000, 10_000), top), (x_of(5_000, 10_000), bottom))
    assert t.sentiment_zero_y == middle


@pytest.mark.parametrize(("a", "b", "expected"), [
    ([(0, 10)], [(2, 4), (6, 8)], [(0, 2), (4, 6), (8, 10)]),
    ([(0, 10)], [(0, 10)], []),
    ([(0, 10), (20, 30)], [(5, 25)], [(0, 5), (25, 30)]),
    ([(0, 10)], [], [(0, 10)]),
])
def test_subtract_intervals(a: list[tuple[int, int]], b: list[tuple[int, int]],
                            expected: list[tuple[int, int]]) -> None:
    assert subtract_intervals(a, b) == expected


def test_silences_ticks_and_clock() -> None:
    assert silences([(0, 1_000), (500, 2_000), (8_000, 9_000)], 5_000) == [(2_000, 8_000)]
    assert silences([(0, 1_000), (6_000, 7_000)], 5_000) == []  # exactly the threshold is not longer
    assert (tick_step_s(30_000), tick_step_s(95_000), tick_step_s(1_200_000)) == (5, 10, 120)
    t = layout(60_000, [])
    assert [tick.label for tick in t.ticks] == ["0:00", "0:10", "0:20", "0:30", "0:40", "0:50", "1:00"]
    assert (clock(61_999), clock(3_725_000)) == ("1:01", "1:02:05")
