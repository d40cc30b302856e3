"""The engine-level benchmarks' one traffic: segments offered to a SegmentBatcher, and what each one waited.

``arrivals`` places the segments as a seeded Poisson process carrying ``audio_s_per_s`` seconds of audio
per second (as many concurrent legs would send them), or all at once (a backlog); ``offer`` submits each at
its time and keeps its length, its latency from submit to transcript (queueing included) and the batch it
was decoded in. `callqa bench asr` (the batcher's latency), batch_order.py and inference_process.py use it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.asr.batcher import SegmentBatcher
from pipeline.asr.results import AudioSegment


@dataclass(frozen=True)
class Decoded:
    audio_s: float
    latency_s: float  # submit -> transcript
    batch_size: int


def arrivals(segments: Sequence[AudioSegment], audio_s_per_s: float | None, seed: int = 0) -> np.ndarray:
    """Each segment's arrival (s from the start): exponential gaps of mean audio length / ``audio_s_per_s``;
    every one at 0 when it is None or 0."""
    if not audio_s_per_s:
        return np.zeros(len(segments))
    mean_s = float(np.mean([(s.end_ms - s.start_ms) / 1000 for s in segments]))
    return np.cumsum(np.random.default_rng(seed).exponential(mean_s / audio_s_per_s, len(segments)))


async def offer(batcher: SegmentBatcher, segments: Sequence[AudioSegment],
                at: np.ndarray) -> tuple[list[Decoded], float]:
    """Every segment submitted at its arrival; their outcomes and the wall seconds until the last was decoded."""
    start = time.perf_counter()

    async def one(segment: AudioSegment, due: float) -> Decoded:
        await asyncio.sleep(max(0.0, start + due - time.perf_counter()))
        submitted = time.perf_counter()
        result = await batcher.submit(segment)
        return Decoded((segment.end_ms - segment.start_ms) / 1000, time.perf_counter() - submitted,
                       result.timings.batch_size)

    done = await asyncio.gather(*(one(s, float(t)) for s, t in zip(segments, at, strict=True)))
    return list(done), time.perf_counter() - start


def percentiles_s(values: Sequence[float]) -> dict[str, float]:
    """Count, P50/P90/P99 and the largest, in seconds (rounded to ms)."""
    if not values:
        return {"n": 0}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"n": len(values), "p50_s": round(float(p50), 3), "p90_s": round(float(p90), 3),
            "p99_s": round(float(p99), 3), "max_s": round(float(max(values)), 3)}
