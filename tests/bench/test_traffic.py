"""The live benchmark's traffic (pure, no Kafka): Poisson arrivals hold the requested concurrency, calls are
2-6 minutes with each leg talking 35-45 %, turns carry their ground truth, frames are what a gateway sends;
and finals are matched to that ground truth as the latency reference."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from pipeline.audio import codecs
from pipeline.bench.latency import FinalSeen, match_finals, stages, window_latency
from pipeline.bench.sender import CallStream, LiveSender
from pipeline.bench.traffic import (
    FRAME_BYTES,
    FRAME_MS,
    SAME_LEG_GAP_MS,
    SAMPLES_PER_MS,
    CallPlan,
    NoiseBed,
    TrafficSpec,
    Turn,
    TurnLibrary,
    mean_open,
    plan_steady_traffic,
    plan_traffic,
    render_leg,
)
from pipeline.contracts.messages import LEGS

HORIZON_S = 30_000.0  # ~1000 calls of 4 minutes on average: the time-average concurrency settles


@pytest.fixture(scope="module")
def library() -> TurnLibrary:
    return TurnLibrary.load()


@pytest.fixture(scope="module")
def long_run(library: TurnLibrary) -> tuple[TrafficSpec, list[CallPlan]]:
    spec = TrafficSpec(calls=8, seed=7)
    return spec, plan_traffic(library, spec, HORIZON_S, "t")


def arrivals(plans: list[CallPlan]) -> list[CallPlan]:
    return [p for p in plans if p.joined_at_ms == 0 and p.arrival_s > 0]


def test_arrival_rate_is_n_over_mean_call_length(long_run: tuple[TrafficSpec, list[CallPlan]]) -> None:
    spec, plans = long_run
    assert spec.arrival_rate_per_s == pytest.approx(8 / 240)
    n = len(arrivals(plans))
    expected = spec.arrival_rate_per_s * HORIZON_S
    assert abs(n - expected) < 4 * np.sqrt(expected), (n, expected)  # Poisson count: within 4 sigma
    gaps = np.diff([p.arrival_s for p in arrivals(plans)])
    # Exponential inter-arrival times: mean 1/λ and coefficient of variation 1 (not evenly spaced).
    assert gaps.mean() == pytest.approx(1 / spec.arrival_rate_per_s, rel=0.1)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.15)


def test_poisson_arrivals_hold_the_requested_mean_concurrency(long_run: tuple[TrafficSpec, list[CallPlan]]) -> None:
    spec, plans = long_run
    mean, least, most = mean_open(plans, 0.0, HORIZON_S, step_s=10.0)
    assert mean == pytest.approx(spec.calls, rel=0.12), mean
    assert least < spec.calls < most  # a Poisson process: concurrency varies around N


def test_steady_from_the_start(library: TurnLibrary) -> None:
    """N calls in progress at the start, ending as calls in progress do (length-biased, from a uniform
    point of them), so arrivals keep N open from the first minute on: no ramp from zero."""
    first_minute = [mean_open(plan_traffic(library, TrafficSpec(calls=8, seed=seed), 120.0, "s"), 0.0, 60.0)[0]
                    for seed in range(30)]
    assert np.mean(first_minute) == pytest.approx(8, abs=0.8), first_minute


def test_steady_traffic_holds_exactly_n_calls_open_all_the_time(library: TurnLibrary) -> None:
    """The soak's traffic: N lines, a new call on a line as soon as its last one ends, so the load does not
    drift with Poisson luck over an hour (a Poisson run of 14 went from about 10 to over 20 open calls)."""
    spec = TrafficSpec(calls=8, seed=3)
    plans = plan_steady_traffic(library, spec, 3600.0, "steady")
    assert mean_open(plans, 0.0, 3600.0, step_s=5.0)[1:] == (8, 8)  # least and most open: 8 throughout
    assert len({p.call_id for p in plans}) == len(plans) and plans == sorted(plans, key=lambda p: p.arrival_s)
    assert all(120_000 <= p.full_duration_ms <= 360_000 + 10_000 for p in plans)


def test_mean_call_length_matches_the_rate(long_run: tuple[TrafficSpec, list[CallPlan]]) -> None:
    spec, plans = long_run
    lengths = [p.duration_ms / 1000 for p in arrivals(plans)]
    assert np.mean(lengths) == pytest.approx(spec.mean_call_s, rel=0.05)


def test_every_call_is_two_to_six_minutes(long_run: tuple[TrafficSpec, list[CallPlan]]) -> None:
    _, plans = long_run
    for p in plans:
        assert 120_000 <= p.full_duration_ms <= 360_000, p.call_id
        assert p.duration_ms % FRAME_MS == 0
        # A call joined in progress is the rest of such a call; an arriving call is whole.
        assert p.joined_at_ms + p.duration_ms == p.full_duration_ms
        assert (p.joined_at_ms == 0) == (p.duration_ms == p.full_duration_ms)


def test_calls_in_progress_at_the_start(long_run: tuple[TrafficSpec, list[CallPlan]]) -> None:
    spec, plans = long_run
    joined = [p for p in plans if p.arrival_s == 0]
    assert len(joined) == spec.calls
    assert any(p.joined_at_ms > 0 for p in joined)
    for p in joined:
        assert all(0 <= t.start_ms < t.end_ms <= p.duration_ms for t in p.turns)


def test_each_leg_talks_35_to_45_percent(long_run: tuple[TrafficSpec, list[CallPlan]]) -> None:
    _, plans = long_run
    ratios = [p.talk_ratio(leg) for p in arrivals(plans) for leg in LEGS]
    assert min(ratios) >= 0.35 and max(ratios) <= 0.45, (min(ratios), max(ratios))
    assert max(ratios) - min(ratios) > 0.03  # drawn per call and leg, not one fixed ratio


def test_turns_carry_their_ground_truth(long_run: tuple[TrafficSpec, list[CallPlan]]) -> None:
    _, plans = long_run
    overlaps = pauses = 0
    checked = arrivals(plans)[:200]
    # Library calls are 1-4 minutes: most generated calls chain several of them, never a turn twice.
    assert np.mean([len(p.sources) for p in checked]) >= 3
    for p in checked:
        assert len({t.source for t in p.turns}) == len(p.turns)
        for t in p.turns:
            assert t.leg in LEGS and t.text == t.source.text and t.leg == t.source.leg
            assert 0 <= t.start_ms < t.end_ms <= p.duration_ms
            assert t.end_ms - t.start_ms == t.source.duration_ms  # each turn's audio kept whole
        for leg in LEGS:
            own = p.turns_of(leg)
            assert all(b.start_ms - a.end_ms >= SAME_LEG_GAP_MS for a, b in zip(own, own[1:], strict=False))
        ordered = sorted(p.turns, key=lambda t: t.start_ms)
        for a, b in zip(ordered, ordered[1:], strict=False):
            overlaps += b.start_ms < a.end_ms
            pauses += b.start_ms >= a.end_ms + 2000
    assert overlaps > 0 and pauses > 0  # both legs at once sometimes, and silences


def test_same_spec_same_traffic(library: TurnLibrary) -> None:
    spec = TrafficSpec(calls=3, seed=11)
    a = plan_traffic(library, spec, 600.0, "a")
    b = plan_traffic(library, spec, 600.0, "b")
    assert [(p.arrival_s, p.duration_ms, p.turns) for p in a] == [(p.arrival_s, p.duration_ms, p.turns) for p in b]
    c = plan_traffic(library, replace(spec, seed=12), 600.0, "a")
    assert [p.turns for p in a] != [p.turns for p in c]


def test_legs_are_mulaw_with_each_turn_in_place(library: TurnLibrary) -> None:
    plan = plan_traffic(library, TrafficSpec(calls=1, seed=5), 1.0, "r")[0]
    noise = NoiseBed(TrafficSpec(1).max_call_s)
    for leg in LEGS:
        audio = render_leg(plan, leg, library, noise)
        assert len(audio) == plan.frames * FRAME_BYTES
        for t in plan.turns_of(leg):
            assert audio[t.start_ms * SAMPLES_PER_MS:t.end_ms * SAMPLES_PER_MS] == library.turn_audio(t.source)
        silent = bytearray(audio)
        for t in plan.turns_of(leg):  # the turns blanked (μ-law 0xFF is zero): what is left lies between them
            silent[t.start_ms * SAMPLES_PER_MS:t.end_ms * SAMPLES_PER_MS] = b"\xff" * (
                (t.end_ms - t.start_ms) * SAMPLES_PER_MS)
        between = codecs.decode(bytes(silent), "mulaw")
        assert 0 < np.abs(between).max() < 0.01  # line noise between turns, far below speech


def test_frames_are_160_bytes_of_mulaw_like_a_gateway_sends(library: TurnLibrary) -> None:
    plan = plan_traffic(library, TrafficSpec(calls=1, seed=5), 1.0, "f")[0]
    stream = CallStream.render(plan, library, NoiseBed(TrafficSpec(1).max_call_s))
    start = stream.start_event()
    assert (start.event_type, start.encoding, start.sample_rate, sorted(start.legs)) == ("start", "mulaw", 8000,
                                                                                        sorted(LEGS))
    frames = stream.frames_until(50) + stream.frames_until(10**9)
    assert stream.done
    assert len(frames) == 2 * plan.frames
    for leg in LEGS:
        own = [f for f in frames if f.leg == leg]
        assert [f.seq for f in own] == list(range(plan.frames))
        assert all(f.start_ms == f.seq * FRAME_MS for f in own)
        assert all(len(f.payload) == FRAME_BYTES == 160 for f in own)
        assert all((f.encoding, f.sample_rate, f.call_id) == ("mulaw", 8000, plan.call_id) for f in own)
        assert b"".join(f.payload for f in own) == stream.legs[leg]
    end = stream.end_event()
    assert end.event_type == "end" and end.frame_counts == dict.fromkeys(LEGS, plan.frames)


def test_messages_of_100_ms_carry_five_frames_each_and_the_last_one_short(library: TurnLibrary) -> None:
    plan = plan_traffic(library, TrafficSpec(calls=1, seed=5), 1.0, "f")[0]
    stream = CallStream.render(plan, library, NoiseBed(TrafficSpec(1).max_call_s), message_frames=5)
    assert stream.frames_until(4) == []  # the first message's last frame is not due yet
    messages = stream.frames_until(5) + stream.frames_until(plan.frames - 1)
    assert not stream.done  # the call's last message waits for its end
    messages += stream.frames_until(plan.frames)
    assert stream.done
    count = -(-plan.frames // 5)
    for leg in LEGS:
        own = [m for m in messages if m.leg == leg]
        assert [m.seq for m in own] == list(range(count))
        assert all(m.start_ms == m.seq * 5 * FRAME_MS for m in own)
        assert all(len(m.payload) == 5 * FRAME_BYTES for m in own[:-1]) and 0 < len(own[-1].payload) <= 5 * FRAME_BYTES
        assert b"".join(m.payload for m in own) == stream.legs[leg]
    assert stream.end_event().frame_counts == dict.fromkeys(LEGS, count)


class _Recorder:
    """What the sender hands its producer, in order (no broker: this is about what is sent)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, Any]] = []

    def send(self, topic: str, key: str, value: Any) -> None:
        self.sent.append((topic, key, value))

    def flush(self, timeout: float) -> int:
        return 0


