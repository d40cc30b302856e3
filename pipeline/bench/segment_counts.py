"""How segmentation settings cut the accuracy sets: segments, their lengths, what the encoder pays.

``python -m pipeline.bench.segment_counts --variant endpoint_silence_ms=300 --variant endpoint_silence_ms=400``

The other half of an endpoint-silence (or ``max_segment_ms``) comparison: `callqa bench accuracy --variant`
gives the WER, `callqa bench live --variant` the latency, and this the segment count. Each recording
goes through the worker's front end (``Engine.leg_segments``'s path: resampler, VAD segmenter) under the
telephony condition, at the current settings and at each variant; no model is loaded. Per set and
settings: segments, their length (mean, P50, P90, max), how many were cut at ``max_segment_ms``, and the
encoder's window-seconds at the ``window_bucket_s`` bucket (each segment's length rounded up: what the
encoder computes). The result ``segments`` (bench/results/, or --out).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.bench.results import RESULTS, record, settings_that_matter, write_result
from pipeline.bench.variants import changed_settings, settings_variant
from pipeline.config import Settings, get_settings

SETS = ("library-legs", "eval", "asterisk")


def segment_figures(durations_ms: list[int], reasons: list[str], recordings: int, bucket_s: float) -> dict[str, Any]:
    """The figures of one set's segments under one setting (lengths in ms, cut reasons)."""
    if not durations_ms:
        return {"segments": 0, "recordings": recordings}
    seconds = np.array(durations_ms) / 1000.0
    windows = [math.ceil(s / bucket_s) * bucket_s if bucket_s > 0 else 30.0 for s in seconds]
    return {
        "recordings": recordings,
        "segments": len(durations_ms),
        "segments_per_recording": round(len(durations_ms) / recordings, 2),
        "audio_s": round(float(seconds.sum()), 1),
        "length_s": {"mean": round(float(seconds.mean()), 2), "p50": round(float(np.percentile(seconds, 50)), 2),
                     "p90": round(float(np.percentile(seconds, 90)), 2), "max": round(float(seconds.max()), 2)},
        "over_10_s": int((seconds > 10).sum()),
        "cut_at_max_length": reasons.count("max_length"),
        "encoder_window_s": round(float(sum(windows)), 1),
    }


def measure(settings: Settings, sets: tuple[str, ...], condition: str) -> dict[str, dict[str, Any]]:
    from pipeline.asr.engine import LegFrontEnd
    from pipeline.eval.accuracy import load_sets
    from pipeline.eval.conditions import conditioned
    from pipeline.eval.dataset import SAMPLE_RATE

    out: dict[str, dict[str, Any]] = {}
    for name, utterances in load_sets(sets).items():
        durations: list[int] = []
        reasons: list[str] = []
        for u in conditioned(utterances, condition):
            front_end = LegFrontEnd(SAMPLE_RATE, "pcm16", settings)
            chunk = SAMPLE_RATE  # 1 s at a time, as Engine.leg_segments feeds a file
            segments = [s for start in range(0, u.audio.size, chunk)
                        for s in front_end.accept_samples(u.audio[start:start + chunk])] + front_end.finish()
            durations += [s.duration_ms for s in segments]
            reasons += [s.reason for s in segments]
        out[name] = segment_figures(durations, reasons, len(utterances), settings.window_bucket_s)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--condition", default="8k-mulaw")
    parser.add_argument("--variant", action="append", default=[], help="setting=value[,...] (repeatable)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    base = get_settings()
    sets = tuple(s for s in args.sets.split(",") if s)
    runs = [("current", base), *(settings_variant(base, spec) for spec in args.variant)]
    figures: dict[str, Any] = {"condition": args.condition, "runs": []}
    for label, settings in runs:
        by_set = measure(settings, sets, args.condition)
        figures["runs"].append({"label": label, "settings_changed": changed_settings(base, settings), "sets": by_set})
        for name, f in by_set.items():
            length = f.get("length_s", {})
            print(f"{label:32} {name:14} segments {f['segments']:5}  mean {length.get('mean', 0):5.2f} s  "
                  f"p90 {length.get('p90', 0):5.2f} s  max {length.get('max', 0):5.2f} s  cut {f.get('cut_at_max_length', 0):3}  "
                  f"encoder window-s {f.get('encoder_window_s', 0):7.1f}")
    for path in write_result("segments", record("segments", settings_that_matter(base), figures), args.out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
