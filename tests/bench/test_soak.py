"""`callqa bench soak`'s load choice and summary (no Kafka; the soak itself is a benchmark, run by hand)."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.bench.latency import FinalSeen, MatchedFinal
from pipeline.bench.soak import SoakConfig, default_calls, slowest_after
from pipeline.bench.tables import grids
from pipeline.bench.workers import share_cores


def test_the_default_load_is_70_percent_of_the_latest_capacity_found_with_the_same_model(tmp_path: Path) -> None:
    assert default_calls("moonshine-base", tmp_path)[0] == 6  # none found yet
    runs = [{"started": "a", "search": {"calls": 10}, "settings": {"model": "moonshine-base"}},
            {"started": "b", "search": {"calls": 20}, "settings": {"model": "tiny.en"}},
            {"started": "c", "search": {"calls": 0}, "settings": {"model": "moonshine-base"}},
            {"started": "d", "search": None, "settings": {"model": "moonshine-base"}}]
    (tmp_path / "live.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    calls, why = default_calls("moonshine-base", tmp_path)
    assert calls == 7 and "10 calls" in why and "on a" in why  # the latest run with this model that found one
    assert default_calls("tiny.en", tmp_path)[0] == 14
    assert default_calls("base", tmp_path)[0] == 6


def test_a_short_soak_compares_thirds_and_workers_share_the_cores() -> None:
    config = SoakConfig(minutes=9, calls=2, cores=(0, 1), workers=2)
    assert config.compare_s == 180 and config.traffic_s == 600
    assert share_cores(config.cores, config.workers) == [(0,), (1,)] and share_cores((), 3) == [(), (), ()]


def test_each_compared_window_of_an_hour_holds_as_many_restarts_and_workers_are_static_members() -> None:
    config = SoakConfig(minutes=60, calls=14, cores=(0, 1))
    due = config.restart_times()
    first, last = (config.warmup_s, config.warmup_s + config.compare_s), (config.traffic_s - config.compare_s,
                                                                          config.traffic_s)
    assert len(due) == 12 and due[0] == 210.0  # half a period after the warm-up
    assert [sum(1 for t in due if a <= t < b) for a, b in (first, last)] == [2, 2]
    assert SoakConfig(60, 2, (), workers=1).restart_times() == []
    static = config.worker_overrides("bench.x", "w1")
    assert static["worker_instance_id"] == "bench.x-w1" and float(static["kafka_session_timeout_s"]) > 6
    assert SoakConfig(60, 2, (), static_membership=False).worker_overrides("bench.x", "w1") == {}


def test_the_summary_says_what_was_not_met() -> None:
    doc = {"settings": {"calls": 14, "minutes": 60}, "restarts": [{}] * 11, "long_lived_worker": "w0",
           "rss_mb": {"first": 800.0, "last": 880.0, "growth_pct": 10.0}, "p99_s": {"first": 1.2, "last": 1.3,
                                                                                   "drift_pct": 8.3,
                                                                                   "between_restarts": {
                                                                                       "first": 0.9, "last": 1.0}},
           "goals": {"rss_growth_max_pct": 5.0, "p99_drift_max_pct": 20.0}, "turns": {"ended": 900, "without_final": 0},
           "met": False, "why_not": ["RSS of w0 grew 10.0 %"]}
    shown = dict(grids(doc, "soak")[0].rows)  # the summary: a figure per row
    assert (shown["calls"], shown["minutes"], shown["restarts"]) == ("14", "60", "11")
    assert shown["RSS MB of the long-lived worker, first → last"] == "800.0 → 880.0"
    assert shown["met"] == "no (RSS of w0 grew 10.0 %)"


def test_each_restart_names_its_slowest_finals_and_where_their_time_went() -> None:
    def final(segment: str, closed_s: float, wait_s: float, inference_s: float, written_s: float) -> FinalSeen:
        return FinalSeen("c1", "agent", segment, 0, 1000, "x", written_s=written_s, received_s=written_s,
                         batch_size=3, closed_s=closed_s, wait_s=wait_s, inference_s=inference_s)

    restart = 1000.0
    matched = [MatchedFinal(final("late", 1012.0, 2.0, 1.5, 1016.0), None, 1005.0),  # 11 s: 7 closing
               MatchedFinal(final("quick", 1031.0, 0.2, 0.3, 1031.6), None, 1030.5),  # 1.1 s
               MatchedFinal(final("before", 999.0, 0.1, 0.1, 999.5), None, 998.0),  # speech ended before it
               MatchedFinal(final("later", 1070.0, 0.1, 0.1, 1090.0), None, 1065.0)]  # after its minute

    shown = slowest_after(matched, restart)

    assert [(f["latency_s"], f["close_s"], f["wait_s"], f["inference_s"], f["after_s"], f["speech_end_after_s"])
            for f in shown] == [(11.0, 7.0, 2.0, 1.5, 0.5, 5.0), (1.1, 0.5, 0.2, 0.3, 0.1, 30.5)]