@pytest.mark.parametrize("end_open", [False, True])
def test_calls_open_when_the_traffic_stops_are_ended_there_when_asked(library: TurnLibrary, end_open: bool) -> None:
    plan = plan_traffic(library, TrafficSpec(calls=1, seed=5), 1.0, "f")[0]
    plan = replace(plan, arrival_s=0.0)
    recorder = _Recorder()
    sender = LiveSender(recorder, "audio", "events", library,  # type: ignore[arg-type]
                        NoiseBed(TrafficSpec(1).max_call_s), message_ms=100)
    report = sender.run([plan], 0.3, threading.Event(), end_open=end_open)
    events = [v for topic, _, v in recorder.sent if topic == "events"]
    audio = [v for topic, _, v in recorder.sent if topic == "audio"]
    assert plan.frames > 100 and 0 < len(audio) < 2 * plan.frames  # cut short, well before the call's end
    if not end_open:
        assert [e.event_type for e in events] == ["start"] and report.ended == set()
        return
    assert [e.event_type for e in events] == ["start", "end"] and report.ended == {plan.call_id}
    # The end counts the messages each leg really got, so the worker waits for no missing one.
    assert events[1].frame_counts == {leg: sum(1 for m in audio if m.leg == leg) for leg in LEGS}


# ---- the ground truth as the latency reference -------------------------------------------------------------
def _plan(arrival_s: float, turns: list[tuple[str, int, int]], library: TurnLibrary) -> CallPlan:
    source = library.calls[0][0]
    placed = tuple(Turn(leg, s, e, f"turn {i}", source) for i, (leg, s, e) in enumerate(turns))  # type: ignore[arg-type]
    return CallPlan("c1", arrival_s, 60_000, placed, 60_000)


