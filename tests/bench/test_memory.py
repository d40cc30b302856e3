"""`callqa bench memory`'s plan and arithmetic without a broker: calls added in steps that stay open, and
MB per leg from the RSS each step added."""

from __future__ import annotations

import pytest

from pipeline.bench.memory import (
    MemoryOptions,
    Sample,
    at_connect,
    per_leg,
    step_figures,
    step_plans,
    verdict,
)
from pipeline.bench.traffic import TurnLibrary


@pytest.fixture(scope="module")
def library() -> TurnLibrary:
    try:
        return TurnLibrary.load()
    except (FileNotFoundError, OSError) as exc:
        pytest.skip(f"no call library built: {exc}")


def test_calls_arrive_in_steps_and_none_ends_before_the_traffic_does(library: TurnLibrary) -> None:
    options = MemoryOptions(step_calls=3, steps=2, idle_s=20.0, step_s=60.0)
    plans = step_plans(library, options, "mem")
    assert [p.arrival_s for p in plans] == [20.0] * 3 + [80.0] * 3
    assert all(p.end_s > options.horizon_s for p in plans)
    assert len({p.call_id for p in plans}) == 6 and all(p.turns for p in plans)
    assert step_plans(library, options, "mem") == plans  # seeded


def _samples(rss_by_step: list[float], legs_by_step: list[float], options: MemoryOptions,
             queue: float = 0.0) -> list[Sample]:
    out = []
    for start, end, rss, legs in zip(options.step_starts(), options.step_ends(), rss_by_step, legs_by_step,
                                     strict=True):
        t = start
        while t < end:
            out.append(Sample(t, int(rss * 2**20), legs, 0.0, queue))
            t += 2.0
    return out


def test_mb_per_leg_is_what_each_step_added_over_the_legs_it_added() -> None:
    options = MemoryOptions(step_calls=5, steps=2, idle_s=20.0, step_s=60.0, window_s=20.0)
    samples = _samples([700.0, 760.0, 775.0], [0, 10, 20], options)
    samples.append(Sample(options.idle_s + 5.0, 999 * 2**20, 3, 0.0, 0.0))  # settling: outside the window
    samples.append(Sample(options.step_ends()[2] - 3.0, 900 * 2**20, 20, 0.0, 0.0))  # a batch's buffers
    steps = step_figures(samples, options.step_ends(), options.window_s)
    assert [(s["legs"], s["rss_mb_floor"], s["rss_mb"]) for s in steps] == [(0, 700.0, 700.0), (10, 760.0, 760.0),
                                                                            (20, 775.0, 775.0)]
    assert steps[2]["rss_mb_max"] == 900.0 and not any(s["backlog"] for s in steps)
    assert all(s["backlog"] for s in step_figures(_samples([1.0] * 3, [0, 10, 20], options, queue=3.0),
                                                  options.step_ends(), options.window_s))
    per_step = per_leg(steps)
    assert [p["mb_per_leg"] for p in per_step] == [6.0, 1.5]
    # The goal is judged on legs added to a worker already holding legs: the first step pays for first use.
    assert verdict(per_step) == {"mb_per_leg": 1.5, "mb_per_leg_median": 1.5, "goal_mb_per_leg": 2.0, "met": True,
                                 "from_legs": 10, "to_legs": 20}
    assert verdict(per_step[:1])["met"] is None
    # A step over the worker's capacity (segments queued) holds queued audio: left out of the verdict.
    backlog = [*per_step, {**per_step[1], "from_legs": 20, "to_legs": 30, "mb_per_leg": 9.0, "backlog": True}]
    assert verdict(backlog)["mb_per_leg"] == 1.5


def test_what_a_leg_costs_when_it_connects_is_measured_before_its_speech() -> None:
    options = MemoryOptions(step_calls=5, steps=2, idle_s=20.0, step_s=60.0)
    samples = [Sample(t, (700 if t < 20 else 701) * 2**20, 0 if t < 20 else 10, 0.0, 0.0) for t in range(0, 30, 2)]
    (first, ) = at_connect(samples, options.step_starts())  # the second step has no samples here: left out
    assert first == {"at_s": 20.0, "legs_added": 10, "rss_mb_added": 1.0, "mb_per_leg": 0.1}


def test_a_step_without_samples_in_its_window_is_an_error() -> None:
    with pytest.raises(ValueError, match="no sample in step 1"):
        step_figures([Sample(1.0, 1, 0, 0, 0)], [20.0, 80.0], 20.0)
