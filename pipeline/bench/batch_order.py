"""The batcher's ordering under a backlog: latency of short and long segments, ``batch_order`` oldest vs shortest.

``python -m pipeline.bench.batch_order --load 0.9 --max-batch 4 --segments 160 --out bench/results/scheduling``

``batch_order`` only decides anything when more than ``max_batch`` segments wait (below that a batch takes
all of them either way), which `callqa bench live` reaches only past the load a worker holds. So this
drives one SegmentBatcher directly: real segments (the library-legs set at 8 kHz mu-law, cut by the
worker's front end), arriving as a seeded Poisson process carrying ``--load`` times the audio seconds
per second that the engine decoded in a first, unhurried pass (so > 1 builds a backlog), the same
arrivals for each order. Per order: latency (submit -> transcript) P50/P90/P99 overall and per length
class (short < 3 s, medium 3-8 s, long >= 8 s), the mean batch, the wall time. Result ``batch-order``.

On a shared machine the engine's speed drifts between runs more than the orders differ, so
``--simulated`` replaces the engine by a cost model that sleeps in the inference thread (no CPU, so
other jobs do not move it): a batch encodes for ``ENCODE_S_PER_WINDOW_S`` per second of its rows' 5 s
windows, then each row is final ``DECODE_S_PER_AUDIO_S`` per second of its audio later (a row leaves the
batch when it ends, as the decoder's rows do), the batch ending with its longest row. The same
arrivals, the policy alone.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.bench.offered import arrivals, offer, percentiles_s
from pipeline.bench.results import RESULTS, record, settings_that_matter, write_result
from pipeline.config import Settings, get_settings

# The cost model of --simulated: tiny.en fp32 on one thread of this machine, roughly (a 30 s window
# encodes in ~0.68 s on 2 cores; greedy steps ~10 ms at ~3 tokens per audio second).
ENCODE_S_PER_WINDOW_S = 0.02
DECODE_S_PER_AUDIO_S = 0.03

CLASSES = (("short", 0.0, 3.0), ("medium", 3.0, 8.0), ("long", 8.0, 1e9))


def library_segments(settings: Settings, count: int, seed: int) -> list[Any]:
    from pipeline.asr.engine import LegFrontEnd
    from pipeline.asr.results import AudioSegment
    from pipeline.eval.accuracy import load_sets
    from pipeline.eval.conditions import conditioned
    from pipeline.eval.dataset import SAMPLE_RATE

    segments = []
    for u in conditioned(load_sets(["library-legs"])["library-legs"], "8k-mulaw"):
        front_end = LegFrontEnd(SAMPLE_RATE, "pcm16", settings)
        for s in [*front_end.accept_samples(u.audio), *front_end.finish()]:
            segments.append(AudioSegment(s.start_ms, s.end_ms, s.audio))
    rng = np.random.default_rng(seed)
    picked = rng.choice(len(segments), size=min(count, len(segments)), replace=False)
    return [segments[i] for i in picked]


class SimulatedRecognizer:
    """The engine's timing without its CPU (see the module's --simulated)."""

    name, version = "simulated", 1

    def __init__(self, window_bucket_s: float) -> None:
        from pipeline.asr.decoding import WindowPolicy

        self.window = WindowPolicy(window_bucket_s)  # the batcher groups segments by it, as the Recognizer's

    def recognize(self, segments: Any, waits: Any = None, wide: bool = False, on_result: Any = None,
                  contexts: Any = None) -> list[Any]:
        import math

        from pipeline.asr.results import SegmentTimings, TranscriptResult

        lengths = [(s.end_ms - s.start_ms) / 1000 for s in segments]
        time.sleep(ENCODE_S_PER_WINDOW_S * sum(math.ceil(x / 5) * 5 for x in lengths))
        out = [TranscriptResult(s.start_ms, s.end_ms, "", 0.0, 0.0, self.name, 1, (),
                                SegmentTimings(batch_size=len(segments))) for s in segments]
        elapsed = 0.0
        for i in sorted(range(len(segments)), key=lambda i: lengths[i]):
            time.sleep(max(0.0, DECODE_S_PER_AUDIO_S * lengths[i] - elapsed))
            elapsed = DECODE_S_PER_AUDIO_S * lengths[i]
            if on_result is not None:
                on_result(i, out[i])
        return out


async def run_order(recognizer: Any, segments: list[Any], at: np.ndarray, settings: Settings) -> dict[str, Any]:
    from pipeline.asr.batcher import SegmentBatcher

    batcher = SegmentBatcher.from_settings(recognizer, settings)
    await batcher.start()
    cpu = time.process_time()
    done, wall = await offer(batcher, segments, at)
    cpu = time.process_time() - cpu
    await batcher.close()
    by_class = {name: percentiles_s([d.latency_s for d in done if lo <= d.audio_s < hi]) for name, lo, hi in CLASSES}
    return {"batch_order": settings.batch_order, "batch_age_limit_ms": settings.batch_age_limit_ms,
            "latency": percentiles_s([d.latency_s for d in done]), "by_length": by_class,
            "mean_batch_per_segment": round(float(np.mean([d.batch_size for d in done])), 2), "wall_s": round(wall, 1),
            "cpu_s": round(cpu, 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--load", type=float, default=1.5, help="offered audio s/s as a multiple of the engine's")
    parser.add_argument("--segments", type=int, default=160)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--age-limits", default="1000", help="batch_age_limit_ms values for shortest (comma-separated)")
    parser.add_argument("--max-batch", type=int, default=0, help="the batcher's max_batch (0: the setting)")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of every order, interleaved (a shared machine drifts)")
    parser.add_argument("--simulated", action="store_true", help="the cost model instead of the engine (see above)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    from pipeline.asr.engine import Engine

    base = get_settings()
    if args.max_batch > 0:
        base = base.model_copy(update={"max_batch": args.max_batch})
    recognizer: Any = SimulatedRecognizer(base.window_bucket_s) if args.simulated else Engine.load(settings=base).recognizer
    segments = library_segments(base, args.segments, args.seed)
    audio_s = sum((s.end_ms - s.start_ms) / 1000 for s in segments)
    started = time.perf_counter()  # the engine's speed on these segments, batches of max_batch, no waiting
    for i in range(0, len(segments), base.max_batch):
        recognizer.recognize(segments[i:i + base.max_batch])
    engine_speed = audio_s / (time.perf_counter() - started)
    rate = args.load * engine_speed / (audio_s / len(segments))  # segments per second
    at = arrivals(segments, args.load * engine_speed, args.seed)
    runs = [base.model_copy(update={"batch_order": "oldest"})]
    runs += [base.model_copy(update={"batch_order": "shortest", "batch_age_limit_ms": float(a)})
             for a in args.age_limits.split(",")]
    results = []
    for settings in [s for _ in range(args.repeats) for s in runs]:
        r = asyncio.run(run_order(recognizer, segments, at, settings))
        results.append(r)
        lat, c = r["latency"], r["by_length"]
        print(f"{r['batch_order']:8} age {r['batch_age_limit_ms']:6.0f}  all P50/P99 {lat['p50_s']:6.2f}/{lat['p99_s']:6.2f} s  "
              + "  ".join(f"{k} P50/P99 {v.get('p50_s', 0):6.2f}/{v.get('p99_s', 0):6.2f} (n {v['n']})" for k, v in c.items())
              + f"  batch {r['mean_batch_per_segment']}  wall {r['wall_s']} s  cpu {r['cpu_s']} s")
    doc = record("batch-order", settings_that_matter(base), {
        "segments": len(segments), "audio_s": round(audio_s, 1), "engine_speech_s_per_s": round(engine_speed, 2),
        "engine": "simulated" if args.simulated else "tiny.en",
        "cost_model": {"encode_s_per_window_s": ENCODE_S_PER_WINDOW_S, "decode_s_per_audio_s": DECODE_S_PER_AUDIO_S}
        if args.simulated else None,
        "load": args.load, "max_batch": base.max_batch, "repeats": args.repeats, "arrival_rate_per_s": round(rate, 3), "seed": args.seed, "runs": results,
    })
    for path in write_result("batch-order", doc, args.out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