def _final(leg: str, start: int, end: int, written_s: float, segment: str = "") -> FinalSeen:
    return FinalSeen("c1", leg, segment or f"{leg}-{start}", start, end, "text", written_s, written_s, 1)


def test_latency_runs_from_the_end_of_the_turn_a_final_overlaps_most(library: TurnLibrary) -> None:
    wall0 = 1000.0
    plan = _plan(10.0, [("agent", 1000, 5000), ("customer", 4500, 9000), ("agent", 11000, 13000)], library)
    finals = [
        _final("agent", 700, 5150, written_s=wall0 + 10.0 + 5.0 + 0.8),  # turn 0 ended at 5.0 s into the call
        _final("customer", 4200, 9150, written_s=wall0 + 10.0 + 9.0 + 1.2),  # overlaps agent turn 0: its leg's
        _final("agent", 10700, 13150, written_s=wall0 + 10.0 + 13.0 + 0.5),
        _final("customer", 20000, 21000, written_s=wall0 + 32.0),  # no customer speech there: unmatched
    ]
    matched = {m.final.segment_id: m for m in match_finals(finals, {"c1": plan}, wall0)}
    assert matched["agent-700"].latency_s == pytest.approx(0.8)
    assert matched["customer-4200"].turn is plan.turns[1]
    assert matched["customer-4200"].latency_s == pytest.approx(1.2)
    assert matched["agent-10700"].latency_s == pytest.approx(0.5)
    assert matched["customer-20000"].turn is None and matched["customer-20000"].latency_s is None
    # The steady window takes the finals whose speech ended in it.
    summary = window_latency(matched.values(), wall0 + 14.0, wall0 + 20.0)
    assert summary.count == 2 and summary.p50_s == pytest.approx(1.0)


