"""Conversation metrics on two-leg calls whose pauses and overlaps are known by construction."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from pipeline.qa.metrics import compute_metrics
from pipeline.qa.segment import Segment


def _call(seg):  # type: ignore[no-untyped-def]
    """A call laid out by hand (seconds); the call ends at 33 s.

    agent    0-4      8 words
    customer 4.5-9    7 words
    agent    8-12     6 words, starts 1 s before the customer stops: an interruption
    customer 18-20    4 words, after a 6 s silence
    agent    19-19.2  "mhm", 0.2 s inside the customer's speech: a backchannel, not an interruption
    agent    26-30    5 words, after another 6 s silence
    customer 30.5-31  2 words
    """
    return [
        seg("agent", 0, 4, "thank you for calling how can i help"),
        seg("customer", 4.5, 9, "i have a problem with my bill"),
        seg("agent", 8, 12, "let me look at that now"),
        seg("customer", 18, 20, "okay thank you so"),
        seg("agent", 19, 19.2, "mhm"),
        seg("agent", 26, 30, "it is fixed for you"),
        seg("customer", 30.5, 31, "great thanks"),
    ]


def test_metrics_of_constructed_call(seg) -> None:  # type: ignore[no-untyped-def]
    m = compute_metrics(
        _call(seg), call_end_ms=33_000, silence_threshold_ms=5000, interruption_min_overlap_ms=500
    )
    agent_talk = 4000 + 4000 + 200 + 4000
    customer_talk = 4500 + 2000 + 500
    speech_union = 4000 + (12_000 - 4500) + 2000 + 4000 + 500  # 0-4, 4.5-12, 18-20, 26-30, 30.5-31
    assert m.duration_ms == 33_000
    assert (m.agent_talk_ms, m.customer_talk_ms, m.talk_ms) == (agent_talk, customer_talk, speech_union)
    assert m.non_talk_ms == 33_000 - speech_union
    assert m.non_talk_pct == pytest.approx(100 * (33_000 - speech_union) / 33_000)
    assert m.agent_talk_pct == pytest.approx(100 * agent_talk / 33_000)
    assert m.agent_talk_share_pct == pytest.approx(100 * agent_talk / (agent_talk + customer_talk))
    # Gaps between speech: 0.5, 6, 6, 0.5 s; the 2 s tail after 31 s is not a silence.
    assert (m.longest_silence_ms, m.silence_count, m.silence_avg_ms) == (6000, 2, 6000)
    assert (m.overtalk_count, m.overtalk_ms) == (2, 1000 + 200)
    assert (m.agent_interruptions, m.customer_interruptions) == (1, 0)
    assert (m.agent_words, m.customer_words) == (20, 13)
    assert m.agent_wpm == pytest.approx(20 * 60_000 / agent_talk)
    assert m.customer_wpm == pytest.approx(13 * 60_000 / customer_talk)
    # The customer's first words end at 9 s; the agent's 8 s interruption started before that, so the
    # first agent speech after it is the 19 s "mhm".
    assert m.first_agent_response_ms == 10_000
    assert m.agent_first_speech_ms == 0
    assert m.turn_count == 6  # A C A C (A A) C


def test_thresholds_are_settings(seg) -> None:  # type: ignore[no-untyped-def]
    segments = _call(seg)
    strict = compute_metrics(segments, silence_threshold_ms=400, interruption_min_overlap_ms=100)
    assert strict.silence_count == 4 and strict.silence_avg_ms == pytest.approx((500 + 6000 + 6000 + 500) / 4)
    assert strict.agent_interruptions == 2  # the backchannel now counts
    assert strict.duration_ms == 31_000  # no call end given: the last word ends the call


def test_customer_interrupting_the_agent(seg) -> None:  # type: ignore[no-untyped-def]
    m = compute_metrics([seg("agent", 0, 10), seg("customer", 3, 12)], interruption_min_overlap_ms=500)
    assert (m.agent_interruptions, m.customer_interruptions) == (0, 1)
    assert (m.overtalk_count, m.overtalk_ms) == (1, 7000)


def test_one_sided_call_has_no_response_time(seg) -> None:  # type: ignore[no-untyped-def]
    m = compute_metrics([seg("agent", 1, 3, "hello is anyone there")])
    assert m.first_agent_response_ms is None and m.customer_talk_ms == 0 and m.agent_talk_share_pct == 100
    assert "first_agent_response_ms" not in m.as_dict()
    assert all(isinstance(v, float) for v in m.as_dict().values())


def test_empty_call_is_all_zero() -> None:
    m = compute_metrics([], call_end_ms=5000)
    assert (m.duration_ms, m.talk_ms, m.non_talk_pct, m.turn_count) == (5000, 0, 100.0, 0)


def _timeline_reference(segments: list[Segment], end_ms: int, step: int) -> dict[str, int]:
    """The same quantities from a sampled timeline: independent of the interval arithmetic."""
    n = end_ms // step
    legs = {leg: np.zeros(n, bool) for leg in ("agent", "customer")}
    for s in segments:
        legs[s.leg][s.start_ms // step : s.end_ms // step] = True
    both, either = legs["agent"] & legs["customer"], legs["agent"] | legs["customer"]
    overtalk_runs = int(np.count_nonzero(np.diff(both.astype(int), prepend=0) == 1))
    spoken = np.flatnonzero(either)
    gaps = np.diff(spoken) - 1 if spoken.size else np.array([])
    return {
        "agent_talk_ms": int(legs["agent"].sum()) * step,
        "customer_talk_ms": int(legs["customer"].sum()) * step,
        "talk_ms": int(either.sum()) * step,
        "overtalk_ms": int(both.sum()) * step,
        "overtalk_count": overtalk_runs,
        "longest_silence_ms": int(gaps.max(initial=0)) * step,
    }


@pytest.mark.parametrize("seed", range(5))
def test_random_calls_match_timeline_reference(seed: int) -> None:
    rng = random.Random(seed)
    step = 10
    segments = []
    for i in range(30):
        leg = rng.choice(["agent", "customer"])
        start = rng.randrange(0, 120_000 // step) * step
        segments.append(Segment("c", leg, f"s{i}", start, start + rng.randrange(1, 800) * step, "a b c"))
    end = max(s.end_ms for s in segments) + 1000
    m = compute_metrics(segments, call_end_ms=end)
    for name, expected in _timeline_reference(segments, end, step).items():
        assert getattr(m, name) == expected, name
    assert m.non_talk_ms == end - m.talk_ms


MANIFEST = Path(__file__).resolve().parents[2] / "samples" / "calls" / "manifest.json"


def _manifest_calls() -> list[dict]:  # type: ignore[type-arg]
    return json.loads(MANIFEST.read_text())["calls"]


@pytest.mark.parametrize("call", _manifest_calls(), ids=lambda c: c["file"])
def test_sample_calls_from_their_placements(call: dict) -> None:  # type: ignore[type-arg]
    """The sample calls (samples/calls) as perfect transcripts: speech spans as segments, references as text."""
    utterances = call["utterances"]
    segments = [
        Segment(call["file"], u["leg"], str(i), u["speech_start_ms"], u["speech_end_ms"], u["reference"])
        for i, u in enumerate(utterances)
    ]
    m = compute_metrics(segments, call_end_ms=call["duration_ms"], interruption_min_overlap_ms=300)
    agent = [u for u in utterances if u["leg"] == "agent"]
    customer = [u for u in utterances if u["leg"] == "customer"]

    def overlap(a: dict, b: dict) -> int:  # type: ignore[type-arg]
        return max(
            0, min(a["speech_end_ms"], b["speech_end_ms"]) - max(a["speech_start_ms"], b["speech_start_ms"])
        )

    # Utterances of one leg never overlap in these calls, so pairwise sums are exact.
    pairs = [overlap(a, c) for a in agent for c in customer]
    assert m.overtalk_ms == sum(pairs) and m.overtalk_count == sum(1 for p in pairs if p > 0)
    assert m.agent_talk_ms == sum(u["speech_end_ms"] - u["speech_start_ms"] for u in agent)
    assert m.customer_talk_ms == sum(u["speech_end_ms"] - u["speech_start_ms"] for u in customer)
    assert m.talk_ms == m.agent_talk_ms + m.customer_talk_ms - m.overtalk_ms

    def interrupts(u: dict, others: list[dict]) -> bool:  # type: ignore[type-arg]
        return any(
            o["speech_start_ms"] < u["speech_start_ms"] < o["speech_end_ms"] and overlap(u, o) >= 300
            for o in others
        )

    assert m.customer_interruptions == sum(interrupts(c, agent) for c in customer)
    assert m.agent_interruptions == sum(interrupts(a, customer) for a in agent)
    assert m.customer_words == sum(len(u["reference"].split()) for u in customer)
    ordered = sorted(utterances, key=lambda u: u["speech_start_ms"])
    assert m.turn_count == 1 + sum(
        1 for a, b in zip(ordered, ordered[1:], strict=False) if a["leg"] != b["leg"]
    )
    speech = sorted((u["speech_start_ms"], u["speech_end_ms"]) for u in utterances)
    reach, gaps = speech[0][1], []
    for start, end in speech[1:]:
        if start > reach:
            gaps.append(start - reach)
        reach = max(reach, end)
    assert m.longest_silence_ms == max(gaps)


def test_sample_calls_exercise_overlap_and_interruption() -> None:
    """The manifest's README promises overlaps in call_01 and call_03; the metrics must see them."""
    by_file = {}
    for call in _manifest_calls():
        segments = [
            Segment(call["file"], u["leg"], str(i), u["speech_start_ms"], u["speech_end_ms"], u["reference"])
            for i, u in enumerate(call["utterances"])
        ]
        by_file[call["file"]] = compute_metrics(segments, interruption_min_overlap_ms=300)
    assert by_file["call_01.wav"].overtalk_count >= 1 and by_file["call_03.wav"].customer_interruptions == 1
    assert by_file["call_02.wav"].overtalk_ms == 0 and by_file["call_02.wav"].longest_silence_ms >= 2000
