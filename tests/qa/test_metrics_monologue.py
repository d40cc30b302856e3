"""Longest monologue per leg: who held the floor alone the longest, through their own pauses."""

from __future__ import annotations

from pipeline.qa.metrics import compute_metrics, longest_monologue
from tests.qa.conftest import SegmentFactory


def test_a_monologue_runs_through_own_pauses_until_the_other_leg_speaks_or_a_silence() -> None:
    own = [(0, 4_000), (4_800, 9_000), (9_500, 12_000), (20_000, 21_000), (22_000, 30_000)]
    # the other leg answers at 12.5 s: the first monologue is 0-12 s, the pauses of 0.8 and 0.5 s inside it
    assert longest_monologue(own, [(12_500, 13_000)], max_pause_ms=5_000) == 12_000
    # the 8 s silence from 12 to 20 s ends it too, with nobody else speaking
    assert longest_monologue(own, [], max_pause_ms=5_000) == 12_000
    assert longest_monologue(own, [], max_pause_ms=10_000) == 30_000
    assert longest_monologue([], [(0, 1_000)], max_pause_ms=5_000) == 0


def test_talking_over_a_monologue_does_not_end_it_but_speaking_in_its_pause_does() -> None:
    own = [(0, 6_000), (6_500, 10_000)]
    assert longest_monologue(own, [(2_000, 2_600)], max_pause_ms=5_000) == 10_000  # "mhm" over it
    assert longest_monologue(own, [(5_500, 6_200)], max_pause_ms=5_000) == 6_000  # takes the pause
    assert longest_monologue(own, [(6_100, 6_300)], max_pause_ms=5_000) == 6_000  # a word in the pause


def test_compute_metrics_reports_each_legs_longest_and_the_calls(seg: SegmentFactory) -> None:
    segments = [seg("agent", 0, 8, "a long greeting"), seg("customer", 9, 12, "a reply"),
                seg("customer", 12.5, 30, "and a long story"), seg("customer", 31, 40, "that goes on"),
                seg("agent", 40.5, 42, "okay")]
    m = compute_metrics(segments, call_end_ms=45_000)
    assert (m.agent_longest_monologue_ms, m.customer_longest_monologue_ms, m.longest_monologue_ms) == (
        8_000, 31_000, 31_000)
    assert m.as_dict()["longest_monologue_ms"] == 31_000.0