def test_a_turn_split_by_the_segmenter_ends_its_first_part_at_that_part_s_end(library: TurnLibrary) -> None:
    wall0 = 0.0
    plan = _plan(0.0, [("agent", 1000, 9000)], library)
    finals = [_final("agent", 700, 4150, written_s=5.0), _final("agent", 4600, 9150, written_s=9.9),
              _final("agent", 4600, 9150, written_s=11.0)]  # the same segment written twice: the first counts
    matched = sorted(match_finals(finals, {"c1": plan}, wall0), key=lambda m: m.final.start_ms)
    assert len(matched) == 2
    assert matched[0].split and matched[0].latency_s == pytest.approx(5.0 - 4.15)
    assert not matched[1].split and matched[1].latency_s == pytest.approx(9.9 - 9.0)


def test_latency_stages_add_up_to_the_latency(library: TurnLibrary) -> None:
    wall0 = 1000.0
    plan = _plan(10.0, [("agent", 1000, 5000), ("customer", 6000, 9000)], library)
    end_agent, end_customer = wall0 + 15.0, wall0 + 19.0  # wall times the turns' speech ended
    finals = [  # decoded after closing; decoded early (its decode began before it closed)
        replace(_final("agent", 700, 5150, end_agent + 1.0), closed_s=end_agent + 0.6, wait_s=0.03,
                inference_s=0.3, produced_s=end_agent + 0.99),
        replace(_final("customer", 5700, 9150, end_customer + 0.7), closed_s=end_customer + 0.6, wait_s=0.03,
                inference_s=0.3, produced_s=end_customer + 0.69),
        _final("agent", 700, 5150, end_agent + 5.0, segment="no-timings"),  # left out
    ]
    got = stages(match_finals(finals, {"c1": plan}, wall0), wall0, wall0 + 60)
    assert got["finals"] == 2
    slowest = got["slowest"]
    assert isinstance(slowest, list) and [round(s["latency_s"], 2) for s in slowest] == [1.0, 0.7]
    for row in slowest:
        assert row["endpoint"] + row["after_close"] + row["kafka_write"] == pytest.approx(row["latency_s"], abs=0.002)
    assert slowest[1]["after_close"] < slowest[1]["batcher_wait"] + slowest[1]["inference"]  # early
