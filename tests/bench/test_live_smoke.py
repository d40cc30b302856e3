"""`callqa bench live` at a small load against the real broker and a real worker process: it runs, and its
JSON, plot and tables hold what the benchmark reports (no timing asserts: the figures depend on the machine).
And the engine-alone comparison on segments cut from the generated traffic (no Kafka)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.bench.latency import FinalSeen
from pipeline.bench.live import LevelConfig, LevelRun, batching_gain, engine_alone
from pipeline.bench.traffic import TrafficSpec, TurnLibrary, plan_traffic

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.broker
@pytest.mark.slow
def test_small_live_run_of_two_workers_and_a_desk_writes_json_plot_and_tables(broker: str, tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "bench", "live", "--calls", "2", "--workers", "2", "--warmup-s", "10",
         "--hold-s", "20", "--desk",
         "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=420, check=False,
        env={**os.environ, "COLUMNS": "120", "CALLQA_PARTIAL_INTERVAL_MS": "1000"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads((out / "live.json").read_text())
    assert [json.loads(line) for line in (out / "live.jsonl").read_text().splitlines()] == [doc]  # the history
    assert doc["git"]["commit"] and doc["machine"]["cores"] >= 1 and doc["settings"]["max_batch"] >= 1
    assert doc["search"] is None and doc["batching"] is None and doc["engine_alone"] is None
    (level,) = doc["levels"]
    assert level["calls"] == 2 and level["legs"] == 4 and level["calls_open"]["mean"] > 0
    # Two workers in one consumer group, each on its share of the cores, measured as one.
    assert level["workers"] == 2 and len(level["worker_cores"]) == 2
    assert level["calls_started"] >= 2 and level["sender"]["frames_sent"] > 0

    # Finals whose speech ended in the steady window, matched to the traffic's turns, with their percentiles.
    latency = level["latency"]
    assert latency["finals"] > 0 and level["finals"]["matched"] > 0
    assert 0 <= level["finals"]["turns_without_final"] < level["finals"]["turns_in_window"]
    assert all(isinstance(latency[k], float) for k in ("p50_s", "p95_s", "p99_s"))
    assert latency["p50_s"] <= latency["p95_s"] <= latency["p99_s"]
    assert level["throughput"]["speech_s_per_s"] > 0

    # Lag, queue and memory sampled over the run, several times inside the steady window.
    window = [s for s in level["timeline"] if 10 <= s["t_s"] <= 30]
    assert len(window) >= 5 and all(s["lag_frames"] is not None for s in window)
    assert all(s["rss_mb"] > 0 for s in window)
    assert level["lag"]["slope_s_per_s"] is not None and isinstance(level["lag"]["growing"], bool)

    # The worker's CPU by part: finals were written in the window, so its inference thread worked then.
    worker = level["worker"]
    assert worker["cores_used"] > 0 and worker["cpu_s"]["event_loop"] > 0
    if level["finals"]["written_in_window"]:
        assert worker["cpu_s"]["inference"] > 0, worker
        batches = level["batches"]
        assert batches["batches"] > 0 and batches["mean_size"] >= 1
        assert sum(batches["segments_by_size"].values()) == level["finals"]["written_in_window"]
        assert batches["callqa_batch_size_histogram"]["observations"] > 0
    assert worker["rss_mb"]["max"] > 0
    assert isinstance(level["met"], bool) and (level["met"] or level["why_not"])

    # A desk on the level's topics: the words spoken in the window, those its stream showed (partial or final)
    # and when; a word the recogniser heard otherwise is not timed, so shown <= spoken.
    screen = level["words_on_screen"]
    assert screen["turn_events"] > 0 and screen["desk_core_share"] > 0
    assert 0 < screen["words_shown"] <= screen["words_spoken"]
    assert 0 <= screen["first_by_partial"] <= screen["words_shown"]
    first = screen["first_shown"]
    assert first["p50_s"] <= first["p95_s"] <= first["p99_s"] <= first["max_s"]
    assert {"published", "dropped", "superseded"} <= set(level["partials"]["outcomes"])  # partials on: counted

    png = out / "live.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert "read_committed P99 s" in done.stdout  # the run's tables: the live spec bench/README.md shows too


@pytest.mark.slow
def test_engine_alone_decodes_the_levels_segments(tmp_path: Path) -> None:
    """The engine-alone ceiling on segments cut from generated legs (here: the traffic's first turns)."""
    library = TurnLibrary.load()
    plans = plan_traffic(library, TrafficSpec(calls=2, seed=3), 1.0, "e")
    finals = [FinalSeen(p.call_id, t.leg, f"s{i}", max(0, t.start_ms - 300), t.end_ms + 150, "", 100.0 + i, 100.0 + i, 1)
              for p in plans for i, t in enumerate(p.turns[:3])]
    config = LevelConfig(calls=2, cores=tuple(sorted(os.sched_getaffinity(0))), hold_s=10.0)
    result = {"max_batch": 4, "throughput": {"speech_s_per_s": 1.0}}
    affinity = os.sched_getaffinity(0)
    engine = engine_alone(LevelRun(config, result, plans, finals), library)
    assert os.sched_getaffinity(0) == affinity  # pinned for the measurement only
    speech = sum(f.audio_s for f in finals)
    assert engine["segments"] == len(finals) and engine["speech_s"] == pytest.approx(speech, abs=0.1)
    assert engine["max_batch"] == 4 and engine["wall_s"] > 0
    # Both figures are rounded (efficiency to 3 places), so compare to within that rounding, not relatively:
    # the faster the engine, the smaller the efficiency and the larger a relative rounding error.
    assert engine["pipeline_efficiency"] == pytest.approx(1.0 / engine["speech_s_per_s"], abs=1e-3)


def test_batching_gain_compares_the_same_load() -> None:
    def level(max_batch: int, speech_per_s: float, per_cpu: float, met: bool) -> LevelRun:
        result = {"max_batch": max_batch, "throughput": {"speech_s_per_s": speech_per_s}, "latency": {}, "lag": {},
                  "worker": {"speech_s_per_inference_cpu_s": per_cpu}, "met": met, "why_not": []}
        return LevelRun(LevelConfig(calls=8, cores=(0,), max_batch=max_batch), result, [], [])

    gain = batching_gain(level(16, 6.0, 30.0, True), level(1, 2.0, 10.0, False))
    assert gain["throughput_ratio"] == 3.0 and gain["per_inference_cpu_ratio"] == 3.0
    assert gain["calls"] == 8 and gain["batch1_keeps_up"] is False


@pytest.mark.parametrize(("capacity", "start", "max_calls", "found"), [
    (37, 4, 256, range(34, 38)),  # doubles 4..32, fails at 64, bisects to within 10 % below 37
    (3, 4, 256, range(3, 4)),  # the start already fails: bisects down
    (0, 4, 256, None),  # not even 1 call
    (500, 4, 100, range(100, 101)),  # every level met: stops at the cap
])
def test_search_finds_the_most_calls_met(capacity: int, start: int, max_calls: int, found: range | None) -> None:
    from pipeline.bench.live import search

    def run(calls: int) -> LevelRun:
        return LevelRun(LevelConfig(calls=calls, cores=(0,)), {"met": calls <= capacity}, [], [])

    best, tried = search(run, start, max_calls, resolution=0.1)
    assert (best.config.calls if best else None) in (found or [None])
    assert [r.config.calls for r in tried] == sorted({r.config.calls for r in tried})  # each level once
    assert all(r.met == (r.config.calls <= capacity) for r in tried)
    if best is not None and best.config.calls < max_calls:  # a failed level bounds it from above
        assert min(r.config.calls for r in tried if not r.met) <= best.config.calls * 1.1 + 1
